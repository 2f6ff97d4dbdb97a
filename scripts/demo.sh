#!/usr/bin/env bash
# The main job: runs a recipe (default sales-reallocation) on the bundled
# sample data with the embedded defaults: local store in ./.triad, Docker
# sandbox. Installs and starts Docker Engine if needed (root or sudo); the
# sandbox image is built on first use (about 2 minutes, cached after that).
# Artifacts, CEL.md and run.ipynb are copied to ./triad-out/<run id>.
set -euo pipefail
cd "$(dirname "$0")/.."
recipe=${1:-sales-reallocation}
shift || true
scripts/docker.sh
exec go run ./cmd/triad run "$recipe" "$@"
