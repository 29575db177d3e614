#!/usr/bin/env bash
# Brings up a real Spark standalone cluster on this one machine, for Shoal's end-to-end tests
# and benchmarks: one master and two workers, each its own JVM from the `spark` venv's PySpark
# (4.3.0), bound to 127.0.0.1 on free ports. Executors are real JVMs the workers start; every
# worker offers fake GPUs through Spark's resource discovery script.
#
#   tests/spark/cluster.sh up       start (idempotent; restarts a dead, half-up or outdated one)
#   tests/spark/cluster.sh down     stop the master, the workers, their executors and every
#                                   process started in the workers' directories (idempotent)
#   tests/spark/cluster.sh status   exit 0 only if the master answers with every worker ALIVE
#   tests/spark/cluster.sh env      print the exports a shell needs:
#                                   eval "$(tests/spark/cluster.sh env)"
#
# Environment: SHOAL_SPARK_DIR (state directory, default /tmp/shoal-spark),
#   SHOAL_SPARK_VENV (the venv with PySpark, default /var/cache/shoal/venvs/spark),
#   SHOAL_SPARK_WORKERS (default 2), SHOAL_SPARK_WORKER_CORES (default 2),
#   SHOAL_SPARK_WORKER_MEMORY (default 2g), SHOAL_SPARK_WORKER_GPUS (fake, default 2).
# Needs Java 17 (java on PATH or JAVA_HOME). No root needed.
# See docs/backends/spark-test-cluster.md.
set -euo pipefail

# Absolute: the daemons run in other directories and get these paths in their configuration.
DIR=$(realpath -m "${SHOAL_SPARK_DIR:-/tmp/shoal-spark}")
VENV=${SHOAL_SPARK_VENV:-/var/cache/shoal/venvs/spark}
WORKERS=${SHOAL_SPARK_WORKERS:-2}
WORKER_CORES=${SHOAL_SPARK_WORKER_CORES:-2}
WORKER_MEMORY=${SHOAL_SPARK_WORKER_MEMORY:-2g}
WORKER_GPUS=${SHOAL_SPARK_WORKER_GPUS:-2}
WAIT_READY_S=120
STOP_GRACE_S=30
# The daemons only shuttle messages: small heaps, serial GC and C1 keep them light on a small
# shared machine (spark-class reads SPARK_DAEMON_MEMORY and SPARK_DAEMON_JAVA_OPTS for them).
export SPARK_DAEMON_MEMORY=256m
# -Dshoal.spark.dir names the daemons of this cluster (pid files may be lost; pids reused).
export SPARK_DAEMON_JAVA_OPTS="-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Dshoal.spark.dir=$DIR"
# No SPARK_CONF_DIR of the machine's: the cluster's settings are all on the command lines.
export SPARK_CONF_DIR=$DIR/conf
export SPARK_LOG_DIR=$DIR/log
export SPARK_LOCAL_IP=127.0.0.1
export SPARK_LOCAL_HOSTNAME=127.0.0.1

log() { echo "spark-cluster: $*"; }
die() { echo "spark-cluster: error: $*" >&2; exit 1; }

for v in WORKERS WORKER_CORES WORKER_GPUS; do
  case "${!v}" in
    '' | *[!0-9]*) die "SHOAL_SPARK_$v must be a number, got '${!v}'" ;;
  esac
done
((WORKERS >= 1 && WORKERS <= 8)) || die "SHOAL_SPARK_WORKERS must be 1..8"
[[ "$WORKER_MEMORY" =~ ^[0-9]+[mMgG]$ ]] ||
  die "SHOAL_SPARK_WORKER_MEMORY must be like 2g or 512m, got '$WORKER_MEMORY'"

# ---------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------

# Reads /proc rather than kill -0. A zombie counts as dead.
pid_alive() {
  [ -n "${1:-}" ] || return 1
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# A daemon's pid from its pid file if it still runs that daemon for this directory (pids are
# reused).
daemon_pid() {
  local file=$DIR/run/$1.pid pid args
  [ -s "$file" ] || return 1
  pid=$(tr -dc '0-9' <"$file")
  pid_alive "$pid" || return 1
  args=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
  case "$args" in *"-Dshoal.spark.dir=$DIR "*) echo "$pid" ;; *) return 1 ;; esac
}

# Every process of the cluster by where it runs or what it was told: the daemons (their
# -Dshoal.spark.dir), and what runs in the workers' directories: executors, their Python
# workers, and whatever those started (Shoal agents and tasks), also when their worker died.
cluster_pids() {
  local p cwd args
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$$" ] && continue
    cwd=$(readlink "$p/cwd" 2>/dev/null) || continue
    case "$cwd/" in
      "$DIR/work/"*) echo "${p#/proc/}"; continue ;;
    esac
    args=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null || true)
    case "$args" in *"-Dshoal.spark.dir=$DIR "*) echo "${p#/proc/}" ;; esac
  done
}

