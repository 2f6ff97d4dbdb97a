package kubelease

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/sandbox/kube"
)

// newLock returns a Lock for holder on the test cluster (scripts/kube.sh
// up prints the variables), closed when the test ends.
func newLock(t *testing.T, owner, holder string, cfg Config) *Lock {
	t.Helper()
	kc, ns := os.Getenv("TRIAD_KUBECONFIG"), os.Getenv("TRIAD_KUBE_NAMESPACE")
	if kc == "" || ns == "" {
		testenv.Missing(t, `TRIAD_KUBECONFIG and TRIAD_KUBE_NAMESPACE (eval "$(scripts/kube.sh up)" sets them)`)
	}
	rc, err := kube.RestConfig(kc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Rest, cfg.Namespace, cfg.Owner, cfg.Holder = rc, ns, owner, holder
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l.Close()
		// The test's Leases go with it.
		sel := kube.LabelOwner + "=" + owner
		list, err := l.cs.CoordinationV1().Leases(ns).List(context.Background(), metav1.ListOptions{LabelSelector: sel})
		if err == nil {
			for _, lease := range list.Items {
				_ = l.cs.CoordinationV1().Leases(ns).Delete(context.Background(), lease.Name, metav1.DeleteOptions{})
			}
		}
	})
	return l
}

func testOwner(t *testing.T) string {
	return fmt.Sprintf("lease-%d-%d", os.Getpid()%10000, time.Now().UnixNano()%1e6)
}

// TestTurns: two replicas take turns on a run. The second waits while the
// first holds it (its Lease renewed past its duration), and each finds the
// run stale exactly when the other held it since.
func TestTurns(t *testing.T) {
	owner := testOwner(t)
	cfg := Config{Duration: 3 * time.Second, Wait: time.Minute}
	a, b := newLock(t, owner, "replica-a", cfg), newLock(t, owner, "replica-b", cfg)
	ctx := t.Context()
	run := runid.New()

	ha, err := a.Lock(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	if !ha.Stale() {
		t.Errorf("a's first hold: Stale false, want true (a never held the run)")
	}
	got := make(chan orchestrator.Held, 1)
	go func() {
		hb, err := b.Lock(ctx, run)
		if err != nil {
			t.Error(err)
		}
		got <- hb
	}()
	// Held for three Lease durations: renewals keep b out.
	select {
	case <-got:
		t.Fatal("b took the run while a held it")
	case <-time.After(3 * cfg.Duration):
	}
	ha.Unlock()
	hb := <-got
	if hb == nil {
		t.FailNow()
	}
	if !hb.Stale() {
		t.Errorf("b's hold after a's: Stale false, want true")
	}
	hb.Unlock()
	if !a.Changed(ctx, run) {
		t.Errorf("a.Changed after b held the run: false, want true")
	}
	ha, err = a.Lock(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	if !ha.Stale() {
		t.Errorf("a's hold after b's: Stale false, want true")
	}
	ha.Unlock()
	if a.Changed(ctx, run) {
		t.Errorf("a.Changed right after its own hold: true, want false")
	}
	ha, err = a.Lock(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	if ha.Stale() {
		t.Errorf("a's second hold in a row: Stale true, want false")
	}
	ha.Unlock()
}

// TestWaitBound: a call that waits past Config.Wait fails with kind
// conflict, naming the holder.
func TestWaitBound(t *testing.T) {
	owner := testOwner(t)
	a := newLock(t, owner, "replica-a", Config{Duration: 3 * time.Second})
	b := newLock(t, owner, "replica-b", Config{Duration: 3 * time.Second, Wait: 2 * time.Second})
	run := runid.New()
	ha, err := a.Lock(t.Context(), run)
	if err != nil {
		t.Fatal(err)
	}
	defer ha.Unlock()
	_, err = b.Lock(t.Context(), run)
	fe := fault.As(err)
	if fe == nil || fe.Kind != fault.Conflict || !strings.Contains(fe.Message, "replica-a") || fe.Suggestion == "" {
		t.Fatalf("got %v, want a conflict naming replica-a with a suggestion", err)
	}
}

// TestDeadHolder: a holder that stops renewing mid-call (it died) loses the
// run when its Lease expires, and the next holder finds the run stale, so
// that it reads the run again (and the call the dead one had begun, whose
// record is in the store's records, is recorded as interrupted: see
// orchestrator's TestSharedRunLock).
func TestDeadHolder(t *testing.T) {
	owner := testOwner(t)
	cfg := Config{Duration: 2 * time.Second, Wait: time.Minute}
	a, b := newLock(t, owner, "replica-a", cfg), newLock(t, owner, "replica-b", cfg)
	ctx := t.Context()
	run := runid.New()
	h, err := a.Lock(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	// Death: renewals stop, nothing is released.
	ha := h.(*held)
	close(ha.stop)
	<-ha.done
	t0 := time.Now()
	hb, err := b.Lock(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Unlock()
	if waited := time.Since(t0); waited < cfg.Duration/2 {
		t.Errorf("b took the run after %s, before a's lease could expire", waited)
	}
	if !hb.Stale() {
		t.Errorf("b after a dead holder: Stale false, want true")
	}
}

// TestLocalQueue: twenty calls on one replica and one run get the run one
// at a time.
func TestLocalQueue(t *testing.T) {
	a := newLock(t, testOwner(t), "replica-a", Config{})
	run := runid.New()
	var mu sync.Mutex
	inside, most := 0, 0
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := a.Lock(context.Background(), run)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			inside++
			most = max(most, inside)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
			mu.Lock()
			inside--
			mu.Unlock()
			h.Unlock()
		}()
	}
	wg.Wait()
	if most != 1 {
		t.Errorf("at most %d calls held the run at once, want 1", most)
	}
}
