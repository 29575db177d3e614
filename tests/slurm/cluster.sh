#!/usr/bin/env bash
# Brings up a real multi-node Slurm cluster on this one machine, for Shoal's end-to-end
# tests and benchmarks. Each node is a network namespace with its own hostname and
# address on a private bridge, running its own slurmd; slurmctld runs on the bridge.
#
#   tests/slurm/cluster.sh up [--no-install]   start (idempotent; repairs a half-up cluster)
#   tests/slurm/cluster.sh down                stop everything and remove the network (idempotent)
#   tests/slurm/cluster.sh status              sinfo; exit 0 only if every node is up
#   tests/slurm/cluster.sh env                 print the exports a shell needs:
#                                              eval "$(tests/slurm/cluster.sh env)"
#
# Environment: SHOAL_SLURM_DIR (state directory, default /tmp/shoal-slurm),
#              SHOAL_SLURM_NODES (node count, default 2).
# Needs root: it creates namespaces, a bridge, device nodes and edits /etc/hosts.
# See docs/backends/slurm-test-cluster.md.
set -euo pipefail

# Absolute, because daemons get it via -f and in their config and run from other directories.
DIR=$(realpath -m "${SHOAL_SLURM_DIR:-/tmp/shoal-slurm}")
NODES=${SHOAL_SLURM_NODES:-2}
# status/env describe the running cluster: without an explicit count, use the one `up` recorded.
if [ -z "${SHOAL_SLURM_NODES:-}" ] && [ -s "$DIR/nodes" ] && [[ "${1:-}" =~ ^(status|env)$ ]]; then
  NODES=$(grep -c . "$DIR/nodes")
fi
CONF=$DIR/slurm.conf
BRIDGE=shoalbr0
NET=10.213.77            # private /24; nothing here routes outside the namespaces we create
CTL_NAME=shoalctl
CTL_ADDR=$NET.1
HOSTS_BEGIN="# BEGIN shoal-slurm test cluster (tests/slurm/cluster.sh)"
HOSTS_END="# END shoal-slurm test cluster"
WAIT_IDLE_S=60
GUARD_METRIC=4242

log() { echo "slurm-cluster: $*"; }
die() { echo "slurm-cluster: error: $*" >&2; exit 1; }

# Every client call below must hit our private cluster, never a default /etc/slurm one.
export SLURM_CONF=$CONF

case "$NODES" in
  '' | *[!0-9]*) die "SHOAL_SLURM_NODES must be a number, got '$NODES'" ;;
esac
# Addresses are $NET.(10+i); keep them inside the /24 and away from the bridge address.
((NODES >= 1 && NODES <= 200)) || die "SHOAL_SLURM_NODES must be 1..200, got $NODES"

node_name() { echo "sn$1"; }
node_addr() { echo "$NET.$((10 + $1))"; }

# Nodes recorded by the last `up`, so `down` still cleans up after SHOAL_SLURM_NODES changes.
recorded_nodes() {
  if [ -f "$DIR/nodes" ]; then cat "$DIR/nodes"; fi
}
all_known_nodes() {
  { for i in $(seq 1 "$NODES"); do node_name "$i"; done; recorded_nodes; } | sort -u
}

# In pipelines, `grep -q` would stop reading at the first match and its writer die of SIGPIPE,
# which pipefail turns into a failed test; plain grep >/dev/null reads to the end.
# Reads /proc rather than kill -0 so that `status` works for non-root users too. A zombie
# counts as dead: daemonizing orphans processes, and some container inits reap them late.
pid_alive() {
  [ -n "${1:-}" ] || return 1
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}
pidfile_pid() {
  if [ -s "$1" ]; then tr -dc '0-9' <"$1"; fi
}

# up and down change machine-wide state (bridge, /etc/hosts), so serialize them even
# across different SHOAL_SLURM_DIRs; a test fixture and a developer may both call `up`.
take_lock() {
  local lock=/run/lock/shoal-slurm-cluster.lock
  [ -d /run/lock ] || lock=/tmp/shoal-slurm-cluster.lock
  exec 9>"$lock"
  if ! flock -n 9; then
    log "waiting for another cluster.sh up/down to finish ($lock)"
    flock -w 300 9 || die "timed out waiting for $lock"
  fi
}

