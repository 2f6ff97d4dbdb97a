package docker

import (
	"bytes"
	_ "embed"
	"encoding/json"
)

// seccompJSON is Triad's seccomp profile for kernel containers: Docker
// 20.10's default profile (testdata/moby-seccomp-default-20.10.24.json)
// minus the syscalls an analysis kernel has no use for and that have been
// the way out of containers (io_uring, ptrace and others; see
// docs/DECISIONS.md, "Triad's seccomp profile"), which fail with EPERM.
// TestSeccompProfile checks it against that derivation and rewrites it
// with -update-seccomp.
//
//go:embed seccomp.json
var seccompJSON []byte

// seccompOpt applies the profile to a container (HostConfig.SecurityOpt):
// the engine takes the profile itself, not a path, and evaluates its
// includes and excludes (capabilities, architecture, kernel version) for
// each container as it does for its own default.
var seccompOpt = func() string {
	var b bytes.Buffer
	if err := json.Compact(&b, seccompJSON); err != nil {
		panic("docker: embedded seccomp.json is not JSON: " + err.Error())
	}
	return "seccomp=" + b.String()
}()
