// Package cmdfs reads and writes a sandbox's own filesystem, outside the run's files, through commands run in the sandbox under its jail.
//
// The run's files (the kernel's working directory) are Triad's store, read
// and written by the tmp.* tools. Everything else a sandbox sees (/tmp, a
// repository a command cloned there) exists only inside the sandbox, while
// its kernel lives. An E2B agent reads and writes it with files.*: each
// operation here is one short command (a small Python program) run through
// sandbox.Commander, so it runs as the sandbox's user, under the same
// seccomp, limits and read-only root as a cell, and on every backend that
// runs commands. See docs/DECISIONS.md, "E2B files outside /home/user".
package cmdfs

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/triadhq/triad/sandbox"
)

// Commander is what cmdfs needs of a kernel: sandbox.Commander.
type Commander interface {
	Command(ctx context.Context, cmd sandbox.Command) (*sandbox.CommandResult, error)
}

// Type is what a path names.
type Type string

// Types of Entry.
const (
	File    Type = "file"
	Dir     Type = "dir"
	Symlink Type = "symlink"
	Other   Type = "other" // a FIFO, a socket, a device
)

// Entry is one path of the sandbox's filesystem, as lstat sees it.
type Entry struct {
	Path     string    `json:"path"`
	Type     Type      `json:"type"`
	Size     int64     `json:"size"`
	Mode     uint32    `json:"mode"` // permission bits
	Modified time.Time `json:"-"`
	MtimeNs  int64     `json:"mtime_ns"`
	UID      int       `json:"uid"`
	GID      int       `json:"gid"`
	Target   string    `json:"target,omitempty"` // a symlink's target
	// Made is set by MakeDir: false when the directory was there.
	Made bool `json:"made,omitempty"`
}

// Error is an operation the sandbox refused: Errno is the C name of the
// error it met (ENOENT, EACCES, EROFS, ...). It matches fs.ErrNotExist,
// fs.ErrPermission and fs.ErrExist as the errno says.
type Error struct {
	Op, Path, Errno, Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %s (%s)", e.Op, e.Path, e.Message, e.Errno)
}

// Is maps the errno onto io/fs's errors.
func (e *Error) Is(target error) bool {
	switch target {
	case fs.ErrNotExist:
		return e.Errno == "ENOENT" || e.Errno == "ENOTDIR"
	case fs.ErrPermission:
		return e.Errno == "EACCES" || e.Errno == "EPERM" || e.Errno == "EROFS" || e.Errno == "EWORKDIR"
	case fs.ErrExist:
		return e.Errno == "EEXIST" || e.Errno == "ENOTEMPTY"
	}
	return false
}

// NoSpace reports whether the sandbox's filesystem (or the user's quota
// there) is full.
func (e *Error) NoSpace() bool {
	return e.Errno == "ENOSPC" || e.Errno == "EDQUOT" || e.Errno == "EFBIG"
}

// ErrTooLarge is a read whose bytes passed the command's output limit.
var ErrTooLarge = errors.New("the file is larger than a command's output limit")

// Stopped is a command the host stopped (its deadline, a cancellation):
// Kind is sandbox.KindTimeout or KindInterrupted.
type Stopped struct{ Kind string }

func (s *Stopped) Error() string { return "the filesystem command was stopped: " + s.Kind }

// FS runs the operations in one sandbox. Workdir is the kernel's working
// directory (the run's files): every operation refuses a path that is, or
// resolves through a symlink to, it or a path under it (errno EWORKDIR),
// so the store stays the only writer of the run's files.
type FS struct {
	K       Commander
	Workdir string
}

