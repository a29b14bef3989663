#!/usr/bin/env bash
# Builds CAF 0.17.6 with ThreadSanitizer from Debian's own source package, once per machine,
# and prints its install prefix. Debian's libcaf is not instrumented: a TSan build of troupe
# against it reads every hand-off through CAF's mailboxes as a race (about a thousand false
# reports), so the TSan stage of scripts/test.sh links this one instead.
#
# The prefix is $TROUPE_TSAN_CACHE/caf-0.17.6-tsan (default cache: /var/cache/troupe); a
# finished build leaves a stamp there and is reused by every later run and checkout.
set -euo pipefail
cache=${TROUPE_TSAN_CACHE:-/var/cache/troupe}
prefix=$cache/caf-0.17.6-tsan
stamp=$prefix/.troupe-tsan-built
if [ -f "$stamp" ]; then
  echo "$prefix"
  exit 0
fi
jobs=${TROUPE_JOBS:-2}
work=$cache/caf-src
mkdir -p "$work/parts" "$work/lists/partial"
cd "$work"
tarball=actor-framework_0.17.6.orig.tar.gz
if [ ! -f "$tarball" ]; then
  # Debian's source entries, read from the binary ones, in a private apt state (the
  # machine's own sources stay as they are).
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > parts/src.sources
  apt=(apt-get -o Dir::Etc::SourceParts="$work/parts" -o Dir::State::Lists="$work/lists")
  "${apt[@]}" update > /dev/null
  # Only the upstream tarball is needed: a failing Debian patch download does not matter.
  "${apt[@]}" source --download-only actor-framework > /dev/null 2>&1 || true
fi
if [ ! -f "$tarball" ]; then
  echo "tsan-caf: could not download $tarball (apt-get source actor-framework)" >&2
  exit 1
fi
rm -rf actor-framework-0.17.6
tar xzf "$tarball"
src=$work/actor-framework-0.17.6
# The upstream tarball misses one include that GCC 12's and clang's libstdc++ need.
hdr=$src/libcaf_io/caf/io/network/receive_buffer.hpp
grep -q '<limits>' "$hdr" || sed -i '0,/^#include/s//#include <limits>\n#include/' "$hdr"
cmake -S "$src" -B "$src/build-tsan" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
  -DCAF_NO_EXAMPLES=yes -DCAF_NO_UNIT_TESTS=yes -DCAF_NO_OPENCL=yes -DCAF_NO_PYTHON=yes \
  -DCAF_NO_TOOLS=yes -DCAF_NO_AUTO_LIBCPP=yes -DCMAKE_INSTALL_PREFIX="$prefix" > /dev/null
cmake --build "$src/build-tsan" -j"$jobs" > /dev/null
cmake --install "$src/build-tsan" > /dev/null
rm -rf "$src"
touch "$stamp"
echo "$prefix"
