package wasm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/triadhq/triad/internal/procmem"
	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/sandboxtest"
)

// The tests share one Backend (one compiled module, as in production) and
// start a kernel each. The compilation cache lives in the user's cache dir so
// only the first run pays the multi-second compile.
var (
	sharedOnce sync.Once
	shared     *Backend
	sharedErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		if err := shared.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close shared backend:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func testCacheDir() string {
	if d := os.Getenv("TRIAD_CACHE"); d != "" {
		return filepath.Join(d, "wazero")
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "triad", "wazero")
	}
	return filepath.Join(os.TempDir(), "triad-wazero-cache")
}

func testBackend(t testing.TB) *Backend {
	t.Helper()
	sharedOnce.Do(func() {
		shared, sharedErr = New(context.Background(), Config{CacheDir: testCacheDir()})
	})
	if sharedErr != nil {
		t.Fatalf("New: %v", sharedErr)
	}
	return shared
}

func startKernel(t testing.TB, b *Backend, spec sandbox.Spec) *Kernel {
	t.Helper()
	k, err := b.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = k.Close() })
	return k.(*Kernel)
}

// result is a finished cell: how it ended and what it printed.
type result struct {
	*sandbox.Result
	sandbox.Collector
	delivered int64 // bytes of output delivered
}

// run runs a cell with a timeout that is a backstop, not a deadline on
// speed: TestMemoryLimit's 4 GiB of touched pages ran past a 30 s timeout
// at load 167 in the CI of 98b5def. Tests of the timeout use runTimeout.
func run(t testing.TB, k sandbox.Kernel, code string) *result {
	t.Helper()
	return runTimeout(t, k, code, 10*time.Minute)
}

func runTimeout(t testing.TB, k sandbox.Kernel, code string, timeout time.Duration) *result {
	t.Helper()
	r := &result{}
	res, err := k.Execute(context.Background(), sandbox.Cell{Code: code, Timeout: timeout, Output: func(e sandbox.Event) {
		r.delivered += e.Size()
		r.Add(e)
	}})
	if err != nil {
		t.Fatalf("Execute(%q): %v", code, err)
	}
	r.Result = res
	return r
}

// mustOK runs code and fails the test unless the cell succeeded.
func mustOK(t testing.TB, k sandbox.Kernel, code string) *result {
	t.Helper()
	res := run(t, k, code)
	if !res.OK {
		t.Fatalf("Execute(%q) failed: %+v", code, res.Error)
	}
	return res
}

// plain returns the text/plain value of a result, or "" without one.
func plain(t testing.TB, res *result) string {
	t.Helper()
	if res.Value == nil {
		return ""
	}
	var s string
	if err := json.Unmarshal(res.Value.Data["text/plain"], &s); err != nil {
		t.Fatalf("text/plain of %s: %v", res.Value.Data["text/plain"], err)
	}
	return s
}

// TestConformance runs the sandbox conformance suite: one Backend per test,
// as in production, sharing the compilation cache.
func TestConformance(t *testing.T) {
	sandboxtest.Run(t, sandboxtest.Options{
		New: func(t *testing.T) sandbox.Backend {
			b, err := New(context.Background(), Config{CacheDir: testCacheDir(), WorkRoot: t.TempDir()})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			t.Cleanup(func() { _ = b.Close() })
			return b
		},
		Interrupts: false, // WASI has no signals: a running cell is stopped by closing its instance
		HostDir:    func(k sandbox.Kernel) string { return k.(*Kernel).workDir },
		Contexts:   true,  // a second python.wasm instance on the same working directory
		Commands:   false, // WASI has no processes: commands need the docker backend
	})
}

func TestNameAndInterfaces(t *testing.T) {
	b := testBackend(t)
	if got := b.Name(); got != "wasm" {
		t.Errorf("Name() = %q, want %q", got, "wasm")
	}
	if !strings.Contains(Provenance(), "[outputs]") {
		t.Errorf("Provenance() has no [outputs] section:\n%s", Provenance())
	}
}

