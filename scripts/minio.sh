#!/usr/bin/env bash
# scripts/minio.sh installs, starts and stops the pinned MinIO server that
# Triad's S3 tests and CI run against. It needs only bash and Go.
#
#   scripts/minio.sh install           build the pinned MinIO once (cached) and print its path
#   scripts/minio.sh start DIR PORT    start it on 127.0.0.1:PORT with data in DIR/data,
#                                      wait until it is live, print the TRIAD_S3_* exports
#   scripts/minio.sh stop DIR          stop the server started with DIR
#
# Typical use:  eval "$(scripts/minio.sh start /tmp/minio 9000)"
#
# The binary is cached outside the clone, keyed by version, under
# ${TRIAD_CACHE:-$HOME/.cache/triad}/minio/<version>/bin/minio: building it
# takes minutes on two cores, so a CI cache of TRIAD_CACHE makes it free.
# Set TRIAD_MINIO_BIN to use a MinIO binary you already have.
#
# Everything meant for eval goes to stdout; progress and errors go to stderr.
set -euo pipefail

# The pinned version. Keep in sync with internal/miniotest (its test checks)
# and ../shared/notes/environment.md.
MINIO_MODULE=github.com/minio/minio
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c

# Fixed test credentials: this server only ever listens on loopback.
ACCESS_KEY=triad-test
SECRET_KEY=triad-test-secret
BUCKET=triad

CACHE=${TRIAD_CACHE:-$HOME/.cache/triad}
BIN=$CACHE/minio/$MINIO_VERSION/bin/minio

die() { echo "minio.sh: $*" >&2; exit 1; }

