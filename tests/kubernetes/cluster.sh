#!/usr/bin/env bash
# Brings up a real one-node Kubernetes on this machine, for Shoal's Kubernetes backend tests:
# etcd, kube-apiserver, kube-scheduler, kube-controller-manager and a kubelet built from the
# Go module proxy (cached by version), Debian's containerd and runc, and images made locally
# from this machine's files (no registry; pods use imagePullPolicy: Never).
#
#   tests/kubernetes/cluster.sh build    build the binaries into the cache (once per version)
#   tests/kubernetes/cluster.sh up       start (idempotent; restarts a half-up cluster); the last
#                                        line printed is KUBECONFIG=<path>
#   tests/kubernetes/cluster.sh down     stop everything it started and remove its mounts,
#                                        network namespaces, bridge and route (idempotent)
#   tests/kubernetes/cluster.sh status   exit 0 only if the node is Ready
#   tests/kubernetes/cluster.sh kubectl ARGS...
#                                        the cluster's own kubectl (v1.37.2) on its kubeconfig
#   tests/kubernetes/cluster.sh node-down
#   tests/kubernetes/cluster.sh node-up  stop / start the node's kubelet, for tests of a lost
#                                        node (its containers keep running, as on a node cut
#                                        off); node-up waits until the node is Ready again
#   tests/kubernetes/cluster.sh import NAME ARCHIVE
#                                        import an OCI archive as image NAME into the running
#                                        cluster's containerd, unless it holds that archive
#                                        already; fails, saying so, when the disk cannot take it
#
# Environment: SHOAL_KUBERNETES_DIR (state directory, default /tmp/shoal-kubernetes),
#              SHOAL_KUBERNETES_CACHE (binaries and images, default /var/cache/shoal/kubernetes),
#              SHOAL_BIN (a shoal binary: `up` also builds and imports localhost/shoal-agent:latest).
# Needs root, Go >= 1.26 at /usr/local/go to build. See docs/backends/kubernetes-test-cluster.md.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
K8S_VERSION=1.37.2
ETCD_VERSION=3.6.16
GO=/usr/local/go/bin/go
GO_MIN_MINOR=26
CACHE=$(realpath -m "${SHOAL_KUBERNETES_CACHE:-/var/cache/shoal/kubernetes}")
DIR=$(realpath -m "${SHOAL_KUBERNETES_DIR:-/tmp/shoal-kubernetes}")
KUBECONFIG_FILE=$DIR/pki/admin.kubeconfig
IMAGE_CACHE=$CACHE/images
CONTAINERD_STATE=/run/shoal-kubernetes-containerd
CONTAINERD_SOCK=$CONTAINERD_STATE/containerd.sock
BRIDGE=shoalk8s0
POD_CIDR=10.244.0.0/24
POD_NET_PREFIX=10.244.0.
BRIDGE_ADDR=10.244.0.1
BRIDGE_MAC=02:53:48:4f:41:4c   # locally administered, fixed: see start_network
SERVICE_CIDR=10.96.0.0/24
API_SERVICE_ADDR=10.96.0.1   # the `kubernetes` Service: what in-cluster clients are told
API_PORT=6443
# Our iptables chains (filter: who may reach the apiserver; nat: the kubernetes Service).
API_FILTER_CHAIN=SHOAL-K8S-API
API_NAT_CHAIN=SHOAL-K8S-SERVICE
PODS_FORWARD_CHAIN=SHOAL-K8S-PODS
PYTHON_PACKAGES=(python3 python3-torch python3-sklearn python3-numpy)
DAEMONS=(etcd kube-apiserver kube-scheduler kube-controller-manager containerd kubelet)
PACKAGES=(containerd runc containernetworking-plugins busybox-static openssl iproute2 patchelf curl)

log() { echo "kubernetes-cluster: $*"; }
die() { echo "kubernetes-cluster: error: $*" >&2; exit 1; }

require_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (containerd, network namespaces, mounts)"
}

# ---------------------------------------------------------------------------------------
# Binaries, cached under $CACHE/v<k8s>-etcd<etcd>-<go version>/bin
# ---------------------------------------------------------------------------------------

