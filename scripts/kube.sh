#!/usr/bin/env bash
# scripts/kube.sh runs a real single-node Kubernetes on this machine for the
# sandbox/kube backend and its tests: no registry, no kind, no internet.
#
#   scripts/kube.sh [up]     build the binaries (cached), start the cluster,
#                            import the sandbox image, apply the namespaces
#                            and RBAC of deploy/kubernetes; print env lines
#   scripts/kube.sh down     stop everything up started and remove its state
#   scripts/kube.sh status   say what runs; exit 0 only when the cluster is up
#   scripts/kube.sh env      print the export lines tests use
#   scripts/kube.sh build    only build the binaries (cached); print their dir
#
# Typical use:  eval "$(scripts/kube.sh up)"   (as root; idempotent)
#
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl
# v1.34.4 are compiled from the Go module proxy through a wrapper module and
# cached outside the clone under ${TRIAD_CACHE:-$HOME/.cache/triad}/kube,
# keyed by version and build recipe. etcd, containerd, runc and the CNI
# plugins come from Debian. The cluster's state (PKI, etcd, its own
# containerd, logs) lives in ${TRIAD_KUBE_STATE:-/var/tmp/triad-kube}.
# Every fix here is explained in docs/DECISIONS.md, "Kubernetes".
#
# Everything meant for eval goes to stdout; progress and errors go to stderr.
set -euo pipefail

# --- pins and layout ------------------------------------------------------
K8S_VERSION=${TRIAD_KUBE_VERSION:-1.34.4}
# The build recipe: change the tags, flags or binary list below and bump it.
RECIPE="triad-kube-build/1 cgo=0 tags=selinux,notest,grpcnotrace ldflags=-s,-w,version-x trimpath bins=apiserver,controller-manager,scheduler,kubelet,kubectl pause=gcc-static"
PAUSE_IMAGE=registry.k8s.io/pause:3.10.1

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${TRIAD_CACHE:-$HOME/.cache/triad}/kube
KDIR=$CACHE/k8s-v$K8S_VERSION
BIN=$KDIR/bin
STATE=${TRIAD_KUBE_STATE:-/var/tmp/triad-kube}
RUN=$STATE/run ETC=$STATE/etc LOGS=$STATE/logs
PKI=$ETC/pki
SOCK=$RUN/containerd/containerd.sock
API_PORT=${TRIAD_KUBE_API_PORT:-6443}
ETCD_PORT=23790 ETCD_PEER_PORT=23800
NODE=triad-kube
BRIDGE=triadk0 CNI_NET=triad-kube
POD_CIDR=10.244.0.0/24 SERVICE_CIDR=10.96.0.0/16
ISOLATION_COMMENT=triad-kube-pod-isolation
# Namespaces and identities are those of deploy/kubernetes; its test checks
# that these stay in step with the manifests.
KERNEL_NS=triad-kernels TRIAD_NS=triad TRIAD_SA=triad
BASE_MANIFESTS=(00-namespaces.yaml 10-rbac.yaml 12-runtimeclass.yaml 15-csidriver.yaml 20-networkpolicy.yaml)
COMPONENTS=(containerd csi-workdir etcd kube-apiserver kube-controller-manager kube-scheduler kubelet)
# Triad's seccomp profile as the kernel pods name it (a Localhost profile).
SECCOMP_PROFILE=triad-kernel.json

T0=$(date +%s.%N)
since() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1fs", b - a }'; }
log() { printf 'kube.sh: [%s] %s\n' "$(since)" "$*" >&2; }
die() { echo "kube.sh: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (the kubelet manages cgroups, mounts and network namespaces); run it with sudo"; }
K() { "$BIN/kubectl" --kubeconfig "$ETC/admin.kubeconfig" --request-timeout 30s "$@"; }
ctr_() { ctr --address "$SOCK" --namespace k8s.io "$@"; }
# has_image REF: our containerd has the image. (Not `| grep -q`: under
# pipefail, grep quitting early makes ctr die of SIGPIPE and the test fail.)
has_image() { ctr_ images ls -q | grep -xF "$1" >/dev/null; }

