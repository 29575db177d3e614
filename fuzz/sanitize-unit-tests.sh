#!/usr/bin/env bash
# The C++ unit tests (the GoogleTest binaries under tests/, not the end-to-end tests) built with
# gcc's AddressSanitizer and UndefinedBehaviorSanitizer in a build folder of their own, then run.
# Not part of .ci/run: docs/design/0007-fuzzing.md gives its time and why.
#   fuzz/sanitize-unit-tests.sh                        build and run every test binary
#   fuzz/sanitize-unit-tests.sh spec_test common_test  only these
# Environment: SANITIZE_BUILD_DIR (default build-asan), SANITIZE_JOBS for ninja (default 2).
# The last line of output is "sanitized unit tests: N passed, M failed" (binaries).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${SANITIZE_BUILD_DIR:-build-asan}
sanitizers="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
start=$SECONDS
mkdir -p "$build"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
    -DCMAKE_CXX_FLAGS="$sanitizers" -DCMAKE_C_FLAGS="$sanitizers" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" >"$build/configure.log" 2>&1 || {
    cat "$build/configure.log" >&2
    echo "sanitized unit tests: 0 passed, 1 failed"
    exit 1
  }
fi
if [ $# -gt 0 ]; then
  tests=("$@")
  extra=()
else
  mapfile -t tests < <(ninja -C "$build" -t targets all |
                       sed -n 's/^\([a-z0-9_]*_test\): phony$/\1/p' | grep -v '^cmake_' | sort)
  extra=(shoal)  # backend_contract_test starts the binary (SHOAL_BINARY)
fi
if ! ninja -C "$build" -j"${SANITIZE_JOBS:-2}" "${extra[@]}" "${tests[@]}"; then
  echo "sanitized unit tests: 0 passed, ${#tests[@]} failed (the build failed)"
  exit 1
fi
echo "sanitized unit tests: built in $((SECONDS - start)) s"
passed=0
failed=0
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
for test in "${tests[@]}"; do
  binary=$(find "$build/tests" -type f -name "$test" -perm -u+x | head -1)
  [ -n "$binary" ] || continue
  log=$build/sanitize-logs/$test.log
  mkdir -p "$(dirname "$log")"
  t0=$SECONDS
  if "$binary" >"$log" 2>&1; then
    passed=$((passed + 1))
    echo "sanitized unit tests: $test passed ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1))
    echo "sanitized unit tests: $test FAILED ($((SECONDS - t0)) s); $log:"
    grep -E "runtime error|ERROR: AddressSanitizer|ERROR: LeakSanitizer|SUMMARY|\[  FAILED  \]" "$log" | head -20
  fi
done
echo "sanitized unit tests: took $((SECONDS - start)) s in all"
echo "sanitized unit tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