func TestCells(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-cells"})
	tests := []struct {
		name       string
		code       string
		wantOK     bool
		wantStdout string
		wantStderr string
		wantValue  string // text/plain; "" means no value
	}{
		{"print reaches stdout", "print('hello', 'world')", true, "hello world\n", "", ""},
		{"stderr is separate", "import sys; print('oops', file=sys.stderr)", true, "", "oops\n", ""},
		{"none is not shown", "None", true, "", "", ""},
		{"semicolon hides the value", "1 + 1;", true, "", "", ""},
		{"value after statements", "a = [1, 2]\na.append(3)\na", true, "", "", "[1, 2, 3]"},
		{"value is repr", "'quoted'", true, "", "", "'quoted'"},
		{"print and value", "print(1)\n2", true, "1\n", "", "2"},
		{"stdlib imports", "import json, csv, sqlite3, statistics, zlib\nstatistics.mean([1, 2, 3, 4])", true, "", "", "2.5"},
		{"sqlite works", "import sqlite3\nc = sqlite3.connect(':memory:')\nc.execute('create table t(v)')\nc.executemany('insert into t values (?)', [(1,), (2,)])\nc.execute('select sum(v) from t').fetchone()[0]", true, "", "", "3"},
		{"zlib round trip", "import zlib; zlib.decompress(zlib.compress(b'abc' * 100)) == b'abc' * 100", true, "", "", "True"},
		{"hashlib", "import hashlib; hashlib.sha256(b'').hexdigest()[:12]", true, "", "", "'e3b0c44298fc'"},
		{"generators and closures", "def g(n):\n    yield from range(n)\nsum(g(5))", true, "", "", "10"},
		{"utf-8 both ways", "print('héllo ✓'); 'ünïcode'", true, "héllo ✓\n", "", "'ünïcode'"},
		{"input gets EOF", "input()", false, "", "", ""},
		{"system exit is an error, not a death", "raise SystemExit(3)", false, "", "", ""},
	}
	for _, tt := range tests {
		res := run(t, k, tt.code)
		if res.OK != tt.wantOK {
			t.Errorf("%s: OK = %v, want %v (error %+v)", tt.name, res.OK, tt.wantOK, res.Error)
			continue
		}
		if got := res.Stdout.String(); got != tt.wantStdout {
			t.Errorf("%s: stdout = %q, want %q", tt.name, got, tt.wantStdout)
		}
		if got := res.Stderr.String(); got != tt.wantStderr {
			t.Errorf("%s: stderr = %q, want %q", tt.name, got, tt.wantStderr)
		}
		if got := plain(t, res); got != tt.wantValue {
			t.Errorf("%s: value = %q, want %q", tt.name, got, tt.wantValue)
		}
		if !tt.wantOK && (res.Error == nil || res.Error.Kind != sandbox.KindExecution || res.Restarted) {
			t.Errorf("%s: error = %+v, restarted %v; want an execution_error without restart", tt.name, res.Error, res.Restarted)
		}
	}
}