# with_lock FILE CMD...: run CMD holding an exclusive flock on FILE, so that
# two test runs never build or start the cluster at once.
with_lock() {
  local f=$1; shift
  mkdir -p "$(dirname "$f")"
  (
    flock 9
    "$@"
  ) 9>"$f"
}

# --- Debian packages -------------------------------------------------------
need_pkgs() {
  local want=(containerd runc etcd-server containernetworking-plugins gcc libc6-dev openssl iproute2 iptables curl util-linux) missing=() p
  for p in "${want[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  log "apt-get install ${missing[*]}"
  apt-get update -qq >/dev/null
  # No init system runs here, so the packages' services are not started;
  # etcd and containerd are started below with our own state and ports.
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# --- the Kubernetes binaries (cached) --------------------------------------
# recipe_key names what a cached build was made from.
recipe_key() { printf '%s\n%s\n' "v$K8S_VERSION" "$RECIPE" | sha256sum | cut -c1-16; }

cached() {
  local b
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
    [ -x "$BIN/$b" ] || return 1
  done
  [ -f "$KDIR/pause/pause.tar" ] && [ "$(cat "$KDIR/recipe" 2>/dev/null)" = "$(recipe_key)" ]
}

build() {
  cached && return
  with_lock "$CACHE/build.lock" build_locked
}

build_locked() {
  cached && return # another process built it while we waited
  command -v go >/dev/null || die "go is not on PATH; it is needed to build Kubernetes"
  command -v gcc >/dev/null || need_pkgs
  local mod=$CACHE/build/k8s-v$K8S_VERSION t0=$SECONDS
  rm -rf "$KDIR" "$mod"
  mkdir -p "$mod" "$KDIR/pause"
  export GOWORK=off GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
  log "wrapper module for k8s.io/kubernetes v$K8S_VERSION in $mod"
  # `go install k8s.io/kubernetes/cmd/kubelet@v…` refuses a module whose
  # go.mod has replace directives, and kubernetes replaces its 30-odd
  # k8s.io/* staging modules with ./staging paths. The wrapper module pins
  # each of them to its published v0.<minor>.<patch> instead.
  (cd "$mod" && go mod download "k8s.io/kubernetes@v$K8S_VERSION") >&2
  local kmod sv gov godebug modtime
  kmod=$(go env GOMODCACHE)/k8s.io/kubernetes@v$K8S_VERSION
  sv=v0.${K8S_VERSION#1.}
  gov=$(awk '$1 == "go" { print $2; exit }' "$kmod/go.mod")
  godebug=$(grep -E '^godebug ' "$kmod/go.mod" || true)
  {
    echo "module triad.local/k8sbuild"
    echo
    echo "go $gov"
    [ -n "$godebug" ] && echo "$godebug"
    echo
    echo "require k8s.io/kubernetes v$K8S_VERSION"
    echo
    echo "replace ("
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$kmod/go.mod" | awk -v sv="$sv" '{ print "\t" $1 " => " $1 " " sv }'
    echo ")"
  } >"$mod/go.mod"
  cat >"$mod/tools.go" <<'EOF'
//go:build tools

// Package k8sbuild only pins the commands `go mod tidy` must resolve.
package k8sbuild

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
EOF
  (cd "$mod" && go mod tidy) >&2
  # Without -X every component reports v0.0.0-master+$Format$. The build
  # date is the release's own time, so a rebuild gives the same binaries.
  modtime=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v$K8S_VERSION.info")
  local minor=${K8S_VERSION#1.} ld="-s -w" kv
  minor=${minor%%.*}
  for kv in "gitVersion=v$K8S_VERSION" gitMajor=1 "gitMinor=$minor" gitTreeState=clean "buildDate=$modtime"; do
    ld+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  local tmp=$KDIR/bin.partial
  mkdir -p "$tmp" "$LOGS"
  log "go build of 5 binaries (about 7 minutes on 2 cores the first time); log: $KDIR/build.log"
  # One go build for all five, so they share compiled packages.
  if ! (cd "$mod" && CGO_ENABLED=0 go build -p "${TRIAD_KUBE_BUILD_P:-2}" -trimpath -tags selinux,notest,grpcnotrace \
    -ldflags "$ld" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl) >"$KDIR/build.log" 2>&1; then
    tail -30 "$KDIR/build.log" >&2
    die "go build failed; see $KDIR/build.log"
  fi
  # The pause image: the kubelet no longer pulls it and no registry is
  # reachable, so containerd's sandbox_image is built from the pause.c that
  # ships in the kubernetes module, as a one-layer docker-archive.
  local p=$KDIR/pause
  mkdir -p "$p/root" "$p/archive"
  gcc -Os -Wall -Werror -static -DVERSION="v3.10.1-triad" -o "$p/root/pause" "$kmod/build/pause/linux/pause.c"
  strip "$p/root/pause"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$p/root" -cf "$p/archive/layer.tar" pause
  local diff
  diff=$(sha256sum "$p/archive/layer.tar" | cut -d' ' -f1)
  printf '{"architecture":"%s","os":"linux","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}\n' \
    "$(go env GOARCH)" "$diff" >"$p/archive/config.json"
  printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":["layer.tar"]}]\n' "$PAUSE_IMAGE" >"$p/archive/manifest.json"
  tar --owner=0 --group=0 --mtime=@0 -C "$p/archive" -cf "$p/pause.tar" layer.tar config.json manifest.json
  rm -rf "$p/root" "$p/archive"
  mv "$tmp" "$BIN"
  recipe_key >"$KDIR/recipe"
  log "built Kubernetes v$K8S_VERSION in $((SECONDS - t0))s: $BIN"
}

# --- PKI and kubeconfigs ---------------------------------------------------
host_ip() {
  local ip
  ip=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -1)
  [ -n "$ip" ] || ip=$(hostname -I | tr ' ' '\n' | grep -E '^[0-9.]+$' | grep -v '^127\.' | head -1)
  [ -n "$ip" ] || die "no non-loopback IPv4 address: the apiserver must advertise one"
  echo "$ip"
}

mk_cert() { # name CN O sans
  local n=$1 cn=$2 o=$3 sans=$4
  [ -f "$PKI/$n.crt" ] && return
  openssl genrsa -out "$PKI/$n.key" 2048 2>/dev/null
  openssl req -new -key "$PKI/$n.key" -subj "/CN=$cn${o:+/O=$o}" -out "$PKI/$n.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [ -n "$sans" ] && echo "subjectAltName=$sans"
  } >"$PKI/$n.ext"
  openssl x509 -req -in "$PKI/$n.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$PKI/$n.ext" -out "$PKI/$n.crt" 2>/dev/null
}

mk_kubeconfig() { # file user token [namespace]
  local f=$1
  cat >"$f.partial" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: triad-kube
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    token: $3
contexts:
- name: triad-kube
  context: {cluster: triad-kube, user: $2${4:+, namespace: $4}}
current-context: triad-kube
EOF
  chmod 600 "$f.partial"
  mv "$f.partial" "$f"
}

setup_pki() {
  mkdir -p "$PKI"
  if [ ! -f "$PKI/ca.crt" ]; then
    log "PKI in $PKI"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -out "$PKI/ca.crt" -days 3650 \
      -subj "/CN=triad-kube-ca" 2>/dev/null
  fi
  local ip
  ip=$(host_ip)
  mk_cert apiserver kube-apiserver "" \
    "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.96.0.1,IP:$ip"
  # The apiserver's client certificate for the kubelet's streaming endpoints
  # (exec, attach, port-forward, logs).
  mk_cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters ""
  mk_cert kubelet "$NODE" "" "DNS:$NODE,DNS:localhost,IP:127.0.0.1,IP:$ip"
  if [ ! -f "$PKI/sa.key" ]; then
    openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  fi
  if [ ! -f "$PKI/tokens.csv" ]; then
    local admin cm sched node
    admin=$(openssl rand -hex 16) cm=$(openssl rand -hex 16) sched=$(openssl rand -hex 16) node=$(openssl rand -hex 16)
    cat >"$PKI/tokens.csv.partial" <<EOF
$admin,admin,uid-admin,"system:masters"
$cm,system:kube-controller-manager,uid-kcm
$sched,system:kube-scheduler,uid-sched
$node,system:node:$NODE,uid-node,"system:nodes"
EOF
    chmod 600 "$PKI/tokens.csv.partial"
    mk_kubeconfig "$ETC/admin.kubeconfig" admin "$admin"
    mk_kubeconfig "$ETC/controller-manager.kubeconfig" system:kube-controller-manager "$cm"
    mk_kubeconfig "$ETC/scheduler.kubeconfig" system:kube-scheduler "$sched"
    mk_kubeconfig "$ETC/kubelet.kubeconfig" "system:node:$NODE" "$node"
    mv "$PKI/tokens.csv.partial" "$PKI/tokens.csv"
  fi
}

# --- processes -------------------------------------------------------------
# running NAME: its pid file names a live process whose command line mentions
# our state directory. The second check matters: pids are reused, and a
# stale pid file once pointed at an unrelated process.
running() {
  local p
  [ -f "$RUN/$1.pid" ] || return 1
  p=$(cat "$RUN/$1.pid")
  kill -0 "$p" 2>/dev/null && [[ "$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" == *"$STATE"* ]]
}

start() { # name cmd...
  local n=$1
  shift
  running "$n" && return
  log "starting $n (log: $LOGS/$n.log)"
  # 9>&-: the daemon must not inherit (and so hold forever) the flock on fd 9.
  setsid "$@" >>"$LOGS/$n.log" 2>&1 </dev/null 9>&- &
  echo $! >"$RUN/$n.pid"
}

# write_if_changed FILE: FILE gets stdin, but is left alone when it already
# holds exactly that: containerd reloads its CNI config on every write.
write_if_changed() {
  local new
  new=$(cat)
  [ -f "$1" ] && [ "$(cat "$1")" = "$new" ] && return
  printf '%s\n' "$new" >"$1.partial"
  mv "$1.partial" "$1"
}

wait_for() { # what timeout-seconds cmd...
  local what=$1 to=$2 i
  shift 2
  for ((i = 0; i < to * 5; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  die "$what was not ready after ${to}s; see $LOGS"
}

# --- containerd: our own, beside Docker's --------------------------------
start_containerd() {
  mkdir -p "$ETC/cni" "$RUN/containerd"
  write_if_changed "$ETC/containerd.toml" <<EOF
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
oom_score = 0
disabled_plugins = ["io.containerd.internal.v1.tracing", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  tolerate_missing_hugetlb_controller = true
  netns_mounts_under_state_dir = true
  # Root here has no CAP_SYS_RESOURCE, so runc cannot lower oom_score_adj to
  # the -998 containerd asks for sandboxes; clamp to containerd's own score.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$ETC/cni"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$RUN/runc"
    # gVisor (the "gvisor" RuntimeClass): scripts/gvisor.sh's shim and
    # runsc, with Triad's seccomp profile applied inside the sandbox too
    # (oci-seccomp) and no network but the sandbox's own loopback.
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$ETC/runsc.toml"
EOF
  write_if_changed "$ETC/runsc.toml" <<EOF
binary_name = "$GVISOR_BIN/runsc"
root = "$RUN/runsc"
[runsc_config]
  platform = "systrap"
  network = "none"
  oci-seccomp = "true"
EOF
  # Pods get an address on an isolated bridge and no route anywhere: no
  # gateway, no masquerade, so neither the apiserver nor the internet is
  # reachable from a pod (containerd 1.6 insists on an eth0 address).
  write_if_changed "$ETC/cni/10-$CNI_NET.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "$CNI_NET", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": false, "ipMasq": false, "hairpinMode": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "dataDir": "$RUN/cni-ipam"}}]}
EOF
  # Pod to pod on the bridge: bridged frames traverse iptables FORWARD only
  # through br_netfilter.
  modprobe br_netfilter 2>/dev/null || true
  [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ] ||
    sysctl -qw net.bridge.bridge-nf-call-iptables=1 ||
    die "net.bridge.bridge-nf-call-iptables is not 1 and cannot be set: pods on $BRIDGE could reach each other"
  iptables -C FORWARD -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "$ISOLATION_COMMENT" -j DROP 2>/dev/null ||
    iptables -I FORWARD -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "$ISOLATION_COMMENT" -j DROP
  # A containerd that runs with an older configuration (a cluster started
  # before gVisor was added, or with another runsc) is restarted; its
  # shims, and so the pods, keep running.
  shim_wrapper
  local key
  key=$(cat "$ETC/containerd.toml" "$ETC/runsc.toml" "$RUN/shim/containerd-shim-runsc-v1" | sha256sum | cut -c1-16)
  if running containerd && [ "$(cat "$RUN/containerd.key" 2>/dev/null)" != "$key" ]; then
    log "containerd's configuration changed; restarting it"
    stop containerd
  fi
  # The runsc shim is found on containerd's PATH, behind shim_wrapper.
  start containerd env PATH="$RUN/shim:$PATH" containerd --config "$ETC/containerd.toml"
  echo "$key" >"$RUN/containerd.key"
  wait_for containerd 30 ctr --address "$SOCK" version
  if ! has_image "$PAUSE_IMAGE"; then
    ctr_ images import "$KDIR/pause/pause.tar" >/dev/null
  fi
}