go_version() {
  [ -x "$GO" ] || die "Go >= 1.$GO_MIN_MINOR is needed at $GO to build Kubernetes (Debian's Go is too old); install it from https://go.dev/dl/"
  local v
  v=$("$GO" env GOVERSION) || die "$GO env GOVERSION failed"
  local minor=${v#go1.}
  minor=${minor%%.*}
  case "$minor" in '' | *[!0-9]*) die "cannot read Go's version from '$v' ($GO)" ;; esac
  ((minor >= GO_MIN_MINOR)) || die "Go >= 1.$GO_MIN_MINOR is needed at $GO, found $v"
  echo "$v"
}

# The cached bin directory for the Go at $GO; without Go, any cached build of these versions.
bin_dir() {
  if [ -x "$GO" ]; then
    echo "$CACHE/v$K8S_VERSION-etcd$ETCD_VERSION-$(go_version)/bin"
    return
  fi
  local d
  for d in "$CACHE/v$K8S_VERSION-etcd$ETCD_VERSION-"go*/bin; do
    if binaries_present "$d"; then echo "$d"; return; fi
  done
  go_version >/dev/null  # dies with the message saying what is missing
}

binaries_present() {
  local b
  for b in "${DAEMONS[@]}" kubectl; do
    [ "$b" = containerd ] && continue
    [ -x "$1/$b" ] || return 1
  done
}

# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces the staging modules
# (k8s.io/api, ...) with ./staging/ folders that its module zip lacks. A wrapper module that
# requires it and points each staging module at its published v0.<minor>.<patch> builds it.
cmd_build() {
  local bin
  bin=$(bin_dir)
  if binaries_present "$bin"; then
    log "binaries cached in $bin"
    return 0
  fi
  local gov
  gov=$(go_version)
  log "building Kubernetes v$K8S_VERSION and etcd v$ETCD_VERSION with $gov into $bin (about 6 minutes on 2 cores)"
  local t0=$SECONDS work
  work=$(mktemp -d)
  # shellcheck disable=SC2064 # expand now: $work is local
  trap "rm -rf '$work'" EXIT
  mkdir -p "$work/kubernetes" "$work/etcd" "$work/bin"
  local module_dir
  module_dir=$("$GO" mod download -json "k8s.io/kubernetes@v$K8S_VERSION" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])') ||
    die "cannot download k8s.io/kubernetes@v$K8S_VERSION from the Go module proxy"
  local staging_version=0.${K8S_VERSION#1.} minor
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  {
    printf 'module shoal.test/kubernetes\n\ngo 1.%s.0\n\nrequire k8s.io/kubernetes v%s\n\n' \
      "$GO_MIN_MINOR" "$K8S_VERSION"
    # tool lines keep `go mod tidy` from dropping what only `go build` below uses.
    printf 'tool (\n'
    for c in kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl; do
      printf '\tk8s.io/kubernetes/cmd/%s\n' "$c"
    done
    printf ')\n\nreplace (\n'
    awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$module_dir/go.mod" | sort -u |
      while read -r m; do printf '\t%s => %s v%s\n' "$m" "$m" "$staging_version"; done
    printf ')\n'
  } >"$work/kubernetes/go.mod"
  (cd "$work/kubernetes" && "$GO" mod tidy) || die "go mod tidy failed for the Kubernetes wrapper module"
  local version_pkg=k8s.io/component-base/version client_pkg=k8s.io/client-go/pkg/version
  # The servers and kubectl compare versions: stamp the real one, not v0.0.0-master.
  local ldflags="-s -w -X $version_pkg.gitVersion=v$K8S_VERSION -X $version_pkg.gitMajor=1"
  ldflags+=" -X $version_pkg.gitMinor=$minor -X $version_pkg.gitTreeState=clean"
  ldflags+=" -X $client_pkg.gitVersion=v$K8S_VERSION -X $client_pkg.gitMajor=1"
  ldflags+=" -X $client_pkg.gitMinor=$minor"
  (cd "$work/kubernetes" && CGO_ENABLED=0 "$GO" build -p 2 -trimpath -ldflags "$ldflags" -o "$work/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kubectl) || die "go build of Kubernetes v$K8S_VERSION failed"
  # etcd's server module's root package is its main package.
  printf 'module shoal.test/etcd\n\ngo 1.%s.0\n\nrequire go.etcd.io/etcd/server/v3 v%s\n\ntool go.etcd.io/etcd/server/v3\n' \
    "$GO_MIN_MINOR" "$ETCD_VERSION" >"$work/etcd/go.mod"
  (cd "$work/etcd" && "$GO" mod tidy && CGO_ENABLED=0 "$GO" build -p 2 -trimpath -ldflags "-s -w" \
    -o "$work/bin/etcd" go.etcd.io/etcd/server/v3) || die "go build of etcd v$ETCD_VERSION failed"
  # Into place only when complete, so an interrupted build is never taken for a cached one.
  mkdir -p "$bin"
  local b
  for b in "$work"/bin/*; do mv -f "$b" "$bin/"; done
  rm -rf "$work"
  trap - EXIT
  log "built in $((SECONDS - t0)) s: $(du -sh "$bin" | cut -f1) in $bin"
}

# ---------------------------------------------------------------------------------------
# Processes: only those this script started, found by their pid files
# ---------------------------------------------------------------------------------------

pid_alive() {
  [ -n "${1:-}" ] || return 1
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# The pid in $DIR/pid/NAME, if that process is still the NAME we started (pids get reused).
daemon_pid() {
  local file=$DIR/pid/$1 pid argv0
  [ -s "$file" ] || return 1
  pid=$(tr -dc '0-9' <"$file")
  pid_alive "$pid" || return 1
  # argv[0], not /proc/PID/exe: `status` works without root.
  argv0=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n 1) || return 1
  [ "$(basename "$argv0")" = "$1" ] || return 1
  echo "$pid"
}

start_daemon() {
  local name=$1
  shift
  # setsid: a Ctrl-C in the shell that ran `up` must not reach the cluster. 9>&-: the daemon
  # must not inherit (and so hold forever) the lock of take_lock.
  setsid "$@" >"$DIR/log/$name.log" 2>&1 </dev/null 9>&- &
  echo $! >"$DIR/pid/$name"
}

stop_daemon() {
  local name=$1 pid
  if pid=$(daemon_pid "$name"); then
    kill "$pid" 2>/dev/null || true
    local _
    for _ in $(seq 40); do pid_alive "$pid" || break; sleep 0.25; done
    if pid_alive "$pid"; then
      log "$name (pid $pid) did not stop on SIGTERM; killing it"
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$DIR/pid/$name"
}

wait_for() {
  local what=$1 tries=$2
  shift 2
  local _
  for _ in $(seq "$tries"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  fail "timed out after $((tries / 2)) s waiting for $what"
}

fail() {
  echo "kubernetes-cluster: error: $*" >&2
  local name
  for name in "${DAEMONS[@]}"; do
    [ -f "$DIR/log/$name.log" ] || continue
    echo "--- last lines of $DIR/log/$name.log" >&2
    tail -n 8 "$DIR/log/$name.log" >&2
  done
  exit 1
}

kubectl_() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
ctr_() { ctr -a "$CONTAINERD_SOCK" -n k8s.io "$@"; }

healthy() {
  local name
  for name in "${DAEMONS[@]}"; do daemon_pid "$name" >/dev/null || return 1; done
  kubectl_ get --raw /readyz >/dev/null 2>&1 || return 1
  [ "$(kubectl_ get node localhost -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

take_lock() {
  local lock=/run/lock/shoal-kubernetes-cluster.lock
  [ -d /run/lock ] || lock=/tmp/shoal-kubernetes-cluster.lock
  exec 9>"$lock"
  if ! flock -n 9; then
    log "waiting for another cluster.sh up/down to finish ($lock)"
    flock -w 900 9 || die "timed out waiting for $lock"
  fi
}

check_packages() {
  local missing=() p
  for p in "${PACKAGES[@]}" "${PYTHON_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] || die "missing Debian packages: ${missing[*]} (setup.sh installs them: apt-get install ${missing[*]})"
}

# ---------------------------------------------------------------------------------------
# up
# ---------------------------------------------------------------------------------------

make_pki() {
  local p=$DIR/pki
  [ -s "$KUBECONFIG_FILE" ] && return 0
  mkdir -p "$p"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$p/ca.key" -subj /CN=shoal-test-ca -days 3650 \
    -out "$p/ca.crt" 2>/dev/null
  # name, subject, extensions
  cert() {
    openssl req -newkey rsa:2048 -nodes -keyout "$p/$1.key" -subj "$2" -out "$p/$1.csr" 2>/dev/null
    printf '%b' "$3" >"$p/$1.ext"
    openssl x509 -req -in "$p/$1.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 3650 \
      -extfile "$p/$1.ext" -out "$p/$1.crt" 2>/dev/null
  }
  # The service's first address and the bridge's, for clients inside pods.
  local names="DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  cert apiserver /CN=kube-apiserver \
    "subjectAltName=IP:127.0.0.1,IP:$API_SERVICE_ADDR,IP:$BRIDGE_ADDR,$names\nextendedKeyUsage=serverAuth\n"
  cert kubelet /CN=localhost 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n'
  # system:masters: the admin identity every component and test uses here.
  cert admin /CN=admin/O=system:masters 'extendedKeyUsage=clientAuth\n'
  openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
  openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
  cat >"$KUBECONFIG_FILE.partial" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: shoal-test
  cluster: {certificate-authority: $p/ca.crt, server: "https://127.0.0.1:$API_PORT"}
users:
- name: admin
  user: {client-certificate: $p/admin.crt, client-key: $p/admin.key}
contexts:
- name: shoal-test
  context: {cluster: shoal-test, user: admin}
current-context: shoal-test
EOF
  mv "$KUBECONFIG_FILE.partial" "$KUBECONFIG_FILE"
}

# The bridge exists before the apiserver, which pods reach on it. No kube-proxy: of the Service
# range only the kubernetes Service ($API_SERVICE_ADDR:443, what in-cluster clients use) is
# forwarded, to the apiserver; packets to any other ClusterIP are dropped on this machine.
start_network() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge || fail "cannot create the bridge $BRIDGE"
  fi
  # A bridge without an address of its own takes the lowest of its ports' MAC addresses, which
  # changes as pods come and go; the pods' ARP entries for their gateway then point at the old
  # one and their traffic to this machine is dropped until the entry expires (seen: agents
  # silent for 20-30 s right after another pod started or stopped). A fixed one never changes.
  ip link set "$BRIDGE" address "$BRIDGE_MAC"
  ip addr replace "$BRIDGE_ADDR/${POD_CIDR#*/}" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  ip route replace blackhole "$SERVICE_CIDR"
  # Locally sent packets are routed before the nat OUTPUT hook: not into the blackhole.
  ip route replace "$API_SERVICE_ADDR/32" dev "$BRIDGE"
  remove_iptables_rules
  iptables -N "$API_FILTER_CHAIN"
  iptables -A "$API_FILTER_CHAIN" -i lo -j RETURN
  iptables -A "$API_FILTER_CHAIN" -i "$BRIDGE" -j RETURN
  iptables -A "$API_FILTER_CHAIN" -j DROP
  iptables -I INPUT -p tcp --dport "$API_PORT" -j "$API_FILTER_CHAIN"
  iptables -t nat -N "$API_NAT_CHAIN"
  iptables -t nat -A "$API_NAT_CHAIN" -d "$API_SERVICE_ADDR/32" -p tcp --dport 443 \
    -j DNAT --to-destination "$BRIDGE_ADDR:$API_PORT"
  iptables -t nat -I PREROUTING -d "$SERVICE_CIDR" -j "$API_NAT_CHAIN"
  iptables -t nat -I OUTPUT -d "$SERVICE_CIDR" -j "$API_NAT_CHAIN"
  # Pods have a default route to this machine (their node), so they reach any of its
  # addresses, as pods reach their node on a real cluster (a master beside the client listens
  # on the machine's own address). Whatever they send beyond it is dropped here: nothing is
  # routed off the machine.
  iptables -N "$PODS_FORWARD_CHAIN"
  iptables -A "$PODS_FORWARD_CHAIN" -d "$POD_CIDR" -j RETURN
  iptables -A "$PODS_FORWARD_CHAIN" -j DROP
  iptables -I FORWARD -s "$POD_CIDR" -j "$PODS_FORWARD_CHAIN"
}

