package keyedmutex

import (
	"sync"
	"testing"
)

func TestExclusiveAndReleased(t *testing.T) {
	var m Map[int]
	var wg sync.WaitGroup
	counts := make([]int, 8)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				unlock := m.Lock(i % 8)
				c := counts[i%8]
				counts[i%8] = c + 1 // a lost update if two held one key
				unlock()
			}
		}()
	}
	wg.Wait()
	for k, c := range counts {
		if c != 8*200 {
			t.Errorf("key %d: got %d increments, want %d", k, c, 8*200)
		}
	}
	if n := m.Len(); n != 0 {
		t.Errorf("got %d keys left, want 0", n)
	}
}

func TestHeldKeyStays(t *testing.T) {
	var m Map[string]
	unlock := m.Lock("a")
	if n := m.Len(); n != 1 {
		t.Fatalf("got %d keys while held, want 1", n)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Lock("a")()
	}()
	unlock()
	unlock() // a second call does nothing
	<-done
	if n := m.Len(); n != 0 {
		t.Errorf("got %d keys after the last unlock, want 0", n)
	}
}
