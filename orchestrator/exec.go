package orchestrator

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
	"github.com/triadhq/triad/orchestrator/kernels"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// ExecConfig bounds cells.
type ExecConfig struct {
	DefaultTimeout time.Duration // 60 s
	MaxTimeout     time.Duration // 10 min
	// StreamCap caps stdout, stderr and each text output in the answer; the
	// full text is kept as a run file.
	StreamCap int // 64 KiB
	// SpoolDir holds the temporary files that streams longer than
	// StreamCap spill into while a cell runs (default os.TempDir()); each
	// is bounded by the cell's output limit and removed after the call.
	SpoolDir string
}

func (c *ExecConfig) defaults() {
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = 60 * time.Second
	}
	if c.MaxTimeout == 0 {
		c.MaxTimeout = 10 * time.Minute
	}
	if c.StreamCap == 0 {
		c.StreamCap = 64 << 10
	}
	if c.SpoolDir == "" {
		c.SpoolDir = os.TempDir()
	}
}

// Exec is sandbox.exec.
func (o *Orchestrator) Exec(ctx context.Context, run runid.ID, in wire.ExecRequest, opts ...CallOption) (wire.ExecResponse, error) {
	return o.ExecStream(ctx, run, in, nil, opts...)
}

// CellEnv is the environment a cell runs with beyond its kernel's,
// for values that are secrets (an E2B sandbox's envs): Triad sets them in
// os.environ with setup cells of its own, which are never kept, journaled
// or traced. The Step Block and the trace name the variables, never their
// values. See docs/DECISIONS.md, "Sealed secrets".
type CellEnv struct {
	// Kernel variables are set once in each interpreter (the run's kernel,
	// or a context), before the first cell run with them; a cell may
	// change them for the cells after it.
	Kernel map[string]string
	// Call variables are set for this cell and restored after it: to
	// their Kernel value, or unset.
	Call map[string]string
}

func (e CellEnv) empty() bool { return len(e.Kernel) == 0 && len(e.Call) == 0 }

// keys are the variables' names, sorted, for the journal.
func (e CellEnv) keys() []string {
	seen := map[string]bool{}
	for k := range e.Kernel {
		seen[k] = true
	}
	for k := range e.Call {
		seen[k] = true
	}
	return slices.Sorted(maps.Keys(seen))
}

// ExecStream is sandbox.exec with the cell's output handed to on as it
// arrives (stdout and stderr chunks, displays, the result), before the
// answer; on runs on the sandbox's goroutine and must not block for long.
// The answer and the journal are exactly Exec's: streaming is a view of
// the same call, not a second path.
//
// A cell may name a code context (in.Context, see NewContext), whose
// interpreter then runs it; with language bash it is a command in the
// run's kernel container, run in the foreground: the run's other calls
// wait for it, as for a cell (StartCommand runs one without holding the
// run).
func (o *Orchestrator) ExecStream(ctx context.Context, run runid.ID, in wire.ExecRequest, on func(ExecEvent), opts ...CallOption) (wire.ExecResponse, error) {
	if o.kernels == nil {
		return wire.ExecResponse{}, fault.New(fault.NotConfigured, "no sandbox backend is configured", "start triad with --sandbox docker, wasm or auto")
	}
	if err := validateExec(o.kernels, run, &in); err != nil {
		return wire.ExecResponse{}, err
	}
	co := callOpts(opts)
	if !co.env.empty() {
		if in.Language == wire.LanguageBash && in.Context == "" {
			return wire.ExecResponse{}, fault.New(fault.BadInput, "a command's environment is its env", "send the variables in env")
		}
		if err := validEnv(co.env.Kernel); err != nil {
			return wire.ExecResponse{}, err
		}
		if err := validEnv(co.env.Call); err != nil {
			return wire.ExecResponse{}, err
		}
	}
	timeout := o.exec.timeout(in)
	oc := execOutcome(in, timeout)
	if !co.env.empty() {
		oc.EnvKeys = co.env.keys()
	}
	var out wire.ExecResponse
	err := o.call(ctx, run, oc, opts, func(ctx context.Context, c *call) error {
		x := &cell{call: c, in: in, env: co.env, timeout: timeout, oc: oc, on: on}
		kept := x.keepCode(ctx)
		var err error
		if in.Language == wire.LanguageBash && in.Context == "" {
			err = x.command(ctx)
		} else {
			err = x.python(ctx)
		}
		out = x.out
		if kerr := kept(); kerr != nil && err == nil {
			return kerr
		}
		return err
	})
	return out, err
}

