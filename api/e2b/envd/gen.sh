#!/usr/bin/env bash
# gen.sh regenerates the Go types and Connect handlers of the envd services
# (filesystem, process) from proto/, with the proto toolchain installed from
# the Go module proxy at pinned versions: buf compiles the .proto files (no
# protoc needed), protoc-gen-go and protoc-gen-connect-go write the code.
# The tools are cached outside the clone under
# ${TRIAD_CACHE:-$HOME/.cache/triad}/gobin/<versions>. See docs/DECISIONS.md.
set -euo pipefail
cd "$(dirname "$0")"
BUF=github.com/bufbuild/buf/cmd/buf@v1.75.0
GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
GEN_CONNECT=connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
bin=${TRIAD_CACHE:-$HOME/.cache/triad}/gobin/buf-1.75.0-go-1.36.12-connect-1.21.1
if [ ! -x "$bin/protoc-gen-connect-go" ]; then
	mkdir -p "$bin"
	for t in "$BUF" "$GEN_GO" "$GEN_CONNECT"; do
		(cd / && GOWORK=off GOFLAGS= GOBIN="$bin" go install "$t") >&2
	done
fi
PATH="$bin:$PATH" buf generate
