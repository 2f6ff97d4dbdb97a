package wire

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/safepath"
)

// The contract of each JSON field is written once, in the struct tags of
// its wire type, and read by every generator: the OpenAPI document (api)
// and MCP's tool schemas (api/mcp). The HTTP API validates each request
// against the document before a handler sees it, and MCP's SDK validates
// tool arguments against the tool's schema, so a constraint written here is
// both stated and enforced on every surface. See docs/DECISIONS.md, "One
// source for the contract".
//
// The tags, each named for the JSON Schema keyword it becomes:
//
//	doc:"..."                    the field's description
//	format:"run-id"              one of Triad's formats below, or a JSON Schema format ("date")
//	pattern:"..."                a regular expression (RE2 and ECMA-262 alike) the string must match
//	enum:"a|b"                   the values allowed
//
// The string constraints (format, pattern, enum, lengths, maxBytes) of an
// array of strings apply to its items; minItems and maxItems to the array.
//	minimum:"1" maximum:"20"     an inclusive numeric range
//	exclusiveMinimum:"0"         an exclusive lower bound
//	minLength:"1" maxLength:"9"  a string's length, in characters
//	minItems:"1" maxItems:"9"    an array's length
//	keyPattern:"..." valuePattern:"..."  the patterns of a map's keys and values
//	maxBytes:"1024"              a string's length in UTF-8 bytes (x-max-bytes: JSON Schema counts characters)
//	duration:"1m..720h"          a Go duration between two bounds (x-duration; the upper one may be the server's)

// Field is what a wire type's tags say about one JSON field.
type Field struct {
	Description string
	Format      string
	Pattern     string
	Enum        []string
	// Minimum and Maximum are inclusive; ExclusiveMinimum is not.
	Minimum, Maximum, ExclusiveMinimum *float64
	MinLength, MaxLength               *uint64
	MinItems, MaxItems                 *uint64
	// MaxBytes bounds a string's UTF-8 length, for limits that are in
	// bytes (file names); 0 is none.
	MaxBytes uint64
	// MinDuration and MaxDuration bound a Go duration string ("90m").
	MinDuration, MaxDuration string
	// KeyPattern and ValuePattern constrain a map's keys and values.
	KeyPattern, ValuePattern string
}

// The formats of Triad's own values. Each stands for a pattern (and, for
// paths, a byte limit) that its validator's own package keeps and tests
// against the validator.
const (
	// RunIDFormat is a run id (runid.Parse).
	RunIDFormat = "run-id"
	// PathFormat is a run file's path (safepath.Clean): relative, no
	// "..", no backslash, no control, line-separator or invisible format
	// character, at most 1024 bytes with components of at most 255.
	PathFormat = "run-path"
	// PrefixFormat is a listing prefix (safepath.CleanPrefix): a path, a
	// trailing "/" allowed, or empty for every file.
	PrefixFormat = "run-prefix"
	// DirFormat is a directory of the run's files: a path, or empty for
	// their root.
	DirFormat = "run-dir"
	// NonBlankFormat is text that holds something other than white space
	// (Go's unicode.IsSpace, Python's str.isspace): the pattern NonBlank.
	NonBlankFormat = "non-blank"
	// DomainFormat is a DNS host name as browser.search's allow_domains
	// takes it: labels of 1-63 letters, digits and hyphens, not starting
	// or ending with a hyphen, at most 253 characters and an optional
	// trailing dot, the last label not all digits (no IP addresses),
	// internationalised names in punycode.
	DomainFormat = "domain"
	// DateRangeFormat is browser.search's date_range: day, week, month,
	// year, or YYYY-MM-DD..YYYY-MM-DD with real dates, the start not after
	// the end.
	DateRangeFormat = "date-range"
	// DurationFormat is a Go duration such as "24h" or "90m" (units ns,
	// us, ms, s, m, h), within the bounds of its duration tag.
	DurationFormat = "duration-go"
	// EgressHostFormat is an egress rule's host (egress.CheckRuleHost): *,
	// *.name or a DNS name of letters, digits, hyphens and underscores,
	// lower- or upper-case, never an IP address or a numeric last label.
	EgressHostFormat = "egress-host"
	// EgressNameFormat is a DNS name as EgressHostFormat takes it, without
	// a wildcard (an egress secret's host).
	EgressNameFormat = "egress-name"
	// CIDRFormat is an IP address or a CIDR prefix (IPv4 or IPv6).
	CIDRFormat = "cidr"
	// HTTPMethodFormat is an HTTP method an egress rule may allow: letters
	// only, never CONNECT.
	HTTPMethodFormat = "http-method"
	// HeaderNameFormat is an HTTP header's name (RFC 9110's token).
	HeaderNameFormat = "header-name"
)

// NonBlank is the pattern of a string that must hold something other than
// white space (as Go's unicode.IsSpace and Python's str.isspace see it).
const NonBlank = `[^\t\n\v\f\r \x85\p{Z}]`

// FieldOf reads f's tags. A malformed tag is a bug in this package, which
// TestFieldsWellFormed catches, so FieldOf panics on one.
func FieldOf(f reflect.StructField) Field {
	fd, err := fieldOf(f.Tag)
	if err != nil {
		panic(fmt.Sprintf("wire: field %s: %v", f.Name, err))
	}
	return fd
}