// cell is one sandbox.exec in flight: its call, its request and its
// outcome, which its steps take.
type cell struct {
	*call
	in      wire.ExecRequest
	env     CellEnv
	timeout time.Duration
	oc      *ExecOutcome
	on      func(ExecEvent)
	out     wire.ExecResponse
	// kernel is the run's kernel session once acquired.
	kernel *kernels.Session
}

// execTimeout is the call's deadline: the request's, or the default, and
// never past the maximum.
func (c ExecConfig) timeout(in wire.ExecRequest) time.Duration {
	timeout := c.DefaultTimeout
	if in.TimeoutS != nil {
		timeout = time.Duration(*in.TimeoutS * float64(time.Second))
	}
	return min(timeout, c.MaxTimeout)
}

func execOutcome(in wire.ExecRequest, timeout time.Duration) *ExecOutcome {
	oc := &ExecOutcome{Code: codeSummary(in.Code), TimeoutS: timeout.Seconds(), FilesIn: in.FilesIn, Timeout: timeout,
		Context: in.Context, Cwd: in.Cwd}
	oc.Language = in.Language
	if in.Language == wire.LanguageBash && in.Context == "" {
		oc.EnvKeys = slices.Sorted(maps.Keys(in.Env))
	}
	return oc
}

func validateExec(km *kernels.Manager, run runid.ID, in *wire.ExecRequest) error {
	if strings.TrimSpace(in.Code) == "" {
		return fault.New(fault.BadInput, "code is empty", "send Python source in code (or the command, with language bash)")
	}
	if err := validateLanguage(km, run, in); err != nil {
		return err
	}
	if in.TimeoutS != nil && !(*in.TimeoutS > 0) {
		return fault.Badf("send timeout_s > 0, or omit it for the server default", "timeout_s is %v; it must be positive", *in.TimeoutS)
	}
	for i, f := range in.FilesIn {
		n, err := writable(f.Name)
		if fe := fault.As(err); fe != nil {
			if fe.Kind == fault.Reserved {
				return fault.New(fe.Kind, fmt.Sprintf("files_in[%d].name: %s", i, fe.Message), "pick another name; "+fe.Suggestion)
			}
			return fault.Badf("name is where the file appears in the working directory: a relative path", "files_in[%d].name: %v", i, fe.Message)
		}
		in.FilesIn[i].Name = n
		if _, ok := fileInDigest(f.Path); !ok {
			p, err := safepath.Clean(f.Path)
			if err != nil {
				fe := fault.As(err)
				return fault.Badf("path is a run file's path, or sha256:<64 lower-case hex digits>: "+fe.Suggestion, "files_in[%d].path: %s", i, fe.Message)
			}
			in.FilesIn[i].Path = p
		}
	}
	return nil
}

// validateLanguage settles which interpreter runs the cell (see
// wire.ExecRequest.Language and Context): afterwards in.Language is ""
// for Python, "bash" with an empty Context for a command, and otherwise
// the cell's language with Context naming a context of that language or
// the language itself (its default interpreter).
func validateLanguage(km *kernels.Manager, run runid.ID, in *wire.ExecRequest) error {
	lang := in.Language
	if lang == wire.LanguagePython {
		lang = ""
	}
	if lang != "" && !slices.Contains(wire.Languages, lang) {
		return fault.Badf("send one of "+strings.Join(wire.Languages, ", ")+", or omit language for Python",
			"language %q is not supported", in.Language)
	}
	switch {
	case in.Context == "" || in.Context == wire.LanguagePython && lang == "":
		in.Context = ""
		if lang != "" && lang != wire.LanguageBash {
			in.Context = lang // the language's default interpreter
		}
	case slices.Contains(wire.Languages, in.Context):
		// A language's default interpreter, named.
		if lang == "" {
			lang = in.Context
		}
		if lang != in.Context {
			return fault.Badf("omit context, or name an interpreter of language "+lang,
				"context %q is the default %s interpreter, not a %s one", in.Context, in.Context, lang)
		}
		if lang == wire.LanguagePython {
			lang, in.Context = "", ""
		}
	default:
		c, ok := km.Context(run, in.Context)
		if !ok {
			return fault.New(fault.NotFound, fmt.Sprintf("run %s has no context %q", run, in.Context),
				"create the context first, or omit context to use the run's kernel")
		}
		cl := c.Language
		if cl == wire.LanguagePython {
			cl = ""
		}
		if in.Language != "" && lang != cl {
			return fault.Badf("omit language to run the cell in the context's, or name another context",
				"context %s runs %s, not %s", in.Context, c.Language, in.Language)
		}
		lang = cl
	}
	in.Language = lang
	if lang == wire.LanguageBash && in.Context == "" {
		// A command.
		if in.Cwd != "" {
			c, err := safepath.Clean(in.Cwd)
			if err != nil {
				fe := fault.As(err)
				return fault.Badf("cwd is a directory of the run's files: "+fe.Suggestion, "cwd: %s", fe.Message)
			}
			in.Cwd = c
		}
		return validEnv(in.Env)
	}
	if in.Env != nil || in.Cwd != "" {
		return fault.New(fault.BadInput, "env and cwd apply to bash commands only",
			"set the environment and directory in the cell itself, or send language \"bash\" without a context")
	}
	return nil
}