// program is the command each operation runs: python3 -c program OP
// WORKDIR PATH [ARG]. It prints one JSON object a line; a refusal is a
// line {"error": errno name, "message", "path"} and exit status 3. read
// prints the file as base64 lines. Written without single quotes.
const program = `import base64, errno, json, os, shutil, stat, sys
op, work, p = sys.argv[1], os.path.realpath(sys.argv[2]), sys.argv[3]
def emit(o):
    sys.stdout.write(json.dumps(o) + "\n")
def entry(q):
    st = os.lstat(q)
    m = st.st_mode
    t = "file" if stat.S_ISREG(m) else "dir" if stat.S_ISDIR(m) else "symlink" if stat.S_ISLNK(m) else "other"
    e = {"path": q, "type": t, "size": st.st_size, "mode": stat.S_IMODE(m), "mtime_ns": st.st_mtime_ns, "uid": st.st_uid, "gid": st.st_gid}
    if t == "symlink":
        e["target"] = os.readlink(q)
    return e
def guard(q):
    r = os.path.realpath(q)
    if r == work or r.startswith(work + "/"):
        raise OSError(0, "the run's files are written with the tmp tools", q)
try:
    for q in [p] + sys.argv[4:5] * (op == "rename"):
        guard(q)
    if op == "stat":
        emit(entry(p))
    elif op == "read":
        with open(p, "rb") as f:
            while True:
                b = f.read(49152)
                if not b:
                    break
                sys.stdout.write(base64.b64encode(b).decode() + "\n")
    elif op == "write":
        d = os.path.dirname(p)
        if d:
            os.makedirs(d, exist_ok=True)
        with open(p, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f)
        emit(entry(p))
    elif op == "mkdir":
        made = True
        try:
            os.makedirs(p)
        except FileExistsError:
            if not os.path.isdir(p):
                raise
            made = False
        e = entry(p)
        e["made"] = made
        emit(e)
    elif op == "list":
        depth = int(sys.argv[4])
        if not stat.S_ISDIR(os.stat(p).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), p)
        def walk(d, level):
            for de in sorted(os.scandir(d), key=lambda x: x.name):
                e = entry(de.path)
                emit(e)
                if e["type"] == "dir" and level < depth:
                    walk(de.path, level + 1)
        walk(p, 1)
    elif op == "remove":
        if stat.S_ISDIR(os.lstat(p).st_mode):
            shutil.rmtree(p)
        else:
            os.remove(p)
        emit({})
    elif op == "rename":
        os.rename(p, sys.argv[4])
        emit(entry(sys.argv[4]))
    sys.stdout.flush()
except OSError as e:
    name = "EWORKDIR" if e.errno == 0 else errno.errorcode.get(e.errno, "EIO")
    emit({"error": name, "message": e.strerror or str(e), "path": e.filename or p})
    sys.stdout.flush()
    os._exit(3)
`

