package recipes

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sort"
	"time"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/tmpfs"
)

// The run-level params every recipe has, declared or not. Their defaults
// are derived per run by Derive; the parameters cell reads them from the
// kernel (TRIAD_SEED, TRIAD_AS_OF), which Triad sets when the run's kernel
// starts, so a cell's source does not change with them.
const (
	// ParamSeed seeds the run's kernel: Python's random, NumPy's global
	// generator, and TRIAD_SEED for libraries that take a random_state.
	ParamSeed = "seed"
	// ParamAsOf is the run's as-of date, YYYY-MM-DD: the date "as of"
	// text shows, and SOURCE_DATE_EPOCH for document writers.
	ParamAsOf = "as_of"
)

// maxSeed is the largest seed NumPy's global generator takes.
const maxSeed = math.MaxUint32

// Derivation says where a run's seed and as_of came from.
type Derivation struct {
	SeedFrom string
	AsOfFrom string
}

// checkRunParam validates a seed or as_of value (normalized).
func checkRunParam(name string, v any) error {
	switch x := v.(type) {
	case nil:
	case int64:
		if x < 0 || x > maxSeed {
			return fmt.Errorf("seed %d is out of range 0..%d", x, int64(maxSeed))
		}
	case string:
		if x != "" {
			if _, err := time.Parse(time.DateOnly, x); err != nil {
				return fmt.Errorf("as_of %q is not a date (YYYY-MM-DD)", x)
			}
		}
	}
	return nil
}

// Derive returns params with the run-level params filled in where the
// caller left them out (a declared default counts as given): as_of is the
// latest date in the inputs (see LatestDate), or none; the seed is derived
// from the recipe's source, every other param (as_of included) and the
// inputs' hashes, so the same recipe on the same inputs with the same
// params always gets the same seed, and a change to any of them gets
// another. inputs are the bytes of the run's input files by input name;
// params are validated as Bind validates them.
func (r *Recipe) Derive(params map[string]any, inputs map[string][]byte) (map[string]any, Derivation, error) {
	out := make(map[string]any, len(params)+2)
	for k, v := range params {
		out[k] = v
	}
	var d Derivation
	given := func(name string) (any, bool, error) {
		p, _ := r.Param(name)
		if v, ok := out[name]; ok {
			nv, err := normalize(p.Type, v)
			if err != nil {
				return nil, false, fault.Badf(r.paramHelp(), "param %s: %v", name, err)
			}
			if err := checkRunParam(name, nv); err != nil {
				return nil, false, fault.Badf(r.paramHelp(), "param %s: %v", name, err)
			}
			return nv, true, nil
		}
		if p.Default != nil {
			return p.Default, true, nil
		}
		return nil, false, nil
	}
	if v, ok, err := given(ParamAsOf); err != nil {
		return nil, d, err
	} else if ok {
		out[ParamAsOf], d.AsOfFrom = v, "param"
		if _, set := params[ParamAsOf]; !set {
			d.AsOfFrom = "the recipe's default"
		}
	} else {
		out[ParamAsOf], d.AsOfFrom = "", "none: no input holds a date"
		for _, in := range r.Inputs {
			if date, ok := LatestDate(inputs[in.Name]); ok && date > out[ParamAsOf].(string) {
				out[ParamAsOf], d.AsOfFrom = date, fmt.Sprintf("the latest date in input %s (%s)", in.Name, in.Path)
			}
		}
	}
	if v, ok, err := given(ParamSeed); err != nil {
		return nil, d, err
	} else if ok {
		out[ParamSeed], d.SeedFrom = v, "param"
		if _, set := params[ParamSeed]; !set {
			d.SeedFrom = "the recipe's default"
		}
		return out, d, nil
	}
	// The other params as Bind normalizes them, defaults filled in.
	rest := make(map[string]any, len(out))
	for k, v := range out {
		rest[k] = v
	}
	rest[ParamSeed] = int64(0)
	plan, err := r.Bind(rest)
	if err != nil {
		return nil, d, err
	}
	delete(plan.Params, ParamSeed)
	pj, err := json.Marshal(plan.Params) // map keys sorted
	if err != nil {
		return nil, d, err
	}
	names := make([]string, 0, len(inputs))
	for name := range inputs {
		names = append(names, name)
	}
	sort.Strings(names)
	h := sha256.New()
	fmt.Fprintf(h, "triad seed v1\x00%s\x00%s\x00%s\x00", r.Name, tmpfs.DigestOf(r.Source), pj)
	for _, name := range names {
		fmt.Fprintf(h, "%s=%s\x00", name, tmpfs.DigestOf(inputs[name]))
	}
	// 31 bits: a seed every library takes, int32 random_state included.
	out[ParamSeed] = int64(binary.BigEndian.Uint32(h.Sum(nil)) & 0x7fffffff)
	d.SeedFrom = "derived from the recipe, its params and its inputs"
	return out, d, nil
}

// dateRE finds ISO dates (YYYY-MM-DD) and months (YYYY-MM) not inside a
// longer number.
var dateRE = regexp.MustCompile(`(?:^|[^0-9])((?:19|20)[0-9]{2})-(0[1-9]|1[0-2])(?:-([0-3][0-9]))?(?:[^0-9]|$)`)

// LatestDate returns the latest date written in data as an ISO date
// (YYYY-MM-DD) or month (YYYY-MM, which counts as its last day), and
// false when there is none. It reads text, so a binary file (a workbook)
// has no date.
func LatestDate(data []byte) (string, bool) {
	latest := ""
	for i := 0; i < len(data); {
		m := dateRE.FindSubmatchIndex(data[i:])
		if m == nil {
			break
		}
		y, mo := string(data[i+m[2]:i+m[3]]), string(data[i+m[4]:i+m[5]])
		var day time.Time
		var err error
		if m[6] >= 0 {
			day, err = time.Parse(time.DateOnly, y+"-"+mo+"-"+string(data[i+m[6]:i+m[7]]))
		} else {
			day, err = time.Parse(time.DateOnly, y+"-"+mo+"-01")
			day = day.AddDate(0, 1, -1)
		}
		if s := day.Format(time.DateOnly); err == nil && s > latest {
			latest = s
		}
		// The match may have consumed the separator before the next date.
		i += max(m[1]-1, m[0]+1)
	}
	return latest, latest != ""
}