// validEnv checks a command's environment variables.
func validEnv(env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fault.Badf("environment variable names are non-empty and hold no '=' or NUL; values hold no NUL",
				"environment variable %q is not valid", k)
		}
	}
	return nil
}

// session acquires the run's kernel for the cell, within its tenant's
// kernel quota, and sets it up if it just started. The cell releases it.
func (x *cell) session(ctx context.Context) error {
	o := x.o
	spec, err := o.setups.spec(ctx, x.r)
	if err != nil {
		return err
	}
	sess, err := o.kernels.Acquire(ctx, x.run, spec, o.claim(x.who, x.owner))
	if err != nil {
		return sandboxErr(err) // a quota's refusal passes through
	}
	if err := o.setups.prepare(ctx, x.r, sess, x.oc); err != nil {
		o.kernels.Release(sess)
		return err
	}
	x.kernel = sess
	return nil
}

// python runs a Python cell in the run's kernel (or the context it
// names).
func (x *cell) python(ctx context.Context) error {
	o, in, oc := x.o, x.in, x.oc
	x.out = wire.ExecResponse{Display: []wire.Bundle{}, FilesOut: []wire.FileRef{}, Kernel: wire.KernelInfo{Backend: o.kernels.Backend()}}
	oc.Backend = x.out.Kernel.Backend
	if err := x.session(ctx); err != nil {
		return err
	}
	sess := x.kernel
	// The session is busy, so the idle reaper leaves it alone, until the
	// cell's files are harvested and its outputs kept.
	defer o.kernels.Release(sess)
	if err := x.filesIn(ctx); err != nil {
		return err
	}
	k, fresh := sess.Kernel, false
	switch {
	case in.Context == "":
	case in.Context == in.Language:
		var err error
		if k, fresh, err = o.kernels.LanguageKernel(ctx, x.run, sess, in.Language); err != nil {
			return contextErr(err, x.run, in.Context)
		}
	default:
		var err error
		if k, fresh, err = o.kernels.ContextKernel(ctx, x.run, sess, in.Context); err != nil {
			return contextErr(err, x.run, in.Context)
		}
	}
	if env := x.env; !env.empty() {
		// The values go to the interpreter in setup cells, which are not
		// kept: the cell's kept source, its trace and its Step Block never
		// hold them.
		if err := runSetupCell(ctx, k, env.setCode(in.Language)); err != nil {
			return sandboxErr(fmt.Errorf("set the cell's environment variables: %w", err))
		}
		defer func() {
			if len(env.Call) == 0 {
				return
			}
			if err := runSetupCell(context.WithoutCancel(ctx), k, env.resetCode(in.Language)); err != nil {
				o.log.WarnContext(ctx, "restore the environment after a cell", "run", x.run, "err", err)
			}
		}()
	}
	// Streams are kept to StreamCap in memory and spooled past it; the
	// caller's callback, if any, sees every event as it arrives.
	outp := newOutput(o.exec.StreamCap, o.exec.SpoolDir, x.on)
	defer outp.close()
	// The cell's own context: GET /kernels' interrupt cancels it, which
	// the kernel takes as a hang-up (it interrupts the cell and keeps its
	// state if the cell stops in time).
	cellCtx, interrupt := context.WithCancel(ctx)
	defer interrupt()
	running := o.kernels.Running(sess, interrupt)
	o.metrics.cellRunning(1)
	res, err := k.Execute(cellCtx, sandbox.Cell{Code: in.Code, Timeout: x.timeout, Output: outp.add})
	o.metrics.cellRunning(-1)
	running()
	if err != nil {
		// The interpreter was unusable before the cell ran: drop it so
		// the next call starts fresh (unless the caller had already
		// gone, or the cell was interrupted, which says nothing about the
		// interpreter). A caller who hangs up while the cell runs gets a
		// Result, not an error, and the kernel is kept (sandbox.Kernel's
		// hang-up contract).
		if cellCtx.Err() == nil {
			if in.Context != "" {
				o.kernels.DropContext(sess, in.Context)
			} else {
				o.kernels.Drop(x.run)
			}
		}
		return sandboxErr(err)
	}
	if res.Restarted && in.Context == "" {
		// Set up for the next cell even if this one's caller hung up.
		if err := o.setups.restarted(context.WithoutCancel(ctx), x.r, sess); err != nil {
			o.log.ErrorContext(ctx, "set up the restarted kernel", "run", x.run, "err", err)
		}
	}
	res.Restarted = res.Restarted || fresh
	// The cell ran, if only until the caller hung up: what it wrote is
	// harvested whole either way, so the store matches the directory.
	if err := x.harvest(ctx); err != nil {
		return err
	}
	x.oc.Egress = o.sb.take(x.run)
	out := &x.out
	out.OK = res.OK
	out.ExecutionCount = res.ExecutionCount
	out.DurationMs = res.Duration.Milliseconds()
	out.Kernel.Restarted = res.Restarted
	out.BackgroundThreads = res.Threads
	prefix := fmt.Sprintf("outputs/exec-%04d", res.ExecutionCount)
	if res.ExecutionCount == 0 || res.Restarted || in.Context != "" {
		// A context counts its own cells: name its outputs by time, as
		// a restarted kernel's, so they never collide with the kernel's.
		prefix = fmt.Sprintf("outputs/exec-%s", time.Now().UTC().Format("20060102T150405.000"))
	}
	keep := func(name string, data []byte) (tmpfs.File, error) {
		f, err := o.store.WriteBytes(ctx, x.run, prefix+"-"+name, data)
		if err != nil {
			return f, err
		}
		x.step.Artifacts = append(x.step.Artifacts, f)
		return f, sess.Dir.Put(ctx, f)
	}
	x.keepStreams(ctx, outp, prefix)
	// A caller in the process (the recipe runner) gets the image bytes
	// from here, not by reading them back from the store.
	var images map[string][]byte
	if r := x.opts.info.Receipt; r != nil {
		images = map[string][]byte{}
		r.Images = images
	}
	for i, b := range outp.display {
		sb, trunc := shapeBundle(b, fmt.Sprintf("display-%d", i+1), o.exec.StreamCap, keep, images)
		out.Truncated = out.Truncated || trunc
		out.Display = append(out.Display, sb)
	}
	if outp.value != nil {
		sb, trunc := shapeBundle(*outp.value, "result", o.exec.StreamCap, keep, images)
		out.Truncated = out.Truncated || trunc
		out.Result = &sb
	}
	if res.Error != nil {
		out.Error = execError(res.Error, x.timeout)
	}
	oc.Ran, oc.OK, oc.Error, oc.Stderr, oc.Restarted = true, out.OK, out.Error, out.Stderr, out.Kernel.Restarted
	return nil
}

