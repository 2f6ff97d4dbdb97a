package orchestrator

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"unicode/utf8"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/cel"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/orchestrator/internal/storeerr"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Write is tmp.write.
func (o *Orchestrator) Write(ctx context.Context, run runid.ID, in wire.WriteRequest, opts ...CallOption) (wire.FileRef, error) {
	var out wire.FileRef
	p, err := writable(in.Path)
	if err != nil {
		return out, err
	}
	var data []byte
	switch {
	case in.Text != nil && in.BytesB64 != nil:
		return out, fault.New(fault.BadInput, "both text and bytes_b64 are set",
			"send exactly one: text for UTF-8 content, bytes_b64 for binary")
	case in.Text != nil:
		data = []byte(*in.Text)
	case in.BytesB64 != nil:
		data, err = base64.StdEncoding.DecodeString(*in.BytesB64)
		if err != nil {
			return out, fault.Wrap(fault.BadInput, err, "bytes_b64 is not valid standard base64",
				"encode the bytes with standard base64 (RFC 4648, with padding), or send UTF-8 content as text")
		}
	default:
		return out, fault.New(fault.BadInput, "neither text nor bytes_b64 is set",
			"send the content as text (UTF-8) or bytes_b64 (base64); an empty file is text \"\"")
	}
	if int64(len(data)) > o.limits.JSONBody {
		return out, fault.New(fault.TooLarge, fmt.Sprintf("content is %d bytes; the inline limit is %d", len(data), o.limits.JSONBody),
			"upload large files with PUT /tmp/files/{path}, which streams")
	}
	err = o.call(ctx, run, &TmpOutcome{Op: ToolWrite, Path: p, Bytes: len(data)}, opts, writeBody(o, run, p, func(ctx context.Context) (tmpfs.File, error) {
		return o.store.Write(ctx, run, p, bytes.NewReader(data), 0)
	}, &out))
	return out, err
}

// WriteStream is tmp.write for a streamed body: r is hashed and stored as
// it arrives, never held whole in memory, up to the stream limit.
//
// The bytes are stored before the run's lock is taken, and the call then
// only links them: a body that arrives slowly, or stops, holds a
// connection and an upload slot of its tenant (Quotas.Uploads), never the
// run (see docs/DECISIONS.md, "No client can hold a run"). Who may write
// and the tenant's stored bytes are checked before a byte is read.
func (o *Orchestrator) WriteStream(ctx context.Context, run runid.ID, path string, r io.Reader, opts ...CallOption) (wire.FileRef, error) {
	var out wire.FileRef
	p, err := writable(path)
	if err != nil {
		return out, err
	}
	rn, done := o.runs.use(run)
	defer done()
	ow, err := o.access(ctx, rn, auth.Runs, true)
	if err == nil {
		err = o.t.CheckBytes(ctx, auth.From(ctx), ow, 0)
	}
	if err != nil {
		return out, err
	}
	release, err := o.t.StartUpload(ow.Tenant)
	if err != nil {
		return out, err
	}
	defer release()
	d, n, err := o.store.Blobs().Put(ctx, r, o.limits.StreamBody)
	if err != nil {
		return out, storeErr(err, run, p)
	}
	// The call only links the stored blob.
	err = o.call(ctx, run, &TmpOutcome{Op: ToolWrite, Path: p, Streamed: true}, opts, writeBody(o, run, p, func(ctx context.Context) (tmpfs.File, error) {
		return o.store.Link(ctx, run, p, d, n)
	}, &out))
	return out, err
}

// writeBody is tmp.write's call: store the file (put stores or links
// it), record it, and copy it into the run's live kernel.
func writeBody(o *Orchestrator, run runid.ID, p string, put func(ctx context.Context) (tmpfs.File, error), out *wire.FileRef) func(ctx context.Context, c *call) error {
	return func(ctx context.Context, c *call) error {
		f, err := put(ctx)
		if err != nil {
			return storeErr(err, run, p)
		}
		c.step.Artifacts = append(c.step.Artifacts, f)
		*out = wire.Ref(f)
		return o.files.put(ctx, run, f)
	}
}

// Read is tmp.read with the content inline, for files up to the JSON limit.
func (o *Orchestrator) Read(ctx context.Context, run runid.ID, path string, opts ...CallOption) (wire.ReadResponse, error) {
	var out wire.ReadResponse
	p, err := safepath.Clean(path)
	if err != nil {
		return out, err
	}
	err = o.call(ctx, run, &TmpOutcome{Op: ToolRead, Path: p}, opts, func(ctx context.Context, _ *call) error {
		f, err := o.store.Stat(ctx, run, p)
		if err != nil {
			return storeErr(err, run, p)
		}
		if f.Size > o.limits.JSONBody {
			return fault.New(fault.TooLarge, fmt.Sprintf("%q is %d bytes; tmp.read inlines at most %d", p, f.Size, o.limits.JSONBody),
				fmt.Sprintf("download it raw with GET /tmp/files/%s or GET /blobs/%s", p, f.SHA256))
		}
		b, f, err := o.store.ReadAll(ctx, run, p)
		if err != nil {
			return storeErr(err, run, p)
		}
		out = wire.ReadResponse{FileRef: wire.Ref(f)}
		if utf8.Valid(b) {
			t := string(b)
			out.Text = &t
		} else {
			e := base64.StdEncoding.EncodeToString(b)
			out.BytesB64 = &e
		}
		return nil
	})
	return out, err
}

