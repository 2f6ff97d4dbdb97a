package e2b

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// Core is the part of Triad's orchestrator the E2B surface calls. Every E2B
// call that touches a sandbox's files or kernel goes through one of these
// methods, the one orchestration path, so it lands in the run's journal and
// is graded. *orchestrator.Orchestrator implements it.
type Core interface {
	// Create starts a sandbox's run as the caller's tenant's: its owner
	// is decided there, before the sandbox id is handed out.
	Create(ctx context.Context, run runid.ID, opts ...orchestrator.RunOption) error
	// Visible checks that the caller may see a sandbox's run: another
	// tenant's is not found.
	Visible(ctx context.Context, run runid.ID) error
	// Creator is who the data plane acts as: the data plane is admitted
	// by the sandbox's access token, and calls as the run's creator.
	Creator(ctx context.Context, run runid.ID) (auth.Principal, error)
	// Adopt and Retire migrate the records Triad kept before the core
	// owned every run (see Legacy).
	Adopt(ctx context.Context, run runid.ID, p auth.Principal, created time.Time) error
	Retire(ctx context.Context, run runid.ID) error
	// ExecStream is sandbox.exec with the cell's output handed to on as
	// it arrives: runCode, with the sandbox's envs (orchestrator.WithEnv).
	ExecStream(ctx context.Context, run runid.ID, in wire.ExecRequest, on func(orchestrator.ExecEvent), opts ...orchestrator.CallOption) (wire.ExecResponse, error)
	// StartCommand starts a bash command in the run's kernel container,
	// which runs without holding the run: commands.run.
	StartCommand(ctx context.Context, run runid.ID, in wire.ExecRequest, on func(orchestrator.ExecEvent), opts ...orchestrator.CallOption) (*orchestrator.Command, error)
	// NewContext, Contexts, RestartContext and RemoveContext manage the
	// run's code contexts: createCodeContext, listCodeContexts,
	// restartCodeContext (the empty id restarts the run's kernel) and
	// removeCodeContext.
	NewContext(ctx context.Context, run runid.ID, cwd, language string) (wire.Context, error)
	Contexts(run runid.ID) []wire.Context
	// Languages lists the languages the sandbox's kernels run, Python
	// first: each has a default context.
	Languages() []string
	RestartContext(ctx context.Context, run runid.ID, id string) error
	RemoveContext(ctx context.Context, run runid.ID, id string) error
	// WriteStream is tmp.write for a streamed body: files.write.
	WriteStream(ctx context.Context, run runid.ID, path string, r io.Reader, opts ...orchestrator.CallOption) (wire.FileRef, error)
	// Open is tmp.read for streaming: files.read.
	Open(ctx context.Context, run runid.ID, path string, opts ...orchestrator.CallOption) (tmpfs.File, *tmpfs.Reader, error)
	// List is tmp.list: files.list, exists and getInfo.
	List(ctx context.Context, run runid.ID, prefix string, opts ...orchestrator.CallOption) (wire.ListResponse, error)
	// WorkingFiles lists the run's working directory as it is now (the
	// store's index and the live kernel's directory), a read that is not
	// journaled: files.watchDir polls it.
	WorkingFiles(ctx context.Context, run runid.ID, prefix string) (map[string]orchestrator.FileState, error)
	// Delete is tmp.delete: files.remove.
	Delete(ctx context.Context, run runid.ID, path string, opts ...orchestrator.CallOption) (wire.OK, error)
	// SandboxFS is sandbox.fs: files.* on a path of the sandbox's own
	// filesystem outside the run's files (/tmp/repo/README.md).
	SandboxFS(ctx context.Context, run runid.ID, req orchestrator.FSRequest) (orchestrator.FSResult, error)
	// Stop ends the run's kernel, keeping its files: a sandbox past its
	// timeout, or killed.
	Stop(ctx context.Context, run runid.ID) error
	// Limits are the body limits the surface enforces before calling.
	Limits() orchestrator.Limits
	// SetRunSetup records a new sandbox's run setup: its template and its
	// egress policy (the template's, narrowed by the sandbox's network
	// options), chosen once at create.
	SetRunSetup(ctx context.Context, run runid.ID, s wire.RunSetup) (wire.RunSetup, error)
	// CheckSetup validates a setup before the run is created.
	CheckSetup(ctx context.Context, run runid.ID, s wire.RunSetup) error
	// Snapshot keeps a sandbox's files by reference as a snapshot (a step
	// of its run): createSnapshot. Fork makes a sandbox's run from a run
	// or a snapshot: fork, and create from a snapshot. SnapshotInfo,
	// Snapshots and DeleteSnapshot are getting one, listSnapshots and
	// deleteSnapshot; another tenant's snapshot is not found.
	Snapshot(ctx context.Context, run runid.ID, in wire.SnapshotRequest) (wire.Snapshot, error)
	Fork(ctx context.Context, from, into runid.ID) (wire.Fork, error)
	SnapshotInfo(ctx context.Context, id runid.ID) (wire.Snapshot, error)
	Snapshots(ctx context.Context, q orchestrator.SnapshotQuery) ([]wire.Snapshot, error)
	DeleteSnapshot(ctx context.Context, id runid.ID) error
	// DialPort connects to a port in the sandbox for a getHost request,
	// a step of the run's journal; Usage reads what the sandbox's kernel
	// uses now, from its cgroup: getMetrics.
	DialPort(ctx context.Context, run runid.ID, port int, request, via string) (net.Conn, error)
	Usage(ctx context.Context, run runid.ID) (sandbox.Usage, bool, error)
}

var _ Core = (*orchestrator.Orchestrator)(nil)