// filesIn copies the cell's files_in into the session's working directory.
func (x *cell) filesIn(ctx context.Context) error {
	o := x.o
	for i, f := range x.in.FilesIn {
		src, err := x.resolveFileIn(ctx, f.Path)
		if err != nil {
			fe := fault.From(err)
			return fault.Wrap(fe.Kind, err, fmt.Sprintf("files_in[%d]: %s", i, fe.Message), fe.Suggestion)
		}
		linked, err := o.store.Link(ctx, x.run, f.Name, src.SHA256, src.Size)
		if err != nil {
			return storeErr(err, x.run, f.Name)
		}
		x.step.Touched = append(x.step.Touched, linked.Path)
		if err := x.kernel.Dir.Put(ctx, linked); err != nil {
			return fault.Wrap(fault.Internal, err, "copy files_in into the working directory", "retry; if the disk quota is full, delete files first")
		}
	}
	return nil
}

// harvest stores what the cell left in the working directory, so the
// store matches it, and notes it in the step and the answer.
func (x *cell) harvest(ctx context.Context) error {
	o, s, oc, out := x.o, x.step, x.oc, &x.out
	ch, herr := x.kernel.Dir.Harvest(context.WithoutCancel(ctx))
	for _, f := range ch.Written {
		out.FilesOut = append(out.FilesOut, wire.Ref(f))
		s.Artifacts = append(s.Artifacts, f)
	}
	out.FilesDeleted = ch.Deleted
	s.Touched = append(s.Touched, ch.Deleted...)
	oc.Tampered, oc.Skipped = ch.Tampered, ch.Skipped
	for _, r := range ch.Refused {
		out.FilesRefused = append(out.FilesRefused, wire.RefusedFile{Path: r.Path, Size: r.Size, Reason: r.Reason})
		oc.Refused = append(oc.Refused, fmt.Sprintf("%s (%s)", r.Path, r.Reason))
	}
	if herr != nil {
		// Never a success with files missing: the caller must know.
		o.log.ErrorContext(ctx, "harvest working directory", "run", x.run, "stored", len(ch.Written), "err", herr)
		return harvestErr(herr, len(ch.Written))
	}
	for _, r := range ch.Refused {
		o.log.WarnContext(ctx, "refused to harvest a file", "run", x.run, "path", r.Path, "size", r.Size, "reason", r.Reason)
	}
	return nil
}

