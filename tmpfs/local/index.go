package local

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

// Index keeps each run's index as an append-only log of put and del records,
// fsynced per record and replayed into memory on first use. A record torn by
// a crash (the last line, unterminated) is ignored: it was never acknowledged.
type Index struct {
	dir string

	mu   sync.Mutex
	runs map[runid.ID]*runIndex

	// crash, set only by tests, is called at each point of a record's
	// write (crashPoints); an error stops the write there, as if the
	// process had died at that point, and the test reopens the index.
	crash func(point string) error
}

// crashPoints are the points of a record's write where a test can stop it:
// before any byte of it is written, with half of it written (a torn
// line), with all of it written but not fsynced, and after the fsync but
// before the index in memory or the caller learns of it.
var crashPoints = []string{"before-record", "torn-record", "before-sync", "after-sync"}

var _ tmpfs.Index = (*Index)(nil)

type runIndex struct {
	mu      sync.Mutex
	gone    bool // forgotten: a caller that finds it so looks the run up again
	files   map[string]tmpfs.File
	dirs    tmpfs.DirCounts // files per directory, for FilesUnder
	log     *os.File
	records int   // lines in the log, for compaction
	valid   int64 // length of the log's complete records; a torn tail is cut here
}

type record struct {
	Op string `json:"op"` // "put", "del" or "batch"
	tmpfs.File
	// Files are a batch's puts (tmpfs.Batcher): one line, so a crash
	// leaves all of them or none.
	Files []tmpfs.File `json:"files,omitempty"`
}

// NewIndex returns an index rooted at dataDir.
func NewIndex(dataDir string) (*Index, error) {
	dir := filepath.Join(dataDir, "runs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &Index{dir: dir, runs: map[runid.ID]*runIndex{}}, nil
}

// Close closes the open logs. It is safe to call twice.
func (x *Index) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	for id, r := range x.runs {
		r.mu.Lock()
		if r.log != nil {
			r.log.Close()
		}
		r.mu.Unlock()
		delete(x.runs, id)
	}
	return nil
}

// Forget implements tmpfs.Forgetter: the run's log is closed and its
// records leave memory; its next use replays the log from disk again. The
// orchestrator calls it when a run has gone idle, so that memory and open
// files grow with the runs in use, not with every run ever seen.
func (x *Index) Forget(run runid.ID) {
	x.mu.Lock()
	r := x.runs[run]
	delete(x.runs, run)
	x.mu.Unlock()
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gone = true
	if r.log != nil {
		r.log.Close()
		r.log = nil
	}
}

// Cached is the number of runs whose index is in memory.
func (x *Index) Cached() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.runs)
}

var _ tmpfs.Forgetter = (*Index)(nil)

// run returns the run's index with its mu held, replaying the log on first
// use. An index forgotten between the lookup and the lock is looked up
// again, so no caller writes through a closed log.
func (x *Index) run(run runid.ID) (*runIndex, error) {
	for {
		r, err := x.load(run)
		if err != nil {
			return nil, err
		}
		r.mu.Lock()
		if !r.gone {
			return r, nil
		}
		r.mu.Unlock()
	}
}

func (x *Index) load(run runid.ID) (*runIndex, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if r, ok := x.runs[run]; ok {
		return r, nil
	}
	r := &runIndex{files: map[string]tmpfs.File{}, dirs: tmpfs.DirCounts{}}
	p := filepath.Join(x.dir, run.String(), "index.jsonl")
	data, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read index of run %s: %w", run, err)
	}
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break // torn final record: never acknowledged, cut on next append
		}
		r.valid += int64(i + 1)
		var rec record
		if err := json.Unmarshal(data[:i], &rec); err != nil {
			return nil, fmt.Errorf("index of run %s: corrupt record: %w", run, err)
		}
		data = data[i+1:]
		r.records++
		switch rec.Op {
		case "put":
			r.put(rec.File)
		case "batch":
			for _, f := range rec.Files {
				r.put(f)
			}
		case "del":
			r.del(rec.Path)
		}
	}
	x.runs[run] = r
	return r, nil
}

func (x *Index) logPath(run runid.ID) string {
	return filepath.Join(x.dir, run.String(), "index.jsonl")
}

