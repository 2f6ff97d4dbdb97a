package emit

import (
	"encoding/json"
	"testing"

	"github.com/triadhq/triad/sandbox"
)

func TestMeter(t *testing.T) {
	var got []sandbox.Event
	m := New(10, func(e sandbox.Event) { got = append(got, e) })
	if !m.Emit(sandbox.Event{Kind: sandbox.EventStdout, Text: "abcd"}) {
		t.Fatal("4 bytes under a 10-byte limit were refused")
	}
	// "é" is two bytes: the cut must not split it.
	if m.Emit(sandbox.Event{Kind: sandbox.EventStderr, Text: "12345é7"}) {
		t.Fatal("an event past the limit was accepted whole")
	}
	if !m.Over() {
		t.Fatal("Over() = false after a refusal")
	}
	b := &sandbox.Bundle{Data: map[string]json.RawMessage{"text/plain": json.RawMessage(`"x"`)}}
	if m.Emit(sandbox.Event{Kind: sandbox.EventDisplay, Bundle: b}) {
		t.Fatal("an event after the limit was accepted")
	}
	if len(got) != 2 || got[0].Text != "abcd" || got[1].Text != "12345" {
		t.Fatalf("got %+v, want abcd and the cut 12345", got)
	}
	if m.Used() > 10 {
		t.Fatalf("Used() = %d, want at most the limit", m.Used())
	}
}

func TestMeterDropsBundleWhole(t *testing.T) {
	var got []sandbox.Event
	m := New(5, func(e sandbox.Event) { got = append(got, e) })
	b := &sandbox.Bundle{Data: map[string]json.RawMessage{"text/plain": json.RawMessage(`"too long"`)}}
	if m.Emit(sandbox.Event{Kind: sandbox.EventResult, Bundle: b}) || len(got) != 0 || !m.Over() {
		t.Fatalf("got %+v over=%v, want the bundle dropped and the meter over", got, m.Over())
	}
}
