package orchestrator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"

	"github.com/triadhq/triad/evaluator"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/journal"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/cmdfs"
	"github.com/triadhq/triad/sandbox/image"
)

// ToolFS is a file operation on the sandbox's own filesystem, outside the
// run's files: E2B's files.* on a path such as /tmp/repo/README.md. See
// docs/DECISIONS.md, "E2B files outside /home/user".
const ToolFS = "sandbox.fs"

// FSOp is one sandbox.fs operation.
type FSOp string

// The operations of sandbox.fs.
const (
	FSStat   FSOp = "stat"
	FSRead   FSOp = "read"
	FSWrite  FSOp = "write"
	FSMkdir  FSOp = "mkdir"
	FSList   FSOp = "list"
	FSRemove FSOp = "remove"
	FSRename FSOp = "rename"
)

// FSRequest is one sandbox.fs call. Path (and Dest, for a rename) are
// absolute paths of the sandbox's filesystem outside its working
// directory; Body is a write's bytes; Depth a list's (1: the directory's
// own entries).
type FSRequest struct {
	Op    FSOp
	Path  string
	Dest  string
	Body  io.Reader
	Depth int
}

// FSResult is what a sandbox.fs call found: the entry a stat, write,
// mkdir or rename describes, a list's entries, a read's bytes.
type FSResult struct {
	Entry   cmdfs.Entry
	Entries []cmdfs.Entry
	Data    []byte
}

// FSOutcome is sandbox.fs's part of a step.
type FSOutcome struct {
	Op      FSOp
	Path    string
	Dest    string
	Backend string
	// Bytes is what a read returned or a write wrote; Entries what a
	// list listed.
	Bytes, Entries int
	// NoKernel is set when no kernel ran, so nothing outside the run's
	// files existed and no kernel was started to find that out.
	NoKernel bool
}

// Tool implements Outcome.
func (f *FSOutcome) Tool() string { return ToolFS }

// Inputs implements Outcome.
func (f *FSOutcome) Inputs() []Input {
	in := []Input{{Key: "op", Value: string(f.Op)}, {Key: "path", Value: f.Path}}
	if f.Dest != "" {
		in = append(in, Input{Key: "dest", Value: f.Dest})
	}
	return journal.Inputs(in...)
}

// Grade implements Outcome: the evaluator grades the step's error alone.
func (f *FSOutcome) Grade(req *evaluator.Request) {}

// Describe implements Outcome.
func (f *FSOutcome) Describe(s *Step) (did, next []string, failed bool) {
	if s.Err != nil {
		return nil, nil, true
	}
	where := fmt.Sprintf("the %s sandbox's own filesystem (outside the run's files; gone when its kernel stops)", f.Backend)
	switch {
	case f.NoKernel:
		did = append(did, fmt.Sprintf("%s %s: no kernel ran, so %s held nothing there", f.Op, f.Path, where))
	case f.Op == FSRead:
		did = append(did, fmt.Sprintf("Read %s (%d bytes) from %s", f.Path, f.Bytes, where))
	case f.Op == FSWrite:
		did = append(did, fmt.Sprintf("Wrote %s (%d bytes) in %s", f.Path, f.Bytes, where))
	case f.Op == FSList:
		did = append(did, fmt.Sprintf("Listed %s (%d entries) in %s", f.Path, f.Entries, where))
	case f.Op == FSRename:
		did = append(did, fmt.Sprintf("Renamed %s to %s in %s", f.Path, f.Dest, where))
	default:
		did = append(did, fmt.Sprintf("%s %s in %s", strings.ToUpper(string(f.Op[:1]))+string(f.Op[1:]), f.Path, where))
	}
	return did, nil, false
}

