// Package runfiles names every file Triad keeps in a run for itself, and the one policy that says who may write it.
//
// A run's file space holds the caller's files and Triad's records about the
// run side by side, so that a cell can read its own journal for context.
// The records must stay Triad's: nothing a caller or a cell sends may write,
// replace or delete them, through any surface (tmp.*, files_in, the PUT
// stream, a cell's writes, notes, recipes). This package is the only place
// that spells their names; every other package asks it.
// See "Triad's records have one owner" in docs/DECISIONS.md.
package runfiles

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// The records, by path.
const (
	// Journal is CEL.md, the run's Context Engineering Log.
	Journal = "CEL.md"
	// Trace holds one JSON line per tool call: inputs, outputs by hash,
	// timings, verdict.
	Trace = "trace.jsonl"
	// Evaluations holds one JSON line per verdict.
	Evaluations = "evaluations.jsonl"
	// Index lists the run's deliverables (files under artifacts/) with
	// download links by hash.
	Index = "artifacts/index.json"
	// RunState is a recipe run's state (steps, status, resumes).
	RunState = "run.json"
	// Notebook is a recipe run's notebook of the cells it executed.
	Notebook = "run.ipynb"
	// Setup is the run's setup: its seed and as_of date, the sandbox
	// backend and image, and the run it replays. With the trace and the
	// content-addressed files it is all a replay needs.
	Setup = "run.setup.json"
	// Reproducibility is a replay's report: per file the original run
	// produced, identical or different, both hashes, and the first step
	// whose outputs diverged.
	Reproducibility = "artifacts/reproducibility.json"
	// CitationsDir holds one citations record per search.
	CitationsDir = "citations/"
	// OutputsDir holds what sandbox.exec kept of a cell's output: images
	// and the full text of streams over the inline cap.
	OutputsDir = "outputs/"
	// ArtifactsDir holds a run's deliverables; files there are the caller's
	// (or the cell's), except Index.
	ArtifactsDir = "artifacts/"
)

// Checkpoint is the path of CEL.md as it stood before step n.
func Checkpoint(n int) string { return fmt.Sprintf("CEL.step_%d.md", n) }

var checkpointRE = regexp.MustCompile(`^CEL\.step_[0-9]+\.md$`)

// IsCheckpoint reports whether p is a journal checkpoint. Checkpoints are
// the one kind of run file not copied into a kernel's working directory:
// there is one per step, each a whole earlier journal, so copying them
// would cost a run's kernel the square of its journal. Cells read CEL.md;
// the checkpoints stay readable with tmp.read. See "Appending to a
// content-addressed store" in docs/DECISIONS.md.
func IsCheckpoint(p string) bool { return checkpointRE.MatchString(p) }

// Policy says who may change a path.
type Policy int

const (
	// Open paths belong to the caller and its cells: tmp.write, tmp.delete,
	// files_in, the PUT stream and cells change them freely.
	Open Policy = iota
	// Kept paths are Triad's records. Callers and cells may read them (they
	// are materialised into the kernel's working directory like every run
	// file but journal checkpoints, see IsCheckpoint), but only Triad writes them: tmp.write, tmp.delete, files_in
	// and the PUT stream are refused with the reserved kind, and a cell that
	// creates, changes or deletes one has it restored from the store and its
	// step's hygiene marked down.
	Kept
)

// PolicyOf returns the policy for a cleaned run path.
func PolicyOf(p string) Policy {
	switch {
	case p == Journal, p == Trace, p == Evaluations, p == Index, p == RunState, p == Notebook,
		p == Setup, p == Reproducibility,
		checkpointRE.MatchString(p),
		strings.HasPrefix(p, CitationsDir), strings.HasPrefix(p, OutputsDir):
		return Kept
	}
	return Open
}

// IsKept reports whether p is one of Triad's records.
func IsKept(p string) bool { return PolicyOf(p) == Kept }

// IsDataset reports whether p is a caller's data file that a report may
// cite by name (the evaluator's evidence check): tables and JSON the caller
// or a cell put in the run, never Triad's own records.
func IsDataset(p string) bool {
	if IsKept(p) {
		return false
	}
	for _, ext := range []string{".csv", ".json", ".xlsx", ".tsv", ".jsonl"} {
		if strings.HasSuffix(p, ext) {
			return true
		}
	}
	return false
}

// IsDeliverable reports whether p belongs in the artifact index: a file
// under artifacts/ other than the index itself.
func IsDeliverable(p string) bool {
	return strings.HasPrefix(p, ArtifactsDir) && p != Index
}

// Marshal encodes v as one line of JSON for a record, and MarshalIndent as
// an indented document. encoding/json already escapes every character that
// could end a line except U+0085 (NEL), which Python's str.splitlines and
// other readers also treat as a line break: it is escaped here, so a value
// from a caller or a cell can never split a record line in two.
func Marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	return escapeNEL(b), err
}

// MarshalIndent is Marshal with two-space indentation.
func MarshalIndent(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	return escapeNEL(b), err
}

// escapeNEL replaces raw U+0085 by its JSON escape; in valid JSON it can
// only stand inside a string.
func escapeNEL(b []byte) []byte {
	return bytes.ReplaceAll(b, []byte("\u0085"), []byte(`\u0085`))
}