// keepStreams puts the cell's stdout and stderr in the answer, each kept
// whole as a run file when it is over the cap.
func (x *cell) keepStreams(ctx context.Context, outp *output, prefix string) {
	var trunc bool
	out := &x.out
	out.Stdout, out.StdoutFile, trunc = x.keepStream(ctx, &outp.stdout, prefix+"-stdout.txt")
	out.Truncated = out.Truncated || trunc
	out.Stderr, out.StderrFile, trunc = x.keepStream(ctx, &outp.stderr, prefix+"-stderr.txt")
	out.Truncated = out.Truncated || trunc
}

// contextErr says what went wrong with a cell's context.
func contextErr(err error, run runid.ID, id string) error {
	switch {
	case errors.Is(err, kernels.ErrNoContext):
		return fault.Wrap(fault.NotFound, err, fmt.Sprintf("run %s has no context %q", run, id),
			"create the context first, or omit context to use the run's kernel")
	case errors.Is(err, kernels.ErrNoLanguage):
		return fault.Wrap(fault.Unsupported, err, "this sandbox backend has no kernel for that language: "+err.Error(),
			"run Python, or start triad with --sandbox docker, whose image has the R, JavaScript, TypeScript and bash kernels")
	case errors.Is(err, kernels.ErrNoContexts):
		return fault.Wrap(fault.Unsupported, err, "this sandbox backend runs one interpreter per run",
			"omit context, or start triad with --sandbox docker or wasm")
	case errors.Is(err, kernels.ErrTooManyContexts):
		return fault.Wrap(fault.Conflict, err, "the run has as many contexts as it may", "remove a context first")
	}
	return sandboxErr(err)
}

// fileInDigest reports whether a files_in path names a blob: sha256: and
// 64 lower-case hex digits. Anything else is a run path (which may start
// with "sha256:"), as the contract's pattern for it says.
func fileInDigest(p string) (tmpfs.Digest, bool) {
	hex, ok := strings.CutPrefix(p, "sha256:")
	if !ok || len(hex) != 64 || strings.Trim(hex, "0123456789abcdef") != "" {
		return tmpfs.Digest{}, false
	}
	d, err := tmpfs.ParseDigest(hex)
	return d, err == nil
}

// resolveFileIn finds a files_in source: a run path or sha256:<hex>. A
// blob by hash must be one some run of the run's tenant has held; any
// other hash is not found, exists or not, so files_in is no oracle for
// other tenants' bytes.
func (x *cell) resolveFileIn(ctx context.Context, p string) (tmpfs.File, error) {
	o := x.o
	if d, ok := fileInDigest(p); ok {
		if !o.t.Holds(ctx, x.owner.Tenant, d) {
			return tmpfs.File{}, blobNotFound(d)
		}
		n, err := o.store.Blobs().Stat(ctx, d)
		if err != nil {
			return tmpfs.File{}, blobNotFound(d)
		}
		return tmpfs.File{SHA256: d, Size: n}, nil
	}
	f, err := o.store.Stat(ctx, x.run, p)
	if err != nil {
		return f, storeErr(err, x.run, p)
	}
	return f, nil
}

