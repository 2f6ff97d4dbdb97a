package jupyter

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// msgLog is an OnOutput that records what it is handed.
type msgLog struct {
	mu   sync.Mutex
	msgs []Msg
}

func (l *msgLog) add(m Msg) {
	l.mu.Lock()
	l.msgs = append(l.msgs, m)
	l.mu.Unlock()
}

func (l *msgLog) kinds() []MsgKind {
	l.mu.Lock()
	defer l.mu.Unlock()
	var k []MsgKind
	for _, m := range l.msgs {
		k = append(k, m.Kind)
	}
	return k
}

// TestOnOutput checks that a cell's output messages reach OnOutput one by
// one, in order, each decoded, all of them before Done closes, and that
// the Execution then keeps none of the output.
func TestOnOutput(t *testing.T) {
	_, c := startKernel(t, Options{})
	var log msgLog
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ex, err := c.Execute(ctx, `import sys
from IPython.display import clear_output
print('a', flush=True)
print('e', file=sys.stderr, flush=True)
h = display('one', display_id=True)
h.update('two')
clear_output(wait=True)
'value'`, ExecOptions{OnOutput: log.add})
	if err != nil {
		t.Fatal(err)
	}
	out, err := ex.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []MsgKind{MsgStream, MsgStream, MsgDisplay, MsgUpdateDisplay, MsgClear, MsgResult}
	if got := log.kinds(); !slices.Equal(got, want) {
		t.Fatalf("got kinds %v, want %v", got, want)
	}
	m := log.msgs
	if m[0].Stream != "stdout" || m[0].Text != "a\n" || m[1].Stream != "stderr" || m[1].Text != "e\n" {
		t.Errorf("got streams %+v and %+v, want stdout a and stderr e", m[0], m[1])
	}
	if m[2].Display.DisplayID == "" || m[3].Display.DisplayID != m[2].Display.DisplayID {
		t.Errorf("got display ids %q and %q, want the update to name the display", m[2].Display.DisplayID, m[3].Display.DisplayID)
	}
	if s, _ := m[3].Display.Text("text/plain"); s != "'two'" {
		t.Errorf("got update %q, want 'two'", s)
	}
	if !m[4].Wait {
		t.Errorf("got clear_output wait=false, want true")
	}
	if s, _ := m[5].Result.Text("text/plain"); s != "'value'" || m[5].Size() != int64(len(`"'value'"`)) {
		t.Errorf("got result %q of size %d, want 'value' counted as its JSON", s, m[5].Size())
	}
	if out.Stdout != "" || out.Stderr != "" || out.Displays != nil || out.Result != nil {
		t.Errorf("got output kept %+v, want none with OnOutput set", out)
	}
	if out.Status != StatusOK || out.ExecutionCount == 0 || !out.Complete {
		t.Errorf("got status %q count %d complete %v, want the reply's fields", out.Status, out.ExecutionCount, out.Complete)
	}

	// An exception is handed on and kept in Output.Error.
	log = msgLog{}
	ex, err = c.Execute(ctx, "1/0", ExecOptions{OnOutput: log.add})
	if err != nil {
		t.Fatal(err)
	}
	out, err = ex.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := log.kinds(); !slices.Equal(got, []MsgKind{MsgError}) || out.Error == nil || out.Error.Ename != "ZeroDivisionError" {
		t.Errorf("got kinds %v and error %+v, want one MsgError, kept as ZeroDivisionError", got, out.Error)
	}
}

// TestMaxOutput floods past the budget: what is handed on stops within one
// message of it, Over closes, the rest is dropped while the cell goes on,
// and an interrupt ends the cell with the kernel's state kept.
func TestMaxOutput(t *testing.T) {
	_, c := startKernel(t, Options{})
	run(t, c, "x = 21")
	const budget = 1 << 20
	var mu sync.Mutex
	var handed, largest int64
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	// flush=True: without Triad's boot patch (sandbox/docker), ipykernel
	// flushes only from a thread that a print loop starves.
	ex, err := c.Execute(ctx, "while True:\n    print('x' * 1000, flush=True)", ExecOptions{MaxOutput: budget, OnOutput: func(m Msg) {
		mu.Lock()
		handed += m.Size()
		largest = max(largest, m.Size())
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-ex.Over():
	case <-ctx.Done():
		t.Fatal("Over not closed while the cell floods")
	}
	mu.Lock()
	got, last := handed, largest
	mu.Unlock()
	if got < budget || got > budget+last {
		t.Errorf("handed on %d bytes, want at least the %d budget and at most one %d-byte message more", got, budget, last)
	}
	if err := c.Interrupt(ctx); err != nil {
		t.Fatal(err)
	}
	out, err := ex.Wait(ctx)
	if err != nil || out.Error == nil || out.Error.Ename != "KeyboardInterrupt" {
		t.Fatalf("got %+v, %v after the interrupt, want KeyboardInterrupt", out.Error, err)
	}
	mu.Lock()
	after := handed
	mu.Unlock()
	if after != got {
		t.Errorf("handed on %d bytes by the end, want nothing more after Over (%d)", after, got)
	}
	if v, _ := run(t, c, "x").Result.Text("text/plain"); v != "21" {
		t.Errorf("got x = %q after the flood, want 21", v)
	}
}

// TestOnOutputHoldsOneMessage blocks OnOutput on the first message while
// the cell sends 64 MiB more: the client reads nothing behind the blocked
// message, so its heap does not grow with what the kernel sends, and
// everything arrives once OnOutput returns.
func TestOnOutputHoldsOneMessage(t *testing.T) {
	_, c := startKernel(t, Options{})
	const n, size = 64, 1 << 20
	release := make(chan struct{})
	var mu sync.Mutex
	var got int64
	first := make(chan struct{})
	var once sync.Once
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	ex, err := c.Execute(ctx, "import sys\nprint('go', flush=True)\n"+
		"for i in range(64):\n    sys.stdout.write('x' * (1 << 20)); sys.stdout.flush()\n'sent'", ExecOptions{OnOutput: func(m Msg) {
		once.Do(func() { close(first); <-release })
		mu.Lock()
		got += int64(len(m.Text))
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	<-first
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	// The kernel's writes meanwhile fill the socket buffers and then its
	// own queue; give it time to try to send everything.
	time.Sleep(3 * time.Second)
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	if grew := int64(during.HeapAlloc) - int64(before.HeapAlloc); grew > 8<<20 {
		t.Errorf("heap grew %d bytes while OnOutput was blocked, want under 8 MiB (one message is %d)", grew, size)
	}
	close(release)
	out, err := ex.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(n*size + len("go\n")); got != want || out.Status != StatusOK {
		t.Errorf("got %d bytes of stdout and status %q, want %d and ok", got, out.Status, want)
	}
	if strings.Contains(out.Stdout, "x") {
		t.Error("the Execution kept stdout though OnOutput took it")
	}
}
