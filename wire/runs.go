package wire

import "time"

// NewRunRequest is POST /runs's optional body.
type NewRunRequest struct {
	Replay     *bool  `json:"replay,omitempty" doc:"Answer the run's searches from its recorded citations instead of the web."`
	ReplayFrom string `json:"replay_from,omitempty" format:"run-id" doc:"Copy this run's recorded citations and answer the new run's searches from them."`
	RunSetupRequest
}

// RunSetupRequest chooses what a new run's kernel starts from: POST
// /runs's body and MCP's run_setup.
type RunSetupRequest struct {
	// Seed's maximum is orchestrator.MaxSeed: NumPy's legacy generator
	// takes 32-bit seeds.
	Seed     *int64        `json:"seed,omitempty" minimum:"0" maximum:"4294967295" doc:"Seeds the run's kernel (Python's random, NumPy's global generator, TRIAD_SEED): 0 to 2^32-1; absent means 0."`
	AsOf     *string       `json:"as_of,omitempty" format:"date" doc:"The run's as-of date, YYYY-MM-DD: TRIAD_AS_OF and SOURCE_DATE_EPOCH (its midnight UTC) in its kernel. Absent means none (epoch 0)."`
	Template *string       `json:"template,omitempty" doc:"The sandbox template the run's kernels start from (GET /templates lists them); absent means default."`
	Egress   *EgressPolicy `json:"egress,omitempty" doc:"Narrows the template's egress policy for this run, within the template's (an admin key may go beyond it); absent means the template's policy as it is."`
}

// Setup is the RunSetup the request asks for, and whether it asks for any.
func (r RunSetupRequest) Setup() (RunSetup, bool) {
	s := RunSetup{Egress: r.Egress}
	if r.Seed != nil {
		s.Seed = *r.Seed
	}
	if r.AsOf != nil {
		s.AsOf = *r.AsOf
	}
	if r.Template != nil {
		s.Template = *r.Template
	}
	return s, r.Seed != nil || r.AsOf != nil || r.Template != nil || r.Egress != nil
}

// NewRunResponse is POST /runs's answer.
type NewRunResponse struct {
	RunID    string        `json:"run_id" doc:"The new run: send it as X-Run-Id."`
	Replay   bool          `json:"replay" doc:"True when the run answers its searches from recorded citations."`
	Seed     int64         `json:"seed" doc:"The run's seed."`
	AsOf     string        `json:"as_of,omitempty" doc:"The run's as-of date."`
	Template string        `json:"template,omitempty" doc:"The run's sandbox template."`
	Egress   *EgressPolicy `json:"egress,omitempty" doc:"The run's egress policy; absent: it reaches nothing."`
}

// NoteRequest is cel.note's input: an operator note the next step sees.
type NoteRequest struct {
	Text   string `json:"text" format:"non-blank" maxBytes:"65536" doc:"The note, up to 64 KiB of UTF-8."`
	Author string `json:"author,omitempty" maxBytes:"200" doc:"Who wrote it, up to 200 bytes."`
}