# shim_wrapper puts a containerd-shim-runsc-v1 on containerd's PATH that
# runs gVisor's and, for its "start" action, hands containerd 1.6 the
# address alone: gVisor's shim is built on containerd 2's shim library,
# whose start prints containerd 2's JSON bootstrap parameters, which
# containerd 1.6 (Debian 12's) would dial as an address. Every other action
# runs the shim unchanged.
shim_wrapper() {
  mkdir -p "$RUN/shim"
  write_if_changed "$RUN/shim/containerd-shim-runsc-v1" <<EOF
#!/bin/sh
case "\$*" in
*" start") out=\$("$GVISOR_BIN/containerd-shim-runsc-v1" "\$@") || exit
  printf '%s\\n' "\$out" | sed -n 's/^{.*"address":"\([^"]*\)".*}\$/\1/p; t; p' | tr -d '\\n' ;;
*) exec "$GVISOR_BIN/containerd-shim-runsc-v1" "\$@" ;;
esac
EOF
  chmod 755 "$RUN/shim/containerd-shim-runsc-v1"
}

# --- etcd and the control plane ------------------------------------------
start_etcd() {
  start etcd /usr/bin/etcd --name triad-kube --data-dir "$RUN/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "triad-kube=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync --quota-backend-bytes 2147483648
  wait_for etcd 30 curl -fsS "http://127.0.0.1:$ETCD_PORT/health"
}

