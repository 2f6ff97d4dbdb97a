#!/usr/bin/env bash
# Builds console/static/vendor/editor.js (CodeMirror 6 with Python, one
# minified ES module) and its licences from entry.js and the versions that
# package-lock.json pins, and checks the result against PROVENANCE.
#
# Usage: tools/editor/build.sh [--update | --check]
#
#   (no flag)  build into a temporary directory and check that the files
#              are byte for byte the committed ones (needs npm's registry).
#   --update   write the build over the committed files and PROVENANCE.
#   --check    only check the committed files' sha256 against PROVENANCE
#              (fast, offline; scripts/test.sh runs it).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$REPO/console/static/vendor
UPDATE=0
[ "${1:-}" = "--update" ] && UPDATE=1
if [ "${1:-}" = "--check" ]; then
	sed -n '/^\[outputs\]$/,$p' "$HERE/PROVENANCE" | grep -E '^[0-9a-f]{64}  ' | (cd "$OUT" && sha256sum -c --quiet -)
	echo "console/static/vendor matches tools/editor/PROVENANCE"
	exit 0
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp "$HERE/package.json" "$HERE/package-lock.json" "$HERE/entry.js" "$WORK/"
(cd "$WORK" && npm ci --no-audit --no-fund --ignore-scripts >/dev/null)
ESBUILD=$(ls "$WORK"/node_modules/@esbuild/*/bin/esbuild | head -1)
"$ESBUILD" "$WORK/entry.js" --bundle --format=esm --minify --target=es2020 --legal-comments=none \
	--outfile="$WORK/editor.js" --log-level=warning
{
	echo "console/static/vendor/editor.js bundles these packages (built by tools/editor/build.sh)."
	echo "Each is under the MIT licence; their notices follow."
	for d in $(cd "$WORK/node_modules" && ls -d @codemirror/* @lezer/* @marijn/* crelt style-mod w3c-keyname 2>/dev/null | sort); do
		[ -f "$WORK/node_modules/$d/package.json" ] || continue
		v=$(node -p "require('$WORK/node_modules/$d/package.json').version")
		echo
		echo "==== $d $v ===="
		cat "$WORK/node_modules/$d/LICENSE"* 2>/dev/null || echo "(no LICENSE file; package.json says $(node -p "require('$WORK/node_modules/$d/package.json').license"))"
	done
} >"$WORK/editor.LICENSES.txt"

if [ $UPDATE = 1 ]; then
	mkdir -p "$OUT"
	cp "$WORK/editor.js" "$WORK/editor.LICENSES.txt" "$OUT/"
	{
		echo "# console/static/vendor/editor.js: built by tools/editor/build.sh from entry.js"
		echo "# with the versions package-lock.json pins (node $(node --version), npm $(npm --version))."
		echo "[packages]"
		(cd "$WORK" && npm ls --all --parseable --long 2>/dev/null | sed -n 's#.*/node_modules/\(.*\)$#\1#p' | grep -v '^@esbuild\|^esbuild' | sort -u)
		echo "[outputs]"
		(cd "$OUT" && sha256sum editor.js editor.LICENSES.txt)
	} >"$HERE/PROVENANCE"
	echo "updated $OUT/editor.js ($(wc -c <"$OUT/editor.js") bytes) and PROVENANCE"
	exit 0
fi
for f in editor.js editor.LICENSES.txt; do
	if ! cmp -s "$WORK/$f" "$OUT/$f"; then
		echo "build.sh: the rebuilt $f differs from console/static/vendor/$f" >&2
		exit 1
	fi
done
echo "console/static/vendor/editor.js matches its build"
