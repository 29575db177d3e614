#!/usr/bin/env bash
# Fake nodes on the test cluster (tests/kubernetes/cluster.sh), for scale tests without real
# machines: kwok (sigs.k8s.io/kwok, built from the Go module proxy and cached by version) runs
# against the cluster's apiserver and plays the kubelet of every node labelled type=kwok: it
# keeps them Ready and marks the pods bound to them Running without running anything.
#
#   tests/kubernetes/kwok.sh build    build kwok into the cache (once per version)
#   tests/kubernetes/kwok.sh up       start kwok (idempotent) and make $SHOAL_KWOK_NODES fake
#                                     nodes (default 100), kwok-node-0 ... kwok-node-<N-1>
#   tests/kubernetes/kwok.sh nodes N  make exactly N fake nodes (adds or deletes the last ones)
#   tests/kubernetes/kwok.sh down     delete the pods bound to fake nodes, the nodes, and stop
#                                     kwok (idempotent; leaves no process)
#   tests/kubernetes/kwok.sh status   exit 0 only if kwok runs and every fake node is Ready
#
# Each fake node has 8 cpus, 32Gi and room for 110 pods, and carries the taint
# kwok.x-k8s.io/node=fake:NoSchedule, so that only a pod that tolerates it (and should select
# type=kwok) lands there: no real test pod ever does. The cluster's own node (localhost) is
# never touched. Environment: SHOAL_KUBERNETES_DIR and SHOAL_KUBERNETES_CACHE as for
# cluster.sh; SHOAL_KWOK_NODES. Needs root and a running cluster (cluster.sh up).
# See docs/backends/kubernetes-test-cluster.md ("Scale").
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
KWOK_VERSION=0.8.0
GO=/usr/local/go/bin/go
CACHE=$(realpath -m "${SHOAL_KUBERNETES_CACHE:-/var/cache/shoal/kubernetes}")
DIR=$(realpath -m "${SHOAL_KUBERNETES_DIR:-/tmp/shoal-kubernetes}")
KUBECONFIG_FILE=$DIR/pki/admin.kubeconfig
NODES=${SHOAL_KWOK_NODES:-100}
NODE_PREFIX=kwok-node-
NODE_LABEL=type=kwok
TAINT_KEY=kwok.x-k8s.io/node
# Pod addresses kwok hands out: never routed, apart from the cluster's bridge (10.244.0.0/24)
# and Service range (10.96.0.0/24).
POD_CIDR=10.250.0.0/16
# kwok's own stage files (kustomize/stage/ in its module) it is run with. Not its
# pod-complete: a Job's pods stay Running, as a Shoal job's do, so that the two compare.
STAGES=(node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  pod/fast/pod-ready.yaml pod/fast/pod-delete.yaml)

log() { echo "kwok: $*"; }
die() { echo "kwok: error: $*" >&2; exit 1; }

require_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (the cluster's admin credentials)"
}

kubectl_() { bash "$HERE/cluster.sh" kubectl "$@"; }

go_version() {
  [ -x "$GO" ] || die "Go is needed at $GO to build kwok; install it from https://go.dev/dl/"
  "$GO" env GOVERSION || die "$GO env GOVERSION failed"
}

# The cached kwok for the Go at $GO; without Go, any cached build of this version.
kwok_bin() {
  if [ -x "$GO" ]; then
    echo "$CACHE/kwok-v$KWOK_VERSION-$(go_version)/bin/kwok"
    return
  fi
  local b
  for b in "$CACHE/kwok-v$KWOK_VERSION-"go*/bin/kwok; do
    if [ -x "$b" ]; then echo "$b"; return; fi
  done
  go_version >/dev/null
}

stages_of() { echo "$(dirname "$1")/../stages.yaml"; }

