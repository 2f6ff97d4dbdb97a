// Package crashpoint lets a test kill the real server at a chosen point, to prove what a crash there leaves behind; it does nothing unless TRIAD_TEST_CRASH is set.
//
// The one point is after-answer: with TRIAD_TEST_CRASH=after-answer:N the
// Nth tool call the orchestrator would record after answering is held (its
// step is never recorded), and the server kills itself with SIGKILL, as
// kill -9 would, right after that call's answer is sent. A test then
// restarts the binary over the same data and reads what is left. Nothing
// reads the variable but this package, and an unset or malformed variable
// arms nothing.
package crashpoint

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// Env is the variable that arms the crash point.
const Env = "TRIAD_TEST_CRASH"

var (
	nth   = parse(os.Getenv(Env))
	calls atomic.Int64
	held  atomic.Bool
)

func parse(v string) int64 {
	n, err := strconv.ParseInt(strings.TrimPrefix(v, "after-answer:"), 10, 64)
	if !strings.HasPrefix(v, "after-answer:") || err != nil || n < 1 {
		return 0
	}
	return n
}

// Armed reports whether the crash point is set.
func Armed() bool { return nth > 0 }

// Hold counts a call whose recording follows its answer, and reports
// whether it is the Nth: its recording must then never run, since the
// process dies once its answer is out (Answered).
func Hold() bool {
	if nth == 0 || calls.Add(1) != nth {
		return false
	}
	held.Store(true)
	return true
}

// Answered is called after a tool call's answer is written to w: once the
// held call has answered, it flushes w and kills the process.
func Answered(w http.ResponseWriter) {
	if !held.Load() {
		return
	}
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught; never return
}
