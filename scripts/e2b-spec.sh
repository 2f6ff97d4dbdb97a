#!/usr/bin/env bash
# scripts/e2b-spec.sh places E2B's published OpenAPI documents, at the commit
# api/e2b pins, where the E2B surface's spec test reads them.
#
#   scripts/e2b-spec.sh place [GIT_DIR]   put spec/openapi.yml and spec/envd/envd.yaml in the cache, print the directory
#   scripts/e2b-spec.sh path              print the directory if it holds both files, else fail
#
# E2B's text is never copied into this repository. The files go to
# ${TRIAD_CACHE:-$HOME/.cache/triad}/e2b-spec/<commit>/, checked against the
# sha256 digests in api/e2b/testdata/e2b-contract.json (our own distillation
# of the operations Triad serves, made from these files). They come from, in
# order: the cache; GIT_DIR (or $E2B_GIT_DIR), a git directory of
# e2b-dev/E2B that has the commit (the search tool's fetch makes one, e.g.
# /work/.mirror/e2b-dev+E2B/repo); raw.githubusercontent.com, where the
# network allows. Then run the test with the printed directory:
#
#   TRIAD_E2B_SPEC=$(scripts/e2b-spec.sh place) go test ./api/e2b -run 'TestAnswersMatchE2B'
#
# Everything meant for scripts goes to stdout; progress and errors go to stderr.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONTRACT=$ROOT/api/e2b/testdata/e2b-contract.json
CACHE=${TRIAD_CACHE:-$HOME/.cache/triad}

die() { echo "e2b-spec.sh: $*" >&2; exit 1; }

commit=$(grep -o '"commit": *"[0-9a-f]*"' "$CONTRACT" | head -1 | sed 's/.*: *"//; s/"//')
[ -n "$commit" ] || die "no commit in $CONTRACT"
DIR=$CACHE/e2b-spec/$commit

# want FILE: the sha256 the contract records for spec FILE (spec/openapi.yml).
want() { grep -o "\"$1\": *\"[0-9a-f]*\"" "$CONTRACT" | sed 's/.*: *"//; s/"//'; }

# FILES maps each repository path to its name in DIR.
FILES="spec/openapi.yml:openapi.yml spec/envd/envd.yaml:envd.yaml"

# ok DIR: DIR holds every file with its digest.
ok() {
	local f src dst
	for f in $FILES; do
		src=${f%%:*} dst=${f##*:}
		[ -f "$1/$dst" ] || return 1
		[ "$(sha256sum "$1/$dst" | cut -d' ' -f1)" = "$(want "$src")" ] || return 1
	done
}

cmd_path() {
	ok "$DIR" || die "$DIR does not hold E2B's spec at $commit; run scripts/e2b-spec.sh place"
	echo "$DIR"
}

cmd_place() {
	if ok "$DIR"; then
		echo "$DIR"
		return
	fi
	local gitdir=${1:-${E2B_GIT_DIR:-}} tmp f src dst
	mkdir -p "$CACHE/e2b-spec"
	tmp=$(mktemp -d "$CACHE/e2b-spec/.place.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	for f in $FILES; do
		src=${f%%:*} dst=${f##*:}
		if [ -n "$gitdir" ] && git --git-dir="$gitdir" cat-file -e "$commit:$src" 2>/dev/null; then
			git --git-dir="$gitdir" show "$commit:$src" >"$tmp/$dst"
		elif command -v curl >/dev/null && curl -fsSL --max-time 60 "https://raw.githubusercontent.com/e2b-dev/E2B/$commit/$src" -o "$tmp/$dst" 2>/dev/null; then
			:
		else
			die "cannot get $src at $commit: name a git directory of e2b-dev/E2B that has it (scripts/e2b-spec.sh place GIT_DIR), or allow raw.githubusercontent.com"
		fi
		[ "$(sha256sum "$tmp/$dst" | cut -d' ' -f1)" = "$(want "$src")" ] || die "$src at $commit does not have the sha256 $CONTRACT records"
	done
	rm -rf "$DIR"
	mv "$tmp" "$DIR"
	trap - EXIT
	echo "e2b-spec.sh: placed E2B's spec at $commit in $DIR" >&2
	echo "$DIR"
}

case "${1:-}" in
place) shift; cmd_place "$@" ;;
path) cmd_path ;;
*) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
