package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	fspb "github.com/triadhq/triad/api/e2b/envd/filesystem"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/sandbox/cmdfs"
)

// The sandbox's own filesystem, outside the run's files: each envd call on
// such a path is one sandbox.fs call (orchestrator.SandboxFS), which runs a
// command in the sandbox's kernel. See docs/DECISIONS.md, "E2B files
// outside /home/user".

func (s *Server) sandboxFS(ctx context.Context, req orchestrator.FSRequest) (orchestrator.FSResult, error) {
	return s.c.Core.SandboxFS(ctx, sandboxOf(ctx).ID, req)
}

// fsEntry describes a path of the sandbox's own filesystem as envd's
// EntryInfo, as envd's stat does.
func fsEntry(e cmdfs.Entry) *fspb.EntryInfo {
	mode := fs.FileMode(e.Mode)
	typ := fspb.FileType_FILE_TYPE_FILE
	switch e.Type {
	case cmdfs.Dir:
		mode |= fs.ModeDir
		typ = fspb.FileType_FILE_TYPE_DIRECTORY
	case cmdfs.Symlink:
		mode |= fs.ModeSymlink
		typ = fspb.FileType_FILE_TYPE_SYMLINK
	case cmdfs.Other:
		mode |= fs.ModeIrregular
		typ = fspb.FileType_FILE_TYPE_UNSPECIFIED
	}
	info := &fspb.EntryInfo{
		Name: path.Base(e.Path), Type: typ, Path: e.Path, Size: e.Size,
		Mode: uint32(mode.Perm()), Permissions: mode.String(), Owner: userName(e.UID), Group: userName(e.GID),
		ModifiedTime: timestamppb.New(e.Modified),
	}
	if e.Type == cmdfs.Symlink {
		t := e.Target
		info.SymlinkTarget = &t
	}
	return info
}

// userName names an owner as E2B's sandboxes do: root, or the one user.
func userName(id int) string {
	if id == 0 {
		return "root"
	}
	return "user"
}

func (f *filesystemService) statOutside(ctx context.Context, p string) (*connect.Response[fspb.StatResponse], error) {
	res, err := f.s.sandboxFS(ctx, orchestrator.FSRequest{Op: orchestrator.FSStat, Path: p})
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: fsEntry(res.Entry)}), nil
}

func (f *filesystemService) listOutside(ctx context.Context, p string, depth int) (*connect.Response[fspb.ListDirResponse], error) {
	res, err := f.s.sandboxFS(ctx, orchestrator.FSRequest{Op: orchestrator.FSList, Path: p, Depth: depth})
	if err != nil {
		return nil, connectErr(err)
	}
	out := make([]*fspb.EntryInfo, 0, len(res.Entries))
	for _, e := range res.Entries {
		out = append(out, fsEntry(e))
	}
	return connect.NewResponse(&fspb.ListDirResponse{Entries: out}), nil
}

func (f *filesystemService) makeDirOutside(ctx context.Context, p string) (*connect.Response[fspb.MakeDirResponse], error) {
	res, err := f.s.sandboxFS(ctx, orchestrator.FSRequest{Op: orchestrator.FSMkdir, Path: p})
	if err != nil {
		return nil, connectErr(err)
	}
	if !res.Entry.Made {
		// envd answers a directory that exists as AlreadyExists, which
		// the SDK's makeDir turns into false.
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("path %q already exists", p))
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: fsEntry(res.Entry)}), nil
}

func (f *filesystemService) removeOutside(ctx context.Context, p string) (*connect.Response[fspb.RemoveResponse], error) {
	if _, err := f.s.sandboxFS(ctx, orchestrator.FSRequest{Op: orchestrator.FSRemove, Path: p}); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

func (f *filesystemService) moveOutside(ctx context.Context, src, dst string) (*connect.Response[fspb.MoveResponse], error) {
	res, err := f.s.sandboxFS(ctx, orchestrator.FSRequest{Op: orchestrator.FSRename, Path: src, Dest: dst})
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: fsEntry(res.Entry)}), nil
}

// mixedMove is a move between the run's files and the sandbox's own
// filesystem: two stores, so no rename.
func mixedMove(src, dst string) error {
	return fault.New(fault.Unsupported, fmt.Sprintf("cannot move %q to %q: one is in the run's files (%s) and the other is not", src, dst, Home),
		"read the file and write it at the new path, then remove the old one")
}

// fileStatus is the status envd's REST routes (GET and POST /files) give
// what the sandbox refused, among those E2B's spec documents for them: a
// path the sandbox will not write or read (its read-only root, a symlink
// into the run's files, a sandbox with no filesystem of its own) is 400,
// the SDKs' InvalidArgumentError, and a full filesystem 507, their
// NotEnoughSpaceError. Triad's kind stays in the body. See
// docs/DECISIONS.md, "E2B files outside /home/user".
func fileStatus(err error) error {
	fe := fault.As(err)
	if fe == nil {
		return err
	}
	var ce *cmdfs.Error
	switch {
	case errors.As(err, &ce) && ce.NoSpace():
		return statusError{status: http.StatusInsufficientStorage, err: fe}
	case fe.Kind == fault.PermissionDenied, fe.Kind == fault.Unsupported:
		return statusError{status: http.StatusBadRequest, err: fe}
	}
	return err
}

// fileGetOutside is files.read of a path outside the run's files.
func (s *Server) fileGetOutside(w http.ResponseWriter, r *http.Request, p string) error {
	res, err := s.sandboxFS(r.Context(), orchestrator.FSRequest{Op: orchestrator.FSRead, Path: p})
	if err != nil {
		return fileStatus(err)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(res.Data)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(res.Data)
	}
	return nil
}

// writeOutside is files.write of one file outside the run's files.
func (s *Server) writeOutside(ctx context.Context, p string, body io.Reader, meta map[string]string) (writeInfo, error) {
	if len(meta) > 0 {
		return writeInfo{}, fileStatus(fault.New(fault.Unsupported, fmt.Sprintf("metadata on %q: only the run's files (%s) keep metadata", p, Home),
			"write it under "+Home+", or without metadata"))
	}
	if _, err := s.sandboxFS(ctx, orchestrator.FSRequest{Op: orchestrator.FSWrite, Path: p, Body: body}); err != nil {
		return writeInfo{}, fileStatus(err)
	}
	return writeInfo{Path: p, Name: path.Base(p), Type: "file"}, nil
}