require_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (namespaces, bridge, mknod, /etc/hosts)"
}

# ---------------------------------------------------------------------------------------
# Packages and munge
# ---------------------------------------------------------------------------------------

pkg_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep "install ok installed" >/dev/null
}

install_packages() {
  local missing=() p
  for p in munge slurm-wlm; do pkg_installed "$p" || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$NO_INSTALL" = 1 ] && die "missing packages (${missing[*]}) and --no-install given"
  log "installing ${missing[*]} (apt-get)"
  # The packages' postinst scripts would start slurmd/slurmctld/munged with the default
  # /etc config; a policy-rc.d that denies starts keeps them from racing our daemons.
  local own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  local rc=0
  {
    apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  } || rc=$?
  if [ "$own_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
  [ "$rc" -eq 0 ] || die "apt-get install failed (rc=$rc)"
}

# Package-started daemons read /etc/slurm and would fight ours over ports 6817/6818.
disable_package_services() {
  local svc
  for svc in slurmd slurmctld; do
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
      systemctl disable --now "$svc" >/dev/null 2>&1 || true
    elif [ -x "/etc/init.d/$svc" ] && command -v update-rc.d >/dev/null; then
      update-rc.d "$svc" disable >/dev/null 2>&1 || true
    fi
  done
  # Any slurm daemon without an explicit -f is a package default one; ours always pass -f.
  local pid args
  # (pgrep -x matches at most 15 characters of the name, so no 'slurmd|slurmctld' regex.)
  for pid in $(pgrep -x slurmd || true) $(pgrep -x slurmctld || true); do
    pid_alive "$pid" || continue
    args=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
    [ -n "$args" ] || continue
    case " $args " in
      *" -f "*) ;;
      *) log "stopping package-default daemon: pid $pid ($args)"; kill "$pid" 2>/dev/null || true ;;
    esac
  done
}

start_munge() {
  if [ ! -s /etc/munge/munge.key ]; then
    log "creating munge key"
    mungekey -c -k /etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
  fi
  # /run is often a fresh tmpfs without the socket directory the package expects.
  install -d -o munge -g munge -m 755 /run/munge
  # Ask munge itself rather than pgrep: an unreaped zombie munged would match pgrep.
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    # 9>&-: a daemon must not inherit the up/down lock, or it holds it for its whole life.
    runuser -u munge -- /usr/sbin/munged 9>&-
  fi
  local i
  for i in $(seq 1 50); do
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  die "munge does not answer (see /var/log/munge/munged.log)"
}

# ---------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------

# Writes slurm.conf, cgroup.conf and gres.conf into $1. `up` also renders into a scratch
# directory and compares, so a running cluster with a stale config counts as unhealthy.
render_config() {
  local out=$1 i
  {
    cat <<EOF
# Generated by tests/slurm/cluster.sh; rewritten on every \`up\`.
ClusterName=shoaltest
SlurmctldHost=$CTL_NAME($CTL_ADDR)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
SwitchType=switch/none
# The default /usr/bin/mail is not installed; slurmctld would log an error at every start.
MailProg=/bin/true
# No cgroup confinement: the box has only cgroup v1 and fake GPUs.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
# Heterogeneous jobs are only ever started by the backfill scheduler, every bf_interval
# (default 30 s); at 1 s a het job starts in about a second instead of up to 30.
SchedulerParameters=bf_interval=1,bf_hetjob_immediate
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default, every job would claim a whole node's memory and nothing would pack.
DefMemPerCPU=512
# Reject at submit time what the partition can never run (srun -n 100 would otherwise
# pend forever), so a test with a wrong request fails fast instead of hanging.
EnforcePartLimits=ALL
# Accept the declared CPUs/memory/GPUs although this machine has far fewer.
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=30
KillWait=5
MessageTimeout=10
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
GresTypes=gpu
StateSaveLocation=$DIR/ctld
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmctldDebug=info
# %n keeps the per-node daemons (same machine, same filesystem) from colliding.
SlurmdSpoolDir=$DIR/spool/%n
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmdDebug=info
EOF
    for i in $(seq 1 "$NODES"); do
      echo "NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") CPUs=8 RealMemory=4096 Gres=gpu:2 State=UNKNOWN"
    done
    if [ "$NODES" -eq 1 ]; then
      echo "PartitionName=debug Nodes=sn1 Default=YES MaxTime=INFINITE State=UP"
    else
      echo "PartitionName=debug Nodes=sn[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
    fi
  } >"$out/slurm.conf"

  # Slurm reads cgroup.conf and gres.conf from the directory of SLURM_CONF.
  cat >"$out/cgroup.conf" <<EOF
