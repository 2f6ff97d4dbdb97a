#!/usr/bin/env bash
# Installs the Debian packages the tests use on the host, when missing:
#   docker.io, debootstrap, e2fsprogs
#                            the Docker sandbox, its offline image build, the mkfs.ext4 of disk quotas
#   python3-ipykernel, python3-matplotlib
#                            a real ipykernel for sandbox/jupyter's tests
#   python3-nbformat         validates run.ipynb with the reference validator
#   poppler-utils            pdfinfo/pdftoppm render the brief's PDF
#   chromium                 the web console's browser tests (console/), driven by chromedp
#   iproute2                 ip netns and veth: the egress tests' hosts live in network
#                            namespaces of their own (egress/egresstest; the tests run as root)
#   nodejs, npm              E2B's SDKs drive triad serve in e2e/e2b (only when
#                            node or npm is not on PATH, so a Node from elsewhere stays)
# Idempotent: installs nothing when everything is there.
set -euo pipefail
want=(docker.io debootstrap e2fsprogs iproute2 python3-ipykernel python3-matplotlib python3-nbformat poppler-utils chromium)
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi
[ ${#missing[@]} -eq 0 ] && exit 0
sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
echo "host-deps.sh: installing ${missing[*]}" >&2
sudo_ apt-get update -qq >/dev/null
sudo_ env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
