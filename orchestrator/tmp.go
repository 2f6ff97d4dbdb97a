package orchestrator

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"github.com/triadhq/triad/auth"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/runfiles"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Write is tmp.write.
func (o *Orchestrator) Write(ctx context.Context, run runid.ID, in wire.WriteRequest) (wire.FileRef, error) {
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
	return o.write(ctx, run, p, bytes.NewReader(data), 0, &TmpOutcome{Op: ToolWrite, Path: p, Bytes: len(data)})
}

// WriteStream is tmp.write for a streamed body: r is hashed and stored as
// it arrives, never held whole in memory, up to the stream limit.
//
// The bytes are stored before the run's lock is taken, and the call then
// only links them: a body that arrives slowly, or stops, holds a
// connection and an upload slot of its tenant (Quotas.Uploads), never the
// run (see docs/DECISIONS.md, "No client can hold a run"). Who may write
// and the tenant's stored bytes are checked before a byte is read.
func (o *Orchestrator) WriteStream(ctx context.Context, run runid.ID, path string, r io.Reader) (wire.FileRef, error) {
	var out wire.FileRef
	p, err := writable(path)
	if err != nil {
		return out, err
	}
	ow, err := o.access(ctx, run, auth.Runs, true)
	if err == nil {
		err = o.checkBytes(ctx, ow, 0)
	}
	if err != nil {
		return out, err
	}
	release, err := o.t.startUpload(ow.Tenant)
	if err != nil {
		return out, err
	}
	defer release()
	d, n, err := o.store.Blobs().Put(ctx, r, o.limits.StreamBody)
	if err != nil {
		return out, storeErr(err, run, p)
	}
	return o.linkStored(ctx, run, p, d, n, &TmpOutcome{Op: ToolWrite, Path: p, Streamed: true})
}

// linkStored is tmp.write's call for bytes already stored: link the blob
// at p, record it, and copy the file into the run's live kernel.
func (o *Orchestrator) linkStored(ctx context.Context, run runid.ID, p string, d tmpfs.Digest, n int64, oc *TmpOutcome) (wire.FileRef, error) {
	var out wire.FileRef
	err := o.call(ctx, run, oc, func(ctx context.Context, s *Step) error {
		f, err := o.store.Link(ctx, run, p, d, n)
		if err != nil {
			return storeErr(err, run, p)
		}
		s.Artifacts = append(s.Artifacts, f)
		out = wire.Ref(f)
		return o.mirrorPut(ctx, run, f)
	})
	return out, err
}

// write is tmp.write's call: store the bytes, record them, and copy the
// file into the run's live kernel.
func (o *Orchestrator) write(ctx context.Context, run runid.ID, p string, r io.Reader, limit int64, oc *TmpOutcome) (wire.FileRef, error) {
	var out wire.FileRef
	err := o.call(ctx, run, oc, func(ctx context.Context, s *Step) error {
		f, err := o.store.Write(ctx, run, p, r, limit)
		if err != nil {
			return storeErr(err, run, p)
		}
		s.Artifacts = append(s.Artifacts, f)
		out = wire.Ref(f)
		return o.mirrorPut(ctx, run, f)
	})
	return out, err
}