// append writes one record durably. Called with r.mu held.
func (x *Index) append(run runid.ID, r *runIndex, rec record) error {
	if r.log == nil {
		if err := os.MkdirAll(filepath.Dir(x.logPath(run)), 0o700); err != nil {
			return err
		}
		f, err := os.OpenFile(x.logPath(run), os.O_WRONLY|os.O_CREATE, 0o600)
		if err != nil {
			return fmt.Errorf("open index of run %s: %w", run, err)
		}
		if err := f.Truncate(r.valid); err != nil {
			f.Close()
			return fmt.Errorf("cut torn record from index of run %s: %w", run, err)
		}
		if _, err := f.Seek(r.valid, 0); err != nil {
			f.Close()
			return err
		}
		r.log = f
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	line := append(b, '\n')
	n, err := 0, x.crashAt("before-record")
	if err == nil && x.crash != nil {
		if err = x.crashAt("torn-record"); err != nil {
			r.log.Write(line[:len(line)/2])
		}
	}
	if err == nil {
		n, err = r.log.Write(line)
	}
	if err == nil {
		err = x.crashAt("before-sync")
	}
	if err == nil {
		err = r.log.Sync()
	}
	if err == nil {
		err = x.crashAt("after-sync")
	}
	if err != nil {
		// Reopen next time, which cuts whatever part of this record landed.
		r.log.Close()
		r.log = nil
		return fmt.Errorf("append index of run %s: %w", run, err)
	}
	r.valid += int64(n)
	r.records++
	if r.records > 2*len(r.files)+256 {
		return x.compact(run, r)
	}
	return nil
}

func (x *Index) crashAt(point string) error {
	if x.crash == nil {
		return nil
	}
	return x.crash(point)
}

// put applies one put to the run's files in memory.
func (r *runIndex) put(f tmpfs.File) {
	if _, had := r.files[f.Path]; !had {
		r.dirs.Add(f.Path, 1)
	}
	r.files[f.Path] = f
}

// del removes the file at path, if the index has it.
func (r *runIndex) del(path string) {
	if _, had := r.files[path]; had {
		delete(r.files, path)
		r.dirs.Add(path, -1)
	}
}

// compact rewrites the log as one put per live file, atomically.
func (x *Index) compact(run runid.ID, r *runIndex) error {
	p := x.logPath(run)
	tmp, err := os.CreateTemp(filepath.Dir(p), "index-*.tmp")
	if err != nil {
		return err
	}
	w := bufio.NewWriter(tmp)
	paths := make([]string, 0, len(r.files))
	for k := range r.files {
		paths = append(paths, k)
	}
	sort.Strings(paths)
	for _, k := range paths {
		b, _ := json.Marshal(record{Op: "put", File: r.files[k]})
		w.Write(append(b, '\n'))
	}
	if err := w.Flush(); err == nil {
		err = tmp.Sync()
	}
	tmp.Close()
	if err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := syncDir(filepath.Dir(p)); err != nil {
		return err
	}
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	r.log.Close()
	r.log = nil
	r.records = len(paths)
	r.valid = st.Size()
	return nil
}

// Get implements tmpfs.Index.
func (x *Index) Get(ctx context.Context, run runid.ID, path string) (tmpfs.File, error) {
	r, err := x.run(run)
	if err != nil {
		return tmpfs.File{}, err
	}
	defer r.mu.Unlock()
	f, ok := r.files[path]
	if !ok {
		return tmpfs.File{}, fmt.Errorf("%w: %q in run %s", tmpfs.ErrNotFound, path, run)
	}
	return f, nil
}

// Put implements tmpfs.Index.
func (x *Index) Put(ctx context.Context, run runid.ID, f tmpfs.File) error {
	r, err := x.run(run)
	if err != nil {
		return err
	}
	defer r.mu.Unlock()
	if err := x.append(run, r, record{Op: "put", File: f}); err != nil {
		return err
	}
	r.put(f)
	return nil
}

var _ tmpfs.Batcher = (*Index)(nil)

// PutAll implements tmpfs.Batcher: the puts are one record of the run's
// log, written with one fsync, so a crash leaves all of them or none (a
// torn last line is never replayed). A journaled step is one such record
// (tmpfs.Store.Commit); see "One group commit per step" in
// docs/DECISIONS.md.
func (x *Index) PutAll(ctx context.Context, run runid.ID, files []tmpfs.File) error {
	if len(files) == 0 {
		return nil
	}
	r, err := x.run(run)
	if err != nil {
		return err
	}
	defer r.mu.Unlock()
	if err := x.append(run, r, record{Op: "batch", Files: files}); err != nil {
		return err
	}
	for _, f := range files {
		r.put(f)
	}
	return nil
}

// Delete implements tmpfs.Index.
func (x *Index) Delete(ctx context.Context, run runid.ID, path string) error {
	r, err := x.run(run)
	if err != nil {
		return err
	}
	defer r.mu.Unlock()
	if _, ok := r.files[path]; !ok {
		return fmt.Errorf("%w: %q in run %s", tmpfs.ErrNotFound, path, run)
	}
	if err := x.append(run, r, record{Op: "del", File: tmpfs.File{Path: path}}); err != nil {
		return err
	}
	r.del(path)
	return nil
}

var _ tmpfs.DirCounter = (*Index)(nil)

// FilesUnder implements tmpfs.DirCounter.
func (x *Index) FilesUnder(ctx context.Context, run runid.ID, dir string) (int, error) {
	r, err := x.run(run)
	if err != nil {
		return 0, err
	}
	defer r.mu.Unlock()
	return r.dirs[dir], nil
}

// List implements tmpfs.Index.
func (x *Index) List(ctx context.Context, run runid.ID, prefix string) ([]tmpfs.File, error) {
	r, err := x.run(run)
	if err != nil {
		return nil, err
	}
	defer r.mu.Unlock()
	out := make([]tmpfs.File, 0, len(r.files))
	for p, f := range r.files {
		if strings.HasPrefix(p, prefix) {
			out = append(out, f)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}
