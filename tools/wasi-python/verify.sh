#!/usr/bin/env bash
# Checks the CPython-for-WASI files committed in sandbox/wasm/python against
# their PROVENANCE.
#
# Usage: tools/wasi-python/verify.sh [--rebuild [--no-cache]]
#
#   (no flag)   the sha256 of python.wasm and lib/python311.zip equal the
#               [outputs] section of PROVENANCE. Fast; builds nothing.
#   --rebuild   also runs build.sh into a temporary directory (a cache hit
#               when this exact script and toolchain built before) and checks
#               that the rebuilt files are byte-for-byte the committed ones.
#   --no-cache  with --rebuild: build from scratch, which proves the build is
#               reproducible rather than that the cache is.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DIR=$REPO/sandbox/wasm/python
REBUILD=0
BUILD_ARGS=()
while [ $# -gt 0 ]; do
	case "$1" in
	--rebuild) REBUILD=1; shift ;;
	--no-cache) BUILD_ARGS+=(--no-cache); shift ;;
	-h | --help) sed -n '2,16p' "$0"; exit 0 ;;
	*) echo "verify.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done

outputs() { sed -n '/^\[outputs\]$/,/^\[/p' "$1" | grep -E '^[0-9a-f]{64}  '; }

[ -f "$DIR/PROVENANCE" ] || { echo "verify.sh: $DIR/PROVENANCE is missing" >&2; exit 1; }
n=$(outputs "$DIR/PROVENANCE" | wc -l)
[ "$n" -eq 2 ] || { echo "verify.sh: PROVENANCE lists $n outputs, want 2" >&2; exit 1; }
if ! (cd "$DIR" && outputs PROVENANCE | sha256sum -c --strict --quiet); then
	echo "verify.sh: committed files do not match PROVENANCE; rebuild with 'make wasi-python' and commit" >&2
	exit 1
fi
echo "verify.sh: committed python.wasm and lib/python311.zip match PROVENANCE"

[ "$REBUILD" = 1 ] || exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$HERE/build.sh" --out "$tmp" "${BUILD_ARGS[@]}"
# Byte equality is only a fair demand of the same toolchain and sources. When
# the mirror has moved a package since the committed build, the script must
# still build (it just did), and the difference is reported, not failed.
pkgs() { grep -E '^(package|source-package):' "$1" | sort; }
if ! diff -q <(pkgs "$DIR/PROVENANCE") <(pkgs "$tmp/PROVENANCE") >/dev/null; then
	echo "verify.sh: the script still builds, with other Debian package versions than the committed build:" >&2
	diff <(pkgs "$DIR/PROVENANCE") <(pkgs "$tmp/PROVENANCE") >&2 || true
	if diff <(outputs "$DIR/PROVENANCE") <(outputs "$tmp/PROVENANCE") >/dev/null; then
		echo "verify.sh: and the outputs are still byte-for-byte the committed ones"
	else
		echo "verify.sh: the outputs differ from the committed ones; run 'make wasi-python' and commit sandbox/wasm/python to refresh them" >&2
	fi
	exit 0
fi
if ! diff <(outputs "$DIR/PROVENANCE") <(outputs "$tmp/PROVENANCE"); then
	echo "verify.sh: the script builds different files than the committed ones with the same toolchain (diff above: < committed, > rebuilt)." >&2
	echo "verify.sh: if the change is intended, run 'make wasi-python' and commit sandbox/wasm/python." >&2
	exit 1
fi
cmp "$DIR/python.wasm" "$tmp/python.wasm"
cmp "$DIR/lib/python311.zip" "$tmp/lib/python311.zip"
echo "verify.sh: rebuilt files are byte-for-byte the committed ones"