func TestError(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-err"})

	res := run(t, k, "1/0")
	if res.OK || res.Error == nil {
		t.Fatalf("1/0: OK = %v, Error = %v; want a failure", res.OK, res.Error)
	}
	want := &sandbox.ExecError{
		Kind:   sandbox.KindExecution,
		Ename:  "ZeroDivisionError",
		Evalue: "division by zero",
		Traceback: []string{
			strings.Repeat("-", 75),
			"ZeroDivisionError                         Traceback (most recent call last)",
			"Cell In[1], line 1\n----> 1 1/0\n",
			"ZeroDivisionError: division by zero",
		},
	}
	if diff := cmp.Diff(want, res.Error); diff != "" {
		t.Errorf("1/0 error (-want +got):\n%s", diff)
	}

	// A frame in a function shows the function and context lines, and no
	// driver frame leaks into the traceback.
	res = run(t, k, "def f(a, b):\n    return a / b\n\nf(1, 0)")
	tb := strings.Join(res.Error.Traceback, "\n")
	for _, want := range []string{"Cell In[2], line 4", "Cell In[2], line 2, in f(a, b)", "----> 2     return a / b"} {
		if !strings.Contains(tb, want) {
			t.Errorf("traceback lacks %q:\n%s", want, tb)
		}
	}
	if strings.Contains(tb, "triad") || strings.Contains(tb, "<string>") {
		t.Errorf("traceback shows driver frames:\n%s", tb)
	}

	// Syntax errors point at the cell.
	res = run(t, k, "1 +")
	if res.Error == nil || res.Error.Ename != "SyntaxError" {
		t.Fatalf("1 +: error = %+v, want SyntaxError", res.Error)
	}
	if !strings.Contains(res.Error.Traceback[0], "Cell In[3], line 1") {
		t.Errorf("SyntaxError traceback = %q, want it to name Cell In[3]", res.Error.Traceback)
	}

	// Deep recursion is an exception, not a crash, and its traceback is
	// folded.
	res = run(t, k, "def r(n):\n    return r(n + 1)\nr(0)")
	if res.Error == nil || res.Error.Ename != "RecursionError" || res.Restarted {
		t.Fatalf("recursion: error = %+v, restarted %v; want RecursionError", res.Error, res.Restarted)
	}
	if n := len(res.Error.Traceback); n > 10 || !strings.Contains(strings.Join(res.Error.Traceback, "\n"), "skipping similar frames") {
		t.Errorf("recursion traceback has %d entries, want a folded one:\n%s", n, strings.Join(res.Error.Traceback, "\n"))
	}

	// Chained exceptions show both.
	res = run(t, k, "try:\n    {}['k']\nexcept KeyError as e:\n    raise ValueError('bad') from e")
	tb = strings.Join(res.Error.Traceback, "\n")
	if res.Error.Ename != "ValueError" || !strings.Contains(tb, "KeyError: 'k'") || !strings.Contains(tb, "direct cause") {
		t.Errorf("chained: ename %q, traceback:\n%s", res.Error.Ename, tb)
	}

	// The kernel is fine afterwards.
	if got := plain(t, mustOK(t, k, "'still here'")); got != "'still here'" {
		t.Errorf("after errors: %q", got)
	}
}

// TestStdlib checks what docs/sandboxes.md promises about the standard library.
func TestStdlib(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-stdlib"})
	works := []string{"json", "csv", "sqlite3", "statistics", "decimal", "fractions", "datetime", "re",
		"zlib", "gzip", "zipfile", "tarfile", "hashlib", "pickle", "struct", "xml.etree.ElementTree",
		"email", "html", "textwrap", "difflib", "itertools", "collections", "math", "random", "uuid",
		"base64", "io", "pathlib", "functools", "dataclasses", "typing", "string", "copy", "pprint"}
	code := "import importlib\nbad = []\nfor m in " + pyList(works) +
		":\n    try:\n        importlib.import_module(m)\n    except Exception as e:\n        bad.append((m, repr(e)))\nbad"
	if got := plain(t, mustOK(t, k, code)); got != "[]" {
		t.Errorf("modules that fail to import: %s", got)
	}
	missing := []string{"ssl", "_hashlib", "bz2", "lzma", "ctypes", "mmap", "readline"}
	code = "import importlib\nthere = []\nfor m in " + pyList(missing) +
		":\n    try:\n        importlib.import_module(m)\n        there.append(m)\n    except ImportError:\n        pass\nthere"
	if got := plain(t, mustOK(t, k, code)); got != "[]" {
		t.Errorf("modules the docs call missing import fine: %s", got)
	}
	// A few real uses, not just imports.
	res := mustOK(t, k, `import hashlib, gzip, decimal, datetime, random, pathlib
(hashlib.md5(b'a').hexdigest()[:6], hashlib.sha3_256(b'').hexdigest()[:6], hashlib.blake2b(b'').hexdigest()[:6],
 gzip.decompress(gzip.compress(b'z')), str(decimal.Decimal('0.1') + decimal.Decimal('0.2')),
 datetime.date(2024, 2, 29).isoformat(), 0 <= random.random() < 1, pathlib.Path('p.txt').write_text('p'))`)
	if got, want := plain(t, res), "('0cc175', 'a7ffc6', '786a02', b'z', '0.3', '2024-02-29', True, 1)"; got != want {
		t.Errorf("stdlib uses = %s, want %s", got, want)
	}
}