// Read is tmp.read with the content inline, for files up to the JSON limit.
func (o *Orchestrator) Read(ctx context.Context, run runid.ID, path string) (wire.ReadResponse, error) {
	var out wire.ReadResponse
	p, err := safepath.Clean(path)
	if err != nil {
		return out, err
	}
	err = o.call(ctx, run, &TmpOutcome{Op: ToolRead, Path: p}, func(ctx context.Context, s *Step) error {
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
func (o *Orchestrator) Open(ctx context.Context, run runid.ID, path string) (tmpfs.File, *tmpfs.Reader, error) {
	var (
		f tmpfs.File
		r *tmpfs.Reader
	)
	p, err := safepath.Clean(path)
	if err != nil {
		return f, nil, err
	}
	err = o.call(ctx, run, &TmpOutcome{Op: ToolRead, Path: p, Streamed: true}, func(ctx context.Context, s *Step) error {
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
func (o *Orchestrator) List(ctx context.Context, run runid.ID, prefix string) (wire.ListResponse, error) {
	out := wire.ListResponse{Files: []wire.FileInfo{}}
	p, err := safepath.CleanPrefix(prefix)
	if err != nil {
		return out, err
	}
	err = o.call(ctx, run, &TmpOutcome{Op: ToolList, Prefix: p}, func(ctx context.Context, s *Step) error {
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
func (o *Orchestrator) Delete(ctx context.Context, run runid.ID, path string) (wire.OK, error) {
	var out wire.OK
	p, err := writable(path)
	if err != nil {
		return out, err
	}
	err = o.call(ctx, run, &TmpOutcome{Op: ToolDelete, Path: p}, func(ctx context.Context, s *Step) error {
		if err := o.store.Delete(ctx, run, p); err != nil {
			return storeErr(err, run, p)
		}
		s.Touched = append(s.Touched, p)
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

// mirrorPut copies a file just written to the run into its live kernel's
// working directory, so the next cell can open it: the run's files and the
// kernel's cwd are one namespace.
func (o *Orchestrator) mirrorPut(ctx context.Context, run runid.ID, f tmpfs.File) error {
	if o.kernels == nil {
		return nil
	}
	sess := o.kernels.Peek(run)
	if sess == nil {
		return nil // materialised when the kernel starts
	}
	if err := sess.Dir.Put(ctx, f); err != nil {
		return fault.Wrap(fault.Internal, err, fmt.Sprintf("%q was stored but could not be copied into the kernel's working directory", f.Path),
			"the disk quota may be full: delete files from the run, or restart the kernel with POST /sandbox/restart")
	}
	return nil
}

// storeErr turns a tmpfs error into a fault a caller can act on.
func storeErr(err error, run runid.ID, path string) error {
	switch {
	case err == nil:
		return nil
	case fault.As(err) != nil:
		return err
	case errors.Is(err, tmpfs.ErrNotFound):
		return fault.Wrap(fault.NotFound, err, fmt.Sprintf("no file %q in run %s", path, run),
			"tmp.list (GET /tmp/list) shows what the run has; write it first with tmp.write")
	case errors.Is(err, tmpfs.ErrTooLarge):
		return fault.Wrap(fault.TooLarge, err, fmt.Sprintf("%q is over the size limit", path),
			"split the file, or raise the limit with --max-stream-bytes (TRIAD_MAX_STREAM_BYTES)")
	case errors.Is(err, tmpfs.ErrConflict):
		return fault.Wrap(fault.Conflict, err, conflictMessage(err),
			"a path cannot be both a file and a directory; delete the clashing file first or pick another path")
	case errors.Is(err, tmpfs.ErrUnavailable):
		return fault.Wrap(fault.StoreUnavailable, err, "the file store does not answer",
			"retry in a few seconds; if it persists, check the S3 endpoint (TRIAD_S3_ENDPOINT) and GET /healthz")
	case errors.Is(err, tmpfs.ErrDigestMismatch):
		return fault.Wrap(fault.Corrupt, err, fmt.Sprintf("the stored bytes of %s do not match their sha256, so they were not served", fileLabel(path)),
			"write the file again (tmp.write or PUT /tmp/files/{path}): the same bytes restore it")
	case errors.Is(err, tmpfs.ErrQuarantined):
		return fault.Wrap(fault.Corrupt, err, fmt.Sprintf("the stored bytes of %s failed their sha256 check and were quarantined (triad fsck or the scrub); they are never served", fileLabel(path)),
			"write the file again (tmp.write or PUT /tmp/files/{path}): the same bytes restore it")
	case errors.Is(err, tmpfs.ErrReplaced):
		return fault.Wrap(fault.Conflict, err, fmt.Sprintf("the stored bytes of %s were stored again while they were being read, so the read stopped", fileLabel(path)),
			"retry the read: the file's content is unchanged")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fault.Wrap(fault.Timeout, err, "the request ended before the store answered", "retry the call")
	default:
		return fault.Wrap(fault.Internal, err, "file store error", "retry; if it persists, report it with the server log")
	}
}

// fileLabel names a file in a message: its path, or "this blob" for a read by
// hash.
func fileLabel(path string) string {
	if path == "" {
		return "this blob"
	}
	return fmt.Sprintf("%q", path)
}

// conflictMessage keeps the part of a conflict error that names the paths.
func conflictMessage(err error) string {
	if _, after, ok := strings.Cut(err.Error(), tmpfs.ErrConflict.Error()+": "); ok {
		return after
	}
	return err.Error()
}