# Ours, and those the kubelet made (it has no flag to make none); each only if present.
remove_iptables_rules() {
  command -v iptables >/dev/null || return 0
  while iptables -D INPUT -p tcp --dport "$API_PORT" -j "$API_FILTER_CHAIN" 2>/dev/null; do :; done
  while iptables -t nat -D PREROUTING -d "$SERVICE_CIDR" -j "$API_NAT_CHAIN" 2>/dev/null; do :; done
  while iptables -t nat -D OUTPUT -d "$SERVICE_CIDR" -j "$API_NAT_CHAIN" 2>/dev/null; do :; done
  while iptables -D FORWARD -s "$POD_CIDR" -j "$PODS_FORWARD_CHAIN" 2>/dev/null; do :; done
  iptables -F "$PODS_FORWARD_CHAIN" 2>/dev/null && iptables -X "$PODS_FORWARD_CHAIN"
  iptables -F "$API_FILTER_CHAIN" 2>/dev/null && iptables -X "$API_FILTER_CHAIN"
  iptables -t nat -F "$API_NAT_CHAIN" 2>/dev/null && iptables -t nat -X "$API_NAT_CHAIN"
  local tool table chain
  for tool in iptables ip6tables; do
    command -v "$tool" >/dev/null || continue
    while "$tool" -D INPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    while "$tool" -D OUTPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    for table in filter nat mangle; do
      for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
        "$tool" -t "$table" -F "$chain" 2>/dev/null && "$tool" -t "$table" -X "$chain" 2>/dev/null
      done
    done
  done
  return 0
}

