#!/usr/bin/env bash
# scripts/e2b-suites.sh runs E2B's own JS SDK test suites, unchanged and checked
# out OUTSIDE this repository, against triad serve (docs/e2b.md, "E2B's own suites").
#
#   scripts/e2b-suites.sh install            npm ci the runner (vitest, the pinned SDKs) once, cached
#   scripts/e2b-suites.sh run ROOT [FILE...] run one suite: ROOT is code-interpreter/js or
#                                            E2B/packages/js-sdk; FILEs (relative to ROOT) narrow it
#
# `run` uses the triad serve that E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY
# name (the suites' own endpoint hooks: the SDK reads them). When
# E2B_API_URL is unset it builds this checkout's triad (or takes the binary
# TRIAD_BIN names), starts `triad serve --sandbox docker` on a free loopback
# port with a fresh data directory (extra flags from TRIAD_SERVE_FLAGS), and
# stops it at the end. The sandbox image must be built first
# (`triad image build`): a serve that has to build it answers nothing meanwhile.
#
# The suites import the SDK's source (../src); the runner resolves those
# imports to the npm SDKs pinned in scripts/e2b-suites/package-lock.json
# (the same e2b and @e2b/code-interpreter as e2e/e2b), except in the SDK's
# own unit tests, which mock its internals and keep its source
# (scripts/e2b-suites/classify.mjs says which) and run without
# E2B_API_URL and E2B_SANDBOX_URL: they mock E2B's default addresses. Which files run:
#   code-interpreter/js   tests/**/*.test.ts except tests/runtimes
#   E2B/packages/js-sdk   tests/sandbox/**/*.test.ts (sandbox, files, commands, git, pty)
# Files run one at a time (a sandbox per test on a shared machine); each
# test keeps the suite's own 30 s timeout unless E2B_SUITE_TIMEOUT_MS says.
#
# Output: vitest's report on stderr, then on stdout one line
#   SUITE <name> files=<n> tests=<n> passed=<n> failed=<n> skipped=<n>
# followed by "FAIL <file> > <test name>" for each failure. The JSON report
# is kept at $E2B_SUITE_REPORT (default: a temp file, path printed).
# Exit status: 0 when the suite ran (whatever its failures), 1 when it
# could not.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNNER=$ROOT/scripts/e2b-suites
CACHE=${TRIAD_CACHE:-$HOME/.cache/triad}

die() { echo "e2b-suites.sh: $*" >&2; exit 1; }

cmd_install() {
	command -v npm >/dev/null || die "npm is not on PATH; install Node.js 20 or newer (apt-get install nodejs npm)"
	local hash dir tmp
	hash=$(sha256sum "$RUNNER/package-lock.json" | cut -c1-16)
	dir=$CACHE/npm/e2b-suites-$hash
	if [ ! -f "$dir/.complete" ]; then
		mkdir -p "$CACHE/npm"
		tmp=$(mktemp -d "$CACHE/npm/.install.XXXXXX")
		cp "$RUNNER/package.json" "$RUNNER/package-lock.json" "$tmp/"
		echo "e2b-suites.sh: npm ci the suite runner into $dir" >&2
		if ! (cd "$tmp" && npm ci --no-audit --no-fund --ignore-scripts --prefer-offline \
			--cache "$CACHE/npm/_cacache") >&2; then
			rm -rf "$tmp"
			die "npm ci failed (is the npm registry reachable, or is $CACHE/npm/_cacache primed?)"
		fi
		touch "$tmp/.complete" "$tmp/node_modules/.resolve-anchor.js"
		rm -rf "$dir"
		mv "$tmp" "$dir"
	fi
	ln -sfn "$dir/node_modules" "$RUNNER/node_modules"
	echo "$dir/node_modules"
}

