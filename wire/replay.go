package wire

import "github.com/triadhq/triad/tmpfs"

// RunSetup is what a run's kernel is set up with, as run.setup.json records
// it and CEL.md's header shows it: the seed Python's random and NumPy's
// global generator start from, the as_of date (SOURCE_DATE_EPOCH), and the
// sandbox image. With the trace and the content-addressed files it is all a
// replay needs.
type RunSetup struct {
	RunID string `json:"run_id"`
	// Seed seeds random and NumPy's global generator when the run's kernel
	// starts or restarts, and is TRIAD_SEED in every cell.
	Seed int64 `json:"seed"`
	// SeedFrom says where the seed came from: "param", "derived from the
	// recipe, its params and its inputs", "default", "replay of ...".
	SeedFrom string `json:"seed_from"`
	// AsOf is the run's as-of date, YYYY-MM-DD, or "" when it has none; it
	// is TRIAD_AS_OF in every cell.
	AsOf     string `json:"as_of"`
	AsOfFrom string `json:"as_of_from"`
	// SourceDateEpoch is SOURCE_DATE_EPOCH in the kernel: midnight UTC of
	// AsOf, or 0 without one, so document writers date files from the data.
	SourceDateEpoch int64 `json:"source_date_epoch"`
	// PythonHashSeed is PYTHONHASHSEED, fixed for every kernel.
	PythonHashSeed int `json:"python_hash_seed"`
	// Backend and Image name the sandbox the run's cells ran in.
	Backend string `json:"backend,omitempty"`
	Image   string `json:"image,omitempty"`
	// Template is the sandbox template the run's kernels start from
	// ("default" when the run named none), and ImageDigest the engine's
	// id of its image ("sha256:…"), when the backend reports one.
	Template    string `json:"template,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
	// Egress is the run's egress policy: its template's, narrowed when the
	// run was created. Secrets show by host and header only. Absent, the
	// run's sandbox reaches nothing. In a request (SetRunSetup), Egress
	// narrows the template's policy instead.
	Egress *EgressPolicy `json:"egress,omitempty"`
	// Triad is the version of the server that set the run up.
	Triad  string `json:"triad"`
	Recipe string `json:"recipe,omitempty"`
	// ReplayOf is the run this run replays.
	ReplayOf string `json:"replay_of,omitempty"`
}

// ReplayRequest is POST /runs/{id}/replay's optional body. A replay runs
// with the original's seed and as_of unless one is given here: a replay
// with another seed shows which files depend on it.
type ReplayRequest struct {
	Seed *int64  `json:"seed,omitempty" minimum:"0" maximum:"4294967295" doc:"The replay's seed, 0 to 2^32-1; absent keeps the original's."`
	AsOf *string `json:"as_of,omitempty" format:"date" doc:"The replay's as-of date, YYYY-MM-DD; absent keeps the original's."`
}

// ReplayReport is a replay's answer and artifacts/reproducibility.json: per
// file the original produced, whether the replay produced the same bytes.
type ReplayReport struct {
	Format string `json:"format"`
	// Original is the replayed run; RunID the replay.
	Original string `json:"original"`
	RunID    string `json:"run_id"`
	// Identical is true when every file is identical.
	Identical bool `json:"identical"`
	// Counts of Files by status.
	Same      int `json:"identical_files"`
	Different int `json:"different_files"`
	// FirstDivergence is the first original step whose outputs the replay
	// did not reproduce (0 for none).
	FirstDivergence int `json:"first_divergent_step"`
	// Why explains the differences: a changed seed or as_of or image, and
	// the steps whose cells read the clock, entropy or the network.
	Why []string `json:"why"`
	// Setup compares the two runs' setups.
	Setup ReplaySetup  `json:"setup"`
	Files []ReplayFile `json:"files"`
	Steps []ReplayStep `json:"steps"`
	// Excluded names the records left out of the comparison by definition.
	Excluded []string `json:"excluded"`
	// DurationMs is how long the replay took; OriginalMs how long the
	// original's calls took, as its trace recorded them.
	DurationMs int64 `json:"duration_ms"`
	OriginalMs int64 `json:"original_ms"`
}

// ReplayFormat is ReplayReport.Format.
const ReplayFormat = "triad.reproducibility/v1"

// ReplaySetup puts the original's setup beside the replay's.
type ReplaySetup struct {
	Original RunSetup `json:"original"`
	Replay   RunSetup `json:"replay"`
}

// File statuses in a ReplayReport.
const (
	ReplayIdentical = "identical"
	ReplayDifferent = "different"
)

// ReplayFile is one file of the comparison.
type ReplayFile struct {
	Path   string `json:"path"`
	Status string `json:"status"`
	// The two hashes; zero when the file does not exist in that run at
	// the end.
	Original tmpfs.Digest `json:"original_sha256,omitzero"`
	Replay   tmpfs.Digest `json:"replay_sha256,omitzero"`
	// Step is the original step that produced the file last; DivergedAt the
	// first original step whose write of it the replay did not reproduce.
	Step       int `json:"step"`
	DivergedAt int `json:"diverged_at_step,omitempty"`
}

// ReplayStep is one original call and the call that replayed it.
type ReplayStep struct {
	Step int    `json:"step"`
	Tool string `json:"tool"`
	// Replay is the replay's step number; 0 when the call was not replayed.
	Replay int `json:"replay_step,omitempty"`
	// Diverged is true when the call's outputs differ by path or hash.
	Diverged bool `json:"diverged,omitempty"`
	// Skipped says why a call was not replayed.
	Skipped string `json:"skipped,omitempty"`
	// Reads lists what the cell's source reads that a replay cannot fix:
	// the clock, entropy, the network.
	Reads []string `json:"reads,omitempty"`
}