// Open is tmp.read for streaming: it resolves the file (recorded as a step)
// and returns a reader that verifies the bytes as they stream. The stream
// itself runs outside the run's lock, so a slow download never holds up the
// run's next call; blobs are immutable, so that is safe.
func (o *Orchestrator) Open(ctx context.Context, run runid.ID, path string, opts ...CallOption) (tmpfs.File, *tmpfs.Reader, error) {
	var (
		f tmpfs.File
		r *tmpfs.Reader
	)
	p, err := safepath.Clean(path)
	if err != nil {
		return f, nil, err
	}
	err = o.call(ctx, run, &TmpOutcome{Op: ToolRead, Path: p, Streamed: true}, opts, func(ctx context.Context, _ *call) error {
		var err error
		f, r, err = o.store.Open(ctx, run, p)
		if err != nil {
			return storeErr(err, run, p)
		}
		return nil
	})
	return f, r, err
}

// List is tmp.list.
func (o *Orchestrator) List(ctx context.Context, run runid.ID, prefix string, opts ...CallOption) (wire.ListResponse, error) {
	out := wire.ListResponse{Files: []wire.FileInfo{}}
	p, err := safepath.CleanPrefix(prefix)
	if err != nil {
		return out, err
	}
	err = o.call(ctx, run, &TmpOutcome{Op: ToolList, Prefix: p}, opts, func(ctx context.Context, _ *call) error {
		files, err := o.store.List(ctx, run, p)
		if err != nil {
			return storeErr(err, run, p)
		}
		for _, f := range files {
			out.Files = append(out.Files, wire.Info(f))
		}
		return nil
	})
	return out, err
}

// Delete is tmp.delete.
func (o *Orchestrator) Delete(ctx context.Context, run runid.ID, path string, opts ...CallOption) (wire.OK, error) {
	var out wire.OK
	p, err := writable(path)
	if err != nil {
		return out, err
	}
	err = o.call(ctx, run, &TmpOutcome{Op: ToolDelete, Path: p}, opts, func(ctx context.Context, c *call) error {
		if err := o.store.Delete(ctx, run, p); err != nil {
			return storeErr(err, run, p)
		}
		c.step.Touched = append(c.step.Touched, p)
		out.OK = true
		if o.kernels != nil {
			if sess := o.kernels.Peek(run); sess != nil {
				if err := sess.Dir.Remove(ctx, p); err != nil {
					o.log.ErrorContext(ctx, "remove from working directory", "run", run, "path", p, "err", err)
				}
			}
		}
		return nil
	})
	return out, err
}

// writable validates a path a caller wants to change: the journal's own
// files are refused.
func writable(path string) (string, error) {
	p, err := safepath.Clean(path)
	if err != nil {
		return "", err
	}
	if runfiles.IsKept(p) {
		return "", fault.New(fault.Reserved, fmt.Sprintf("%q is kept by triad itself (the journal, its records, or a recipe run's state)", p),
			"read it with tmp.read or GET /cel; add to the journal with POST /cel/note {text}")
	}
	return p, nil
}

// mirror keeps a run's live kernel's working directory in step with the
// run's files: the run's files and the kernel's cwd are one namespace.
type mirror struct {
	store   *tmpfs.Store
	kernels *kernels.Manager // nil: no sandbox
	log     *slog.Logger
}

// put copies a file just written to the run into its live kernel's
// working directory, so the next cell can open it.
func (m mirror) put(ctx context.Context, run runid.ID, f tmpfs.File) error {
	if m.kernels == nil {
		return nil
	}
	sess := m.kernels.Peek(run)
	if sess == nil {
		return nil // materialised when the kernel starts
	}
	if err := sess.Dir.Put(ctx, f); err != nil {
		return fault.Wrap(fault.Internal, err, fmt.Sprintf("%q was stored but could not be copied into the kernel's working directory", f.Path),
			"the disk quota may be full: delete files from the run, or restart the kernel with POST /sandbox/restart")
	}
	return nil
}

// write writes a file Triad keeps in the run for itself, and copies it
// into the live kernel: not a tool call, and no access check (the caller,
// inside the core, has the run).
func (m mirror) write(ctx context.Context, run runid.ID, path string, data []byte) (tmpfs.File, error) {
	f, err := m.store.WriteBytes(ctx, run, path, data)
	if err != nil {
		return f, storeErr(err, run, path)
	}
	return f, m.put(ctx, run, f)
}

// journal brings the live kernel's copies of the journal's files up to
// date: appended text is appended (when the working directory can), so
// the cost does not grow with the journal; checkpoints are not copied
// (see runfiles.IsCheckpoint).
func (m mirror) journal(ctx context.Context, run runid.ID, writes []cel.Write) {
	if m.kernels == nil {
		return
	}
	sess := m.kernels.Peek(run)
	if sess == nil {
		return // materialised when the kernel starts
	}
	for _, w := range writes {
		var err error
		if w.Appended != nil {
			err = sess.Dir.Append(ctx, w.File, w.Prev, w.Appended)
		} else {
			err = sess.Dir.Put(ctx, w.File)
		}
		if err != nil {
			m.log.WarnContext(ctx, "mirror journal file", "run", run, "path", w.Path, "err", err)
		}
	}
}

// storeErr turns a tmpfs error into a fault a caller can act on.
func storeErr(err error, run runid.ID, path string) error { return storeerr.Fault(err, run, path) }