// keepStream returns a stream's text for the answer and, when it was over
// the cap, stores its full text as a run file (streamed from the spool, never
// whole in memory) and returns that file's reference.
func (x *cell) keepStream(ctx context.Context, sp *spool, path string) (string, *wire.FileRef, bool) {
	o := x.o
	text, truncated := sp.text()
	if !truncated {
		return text, nil, false
	}
	f, ok, err := sp.full()
	if err == nil && ok {
		var stored tmpfs.File
		stored, err = o.store.Write(ctx, x.run, path, f, 0)
		if err == nil {
			x.step.Artifacts = append(x.step.Artifacts, stored)
			err = o.files.put(ctx, x.run, stored)
			r := wire.Ref(stored)
			return text, &r, true
		}
	}
	o.log.ErrorContext(ctx, "keep full output", "run", x.run, "path", path, "err", err)
	return text, nil, true
}

// binaryMIME are the bundle types stored as files instead of inlined.
var binaryMIME = map[string]string{"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/svg+xml": "svg", "application/pdf": "pdf"}

// jsonFileMIME are the JSON-valued bundle types stored as files (their
// JSON as sent) instead of inlined: a chart's data and a DataFrame's can be
// large, and like images they are artifacts of the cell, addressed by hash.
var jsonFileMIME = map[string]string{wire.ChartMIME: "chart.json", wire.DataMIME: "data.json"}

func shapeBundle(b sandbox.Bundle, name string, streamCap int, keep func(string, []byte) (tmpfs.File, error), images map[string][]byte) (wire.Bundle, bool) {
	out := wire.Bundle{Data: map[string]any{}, Metadata: b.Metadata}
	truncated := false
	for mime, raw := range b.Data {
		if ext, ok := jsonFileMIME[mime]; ok {
			if f, err := keep(name+"."+ext, raw); err == nil {
				out.Data[mime] = wire.Ref(f)
				continue
			}
		}
		if ext, ok := binaryMIME[mime]; ok {
			var s string
			if err := json.Unmarshal(raw, &s); err == nil {
				data := []byte(s)
				if ext != "svg" {
					if dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s)); err == nil {
						data = dec
					}
				}
				if f, err := keep(name+"."+ext, data); err == nil {
					out.Data[mime] = wire.Ref(f)
					if images != nil {
						images[f.Path] = data
					}
					continue
				}
			}
		}
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			if len(s) > streamCap {
				out.Data[mime] = truncateUTF8(s, streamCap)
				truncated = true
				continue
			}
			out.Data[mime] = s
			continue
		}
		out.Data[mime] = raw // JSON-valued types (application/json, widgets)
	}
	return out, truncated
}

func execError(e *sandbox.ExecError, timeout time.Duration) *wire.ExecError {
	out := &wire.ExecError{Kind: e.Kind, Ename: e.Ename, Evalue: e.Evalue, Traceback: e.Traceback, Reason: e.Reason}
	switch e.Kind {
	case sandbox.KindTimeout:
		out.Message = fmt.Sprintf("the cell ran past its %s deadline and was interrupted", timeout)
		out.Suggestion = "make the cell faster or split it, or raise timeout_s (up to the server maximum)"
	case sandbox.KindKernelDied:
		out.Message = "the kernel died while running the cell"
		if e.Reason != "" {
			out.Message += " (" + e.Reason + ")"
		}
		out.Suggestion = "the next call gets a fresh kernel with no variables; use less memory (OOMKilled) or avoid os._exit, then re-run the cells that set up state"
	case sandbox.KindOutputLimit:
		out.Message = "the cell's output passed the per-cell output limit and the cell was stopped: " + e.Evalue
		out.Suggestion = "print less: write large results to a file in the working directory (it becomes a run file) and print a summary; if the kernel was restarted, re-run the cells that set up state"
	case sandbox.KindInterrupted:
		out.Message = "the call was abandoned while the cell ran, so the cell was interrupted: " + e.Evalue
		out.Suggestion = "run the cell again and wait for its answer; if the kernel was restarted, re-run the cells that set up state"
	default:
		out.Kind = sandbox.KindExecution
		out.Message = strings.TrimSpace(e.Ename + ": " + e.Evalue)
		out.Suggestion = "fix the code and run the cell again; the traceback shows where it failed"
	}
	return out
}