// SandboxFS is sandbox.fs: one operation on the run's sandbox's own
// filesystem outside the run's files, run as a command in the run's
// kernel under its jail (cmdfs), as a tool call of the run. A write,
// mkdir or rename starts the run's kernel if none runs; a stat, read or
// list with no kernel finds nothing (not found) and a remove nothing to
// remove, without starting one. A path at or under the kernel's working
// directory is refused: those are the run's files, the tmp tools'.
func (o *Orchestrator) SandboxFS(ctx context.Context, run runid.ID, req FSRequest) (FSResult, error) {
	if o.kernels == nil {
		return FSResult{}, fault.New(fault.NotConfigured, "no sandbox backend is configured", "start triad with --sandbox docker or kube")
	}
	if err := checkFSRequest(req); err != nil {
		return FSResult{}, err
	}
	var res FSResult
	fo := &FSOutcome{Op: req.Op, Path: req.Path, Dest: req.Dest, Backend: o.kernels.Backend()}
	err := o.call(ctx, run, fo, nil, func(ctx context.Context, c *call) error {
		starts := req.Op == FSWrite || req.Op == FSMkdir || req.Op == FSRename
		if !starts && o.kernels.Peek(run) == nil {
			fo.NoKernel = true
			if req.Op == FSRemove {
				return nil // nothing there: removed, as envd's os.RemoveAll answers
			}
			return fault.New(fault.NotFound, fmt.Sprintf("path %q does not exist: run %s has no kernel running, and the sandbox's filesystem outside %s lives only with its kernel", req.Path, run, image.Work),
				"write it first (files.write), or keep files you need in "+image.Work+", the run's files")
		}
		spec, err := o.setups.spec(ctx, c.r)
		if err != nil {
			return err
		}
		sess, err := o.kernels.Acquire(ctx, run, spec, o.claim(c.who, c.owner))
		if err != nil {
			return sandboxErr(err)
		}
		defer o.kernels.Release(sess)
		if sess.Fresh {
			// A kernel started for a file: its setup runs now, and the
			// run's next cell is the first in its interpreter.
			if err := o.setups.restarted(ctx, c.r, sess); err != nil {
				return err
			}
		}
		cm, err := commander(o.kernels.Backend(), sess)
		if err != nil {
			return err
		}
		f := cmdfs.FS{K: cm, Workdir: image.Work}
		cctx, cancel := context.WithTimeout(ctx, o.exec.DefaultTimeout)
		defer cancel()
		switch req.Op {
		case FSStat:
			res.Entry, err = f.Stat(cctx, req.Path)
		case FSRead:
			res.Data, err = f.Read(cctx, req.Path)
			fo.Bytes = len(res.Data)
		case FSWrite:
			body := req.Body
			if body == nil {
				body = bytes.NewReader(nil)
			}
			res.Entry, err = f.Write(cctx, req.Path, body)
			fo.Bytes = int(res.Entry.Size)
		case FSMkdir:
			res.Entry, err = f.MakeDir(cctx, req.Path)
		case FSList:
			res.Entries, err = f.List(cctx, req.Path, req.Depth)
			fo.Entries = len(res.Entries)
		case FSRemove:
			err = f.Remove(cctx, req.Path)
			if errors.Is(err, fs.ErrNotExist) {
				err = nil
			}
		case FSRename:
			res.Entry, err = f.Rename(cctx, req.Path, req.Dest)
		}
		return fsErr(err, req)
	})
	return res, err
}

// checkFSRequest refuses what no sandbox could do, before the call.
func checkFSRequest(req FSRequest) error {
	switch req.Op {
	case FSStat, FSRead, FSWrite, FSMkdir, FSList, FSRemove, FSRename:
	default:
		return fault.Badf("use stat, read, write, mkdir, list, remove or rename", "sandbox.fs has no operation %q", req.Op)
	}
	paths := []string{req.Path}
	if req.Op == FSRename {
		paths = append(paths, req.Dest)
	}
	for _, p := range paths {
		switch {
		case !path.IsAbs(p) || path.Clean(p) != p || strings.ContainsRune(p, 0):
			return fault.Badf("send a clean absolute path such as /tmp/data.txt", "path %q is not a clean absolute path", p)
		case p == "/":
			return fault.Badf("name a file or directory under /", "sandbox.fs %s cannot take the sandbox's root /", req.Op)
		case p == image.Work || strings.HasPrefix(p, image.Work+"/"):
			return fault.New(fault.PermissionDenied, fmt.Sprintf("path %q is in the run's files", p),
				"read and write the run's files with tmp.read and tmp.write")
		}
	}
	return nil
}

// fsErr maps what the sandbox refused onto Triad's faults.
func fsErr(err error, req FSRequest) error {
	if err == nil {
		return nil
	}
	var ce *cmdfs.Error
	var st *cmdfs.Stopped
	isCE := errors.As(err, &ce)
	switch {
	case isCE && ce.Errno == "EWORKDIR":
		return fault.Wrap(fault.PermissionDenied, err, fmt.Sprintf("path %q leads into the run's files (through a symlink)", ce.Path),
			"read and write the run's files with tmp.read and tmp.write")
	case isCE && errors.Is(err, fs.ErrNotExist):
		return fault.Wrap(fault.NotFound, err, fmt.Sprintf("path %q does not exist in the sandbox", ce.Path),
			"list its directory (files.list) to see what is there")
	case isCE && errors.Is(err, fs.ErrPermission):
		return fault.Wrap(fault.PermissionDenied, err, fmt.Sprintf("the sandbox refused %s of %q: %s", req.Op, ce.Path, ce.Message),
			"the sandbox's root is read-only and its user is not root: use /tmp, or the run's files under "+image.Work)
	case isCE && errors.Is(err, fs.ErrExist):
		return fault.Wrap(fault.Conflict, err, fmt.Sprintf("path %q exists: %s", ce.Path, ce.Message), "pick another path, or remove it first")
	case isCE && ce.NoSpace():
		return fault.Wrap(fault.TooLarge, err, fmt.Sprintf("the sandbox's filesystem has no room for %q: %s", ce.Path, ce.Message),
			"write less, remove files under /tmp, or keep large files in the run's files")
	case isCE:
		return fault.Wrap(fault.BadInput, err, fmt.Sprintf("the sandbox refused %s of %q: %s (%s)", req.Op, ce.Path, ce.Message, ce.Errno),
			"check the path: a file where a directory is expected, or the reverse")
	case errors.Is(err, cmdfs.ErrTooLarge):
		return fault.Wrap(fault.TooLarge, err, fmt.Sprintf("%q is larger than a command's output limit", req.Path),
			"copy it into the run's files with a command (cp) and read it from there, in ranges")
	case errors.As(err, &st) && st.Kind == sandbox.KindTimeout:
		return fault.Wrap(fault.Timeout, err, fmt.Sprintf("sandbox.fs %s of %q ran past its deadline", req.Op, req.Path), "retry; a busy sandbox answers later")
	}
	return sandboxErr(err)
}
