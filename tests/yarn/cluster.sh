#!/usr/bin/env bash
# Brings up a real Hadoop YARN + HDFS cluster on this one machine, for Shoal's end-to-end tests
# and benchmarks: one JVM (tests/yarn/minicluster, Hadoop's hadoop-minicluster 3.4.2) running
# a ResourceManager, several NodeManagers, a NameNode and a DataNode, every one on a free port.
# Containers are real processes on this machine.
#
#   tests/yarn/cluster.sh up       start (idempotent; restarts a dead, half-up or outdated one)
#   tests/yarn/cluster.sh down     stop it and its containers (idempotent; keeps logs and data)
#   tests/yarn/cluster.sh status   exit 0 only if it is up with every NodeManager RUNNING
#   tests/yarn/cluster.sh env      print the exports a shell needs:
#                                  eval "$(tests/yarn/cluster.sh env)"
#   tests/yarn/cluster.sh build    build the jar if missing or older than its sources
#
# Environment: SHOAL_YARN_DIR (state directory, default /tmp/shoal-yarn),
#   SHOAL_YARN_NODEMANAGERS (default 2), SHOAL_YARN_NM_MEMORY_MB (per NodeManager, default
#   4096), SHOAL_YARN_NM_VCORES (default 4), SHOAL_YARN_NM_GPUS (fake yarn.io/gpu, default 2),
#   SHOAL_YARN_JAVA (java binary; default $JAVA_HOME/bin/java, then java on PATH),
#   SHOAL_M2_REPO (Maven's local repository, default /var/cache/shoal/m2).
# Needs Java 17 and Maven (Debian: openjdk-17-jdk-headless maven). No root needed.
# See docs/backends/yarn-test-cluster.md.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# Absolute: the JVM runs in another directory and writes this path into the configuration.
DIR=$(realpath -m "${SHOAL_YARN_DIR:-/tmp/shoal-yarn}")
PROJECT=$HERE/minicluster
JAR=$PROJECT/target/shoal-yarn-minicluster.jar
LIB=$PROJECT/target/lib
M2=${SHOAL_M2_REPO:-/var/cache/shoal/m2}
NODEMANAGERS=${SHOAL_YARN_NODEMANAGERS:-2}
NM_MEMORY_MB=${SHOAL_YARN_NM_MEMORY_MB:-4096}
NM_VCORES=${SHOAL_YARN_NM_VCORES:-4}
NM_GPUS=${SHOAL_YARN_NM_GPUS:-2}
LOG=$DIR/log/minicluster.log
PIDFILE=$DIR/run/minicluster.pid
WAIT_READY_S=180
STOP_GRACE_S=60
# Guice (the ResourceManager's and NodeManagers' web apps) defines classes through
# ClassLoader.defineClass by reflection; nothing else in Hadoop 3.4 needs opening on Java 17.
JAVA_FLAGS=(--add-opens java.base/java.lang=ALL-UNNAMED)
# Heap for all daemons together; a serial collector and C1 only: less memory and CPU on a
# small shared machine than G1 and C2, and the cluster is never the bottleneck of a test.
JVM_FLAGS=(-Xms128m -Xmx768m -XX:+UseSerialGC -XX:TieredStopAtLevel=1)

log() { echo "yarn-cluster: $*"; }
die() { echo "yarn-cluster: error: $*" >&2; exit 1; }

for v in NODEMANAGERS NM_MEMORY_MB NM_VCORES NM_GPUS; do
  case "${!v}" in
    '' | *[!0-9]*) die "SHOAL_YARN_$v must be a number, got '${!v}'" ;;
  esac
done
((NODEMANAGERS >= 1 && NODEMANAGERS <= 16)) || die "SHOAL_YARN_NODEMANAGERS must be 1..16"

# ---------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------

# Reads /proc rather than kill -0, so that it also works on another user's cluster. A zombie
# counts as dead.
pid_alive() {
  [ -n "${1:-}" ] || return 1
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# The cluster's JVM: the recorded pid if it still runs our jar for this directory (pids are
# reused), else any JVM that does (its pid file lost).
cluster_pid() {
  local pid args
  if [ -s "$PIDFILE" ]; then
    pid=$(tr -dc '0-9' <"$PIDFILE")
    if pid_alive "$pid"; then
      args=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
      case "$args" in *"shoal-yarn-minicluster.jar --dir $DIR "*) echo "$pid"; return 0 ;; esac
    fi
  fi
  for pid in $(pgrep -f -- "shoal-yarn-minicluster.jar --dir $DIR " || true); do
    if pid_alive "$pid"; then echo "$pid"; return 0; fi
  done
  return 1
}