start_control_plane() {
  local p=$DIR/pki kc=$KUBECONFIG_FILE
  start_daemon etcd "$BIN/etcd" --name shoal-test --data-dir "$DIR/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster shoal-test=http://127.0.0.1:2380 --unsafe-no-fsync
  wait_for etcd 60 curl -sf http://127.0.0.1:2379/health
  # It listens on every address (one --bind-address only) for the loopback and the pods on the
  # bridge; $API_FILTER_CHAIN drops the rest. --endpoint-reconciler-type=none: there is no
  # kube-proxy to use the endpoints, and the default reconciler refuses some addresses.
  # Hostname first: the node is named localhost and its kubelet listens on 127.0.0.1.
  start_daemon kube-apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --secure-port="$API_PORT" --advertise-address="$BRIDGE_ADDR" \
    --endpoint-reconciler-type=none --service-cluster-ip-range="$SERVICE_CIDR" \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" --client-ca-file="$p/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$p/sa.pub" \
    --service-account-signing-key-file="$p/sa.key" --authorization-mode=Node,RBAC \
    --kubelet-client-certificate="$p/admin.crt" --kubelet-client-key="$p/admin.key" \
    --kubelet-certificate-authority="$p/ca.crt" --kubelet-preferred-address-types=Hostname,InternalIP
  wait_for kube-apiserver 240 kubectl_ get --raw /readyz
  start_daemon kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$kc" --authentication-kubeconfig="$kc" \
    --authorization-kubeconfig="$kc" --bind-address=127.0.0.1 --leader-elect=false
  start_daemon kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$kc" \
    --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" --bind-address=127.0.0.1 \
    --leader-elect=false --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
    --cluster-signing-cert-file="$p/ca.crt" --cluster-signing-key-file="$p/ca.key" \
    --use-service-account-credentials=true --service-cluster-ip-range="$SERVICE_CIDR"
}

