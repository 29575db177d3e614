#!/usr/bin/env bash
# Builds the fuzz targets (clang, libFuzzer, ASan, UBSan) in their own build folder and runs
# each for a bounded time over its stored corpus; docs/design/0007-fuzzing.md says why.
#   fuzz/run.sh                 every target, FUZZ_SECONDS (default 30) each
#   fuzz/run.sh fuzz_journal    only the targets named
# Environment: FUZZ_SECONDS, FUZZ_BUILD_DIR (default build-fuzz), CXX/CC (default clang++ /
# clang, else clang++-14 / clang-14), FUZZ_JOBS for ninja (default 2).
# A target passes when it ran its whole time without a crash, a leak, a UBSan finding, an input
# over 10 s or 2 GiB. A failing input is kept as <build>/fuzz/crashes/<target>/crash-<sha1>
# (and the libFuzzer log beside it); reproduce it with
#   <build>/fuzz/<target> <that file>
# The last line of output is "fuzz: N passed, M failed"; the exit status is 1 when M > 0.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
build=${FUZZ_BUILD_DIR:-build-fuzz}
seconds=${FUZZ_SECONDS:-30}
all_targets=(fuzz_job_spec fuzz_infer_request fuzz_http_request fuzz_sdk_protocol fuzz_journal)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")

pick() { for c in "$@"; do command -v "$c" >/dev/null && { echo "$c"; return; }; done; }
cxx=${CXX:-$(pick clang++ clang++-14)}
cc=${CC:-$(pick clang clang-14)}
if [ -z "$cxx" ] || [ -z "$cc" ]; then
  echo "fuzz: no clang found; setup.sh installs Debian's clang-14 and libclang-rt-14-dev" >&2
  echo "fuzz: 0 passed, ${#targets[@]} failed"
  exit 1
fi

# shellcheck source=../tools/ccache_env.sh
. tools/ccache_env.sh
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
start=$SECONDS
mkdir -p "$build"
if [ ! -f "$build/build.ninja" ]; then
  CXX=$cxx CC=$cc cmake -S . -B "$build" -G Ninja -DSHOAL_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >"$build/configure.log" 2>&1 || {
    cat "$build/configure.log" >&2
    echo "fuzz: configuring $build failed"
    echo "fuzz: 0 passed, ${#targets[@]} failed"
    exit 1
  }
fi
if ! ninja -C "$build" -j"${FUZZ_JOBS:-2}" "${targets[@]}"; then
  echo "fuzz: building the fuzz targets failed"
  echo "fuzz: 0 passed, ${#targets[@]} failed"
  exit 1
fi
echo "fuzz: built in $((SECONDS - start)) s; running each target for ${seconds} s"

# UBSan's report names our frame, not only the library header where the conversion happened.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
passed=0
failed=0
failures=()
for target in "${targets[@]}"; do
  stored=$repo/fuzz/corpus/$target
  # New inputs go to the first folder, a writable copy kept in the build folder: the stored
  # corpus changes only when someone copies an input into it (a regression input, or a seed
  # worth keeping; fuzz/README.md).
  work=$build/fuzz/corpus/$target
  crashes=$build/fuzz/crashes/$target
  log=$build/fuzz/logs/$target.log
  mkdir -p "$work" "$crashes" "$(dirname "$log")"
  dict=()
  [ -f "$repo/fuzz/$target.dict" ] && dict=(-dict="$repo/fuzz/$target.dict")
  rc=0
  "$build/fuzz/$target" "$work" "$stored" "${dict[@]}" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$crashes/" -print_final_stats=1 >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    echo "fuzz: $target passed (${execs:-?} inputs, corpus $(ls "$work" | wc -l) + $(ls "$stored" | wc -l) stored)"
  else
    failed=$((failed + 1))
    failures+=("$target")
    echo "fuzz: $target FAILED (exit $rc); its log, $log, ends:"
    grep -E "ERROR|SUMMARY|runtime error|Test unit written|deadly signal" "$log" | head -20
    tail -n 40 "$log"
    cp "$log" "$crashes/"
    echo "fuzz: failing inputs in $crashes:"
    ls -l "$crashes"
  fi
done
echo "fuzz: took $((SECONDS - start)) s in all"
[ ${#failures[@]} -eq 0 ] || echo "fuzz: failed: ${failures[*]}"
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
