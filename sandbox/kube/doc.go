// Package kube runs sandbox kernels as Kubernetes pods, one pod per run, reached only through the API server's streams.
//
// Each kernel is a pod from the sandbox image in a namespace that enforces
// the restricted Pod Security Standard: non-root (a uid of its own, so that
// ulimit -u bounds the pod's processes), a read-only root filesystem, no
// capabilities, seccomp RuntimeDefault, no ServiceAccount token, no
// service links, CPU and memory limits, an emptyDir working directory with
// a sizeLimit, a memory-backed /tmp, an optional RuntimeClass (gVisor), and
// a deny-all NetworkPolicy that New makes sure exists. The pod has two
// containers: "kernel" runs ipykernel on 127.0.0.1; "agent" sleeps, so that
// the working directory stays readable after the kernel dies.
//
// Triad reaches a kernel only through the API server: the Jupyter client's
// five sockets are streams of one port-forward connection, and the working
// directory is a sandbox.WorkDir spoken over a long-lived exec session into
// the agent container, whose program (agent.py) Triad ships over stdin.
// Nothing in the pod listens on the pod network.
//
// Pods carry labels naming the deployment (owner), the replica that made
// them (instance), their state (warm or run) and their run, so any replica
// adopts a run's live pod with its interpreter state intact, claims warm
// pods from a pool shared by all replicas (a relabel with a
// resourceVersion precondition, which one replica wins), and sweeps pods
// nobody will use. A kernel's death is read from the pod's status
// (OOMKilled, the exit code, an eviction for exceeding the working
// directory's size), and a restart moves the kernel to a fresh pod with its
// files. See docs/DECISIONS.md, "Kubernetes".
//
// The files follow those concerns: backend.go opens, starts and closes;
// config.go is Config; pod.go is the pod's spec and how its status reads;
// watch.go follows pods through the informer; claim.go creates, claims
// and deletes them; pool.go is this replica's part of the warm pool
// (sandbox.Pool); replicas.go is the instance Leases that say which
// replicas live; sweep.go deletes what none will use; network.go is the
// deny-all NetworkPolicy; kernel.go, execute.go, command.go, forward.go,
// agent.go and workdir.go are one kernel: its pod connection, cells,
// commands (pods/exec into the kernel container, under
// sandbox/internal/supervisor), the Jupyter port-forward, and its working
// directory through the agent.
package kube
