package mcp

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
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
// unknown properties refused), with typeSchemas applied, and then writes
// the contract the wire types' tags state (wire.FieldOf: descriptions,
// patterns, ranges; and for inputs the rules of the object as a whole), as
// the OpenAPI document does from the same tags. The tools' Go types are the
// HTTP API's own request and answer types, so the schemas are the HTTP
// contracts by construction, not by a copy that could drift.
//
// An input refuses null where the Go type would take it for "absent": a
// caller who sends top_k: null is told so, as over HTTP.
func schemaFor[T any](input bool) *jsonschema.Schema {
	s, err := jsonschema.For[T](&jsonschema.ForOptions{TypeSchemas: typeSchemas})
	if err != nil {
		panic(fmt.Sprintf("mcp: infer schema of %T: %v", *new(T), err))
	}
	apply(reflect.TypeFor[T](), s, input)
	return s
}

var timeType = reflect.TypeFor[time.Time]()

// apply writes t's field tags onto s, t's schema, recursively.
func apply(t reflect.Type, s *jsonschema.Schema, input bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if s == nil || t.Kind() != reflect.Struct || t == timeType || typeSchemas[t] != nil {
		return
	}
	for _, f := range wire.Fields(t) {
		p := s.Properties[f.Name]
		if p == nil {
			continue
		}
		fd := wire.FieldOf(f.StructField)
		if input {
			noNull(p)
		}
		if fd.Description != "" {
			p.Description = fd.Description
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch ft.Kind() {
		case reflect.Slice:
			p.MinItems, p.MaxItems = count(fd.MinItems), count(fd.MaxItems)
			if ft.Elem().Kind() == reflect.String {
				scalar(p.Items, fd)
			}
			apply(ft.Elem(), p.Items, input)
		case reflect.Map:
			if fd.KeyPattern != "" {
				p.PropertyNames = &jsonschema.Schema{Type: "string", Pattern: fd.KeyPattern}
			}
			if fd.ValuePattern != "" && p.AdditionalProperties != nil {
				p.AdditionalProperties.Pattern = fd.ValuePattern
			}
			apply(ft.Elem(), p.AdditionalProperties, input)
		case reflect.Struct:
			apply(ft, p, input)
		default:
			scalar(p, fd)
		}
	}
	if !input {
		return
	}
	v := reflect.New(t).Elem().Interface()
	if x, ok := v.(wire.ExactlyOne); ok {
		for _, f := range x.ExactlyOne() {
			s.OneOf = append(s.OneOf, &jsonschema.Schema{Required: []string{f}})
		}
	}
	if x, ok := v.(wire.AtLeastOne); ok {
		for _, f := range x.AtLeastOne() {
			s.AnyOf = append(s.AnyOf, &jsonschema.Schema{Required: []string{f}})
		}
	}
	if x, ok := v.(wire.Conditional); ok {
		for _, c := range x.Conditions() {
			s.AllOf = append(s.AllOf, condition(c))
		}
	}
}

// condition states a wire.Condition as the OpenAPI document does.
func condition(c wire.Condition) *jsonschema.Schema {
	is := &jsonschema.Schema{Required: []string{c.Field}, Properties: map[string]*jsonschema.Schema{c.Field: {Enum: []any{c.Value}}}}
	if c.Not {
		is = &jsonschema.Schema{Not: is}
	}
	var any []*jsonschema.Schema
	for _, f := range c.Fields {
		any = append(any, &jsonschema.Schema{Required: []string{f}})
	}
	return &jsonschema.Schema{AnyOf: []*jsonschema.Schema{is, {Not: &jsonschema.Schema{AnyOf: any}}}}
}

// noNull drops null from an input's types.
func noNull(p *jsonschema.Schema) {
	if i := slices.Index(p.Types, "null"); i >= 0 {
		types := slices.Delete(slices.Clone(p.Types), i, i+1)
		if len(types) == 1 {
			p.Type, p.Types = types[0], nil
		} else {
			p.Types = types
		}
	}
}

// scalar writes a field's value constraints onto s.
func scalar(s *jsonschema.Schema, fd wire.Field) {
	if s == nil {
		return
	}
	if fd.Format != "" {
		s.Format = fd.Format
	}
	if fd.Pattern != "" {
		s.Pattern = fd.Pattern
	}
	for _, e := range fd.Enum {
		s.Enum = append(s.Enum, e)
	}
	if fd.Minimum != nil {
		s.Minimum = fd.Minimum
	}
	if fd.Maximum != nil {
		s.Maximum = fd.Maximum
	}
	if fd.ExclusiveMinimum != nil {
		s.ExclusiveMinimum = fd.ExclusiveMinimum
	}
	s.MinLength, s.MaxLength = orCount(s.MinLength, fd.MinLength), orCount(s.MaxLength, fd.MaxLength)
	if fd.MaxBytes != 0 {
		extra(s)["x-max-bytes"] = fd.MaxBytes
	}
	if fd.MinDuration != "" || fd.MaxDuration != "" {
		extra(s)["x-duration"] = map[string]string{"min": fd.MinDuration, "max": fd.MaxDuration}
	}
}

func extra(s *jsonschema.Schema) map[string]any {
	if s.Extra == nil {
		s.Extra = map[string]any{}
	}
	return s.Extra
}

func count(n *uint64) *int {
	if n == nil {
		return nil
	}
	v := int(*n)
	return &v
}

func orCount(old *int, n *uint64) *int {
	if n == nil {
		return old
	}
	return count(n)
}