start_containerd() {
  mkdir -p "$DIR/cni/net.d"
  cat >"$DIR/containerd.toml" <<EOF
version = 2
root = "$DIR/containerd"
state = "$CONTAINERD_STATE"
[grpc]
  address = "$CONTAINERD_SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:test"
  # Without CAP_SYS_RESOURCE (as in some sandboxes) runc cannot lower oom_score_adj, and every
  # pod sandbox fails with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni/net.d"
EOF
  # Pods' default route is this machine (their node): they reach its addresses, the other pods
  # and the Service range (where only the kubernetes Service answers); the FORWARD rule above
  # drops anything beyond.
  cat >"$DIR/cni/net.d/10-shoal.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "shoal-test", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "isDefaultGateway": true,
   "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$BRIDGE_ADDR"}]],
            "routes": [{"dst": "$SERVICE_CIDR"}], "dataDir": "$DIR/cni/ipam"}},
  {"type": "loopback"}]}
EOF
  start_daemon containerd /usr/bin/containerd --config "$DIR/containerd.toml"
  wait_for containerd 60 ctr_ version
}

# Imports ARCHIVE unless this containerd already holds it (containerd's data lives in $DIR).
import_image() {
  local name=$1 archive=$2 mark
  mark=$DIR/images/$(echo "$name" | tr '/:' '__')
  if [ "$(cat "$mark" 2>/dev/null)" = "$archive" ] && ctr_ images ls -q | grep -Fx "$name" >/dev/null; then
    return 0
  fi
  # Its blobs and its unpacked layers, above the kubelet's 1 % eviction threshold: below it the
  # node reports DiskPressure and no pod is scheduled, which no test would say.
  local size need free
  size=$(stat -c %s "$archive")
  need=$(( 2 * size + $(df -P -B1 "$DIR" | awk 'NR == 2 {print $2}') / 100 + 512 * 1024 * 1024 ))
  free=$(df -P -B1 "$DIR" | awk 'NR == 2 {print $4}')
  [ "$free" -ge "$need" ] || fail "importing $archive ($((size / 1000000)) MB) needs $((need / 1000000)) MB free under $DIR, $((free / 1000000)) MB are: free some space"
  local t0=$SECONDS
  ctr_ images import "$archive" >/dev/null || fail "ctr images import $archive failed"
  echo "$archive" >"$mark"
  log "imported $name ($(du -m "$archive" | cut -f1) MB) in $((SECONDS - t0)) s"
}

import_images() {
  mkdir -p "$DIR/images"
  local archive
  archive=$(python3 "$HERE/images.py" pause localhost/pause:test "$IMAGE_CACHE") || fail "building the pause image failed"
  import_image localhost/pause:test "$archive"
  archive=$(python3 "$HERE/images.py" busybox localhost/busybox:test "$IMAGE_CACHE") || fail "building the busybox image failed"
  import_image localhost/busybox:test "$archive"
  archive=$(python3 "$HERE/images.py" debian localhost/shoal-python:test "$IMAGE_CACHE" "${PYTHON_PACKAGES[@]}") ||
    fail "building the python image failed"
  import_image localhost/shoal-python:test "$archive"
  [ -n "${SHOAL_BIN:-}" ] && import_agent_image
  return 0
}

# localhost/shoal-agent:latest from $SHOAL_BIN, rebuilt when the binary, the SDK or the tool
# changed (keyed on the binary's size and mtime, the others' contents).
import_agent_image() {
  [ -x "$SHOAL_BIN" ] || fail "SHOAL_BIN=$SHOAL_BIN is not an executable file"
  local key archive
  key=$({
    stat -L -c '%s %Y %n' "$SHOAL_BIN"
    cat "$REPO/tools/kubernetes/agent_image.py" "$REPO/tools/kubernetes/oci_archive.py"
    find "$REPO/sdk/python/shoal" -name '*.py' -type f | sort | xargs cat
  } | sha256sum | cut -c1-16)
  archive=$IMAGE_CACHE/shoal-agent-latest-$key.tar
  if [ ! -s "$archive" ]; then
    local t0=$SECONDS
    # Only the newest agent archive is kept: a developer rebuilds shoal often.
    rm -f "$IMAGE_CACHE"/shoal-agent-latest-*.tar
    python3 "$REPO/tools/kubernetes/agent_image.py" --shoal "$SHOAL_BIN" \
      --sdk "$REPO/sdk/python/shoal" --image localhost/shoal-agent:latest --output "$archive" >/dev/null ||
      fail "building the agent image from $SHOAL_BIN failed"
    log "built localhost/shoal-agent:latest from $SHOAL_BIN in $((SECONDS - t0)) s"
  fi
  import_image localhost/shoal-agent:latest "$archive"
}