# Containers are processes of their own session (setsid), outside the JVM's process tree; each
# runs in a working directory under $DIR/work. Prints those still running.
container_pids() {
  local p cwd
  for p in /proc/[0-9]*; do
    cwd=$(readlink "$p/cwd" 2>/dev/null) || continue
    case "$cwd/" in "$DIR/work/target/"*) echo "${p#/proc/}" ;; esac
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
    if ((i % 100 == 0)); then log "waiting for $what to stop ($((i / 10))s)"; fi
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
  local pid
  if pid=$(cluster_pid); then
    log "stopping the mini-cluster (pid $pid)"
    stop_pids "the mini-cluster" "$STOP_GRACE_S" "$pid"
  fi
  # The NodeManagers kill their containers when they stop cleanly, not after a SIGKILL.
  # shellcheck disable=SC2046  # one word per pid
  set -- $(container_pids)
  if [ $# -gt 0 ]; then
    log "stopping leftover container processes: $*"
    stop_pids "container processes" 5 "$@"
  fi
  rm -f "$PIDFILE" "$DIR/env"
}

# ---------------------------------------------------------------------------------------
# Java and the jar
# ---------------------------------------------------------------------------------------

find_java() {
  local java=${SHOAL_YARN_JAVA:-}
  if [ -z "$java" ] && [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
    java=$JAVA_HOME/bin/java
  fi
  [ -n "$java" ] || java=$(command -v java || true)
  [ -n "$java" ] && [ -x "$java" ] ||
    die "no Java found; install it: sudo apt-get install -y openjdk-17-jdk-headless maven (or ./setup.sh)"
  local version
  version=$("$java" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
  [ "${version%%.*}" -ge 17 ] 2>/dev/null ||
    die "$java is Java '$version'; Hadoop here needs 17 (apt-get install openjdk-17-jdk-headless)"
  JAVA=$java
  # Containers find java through JAVA_HOME, which the NodeManagers pass on from our environment.
  JAVA_HOME=$(dirname "$(dirname "$(readlink -f "$java")")")
  export JAVA_HOME
}

jar_current() {
  [ -s "$JAR" ] && [ -d "$LIB" ] && [ -f "$LIB/.complete" ] || return 1
  [ -z "$(find "$PROJECT/pom.xml" "$PROJECT/src" -newer "$JAR" -print -quit)" ]
}

# Builds the jar and target/lib with Maven, offline when the local repository already has
# everything (a second CI run downloads nothing). One Maven at a time on this machine.
build_jar() {
  if jar_current; then return 0; fi
  command -v mvn >/dev/null ||
    die "Maven is missing; install it: sudo apt-get install -y maven openjdk-17-jdk-headless (or ./setup.sh)"
  find_java
  local lock=/run/lock/shoal-yarn-build.lock
  [ -w /run/lock ] || lock=/tmp/shoal-yarn-build.lock
  exec 8>"$lock"
  if ! flock -n 8; then
    log "waiting for another build of the mini-cluster jar ($lock)"
    flock -w 900 8 || die "timed out waiting for $lock"
  fi
  if jar_current; then exec 8>&-; return 0; fi
  mkdir -p "$M2" 2>/dev/null || true
  [ -w "$M2" ] || die "Maven's repository $M2 is not writable; run ./setup.sh or set SHOAL_M2_REPO"
  local mvn=(nice -n 10 mvn -B -q -f "$PROJECT/pom.xml" "-Dmaven.repo.local=$M2")
  local out t0=$SECONDS
  out=$(mktemp)
  # Stale jars of an older pom.xml must not stay on the classpath.
  rm -rf "$LIB"
  log "building $JAR (Maven, repository $M2)"
  if ! JAVA_HOME=$JAVA_HOME "${mvn[@]}" -o package >"$out" 2>&1; then
    log "not everything is in $M2 yet; downloading (Maven Central)"
    if ! JAVA_HOME=$JAVA_HOME "${mvn[@]}" package >"$out" 2>&1; then
      tail -n 40 "$out" >&2
      rm -f "$out"
      die "Maven build failed: (cd $PROJECT && mvn -Dmaven.repo.local=$M2 package)"
    fi
  fi
  rm -f "$out"
  touch "$LIB/.complete"
  exec 8>&-
  log "built in $((SECONDS - t0))s"
}

# ---------------------------------------------------------------------------------------
# Health
# ---------------------------------------------------------------------------------------

# What `up` was asked for; a running cluster started with other settings or an older jar is
# restarted.
settings() {
  echo "nodemanagers=$NODEMANAGERS nm_memory_mb=$NM_MEMORY_MB nm_vcores=$NM_VCORES" \
    "nm_gpus=$NM_GPUS jar=$(stat -c %Y "$JAR" 2>/dev/null || echo none)"
}

env_value() {
  sed -n "s/^$1=//p" "$DIR/env" 2>/dev/null | head -n 1
}

running_nodemanagers() {
  local web
  web=$(env_value SHOAL_YARN_RM_WEB)
  [ -n "$web" ] || { echo 0; return; }
  curl -sf --max-time 5 "$web/ws/v1/cluster/nodes?states=RUNNING" 2>/dev/null |
    grep -o '"state":"RUNNING"' | grep -c . || true
}

healthy() {
  cluster_pid >/dev/null || return 1
  [ -s "$DIR/env" ] && grep -qx ready "$LOG" 2>/dev/null || return 1
  [ "$(cat "$DIR/run/settings" 2>/dev/null)" = "$(settings)" ] || return 1
  [ "$(running_nodemanagers)" -ge "$NODEMANAGERS" ]
}

# Prints the end of the log, then exits: used for every failure after the JVM started.
fail() {
  echo "yarn-cluster: error: $*" >&2
  if [ -s "$LOG" ]; then
    echo "----- tail -n 40 $LOG" >&2
    tail -n 40 "$LOG" >&2
  fi
  echo "yarn-cluster: the log is $LOG; \`$0 down\` cleans up" >&2
  exit 1
}

wait_ready() {
  local pid=$1 start=$SECONDS now
  while ! grep -qx ready "$LOG" 2>/dev/null; do
    now=$((SECONDS - start))
    pid_alive "$pid" || fail "the mini-cluster (pid $pid) exited during start-up"
    ((now < WAIT_READY_S)) || fail "not ready after ${WAIT_READY_S}s"
    if ((now > 0 && now % 10 == 0)); then
      log "waiting for the mini-cluster to be ready (${now}s): $(grep -c . "$LOG") log lines"
    fi
    sleep 1
  done
  local n
  n=$(running_nodemanagers)
  [ "$n" -ge "$NODEMANAGERS" ] || fail "ready, but only $n of $NODEMANAGERS NodeManagers RUNNING"
  log "ready after $((SECONDS - start))s; $n NodeManagers RUNNING"
}

# ---------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------

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
  local t0=$SECONDS
  build_jar
  find_java
  if healthy; then
    log "already up and healthy ($NODEMANAGERS NodeManagers); eval \"\$($0 env)\" or source $DIR/env"
    return 0
  fi
  if cluster_pid >/dev/null || [ -n "$(container_pids)" ]; then
    log "found a dead, half-up or outdated cluster; stopping it first"
    stop_cluster
  fi
  # A fresh cluster every time: HDFS is formatted anew, no application survives. Logs of
  # the previous run are cleared; $DIR/work (HDFS blocks, container logs) is replaced.
  rm -rf "$DIR/work" "$DIR/conf" "$DIR/env"
  mkdir -p "$DIR/work" "$DIR/log" "$DIR/run"
  : >"$LOG"
  settings >"$DIR/run/settings"
  log "starting the mini-cluster: $NODEMANAGERS NodeManagers ($NM_MEMORY_MB MB, $NM_VCORES vcores," \
    "$NM_GPUS GPUs each), HDFS; log $LOG"
  # setsid: the cluster must outlive this script's process group (ctest kills it). 8>&- 9>&-:
  # the JVM must not inherit the build or up/down lock, or it would hold them for its life.
  (
    cd "$DIR/work"
    exec setsid "$JAVA" "${JVM_FLAGS[@]}" "${JAVA_FLAGS[@]}" -jar "$JAR" --dir "$DIR" \
      --nodemanagers "$NODEMANAGERS" --nm-memory-mb "$NM_MEMORY_MB" --nm-vcores "$NM_VCORES" \
      --nm-gpus "$NM_GPUS"
  ) </dev/null >>"$LOG" 2>&1 8>&- 9>&- &
  local pid=$!
  echo "$pid" >"$PIDFILE"
  wait_ready "$pid"
  log "up in $((SECONDS - t0))s; eval \"\$($0 env)\" or source $DIR/env"
  sed 's/^/  /' "$DIR/env"
}

cmd_down() {
  take_lock
  stop_cluster
  log "down (logs and data kept in $DIR)"
}

cmd_status() {
  local pid n
  if ! pid=$(cluster_pid); then
    log "down (no mini-cluster running for $DIR)"
    return 1
  fi
  if ! grep -qx ready "$LOG" 2>/dev/null || [ ! -s "$DIR/env" ]; then
    log "starting (pid $pid), not ready yet"
    return 1
  fi
  n=$(running_nodemanagers)
  log "up (pid $pid): $n NodeManagers RUNNING; RM $(env_value SHOAL_YARN_RM)," \
    "web $(env_value SHOAL_YARN_RM_WEB), HDFS $(env_value SHOAL_HDFS)"
  [ "$n" -ge "$(env_value SHOAL_YARN_NODEMANAGERS)" ]
}

cmd_env() {
  [ -s "$DIR/env" ] && cluster_pid >/dev/null ||
    die "the cluster in $DIR is not up; start it: $0 up"
  sed 's/^/export /' "$DIR/env"
}

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
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
  build)
    if jar_current; then log "the mini-cluster jar is up to date ($JAR)"; else build_jar; fi
    ;;
  -h | --help | help | '') usage ;;
  *) die "unknown command '$cmd' (up|down|status|env|build)" ;;
esac