// RunView is a run as GET /runs/{id} (and MCP's run_status) report it: the
// journal's view of every call, and the recipe run's state on top for a
// recipe run.
type RunView struct {
	RunID     string       `json:"run_id" doc:"The run."`
	Status    string       `json:"status" doc:"open for a run of tool calls; queued, running, succeeded or failed for a recipe run."`
	Steps     []StepStatus `json:"steps" doc:"One entry per tool call, in order, with the evaluator's verdict (PASS, FAIL, or UNGRADED while the evaluator could not grade it yet: it is graded again in the background) and score."`
	Artifacts []IndexEntry `json:"artifacts" doc:"The run's artifact index (artifacts/index.json)."`
	// The recipe run's fields, for a recipe run.
	Recipe      string         `json:"recipe,omitempty"`
	Objective   string         `json:"objective,omitempty"`
	Error       string         `json:"error,omitempty"`
	Resumes     int            `json:"resumes,omitempty"`
	RecipeSteps []RecipeStep   `json:"recipe_steps,omitempty" doc:"A recipe run's steps and their status."`
	Params      map[string]any `json:"params,omitempty"`
	Created     *time.Time     `json:"created,omitempty"`
	Finished    *time.Time     `json:"finished,omitempty"`
	// StartedBy is who started the run: its key and tenant.
	StartedBy *Caller `json:"started_by,omitempty"`
	// Sandbox is what the run's cells run in, as its setup recorded it
	// at its first call; absent before then.
	Sandbox *RunSandbox `json:"sandbox,omitempty"`
	// Template, ImageDigest and Egress are the run's sandbox: its
	// template, the digest of the image its kernels run, and its egress
	// policy (absent: it reaches nothing).
	Template    string        `json:"template,omitempty"`
	ImageDigest string        `json:"image_digest,omitempty"`
	Egress      *EgressPolicy `json:"egress,omitempty"`
	// Name and Tags label the run (PATCH /runs/{id}).
	Name string   `json:"name,omitempty"`
	Tags []string `json:"tags,omitempty"`
	// Usage is what the run has used: its kernels as of their last
	// reading (each call's end, and periodically while one lives), what
	// it stores now.
	Usage *RunUsage `json:"usage,omitempty" doc:"What the run has used: CPU, memory, stored bytes, egress."`
}

// RunUsage is what a run has used, kept with its record by Triad alone:
// its kernels' CPU time and memory as the sandbox backend measures them,
// the bytes its files hold, and the bytes its egress moved. A measure the
// backend cannot take is absent (unknown), never a guessed zero: wasm
// and Kubernetes kernels do not report CPU time, Kubernetes ones not
// memory either; a run whose kernel never ran has only stored_bytes. See
// docs/DECISIONS.md, "Per-run accounting (issue 27)".
type RunUsage struct {
	CPUSeconds        *float64 `json:"cpu_seconds,omitempty" doc:"CPU time the run's kernels used, in seconds, each from its start (its boot included). Absent when unknown."`
	MemoryPeakBytes   *int64   `json:"memory_peak_bytes,omitempty" doc:"The most memory a kernel of the run held at a reading (after each call, and periodically while it lives), page cache aside. Absent when unknown."`
	MemoryByteSeconds *float64 `json:"memory_byte_seconds,omitempty" doc:"Memory held over time, in byte-seconds: trapezoids between readings, while the run's kernels lived. Absent when unknown."`
	StoredBytes       int64    `json:"stored_bytes" doc:"The bytes the run's files hold (the sum of their sizes in its index; Triad's own records included)."`
	EgressBytesOut    *int64   `json:"egress_bytes_out,omitempty" doc:"Bytes the run's sandbox sent out through the egress proxy. Absent before its first kernel reading."`
	EgressBytesIn     *int64   `json:"egress_bytes_in,omitempty" doc:"Bytes the run's sandbox received through the egress proxy. Absent before its first kernel reading."`
}

// TenantUsage is GET /usage's answer: what a tenant's runs have used,
// summed (runs since deleted included: what was used stays used), and
// what they store now. A run's measure that is unknown adds nothing.
type TenantUsage struct {
	Tenant            string  `json:"tenant" doc:"The tenant."`
	CPUSeconds        float64 `json:"cpu_seconds" doc:"CPU time its runs' kernels used, in seconds, where the backend measures it."`
	MemoryByteSeconds float64 `json:"memory_byte_seconds" doc:"Memory its runs' kernels held over time, in byte-seconds, where the backend measures it."`
	StoredBytes       int64   `json:"stored_bytes" doc:"The bytes its runs' files hold now."`
	EgressBytesOut    int64   `json:"egress_bytes_out" doc:"Bytes its runs' sandboxes sent out through the egress proxy."`
	EgressBytesIn     int64   `json:"egress_bytes_in" doc:"Bytes its runs' sandboxes received through the egress proxy."`
}

