# Make targets. Each group belongs to the package or tool it names.

# tools/wasi-python: the CPython-for-WASI build that sandbox/wasm embeds.
.PHONY: wasi-python wasi-python-verify wasi-python-rebuild-check
wasi-python: # build (cached) python.wasm and the stdlib zip into sandbox/wasm/python
	tools/wasi-python/build.sh
wasi-python-verify: # committed files match PROVENANCE (fast, no build)
	tools/wasi-python/verify.sh
wasi-python-rebuild-check: # the script rebuilds the committed files byte for byte
	tools/wasi-python/verify.sh --rebuild
