package orchestrator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator/tenancy"
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
	r, done := o.runs.use(run)
	defer done()
	ow, err := o.access(ctx, r, auth.Runs, false)
	if err != nil {
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
	held, err := o.lockRun(ctx, r)
	if err != nil {
		return wire.RunSummary{}, err
	}
	defer held.Unlock()
	var out wire.RunSummary
	o.t.Label(ctx, ow, func(s *tenancy.Summary) {
		if in.Name != nil {
			s.Name = name
		}
		if tags != nil {
			s.Tags = tags
			if len(tags) == 0 {
				s.Tags = nil
			}
		}
		out = s.Listed()
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

// The orders GET /runs sorts by (tenancy.Sorts).
const (
	SortCreated = tenancy.SortCreated
	SortOldest  = tenancy.SortOldest
	SortUpdated = tenancy.SortUpdated
	SortName    = tenancy.SortName
)
