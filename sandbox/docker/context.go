package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/image"
)

var (
	_ sandbox.Contexts  = (*Kernel)(nil)
	_ sandbox.Languages = (*Kernel)(nil)
)

// MaxContexts is how many contexts one kernel may have at a time. Each is a
// full interpreter sharing the container's memory, pids and socket
// directory (sized for this many, see socketDirInodes).
const MaxContexts = 8

// socketDirInodes bounds the files of a kernel's socket directory: its own
// connection file and five sockets, and per context one more of each plus
// a pid file, with room to spare.
const socketDirInodes = 16 + 8*MaxContexts

// ErrTooManyContexts means a kernel already has MaxContexts contexts;
// close one first.
var ErrTooManyContexts = errors.New("docker: too many contexts")

// contextCmd starts a context's interpreter: the shell seeds matplotlib's
// font cache (a restarted container has a fresh home), records its pid (the
// host signals the interpreter through it: docker cannot signal an exec),
// enters the context's directory, made if missing, and execs the
// language's kernel: for Python the same ipykernel boot as the kernel's.
// The pid file, directory and connection file come from the environment,
// so no value is spliced into the script.
func contextCmd(language string) []string {
	return []string{"/bin/sh", "-c", `mkdir -p "$MPLCONFIGDIR" && cp -a ` + image.MPLSeed + `/. "$MPLCONFIGDIR"/ 2>/dev/null; ` +
		`echo $$ >"$TRIAD_PIDFILE" && mkdir -p "$TRIAD_CWD" && cd "$TRIAD_CWD" && exec ` + languageKernels[language]}
}

// languageKernels are the commands that start each language's Jupyter
// kernel on the connection file $TRIAD_CONN (ipc sockets in the socket
// directory). See docs/DECISIONS.md, "Kernels in more languages".
var languageKernels = map[string]string{
	sandbox.LanguagePython: `python3 -c '` + image.KernelLauncher + `' -f "$TRIAD_CONN" ` +
		`--InteractiveShell.colors=NoColor --HistoryManager.enabled=False --IPKernelApp.quiet=True`,
	// IRkernel (Debian's r-cran-irkernel) speaks ipc through pbdZMQ.
	sandbox.LanguageR: `R --no-echo --no-save --no-restore -e "IRkernel::main()" --args "$TRIAD_CONN"`,
	// Triad's own bash kernel (sandbox/image/python).
	sandbox.LanguageBash: `python3 -m triad_bash_kernel -f "$TRIAD_CONN" --IPKernelApp.quiet=True`,
	// Deno's kernel runs JavaScript and TypeScript alike; it binds tcp
	// only, so a relay joins it to the ipc sockets.
	sandbox.LanguageJavaScript: `python3 -m triad_deno_kernel "$TRIAD_CONN"`,
	sandbox.LanguageTypeScript: `python3 -m triad_deno_kernel "$TRIAD_CONN"`,
}

// stdioBarriers are the jupyter.Options.StdioBarrier of the languages
// whose kernel may publish a cell's console output after the cell's idle:
// Deno's (DECISIONS, "A cell's late stdout").
var stdioBarriers = map[string]func(token string) string{
	sandbox.LanguageJavaScript: denoBarrier,
	sandbox.LanguageTypeScript: denoBarrier,
}

// denoBarrier writes token with console.log, which Deno's kernel queues
// behind every line a cell wrote before it.
func denoBarrier(token string) string { return "console.log(" + strconv.Quote(token) + ")" }

// Languages implements sandbox.Languages.
func (k *Kernel) Languages() []string { return k.b.Languages() }

var _ sandbox.Polyglot = (*Backend)(nil)

// Languages implements sandbox.Polyglot: the image's kernels besides
// Python's.
func (b *Backend) Languages() []string {
	return []string{sandbox.LanguageR, sandbox.LanguageBash, sandbox.LanguageJavaScript, sandbox.LanguageTypeScript}
}

