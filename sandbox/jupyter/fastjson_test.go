package jupyter

import (
	"encoding/json"
	"strings"
	"testing"
)

// streamSeeds are stream contents as ipykernel sends them, and near misses.
var streamSeeds = []string{
	`{"name": "stdout", "text": "hello\n"}`,
	`{"name":"stderr","text":"caf\u00e9 \ud83d\ude00 \u001b[31mred\u001b[0m\t\"q\" \\ \/"}`,
	`{"name": "stdout", "text": "déjà vu ✓"}`,
	`{"text": "", "name": "stdout"}`,
	`{}`,
	` { "name" : "stdout" , "text" : "x" } `,
	`{"name": "stdout", "text": "lone \ud800 and \udc00 and \ud800\u0041"}`,
	`{"name": "stdout", "text": "bad utf8 ` + "\xff\xfe" + `"}`,
	`{"name": "stdout", "text": "ctrl ` + "\x01" + `"}`,
	`{"Name": "stdout", "TEXT": "case"}`,
	`{"name": "stdout", "text": "a", "extra": 1}`,
	`{"name": "stdout", "text": "a"} trailing`,
	`{"name": "stdout", "text": "unterminated`,
	`{"name": "stdout", "text": "bad \x escape"}`,
	`{"name": "stdout", "text": "bad \u12 escape"}`,
	`[1, 2]`,
	`{"name": null, "text": "n"}`,
}

// TestDecodeStream checks the fast path against encoding/json on the seeds
// and that it takes the seeds ipykernel actually sends.
func TestDecodeStream(t *testing.T) {
	for _, s := range streamSeeds {
		checkStream(t, []byte(s))
	}
	for _, s := range streamSeeds[:6] {
		if _, ok := fastStream([]byte(s)); !ok {
			t.Errorf("fast path refused %q", s)
		}
	}
}

// FuzzDecodeStream: whatever the content, decodeStream answers exactly
// what encoding/json does, and the fast path never accepts what
// encoding/json rejects.
func FuzzDecodeStream(f *testing.F) {
	for _, s := range streamSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkStream(t, b) })
}

func checkStream(t *testing.T, b []byte) {
	t.Helper()
	var want streamContent
	werr := json.Unmarshal(b, &want)
	got, gerr := decodeStream(b)
	if (werr == nil) != (gerr == nil) || (werr == nil && got != want) {
		t.Errorf("decodeStream(%q) = %+v, %v; encoding/json gives %+v, %v", b, got, gerr, want, werr)
	}
	if fast, ok := fastStream(b); ok && (werr != nil || fast != want) {
		t.Errorf("fastStream(%q) = %+v, accepted; encoding/json gives %+v, %v", b, fast, want, werr)
	}
}

// BenchmarkDecodeStream decodes a 1 MiB stream message (what a flooding
// cell sends per message) with the fast path, and with encoding/json as
// the baseline in the same run.
func BenchmarkDecodeStream(b *testing.B) {
	content := []byte(`{"name": "stdout", "text": "` + strings.Repeat(strings.Repeat("x", 65535)+`\n`, 16) + `"}`)
	b.Run("fast", func(b *testing.B) {
		b.SetBytes(int64(len(content)))
		for b.Loop() {
			if _, err := decodeStream(content); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(content)))
		for b.Loop() {
			var c streamContent
			if err := json.Unmarshal(content, &c); err != nil {
				b.Fatal(err)
			}
		}
	})
}
