package wasm_test

import (
	"bufio"
	"context"
	"testing"
	"time"

	"github.com/triadhq/triad/sandbox/wasm"
)

// A program sees only its read-only directory, answers on stdout, and a
// backend closed under a sleeping program ends it promptly.
func TestProgram(t *testing.T) {
	b, err := wasm.New(context.Background(), wasm.Config{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := []byte(`import os, sys
print(sorted(os.listdir('/')), sorted(os.listdir('/in')))
try:
    open('/in/x', 'w')
except OSError:
    print('read-only')
sys.stdout.flush()
for line in sys.stdin:
    print(line.strip().upper(), flush=True)
`)
	p, err := b.StartProgram(t.Context(), script, dir)
	if err != nil {
		t.Fatal(err)
	}
	out := bufio.NewReader(p.Stdout())
	for _, want := range []string{"['in', 'lib'] []\n", "read-only\n"} {
		if got, _ := out.ReadString('\n'); got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
	p.Stdin().Write([]byte("hello\n"))
	if got, _ := out.ReadString('\n'); got != "HELLO\n" {
		t.Fatalf("echo: got %q", got)
	}
	p.Close()

	sleeper, err := b.StartProgram(t.Context(), []byte("import time\ntime.sleep(3600)"), dir)
	if err != nil {
		t.Fatal(err)
	}
	_ = sleeper
	done := make(chan struct{})
	go func() { b.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Backend.Close did not end a sleeping program")
	}
}
