#!/usr/bin/env bash
# Install what is missing, build, and run the whole test suite twice: an optimised build,
# then an AddressSanitizer + UndefinedBehaviorSanitizer build.
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