# serve starts triad serve for a run and sets the E2B_* variables.
serve() {
	local tmp bin port key
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/e2b-suites.XXXXXX")
	bin=${TRIAD_BIN:-$tmp/triad}
	if [ -z "${TRIAD_BIN:-}" ]; then
		echo "e2b-suites.sh: building triad" >&2
		(cd "$ROOT" && go build -o "$bin" ./cmd/triad) || die "go build ./cmd/triad failed"
	fi
	"$bin" image tag >/dev/null 2>&1 && ! docker image inspect "$("$bin" image tag)" >/dev/null 2>&1 &&
		die "the sandbox image $("$bin" image tag) is not built: run triad image build first"
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	key=e2b_$(head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n')
	# shellcheck disable=SC2086 # TRIAD_SERVE_FLAGS is a list of flags
	"$bin" serve --addr "127.0.0.1:$port" --data "$tmp/data" --sandbox docker --warm 2 \
		--e2b-api-key "$key" ${TRIAD_SERVE_FLAGS:-} >"$tmp/serve.log" 2>&1 &
	SERVE_PID=$!
	SERVE_DIR=$tmp
	trap 'stop_serve' EXIT
	local i
	for i in $(seq 1 1800); do
		if curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then break; fi
		kill -0 "$SERVE_PID" 2>/dev/null || { cat "$tmp/serve.log" >&2; die "triad serve exited"; }
		sleep 0.1
	done
	export E2B_API_URL=http://127.0.0.1:$port E2B_SANDBOX_URL=http://127.0.0.1:$port E2B_API_KEY=$key
	echo "e2b-suites.sh: triad serve at $E2B_API_URL (log: $tmp/serve.log)" >&2
}

stop_serve() {
	if [ -n "${SERVE_PID:-}" ]; then
		kill -TERM "$SERVE_PID" 2>/dev/null || true
		wait "$SERVE_PID" 2>/dev/null || true
		SERVE_PID=
		echo "e2b-suites.sh: triad serve stopped; its log is $SERVE_DIR/serve.log" >&2
	fi
}

cmd_run() {
	[ $# -ge 1 ] || die "usage: scripts/e2b-suites.sh run SUITE_ROOT [FILE...]"
	local suite name sdk files nm report
	suite=$(cd "$1" && pwd) || die "no suite at $1"
	shift
	name=$(node -p "require('$suite/package.json').name") || die "$suite/package.json is unreadable"
	case $name in
	@e2b/code-interpreter) sdk=@e2b/code-interpreter ;;
	e2b) sdk=e2b ;;
	*) die "$suite is $name, not code-interpreter/js or E2B's packages/js-sdk" ;;
	esac
	nm=$(cmd_install)
	if [ $# -gt 0 ]; then
		files=$(printf '%s\n' "$@")
	elif [ "$sdk" = e2b ]; then
		files=$(cd "$suite" && find tests/sandbox -name '*.test.ts' | sort)
	else
		files=$(cd "$suite" && find tests -name '*.test.ts' -not -path 'tests/runtimes/*' | sort)
	fi
	[ -n "${E2B_API_URL:-}" ] || serve
	: "${E2B_SANDBOX_URL:=$E2B_API_URL}"
	[ -n "${E2B_API_KEY:-}" ] || die "E2B_API_KEY is not set (the key triad serve's --e2b-api-key names)"
	export E2B_SANDBOX_URL
	report=${E2B_SUITE_REPORT:-$(mktemp "${TMPDIR:-/tmp}/e2b-suite-report.XXXXXX")}
	local classes mode part out=() i=0
	# shellcheck disable=SC2086 # one file per word; test paths have no spaces
	classes=$(cd "$RUNNER" && node classify.mjs "$suite" "$sdk" $files)
	for mode in npm src; do
		part=$(printf '%s\n' "$classes" | awk -F'\t' -v m="$mode" '$1 == m { print $2 }')
		[ -n "$part" ] || continue
		i=$((i + 1))
		echo "e2b-suites.sh: $name, $(printf '%s\n' "$part" | wc -l) files with the SDK from $mode" >&2
		# vitest exits non-zero when a test fails: the report says which.
		# The SDK's unit tests mock the network (msw) at E2B's own default
		# addresses, so they run without our endpoint variables.
		local unset=()
		[ "$mode" = src ] && unset=(-u E2B_API_URL -u E2B_SANDBOX_URL)
		env "${unset[@]}" "E2B_SUITE_ROOT=$suite" "E2B_SUITE_SDK=$sdk" "E2B_SUITE_MODE=$mode" "E2B_SUITE_FILES=$part" \
			node "$nm/vitest/vitest.mjs" run --config "$RUNNER/vitest.config.mjs" \
			--no-file-parallelism --reporter=default --reporter=json --outputFile.json="$report.$i" >&2 || true
		[ -s "$report.$i" ] || die "vitest wrote no report ($report.$i): see its output above"
		out+=("$report.$i")
	done
	node "$RUNNER/summary.mjs" "$name" "$suite" "$report" "${out[@]}"
	rm -f "${out[@]}"
	echo "e2b-suites.sh: JSON report at $report" >&2
}

case "${1:-}" in
install) cmd_install ;;
run) shift; cmd_run "$@" ;;
*) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