cmd_build() {
  local bin
  bin=$(kwok_bin)
  if [ -x "$bin" ] && [ -s "$(stages_of "$bin")" ]; then
    log "kwok cached at $bin"
    return 0
  fi
  log "building kwok v$KWOK_VERSION with $(go_version) into $(dirname "$bin") (about a minute on 2 cores)"
  local t0=$SECONDS work
  work=$(mktemp -d)
  # shellcheck disable=SC2064 # expand now: $work is local
  trap "rm -rf '$work'" EXIT
  # kwok's module has no replace lines: `go install` builds it as published.
  GOBIN=$work CGO_ENABLED=0 "$GO" install -p 2 -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION" ||
    die "go install sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION failed"
  # kwok does nothing without stages (what it does to a node or pod in which state); its
  # module publishes its "fast" ones: nodes Ready at once with lease heartbeats, pods Running
  # at once, deleted pods removed at once.
  local module_dir stage
  module_dir=$("$GO" mod download -json "sigs.k8s.io/kwok@v$KWOK_VERSION" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])') ||
    die "cannot download sigs.k8s.io/kwok@v$KWOK_VERSION from the Go module proxy"
  for stage in "${STAGES[@]}"; do
    [ -s "$module_dir/kustomize/stage/$stage" ] || die "kwok v$KWOK_VERSION has no stage $stage"
    echo "---"
    cat "$module_dir/kustomize/stage/$stage"
  done >"$work/stages.yaml"
  # Into place only when complete, so an interrupted build is never taken for a cached one.
  mkdir -p "$(dirname "$bin")"
  mv -f "$work/stages.yaml" "$(dirname "$bin")/../stages.yaml"
  mv -f "$work/kwok" "$bin"
  rm -rf "$work"
  trap - EXIT
  log "built in $((SECONDS - t0)) s: $bin"
}

# ---------------------------------------------------------------------------------------
# The kwok process: $DIR/pid/kwok beside the cluster's daemons (cluster.sh down stops it too)
# ---------------------------------------------------------------------------------------

kwok_pid() {
  local file=$DIR/pid/kwok pid argv0 state
  [ -s "$file" ] || return 1
  pid=$(tr -dc '0-9' <"$file")
  [ -n "$pid" ] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ] || return 1
  # pids get reused: it must still be the kwok we started.
  argv0=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n 1) || return 1
  [ "$(basename "$argv0")" = kwok ] || return 1
  echo "$pid"
}

start_kwok() {
  local bin=$1
  mkdir -p "$DIR/pid" "$DIR/log"
  # Its stages, and not whatever ~/.kwok/kwok.yaml holds. setsid: a Ctrl-C in the shell that
  # ran `up` must not reach kwok.
  setsid "$bin" --kubeconfig="$KUBECONFIG_FILE" --config="$(stages_of "$bin")" \
    --manage-nodes-with-label-selector="$NODE_LABEL" --cidr="$POD_CIDR" \
    --node-lease-duration-seconds=40 --v=WARN >"$DIR/log/kwok.log" 2>&1 </dev/null &
  echo $! >"$DIR/pid/kwok"
  sleep 1
  kwok_pid >/dev/null || {
    tail -n 20 "$DIR/log/kwok.log" >&2
    die "kwok exited at once (log above, in $DIR/log/kwok.log)"
  }
}

stop_kwok() {
  local pid _
  if pid=$(kwok_pid); then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kwok_pid >/dev/null || break; sleep 0.25; done
    if kwok_pid >/dev/null; then
      log "kwok (pid $pid) did not stop on SIGTERM; killing it"
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$DIR/pid/kwok"
}

# ---------------------------------------------------------------------------------------
# Fake nodes
# ---------------------------------------------------------------------------------------

node_names() {
  kubectl_ get nodes -l "$NODE_LABEL" -o 'jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}'
}

ready_nodes() {
  kubectl_ get nodes -l "$NODE_LABEL" \
    -o 'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
    grep -c True || true
}

node_manifest() {
  local name=$1
  cat <<EOF
- apiVersion: v1
  kind: Node
  metadata:
    name: $name
    labels: {type: kwok, kubernetes.io/hostname: $name, kubernetes.io/os: linux}
    annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  spec:
    taints: [{key: $TAINT_KEY, value: fake, effect: NoSchedule}]
  status:
    allocatable: {cpu: "8", memory: 32Gi, pods: "110"}
    capacity: {cpu: "8", memory: 32Gi, pods: "110"}
EOF
}

# The pods bound to fake nodes, in every namespace, as NAMESPACE/NAME lines.
pods_on_fake_nodes() {
  kubectl_ get pods -A \
    -o 'jsonpath={range .items[*]}{.spec.nodeName} {.metadata.namespace}/{.metadata.name}{"\n"}{end}' |
    awk -v p="$NODE_PREFIX" 'index($1, p) == 1 {print $2}'
}

