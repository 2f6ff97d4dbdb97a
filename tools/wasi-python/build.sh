#!/usr/bin/env bash
# Reproducible build of CPython 3.11 for wasm32-wasi from Debian bookworm's own
# packages (toolchain) and source packages (CPython, zlib, SQLite).
#
# Usage: tools/wasi-python/build.sh [--out DIR] [--no-cache]
#
# Writes DIR/python.wasm (stripped), DIR/lib/python311.zip (stdlib as .pyc) and
# DIR/PROVENANCE. DIR defaults to sandbox/wasm/python, where sandbox/wasm embeds
# them. Results are cached under
# ${TRIAD_CACHE:-$HOME/.cache/triad}/wasi-python/<key>/, where <key> is the
# sha256 of this script, its input files and the installed toolchain's package
# versions, so a second run is a copy. --no-cache rebuilds from scratch (to
# prove the build is reproducible) and refreshes the cache entry.
#
# Reproducibility: sources are pinned by sha256; the build always runs in the
# same directory ($WORK below) because CPython records build paths in
# _sysconfigdata; SOURCE_DATE_EPOCH fixes __DATE__/__TIME__; PYTHONHASHSEED=0
# fixes set ordering in frozen and compiled code; .pyc files are
# unchecked-hash (no mtimes); zip entries are sorted with fixed timestamps.
set -euo pipefail

export LC_ALL=C TZ=UTC
umask 022

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$REPO/sandbox/wasm/python
NO_CACHE=0
while [ $# -gt 0 ]; do
	case "$1" in
	--out) OUT=$2; shift 2 ;;
	--no-cache) NO_CACHE=1; shift ;;
	-h | --help) sed -n '2,20p' "$0"; exit 0 ;;
	*) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# Pinned inputs. Debian's .orig tarballs are the upstream releases and stay the
# same across Debian revisions (security updates change only the Debian diff,
# which this build does not apply), so pinning them by hash survives updates.
PY_VERSION=3.11.2
PY_ORIG=python3.11_3.11.2.orig.tar.gz
PY_ORIG_SHA256=2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849
ZLIB_ORIG=zlib_1.2.13.dfsg.orig.tar.bz2
ZLIB_ORIG_SHA256=71feb7947e3c00ef125f83b79a4e529bde31171e5babe48b391f06758d1ab0a1
SQLITE_ORIG=sqlite3_3.40.1.orig.tar.xz
SQLITE_ORIG_SHA256=aaa776260ab4dc976db34aa7891819484c8676b5b2783123ebc6301e2ca5d655
# 2023-02-08T00:00:00Z, the day CPython 3.11.2 was released.
export SOURCE_DATE_EPOCH=1675814400
export PYTHONHASHSEED=0
BUILD_PYTHON=/usr/bin/python3.11
JOBS=${JOBS:-$(nproc)}

TOOLCHAIN_PKGS=(clang-16 lld-16 llvm-16 libclang-rt-16-dev-wasm32 wasi-libc tcl
	python3.11 gcc libc6-dev make xz-utils bzip2 zlib1g)
# Packages whose versions are recorded (and keyed on) but that python3.11 and
# the toolchain pull in themselves.
RECORDED_PKGS=("${TOOLCHAIN_PKGS[@]}" python3.11-minimal libpython3.11-stdlib
	libpython3.11-minimal)

CACHE_ROOT=${TRIAD_CACHE:-$HOME/.cache/triad}/wasi-python
# The build directory is fixed on purpose: its path ends up in _sysconfigdata.
WORK=/tmp/triad-wasi-python-build

log() { printf '[wasi-python %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

missing_pkgs() {
	local p
	for p in "${TOOLCHAIN_PKGS[@]}"; do
		if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != installed ]; then
			echo "$p"
		fi
	done
}

install_toolchain() {
	local missing
	missing=$(missing_pkgs)
	[ -z "$missing" ] && return 0
	log "installing toolchain: $(echo $missing)"
	# --no-upgrade: never move packages other work on this machine relies on.
	# shellcheck disable=SC2086
	if ! apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends --no-upgrade $missing; then
		apt-get -o DPkg::Lock::Timeout=600 update
		# shellcheck disable=SC2086
		apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends --no-upgrade $missing
	fi
}

pkg_versions() {
	dpkg-query -W -f='${Package} ${Version}\n' "${RECORDED_PKGS[@]}" | sort
}

