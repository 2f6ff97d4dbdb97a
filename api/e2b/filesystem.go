package e2b

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	fspb "github.com/triadhq/triad/api/e2b/envd/filesystem"
	"github.com/triadhq/triad/api/e2b/envd/filesystem/filesystemconnect"
	"github.com/triadhq/triad/internal/fault"
)

// keepFile is the empty file files.makeDir writes: Triad's file space holds
// files, and a directory exists while a file is in it (DECISIONS.md, "E2B
// surface: directories").
const keepFile = ".keep"

// filesystemService is envd's filesystem.Filesystem over the run's files.
// Each method is one or more tmp.* calls on the orchestrator.
type filesystemService struct {
	s *Server
}

var _ filesystemconnect.FilesystemHandler = (*filesystemService)(nil)

// Stat is files.exists and files.getInfo: one tmp.list.
func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	if op, ok := outside(req.Msg.GetPath()); ok {
		return f.statOutside(ctx, op)
	}
	sb := sandboxOf(ctx)
	p, err := runPath(req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	t, err := f.s.listTree(ctx, sb.ID, p)
	if err != nil {
		return nil, connectErr(err)
	}
	file, dir := t.kind()
	switch {
	case file != nil:
		return connect.NewResponse(&fspb.StatResponse{Entry: fileEntry(*file, sb.metaOf(*file))}), nil
	case dir:
		return connect.NewResponse(&fspb.StatResponse{Entry: dirEntry(p, t.dirModTime())}), nil
	}
	return nil, connectErr(noPath(req.Msg.GetPath()))
}

func noPath(p string) error {
	return fault.New(fault.NotFound, fmt.Sprintf("path %q does not exist", p), "files.list shows what the sandbox has; write the file first with files.write")
}

// ListDir is files.list: one tmp.list, seen as a tree down to depth.
func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	if op, ok := outside(req.Msg.GetPath()); ok {
		return f.listOutside(ctx, op, max(int(req.Msg.GetDepth()), 1))
	}
	sb := sandboxOf(ctx)
	p, err := runPath(req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	t, err := f.s.listTree(ctx, sb.ID, p)
	if err != nil {
		return nil, connectErr(err)
	}
	file, dir := t.kind()
	switch {
	case file != nil:
		return nil, connectErr(fault.New(fault.BadInput, fmt.Sprintf("path %q is a file, not a directory", req.Msg.GetPath()), "files.read reads a file; files.list lists a directory"))
	case !dir:
		return nil, connectErr(noPath(req.Msg.GetPath()))
	}
	return connect.NewResponse(&fspb.ListDirResponse{Entries: t.entries(depth, sb)}), nil
}

// MakeDir is files.makeDir: the directory exists once it holds a file, so
// Triad writes an empty .keep in it (one tmp.write).
func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	if op, ok := outside(req.Msg.GetPath()); ok {
		return f.makeDirOutside(ctx, op)
	}
	sb := sandboxOf(ctx)
	p, err := runPath(req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	t, err := f.s.listTree(ctx, sb.ID, p)
	if err != nil {
		return nil, connectErr(err)
	}
	if file, dir := t.kind(); file != nil || dir {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("path %q already exists", req.Msg.GetPath()))
	}
	if _, err := f.s.c.Core.WriteStream(ctx, sb.ID, joinRun(p, keepFile), strings.NewReader("")); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: dirEntry(p, nowUTC())}), nil
}