# Waits for pids to exit; SIGKILL after a grace period so `down` is always bounded.
stop_pids() {
  local what=$1 grace=$2 i pid left
  shift 2
  [ $# -gt 0 ] || return 0
  kill "$@" 2>/dev/null || true
  for i in $(seq 1 $((grace * 10))); do
    left=()
    for pid in "$@"; do pid_alive "$pid" && left+=("$pid"); done
    [ ${#left[@]} -eq 0 ] && return 0
    sleep 0.1
  done
  log "$what (${left[*]}) ignored SIGTERM for ${grace}s; killing"
  kill -9 "${left[@]}" 2>/dev/null || true
  for i in $(seq 1 50); do
    left=()
    for pid in "$@"; do pid_alive "$pid" && left+=("$pid"); done
    [ ${#left[@]} -eq 0 ] && return 0
    sleep 0.1
  done
  die "$what (${left[*]}) does not exit"
}

stop_cluster() {
  local i pid workers=()
  # Workers first: a worker that stops cleanly kills its executors.
  for i in $(seq 1 8); do
    if pid=$(daemon_pid "worker$i"); then workers+=("$pid"); fi
  done
  if [ ${#workers[@]} -gt 0 ]; then
    log "stopping the workers (${workers[*]})"
    stop_pids "the workers" "$STOP_GRACE_S" "${workers[@]}"
  fi
  if pid=$(daemon_pid master); then
    log "stopping the master ($pid)"
    stop_pids "the master" "$STOP_GRACE_S" "$pid"
  fi
  # shellcheck disable=SC2046  # one word per pid
  set -- $(cluster_pids)
  if [ $# -gt 0 ]; then
    log "stopping leftover processes of the cluster: $*"
    stop_pids "leftover processes" 5 "$@"
  fi
  rm -f "$DIR"/run/*.pid "$DIR/env"
}

# ---------------------------------------------------------------------------------------
# Health
# ---------------------------------------------------------------------------------------

settings() {
  echo "workers=$WORKERS cores=$WORKER_CORES memory=$WORKER_MEMORY gpus=$WORKER_GPUS venv=$VENV"
}

env_value() {
  sed -n "s/^$1=//p" "$DIR/env" 2>/dev/null | head -n 1
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Workers ALIVE according to the master's JSON page.
alive_workers() {
  local web=${1:-$(env_value SHOAL_SPARK_MASTER_WEB)}
  [ -n "$web" ] || { echo 0; return; }
  curl -sf --max-time 5 "$web/json/" 2>/dev/null | grep -o '"state" *: *"ALIVE"' | grep -c . || true
}

healthy() {
  daemon_pid master >/dev/null || return 1
  local i
  for i in $(seq 1 "$WORKERS"); do daemon_pid "worker$i" >/dev/null || return 1; done
  [ -s "$DIR/env" ] || return 1
  [ "$(cat "$DIR/run/settings" 2>/dev/null)" = "$(settings)" ] || return 1
  [ "$(alive_workers)" -ge "$WORKERS" ]
}

fail() {
  echo "spark-cluster: error: $*" >&2
  local f
  for f in "$DIR"/log/*.out; do
    [ -s "$f" ] || continue
    echo "----- tail -n 20 $f" >&2
    tail -n 20 "$f" >&2
  done
  echo "spark-cluster: logs in $DIR/log; \`$0 down\` cleans up" >&2
  exit 1
}

# Starts one daemon as its own session (it must outlive this script's process group, which
# ctest kills); spark-class execs the JVM, so $! is the JVM's pid. 9>&-: the JVM must not
# inherit the up/down lock.
start_daemon() {
  local name=$1
  shift
  (
    cd "$DIR/work"
    exec setsid "$VENV/bin/spark-class" "$@"
  ) </dev/null >>"$DIR/log/$name.out" 2>&1 9>&- &
  echo $! >"$DIR/run/$name.pid"
}

take_lock() {
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  if ! flock -n 9; then
    log "waiting for another cluster.sh up/down on $DIR to finish"
    flock -w 300 9 || die "timed out waiting for $DIR/.lock"
  fi
}

cmd_up() {
  take_lock
  local t0=$SECONDS i
  [ -x "$VENV/bin/spark-class" ] || die "no PySpark in $VENV (SHOAL_SPARK_VENV); setup.sh makes it"
  # spark-class finds Spark's jars through SPARK_HOME: the pyspark package of the venv.
  SPARK_HOME=$("$VENV/bin/python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))') ||
    die "cannot import pyspark with $VENV/bin/python"
  export SPARK_HOME
  command -v java >/dev/null || [ -n "${JAVA_HOME:-}" ] || die "no java on PATH (Java 17 needed)"
  if healthy; then
    log "already up and healthy ($WORKERS workers); eval \"\$($0 env)\" or source $DIR/env"
    return 0
  fi
  if daemon_pid master >/dev/null || [ -n "$(cluster_pids)" ]; then
    log "found a dead, half-up or outdated cluster; stopping it first"
    stop_cluster
  fi
  rm -rf "$DIR/work" "$DIR/conf" "$DIR/log" "$DIR/env"
  mkdir -p "$DIR/work" "$DIR/conf" "$DIR/log" "$DIR/run"
  settings >"$DIR/run/settings"
  local port web_port
  port=$(free_port)
  web_port=$(free_port)
  local master_url=spark://127.0.0.1:$port master_web=http://127.0.0.1:$web_port
  log "starting the master at $master_url (web $master_web)"
  start_daemon master org.apache.spark.deploy.master.Master \
    --host 127.0.0.1 --port "$port" --webui-port "$web_port"
  # The fake GPUs: Spark runs the discovery script when a worker starts and offers what it
  # prints as the worker's `gpu` resource; executors and tasks get addresses from it.
  # Each worker has its own addresses, as two machines would.
  for i in $(seq 1 "$WORKERS"); do
    local first=$(((i - 1) * WORKER_GPUS)) addresses="" g
    for g in $(seq "$first" $((first + WORKER_GPUS - 1))); do
      addresses+="${addresses:+,}\"$g\""
    done
    [ "$WORKER_GPUS" -gt 0 ] || addresses=""
    printf '#!/bin/sh\n# Fake GPUs of worker %s (tests/spark/cluster.sh).\necho '"'"'{"name": "gpu", "addresses": [%s]}'"'"'\n' \
      "$i" "$addresses" >"$DIR/conf/gpus-worker$i.sh"
    chmod 755 "$DIR/conf/gpus-worker$i.sh"
    {
      echo "spark.worker.cleanup.enabled false"
      if [ "$WORKER_GPUS" -gt 0 ]; then
        echo "spark.worker.resource.gpu.amount $WORKER_GPUS"
        echo "spark.worker.resource.gpu.discoveryScript $DIR/conf/gpus-worker$i.sh"
      fi
    } >"$DIR/conf/worker$i.conf"
    mkdir -p "$DIR/work/worker$i"
    start_daemon "worker$i" org.apache.spark.deploy.worker.Worker \
      --host 127.0.0.1 --port "$(free_port)" --webui-port "$(free_port)" \
      --cores "$WORKER_CORES" --memory "$WORKER_MEMORY" --work-dir "$DIR/work/worker$i" \
      --properties-file "$DIR/conf/worker$i.conf" "$master_url"
  done
  local start=$SECONDS n=0
  while :; do
    n=$(alive_workers "$master_web")
    [ "$n" -ge "$WORKERS" ] && break
    # (The pid is spark-class's until it execs the JVM: alive is all that can be asked yet.)
    pid_alive "$(cat "$DIR/run/master.pid")" || fail "the master exited during start-up"
    for i in $(seq 1 "$WORKERS"); do
      pid_alive "$(cat "$DIR/run/worker$i.pid")" || fail "worker $i exited during start-up"
    done
    ((SECONDS - start < WAIT_READY_S)) || fail "only $n of $WORKERS workers ALIVE after ${WAIT_READY_S}s"
    sleep 1
  done
  cat >"$DIR/env" <<EOF
SHOAL_SPARK_MASTER=$master_url
SHOAL_SPARK_MASTER_WEB=$master_web
SHOAL_SPARK_WORKERS=$WORKERS
SHOAL_SPARK_WORKER_CORES=$WORKER_CORES
SHOAL_SPARK_WORKER_GPUS=$WORKER_GPUS
SHOAL_SPARK_GPU_DISCOVERY_SCRIPT=$DIR/conf/gpus-worker1.sh
SHOAL_SPARK_PYTHON=$VENV/bin/python
EOF
  log "up in $((SECONDS - t0))s: $n workers ALIVE; eval \"\$($0 env)\" or source $DIR/env"
  sed 's/^/  /' "$DIR/env"
}

cmd_down() {
  take_lock
  stop_cluster
  log "down (logs kept in $DIR/log)"
}

cmd_status() {
  local pid n
  if ! pid=$(daemon_pid master); then
    log "down (no master running for $DIR)"
    return 1
  fi
  if [ ! -s "$DIR/env" ]; then
    log "starting (master pid $pid), not ready yet"
    return 1
  fi
  n=$(alive_workers)
  log "up (master pid $pid): $n workers ALIVE; master $(env_value SHOAL_SPARK_MASTER)," \
    "web $(env_value SHOAL_SPARK_MASTER_WEB)"
  [ "$n" -ge "$(env_value SHOAL_SPARK_WORKERS)" ]
}

cmd_env() {
  [ -s "$DIR/env" ] && daemon_pid master >/dev/null ||
    die "the cluster in $DIR is not up; start it: $0 up"
  sed 's/^/export /' "$DIR/env"
}

usage() {
  sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

cmd=${1:-}
[ $# -gt 0 ] && shift
[ $# -eq 0 ] || die "unknown argument '$1'"

case "$cmd" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  -h | --help | help | '') usage ;;
  *) die "unknown command '$cmd' (up|down|status|env)" ;;
esac
