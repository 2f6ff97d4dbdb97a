// Package docker runs sandbox kernels as ipykernel processes in jailed Docker containers, one container per kernel.
//
// Each kernel is one container from the sandbox image (see sandbox/image)
// with no network, no capabilities, a read-only root filesystem, a non-root
// uid, pids/memory/CPU limits, a size-capped /tmp and one writable working
// directory (a loop-mounted ext4 image sized to the disk quota) at /work. The
// host speaks the Jupyter protocol to the kernel over ZMQ ipc sockets in a
// bind-mounted directory (sandbox/jupyter). Containers carry labels naming
// the backend's WorkRoot, so a process restarted after a crash removes what
// its predecessor left behind.
package docker