# slurmd with GRES refuses to start on a cgroup v1 + empty cgroup2 layout
# unless the v1 plugin is forced.
CgroupPlugin=cgroup/v1
ConstrainDevices=no
EOF
  for i in $(seq 1 "$NODES"); do
    echo "NodeName=$(node_name "$i") Name=gpu File=$DIR/dev/fakegpu[0-1]"
  done >"$out/gres.conf"
}

config_current() {
  local tmp f rc=0
  tmp=$(mktemp -d)
  render_config "$tmp"
  for f in slurm.conf cgroup.conf gres.conf; do
    cmp -s "$tmp/$f" "$DIR/$f" || rc=1
  done
  rm -rf "$tmp"
  return "$rc"
}

write_config() {
  mkdir -p "$DIR"/{ctld,spool,log,run,dev}
  # GRES files must be character devices; slurmd only stats them, so /dev/null's numbers do.
  local g i
  for g in 0 1; do
    [ -c "$DIR/dev/fakegpu$g" ] || { rm -f "$DIR/dev/fakegpu$g"; mknod "$DIR/dev/fakegpu$g" c 1 3; }
  done
  render_config "$DIR"
  write_env
  for i in $(seq 1 "$NODES"); do node_name "$i"; done >"$DIR/nodes"
}

env_text() {
  cat <<EOF
export SLURM_CONF=$CONF
export SHOAL_SLURM_DIR=$DIR
export SHOAL_SLURM_NODES=$NODES
EOF
}

write_env() {
  mkdir -p "$DIR"
  env_text >"$DIR/env.sh"
}

# ---------------------------------------------------------------------------------------
# Network: one namespace per node on a private bridge
# ---------------------------------------------------------------------------------------

hosts_block() {
  echo "$HOSTS_BEGIN"
  echo "$CTL_ADDR $CTL_NAME"
  local i
  for i in $(seq 1 "$NODES"); do echo "$(node_addr "$i") $(node_name "$i")"; done
  echo "$HOSTS_END"
}

hosts_without_block() {
  awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '$0==b{skip=1;next} $0==e{skip=0;next} !skip' /etc/hosts
}

# /etc/hosts is often a bind mount in containers, so rewrite it in place instead of renaming;
# and never empty it first, as `cat >` would: a test resolving localhost in that instant (the
# YARN client, while the cluster went down beside it) found no such host. Overwritten from the
# start, then cut to length, the file always begins with the lines before the block.
write_hosts() {
  local tmp
  tmp=$(mktemp)
  hosts_without_block >"$tmp"
  if [ "${1:-}" = add ]; then hosts_block >>"$tmp"; fi
  if ! cmp -s "$tmp" /etc/hosts; then
    dd if="$tmp" of=/etc/hosts conv=notrunc status=none
    truncate -s "$(stat -c %s "$tmp")" /etc/hosts
  fi
  rm -f "$tmp"
}

# Once the bridge is gone, a client with our SLURM_CONF (a test, a developer's shell) would
# send to 10.213.77.1 through the default route, i.e. off the machine. This low-priority
# route makes such traffic fail locally instead; the bridge's own route wins while it exists.
# It is deliberately left in place by `down`.
guard_route() {
  if ! ip route show table main | grep "^unreachable $NET.0/24 .*metric $GUARD_METRIC" >/dev/null; then
    ip route add unreachable "$NET.0/24" metric "$GUARD_METRIC"
  fi
}

net_up() {
  guard_route
  ip link add "$BRIDGE" type bridge
  ip addr add "$CTL_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local i n
  for i in $(seq 1 "$NODES"); do
    n=$(node_name "$i")
    ip netns add "$n"
    ip link add "veth-$n" type veth peer name "$n-eth0"
    ip link set "veth-$n" master "$BRIDGE"
    ip link set "veth-$n" up
    ip link set "$n-eth0" netns "$n"
    ip -n "$n" addr add "$(node_addr "$i")/24" dev "$n-eth0"
    ip -n "$n" link set "$n-eth0" up
    # Tasks (gloo, NCCL stores) bind and connect to 127.0.0.1 inside the node.
    ip -n "$n" link set lo up
  done
  write_hosts add
}