// RunSandbox names the sandbox a run's cells run in.
type RunSandbox struct {
	// Backend is "docker", "kube" or "wasm".
	Backend string `json:"backend"`
	// Runtime is the OCI runtime between a cell and the host's kernel:
	// "runsc" (gVisor, a second kernel) or "runc"; absent for wasm.
	Runtime string `json:"runtime,omitempty"`
	// Image is the sandbox image (a tag, or the python.wasm build).
	Image string `json:"image,omitempty"`
}

// StepStatus is one journaled call of a run.
type StepStatus struct {
	Step int    `json:"step"`
	Tool string `json:"tool"`
	OK   bool   `json:"ok"`
	// Evaluation is "PASS", "FAIL" or "UNGRADED" (the evaluator could
	// not grade the step yet; it is graded again in the background).
	Evaluation string  `json:"evaluation"`
	Score      float64 `json:"score"`
	DurationMs int64   `json:"duration_ms"`
	Label      string  `json:"label,omitempty"`
}

// IndexEntry is one deliverable in artifacts/index.json: its reference,
// the step that produced it, and its download link by hash.
type IndexEntry struct {
	FileRef
	Step int    `json:"step"`
	URL  string `json:"url"`
}

// RecipeRunRequest is POST /run's body: start a recipe run, or resume one
// by RunID.
type RecipeRunRequest struct {
	Recipe    string         `json:"recipe,omitempty" doc:"The recipe's name, e.g. market-scan (GET /recipes lists them). Required unless run_id names a recipe run to resume."`
	Objective string         `json:"objective,omitempty" doc:"The question the run answers; it heads the recipe's report."`
	Params    map[string]any `json:"params,omitempty" doc:"The recipe's params by name (GET /recipes/{name} shows them); absent params take their defaults."`
	RunID     string         `json:"run_id,omitempty" format:"run-id" doc:"A fresh run id, or a failed or interrupted recipe run to resume; absent mints one. A recipe never runs in an MCP session's own run."`
	Template  string         `json:"template,omitempty" doc:"The sandbox template the run starts from; absent means the recipe's (its front matter's template), else the default."`
}

// AtLeastOne implements wire.AtLeastOne: a recipe to start, or a run to
// resume.
func (RecipeRunRequest) AtLeastOne() []string { return []string{"recipe", "run_id"} }

// RecipeRunStarted is POST /run's answer.
type RecipeRunStarted struct {
	RunID     string `json:"run_id" doc:"The recipe's run: pass it as X-Run-Id (HTTP) or run_id (MCP) to follow it."`
	Status    string `json:"status" doc:"queued, running, succeeded or failed."`
	StatusURL string `json:"status_url" doc:"The run's status (GET)."`
	EventsURL string `json:"events_url" doc:"The run's progress, as Server-Sent Events (GET)."`
	Resumes   int    `json:"resumes" doc:"How many times the run was resumed."`
}

// RecipeState is a recipe run as run.json records it and the run's events
// stream report it.
type RecipeState struct {
	RunID     string         `json:"run_id"`
	Recipe    string         `json:"recipe"`
	Objective string         `json:"objective,omitempty"`
	Params    map[string]any `json:"params"`
	Status    string         `json:"status"`
	Error     string         `json:"error,omitempty"`
	Created   time.Time      `json:"created"`
	Finished  *time.Time     `json:"finished,omitempty"`
	// Resumes counts the times the run was resumed.
	Resumes int          `json:"resumes"`
	Steps   []RecipeStep `json:"steps"`
}

// RecipeStep is one recipe step's progress.
type RecipeStep struct {
	N      int    `json:"n"`
	ID     string `json:"id"`
	Title  string `json:"title"`
	Kind   string `json:"kind"`
	Status string `json:"status"`
	// Key identifies what the step did: its definition and the files it
	// started from. Resume skips a step whose key is unchanged.
	Key string `json:"key,omitempty"`
	// Outputs are the declared outputs the step left, by hash.
	Outputs map[string]string `json:"outputs,omitempty"`
	// Produced are all the files the step wrote, by hash. On resume they
	// are left out of the step's key, since they did not exist before it.
	Produced   map[string]string `json:"produced,omitempty"`
	DurationMs int64             `json:"duration_ms,omitempty"`
	Error      string            `json:"error,omitempty"`
	// Evaluation is the evaluator's verdict on the step's last tool call
	// ("PASS 0.92"); a step the evaluator could not grade waits for its
	// regrade, and says "UNGRADED" only if the run ended first.
	Evaluation string `json:"evaluation,omitempty"`
}

