// Package template reads the operator's sandbox templates: for each, an image (Triad's sandbox image plus Debian packages, wheels and files), default limits and a default egress policy.
//
// Templates live in a directory (triad serve --templates), one small YAML
// file each, named NAME.yaml. A template named "default" serves runs that
// name none; without one, the default template is Triad's sandbox image
// as it is, with the server's limits and no egress at all. A template's
// image is a sandbox/image Variant, built offline and cached by content
// (triad image build --template NAME). Secrets a template's egress policy
// attaches to a destination are read here, from the server's environment
// or a file, and live nowhere else: a template's wire form names them only
// by host and header.
package template

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/goccy/go-yaml"

	"github.com/triadhq/triad/egress"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/image"
	"github.com/triadhq/triad/wire"
)

// Default is the name of the template a run gets when it names none.
const Default = "default"

// Template is one sandbox template.
type Template struct {
	// Name is the template's name, from its file's name.
	Name string
	// Description says what the template is for.
	Description string
	// Variant is what the template adds to Triad's sandbox image; nil for
	// a template that adds nothing (its kernels run the base image).
	Variant *image.Variant
	// Limits are the template's kernels' limits; zero fields take the
	// server's.
	Limits sandbox.Limits
	// Egress is the template's egress policy: what its runs may reach
	// unless a run narrows it. An empty policy reaches nothing.
	Egress *egress.Policy
}

// file is a template file's shape.
type file struct {
	Description string   `yaml:"description"`
	Base        string   `yaml:"base"`
	Debian      []string `yaml:"debian"`
	Wheelhouse  string   `yaml:"wheelhouse"`
	Wheels      []string `yaml:"wheels"`
	Files       []struct {
		Src  string `yaml:"src"`
		Dst  string `yaml:"dst"`
		Mode string `yaml:"mode"`
	} `yaml:"files"`
	Limits struct {
		Memory string  `yaml:"memory"`
		CPUs   float64 `yaml:"cpus"`
		Pids   int64   `yaml:"pids"`
		Disk   string  `yaml:"disk"`
		Output string  `yaml:"output"`
	} `yaml:"limits"`
	Egress struct {
		Allow []struct {
			Host    string   `yaml:"host"`
			Ports   []int    `yaml:"ports"`
			Methods []string `yaml:"methods"`
		} `yaml:"allow"`
		Deny           []string `yaml:"deny"`
		MaxBytes       string   `yaml:"max_bytes"`
		MaxConnections int      `yaml:"max_connections"`
		Secrets        []struct {
			Host      string `yaml:"host"`
			Header    string `yaml:"header"`
			Prefix    string `yaml:"prefix"`
			ValueEnv  string `yaml:"value_env"`
			ValueFile string `yaml:"value_file"`
		} `yaml:"secrets"`
	} `yaml:"egress"`
}

// Set is the templates a server offers. It always holds Default.
type Set struct {
	byName map[string]*Template
}

// ErrUnknown means a run named a template the server does not have: pick
// one of Set.Names.
var ErrUnknown = errors.New("template: unknown template")

// Builtin is the default template when the operator declares none: the
// sandbox image, the server's limits, no egress.
func Builtin() *Template { return &Template{Name: Default, Egress: &egress.Policy{}} }

// NewSet returns a Set of the given templates, with Builtin unless one is
// named Default.
func NewSet(ts ...*Template) *Set {
	s := &Set{byName: map[string]*Template{Default: Builtin()}}
	for _, t := range ts {
		s.byName[t.Name] = t
	}
	return s
}

// Load reads every NAME.yaml in dir (none when dir is ""). getenv reads
// the server's environment for secrets' value_env (os.Getenv when nil).
func Load(dir string, getenv func(string) string) (*Set, error) {
	if dir == "" {
		return NewSet(), nil
	}
	if getenv == nil {
		getenv = os.Getenv
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("templates: %w", err)
	}
	var ts []*Template
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".yaml")
		if !ok || e.IsDir() {
			continue
		}
		t, err := parse(dir, name, getenv)
		if err != nil {
			return nil, fmt.Errorf("template %s (%s): %w", name, filepath.Join(dir, e.Name()), err)
		}
		ts = append(ts, t)
	}
	return NewSet(ts...), nil
}