// NewContext implements sandbox.Contexts: a second ipykernel in the
// kernel's container, started with docker exec as the kernel's uid, so it
// has the same jail and limits (shared with the kernel) and the same
// working directory; its connection file and sockets sit in the kernel's
// socket directory. Restarting the kernel restarts its container, which
// ends its contexts: each reports that as a death on its next cell and
// comes back fresh. See docs/DECISIONS.md, "Contexts and commands at the
// seam".
func (k *Kernel) NewContext(ctx context.Context, cwd string) (sandbox.Kernel, error) {
	return k.NewLanguageContext(ctx, cwd, sandbox.LanguagePython)
}

// NewLanguageContext implements sandbox.Languages: a context as NewContext
// makes, whose interpreter is the language's Jupyter kernel.
func (k *Kernel) NewLanguageContext(ctx context.Context, cwd, language string) (sandbox.Kernel, error) {
	if k.parent != nil {
		return k.parent.NewLanguageContext(ctx, cwd, language)
	}
	if _, ok := languageKernels[language]; !ok {
		return nil, fmt.Errorf("language %q: %w", language, sandbox.ErrLanguage)
	}
	dir := ctrWork
	if cwd != "" {
		d, err := safepath.Clean(cwd)
		if err != nil {
			return nil, err
		}
		dir = ctrWork + "/" + d
	}
	var r [3]byte
	_, _ = rand.Read(r[:])
	c := &Kernel{
		b:           k.b,
		id:          k.id,
		owner:       k.owner,
		limits:      k.limits,
		sockDir:     k.sockDir,
		files:       k.files,
		containerID: k.containerID,
		parent:      k,
		name:        "c" + hex.EncodeToString(r[:]),
		cwd:         dir,
		language:    language,
		closing:     make(chan struct{}),
	}
	k.ctxMu.Lock()
	switch {
	case k.isClosing():
		k.ctxMu.Unlock()
		return nil, sandbox.ErrClosed
	case len(k.contexts) >= MaxContexts:
		k.ctxMu.Unlock()
		return nil, fmt.Errorf("kernel %s has %d contexts: %w", k.ID(), MaxContexts, ErrTooManyContexts)
	}
	if k.contexts == nil {
		k.contexts = map[*Kernel]struct{}{}
	}
	k.contexts[c] = struct{}{}
	k.ctxMu.Unlock()

	c.mu.Lock()
	defer c.mu.Unlock()
	t := time.Now()
	if err := c.boot(ctx); err != nil {
		_ = c.teardownContext()
		return nil, fmt.Errorf("start %s context in kernel %s: %w", language, k.ID(), err)
	}
	k.b.log.InfoContext(ctx, "sandbox context started", "kernel", c.ID(), "owner", k.owner, "language", language, "cwd", dir, "duration", time.Since(t).Round(time.Millisecond))
	c.phases = nil
	return c, nil
}