// harvestErr reports a harvest that could not store every file the cell
// left: the call fails rather than answer with files missing.
func harvestErr(err error, stored int) error {
	msg := fmt.Sprintf("the cell ran, but its files could not all be stored (%d were)", stored)
	if errors.Is(err, sandbox.ErrClosed) {
		msg = fmt.Sprintf("the cell ran, but its kernel was stopped while its files were being stored (%d were); the others are lost", stored)
	}
	return fault.Wrap(fault.Unavailable, err, msg, "check the run's files with tmp.list, and run the cell again to write the missing ones")
}

func sandboxErr(err error) error {
	if fault.As(err) != nil {
		return err
	}
	if errors.Is(err, sandbox.ErrUnavailable) {
		return fault.Wrap(fault.Unavailable, err, "the sandbox backend does not answer",
			"check the Docker engine (docker info) or start triad with --sandbox wasm")
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fault.Wrap(fault.Timeout, err, "the kernel did not become ready in time", "retry the call")
	}
	return fault.Wrap(fault.Unavailable, err, "the sandbox could not run the cell: "+err.Error(), "retry; the next call starts a fresh kernel")
}

// codeSummary shortens code for the journal: its first line and a hash.
func codeSummary(code string) string {
	sum := sha256.Sum256([]byte(code))
	first, _, _ := strings.Cut(strings.TrimSpace(code), "\n")
	if len(first) > 60 {
		first = truncateUTF8(first, 60) + "…"
	}
	lines := strings.Count(strings.TrimRight(code, "\n"), "\n") + 1
	return fmt.Sprintf("%q (%d lines, sha256:%s)", first, lines, hex.EncodeToString(sum[:])[:12])
}

// Restart is POST /sandbox/restart: the run's kernel starts afresh, its
// files stay.
func (o *Orchestrator) Restart(ctx context.Context, run runid.ID) error {
	if o.kernels == nil {
		return fault.New(fault.NotConfigured, "no sandbox backend is configured", "start triad with --sandbox docker, wasm or auto")
	}
	r, done := o.runs.use(run)
	defer done()
	if _, err := o.access(ctx, r, auth.Runs, true); err != nil {
		return err
	}
	held, err := o.lockRun(ctx, r)
	if err != nil {
		return err
	}
	defer held.Unlock()
	sess := o.kernels.Peek(run)
	if sess == nil {
		if _, alone := o.lock.(*InProcess); alone {
			return nil // nothing running: the next exec starts fresh anyway
		}
		// Under a shared lock the run's kernel may live on without this
		// process holding it (another replica's, or adopted on restart):
		// adopt it to restart it.
		spec, err := o.setups.spec(ctx, r)
		if err != nil {
			return err
		}
		ow, _, err := o.ownerOf(ctx, r)
		if err != nil {
			return err
		}
		if sess, err = o.kernels.Acquire(ctx, run, spec, o.claim(auth.From(ctx), ow)); err != nil {
			return sandboxErr(err)
		}
		defer o.kernels.Release(sess)
	}
	o.kernels.Meter(ctx, run) // what it used before its count starts again
	if err := sess.Kernel.Restart(ctx); err != nil {
		o.kernels.Drop(run)
		return sandboxErr(err)
	}
	return o.setups.restarted(ctx, r, sess)
}

// Stop ends the run's kernel, if one is live: its files stay in the store
// and the next exec starts a fresh kernel over them. Surfaces whose
// sessions time out (the E2B surface) call it.
func (o *Orchestrator) Stop(ctx context.Context, run runid.ID) error {
	if o.kernels == nil {
		return nil
	}
	r, done := o.runs.use(run)
	defer done()
	held, err := o.lockRun(ctx, r)
	if err != nil {
		return err
	}
	defer held.Unlock()
	o.kernels.Drop(run)
	return nil
}