// RunEvent is a recipe run's progress event, streamed as Server-Sent
// Events by GET /runs/{id}/events.
type RunEvent struct {
	Type   string    `json:"type"` // "step" or "run"
	RunID  string    `json:"run_id"`
	Status string    `json:"status"`
	Step   int       `json:"step,omitempty"`
	ID     string    `json:"id,omitempty"`
	Title  string    `json:"title,omitempty"`
	Error  string    `json:"error,omitempty"`
	Time   time.Time `json:"time"`
}

// RecipeList is GET /recipes's answer.
type RecipeList struct {
	Recipes []RecipeInfo `json:"recipes" doc:"The recipes, sorted by name."`
}

// RecipeInfo describes a recipe; GET /recipes/{name} fills every field.
type RecipeInfo struct {
	Name        string         `json:"name"`
	Title       string         `json:"title"`
	Description string         `json:"description"`
	Backend     string         `json:"backend"`
	Origin      string         `json:"origin"`
	Params      []RecipeParam  `json:"params,omitempty"`
	Inputs      []RecipeInput  `json:"inputs,omitempty"`
	Outputs     []ExpectedFile `json:"outputs,omitempty"`
	Steps       []RecipeBlock  `json:"steps,omitempty"`
}

// RecipeParam describes a recipe param.
type RecipeParam struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	Default     any    `json:"default,omitempty"`
	Required    bool   `json:"required"`
	Description string `json:"description,omitempty"`
	// Minimum and Maximum bound an int or float param; MaxLength a
	// string's length, or a list's items', in characters.
	Minimum   *float64 `json:"minimum,omitempty"`
	Maximum   *float64 `json:"maximum,omitempty"`
	MaxLength int      `json:"max_length,omitempty"`
}

// RecipeInput describes a recipe input file.
type RecipeInput struct {
	Name        string `json:"name"`
	Path        string `json:"path"`
	Default     string `json:"default,omitempty"`
	Required    bool   `json:"required"`
	Description string `json:"description,omitempty"`
}

// ExpectedFile is a file a recipe (or a step) promises, with the checks the
// evaluator applies to it; zero-valued checks are off.
type ExpectedFile struct {
	Path string `json:"path"`
	// Columns must all be present in a CSV's header row.
	Columns []string `json:"columns,omitempty"`
	// MinRows is the least number of data rows in a CSV, or items in a
	// JSON array (or in a JSON object's "results" or first array field).
	MinRows int `json:"min_rows,omitempty"`
	// Keys must all be present at the top level of a JSON object.
	Keys []string `json:"keys,omitempty"`
	// Contains are substrings a text artifact (Markdown, HTML) must hold.
	Contains []string `json:"contains,omitempty"`
}

// RecipeBlock describes one block (step) of a recipe.
type RecipeBlock struct {
	ID    string `json:"id"`
	Kind  string `json:"kind"`
	Title string `json:"title"`
	Line  int    `json:"line"`
}

// Health is GET /healthz's answer.
type Health struct {
	Status string `json:"status"`
	Store  string `json:"store"`
}

// Version is GET /version's answer.
type Version struct {
	Version string `json:"version"`
}

// Caller names who made a call or started a run: the API key's id (never
// the key itself) and name, and the tenant. KeyID is empty for the
// operator (authentication off, MCP over stdio, the CLI).
type Caller struct {
	KeyID  string `json:"key_id,omitempty"`
	Name   string `json:"name,omitempty"`
	Tenant string `json:"tenant"`
}