func fieldOf(tag reflect.StructTag) (Field, error) {
	fd := Field{Description: tag.Get("doc"), Format: tag.Get("format"), Pattern: tag.Get("pattern"),
		KeyPattern: tag.Get("keyPattern"), ValuePattern: tag.Get("valuePattern")}
	switch fd.Format {
	case RunIDFormat:
		if fd.Pattern == "" {
			fd.Pattern = runid.Pattern
		}
		fd.MaxLength = ptr(uint64(runid.MaxLen))
	case NonBlankFormat:
		if fd.Pattern == "" {
			fd.Pattern = NonBlank
		}
	case DomainFormat:
		if fd.Pattern == "" {
			fd.Pattern = `^[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.?$`
		}
		fd.MaxLength = orPtr(fd.MaxLength, ptr(uint64(254)))
	case EgressHostFormat, EgressNameFormat:
		if fd.Pattern == "" {
			fd.Pattern = map[string]string{EgressHostFormat: `^(?:\*|(?:\*\.)?[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.?)$`,
				EgressNameFormat: `^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.?$`}[fd.Format]
		}
		fd.MaxLength = orPtr(fd.MaxLength, ptr(uint64(256)))
	case CIDRFormat:
		if fd.Pattern == "" {
			fd.Pattern = `^[0-9A-Fa-f:.]+(?:/[0-9]{1,3})?$`
		}
	case HTTPMethodFormat:
		if fd.Pattern == "" {
			fd.Pattern = `^[A-Za-z]+$`
		}
	case HeaderNameFormat:
		if fd.Pattern == "" {
			fd.Pattern = "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"
		}
	case PathFormat, PrefixFormat, DirFormat:
		if fd.Pattern == "" {
			fd.Pattern = map[string]string{PathFormat: safepath.Pattern, PrefixFormat: safepath.PrefixPattern,
				DirFormat: "^$|" + safepath.Pattern}[fd.Format]
		}
		fd.MaxBytes = safepath.MaxPath
	}
	if e := tag.Get("enum"); e != "" {
		fd.Enum = strings.Split(e, "|")
	}
	var err error
	num := func(name string) *float64 {
		v, ok := tag.Lookup(name)
		if !ok || err != nil {
			return nil
		}
		n, perr := strconv.ParseFloat(v, 64)
		if perr != nil {
			err = fmt.Errorf("%s:%q is not a number", name, v)
		}
		return &n
	}
	count := func(name string) *uint64 {
		v, ok := tag.Lookup(name)
		if !ok || err != nil {
			return nil
		}
		n, perr := strconv.ParseUint(v, 10, 64)
		if perr != nil {
			err = fmt.Errorf("%s:%q is not a count", name, v)
		}
		return &n
	}
	fd.Minimum, fd.Maximum, fd.ExclusiveMinimum = num("minimum"), num("maximum"), num("exclusiveMinimum")
	fd.MinLength, fd.MaxLength = count("minLength"), orPtr(count("maxLength"), fd.MaxLength)
	fd.MinItems, fd.MaxItems = count("minItems"), count("maxItems")
	if n := count("maxBytes"); n != nil {
		fd.MaxBytes = *n
	}
	if d, ok := tag.Lookup("duration"); ok {
		lo, hi, ok := strings.Cut(d, "..")
		if !ok {
			return fd, fmt.Errorf("duration:%q is not min..max", d)
		}
		fd.MinDuration, fd.MaxDuration = lo, hi
		fd.Format = DurationFormat
	}
	return fd, err
}

func ptr[T any](v T) *T { return &v }

func orPtr[T any](a, b *T) *T {
	if a != nil {
		return a
	}
	return b
}

// ExactlyOne is implemented by a request type some of whose fields are
// alternatives: exactly one of them must be present. The generators state
// it as a oneOf of required fields.
type ExactlyOne interface {
	ExactlyOne() []string
}

// AtLeastOne is implemented by a request type of which at least one of
// some fields must be present. The generators state it as an anyOf of
// required fields.
type AtLeastOne interface {
	AtLeastOne() []string
}

// Conditional is implemented by a request type whose fields depend on
// another's value: each Condition's fields may be present only when Field
// equals Value (or, with Not, only when it does not).
type Conditional interface {
	Conditions() []Condition
}

// Condition says that Fields may be present only when Field is Value
// (Not: only when it is not; an absent Field is not Value).
type Condition struct {
	Field  string
	Value  string
	Not    bool
	Fields []string
}

// NamedField is a struct field as encoding/json sees it.
type NamedField struct {
	reflect.StructField
	// Name is its JSON name; OmitEmpty is true when an empty value is
	// left out (omitempty or omitzero), so the field is optional.
	Name      string
	OmitEmpty bool
}

// Fields lists t's JSON fields in order, embedded structs' fields in
// their place, as encoding/json marshals them.
func Fields(t reflect.Type) []NamedField {
	var out []NamedField
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				out = append(out, Fields(ft)...)
				continue
			}
		}
		if !f.IsExported() || tag == "" || name == "-" {
			continue
		}
		o := strings.Split(opts, ",")
		out = append(out, NamedField{StructField: f, Name: name, OmitEmpty: slices.Contains(o, "omitempty") || slices.Contains(o, "omitzero")})
	}
	return out
}
