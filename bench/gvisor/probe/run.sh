#!/usr/bin/env bash
# bench/gvisor/probe/run.sh [RUNTIME...]: where gVisor's time goes, per
# system call. For each runtime (default: runc runsc) it runs syscalls.py
# (the cost of a getppid, a pipe and a socketpair round trip, a stat, a
# thread ping-pong) in the sandbox image, then cell.py (50 `1+1` cells of an
# ipykernel in the container, timed inside it); under runc the kernel's
# system calls are counted with the host's strace (which slows that run:
# its time is not a figure). Needs the Docker engine, runsc registered
# (scripts/gvisor.sh docker) and the sandbox image (go run ./cmd/triad image build).
set -euo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
img=$(docker images --format '{{.Repository}}:{{.Tag}}' | grep '^triad-sandbox:' | head -1)
[ $# -gt 0 ] || set -- runc runsc
for rt in "$@"; do
	echo "$rt syscalls: $(docker run --rm --runtime="$rt" --network=none -v "$dir/syscalls.py:/b.py:ro" "$img" python3 /b.py | tail -1)"
	cid=$(docker run -d --runtime="$rt" --network=none -e HOME=/tmp -v "$dir/cell.py:/kc.py:ro" "$img" python3 /kc.py)
	for _ in $(seq 120); do docker logs "$cid" 2>&1 | grep -q READY && break; sleep 1; done
	out=""
	if [ "$rt" = runc ] && command -v strace >/dev/null; then
		kp=$(docker top "$cid" -eo pid,args | awk '/ipykernel_launcher/ {print $1}' | head -1)
		out=$(mktemp)
		timeout 20 strace -f -c -p "$kp" -o "$out" 2>/dev/null &
	fi
	docker wait "$cid" >/dev/null
	echo "$rt cell: $(docker logs "$cid" 2>&1 | grep 'per cell')"
	docker rm "$cid" >/dev/null
	if [ -n "$out" ]; then
		wait
		echo "$rt kernel system calls for 50 cells (strace -c):"
		head -20 "$out"
		rm -f "$out"
	fi
done