func pyList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = strconv.Quote(x)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func TestDisplay(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-display"})
	res := mustOK(t, k, `
class Rich:
    def __repr__(self): return 'Rich()'
    def _repr_html_(self): return '<b>rich</b>'
    def _repr_png_(self): return b'\x89PNG'
display(Rich(), 7)
Rich()`)
	want := []sandbox.Bundle{
		{Data: map[string]json.RawMessage{
			"text/plain": json.RawMessage(`"Rich()"`),
			"text/html":  json.RawMessage(`"<b>rich</b>"`),
			"image/png":  json.RawMessage(`"iVBORw=="`),
		}, Metadata: map[string]json.RawMessage{}},
		{Data: map[string]json.RawMessage{"text/plain": json.RawMessage(`"7"`)}, Metadata: map[string]json.RawMessage{}},
	}
	if diff := cmp.Diff(want, res.Display); diff != "" {
		t.Errorf("display bundles (-want +got):\n%s", diff)
	}
	if res.Value == nil || string(res.Value.Data["text/html"]) != `"<b>rich</b>"` {
		t.Errorf("value = %+v, want a text/html bundle", res.Value)
	}
}

func TestFiles(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-files"})

	info, err := os.Stat(k.workDir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		t.Errorf("WorkDir mode = %v, want no group/other access", perm)
	}
	if entries, _ := os.ReadDir(k.workDir); len(entries) != 0 {
		t.Errorf("new WorkDir holds %d entries, want none", len(entries))
	}

	// A cell writes out.csv (relative: the cwd is /work); the host sees it.
	mustOK(t, k, "import csv, os\nassert os.getcwd() == '/work'\nwith open('out.csv', 'w', newline='') as f:\n    csv.writer(f).writerows([['a', 'b'], [1, 2]])")
	got, err := os.ReadFile(filepath.Join(k.workDir, "out.csv"))
	if err != nil {
		t.Fatalf("out.csv on the host: %v", err)
	}
	if string(got) != "a,b\r\n1,2\r\n" {
		t.Errorf("out.csv = %q, want %q", got, "a,b\r\n1,2\r\n")
	}

	// A file the host places (files_in) opens in the next cell, by relative
	// and absolute path, and in a subdirectory.
	if err := os.MkdirAll(filepath.Join(k.workDir, "in"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(k.workDir, "in", "data.txt"), []byte("from the host\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	res := mustOK(t, k, "open('in/data.txt').read() + open('/work/in/data.txt').read()")
	if got := plain(t, res); got != `'from the host\nfrom the host\n'` {
		t.Errorf("reading the host's file = %s", got)
	}

	// No bytecode caches appear next to a user module.
	if err := os.WriteFile(filepath.Join(k.workDir, "helper.py"), []byte("def f():\n    return 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := plain(t, mustOK(t, k, "import helper; helper.f()")); got != "5" {
		t.Errorf("helper.f() = %q, want 5", got)
	}
	if _, err := os.Stat(filepath.Join(k.workDir, "__pycache__")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("__pycache__ in WorkDir: %v", err)
	}
}

func TestJail(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-jail"})
	// Each refusal must be an OSError raised by the attempt; the cell
	// reports the exception's class name, or None if the attempt worked.
	refusals := []struct {
		name string
		code string
		want string
	}{
		{"socket connect fails", "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 80))", "OSError"},
		{"host /etc/passwd is absent", "open('/etc/passwd')", "FileNotFoundError"},
		{"dot-dot out of /work is refused", "open('/work/../../etc/passwd')", "PermissionError"},
		{"relative dot-dot is refused", "open('../../../../etc/passwd')", "PermissionError"},
		{"symlinks cannot be made", "import os; os.symlink('../../../etc/passwd', 'link')", "PermissionError"},
		{"stdlib is read-only", "open('/lib/python311.zip', 'ab')", "OSError"},
		{"root is read-only", "open('/new-file', 'w')", "OSError"},
		{"no subprocesses", "import subprocess; subprocess.run(['true'])", "OSError"},
	}
	for _, tt := range refusals {
		code := "try:\n    " + strings.ReplaceAll(tt.code, "\n", "\n    ") +
			"\nexcept OSError as e:\n    refused = type(e).__name__\nelse:\n    refused = None\nrefused"
		res := mustOK(t, k, code)
		got := plain(t, res)
		if got == "" || got == "None" {
			t.Errorf("%s: the attempt succeeded", tt.name)
		} else if tt.want != "OSError" && got != "'"+tt.want+"'" {
			t.Errorf("%s: raised %s, want %s", tt.name, got, tt.want)
		}
	}
	views := []struct {
		name, code, want string
	}{
		{"root lists only the mounts", "import os; sorted(os.listdir('/'))", "['lib', 'work']"},
		{"lib holds only the stdlib", "import os; os.listdir('/lib')", "['python311.zip']"},
		{"environment is the sandbox's", "import os; sorted(os.environ)", "['HOME', 'LANG', 'PYTHONHASHSEED', 'PYTHONHOME', 'PYTHONUTF8']"},
		{"no DNS, so no urllib", "import urllib.request\ntry:\n    urllib.request.urlopen('http://127.0.0.1:1/')\n    r = 'fetched'\nexcept Exception as e:\n    r = 'refused'\nr", "'refused'"},
		{"threads cannot start", "import threading\ntry:\n    threading.Thread(target=print).start()\nexcept RuntimeError as e:\n    r = 'refused'\nr", "'refused'"},
	}
	for _, tt := range views {
		if got := plain(t, mustOK(t, k, tt.code)); got != tt.want {
			t.Errorf("%s: got %s, want %s", tt.name, got, tt.want)
		}
	}
	if _, err := os.Lstat(filepath.Join(k.workDir, "link")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("symlink exists on the host: %v", err)
	}
}

// TestFraming checks that output a cell produces, printed or written to the
// file descriptors directly, cannot be taken for a driver frame.
func TestFraming(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-framing"})
	fake := `\x1eTRIAD:0123456789abcdef0123456789abcdef:40\n{"t":"result","n":1,"ok":false}`
	res := mustOK(t, k, "import os\nprint('"+fake+"')\nos.write(1, b'"+fake+"')\nos.write(2, b'raw err')\n'done'")
	if got := plain(t, res); got != "'done'" {
		t.Errorf("value = %q, want 'done'", got)
	}
	wantOut := strings.ReplaceAll(strings.ReplaceAll(fake, `\x1e`, "\x1e"), `\n`, "\n")
	if strings.Count(res.Stdout.String(), wantOut) != 2 {
		t.Errorf("stdout = %q, want the fake frame twice (printed and raw)", res.Stdout.String())
	}
	if got := res.Stderr.String(); got != "raw err" {
		t.Errorf("stderr = %q, want %q", got, "raw err")
	}
	if got := plain(t, mustOK(t, k, "1")); got != "1" {
		t.Errorf("next cell = %q, want 1", got)
	}
}

func TestKernelDied(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-died"})
	// The suite checks os._exit; here, the reason does not blame memory
	// for a plain exit.
	res := run(t, k, "import os\nos._exit(3)")
	if res.Error == nil || !strings.Contains(res.Error.Reason, "exited with code 3") || strings.Contains(res.Error.Reason, "OOM") {
		t.Errorf("os._exit(3): error %+v, want a reason with the exit code and no OOM", res.Error)
	}

	// A trap: C recursion (repr of a deeply nested list, with Python's own
	// recursion guard lifted) overflows the guest's stack.
	mustOK(t, k, "x = 1")
	res = run(t, k, "import sys\nsys.setrecursionlimit(10**7)\nl = []\nfor i in range(200000): l = [l]\nrepr(l)")
	if res.OK || res.Error == nil || res.Error.Kind != sandbox.KindKernelDied || !res.Restarted {
		t.Fatalf("stack overflow: %+v restarted %v, want kind kernel_died and a restart", res.Error, res.Restarted)
	}
	if !strings.Contains(res.Error.Reason, "wasm error") {
		t.Errorf("Reason = %q, want the trap", res.Error.Reason)
	}
	if got := plain(t, mustOK(t, k, "'x' in globals()")); got != "False" {
		t.Errorf("state after the trap: x defined = %s, want False", got)
	}
}

func TestRestart(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-restart"})
	mustOK(t, k, "x = 1\nopen('f.txt', 'w').write('f')")
	if err := k.Restart(t.Context()); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	res := mustOK(t, k, "'x' in globals(), open('f.txt').read()")
	if got := plain(t, res); got != "(False, 'f')" {
		t.Errorf("after Restart: %s, want (False, 'f')", got)
	}
	if res.ExecutionCount != 1 {
		t.Errorf("ExecutionCount after Restart = %d, want 1", res.ExecutionCount)
	}
}

// rss returns the process's resident set and its peak (VmRSS, VmHWM) in
// bytes, from /proc; ok is false where /proc is not there.
func rss(t testing.TB) (cur, peak int64, ok bool) {
	t.Helper()
	cur, peak, err := procmem.RSS(0)
	return cur, peak, err == nil
}

// resetPeakRSS makes VmHWM start again from the current RSS (Linux >= 4.0),
// so a peak measured later belongs to this test.
func resetPeakRSS() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// TestMemoryLimit allocates 4 GiB in a kernel capped at the default 1 GiB.
// It is not parallel: it measures the process's RSS.
func TestMemoryLimit(t *testing.T) {
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-oom"})
	runtime.GC()
	before, _, haveRSS := rss(t)
	peakReset := resetPeakRSS()

	// 16 x 256 MiB, each touched, so the pages are really committed.
	res := run(t, k, "chunks = []\nfor i in range(16):\n    b = bytearray(256 << 20)\n    b[::4096] = b'x' * len(b[::4096])\n    chunks.append(b)")
	if res.OK {
		t.Fatal("allocating 4 GiB succeeded under a 1 GiB limit")
	}
	switch res.Error.Kind {
	case sandbox.KindExecution:
		if res.Error.Ename != "MemoryError" {
			t.Fatalf("ename = %q (%s), want MemoryError", res.Error.Ename, res.Error.Evalue)
		}
	case sandbox.KindKernelDied:
		if !res.Restarted {
			t.Error("kernel died but was not restarted")
		}
	default:
		t.Fatalf("error %+v, want MemoryError or kernel_died", res.Error)
	}
	if haveRSS {
		after, peak, _ := rss(t)
		if !peakReset {
			peak = after
		}
		growth := max(after, peak) - before
		t.Logf("RSS before %d MiB, after %d MiB, peak %d MiB, linear memory %d MiB",
			before>>20, after>>20, peak>>20, k.MemoryBytes()>>20)
		if growth > 3<<29 {
			t.Errorf("RSS grew by %d MiB, want < 1536 MiB", growth>>20)
		}
	}
	// The kernel still works; a Restart gives the memory back.
	if got := plain(t, mustOK(t, k, "del chunks\n1 + 1")); got != "2" && res.Error.Kind == sandbox.KindExecution {
		t.Errorf("after MemoryError: %q", got)
	}
	if err := k.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := k.MemoryBytes(); got > 256<<20 {
		t.Errorf("linear memory after Restart = %d MiB, want a fresh interpreter's", got>>20)
	}
}

func TestSpecMemoryLimit(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-small", Limits: sandbox.Limits{MemoryBytes: 64 << 20}})
	if got := k.MemoryLimit(); got != 64<<20 {
		t.Errorf("MemoryLimit() = %d, want %d", got, 64<<20)
	}
	res := run(t, k, "b = bytearray(100 << 20)")
	if res.OK || res.Error.Ename != "MemoryError" {
		t.Fatalf("100 MiB under a 64 MiB limit: %+v, want MemoryError", res.Error)
	}
	mustOK(t, k, "b = bytearray(16 << 20)")
}

func TestDiskQuota(t *testing.T) {
	t.Parallel()
	k := startKernel(t, testBackend(t), sandbox.Spec{Owner: "run-quota", Limits: sandbox.Limits{DiskBytes: 1 << 20}})
	write := func(name string, kib int) string {
		return fmt.Sprintf("try:\n    with open(%q, 'wb') as f:\n        f.write(b'x' * (%d << 10))\n    r = 'ok'\nexcept OSError as e:\n    r = type(e).__name__\nr", name, kib)
	}
	if got := plain(t, mustOK(t, k, write("a.bin", 600))); got != "'ok'" {
		t.Fatalf("600 KiB under a 1 MiB quota: %s", got)
	}
	res := mustOK(t, k, write("b.bin", 600))
	if got := plain(t, res); got != "'OSError'" {
		t.Errorf("another 600 KiB: %s, want OSError", got)
	}
	if !strings.Contains(res.Stderr.String(), "disk quota of 1 MiB") {
		t.Errorf("stderr = %q, want a note about the quota", res.Stderr.String())
	}
	// Deleting frees the space again (the next refusal re-measures).
	if got := plain(t, mustOK(t, k, "import os; os.remove('a.bin')\n"+write("b.bin", 600))); got != "'ok'" {
		t.Errorf("600 KiB after deleting a.bin: %s", got)
	}
	// Files the host placed count too.
	if err := os.WriteFile(filepath.Join(k.workDir, "host.bin"), make([]byte, 400<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := plain(t, mustOK(t, k, write("c.bin", 100))); got != "'OSError'" {
		t.Errorf("100 KiB with 1000 KiB used: %s, want OSError", got)
	}
}

// TestClose checks what the suite cannot see: a working directory carries
// its owner in its name and is removed by Close, also when the backend
// closes a kernel in the middle of a cell.
func TestClose(t *testing.T) {
	t.Parallel()
	b, err := New(t.Context(), Config{CacheDir: testCacheDir(), WorkRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	k1 := startKernel(t, b, sandbox.Spec{Owner: "run-close-1"})
	k2 := startKernel(t, b, sandbox.Spec{Owner: "run-close-2"})
	if !strings.HasPrefix(filepath.Base(k1.workDir), "wk-run-close-1-") {
		t.Errorf("working directory %s does not carry the owner", k1.workDir)
	}
	if err := k1.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := os.Stat(k1.workDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("working directory after Close: %v, want it gone", err)
	}
	done := make(chan error, 1)
	running := make(chan struct{}, 1)
	go func() {
		_, err := k2.Execute(context.Background(), sandbox.Cell{Code: "print('go', flush=True)\nwhile True: pass", Timeout: time.Hour,
			Output: func(sandbox.Event) { running <- struct{}{} }})
		done <- err
	}()
	<-running
	if err := b.Close(); err != nil {
		t.Fatalf("Backend Close: %v", err)
	}
	if err := <-done; !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("a cell running at Backend Close: %v, want ErrClosed", err)
	}
	if _, err := os.Stat(k2.workDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("k2's working directory after Backend Close: %v, want it gone", err)
	}
}

func TestWorkRootLockAndLeftovers(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	// Leftovers of an earlier process, and a file that is not ours.
	for _, d := range []string{"wk-run-old-123", "wk-kernel-456"} {
		if err := os.MkdirAll(filepath.Join(root, d, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "notes.txt"), []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := New(t.Context(), Config{CacheDir: testCacheDir(), WorkRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	entries, _ := os.ReadDir(root)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff([]string{".lock", "notes.txt"}, names); diff != "" {
		t.Errorf("work root after New (-want +got):\n%s", diff)
	}
	if runtime.GOOS != "windows" {
		if _, err := New(t.Context(), Config{CacheDir: testCacheDir(), WorkRoot: root}); err == nil {
			t.Error("a second Backend on the same WorkRoot started; want it refused")
		}
	}
}

func TestEmbeddedFilesMatchProvenance(t *testing.T) {
	sums := map[string]string{}
	inOutputs := false
	for _, line := range strings.Split(Provenance(), "\n") {
		if strings.HasPrefix(line, "[") {
			inOutputs = line == "[outputs]"
			continue
		}
		if f := strings.Fields(line); inOutputs && len(f) == 2 {
			sums[f[1]] = f[0]
		}
	}
	zip, err := stdlibFS.ReadFile("python/lib/python311.zip")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{"python.wasm": sha256hex(pythonWasm), "lib/python311.zip": sha256hex(zip)}
	if diff := cmp.Diff(sums, got); diff != "" {
		t.Errorf("embedded files vs PROVENANCE (-provenance +embedded):\n%s", diff)
	}
}

func sha256hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
