// Package storeerr turns the file store's errors into the faults callers see, in one place for the core and its rooms.
package storeerr

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

// Fault turns a tmpfs error into a fault a caller can act on.
func Fault(err error, run runid.ID, path string) error {
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