# ensure_deb_src adds deb-src entries for the mirrors and suites apt already
# uses for binaries (read back from apt-cache policy, so both one-line and
# deb822 configurations work) and refreshes the source indexes.
ensure_deb_src() {
	local list=/etc/apt/sources.list.d/triad-deb-src.sources
	if apt-cache showsrc python3.11 2>/dev/null | grep -q '^Package:'; then
		return 0
	fi
	log "adding deb-src entries in $list"
	# deb and deb-src entries for one mirror must agree on Signed-By. deb822
	# sources (Debian 12's default) name the archive keyring; one-line
	# sources.list entries usually name none. Try the first, fall back to the
	# second, and never leave a file that breaks apt for everyone else.
	local keyring
	for keyring in /usr/share/keyrings/debian-archive-keyring.gpg ""; do
		{
			echo "# Written by triad tools/wasi-python/build.sh: Debian source packages"
			echo "# from the mirrors already configured for binary packages."
			apt-cache policy | awk '$NF == "Packages" && $2 ~ /^https?:/ {
				n = split($3, a, "/"); print $2, a[1], a[2] }' | sort -u |
				while read -r uri suite comp; do
					printf '\nTypes: deb-src\nURIs: %s\nSuites: %s\nComponents: %s\n' "$uri" "$suite" "$comp"
					if [ -n "$keyring" ]; then printf 'Signed-By: %s\n' "$keyring"; fi
				done
		} >"$list.tmp"
		mv "$list.tmp" "$list"
		if apt-cache policy >/dev/null 2>&1; then
			apt-get -o DPkg::Lock::Timeout=600 update
			return 0
		fi
	done
	rm -f "$list"
	die "could not add deb-src entries apt accepts; add deb-src lines for your mirror by hand"
}

# fetch_sources downloads the three source packages into $SRC and checks the
# pinned .orig hashes. apt-get source may fail on a .dsc or .debian.tar.xz the
# mirror no longer serves; only the .orig tarballs are needed.
fetch_sources() {
	SRC=$CACHE_ROOT/sources
	mkdir -p "$SRC"
	if ! sha256_ok "$SRC/$PY_ORIG" "$PY_ORIG_SHA256" ||
		! sha256_ok "$SRC/$ZLIB_ORIG" "$ZLIB_ORIG_SHA256" ||
		! sha256_ok "$SRC/$SQLITE_ORIG" "$SQLITE_ORIG_SHA256"; then
		ensure_deb_src
		log "downloading sources with apt-get source"
		(cd "$SRC" && apt-get source --download-only python3.11 zlib sqlite3) ||
			log "apt-get source reported errors; checking the .orig tarballs"
	fi
	sha256_ok "$SRC/$PY_ORIG" "$PY_ORIG_SHA256" || die "$PY_ORIG missing or not sha256 $PY_ORIG_SHA256"
	sha256_ok "$SRC/$ZLIB_ORIG" "$ZLIB_ORIG_SHA256" || die "$ZLIB_ORIG missing or not sha256 $ZLIB_ORIG_SHA256"
	sha256_ok "$SRC/$SQLITE_ORIG" "$SQLITE_ORIG_SHA256" || die "$SQLITE_ORIG missing or not sha256 $SQLITE_ORIG_SHA256"
	SRC_VERSIONS=$(apt-cache showsrc python3.11 zlib sqlite3 2>/dev/null |
		awk '/^Package:/ {p=$2} /^Version:/ {print p, $2}' | sort -u)
}

sha256_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

copy_outputs() { # from to
	mkdir -p "$2/lib"
	cp "$1/python.wasm" "$2/python.wasm"
	cp "$1/lib/python311.zip" "$2/lib/python311.zip"
	cp "$1/PROVENANCE" "$2/PROVENANCE"
}

