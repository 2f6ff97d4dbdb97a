#!/usr/bin/env bash
# Ensures a Docker engine answers: installs Debian's docker.io when dockerd is
# missing and starts dockerd without a bridge (sandbox containers always run
# with network mode none) when no engine answers. Idempotent.
set -euo pipefail
CACHE=${TRIAD_CACHE:-$HOME/.cache/triad}
mkdir -p "$CACHE/logs"

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if docker info >/dev/null 2>&1; then
  exit 0
fi
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  echo "docker.sh: installing ${need[*]}" >&2
  sudo_ apt-get update -qq >/dev/null
  sudo_ env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${need[@]}" >/dev/null
fi
echo "docker.sh: starting dockerd (log: $CACHE/logs/dockerd.log)" >&2
sudo_ nohup dockerd --bridge=none --iptables=false --ip-masq=false >"$CACHE/logs/dockerd.log" 2>&1 &
for _ in $(seq 1 120); do
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  sleep 0.5
done
echo "docker.sh: dockerd did not answer within 60 s; see $CACHE/logs/dockerd.log" >&2
tail -20 "$CACHE/logs/dockerd.log" >&2 || true
exit 1
