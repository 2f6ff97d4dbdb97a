package mcp

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/triadhq/triad/tmpfs"
)

// typeSchemas are the schemas of types whose JSON form is not what their Go
// shape suggests. Without them, inference reads tmpfs.Digest (a struct with
// unexported fields that marshals as 64 hex digits) as an empty object, and
// json.RawMessage (any JSON value) as an array of bytes, and the SDK would
// then reject every honest answer as not matching its own output schema.
var typeSchemas = map[reflect.Type]*jsonschema.Schema{
	reflect.TypeFor[tmpfs.Digest](): {
		Type:        "string",
		Pattern:     "^[0-9a-f]{64}$",
		Description: "sha256 of the content: 64 lower-case hex digits",
	},
	reflect.TypeFor[json.RawMessage](): {},
}

// schemaFor infers T's JSON schema the way the SDK does (same library, same
// rules: struct fields by their json names, omitempty means optional,
// unknown properties refused), with typeSchemas applied and the given
// property descriptions. The tools' Go types are the HTTP API's own
// request and answer types, so the schemas are the HTTP contracts by
// construction, not by a copy that could drift.
//
// A description key is a property path: "code", "files_in[].name",
// "display[].data". A key that names no property is a bug in this package,
// so schemaFor panics; the package's tests build every tool.
func schemaFor[T any](descriptions map[string]string) *jsonschema.Schema {
	s, err := jsonschema.For[T](&jsonschema.ForOptions{TypeSchemas: typeSchemas})
	if err != nil {
		panic(fmt.Sprintf("mcp: infer schema of %T: %v", *new(T), err))
	}
	for path, d := range descriptions {
		p := property(s, path)
		if p == nil {
			panic(fmt.Sprintf("mcp: schema of %T has no property %q", *new(T), path))
		}
		p.Description = d
	}
	return s
}

// property finds the schema at path (see schemaFor).
func property(s *jsonschema.Schema, path string) *jsonschema.Schema {
	for seg := range strings.SplitSeq(path, ".") {
		name, items := strings.CutSuffix(seg, "[]")
		if s == nil || s.Properties == nil {
			return nil
		}
		s = s.Properties[name]
		if items {
			if s == nil {
				return nil
			}
			s = s.Items
		}
	}
	return s
}