start_control_plane() {
  local ip
  ip=$(host_ip)
  # Bound to loopback; --advertise-address must still be a real address and
  # the endpoint reconciler would publish it, so it is off.
  start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --secure-port "$API_PORT" --advertise-address "$ip" \
    --endpoint-reconciler-type none \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" --token-auth-file "$PKI/tokens.csv" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --allow-privileged=false --profiling=false
  wait_for kube-apiserver 120 K get --raw /readyz
  # Service-account credentials per controller, as kubeadm does: with one
  # shared identity the controllers hit RBAC errors.
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$ETC/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$ETC/controller-manager.kubeconfig" --authorization-kubeconfig "$ETC/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials=true --authentication-skip-lookup \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --allocate-node-cidrs=false --profiling=false
  start kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig "$ETC/scheduler.kubeconfig" \
    --authentication-kubeconfig "$ETC/scheduler.kubeconfig" --authorization-kubeconfig "$ETC/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false --profiling=false --authentication-skip-lookup
}

# --- Triad's CSI node plugin -------------------------------------------------
# start_csi_workdir runs `triad csi-workdir` (sandbox/kube/csi) as a host
# process beside the kubelet, as a DaemonSet would on a real cluster
# (deploy/kubernetes/README.md, "The nodes"): it gives each kernel pod a
# working directory of exactly its disk limit. A plugin built from other
# sources is restarted; pods keep their mounted volumes.
start_csi_workdir() {
  local bin=$RUN/bin/triad key
  mkdir -p "$RUN/bin" "$RUN/csi"
  (cd "$REPO" && go build -o "$bin.partial" ./cmd/triad) && mv "$bin.partial" "$bin"
  key=$(sha256sum "$bin" | cut -c1-16)
  if running csi-workdir && [ "$(cat "$RUN/csi-workdir.key" 2>/dev/null)" != "$key" ]; then
    log "triad csi-workdir changed; restarting it"
    stop csi-workdir
  fi
  start csi-workdir "$bin" csi-workdir --node "$NODE" --kubelet-dir "$RUN/kubelet" --state "$RUN/csi"
  echo "$key" >"$RUN/csi-workdir.key"
}

