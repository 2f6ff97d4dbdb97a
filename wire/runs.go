package wire

import "time"

// NewRunRequest is POST /runs's optional body.
type NewRunRequest struct {
	// Replay answers the run's searches from its recorded citations.
	Replay *bool `json:"replay,omitempty"`
	// ReplayFrom copies another run's citations records and replays them.
	ReplayFrom string `json:"replay_from,omitempty"`
}

// NewRunResponse is POST /runs's answer.
type NewRunResponse struct {
	RunID  string `json:"run_id"`
	Replay bool   `json:"replay"`
}

// NoteRequest is cel.note's input: an operator note the next step sees.
type NoteRequest struct {
	Text   string `json:"text"`
	Author string `json:"author,omitempty"`
}

// RunView is a run as GET /runs/{id} (and MCP's run_status) report it: the
// journal's view of every call, and the recipe run's state on top for a
// recipe run.
type RunView struct {
	RunID     string       `json:"run_id"`
	Status    string       `json:"status"`
	Steps     []StepStatus `json:"steps"`
	Artifacts []IndexEntry `json:"artifacts"`
	// The recipe run's fields, for a recipe run.
	Recipe      string         `json:"recipe,omitempty"`
	Objective   string         `json:"objective,omitempty"`
	Error       string         `json:"error,omitempty"`
	Resumes     int            `json:"resumes,omitempty"`
	RecipeSteps []RecipeStep   `json:"recipe_steps,omitempty"`
	Params      map[string]any `json:"params,omitempty"`
	Created     *time.Time     `json:"created,omitempty"`
	Finished    *time.Time     `json:"finished,omitempty"`
}

// StepStatus is one journaled call of a run.
type StepStatus struct {
	Step       int     `json:"step"`
	Tool       string  `json:"tool"`
	OK         bool    `json:"ok"`
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
	Recipe    string         `json:"recipe"`
	Objective string         `json:"objective,omitempty"`
	Params    map[string]any `json:"params,omitempty"`
	// RunID names the run: a fresh id, or a failed or interrupted run to
	// resume. Empty mints one.
	RunID string `json:"run_id,omitempty"`
}

// RecipeRunStarted is POST /run's answer.
type RecipeRunStarted struct {
	RunID     string `json:"run_id"`
	Status    string `json:"status"`
	StatusURL string `json:"status_url"`
	EventsURL string `json:"events_url"`
	Resumes   int    `json:"resumes"`
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
	// Evaluation is the evaluator's verdict on the step's last tool call.
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
	Recipes []RecipeInfo `json:"recipes"`
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