delete_pods_on_fake_nodes() {
  local ns_pods
  ns_pods=$(pods_on_fake_nodes) || die "cannot list the pods on fake nodes"
  [ -n "$ns_pods" ] || return 0
  log "deleting $(echo "$ns_pods" | wc -l) pods left on fake nodes"
  local ns
  for ns in $(echo "$ns_pods" | cut -d/ -f1 | sort -u); do
    # No kubelet runs them: nothing to wait for.
    echo "$ns_pods" | awk -F/ -v n="$ns" '$1 == n {print $2}' |
      xargs -r -n 200 bash "$HERE/cluster.sh" kubectl delete pod -n "$ns" --grace-period=0 --force \
        --wait=false >/dev/null 2>&1 || true
  done
}

# Exactly $1 fake nodes: kwok-node-0 ... kwok-node-<$1 - 1>.
cmd_nodes() {
  local want=$1
  case "$want" in '' | *[!0-9]*) die "nodes takes a number of nodes, got '$want'" ;; esac
  local have=() name i
  mapfile -t have < <(node_names) || die "cannot list the nodes"
  local missing=()
  for ((i = 0; i < want; i++)); do
    printf '%s\n' "${have[@]}" | grep -Fx "$NODE_PREFIX$i" >/dev/null || missing+=("$NODE_PREFIX$i")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    { echo "apiVersion: v1"; echo "kind: List"; echo "items:"
      for name in "${missing[@]}"; do node_manifest "$name"; done; } |
      kubectl_ create -f - >/dev/null || die "cannot create the fake nodes"
    log "created ${#missing[@]} fake nodes"
  fi
  local extra=()
  for name in "${have[@]}"; do
    [ -n "$name" ] || continue
    i=${name#"$NODE_PREFIX"}
    case "$i" in '' | *[!0-9]*) extra+=("$name"); continue ;; esac
    ((i >= want)) && extra+=("$name")
  done
  if [ ${#extra[@]} -gt 0 ]; then
    kubectl_ delete node "${extra[@]}" --wait=false >/dev/null || die "cannot delete fake nodes"
    log "deleted ${#extra[@]} fake nodes"
  fi
  [ "$want" -eq 0 ] && return 0
  if ! kwok_pid >/dev/null; then
    log "kwok is not running: the nodes stay NotReady until kwok.sh up"
    return 0
  fi
  local _ ready
  for _ in $(seq 120); do
    ready=$(ready_nodes)
    [ "$ready" -ge "$want" ] && { log "$ready fake nodes Ready"; return 0; }
    sleep 0.5
  done
  die "only $ready of $want fake nodes are Ready after 60 s (kwok's log: $DIR/log/kwok.log)"
}

cluster_up() {
  bash "$HERE/cluster.sh" status >/dev/null 2>&1 ||
    die "the test cluster is not up: run tests/kubernetes/cluster.sh up first"
}

cmd_up() {
  require_root
  cluster_up
  cmd_build
  local bin
  bin=$(kwok_bin)
  if kwok_pid >/dev/null; then
    log "kwok already running (pid $(kwok_pid))"
  else
    start_kwok "$bin"
    log "kwok v$KWOK_VERSION running (pid $(kwok_pid)), managing the nodes labelled $NODE_LABEL"
  fi
  cmd_nodes "$NODES"
}

cmd_down() {
  require_root
  if bash "$HERE/cluster.sh" status >/dev/null 2>&1; then
    # Pods first, while kwok still answers for their nodes, then the nodes.
    delete_pods_on_fake_nodes
    kubectl_ delete nodes -l "$NODE_LABEL" --wait=false >/dev/null ||
      die "cannot delete the fake nodes"
  fi
  stop_kwok
  log "down"
}

cmd_status() {
  local pid
  pid=$(kwok_pid) || { log "kwok is not running"; return 1; }
  local total ready
  total=$(node_names | grep -c . || true)
  ready=$(ready_nodes)
  log "kwok running (pid $pid): $ready of $total fake nodes Ready"
  [ "$total" -gt 0 ] && [ "$ready" -eq "$total" ]
}

usage() {
  awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"
  exit 2
}

case "${1:-}" in
  build) [ $# -eq 1 ] || die "build takes no arguments"; cmd_build ;;
  up) [ $# -eq 1 ] || die "up takes no arguments (the node count is \$SHOAL_KWOK_NODES)"; cmd_up ;;
  nodes)
    [ $# -eq 2 ] || die "nodes takes a number of nodes"
    require_root
    cluster_up
    cmd_nodes "$2"
    ;;
  down) [ $# -eq 1 ] || die "down takes no arguments"; cmd_down ;;
  status) [ $# -eq 1 ] || die "status takes no arguments"; cmd_status ;;
  -h | --help | help | '') usage ;;
  *) die "unknown command '$1' (build|up|nodes|down|status)" ;;
esac