func parse(dir, name string, getenv func(string) string) (*Template, error) {
	data, err := os.ReadFile(filepath.Join(dir, name+".yaml"))
	if err != nil {
		return nil, err
	}
	var f file
	if err := yaml.UnmarshalWithOptions(data, &f, yaml.Strict()); err != nil {
		return nil, err
	}
	if f.Base != "" && f.Base != "triad" {
		return nil, fmt.Errorf("base %q: the only base is \"triad\", Triad's sandbox image", f.Base)
	}
	t := &Template{Name: name, Description: strings.TrimSpace(f.Description)}
	v := image.Variant{Name: name, Debian: f.Debian, Wheels: f.Wheels}
	if f.Wheelhouse != "" {
		v.Wheelhouse = resolve(dir, f.Wheelhouse)
	}
	for i, fl := range f.Files {
		vf := image.VariantFile{Src: resolve(dir, fl.Src), Dst: fl.Dst}
		if fl.Mode != "" {
			m, err := strconv.ParseUint(fl.Mode, 8, 32)
			if err != nil || m > 0o777 {
				return nil, fmt.Errorf("files[%d]: mode %q is not an octal permission like \"0644\"", i, fl.Mode)
			}
			vf.Mode = fs.FileMode(m)
		}
		if _, err := os.Stat(vf.Src); err != nil {
			return nil, fmt.Errorf("files[%d]: %w", i, err)
		}
		v.Files = append(v.Files, vf)
	}
	if len(v.Debian)+len(v.Wheels)+len(v.Files) > 0 {
		if err := v.Validate(); err != nil {
			return nil, err
		}
		if _, err := v.Hash(); err != nil { // reads the wheelhouse and files now, not at first use
			return nil, err
		}
		t.Variant = &v
	}
	l := f.Limits
	t.Limits = sandbox.Limits{CPUs: l.CPUs, Pids: l.Pids}
	for _, b := range []struct {
		name string
		in   string
		out  *int64
	}{{"limits.memory", l.Memory, &t.Limits.MemoryBytes}, {"limits.disk", l.Disk, &t.Limits.DiskBytes}, {"limits.output", l.Output, &t.Limits.OutputBytes}} {
		if b.in == "" {
			continue
		}
		n, err := ParseBytes(b.in)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.name, err)
		}
		*b.out = n
	}
	if l.CPUs < 0 || l.Pids < 0 {
		return nil, errors.New("limits: cpus and pids must be positive")
	}
	var pol wire.EgressPolicy
	for _, a := range f.Egress.Allow {
		pol.Allow = append(pol.Allow, wire.EgressRule{Host: a.Host, Ports: a.Ports, Methods: a.Methods})
	}
	pol.Deny, pol.MaxConnections = f.Egress.Deny, f.Egress.MaxConnections
	if f.Egress.MaxBytes != "" {
		if pol.MaxBytes, err = ParseBytes(f.Egress.MaxBytes); err != nil {
			return nil, fmt.Errorf("egress.max_bytes: %w", err)
		}
	}
	var secrets []egress.Secret
	for i, s := range f.Egress.Secrets {
		var val string
		switch {
		case s.ValueEnv != "" && s.ValueFile != "":
			return nil, fmt.Errorf("egress.secrets[%d]: give value_env or value_file, not both", i)
		case s.ValueEnv != "":
			val = getenv(s.ValueEnv)
			if val == "" {
				return nil, fmt.Errorf("egress.secrets[%d]: the environment variable %s is empty or unset", i, s.ValueEnv)
			}
		case s.ValueFile != "":
			b, err := os.ReadFile(resolve(dir, s.ValueFile))
			if err != nil {
				return nil, fmt.Errorf("egress.secrets[%d]: %w", i, err)
			}
			val = strings.TrimRight(string(b), "\r\n")
		default:
			return nil, fmt.Errorf("egress.secrets[%d]: give value_env or value_file: a secret's value never sits in a template", i)
		}
		secrets = append(secrets, egress.Secret{Host: s.Host, Header: s.Header, Value: s.Prefix + val})
	}
	if t.Egress, err = egress.Compile(pol, secrets); err != nil {
		return nil, err
	}
	return t, nil
}

func resolve(dir, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}

// Get returns the named template; "" is Default. An unknown name is an
// error wrapping ErrUnknown, a bad-input fault that names the templates
// there are.
func (s *Set) Get(name string) (*Template, error) {
	if name == "" {
		name = Default
	}
	if t, ok := s.byName[name]; ok {
		return t, nil
	}
	return nil, fault.Wrap(fault.BadInput, ErrUnknown, fmt.Sprintf("there is no sandbox template %q", name),
		"name one of the server's templates: "+strings.Join(s.Names(), ", "))
}

// Names returns the templates' names, sorted, Default first.
func (s *Set) Names() []string {
	var out []string
	for n := range s.byName {
		if n != Default {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return append([]string{Default}, out...)
}

// All returns every template, in Names order.
func (s *Set) All() []*Template {
	var out []*Template
	for _, n := range s.Names() {
		out = append(out, s.byName[n])
	}
	return out
}

// Wire describes the template for callers: its name, image additions,
// limits and egress policy (secrets by name only).
func (t *Template) Wire() wire.Template {
	w := wire.Template{Name: t.Name, Description: t.Description, Egress: t.Egress.Wire()}
	if t.Variant != nil {
		w.Debian, w.Wheels = slices.Clone(t.Variant.Debian), slices.Clone(t.Variant.Wheels)
		for _, f := range t.Variant.Files {
			w.Files = append(w.Files, f.Dst)
		}
	}
	return w
}

// ParseBytes reads "2GiB", "512MiB", "2g", "1048576".
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToLower(s))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"gib", 1 << 30}, {"mib", 1 << 20}, {"kib", 1 << 10}, {"gb", 1e9}, {"mb", 1e6}, {"kb", 1e3}, {"g", 1 << 30}, {"m", 1 << 20}, {"k", 1 << 10}, {"b", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.m
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("%q is not a size like 2GiB, 512MiB or 1048576", s)
	}
	return int64(f * float64(mult)), nil
}
