package sandbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// A wait whose CPU time grows goes on for as many windows as it grows, and
// ends with ErrStalled in the first window it does not; one that ends first
// is not cancelled by the watch.
func TestWhileProgressing(t *testing.T) {
	var samples atomic.Int64
	const growing = 6 // windows with progress before the kernel sticks
	used := func(context.Context) (time.Duration, error) {
		n := samples.Add(1)
		return time.Duration(min(n, growing)) * 2 * MinProgress, nil
	}
	ctx, cancel := whileProgressing(context.Background(), time.Millisecond, time.Millisecond, used)
	defer cancel()
	<-ctx.Done()
	if err := context.Cause(ctx); !errors.Is(err, ErrStalled) {
		t.Fatalf("cause %v, want ErrStalled", err)
	}
	// Samples 1..growing grew; sample growing+1 is the first that did not.
	if n := samples.Load(); n != growing+1 {
		t.Errorf("ended after %d samples, want %d", n, growing+1)
	}

	// A failed sample (the container going away) ends nothing by itself,
	// nor is a gap across it taken for a stall.
	var calls atomic.Int64
	flaky := func(context.Context) (time.Duration, error) {
		n := calls.Add(1)
		if n%2 == 0 {
			return 0, errors.New("no such container")
		}
		return time.Duration(n) * MinProgress, nil
	}
	ctx2, cancel2 := whileProgressing(context.Background(), time.Millisecond, time.Millisecond, flaky)
	for calls.Load() < 40 {
		if ctx2.Err() != nil {
			t.Fatalf("a wait with failing samples ended: %v", context.Cause(ctx2))
		}
		time.Sleep(time.Millisecond)
	}
	cancel2()
	if err := context.Cause(ctx2); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled wait: cause %v, want context.Canceled", err)
	}
}