// startExec starts a context's interpreter as a docker exec, attached so
// that the end of its output stream tells the host it exited. What it
// writes there is diagnostics, drained and dropped.
func (k *Kernel) startExec(ctx context.Context) error {
	b := k.b
	cctx, cancel := context.WithTimeout(ctx, engineCallTimeout)
	defer cancel()
	ex, err := b.cli.ContainerExecCreate(cctx, k.containerID, container.ExecOptions{
		User:         fmt.Sprintf("%d:%d", b.cfg.UID, b.cfg.GID),
		AttachStdout: true,
		AttachStderr: true,
		Env: []string{
			"TRIAD_PIDFILE=" + ctrSockets + "/" + k.name + ".pid",
			"TRIAD_CWD=" + k.cwd,
			"TRIAD_CONN=" + ctrSockets + "/" + k.connFile(),
		},
		WorkingDir: ctrWork,
		Cmd:        contextCmd(k.language),
	})
	if err != nil {
		return fmt.Errorf("create exec: %w", err)
	}
	att, err := b.cli.ContainerExecAttach(cctx, ex.ID, container.ExecAttachOptions{})
	if err != nil {
		return fmt.Errorf("start exec: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_, _ = io.Copy(io.Discard, att.Reader)
	}()
	k.exited, k.stopWatch = exited, att.Close
	k.execID = ex.ID
	return nil
}

// signal sends a signal to the interpreter: to the container's init (which
// passes it on) for a kernel, to the context's recorded pid for a context.
func (k *Kernel) signal(ctx context.Context, sig string) error {
	if k.parent == nil {
		return k.b.cli.ContainerKill(ctx, k.containerID, "SIG"+sig)
	}
	return k.execQuiet(ctx, []string{"/bin/sh", "-c", `kill -s "$1" "$(cat "$2")"`, "sh", sig, ctrSockets + "/" + k.name + ".pid"})
}

// execQuiet runs a short helper command in the container as the kernel's
// uid and waits for it; a non-zero exit is an error.
func (k *Kernel) execQuiet(ctx context.Context, argv []string) error {
	b := k.b
	ex, err := b.cli.ContainerExecCreate(ctx, k.containerID, container.ExecOptions{
		User: fmt.Sprintf("%d:%d", b.cfg.UID, b.cfg.GID), AttachStdout: true, AttachStderr: true, Cmd: argv,
	})
	if err != nil {
		return err
	}
	att, err := b.cli.ContainerExecAttach(ctx, ex.ID, container.ExecAttachOptions{})
	if err != nil {
		return err
	}
	out, _ := io.ReadAll(io.LimitReader(att.Reader, 4096))
	att.Close()
	code, err := k.execExitCode(ctx, ex.ID)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("%s exited with %d: %q", argv[0], code, out)
	}
	return nil
}

// restartContext kills the context's interpreter, if it still runs, and
// boots a fresh one in the container. k.mu is held.
func (k *Kernel) restartContext(ctx context.Context) error {
	k.killContext(ctx)
	t := time.Now()
	if err := k.boot(ctx); err != nil {
		return err
	}
	k.b.log.InfoContext(ctx, "sandbox context restarted", "kernel", k.ID(), "owner", k.owner, "duration", time.Since(t).Round(time.Millisecond))
	k.phases = nil
	return nil
}

// killContext kills the context's interpreter and waits for its exec to
// end. A container that no longer runs has killed it already.
func (k *Kernel) killContext(ctx context.Context) {
	if k.exited == nil {
		return
	}
	select {
	case <-k.exited:
	default:
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), engineCallTimeout)
		defer cancel()
		if err := k.signal(kctx, "KILL"); err != nil {
			k.b.log.WarnContext(ctx, "kill context interpreter", "kernel", k.ID(), "err", err)
		}
		select {
		case <-k.exited:
		case <-kctx.Done():
		}
	}
	if k.stopWatch != nil {
		k.stopWatch()
	}
}

// contextDeathReason says why a context's interpreter ended: the
// container restarted under it (its kernel restarted or died), or the
// interpreter's own exit code.
func (k *Kernel) contextDeathReason(ctx context.Context) string {
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), engineCallTimeout)
	defer cancel()
	if info, err := k.b.cli.ContainerInspect(ictx, k.containerID); err == nil && info.State != nil {
		started, _ := time.Parse(time.RFC3339Nano, info.State.StartedAt)
		if !info.State.Running || started.After(k.bootedAt) {
			return "the sandbox's kernel was restarted or died, which ends its contexts"
		}
	}
	ex, err := k.b.cli.ContainerExecInspect(ictx, k.execID)
	switch {
	case err != nil:
		return "unknown: " + err.Error()
	case ex.Running:
		return "the context stopped answering"
	case ex.ExitCode > 128:
		return fmt.Sprintf("killed by signal %d (exit code %d)", ex.ExitCode-128, ex.ExitCode)
	default:
		return fmt.Sprintf("exited with code %d", ex.ExitCode)
	}
}

// teardownContext stops a context's interpreter and removes its files
// from the socket directory; the container, the working directory and the
// other interpreters stay. k.mu is held.
func (k *Kernel) teardownContext() error {
	k.stopKernel()
	k.killContext(context.Background())
	k.removeSockFiles()
	p := k.parent
	p.ctxMu.Lock()
	delete(p.contexts, k)
	p.ctxMu.Unlock()
	return nil
}
