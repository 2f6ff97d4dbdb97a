package docker

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"slices"
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

// SeccompOCI returns Triad's profile as an OCI runtime spec's
// linux.seccomp, resolved the way Docker resolves its own format for a
// container with no capabilities on goarch (Go's name: "amd64"): rules
// that need a capability go, rules for other architectures go, and the
// native architecture and its sub-architectures are listed. This is the
// form containerd reads for a Kubernetes Localhost profile: it parses the
// file straight into the spec, so Docker's includes and excludes would be
// ignored there, and the rule that allows unshare, mount and setns to
// CAP_SYS_ADMIN would apply to every pod. See docs/DECISIONS.md, "Triad's
// seccomp profile on Kubernetes".
func SeccompOCI(goarch string) ([]byte, error) {
	var p struct {
		DefaultAction   string `json:"defaultAction"`
		DefaultErrnoRet *uint  `json:"defaultErrnoRet,omitempty"`
		ArchMap         []struct {
			Architecture     string   `json:"architecture"`
			SubArchitectures []string `json:"subArchitectures"`
		} `json:"archMap"`
		Syscalls []struct {
			Names    []string          `json:"names"`
			Action   string            `json:"action"`
			ErrnoRet *uint             `json:"errnoRet,omitempty"`
			Args     []json.RawMessage `json:"args"`
			Includes seccompFilter     `json:"includes"`
			Excludes seccompFilter     `json:"excludes"`
		} `json:"syscalls"`
	}
	if err := json.Unmarshal(seccompJSON, &p); err != nil {
		return nil, err
	}
	type ociRule struct {
		Names    []string          `json:"names"`
		Action   string            `json:"action"`
		ErrnoRet *uint             `json:"errnoRet,omitempty"`
		Args     []json.RawMessage `json:"args,omitempty"`
	}
	out := struct {
		DefaultAction   string    `json:"defaultAction"`
		DefaultErrnoRet *uint     `json:"defaultErrnoRet,omitempty"`
		Architectures   []string  `json:"architectures"`
		Syscalls        []ociRule `json:"syscalls"`
	}{DefaultAction: p.DefaultAction, DefaultErrnoRet: p.DefaultErrnoRet}
	native, ok := seccompArch[goarch]
	if !ok {
		return nil, fmt.Errorf("seccomp: no architecture for GOARCH %q", goarch)
	}
	for _, a := range p.ArchMap {
		if a.Architecture == native {
			out.Architectures = append([]string{a.Architecture}, a.SubArchitectures...)
		}
	}
	if out.Architectures == nil {
		return nil, fmt.Errorf("seccomp: the profile's archMap has no %s", native)
	}
	for _, r := range p.Syscalls {
		// No capabilities: a rule that needs one never applies, and one
		// that excludes one always may.
		if len(r.Includes.Caps) > 0 || r.Includes.MinKernel != "" || r.Excludes.MinKernel != "" {
			continue
		}
		if len(r.Includes.Arches) > 0 && !slices.Contains(r.Includes.Arches, goarch) {
			continue
		}
		if slices.Contains(r.Excludes.Arches, goarch) {
			continue
		}
		out.Syscalls = append(out.Syscalls, ociRule{Names: r.Names, Action: r.Action, ErrnoRet: r.ErrnoRet, Args: r.Args})
	}
	return json.MarshalIndent(out, "", "  ")
}

// seccompFilter is a rule's includes or excludes in Docker's format.
type seccompFilter struct {
	Caps      []string `json:"caps"`
	Arches    []string `json:"arches"`
	MinKernel string   `json:"minKernel"`
}

// seccompArch maps Go's architecture names to libseccomp's.
var seccompArch = map[string]string{"amd64": "SCMP_ARCH_X86_64", "arm64": "SCMP_ARCH_AARCH64", "s390x": "SCMP_ARCH_S390X"}
