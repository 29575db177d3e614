#!/usr/bin/env bash
# Runs YARN's DistributedShell example application on the test cluster (tests/yarn/cluster.sh),
# the yardstick the YARN backend's benchmark compares against:
#
#   tests/yarn/dshell.sh -shell_command hostname -num_containers 2
#
# The arguments go to org.apache.hadoop.yarn.applications.distributedshell.Client (run it with
# -help for the list), after `-jar <its jar>` and these defaults for flags not given:
# -master_memory 512 -container_memory 256 -timeout 300000. (The client caps -master_memory
# and -container_memory at what one NodeManager offers, with a warning.) The client submits the
# application, follows it, and exits 0 only if it finished SUCCEEDED. It logs on stderr,
# including "Submitted application application_..."; each container's stdout and stderr stay
# under $SHOAL_YARN_DIR/work/target/ (no log aggregation).
#
# Environment: SHOAL_YARN_DIR (default /tmp/shoal-yarn), SHOAL_YARN_JAVA as for cluster.sh.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(realpath -m "${SHOAL_YARN_DIR:-/tmp/shoal-yarn}")
TARGET=$HERE/minicluster/target

die() { echo "yarn-dshell: error: $*" >&2; exit 1; }

[ -s "$DIR/env" ] || die "the cluster in $DIR is not up; start it: $HERE/cluster.sh up"
shopt -s nullglob
ds_jars=("$TARGET"/lib/hadoop-yarn-applications-distributedshell-*.jar)
[ ${#ds_jars[@]} -eq 1 ] || die "no DistributedShell jar in $TARGET/lib; build it: $HERE/cluster.sh build"

java=${SHOAL_YARN_JAVA:-}
if [ -z "$java" ] && [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then java=$JAVA_HOME/bin/java; fi
[ -n "$java" ] || java=$(command -v java || true)
[ -n "$java" ] || die "no Java found; install it: sudo apt-get install -y openjdk-17-jdk-headless"
# The application master's command line is $JAVA_HOME/bin/java, expanded in its container.
JAVA_HOME=$(dirname "$(dirname "$(readlink -f "$java")")")
export JAVA_HOME

# commons-cli keeps the first of repeated flags, so a default goes in only when not given.
defaults=()
for flag_value in "-master_memory 512" "-container_memory 256" "-timeout 300000"; do
  flag=${flag_value%% *}
  given=0
  for arg in "$@"; do [ "$arg" = "$flag" ] && given=1; done
  [ "$given" = 1 ] || defaults+=("$flag" "${flag_value#* }")
done

# The conf dir tells the client where the ResourceManager and HDFS are, and (yarn.is.minicluster)
# to give the application master this same classpath: the NodeManagers run on this machine.
exec "$java" -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
  -cp "$DIR/conf:$TARGET/shoal-yarn-minicluster.jar:$TARGET/lib/*" \
  org.apache.hadoop.yarn.applications.distributedshell.Client \
  -jar "${ds_jars[0]}" "${defaults[@]}" "$@"
