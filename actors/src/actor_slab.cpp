// The task actors' slab (see actor_slab.hpp): 2 MB chunks of fixed-size blocks, one lock.

#include "troupe/actors/detail/actor_slab.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string_view>
#include <utility>

#include <pthread.h>
#include <sys/mman.h>

#include "chunk_slab.hpp"
#include "under_asan.hpp"

#ifdef TROUPE_UNDER_ASAN
#define TROUPE_SLAB_OFF 1
#endif

namespace troupe::detail::actor_slab {

namespace {

constexpr std::size_t line = 64;

/// The task actors' slab: the block size is set by the first actor; empty chunks wait for
/// the next burst, up to 128 (256 MB, about 180k task actors), one of them kept for good
/// (a burst's first blocks never wait for a mapping).
using slab = chunk_slab<std::mutex>;
constexpr chunk_slab_shape shape{.block = 0, .align = line, .cap_chunks = 128, .floor_chunks = 1,
                                 .reap_budget = 16, .registered = false, .prefetch_next = true};

/// Never destroyed: an actor freed during static destruction still finds it.
slab& the_slab() {
  static auto* s = [] {
    auto* sl = new slab{shape};
    ::pthread_atfork([] { the_slab().mtx_.lock(); }, [] { the_slab().mtx_.unlock(); },
                     [] { the_slab().mtx_.unlock(); });
    return sl;
  }();
  return *s;
}

} // namespace

bool enabled() noexcept {
#ifdef TROUPE_SLAB_OFF
  return false;
#else
  return true;
#endif
}

void* allocate(std::size_t n) {
#ifndef TROUPE_SLAB_OFF
  if (auto* p = the_slab().allocate(n)) return p;
#endif
  return ::operator new(n, std::align_val_t{line});
}

void deallocate(void* p, std::size_t n) noexcept {
  if (p == nullptr) return;
#ifndef TROUPE_SLAB_OFF
  if (the_slab().deallocate(p, n)) return;
#endif
  ::operator delete(p, std::align_val_t{line});
}

counters stats() noexcept { return the_slab().stats(); }

void reap_idle() noexcept {
#ifndef TROUPE_SLAB_OFF
  the_slab().reap_idle();
#endif
}

void reap_now() noexcept {
#ifndef TROUPE_SLAB_OFF
  if (the_slab().reap_pass(true))
    while (the_slab().reap_pass(false)) {
    } // the budget's leftovers
#endif
}

std::chrono::nanoseconds set_reap_interval(std::chrono::nanoseconds d) noexcept {
  return the_slab().set_reap_interval(d);
}

} // namespace troupe::detail::actor_slab