// Remove is files.remove: tmp.delete of the file, or of every file under
// the directory; a path with nothing there is removed already.
func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	if op, ok := outside(req.Msg.GetPath()); ok {
		return f.removeOutside(ctx, op)
	}
	sb := sandboxOf(ctx)
	p, err := runPath(req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	if p == "" {
		return nil, connectErr(fault.New(fault.BadInput, fmt.Sprintf("%s is the sandbox's root", Home), "remove the files or directories under it"))
	}
	t, err := f.s.listTree(ctx, sb.ID, p)
	if err != nil {
		return nil, connectErr(err)
	}
	file, dir := t.kind()
	switch {
	case file != nil:
		if _, err := f.s.c.Core.Delete(ctx, sb.ID, p); err != nil {
			return nil, connectErr(err)
		}
		if err := f.s.dropMeta(ctx, sb.ID, []string{p}); err != nil {
			return nil, connectErr(err)
		}
	case dir:
		var gone []string
		for _, x := range t.below() {
			if _, err := f.s.c.Core.Delete(ctx, sb.ID, x.Path); err != nil {
				return nil, connectErr(err)
			}
			gone = append(gone, x.Path)
		}
		if err := f.s.dropMeta(ctx, sb.ID, gone); err != nil {
			return nil, connectErr(err)
		}
	default:
		// Nothing there: done, as envd's remove (os.RemoveAll) answers.
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

// Move is files.rename: each file is read, written at its new path and
// deleted at its old one (tmp.read, tmp.write, tmp.delete). It is not
// atomic; a failure part way leaves both paths, never neither.
func (f *filesystemService) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	osrc, srcOut := outside(req.Msg.GetSource())
	odst, dstOut := outside(req.Msg.GetDestination())
	switch {
	case srcOut && dstOut:
		return f.moveOutside(ctx, osrc, odst)
	case srcOut || dstOut:
		return nil, connectErr(mixedMove(req.Msg.GetSource(), req.Msg.GetDestination()))
	}
	sb := sandboxOf(ctx)
	src, err := runPath(req.Msg.GetSource())
	if err != nil {
		return nil, connectErr(err)
	}
	dst, err := runPath(req.Msg.GetDestination())
	if err != nil {
		return nil, connectErr(err)
	}
	if src == "" || dst == "" {
		return nil, connectErr(fault.New(fault.BadInput, fmt.Sprintf("%s, the sandbox's root, cannot be moved or replaced", Home), "move the files under it"))
	}
	if dst == src || strings.HasPrefix(dst, src+"/") {
		return nil, connectErr(fault.Badf("pick a destination outside the source", "cannot move %q into itself", req.Msg.GetSource()))
	}
	t, err := f.s.listTree(ctx, sb.ID, src)
	if err != nil {
		return nil, connectErr(err)
	}
	file, dir := t.kind()
	var moves [][2]string
	switch {
	case file != nil:
		moves = append(moves, [2]string{src, dst})
	case dir:
		for _, x := range t.below() {
			moves = append(moves, [2]string{x.Path, dst + strings.TrimPrefix(x.Path, src)})
		}
	default:
		return nil, connectErr(noPath(req.Msg.GetSource()))
	}
	var last *fspb.EntryInfo
	for _, m := range moves {
		e, err := f.s.moveFile(ctx, sb, m[0], m[1])
		if err != nil {
			return nil, connectErr(err)
		}
		last = e
	}
	if err := f.s.moveMeta(ctx, sb.ID, moves); err != nil {
		return nil, connectErr(err)
	}
	if dir {
		last = dirEntry(dst, nowUTC())
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: last}), nil
}

func (s *Server) moveFile(ctx context.Context, sb Sandbox, src, dst string) (*fspb.EntryInfo, error) {
	_, rd, err := s.c.Core.Open(ctx, sb.ID, src)
	if err != nil {
		return nil, err
	}
	ref, err := s.c.Core.WriteStream(ctx, sb.ID, dst, rd)
	rd.Close()
	if err != nil {
		return nil, err
	}
	if _, err := s.c.Core.Delete(ctx, sb.ID, src); err != nil {
		return nil, err
	}
	// The metadata moves with the bytes (see Move).
	return fileEntry(listed(ref), sb.metaAt(src, ref.SHA256)), nil
}

// connectCode maps a fault kind to the Connect code the SDKs turn into the
// matching exception (docs/e2b-protocol.md §3).
func connectCode(k fault.Kind) connect.Code {
	switch k {
	case fault.BadInput, fault.MissingRun, fault.InvalidRun:
		return connect.CodeInvalidArgument
	case fault.NotFound:
		return connect.CodeNotFound
	case fault.Conflict:
		return connect.CodeAlreadyExists
	case fault.TooLarge:
		return connect.CodeFailedPrecondition
	case fault.Unsupported:
		return connect.CodeUnimplemented
	case fault.Reserved, fault.PermissionDenied:
		return connect.CodePermissionDenied
	case fault.Quota:
		return connect.CodeResourceExhausted
	case fault.Timeout:
		return connect.CodeDeadlineExceeded
	case fault.Auth:
		return connect.CodeUnauthenticated
	case fault.NotConfigured, fault.StoreUnavailable, fault.Unavailable, fault.KernelDied, fault.Upstream:
		return connect.CodeUnavailable
	}
	return connect.CodeInternal
}

// connectErr turns an error from the orchestrator into a Connect error whose
// message carries Triad's suggestion.
func connectErr(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	fe, _ := classify(err)
	return connect.NewError(connectCode(fe.Kind), errors.New(sdkMessage(fe)))
}
