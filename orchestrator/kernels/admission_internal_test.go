package kernels

import (
	"context"
	"runtime"
	"testing"
)

// The pool's filler gets a slot only when no run waits and no run's start
// is under way, and every path by which a run gives its slot back (a done
// start, a waiter that gives up after its slot was granted) lets the
// filler in again.
func TestFillerYieldsToRunStarts(t *testing.T) {
	a := newAdmission(2)
	if _, err := a.acquire(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if a.tryAcquire() {
		t.Fatal("the filler got a slot while a run's start was under way")
	}
	a.releaseRun()
	if !a.tryAcquire() {
		t.Fatal("the filler got no slot with every slot free and no run starting")
	}

	// The filler holds one slot, a run the other; a third run waits.
	if _, err := a.acquire(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	got := make(chan error, 1)
	go func() {
		_, err := a.acquire(ctx, nil)
		got <- err
	}()
	for a.waiting() != 1 {
		runtime.Gosched() // until the waiter has queued
	}
	a.release() // the filler's start ends: its slot goes to the waiter
	cancel()    // which may give up at the same moment
	if err := <-got; err == nil {
		a.releaseRun() // it took the slot: its start ends
	}
	if a.tryAcquire() {
		t.Fatal("the filler got a slot while the first run's start was under way")
	}
	a.releaseRun()
	if !a.tryAcquire() {
		t.Fatalf("the filler got no slot after every run gave its slot back (runs %d, free %d)", a.runs, a.free)
	}
}