start_kubelet() {
  local p=$DIR/pki
  cat >"$DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This kernel mounts cgroup v1 (v2 only at /sys/fs/cgroup/unified); kubelet >= 1.35 refuses v1
# unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
address: 127.0.0.1
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: $p/ca.crt}}
authorization: {mode: Webhook}
tlsCertFile: $p/kubelet.crt
tlsPrivateKeyFile: $p/kubelet.key
failSwapOn: false
podLogsDir: $DIR/pod-logs
resolvConf: /etc/resolv.conf
enforceNodeAllocatable: []
# A test machine's disk is often fuller than the defaults allow; never evict or collect images.
evictionHard: {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
  # The kubelet refuses a loopback node IP: the node is named localhost and the apiserver
  # reaches it through that name (--kubelet-preferred-address-types=Hostname,...).
  start_daemon kubelet "$BIN/kubelet" --config="$DIR/kubelet.yaml" --kubeconfig="$KUBECONFIG_FILE" \
    --hostname-override=localhost --root-dir="$DIR/kubelet"
}

cmd_up() {
  require_root
  take_lock
  BIN=$(bin_dir)
  if [ -s "$KUBECONFIG_FILE" ] && binaries_present "$BIN" && healthy; then
    import_images
    log "already up and healthy"
    echo "KUBECONFIG=$KUBECONFIG_FILE"
    return 0
  fi
  check_packages
  local t0=$SECONDS
  if [ -d "$DIR/pid" ] && [ -n "$(ls -A "$DIR/pid" 2>/dev/null)" ]; then
    log "half up (a daemon is missing or the node is not Ready): starting over"
    stop_cluster
  fi
  cmd_build
  BIN=$(bin_dir)
  mkdir -p "$DIR"/{log,pid,images}
  make_pki
  start_network
  start_control_plane
  start_containerd
  import_images
  start_kubelet
  wait_for "node localhost to be Ready" 240 kubectl_ wait --for=condition=Ready node/localhost --timeout=1s
  wait_for "the default service account" 120 kubectl_ get serviceaccount default
  log "up in $((SECONDS - t0)) s"
  echo "KUBECONFIG=$KUBECONFIG_FILE"
}

# ---------------------------------------------------------------------------------------
# down
# ---------------------------------------------------------------------------------------

stop_containers() {
  [ -S "$CONTAINERD_SOCK" ] && daemon_pid containerd >/dev/null || return 0
  local t
  for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
  local _
  for _ in $(seq 20); do
    [ -z "$(ctr_ tasks ls -q 2>/dev/null | head -1)" ] && break
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$t" >/dev/null 2>&1 || true; done
    sleep 0.25
  done
  local c
  for c in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$c" >/dev/null 2>&1 || true; done
}

# Shims our containerd started outlive it; they are ours when they name our socket.
stop_shims() {
  local pid args
  for pid in $(pgrep -f -- "-address $CONTAINERD_SOCK" || true); do
    args=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
    case "$args" in *containerd-shim*"-address $CONTAINERD_SOCK"*) kill -9 "$pid" 2>/dev/null || true ;; esac
  done
}

