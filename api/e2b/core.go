package e2b

import (
	"context"
	"io"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Core is the part of Triad's orchestrator the E2B surface calls. Every E2B
// call that touches a sandbox's files or kernel goes through one of these
// methods, the one orchestration path, so it lands in the run's journal and
// is graded. *orchestrator.Orchestrator implements it.
type Core interface {
	// Exec is sandbox.exec: runCode and commands.run.
	Exec(ctx context.Context, run runid.ID, in wire.ExecRequest) (wire.ExecResponse, error)
	// WriteStream is tmp.write for a streamed body: files.write.
	WriteStream(ctx context.Context, run runid.ID, path string, r io.Reader) (wire.FileRef, error)
	// Open is tmp.read for streaming: files.read.
	Open(ctx context.Context, run runid.ID, path string) (tmpfs.File, *tmpfs.Reader, error)
	// List is tmp.list: files.list, exists and getInfo.
	List(ctx context.Context, run runid.ID, prefix string) (wire.ListResponse, error)
	// Delete is tmp.delete: files.remove.
	Delete(ctx context.Context, run runid.ID, path string) (wire.OK, error)
	// Restart restarts the run's kernel, keeping its files: restartCodeContext.
	Restart(ctx context.Context, run runid.ID) error
	// Stop ends the run's kernel, keeping its files: a sandbox past its
	// timeout, or killed.
	Stop(ctx context.Context, run runid.ID) error
	// Limits are the body limits the surface enforces before calling.
	Limits() orchestrator.Limits
}

// Blobs opens bytes by their content address. The surface reads back only
// what an Exec it made has just reported (images stored as run files, the
// full text of a capped stream) to inline it the way E2B's results carry it,
// exactly as GET /blobs/{sha256} serves them. *tmpfs.Store implements it.
type Blobs interface {
	OpenBlob(ctx context.Context, d tmpfs.Digest) (*tmpfs.Reader, error)
}

var (
	_ Core  = (*orchestrator.Orchestrator)(nil)
	_ Blobs = (*tmpfs.Store)(nil)
)