net_down() {
  local n
  for n in $(all_known_nodes); do
    if ip netns list 2>/dev/null | awk '{print $1}' | grep -x "$n" >/dev/null; then ip netns del "$n"; fi
    # Deleting the namespace deletes the pair; this only catches a pair never moved into it.
    # (The kernel removes it asynchronously after the namespace goes, hence no error check.)
    if ip link show "veth-$n" >/dev/null 2>&1; then ip link del "veth-$n" 2>/dev/null || true; fi
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
  write_hosts remove
}

# ---------------------------------------------------------------------------------------
# Daemons
# ---------------------------------------------------------------------------------------

start_daemons() {
  # Fresh controller state: a cluster from an earlier `up` must not resurrect old jobs.
  rm -rf "$DIR/ctld" "$DIR/spool"
  mkdir -p "$DIR/ctld" "$DIR/spool"
  : >"$DIR/log/slurmctld.log"
  # slurmctld refuses to run unless its hostname matches SlurmctldHost, so give it a
  # UTS namespace named after the controller; it stays in the root network namespace.
  log "starting slurmctld ($CTL_NAME, $CTL_ADDR)"
  unshare --uts sh -c 'hostname "$1"; shift; exec "$@"' sh "$CTL_NAME" \
    slurmctld -f "$CONF" </dev/null >>"$DIR/log/slurmctld.out" 2>&1 9>&- ||
    fail "slurmctld did not start"
  local i n
  for i in $(seq 1 "$NODES"); do
    n=$(node_name "$i")
    mkdir -p "$DIR/spool/$n"
    : >"$DIR/log/slurmd-$n.log"
    log "starting slurmd $n ($(node_addr "$i"))"
    # Own hostname per node: jobs (and gloo) resolve their own hostname to pick an address.
    ip netns exec "$n" unshare --uts sh -c 'hostname "$1"; shift; exec "$@"' sh "$n" \
      slurmd -f "$CONF" -N "$n" </dev/null >>"$DIR/log/slurmd-$n.out" 2>&1 9>&- ||
      fail "slurmd $n did not start"
  done
}

# Waits for a daemon to exit; SIGKILL after a grace period so `down` is always bounded.
stop_pid() {
  local pid=$1 what=$2 i
  pid_alive "$pid" || return 0
  kill "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do
    pid_alive "$pid" || return 0
    sleep 0.1
  done
  log "$what (pid $pid) ignored SIGTERM for 10 s; killing"
  kill -9 "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do
    pid_alive "$pid" || return 0
    sleep 0.1
  done
  die "$what (pid $pid) does not exit"
}

namespace_pids() {
  local n
  for n in $(all_known_nodes); do
    if ip netns list 2>/dev/null | awk '{print $1}' | grep -x "$n" >/dev/null; then
      ip netns pids "$n" 2>/dev/null || true
    fi
  done | tr '\n' ' '
}

# Job steps and their tasks outlive slurmd; they would keep the namespaces (and with them
# the node addresses) alive. This is a throwaway cluster, so a short grace is enough.
kill_namespace_procs() {
  local pids i
  pids=$(namespace_pids)
  [ -n "${pids// /}" ] || return 0
  log "stopping leftover processes in the node namespaces: $pids"
  # shellcheck disable=SC2086
  kill $pids 2>/dev/null || true
  for i in $(seq 1 20); do
    pids=$(namespace_pids)
    [ -n "${pids// /}" ] || return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -9 $pids 2>/dev/null || true
}