stop_cluster() {
  # kwok (tests/kubernetes/kwok.sh), if started: its fake nodes go with etcd's data below.
  stop_daemon kwok
  # The kubelet first, so that it restarts nothing we stop below.
  stop_daemon kubelet
  stop_containers
  stop_daemon containerd
  stop_shims
  local name
  for name in kube-controller-manager kube-scheduler kube-apiserver etcd; do stop_daemon "$name"; done
  # The kubelet bind-mounts its root dir and mounts each pod's volumes; containerd mounts
  # snapshots and each sandbox's /dev/shm. Deepest first.
  local mounts
  mounts=$(awk -v d="$DIR" -v s="$CONTAINERD_STATE" '
      index($2, d "/") == 1 || $2 == d || index($2, s "/") == 1 || $2 == s {print $2}' /proc/mounts | sort -r)
  local m
  for m in $mounts; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  # The pod network namespaces: those holding an address of our pod network.
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do
    if ip -n "$ns" -4 addr show 2>/dev/null | grep -F "inet $POD_NET_PREFIX" >/dev/null; then
      ip netns delete "$ns" 2>/dev/null || true
    fi
  done
  ip link delete "$BRIDGE" 2>/dev/null || true
  ip route del blackhole "$SERVICE_CIDR" 2>/dev/null || true
  ip route del "$API_SERVICE_ADDR/32" 2>/dev/null || true
  remove_iptables_rules
  # The kubelet's pod cgroups (cgroupfs driver), empty once the containers are gone.
  local cg
  for cg in /sys/fs/cgroup/*/kubepods; do
    [ -d "$cg" ] && find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  rm -rf "$CONTAINERD_STATE"
  [ -d "$DIR" ] && rm -rf "${DIR:?}"/{pid,containerd,kubelet,etcd,cni,images,pod-logs}
}

cmd_down() {
  require_root
  take_lock
  stop_cluster
  log "down (logs kept in $DIR/log)"
}

cmd_status() {
  BIN=$(bin_dir)
  if [ -e "$DIR/pki/admin.key" ] && [ ! -r "$DIR/pki/admin.key" ]; then
    die "cannot read $DIR/pki/admin.key, the cluster's admin credentials: run as root"
  fi
  if [ -s "$KUBECONFIG_FILE" ] && binaries_present "$BIN" && healthy; then
    log "up: node localhost Ready"
    echo "KUBECONFIG=$KUBECONFIG_FILE"
    return 0
  fi
  local missing=() name
  for name in "${DAEMONS[@]}"; do daemon_pid "$name" >/dev/null || missing+=("$name"); done
  if [ ${#missing[@]} -gt 0 ]; then
    log "down (not running: ${missing[*]})"
  else
    log "not healthy (apiserver not ready or node localhost not Ready)"
  fi
  return 1
}

usage() {
  awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"
  exit 2
}

cmd_node_down() {
  require_root
  take_lock
  daemon_pid kubelet >/dev/null || die "the kubelet is not running"
  stop_daemon kubelet
  log "kubelet stopped: node localhost no longer reports"
}

cmd_node_up() {
  require_root
  take_lock
  BIN=$(bin_dir)
  daemon_pid kubelet >/dev/null || start_kubelet
  wait_for "node localhost to be Ready" 120 kubectl_ wait --for=condition=Ready node/localhost --timeout=1s
  log "kubelet running: node localhost Ready"
}

case "${1:-}" in
  build) [ $# -eq 1 ] || die "build takes no arguments"; cmd_build ;;
  up) [ $# -eq 1 ] || die "up takes no arguments"; cmd_up ;;
  down) [ $# -eq 1 ] || die "down takes no arguments"; cmd_down ;;
  status) [ $# -eq 1 ] || die "status takes no arguments"; cmd_status ;;
  node-down) [ $# -eq 1 ] || die "node-down takes no arguments"; cmd_node_down ;;
  node-up) [ $# -eq 1 ] || die "node-up takes no arguments"; cmd_node_up ;;
  import)
    [ $# -eq 3 ] || die "import takes an image NAME and its ARCHIVE"
    require_root
    [ -f "$3" ] || die "no image archive at $3"
    mkdir -p "$DIR/images"
    import_image "$2" "$3"
    ;;
  kubectl)
    shift
    BIN=$(bin_dir)
    binaries_present "$BIN" || die "no kubectl in $BIN: run $0 build"
    exec "$BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"
    ;;
  -h | --help | help | '') usage ;;
  *) die "unknown command '$1' (build|up|down|status|kubectl|node-down|node-up|import)" ;;
esac
