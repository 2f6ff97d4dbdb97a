package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/wire"
)

// A run's name and tags are how people find it again: they live in its
// entry in the tenant's run index, beside its status and counts, so GET
// /runs lists and searches them without reading any run.

// Bounds of a run's labels.
const (
	MaxRunName = 200
	MaxTags    = 20
	MaxTag     = 40
)

// SetLabels names or tags a run the caller may write, and returns its
// summary as GET /runs will list it. Labels are not the run's activity:
// its Updated time, and so its duration, stay as they were.
func (o *Orchestrator) SetLabels(ctx context.Context, run runid.ID, in wire.RunLabels) (wire.RunSummary, error) {
	if _, err := o.access(ctx, run, auth.Runs, false); err != nil {
		return wire.RunSummary{}, err
	}
	var name string
	var tags []string
	if in.Name != nil {
		name = strings.Join(strings.Fields(*in.Name), " ")
		if err := checkLabel("name", name, MaxRunName); err != nil {
			return wire.RunSummary{}, err
		}
	}
	if in.Tags != nil {
		if len(*in.Tags) > MaxTags {
			return wire.RunSummary{}, fault.Badf(fmt.Sprintf("send at most %d tags", MaxTags), "%d tags is too many", len(*in.Tags))
		}
		for _, t := range *in.Tags {
			t = strings.ToLower(strings.TrimSpace(t))
			if t == "" || strings.ContainsFunc(t, unicode.IsSpace) {
				return wire.RunSummary{}, fault.Badf("send tags as single words such as q3 or eu-figures", "tag %q is empty or has a space", t)
			}
			if err := checkLabel("tag", t, MaxTag); err != nil {
				return wire.RunSummary{}, err
			}
			if !slices.Contains(tags, t) {
				tags = append(tags, t)
			}
		}
		if tags == nil {
			tags = []string{}
		}
	}
	held, err := o.lockRun(ctx, run)
	if err != nil {
		return wire.RunSummary{}, err
	}
	defer held.Unlock()
	var out wire.RunSummary
	o.editSummary(ctx, run, nil, false, func(s *summary) {
		if in.Name != nil {
			s.Name = name
		}
		if tags != nil {
			s.Tags = tags
			if len(tags) == 0 {
				s.Tags = nil
			}
		}
		out = s.RunSummary
		out.Tags = slices.Clone(s.Tags)
	})
	return out, nil
}

// checkLabel refuses a name or tag that is too long or holds control
// characters.
func checkLabel(what, v string, limit int) error {
	if n := utf8.RuneCountInString(v); n > limit {
		return fault.Badf(fmt.Sprintf("send a %s of at most %d characters", what, limit), "the %s is %d characters long", what, n)
	}
	if !utf8.ValidString(v) || strings.ContainsFunc(v, unicode.IsControl) {
		return fault.Badf(fmt.Sprintf("send the %s as plain text", what), "the %s holds control characters", what)
	}
	return nil
}

// labels returns a run's name and tags from its index entry (the pending
// one, if a change is not written yet).
func (o *Orchestrator) labels(ctx context.Context, ow owner) (string, []string) {
	o.t.smu.Lock()
	if rs := o.t.sums[ow.Run]; rs != nil {
		name, tags := rs.sum.Name, slices.Clone(rs.sum.Tags)
		o.t.smu.Unlock()
		return name, tags
	}
	o.t.smu.Unlock()
	var s summary
	if b, _, err := o.store.Meta().GetMeta(ctx, indexKey(ow)); err == nil && json.Unmarshal(b, &s) == nil {
		return s.Name, s.Tags
	}
	return "", nil
}

// The orders GET /runs sorts by.
const (
	SortCreated = "created" // newest first, the default
	SortOldest  = "oldest"
	SortUpdated = "updated" // latest activity first
	SortName    = "name"    // A to Z, unnamed runs last
)

// Sorts lists the orders RunsQuery.Sort takes.
var Sorts = []string{SortCreated, SortOldest, SortUpdated, SortName}

// maxSorted bounds the index entries a page in another order than the
// index's own reads: the tenant's newest runs, this many of them.
const maxSorted = 5000

// search reports whether a run matches every term of q: a term tag:x
// needs the tag x; any other term is looked for in the run's id, name,
// objective, recipe and tags, ignoring case.
func search(s wire.RunSummary, q string) bool {
	for _, term := range strings.Fields(strings.ToLower(q)) {
		if t, ok := strings.CutPrefix(term, "tag:"); ok {
			if !slices.Contains(s.Tags, t) {
				return false
			}
			continue
		}
		hay := strings.ToLower(s.RunID + "\x00" + s.Name + "\x00" + s.Objective + "\x00" + s.Recipe + "\x00" + strings.Join(s.Tags, "\x00"))
		if !strings.Contains(hay, term) {
			return false
		}
	}
	return true
}

// sortedCursor is a page's cursor in another order than the index's: the
// offset of the page's first run, after "@".
func sortedCursor(offset int) string { return "@" + strconv.Itoa(offset) }

// sortRuns orders runs for q.Sort.
func sortRuns(runs []wire.RunSummary, by string) {
	sort.SliceStable(runs, func(i, j int) bool {
		a, b := runs[i], runs[j]
		switch by {
		case SortOldest:
			return a.Created.Before(b.Created)
		case SortUpdated:
			return a.Updated.After(b.Updated)
		case SortName:
			if (a.Name == "") != (b.Name == "") {
				return a.Name != ""
			}
			if x, y := strings.ToLower(a.Name), strings.ToLower(b.Name); x != y {
				return x < y
			}
		}
		return a.Created.After(b.Created)
	})
}
