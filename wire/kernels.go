package wire

import "time"

// LiveKernel is one live kernel of the caller's tenant, as GET /kernels
// lists it: the run it belongs to, its age and last use, whether it is in
// use, and what its sandbox uses as the backend reports it.
type LiveKernel struct {
	RunID string `json:"run_id"`
	// Tenant is the run's tenant (the operator sees every tenant's).
	Tenant string `json:"tenant,omitempty"`
	// Started is when the kernel became the run's; LastUsed when its
	// last cell or command ended (Started before any).
	Started  time.Time `json:"started"`
	LastUsed time.Time `json:"last_used"`
	// Busy is true while a cell or command runs in it: a busy kernel
	// counts against the kernel quota, an idle one is reclaimed when
	// another run needs its slot.
	Busy bool `json:"busy"`
	// Contexts counts the code contexts live in its sandbox.
	Contexts int `json:"contexts"`
	// CPUSeconds is the processor time its sandbox used since it
	// started, and MemoryBytes the memory it holds now; absent when the
	// backend cannot measure them (Backend says which backend).
	CPUSeconds  *float64 `json:"cpu_seconds,omitempty"`
	MemoryBytes *int64   `json:"memory_bytes,omitempty"`
}

// KernelQuota is the caller's tenant's use of its kernel quota: how many
// kernels are live, how many of them are busy (a cell or command running)
// and how many are starting. Only busy and starting kernels are in use: a
// new kernel at the limit reclaims the least recently used idle one.
type KernelQuota struct {
	// Limit is the most kernels the tenant may have live at once; 0 means
	// no limit.
	Limit    int `json:"limit"`
	Live     int `json:"live"`
	Busy     int `json:"busy"`
	Starting int `json:"starting"`
}

// KernelList is GET /kernels's answer.
type KernelList struct {
	// Backend names the sandbox backend ("docker", "kube", "wasm").
	Backend string       `json:"backend"`
	Kernels []LiveKernel `json:"kernels"`
	Quota   KernelQuota  `json:"quota"`
}

// KernelAction is the answer of an action on a run's live kernel
// (interrupt, restart, stop).
type KernelAction struct {
	OK    bool   `json:"ok"`
	RunID string `json:"run_id"`
	// Interrupted counts the cells the action interrupted.
	Interrupted int `json:"interrupted"`
}