// RunSummary is one run in GET /runs: what a listing needs without
// reading the run's trace.
type RunSummary struct {
	RunID     string `json:"run_id"`
	Status    string `json:"status"`
	Recipe    string `json:"recipe,omitempty"`
	Objective string `json:"objective,omitempty"`
	Steps     int    `json:"steps"`
	// Passed and Failed count the evaluator's verdicts on the run's calls;
	// an UNGRADED call counts in neither until it is graded.
	Passed int `json:"passed"`
	Failed int `json:"failed"`
	// LastVerdict is the evaluator's verdict on the run's last call
	// ("PASS", "FAIL", or "UNGRADED" while the evaluator has not been
	// able to grade it: it is graded again in the background), empty
	// before the first call.
	LastVerdict string    `json:"last_verdict,omitempty"`
	Created     time.Time `json:"created"`
	// Updated is the time of the run's last call or status change: a
	// run's duration is Updated - Created.
	Updated   time.Time `json:"updated"`
	StartedBy Caller    `json:"started_by"`
	// Name and Tags are what people call the run and file it under
	// (PATCH /runs/{id}); GET /runs searches them.
	Name string   `json:"name,omitempty"`
	Tags []string `json:"tags,omitempty"`
	// Usage is what the run has used, as of its last call or kernel
	// reading (RunUsage).
	Usage *RunUsage `json:"usage,omitempty"`
}

// RunLabels is PATCH /runs/{id}'s body: a run's name and tags. An absent
// field is left as it is; an empty name or an empty list clears it.
type RunLabels struct {
	Name *string   `json:"name,omitempty" maxLength:"200" pattern:"^[^\\p{Cc}]*$" doc:"The run's name, at most 200 characters of plain text (runs of white space become one space); empty clears it."`
	Tags *[]string `json:"tags,omitempty" maxItems:"20" minLength:"1" maxLength:"40" pattern:"^[^\\t\\n\\v\\f\\r \\x85\\p{Z}\\p{Cc}]+$" doc:"The run's tags, at most 20 single words of at most 40 characters, kept lower-case and once each; an empty list clears them."`
}

// RunList is GET /runs's answer: the caller's runs, newest first, a page
// at a time. NextCursor, when set, fetches the next page
// (GET /runs?cursor=...).
type RunList struct {
	Runs       []RunSummary `json:"runs"`
	NextCursor string       `json:"next_cursor,omitempty"`
}

// ShareRequest is POST /runs/{id}/share's body: exactly one of Path (one
// file) and Prefix (every file under it), and how long the link lives.
type ShareRequest struct {
	Path   string `json:"path,omitempty" format:"run-path" doc:"The one file the link shares."`
	Prefix string `json:"prefix,omitempty" format:"run-prefix" minLength:"1" doc:"The link shares every file under this prefix, e.g. artifacts/."`
	// TTL's bounds: MinShareTTL, and the server's --max-share-ttl.
	TTL string `json:"ttl,omitempty" duration:"1m..$max-share-ttl" doc:"The link's lifetime as a Go duration (24h, 90m): at least a minute and at most the server's maximum (30 days by default); absent takes the server's default (24 h)."`
}

// MinShareTTL is the shortest a share link may live: a shorter one would
// be dead before anyone could follow it.
const MinShareTTL = time.Minute

// ExactlyOne implements wire.ExactlyOne: one file, or a prefix.
func (ShareRequest) ExactlyOne() []string { return []string{"path", "prefix"} }

