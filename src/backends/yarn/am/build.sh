#!/usr/bin/env bash
# Builds Shoal's YARN application master, am/target/shoal-yarn-am.jar (docs/backends/yarn.md),
# with Maven: offline first (the jars it compiles against are Hadoop's, which the YARN test
# cluster's build already put into the repository), Maven Central only when that fails. Skipped
# while the jar is newer than its sources; one Maven build of it at a time on this machine.
#
# Environment: SHOAL_M2_REPO (default /var/cache/shoal/m2), JAVA_HOME.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
JAR=$HERE/target/shoal-yarn-am.jar
M2=${SHOAL_M2_REPO:-/var/cache/shoal/m2}

die() { echo "yarn-am: error: $*" >&2; exit 1; }

current() {
  [ -s "$JAR" ] && [ -z "$(find "$HERE/pom.xml" "$HERE/src" -newer "$JAR" -print -quit)" ]
}

current && exit 0
command -v mvn >/dev/null ||
  die "Maven is missing; install it: sudo apt-get install -y maven openjdk-17-jdk-headless (or ./setup.sh)"
lock=/run/lock/shoal-yarn-am-build.lock
[ -w /run/lock ] || lock=/tmp/shoal-yarn-am-build.lock
exec 8>"$lock"
flock -w 900 8 || die "timed out waiting for $lock"
current && exit 0
mkdir -p "$M2" 2>/dev/null || true
[ -w "$M2" ] || die "Maven's repository $M2 is not writable; run ./setup.sh or set SHOAL_M2_REPO"
mvn=(nice -n 10 mvn -B -q -f "$HERE/pom.xml" "-Dmaven.repo.local=$M2")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "yarn-am: building $JAR (Maven, repository $M2)" >&2
if ! "${mvn[@]}" -o package >"$out" 2>&1; then
  echo "yarn-am: not everything is in $M2 yet; downloading (Maven Central)" >&2
  if ! "${mvn[@]}" package >"$out" 2>&1; then
    tail -n 40 "$out" >&2
    die "Maven build failed: (cd $HERE && mvn -Dmaven.repo.local=$M2 package)"
  fi
fi
touch "$JAR"