// NewContext makes a code context for the run: an interpreter of its own
// (its own variables) in the run's sandbox, beside the run's kernel, whose
// cells start in cwd, a directory of the run's files ("" for their root;
// made if missing). A cell runs in it when its exec request names the
// context's id. The run's contexts outlive any one kernel: after the
// kernel is stopped (idle, or a sandbox past its timeout), a context
// starts afresh on its next cell, and the answer says it was restarted.
// Making, restarting and removing a context are steps of the journal
// (tool sandbox.context).
func (o *Orchestrator) NewContext(ctx context.Context, run runid.ID, cwd, language string) (wire.Context, error) {
	if o.kernels == nil {
		return wire.Context{}, fault.New(fault.NotConfigured, "no sandbox backend is configured", "start triad with --sandbox docker, wasm or auto")
	}
	if language == "" {
		language = wire.LanguagePython
	}
	if !slices.Contains(wire.Languages, language) {
		return wire.Context{}, fault.Badf("send one of "+strings.Join(wire.Languages, ", ")+", or omit language for Python",
			"language %q is not supported", language)
	}
	if cwd != "" {
		c, err := safepath.Clean(cwd)
		if err != nil {
			fe := fault.As(err)
			return wire.Context{}, fault.Badf("cwd is a directory of the run's files: "+fe.Suggestion, "cwd: %s", fe.Message)
		}
		cwd = c
	}
	var out wire.Context
	oc := &ContextOutcome{Op: ContextCreate, Cwd: cwd, Language: language, Backend: o.kernels.Backend()}
	err := o.call(ctx, run, oc, nil, func(ctx context.Context, c *call) error {
		spec, err := o.setups.spec(ctx, c.r)
		if err != nil {
			return err
		}
		k, err := o.kernels.NewContext(ctx, run, cwd, language, spec, o.claim(c.who, c.owner))
		if err != nil {
			return contextErr(err, run, "")
		}
		out, oc.ID, oc.Done = wireContext(k), k.ID, true
		return nil
	})
	return out, err
}

func wireContext(c kernels.Context) wire.Context {
	return wire.Context{ID: c.ID, Language: c.Language, Cwd: c.Cwd, Created: c.Created}
}

// Languages lists the languages sandbox.exec runs on this server: Python,
// and those the backend's kernels have (wire.Languages order). bash is
// always there as a command where the backend runs commands.
func (o *Orchestrator) Languages() []string {
	out := []string{wire.LanguagePython}
	if o.kernels == nil {
		return out
	}
	have := o.kernels.Languages()
	for _, l := range wire.Languages[1:] {
		if slices.Contains(have, l) {
			out = append(out, l)
		}
	}
	return out
}

// Contexts lists the run's code contexts, oldest first.
func (o *Orchestrator) Contexts(run runid.ID) []wire.Context {
	out := []wire.Context{}
	if o.kernels == nil {
		return out
	}
	for _, c := range o.kernels.Contexts(run) {
		out = append(out, wireContext(c))
	}
	return out
}

// RestartContext restarts the run's context id: its variables go, the
// run's kernel and other contexts keep theirs. The empty id is the run's
// kernel, which may end the contexts (see sandbox.Contexts).
func (o *Orchestrator) RestartContext(ctx context.Context, run runid.ID, id string) error {
	return o.contextOp(ctx, run, ContextRestart, id, func(ctx context.Context) error {
		if id == "" {
			sess := o.kernels.Peek(run)
			if sess == nil {
				return nil // nothing running: the next cell starts fresh anyway
			}
			o.kernels.Meter(ctx, run)
			if err := sess.Kernel.Restart(ctx); err != nil {
				o.kernels.Drop(run)
				return sandboxErr(err)
			}
			return nil
		}
		return o.kernels.RestartContext(ctx, run, id)
	})
}

// RemoveContext ends the run's context id and forgets it.
func (o *Orchestrator) RemoveContext(ctx context.Context, run runid.ID, id string) error {
	if id == "" {
		return fault.New(fault.BadInput, "the run's kernel is not a context that can be removed", "name a context the run made")
	}
	return o.contextOp(ctx, run, ContextRemove, id, func(context.Context) error { return o.kernels.RemoveContext(run, id) })
}

// contextOp is a journaled restart or removal of a context; an unknown
// one is refused before the journal sees it, as an exec naming it is.
func (o *Orchestrator) contextOp(ctx context.Context, run runid.ID, op, id string, fn func(context.Context) error) error {
	if o.kernels == nil {
		return fault.New(fault.NotConfigured, "no sandbox backend is configured", "start triad with --sandbox docker, wasm or auto")
	}
	if id != "" && !o.kernels.HasContext(run, id) {
		return contextErr(kernels.ErrNoContext, run, id)
	}
	oc := &ContextOutcome{Op: op, ID: id, Backend: o.kernels.Backend()}
	return o.call(ctx, run, oc, nil, func(ctx context.Context, _ *call) error {
		if err := fn(ctx); err != nil {
			return contextErr(err, run, id)
		}
		oc.Done = true
		return nil
	})
}