usage() {
	sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

# is_pinned BIN: BIN is a Go binary built from the pinned MinIO module version.
is_pinned() {
	[ -x "$1" ] && go version -m "$1" 2>/dev/null |
		awk -v m="$MINIO_MODULE" -v v="$MINIO_VERSION" '$1 == "mod" && $2 == m && $3 == v { ok = 1 } END { exit !ok }'
}

cmd_install() {
	if is_pinned "$BIN"; then
		echo "$BIN"
		return
	fi
	command -v go >/dev/null || die "go is not on PATH; it is needed to build MinIO"
	local dir tmp
	dir=$(dirname "$BIN")
	mkdir -p "$dir"
	# Build into a temp dir beside the target and rename, so an interrupted
	# build never leaves a half-written binary at the cached path.
	tmp=$(mktemp -d "$dir/.install.XXXXXX")
	echo "minio.sh: building $MINIO_MODULE@$MINIO_VERSION (several minutes the first time)..." >&2
	# Outside any module or workspace, so the clone's go.mod cannot interfere.
	if ! (cd / && GOWORK=off GOFLAGS= GOBIN="$tmp" go install "$MINIO_MODULE@$MINIO_VERSION") >&2; then
		rm -rf "$tmp"
		die "go install $MINIO_MODULE@$MINIO_VERSION failed"
	fi
	mv -f "$tmp/minio" "$BIN"
	rm -rf "$tmp"
	is_pinned "$BIN" || die "$BIN was built but does not report $MINIO_VERSION"
	echo "$BIN"
}

# resolve_bin prints the binary to run: TRIAD_MINIO_BIN, else the cached pinned build.
resolve_bin() {
	if [ -n "${TRIAD_MINIO_BIN:-}" ]; then
		[ -x "$TRIAD_MINIO_BIN" ] || die "TRIAD_MINIO_BIN=$TRIAD_MINIO_BIN is not an executable file"
		echo "$TRIAD_MINIO_BIN"
		return
	fi
	cmd_install
}

# live PORT: MinIO is up and serving S3. GET /minio/health/live answers 200
# before the object layer is initialized, marking that state only with an
# "X-Minio-Server-Status: unavailable" header (S3 requests then get 503
# XMinioServerNotInitialized), so the header must be absent too. Uses curl
# when present and bash's /dev/tcp otherwise: a machine with only Go works.
live() {
	local head
	if command -v curl >/dev/null; then
		head=$(curl -sS -D - -o /dev/null --max-time 2 "http://127.0.0.1:$1/minio/health/live" 2>/dev/null) || return 1
	else
		head=$(
			exec 2>/dev/null
			exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
			printf 'GET /minio/health/live HTTP/1.0\r\nHost: 127.0.0.1:%s\r\n\r\n' "$1" >&3
			while IFS= read -r -t 2 line <&3; do
				line=${line%$'\r'}
				[ -z "$line" ] && break
				echo "$line"
			done
		) || return 1
	fi
	head=${head//$'\r'/}
	[[ $head == "HTTP/1."?" 200"* ]] || return 1
	[[ ${head,,} != *$'\n'x-minio-server-status:* ]]
}

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

cmd_start() {
	[ $# -eq 2 ] || usage
	local dir=$1 port=$2
	[[ $port =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "PORT must be a number from 1 to 65535, got '$port'"
	local bin
	bin=$(resolve_bin)
	mkdir -p "$dir/data"
	dir=$(cd "$dir" && pwd)
	local pidfile=$dir/minio.pid log=$dir/minio.log
	if running "$pidfile"; then
		die "a MinIO started with $dir is already running (pid $(cat "$pidfile")); run: $0 stop $dir"
	fi
	if live "$port"; then
		die "something already answers on 127.0.0.1:$port; pick another PORT"
	fi
	MINIO_ROOT_USER=$ACCESS_KEY MINIO_ROOT_PASSWORD=$SECRET_KEY \
		MINIO_BROWSER=off MINIO_UPDATE=off \
		nohup "$bin" server "$dir/data" --address "127.0.0.1:$port" --quiet \
		</dev/null >"$log" 2>&1 &
	local pid=$!
	echo "$pid" >"$pidfile"
	# Bounded wait: MinIO is normally live within a few seconds.
	local timeout=${TRIAD_MINIO_START_TIMEOUT:-60} waited=0
	until live "$port"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			rm -f "$pidfile"
			tail -n 20 "$log" >&2 || true
			die "MinIO exited during startup; log above ($log)"
		fi
		if [ "$waited" -ge $((timeout * 10)) ]; then
			kill -TERM "$pid" 2>/dev/null || true
			rm -f "$pidfile"
			tail -n 20 "$log" >&2 || true
			die "MinIO was not live on 127.0.0.1:$port after ${timeout}s; log above ($log)"
		fi
		sleep 0.1
		waited=$((waited + 1))
	done
	echo "minio.sh: MinIO pid $pid live on 127.0.0.1:$port, data in $dir/data, log $log" >&2
	cat <<EOF
export TRIAD_S3_ENDPOINT=http://127.0.0.1:$port
export TRIAD_S3_BUCKET=$BUCKET
export TRIAD_S3_ACCESS_KEY=$ACCESS_KEY
export TRIAD_S3_SECRET_KEY=$SECRET_KEY
export TRIAD_MINIO_BIN=$bin
EOF
}

cmd_stop() {
	[ $# -eq 1 ] || usage
	local pidfile=$1/minio.pid
	if ! [ -f "$pidfile" ]; then
		echo "minio.sh: no pid file at $pidfile; nothing to stop" >&2
		return
	fi
	local pid
	pid=$(cat "$pidfile")
	if kill -TERM "$pid" 2>/dev/null; then
		# MinIO drains and exits on SIGTERM; give it 10 s, then kill it.
		local i
		for i in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			echo "minio.sh: pid $pid ignored SIGTERM for 10s; sending SIGKILL" >&2
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	rm -f "$pidfile"
	echo "minio.sh: stopped pid $pid" >&2
}

case "${1:-}" in
install) shift; [ $# -eq 0 ] || usage; cmd_install ;;
start) shift; cmd_start "$@" ;;
stop) shift; cmd_stop "$@" ;;
*) usage ;;
esac