build() { # dest
	local dest=$1 t0 t
	t0=$(date +%s)
	rm -rf "$WORK"
	mkdir -p "$WORK"
	local SYSROOT=$WORK/sysroot
	mkdir -p "$SYSROOT/include" "$SYSROOT/lib/wasm32-wasi"
	# A private sysroot: clang-16 with --sysroot searches only $SYSROOT/include,
	# so host headers from /usr/include cannot leak into a wasm32 build.
	local f
	for f in /usr/include/wasm32-wasi/*; do ln -s "$f" "$SYSROOT/include/"; done
	for f in /usr/lib/wasm32-wasi/*; do ln -s "$f" "$SYSROOT/lib/wasm32-wasi/"; done

	local PREFIX_MAP="-ffile-prefix-map=$WORK=/triad-wasi-python"
	export CC="clang-16 --target=wasm32-wasi --sysroot=$SYSROOT"
	export AR=llvm-ar-16 RANLIB=llvm-ranlib-16
	export PKG_CONFIG_LIBDIR=$SYSROOT/lib/wasm32-wasi/pkgconfig

	log "zlib"
	tar -C "$WORK" -xjf "$SRC/$ZLIB_ORIG"
	(
		cd "$WORK"/zlib-1.2.13.dfsg
		local objs=()
		for f in adler32 compress crc32 deflate gzclose gzlib gzread gzwrite \
			infback inffast inflate inftrees trees uncompr zutil; do
			# -w: zlib 1.2.13's K&R definitions warn on every function.
			$CC -O2 -w $PREFIX_MAP -D_LARGEFILE64_SOURCE=1 -c "$f.c" -o "$f.o"
			objs+=("$f.o")
		done
		$AR rcD "$SYSROOT/lib/wasm32-wasi/libz.a" "${objs[@]}"
		cp zlib.h zconf.h "$SYSROOT/include/"
	)

	log "sqlite"
	tar -C "$WORK" -xJf "$SRC/$SQLITE_ORIG"
	(
		cd "$WORK"/sqlite3-3.40.1
		# The amalgamation is generated natively (it needs tclsh), then
		# compiled for WASI.
		env -u CC -u AR -u RANLIB -u PKG_CONFIG_LIBDIR ./configure >configure.log 2>&1 ||
			{ tail -30 configure.log; die "sqlite configure failed"; }
		env -u CC -u AR -u RANLIB -u PKG_CONFIG_LIBDIR make sqlite3.c >make.log 2>&1 ||
			{ tail -30 make.log; die "make sqlite3.c failed"; }
		$CC -O2 $PREFIX_MAP -include "$HERE/sqlite-wasi-shim.h" \
			-DSQLITE_THREADSAFE=0 -DSQLITE_OMIT_LOAD_EXTENSION -D_WASI_EMULATED_GETPID \
			-DSQLITE_OMIT_WAL -DSQLITE_MAX_MMAP_SIZE=0 -DSQLITE_DEFAULT_UNIX_VFS='"unix-none"' \
			-c sqlite3.c -o sqlite3.o
		$AR rcD "$SYSROOT/lib/wasm32-wasi/libsqlite3.a" sqlite3.o
		cp sqlite3.h sqlite3ext.h "$SYSROOT/include/"
	)

	log "cpython configure"
	tar -C "$WORK" -xzf "$SRC/$PY_ORIG"
	local PYSRC=$WORK/Python-$PY_VERSION
	mkdir -p "$PYSRC/builddir/wasi"
	(
		cd "$PYSRC/builddir/wasi"
		# clang 16 makes int-conversion an error; wasi-libc's clockid_t is a
		# pointer, which Modules/timemodule.c converts to int.
		# No clock_nanosleep: time.sleep would use it with TIMER_ABSTIME,
		# which wazero's poll_oneoff rejects (ENOTSUP); nanosleep sleeps
		# with a relative timeout, which it supports. (configure falls back
		# to looking in librt, hence both variables.)
		ac_cv_func_clock_nanosleep=no ac_cv_lib_rt_clock_nanosleep=no \
			CONFIG_SITE=../../Tools/wasm/config.site-wasm32-wasi \
			CFLAGS="-Wno-error=int-conversion $PREFIX_MAP" \
			LIBSQLITE3_CFLAGS=" " LIBSQLITE3_LIBS=-lsqlite3 ZLIB_CFLAGS=" " ZLIB_LIBS=-lz \
			../../configure -C --host=wasm32-unknown-wasi --build="$(../../config.guess)" \
			--with-build-python="$BUILD_PYTHON" >configure.log 2>&1 ||
			{ tail -40 configure.log; die "cpython configure failed"; }
		log "cpython make -j$JOBS"
		make -j"$JOBS" >make.log 2>&1 || { tail -40 make.log; die "cpython make failed"; }
		grep -E "^(Following modules|The necessary bits|Failed to build)" -A6 make.log >&2 || true
	)
	local B=$PYSRC/builddir/wasi
	mkdir -p "$dest/lib"
	llvm-strip-16 -o "$dest/python.wasm" "$B/python.wasm"

	log "stdlib zip"
	local STAGE=$WORK/stdlib
	mkdir -p "$STAGE"
	(cd "$PYSRC/Lib" && tar -c --exclude=test --exclude=tests --exclude=idlelib \
		--exclude=tkinter --exclude=turtledemo --exclude=ensurepip \
		--exclude=__pycache__ --exclude=site-packages .) | tar -C "$STAGE" -x
	cp "$B"/build/lib.wasi-wasm32-3.11/_sysconfigdata__wasi_wasm32-wasi.py "$STAGE/"
	# -b writes legacy x.pyc next to x.py, which is where a sourceless zip
	# import looks; -d names the files as the guest will see them in
	# tracebacks.
	"$BUILD_PYTHON" -I -m compileall -q -b -f -j1 --invalidation-mode unchecked-hash \
		-d /lib/python311.zip "$STAGE" >/dev/null ||
		die "compileall failed"
	"$BUILD_PYTHON" -I -S "$HERE/mkzip.py" "$STAGE" "$dest/lib/python311.zip" >&2

	t=$(($(date +%s) - t0))
	log "built in ${t}s"
	write_provenance "$dest" "$t"
	rm -rf "$WORK"
}

write_provenance() { # dest seconds
	local dest=$1
	{
		echo "# Provenance of the CPython-for-WASI build that sandbox/wasm embeds."
		echo "# Written by tools/wasi-python/build.sh; check with tools/wasi-python/verify.sh."
		echo
		echo "[build]"
		echo "command: tools/wasi-python/build.sh"
		echo "cache_key: $KEY"
		echo "cpython: $PY_VERSION (wasm32-wasi, static, no threads)"
		echo "source_date_epoch: $SOURCE_DATE_EPOCH"
		echo "pythonhashseed: $PYTHONHASHSEED"
		echo "host: $(. /etc/os-release && echo "$PRETTY_NAME") $(uname -m)"
		echo "build_seconds: $2 (jobs=$JOBS)"
		echo
		echo "[sources]"
		echo "# Debian .orig tarballs, pinned by sha256; Debian's own patches are not applied."
		echo "$PY_ORIG_SHA256  $PY_ORIG"
		echo "$ZLIB_ORIG_SHA256  $ZLIB_ORIG"
		echo "$SQLITE_ORIG_SHA256  $SQLITE_ORIG"
		echo "# Debian source package versions the mirror offered:"
		echo "$SRC_VERSIONS" | sed 's/^/source-package: /'
		echo
		echo "[toolchain]"
		pkg_versions | sed 's/^/package: /'
		echo "clang: $(clang-16 --version | head -1)"
		echo "wasm-ld: $(wasm-ld-16 --version | head -1)"
		echo "build-python: $("$BUILD_PYTHON" -c 'import sys; print(sys.version.split()[0])')"
		echo
		echo "[outputs]"
		(cd "$dest" && sha256sum python.wasm lib/python311.zip)
	} >"$dest/PROVENANCE"
}

cache_hit() { # entry
	[ -f "$1/PROVENANCE" ] || return 1
	log "cache hit $1"
	[ "$1" -ef "$OUT" ] || copy_outputs "$1" "$OUT"
	(cd "$OUT" && sed -n '/^\[outputs\]$/,$p' PROVENANCE | grep -E '^[0-9a-f]{64}  ' | sha256sum -c --quiet)
}

main() {
	install_toolchain
	KEY=$( {
		cat "$HERE/build.sh" "$HERE/sqlite-wasi-shim.h" "$HERE/mkzip.py"
		pkg_versions
	} | sha256sum | cut -d' ' -f1)
	local entry=$CACHE_ROOT/$KEY
	mkdir -p "$CACHE_ROOT"
	if [ "$NO_CACHE" = 0 ] && cache_hit "$entry"; then
		return 0
	fi
	# One build at a time: the build directory is fixed. Whoever waited may
	# find the entry the other one built.
	exec 9>"$CACHE_ROOT/.lock"
	flock 9
	if [ "$NO_CACHE" = 0 ] && cache_hit "$entry"; then
		return 0
	fi
	fetch_sources
	local tmp=$CACHE_ROOT/.tmp-$KEY
	rm -rf "$tmp"
	build "$tmp"
	rm -rf "$entry"
	mv "$tmp" "$entry"
	[ "$entry" -ef "$OUT" ] || copy_outputs "$entry" "$OUT"
	log "outputs in $OUT:"
	sed -n '/^\[outputs\]$/,$p' "$OUT/PROVENANCE" >&2
}

main