// Share is a share link: POST /runs/{id}/share's answer. URL downloads
// the shared file (or, for a prefix, lists the shared files) without an
// API key until Expires or until DELETE /shares/{id} revokes it.
type Share struct {
	ID      string    `json:"id"`
	RunID   string    `json:"run_id"`
	Path    string    `json:"path,omitempty"`
	Prefix  string    `json:"prefix,omitempty"`
	URL     string    `json:"url"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
}

// ShareList is GET /runs/{id}/shares's answer: the run's live links.
type ShareList struct {
	Shares []Share `json:"shares"`
}

// SharedFiles is a prefix share link's answer: the files it shares, each
// with the URL that downloads it.
type SharedFiles struct {
	Prefix  string       `json:"prefix"`
	Expires time.Time    `json:"expires"`
	Files   []SharedFile `json:"files"`
}

// SharedFile is one file of a prefix share.
type SharedFile struct {
	FileRef
	URL string `json:"url"`
}

// Key is an API key as listings show it: never its secret.
type Key struct {
	ID      string    `json:"id"`
	Name    string    `json:"name"`
	Tenant  string    `json:"tenant"`
	Scopes  []string  `json:"scopes"`
	Created time.Time `json:"created"`
	// LastUsed is when the key last authenticated a request, to within
	// the server's last-used interval (a minute by default).
	LastUsed *time.Time `json:"last_used,omitempty"`
	Revoked  *time.Time `json:"revoked,omitempty"`
}

// KeyList is GET /keys's answer.
type KeyList struct {
	Keys []Key `json:"keys"`
}

// NewKeyRequest is POST /keys's body.
type NewKeyRequest struct {
	Name   string   `json:"name" pattern:"^[\\p{L}\\p{M}\\p{N}\\p{P}\\p{S} ]+$" maxBytes:"100" doc:"What the key is for: 1 to 100 bytes of printable characters."`
	Tenant string   `json:"tenant,omitempty" pattern:"^[a-z0-9][a-z0-9-]{0,62}$" doc:"The tenant whose runs the key works on: 1-63 characters from [a-z0-9-], starting with a letter or digit; absent means default."`
	Scopes []string `json:"scopes,omitempty" enum:"read|runs|admin" doc:"What the key may do: read (look), runs (call tools and start runs), admin (manage keys and see every tenant); absent means [runs]."`
}

// NewKey is POST /keys's answer: the key itself (trd_<id>_<secret>),
// shown this once and never again, and its listing entry.
type NewKey struct {
	Token string `json:"token"`
	Key   Key    `json:"key"`
}

// CallEvent is one journaled tool call of a run: what its Step Block and
// trace record say, in short. GET /runs/{id}/events streams one "call"
// event per call, for every run (recipe or manual), first the calls the
// run already has, then each as the journal records it.
type CallEvent struct {
	Step       int       `json:"step"`
	Tool       string    `json:"tool"`
	Label      string    `json:"label,omitempty"`
	Started    time.Time `json:"started"`
	DurationMs int64     `json:"duration_ms"`
	OK         bool      `json:"ok"`
	// Error is a failed call's error, as kind: message.
	Error string `json:"error,omitempty"`
	// Inputs are the call's salient inputs, as its Step Block lists them
	// (a cell's code as its first line and hash).
	Inputs map[string]any `json:"inputs"`
	// Outputs are the files the call created or changed.
	Outputs []FileRef `json:"outputs"`
	// Verdict is the evaluator's: "PASS" or "FAIL", with its score and
	// its critique line; or "UNGRADED" when the evaluator could not grade
	// the call yet (the critique says why), never a FAIL. The late
	// verdict comes as a "verdict" event.
	Verdict  string  `json:"verdict"`
	Score    float64 `json:"score"`
	Critique string  `json:"critique,omitempty"`
	// FreshKernel is true when a cell ran in an interpreter no earlier
	// cell of the run ran in: the run's first cell, or the first after its
	// kernel was replaced (a restart, a crash, a server restart, an idle
	// kernel stopped), whose variables it does not have.
	FreshKernel bool `json:"fresh_kernel,omitempty"`
}

// JournalEvent says a run's journal changed without a call: an operator
// note ("note"), a kernel reclaimed from the run ("reclaim") or the
// closing summary ("summary"). GET /runs/{id}/events
// streams it as a "journal" event.
type JournalEvent struct {
	Kind string    `json:"kind"`
	Time time.Time `json:"time"`
}

// RunFile is one file of a run, as GET /runs/{id}/files lists it: its
// reference, when it last changed, and the journaled call that produced
// these bytes (0 when no call did: a file Triad keeps for itself).
type RunFile struct {
	FileInfo
	Step int    `json:"step,omitempty"`
	Tool string `json:"tool,omitempty"`
}

// RunFiles is GET /runs/{id}/files's answer: every file of the run, by
// path.
type RunFiles struct {
	Files []RunFile `json:"files"`
}
