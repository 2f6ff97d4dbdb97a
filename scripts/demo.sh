#!/usr/bin/env bash
# The main job: runs a recipe (default sales-reallocation) on the bundled
# sample data with the embedded defaults: local store in ./.triad, Docker
# sandbox, kernels under gVisor. Installs and starts Docker Engine if needed
# (root or sudo) and registers gVisor's runsc with it (scripts/gvisor.sh:
# built from the Go module proxy, about 3 minutes the first time, cached
# after that); the sandbox image is built on first use (about 2 minutes,
# cached after that). When runsc cannot be built or registered, the demo
# says so and runs under runc; the run's CEL.md names the runtime either way.
# Artifacts, CEL.md and run.ipynb are copied to ./triad-out/<run id>.
set -euo pipefail
cd "$(dirname "$0")/.."
recipe=${1:-sales-reallocation}
shift || true
scripts/docker.sh
if ! scripts/gvisor.sh docker >/dev/null; then
  echo "demo.sh: gVisor could not be registered with the Docker engine (see above); kernels run under runc, on the host's kernel" >&2
fi
exec go run ./cmd/triad run "$recipe" "$@"