stop_daemons() {
  local n pid
  for n in $(all_known_nodes); do
    pid=$(pidfile_pid "$DIR/run/slurmd-$n.pid")
    if pid_alive "$pid"; then log "stopping slurmd $n (pid $pid)"; fi
    stop_pid "$pid" "slurmd $n"
  done
  pid=$(pidfile_pid "$DIR/run/slurmctld.pid")
  if pid_alive "$pid"; then log "stopping slurmctld (pid $pid)"; fi
  stop_pid "$pid" slurmctld
  # Daemons whose pid file is gone (crashed mid-start, deleted state dir) still name our conf.
  local stray
  for pid in $(pgrep -f -- "-f $CONF" || true); do
    stray=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
    case "$stray" in
      *slurmd* | *slurmctld* | *slurmstepd*)
        log "stopping stray daemon pid $pid ($stray)"
        stop_pid "$pid" "pid $pid"
        ;;
    esac
  done
  kill_namespace_procs
  rm -f "$DIR"/run/*.pid
}

# ---------------------------------------------------------------------------------------
# Health
# ---------------------------------------------------------------------------------------

# Prints the tails of every daemon log, then exits: used for every failure after start.
fail() {
  echo "slurm-cluster: error: $*" >&2
  local f
  for f in "$DIR"/log/slurmctld.log "$DIR"/log/slurmctld.out "$DIR"/log/slurmd-*.log "$DIR"/log/slurmd-*.out; do
    [ -s "$f" ] || continue
    echo "----- tail -n 25 $f" >&2
    tail -n 25 "$f" >&2
  done
  echo "slurm-cluster: logs are in $DIR/log; \`$0 down\` cleans up" >&2
  exit 1
}

# Node states from sinfo, one per node ("idle", "idle*", "down*", ...).
node_states() {
  timeout 15 sinfo -h -N -o '%N %T' 2>/dev/null | sort -u
}

all_nodes_up() {
  local states n i
  states=$(node_states) || return 1
  [ "$(printf '%s\n' "$states" | grep -c .)" -eq "$NODES" ] || return 1
  for i in $(seq 1 "$NODES"); do
    n=$(node_name "$i")
    printf '%s\n' "$states" | grep -Eq "^$n (idle|mixed|allocated|completing)$" || return 1
  done
}

all_nodes_idle() {
  local states
  states=$(node_states) || return 1
  [ "$(printf '%s\n' "$states" | grep -c .)" -eq "$NODES" ] || return 1
  ! printf '%s\n' "$states" | grep -vEq ' idle$'
}

# Anything of ours left around: a running daemon, a namespace, the bridge or the hosts block.
anything_present() {
  local n
  pid_alive "$(pidfile_pid "$DIR/run/slurmctld.pid")" && return 0
  for n in $(all_known_nodes); do
    pid_alive "$(pidfile_pid "$DIR/run/slurmd-$n.pid")" && return 0
    ip netns list 2>/dev/null | awk '{print $1}' | grep -x "$n" >/dev/null && return 0
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && return 0
  grep -qxF "$HOSTS_BEGIN" /etc/hosts && return 0
  pgrep -f -- "-f $CONF" >/dev/null && return 0
  return 1
}

# Prints the slurm.conf of a slurmctld that belongs to a different state directory, if any.
other_cluster_conf() {
  local pid args conf
  for pid in $(pgrep -x slurmctld || true); do
    pid_alive "$pid" || continue
    args=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null || true)
    conf=$(printf '%s\n' "$args" | awk 'prev=="-f"{print; exit} {prev=$0}')
    if [ -n "$conf" ] && [ "$conf" != "$CONF" ]; then
      echo "$conf"
      return 0
    fi
  done
}

healthy() {
  config_current || return 1
  # The recorded cluster must be the one asked for (SHOAL_SLURM_NODES may have changed).
  [ "$(recorded_nodes | tr '\n' ' ')" = "$(for i in $(seq 1 "$NODES"); do node_name "$i"; done | tr '\n' ' ')" ] || return 1
  pid_alive "$(pidfile_pid "$DIR/run/slurmctld.pid")" || return 1
  local i
  for i in $(seq 1 "$NODES"); do
    pid_alive "$(pidfile_pid "$DIR/run/slurmd-$(node_name "$i").pid")" || return 1
  done
  grep -qxF "$HOSTS_BEGIN" /etc/hosts || return 1
  ip link show "$BRIDGE" >/dev/null 2>&1 || return 1
  all_nodes_up
}

wait_idle() {
  local start now
  start=$SECONDS
  while ! all_nodes_idle; do
    now=$((SECONDS - start))
    if ((now >= WAIT_IDLE_S)); then
      echo "slurm-cluster: sinfo after ${WAIT_IDLE_S}s:" >&2
      timeout 15 sinfo -N -l >&2 || true
      fail "nodes not idle after ${WAIT_IDLE_S}s"
    fi
    if ((now > 0 && now % 5 == 0)); then
      log "waiting for nodes to become idle (${now}s): $(node_states | tr '\n' ' ')"
    fi
    sleep 1
  done
  log "all $NODES nodes idle after $((SECONDS - start))s"
}

smoke() {
  local out want err i
  err=$(mktemp)
  want=$(for i in $(seq 1 "$NODES"); do node_name "$i"; done | sort | paste -sd' ')
  out=$(timeout 30 srun -N "$NODES" -n "$NODES" hostname 2>"$err" | sort | paste -sd' ') || true
  [ "$out" = "$want" ] ||
    fail "smoke: srun -N$NODES -n$NODES hostname printed '$out' (expected '$want'): $(cat "$err")"
  log "smoke: srun -N$NODES -n$NODES hostname -> $out"
  out=$(timeout 30 srun -N1 -n1 --gres=gpu:1 env 2>"$err" | grep '^CUDA_VISIBLE_DEVICES=') || true
  [ -n "$out" ] || fail "smoke: srun --gres=gpu:1 did not set CUDA_VISIBLE_DEVICES: $(cat "$err")"
  log "smoke: srun -N1 -n1 --gres=gpu:1 -> $out"
  rm -f "$err"
}

# ---------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------

cmd_down() {
  require_root
  take_lock
  stop_daemons
  net_down
  guard_route
  log "down"
}

cmd_up() {
  require_root
  take_lock
  local t0=$SECONDS
  install_packages
  disable_package_services
  start_munge
  if healthy; then
    write_env
    log "already up and healthy ($NODES nodes); eval \"\$($0 env)\" or source $DIR/env.sh"
    return 0
  fi
  # The bridge, namespaces and ports are machine-wide: one cluster at a time.
  local other
  other=$(other_cluster_conf)
  if [ -n "$other" ]; then
    die "another test cluster is running with $other; stop it first: SHOAL_SLURM_DIR=$(dirname "$other") $0 down"
  fi
  if anything_present; then
    log "found a half-up, unhealthy or outdated cluster; tearing it down first"
    stop_daemons
    net_down
  fi
  write_config
  log "creating bridge $BRIDGE ($CTL_ADDR/24) and $NODES node namespaces"
  net_up
  start_daemons
  wait_idle
  smoke
  log "up in $((SECONDS - t0))s; eval \"\$($0 env)\" or source $DIR/env.sh"
}

cmd_status() {
  # Without our controller and bridge, sinfo would only reach for an address that is not ours.
  if ! pid_alive "$(pidfile_pid "$DIR/run/slurmctld.pid")" || ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    log "down (no slurmctld for $CONF)"
    return 1
  fi
  timeout 15 sinfo 2>&1 || { log "controller not answering (SLURM_CONF=$CONF)"; return 1; }
  local i n dead=()
  # A killed slurmd shows as up in sinfo until SlurmdTimeout passes; look at the processes too.
  for i in $(seq 1 "$NODES"); do
    n=$(node_name "$i")
    pid_alive "$(pidfile_pid "$DIR/run/slurmd-$n.pid")" || dead+=("$n")
  done
  if [ ${#dead[@]} -gt 0 ]; then
    log "slurmd not running on: ${dead[*]}"
    return 1
  fi
  if all_nodes_up; then
    log "all $NODES nodes up"
    return 0
  fi
  log "not all $NODES nodes are up"
  return 1
}

cmd_env() {
  env_text
  # Keep env.sh on disk in step with what we print, without needing root to read it.
  write_env 2>/dev/null || true
}

usage() {
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

NO_INSTALL=0
cmd=${1:-}
[ $# -gt 0 ] && shift
for arg in "$@"; do
  case "$arg" in
    --no-install) NO_INSTALL=1 ;;
    -h | --help) usage ;;
    *) die "unknown argument '$arg'" ;;
  esac
done

case "$cmd" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  -h | --help | help | '') usage ;;
  *) die "unknown command '$cmd' (up|down|status|env)" ;;
esac
