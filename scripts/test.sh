#!/usr/bin/env bash
# Install what is missing, build, and run the whole test suite three times: an optimised
# build, an AddressSanitizer + UndefinedBehaviorSanitizer build, and a ThreadSanitizer build
# against a TSan-built CAF (scripts/tsan-caf.sh builds it once per machine; any report fails).
# TROUPE_SKIP_TSAN=1 leaves the third stage out (a quick local run).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
jobs=${TROUPE_JOBS:-2}

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure --timeout 600)

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTROUPE_SANITIZE=ON \
      -DTROUPE_BUILD_BENCH=OFF > /dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ctest --output-on-failure --timeout 900 -E '^consumer_')

[ "${TROUPE_SKIP_TSAN:-0}" = 1 ] && exit 0
unset ASAN_OPTIONS UBSAN_OPTIONS
caf_tsan=$(./scripts/tsan-caf.sh)
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_TSAN=ON \
      -DTROUPE_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="$caf_tsan" > /dev/null
cmake --build build-tsan -j"$jobs"
export TSAN_OPTIONS="second_deadlock_stack=1 history_size=4"
(cd build-tsan && ctest --output-on-failure --timeout 1200 -E '^consumer_')