// run runs one operation; stdin, when not nil, is the command's standard
// input. It returns the command's stdout.
func (f FS) run(ctx context.Context, op, p string, extra []string, stdin io.Reader) ([]byte, error) {
	if !path.IsAbs(p) {
		return nil, &Error{Op: op, Path: p, Errno: "EINVAL", Message: "the path is not absolute"}
	}
	var out, errb bytes.Buffer
	cmd := sandbox.Command{
		Args: append([]string{"python3", "-c", program, op, f.Workdir, p}, extra...),
		Output: func(e sandbox.Event) {
			if e.Kind == sandbox.EventStdout {
				out.WriteString(e.Text)
			} else {
				errb.WriteString(e.Text)
			}
		},
	}
	var res *sandbox.CommandResult
	var err error
	if stdin == nil {
		res, err = f.K.Command(ctx, cmd)
	} else {
		res, err = f.withStdin(ctx, cmd, stdin)
	}
	if err != nil {
		return nil, err
	}
	switch res.Stopped {
	case "":
	case sandbox.KindOutputLimit:
		return nil, ErrTooLarge
	default:
		return nil, &Stopped{Kind: res.Stopped}
	}
	if res.ExitCode == 3 {
		var e struct{ Error, Message, Path string }
		if json.Unmarshal(lastLine(out.Bytes()), &e) == nil && e.Error != "" {
			return nil, &Error{Op: op, Path: e.Path, Errno: e.Error, Message: e.Message}
		}
	}
	if res.ExitCode != 0 {
		return nil, fmt.Errorf("cmdfs: %s %s exited with code %d: %s", op, p, res.ExitCode, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// withStdin runs cmd with its standard input fed from r, then closed.
func (f FS) withStdin(ctx context.Context, cmd sandbox.Command, r io.Reader) (*sandbox.CommandResult, error) {
	ctl := sandbox.NewCommandControl()
	cmd.Stdin, cmd.Control = true, ctl
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fed := make(chan error, 1)
	go func() {
		fed <- feed(ctx, ctl, r)
	}()
	res, err := f.K.Command(ctx, cmd)
	ctl.Ended()
	ferr := <-fed
	if err == nil && ferr != nil && !errors.Is(ferr, sandbox.ErrCommandEnded) {
		// The body could not be read: the file is not what was sent.
		return nil, fmt.Errorf("cmdfs: read the body: %w", ferr)
	}
	return res, err
}

// feed sends r to the command's stdin in chunks, then closes it. A
// failure to read r kills the command (the caller cancels its context)
// so no partial file is reported as written.
func feed(ctx context.Context, ctl *sandbox.CommandControl, r io.Reader) error {
	if _, ok := ctl.Pid(ctx); !ok {
		return sandbox.ErrCommandEnded
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if serr := ctl.Send(sandbox.ControlOp{Data: bytes.Clone(buf[:n])}); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) {
			return ctl.Send(sandbox.ControlOp{Close: true})
		}
		if err != nil {
			_ = ctl.Send(sandbox.ControlOp{Signal: 9})
			return err
		}
	}
}

func lastLine(b []byte) []byte {
	b = bytes.TrimRight(b, "\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		return b[i+1:]
	}
	return b
}

func decodeEntry(line []byte) (Entry, error) {
	var e Entry
	if err := json.Unmarshal(line, &e); err != nil {
		return Entry{}, fmt.Errorf("cmdfs: the sandbox answered %.100q: %w", line, err)
	}
	e.Modified = time.Unix(0, e.MtimeNs).UTC()
	return e, nil
}

// Stat describes p without following a final symlink.
func (f FS) Stat(ctx context.Context, p string) (Entry, error) {
	out, err := f.run(ctx, "stat", p, nil, nil)
	if err != nil {
		return Entry{}, err
	}
	return decodeEntry(lastLine(out))
}

// Read returns the bytes of the file p. A file whose base64 passes the
// command's output limit is ErrTooLarge.
func (f FS) Read(ctx context.Context, p string) ([]byte, error) {
	out, err := f.run(ctx, "read", p, nil, nil)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	for _, line := range bytes.Split(out, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		chunk, err := base64.StdEncoding.DecodeString(string(line))
		if err != nil {
			return nil, fmt.Errorf("cmdfs: read %s: the sandbox sent bytes that are not base64: %w", p, err)
		}
		b.Write(chunk)
	}
	return b.Bytes(), nil
}

// Write makes or replaces the file p with r's bytes, making its parent
// directories, and describes it.
func (f FS) Write(ctx context.Context, p string, r io.Reader) (Entry, error) {
	out, err := f.run(ctx, "write", p, nil, r)
	if err != nil {
		return Entry{}, err
	}
	return decodeEntry(lastLine(out))
}

// MakeDir makes the directory p and its parents; Entry.Made says whether
// it was not there before.
func (f FS) MakeDir(ctx context.Context, p string) (Entry, error) {
	out, err := f.run(ctx, "mkdir", p, nil, nil)
	if err != nil {
		return Entry{}, err
	}
	return decodeEntry(lastLine(out))
}

// List lists the directory p down to depth levels (1: its own entries),
// sorted by name within each directory.
func (f FS) List(ctx context.Context, p string, depth int) ([]Entry, error) {
	if depth < 1 {
		depth = 1
	}
	out, err := f.run(ctx, "list", p, []string{strconv.Itoa(depth)}, nil)
	if err != nil {
		return nil, err
	}
	var es []Entry
	for _, line := range bytes.Split(out, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		e, err := decodeEntry(line)
		if err != nil {
			return nil, err
		}
		es = append(es, e)
	}
	return es, nil
}

// Remove removes the file, symlink or directory tree p.
func (f FS) Remove(ctx context.Context, p string) error {
	_, err := f.run(ctx, "remove", p, nil, nil)
	return err
}

// Rename renames p to dst (both in the sandbox's filesystem) and
// describes dst.
func (f FS) Rename(ctx context.Context, p, dst string) (Entry, error) {
	if !path.IsAbs(dst) {
		return Entry{}, &Error{Op: "rename", Path: dst, Errno: "EINVAL", Message: "the path is not absolute"}
	}
	out, err := f.run(ctx, "rename", p, []string{dst}, nil)
	if err != nil {
		return Entry{}, err
	}
	return decodeEntry(lastLine(out))
}