# --- kubelet ---------------------------------------------------------------
start_kubelet() {
  # The kubelet (protectKernelDefaults false) rewrites these; down puts the
  # originals back.
  [ -f "$RUN/sysctl.orig" ] ||
    sysctl -n vm.overcommit_memory kernel.panic kernel.panic_on_oops | paste -sd' ' >"$RUN/sysctl.orig"
  mkdir -p "$RUN/kubelet" "$RUN/pod-logs"
  # Whatever its --root-dir, the kubelet creates /var/lib/kubelet/device-plugins;
  # down removes the directory when it was not there before.
  if ! running kubelet && [ ! -e /var/lib/kubelet ]; then touch "$RUN/var-lib-kubelet.ours"; fi
  # oomScoreAdj 0: no CAP_SYS_RESOURCE here. failCgroupV1 false: this host is
  # cgroup v1 (1.34 defaults to false; 1.35 refuses v1 by default).
  # imageGCHighThresholdPercent 100: never collect the imported images, which
  # no registry could give back.
  write_if_changed "$ETC/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
failSwapOn: false
oomScoreAdj: 0
failCgroupV1: false
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
podLogsDir: $RUN/pod-logs
resolvConf: /etc/resolv.conf
serializeImagePulls: false
maxPods: 110
# Absolute floors, not percentages: on a large shared disk 2% can be gigabytes a CI's own
# build cache eats, and a DiskPressure taint then evicts the warm pool (DECISIONS "A test
# cluster on a shared disk").
evictionHard: {memory.available: 100Mi, nodefs.available: 1Gi, imagefs.available: 1Gi, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusReportFrequency: 10s
syncFrequency: 10s
fileCheckFrequency: 10s
EOF
  start kubelet "$BIN/kubelet" --config "$ETC/kubelet.yaml" --kubeconfig "$ETC/kubelet.kubeconfig" \
    --root-dir "$RUN/kubelet" --cert-dir "$PKI/kubelet-certs" --hostname-override "$NODE" --node-ip "$(host_ip)" --v=1
  wait_for "node $NODE Ready" 180 node_ready
}

node_ready() {
  [ "$(K get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

# --- the sandbox image ------------------------------------------------------
triad() { (cd "$REPO" && go run ./cmd/triad "$@"); }

# image_ref is the sandbox image as containerd names it: the tag Docker
# uses, normalized the way the kubelet resolves "triad-sandbox:<hash>".
image_ref() { echo "docker.io/library/$(triad image tag)"; }

import_image() {
  local ref
  ref=$(image_ref)
  has_image "$ref" && return
  log "importing $ref into the cluster's containerd (one layer, streamed from the cached root filesystem)"
  # triad image export builds the root filesystem first when it is not cached.
  triad image export --format docker-archive | ctr_ images import - >/dev/null
  has_image "$ref" || die "containerd did not keep $ref after the import"
}

# --- Triad's seccomp profile ------------------------------------------------
# install_seccomp puts Triad's seccomp profile, in the OCI form containerd
# reads, where the kubelet finds Localhost profiles (<root-dir>/seccomp).
install_seccomp() {
  local dir=$RUN/kubelet/seccomp
  mkdir -p "$dir"
  triad image seccomp | write_if_changed "$dir/$SECCOMP_PROFILE"
}

# --- namespaces, RBAC and Triad's identity ---------------------------------
manifests_key() { (cd "$REPO/deploy/kubernetes" && cat "${BASE_MANIFESTS[@]}") | sha256sum | cut -c1-16; }

apply_base() {
  local key
  key=$(manifests_key)
  if [ "$(cat "$RUN/manifests.key" 2>/dev/null)" != "$key" ] || ! K get ns "$KERNEL_NS" >/dev/null 2>&1; then
    log "applying ${BASE_MANIFESTS[*]} from deploy/kubernetes"
    local f args=()
    for f in "${BASE_MANIFESTS[@]}"; do args+=(-f "$REPO/deploy/kubernetes/$f"); done
    # Plain (client-side) apply, as an operator and the deploy test's
    # `kubectl apply --dry-run=server` do, so that they agree on ownership.
    # A retry covers the one race: the controller-manager may create the
    # kernels' default ServiceAccount between apply's get and its create.
    local out try
    for try in 1 2 3; do
      out=$(K apply "${args[@]}" 2>&1) && break
      [ $try = 3 ] && { echo "$out" >&2; die "kubectl apply of deploy/kubernetes failed"; }
      sleep 1
    done
    echo "$key" >"$RUN/manifests.key"
  fi
  # Tests run as Triad's own ServiceAccount, with exactly the deployed Role.
  # The token is bound to the ServiceAccount's uid: a recreated account
  # invalidates it, so check it and mint a new one when needed.
  if [ ! -f "$ETC/triad.kubeconfig" ] || ! KUBECONFIG="$ETC/triad.kubeconfig" "$BIN/kubectl" --request-timeout 10s auth can-i create pods -n "$KERNEL_NS" >/dev/null 2>&1; then
    local token
    token=$(K -n "$TRIAD_NS" create token "$TRIAD_SA" --duration 8760h)
    mk_kubeconfig "$ETC/triad.kubeconfig" "system:serviceaccount:$TRIAD_NS:$TRIAD_SA" "$token" "$KERNEL_NS"
  fi
}

# --- commands ----------------------------------------------------------------
print_env() {
  cat <<EOF
export KUBECONFIG=$ETC/triad.kubeconfig
export TRIAD_KUBECONFIG=$ETC/triad.kubeconfig
export TRIAD_KUBE_ADMIN_KUBECONFIG=$ETC/admin.kubeconfig
export TRIAD_KUBECTL=$BIN/kubectl
export TRIAD_KUBE_NAMESPACE=$KERNEL_NS
export TRIAD_KUBE_IMAGE=$(triad image tag)
export TRIAD_KUBE_RUNTIME_CLASS=gvisor
export TRIAD_KUBE_SECCOMP_PROFILE=$SECCOMP_PROFILE
export TRIAD_KUBE_WORK_DRIVER=workdir.triad.dev
export TRIAD_KUBE_CONTAINERD=$SOCK
EOF
}

cmd_up() {
  need_root "scripts/kube.sh up"
  need_pkgs
  build
  GVISOR_BIN=$("$REPO/scripts/gvisor.sh" install)
  with_lock "$CACHE/cluster.lock" up_locked
  log "cluster up in $(since): admin KUBECONFIG=$ETC/admin.kubeconfig, Triad's KUBECONFIG=$ETC/triad.kubeconfig, kubectl $BIN/kubectl"
  print_env
}

up_locked() {
  mkdir -p "$RUN" "$ETC" "$LOGS"
  setup_pki
  start_containerd
  start_etcd
  start_control_plane
  start_csi_workdir
  start_kubelet
  import_image
  install_seccomp
  apply_base
}

cmd_build() {
  build
  echo "$BIN"
}

cmd_status() {
  local ok=0 n
  for n in "${COMPONENTS[@]}"; do
    if running "$n"; then
      printf '%-24s running (pid %s)\n' "$n" "$(cat "$RUN/$n.pid")"
    else
      printf '%-24s stopped\n' "$n"
      ok=1
    fi
  done
  if [ $ok = 0 ] && [ -x "$BIN/kubectl" ] && node_ready; then
    printf '%-24s Ready\n' "node $NODE"
  else
    printf '%-24s not ready\n' "node $NODE"
    ok=1
  fi
  if [ $ok = 0 ] && has_image "$(image_ref)"; then
    printf '%-24s %s\n' "sandbox image" "$(image_ref)"
  else
    printf '%-24s missing\n' "sandbox image"
    ok=1
  fi
  return $ok
}

cmd_env() {
  [ -f "$ETC/triad.kubeconfig" ] || die "no cluster state in $STATE; run scripts/kube.sh up"
  print_env
}

# stop NAME...: SIGTERM the named components (pid files only), wait up to
# 15 s for them to exit, then SIGKILL what is left.
stop() {
  local n pids=() p i alive
  for n in "$@"; do
    if running "$n"; then
      p=$(cat "$RUN/$n.pid")
      log "stopping $n (pid $p)"
      kill -TERM "$p" 2>/dev/null || true
      pids+=("$p")
    fi
    rm -f "$RUN/$n.pid"
  done
  [ ${#pids[@]} -eq 0 ] && return
  for ((i = 0; i < 150; i++)); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && return
    sleep 0.1
  done
  for p in "${pids[@]}"; do
    kill -0 "$p" 2>/dev/null && { log "pid $p ignored SIGTERM; SIGKILL"; kill -KILL "$p" 2>/dev/null || true; }
  done
}

cmd_down() {
  need_root "scripts/kube.sh down"
  with_lock "$CACHE/cluster.lock" down_locked
  log "down"
}

down_locked() {
  # 1. Let the kubelet tear pods down (CNI DEL, unmounts) while it can.
  if running kube-apiserver && running kubelet && [ -x "$BIN/kubectl" ]; then
    local ns
    for ns in $(K get ns -o jsonpath='{.items[*].metadata.name}' 2>/dev/null); do
      K -n "$ns" delete pods --all --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
    done
    for ((i = 0; i < 60; i++)); do
      [ "$(ctr_ tasks ls -q 2>/dev/null | wc -l)" = 0 ] && break
      sleep 0.5
    done
  fi
  # 2. The control plane, then etcd.
  stop kubelet
  stop csi-workdir # after the kubelet, which unpublishes volumes as pods go
  if [ -f "$RUN/var-lib-kubelet.ours" ]; then rm -rf --one-file-system /var/lib/kubelet; fi
  stop kube-scheduler kube-controller-manager kube-apiserver
  stop etcd
  # 3. Whatever containers are left in our containerd, then containerd and
  # the shims it started (found by our socket in their command line).
  if running containerd; then
    local t c
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
    sleep 0.5
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$t" >/dev/null 2>&1 || true; done
    for c in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$c" >/dev/null 2>&1 || true; done
  fi
  stop containerd
  local pid
  for pid in $(pgrep -f "containerd-shim-run(c-v2|sc-v1) .*-address $SOCK" 2>/dev/null); do
    log "killing leftover shim $pid"
    kill -KILL "$pid" 2>/dev/null || true
  done
  # 4. Mounts under the state directory (volumes, overlay roots, netns),
  # deepest first.
  local m
  awk -v s="$STATE/" 'index($2, s) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  # 5. Network: the bridge (veth peers went with their netns), the isolation
  # rule, and libcni's result cache for our network.
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
  while iptables -D FORWARD -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "$ISOLATION_COMMENT" -j DROP 2>/dev/null; do :; done
  rm -f /var/lib/cni/results/"$CNI_NET"-* 2>/dev/null || true
  rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true # only when nothing else keeps results there
  # 6. The sysctls the kubelet changed.
  if [ -f "$RUN/sysctl.orig" ]; then
    local oc panic oops
    read -r oc panic oops <"$RUN/sysctl.orig"
    sysctl -qw vm.overcommit_memory="$oc" kernel.panic="$panic" kernel.panic_on_oops="$oops"
    log "restored vm.overcommit_memory=$oc kernel.panic=$panic kernel.panic_on_oops=$oops"
  fi
  # 7. The kubelet's pod cgroups (cgroupfs driver), deepest first.
  log "removing pod cgroups"
  local h
  for h in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [ -d "$h" ] && find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  # 8. The state itself; --one-file-system so that a mount missed above is
  # never followed.
  log "removing $STATE"
  rm -rf --one-file-system "$STATE"
}

main() {
  case "${1:-up}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  build) cmd_build ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
}
# One line, so that bash has read it all before main runs: editing this file
# while it runs cannot change what it does next.
main "$@"; exit
