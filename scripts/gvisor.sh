#!/usr/bin/env bash
# scripts/gvisor.sh builds gVisor's runsc and its containerd shim at the
# pinned version and registers runsc with the Docker engine, so that
# kernels run on a second kernel (gVisor's Sentry) instead of the host's.
#
#   scripts/gvisor.sh install   build runsc and containerd-shim-runsc-v1 once
#                               (cached) and print the directory holding them
#   scripts/gvisor.sh docker    install, then register the runtime "runsc" with
#                               the Docker engine (daemon.json + SIGHUP; the
#                               default runtime is never changed); print its name
#   scripts/gvisor.sh variant NAME FLAG...
#                               register the same runsc again as NAME with
#                               these flags instead (for measuring where the
#                               time goes: go run ./bench/gvisor -variant NAME)
#   scripts/gvisor.sh version   print the pinned version
#
# The binaries are built from the Go module proxy (static: CGO_ENABLED=0, or
# runsc cannot re-execute itself in its chroot) and cached outside the
# clone, keyed by version and build recipe, under
# ${TRIAD_CACHE:-$HOME/.cache/triad}/gvisor. See docs/DECISIONS.md, "gVisor",
# for the pin, how to move it, and the runtime's flags.
#
# Everything meant for the caller goes to stdout; progress goes to stderr.
set -euo pipefail

# The pin. To move it: pick a commit of gVisor's `go` branch, take its
# pseudo-version from `go list -m gvisor.dev/gvisor@<commit>`, set it here
# and run the kube and Docker suites under runsc (docs/DECISIONS.md, "gVisor").
GVISOR_MODULE=gvisor.dev/gvisor
GVISOR_VERSION=v0.0.0-20260905035102-160fafc42237
# The build recipe: change the flags or binary list below and bump it. The
# patches in scripts/gvisor/ are part of the key.
RECIPE="triad-gvisor-build/3 cgo=0 trimpath ldflags=-s,-w,version-x bins=runsc,containerd-shim-runsc-v1 patches=scripts/gvisor"

