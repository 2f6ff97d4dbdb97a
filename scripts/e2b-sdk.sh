#!/usr/bin/env bash
# scripts/e2b-sdk.sh installs the pinned E2B SDKs (e2b, @e2b/code-interpreter)
# that e2e/e2b drives a real triad serve with, and links them into the suite.
#
#   scripts/e2b-sdk.sh install   npm ci the lockfile once (cached), link
#                                e2e/e2b/node_modules to it, print its path
#
# The packages are installed outside the clone, keyed by the sha256 of
# e2e/e2b/package-lock.json, under
# ${TRIAD_CACHE:-$HOME/.cache/triad}/npm/e2b-<hash>/node_modules, with npm's
# own download cache beside it (npm/_cacache): once both exist, install needs
# no network. Changing the lockfile changes the key, so a stale tree is never used.
#
# Everything meant for scripts goes to stdout; progress and errors go to stderr.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SUITE=$ROOT/e2e/e2b
CACHE=${TRIAD_CACHE:-$HOME/.cache/triad}

die() { echo "e2b-sdk.sh: $*" >&2; exit 1; }

cmd_install() {
	command -v npm >/dev/null || die "npm is not on PATH; install Node.js 20 or newer (apt-get install nodejs npm)"
	local hash dir tmp
	hash=$(sha256sum "$SUITE/package-lock.json" | cut -c1-16)
	dir=$CACHE/npm/e2b-$hash
	if [ ! -f "$dir/.complete" ]; then
		mkdir -p "$CACHE/npm"
		# Install into a temp dir beside the target and rename, so an
		# interrupted install never leaves a half tree at the cached path.
		tmp=$(mktemp -d "$CACHE/npm/.install.XXXXXX")
		cp "$SUITE/package.json" "$SUITE/package-lock.json" "$tmp/"
		echo "e2b-sdk.sh: npm ci e2b SDKs into $dir" >&2
		if ! (cd "$tmp" && npm ci --no-audit --no-fund --ignore-scripts --prefer-offline \
			--cache "$CACHE/npm/_cacache") >&2; then
			rm -rf "$tmp"
			die "npm ci failed (is the npm registry reachable, or is $CACHE/npm/_cacache primed?)"
		fi
		touch "$tmp/.complete"
		rm -rf "$dir"
		mv "$tmp" "$dir"
	fi
	# The suite imports the SDKs by bare name: Node resolves them through
	# this link, and their own dependencies from the cached tree.
	ln -sfn "$dir/node_modules" "$SUITE/node_modules"
	echo "$dir/node_modules"
}

case "${1:-}" in
install) cmd_install ;;
*) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
