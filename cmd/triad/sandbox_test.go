package main

import (
	"runtime"
	"testing"
)

// TestKernelStartsDefault checks how many kernels serve lets start at
// once: by default one more than the CPUs on Docker and no limit on wasm
// and kube; an explicit value, 0 included, wins everywhere.
func TestKernelStartsDefault(t *testing.T) {
	parse := func(args ...string) *sandboxConfig {
		t.Helper()
		var c sandboxConfig
		f := newFlagSet("serve")
		c.flags(f)
		if err := f.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := c.validate(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return &c
	}
	for _, tc := range []struct {
		args    []string
		backend string
		want    int
	}{
		{nil, "docker", runtime.NumCPU() + 1},
		{nil, "wasm", 0},
		{nil, "kube", 0},
		{[]string{"--kernel-starts", "0"}, "docker", 0},
		{[]string{"--kernel-starts", "5"}, "docker", 5},
		{[]string{"--kernel-starts", "5"}, "kube", 5},
	} {
		if got := parse(tc.args...).startsFor(tc.backend); got != tc.want {
			t.Errorf("%v on %s: %d kernels may start at once, want %d", tc.args, tc.backend, got, tc.want)
		}
	}
	t.Setenv("TRIAD_KERNEL_STARTS", "0")
	if got := parse().startsFor("docker"); got != 0 {
		t.Errorf("TRIAD_KERNEL_STARTS=0 on docker: %d, want 0 (no limit)", got)
	}
	var c sandboxConfig
	f := newFlagSet("serve")
	c.flags(f)
	if err := f.Parse([]string{"--kernel-starts", "-2"}); err != nil {
		t.Fatal(err)
	}
	if err := c.validate(); err == nil {
		t.Error("--kernel-starts -2 was accepted")
	}
}