# The runtime as Docker runs it (docs/DECISIONS.md, "gVisor"):
#   systrap         the platform: no KVM in these VMs, and ptrace is slower;
#   network=none    kernels have no network at all (they run with network
#                   mode none as well);
#   host-uds=create a kernel may create unix sockets in its bind-mounted
#                   directory that the host connects to (the Jupyter
#                   sockets), and can connect to no host socket;
#   oci-seccomp     apply Triad's seccomp profile inside the sandbox as well,
#                   so every rule that holds under runc holds here too.
RUNTIME_NAME=runsc
RUNTIME_ARGS=(--platform=systrap --network=none --host-uds=create --oci-seccomp)

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${TRIAD_CACHE:-$HOME/.cache/triad}/gvisor
PATCHES=$REPO/scripts/gvisor
key() { { printf '%s\n%s\n' "$GVISOR_VERSION" "$RECIPE"; cat "$PATCHES"/*.patch; } | sha256sum | cut -c1-12; }
DIR=$CACHE/$GVISOR_VERSION-$(key)
BIN=$DIR/bin

log() { echo "gvisor.sh: $*" >&2; }
die() { log "$*"; exit 1; }
sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

with_lock() {
	local f=$1
	shift
	mkdir -p "$(dirname "$f")"
	(
		flock 9
		"$@"
	) 9>"$f"
}

cached() { [ -x "$BIN/runsc" ] && [ -x "$BIN/containerd-shim-runsc-v1" ]; }

cmd_install() {
	cached || with_lock "$CACHE/build.lock" build
	echo "$BIN"
}

build() {
	cached && return # built by another process while we waited
	command -v go >/dev/null || die "go is not on PATH; it is needed to build gVisor"
	local mod=$CACHE/build/$GVISOR_VERSION tmp t0=$SECONDS
	rm -rf "$mod"
	mkdir -p "$mod" "$DIR"
	tmp=$(mktemp -d "$DIR/.bin.XXXXXX")
	export GOWORK=off GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
	# gVisor's source at the pin, with Triad's patches (scripts/gvisor/*.patch;
	# docs/DECISIONS.md, "gVisor", says why each exists), built through a
	# scratch module that replaces the module with the patched copy, so both
	# binaries come from one resolved dependency set.
	log "patching $GVISOR_MODULE@$GVISOR_VERSION with $(cd "$PATCHES" && echo *.patch)"
	local src
	src=$( (cd "$mod" && go mod download -json "$GVISOR_MODULE@$GVISOR_VERSION") | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[ -d "$src" ] || die "go mod download $GVISOR_MODULE@$GVISOR_VERSION gave no source directory"
	cp -r "$src" "$mod/gvisor"
	chmod -R u+w "$mod/gvisor"
	local p
	for p in "$PATCHES"/*.patch; do
		patch -s -p1 -d "$mod/gvisor" <"$p" || die "patch $p does not apply to $GVISOR_VERSION; update it (docs/DECISIONS.md, \"gVisor\")"
	done
	cat >"$mod/go.mod" <<EOF
module triad.local/gvisorbuild

go 1.26

require $GVISOR_MODULE $GVISOR_VERSION

replace $GVISOR_MODULE => ./gvisor
EOF
	cat >"$mod/tools.go" <<'EOF'
//go:build tools

// Package gvisorbuild only pins the commands go get must resolve.
package gvisorbuild

import (
	_ "gvisor.dev/gvisor/runsc"
	_ "gvisor.dev/gvisor/shim"
)
EOF
	log "building $GVISOR_MODULE@$GVISOR_VERSION: runsc and containerd-shim-runsc-v1 (about 4 minutes on 2 cores the first time); log: $DIR/build.log"
	if ! (cd "$mod" && go mod tidy &&
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$GVISOR_VERSION+triad.$(key)" -o "$tmp/runsc" "$GVISOR_MODULE/runsc" &&
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/containerd-shim-runsc-v1" "$GVISOR_MODULE/shim") >"$DIR/build.log" 2>&1; then
		tail -30 "$DIR/build.log" >&2
		rm -rf "$tmp"
		die "go build failed; see $DIR/build.log"
	fi
	# A cgo build would start and then fail in its chroot; refuse it here.
	if LC_ALL=C ldd "$tmp/runsc" 2>&1 | grep -q '=>'; then
		rm -rf "$tmp"
		die "runsc was linked dynamically; it must be static"
	fi
	chmod 755 "$tmp"
	rm -rf "$BIN"
	mv "$tmp" "$BIN"
	rm -rf "$mod"
	log "built gVisor $GVISOR_VERSION in $((SECONDS - t0))s: $BIN"
}

# daemon_config prints the daemon.json the running dockerd reads.
daemon_config() {
	local pid cfg
	pid=$(cat /var/run/docker.pid 2>/dev/null || pidof dockerd 2>/dev/null | awk '{print $1}')
	[ -n "$pid" ] || die "no dockerd runs; start it with scripts/docker.sh"
	cfg=$(tr '\0' '\n' <"/proc/$pid/cmdline" | awk 'f { print; exit } /^--config-file$/ { f = 1 } /^--config-file=/ { sub(/^--config-file=/, ""); print; exit }')
	echo "${cfg:-/etc/docker/daemon.json}"
}

# registered: the engine lists our runtime with our path and arguments.
registered() {
	local want
	want=$(printf '%s ' "$BIN/runsc" "${RUNTIME_ARGS[@]}")
	[ "$(docker info --format "{{with index .Runtimes \"$RUNTIME_NAME\"}}{{.Path}} {{range .Args}}{{.}} {{end}}{{end}}" 2>/dev/null)" = "$want" ]
}

cmd_docker() {
	cmd_install >/dev/null
	docker info >/dev/null 2>&1 || "$REPO/scripts/docker.sh"
	if ! registered; then
		with_lock "$CACHE/register.lock" register
	fi
	echo "$RUNTIME_NAME"
}

register() {
	registered && return
	local cfg pid
	cfg=$(daemon_config)
	pid=$(cat /var/run/docker.pid 2>/dev/null || pidof dockerd | awk '{print $1}')
	log "registering runtime $RUNTIME_NAME ($BIN/runsc ${RUNTIME_ARGS[*]}) in $cfg; SIGHUP to dockerd $pid"
	# Merge, never replace: the engine is shared, and its other settings
	# (and its default runtime) are not ours.
	sudo_ mkdir -p "$(dirname "$cfg")"
	sudo_ python3 - "$cfg" "$RUNTIME_NAME" "$BIN/runsc" "${RUNTIME_ARGS[@]}" <<'EOF'
import json, os, sys
cfg, name, path, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
try:
    with open(cfg) as f:
        d = json.load(f)
except FileNotFoundError:
    d = {}
d.setdefault("runtimes", {})[name] = {"path": path, "runtimeArgs": args}
tmp = cfg + ".triad-partial"
with open(tmp, "w") as f:
    json.dump(d, f, indent=2)
    f.write("\n")
os.replace(tmp, cfg)
EOF
	sudo_ kill -HUP "$pid"
	local i
	for ((i = 0; i < 100; i++)); do
		registered && return
		sleep 0.1
	done
	die "dockerd did not list runtime $RUNTIME_NAME after SIGHUP; see its log"
}

case "${1:-}" in
install) cmd_install ;;
docker) cmd_docker ;;
variant)
	[ $# -ge 2 ] || die "usage: scripts/gvisor.sh variant NAME FLAG..."
	[ "$2" != runsc ] || die "a variant needs its own name, not runsc"
	RUNTIME_NAME=$2
	RUNTIME_ARGS=("${@:3}")
	cmd_docker
	;;
version) echo "$GVISOR_VERSION" ;;
*)
	sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
