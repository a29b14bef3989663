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
                                 .reap_budget = 16, .registered = false, .prefetch_next = true,
                                 .prefault_on_helper = true};

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

/// A worker's own blocks (`use_thread_cache`): a job's end frees its task actor on one
/// worker and the next job's admission takes one there, and both went through the slab's
/// lock (5% of a burst of jobs on two workers, spent in the mutex). A worker keeps up to
/// `cache_cap` blocks it freed and takes the latest freed first (its lines are the
/// warmest); a full cache gives its `refill` oldest back under one lock. An empty one
/// takes from the slab, one block at a time (taking 16 at once measured no better for a
/// spawn loop: the slab already prefetches the block it hands out next). A worker gives
/// them all back when it ends and when it has slept through a long park
/// (flush_thread_cache), so an idle process still returns a burst's chunks.
constexpr std::size_t cache_cap = 32;
constexpr std::size_t refill = 16;

struct thread_cache {
  void* items[cache_cap];
  std::size_t count = 0;
  std::size_t block = 0; // the slab's block size, once known
  ~thread_cache();
  /// The slab's block size (0 while no task actor was ever made): a worker that only frees
  /// blocks (its tasks were made on another) keeps them too.
  std::size_t block_size() noexcept {
    if (block == 0) [[unlikely]]
      block = the_slab().block_size();
    return block;
  }
  void give_back(std::size_t k) noexcept {
    // The oldest first: the latest freed stay (the warmest).
    the_slab().deallocate_batch(items, k);
    std::copy(items + k, items + count, items);
    count -= k;
  }
};

// Trivially destructible: readable while the cache's destructor runs and after it (a block
// freed by this thread later goes straight to the slab).
thread_local bool cache_on = false;
thread_local thread_cache cache;

thread_cache::~thread_cache() {
  cache_on = false;
  if (count > 0) give_back(count);
}

} // namespace

void use_thread_cache() noexcept {
#ifndef TROUPE_SLAB_OFF
  if (!cache_on) {
    cache_on = true;
    (void)cache.count; // constructs the thread's cache (and registers its destructor)
  }
#endif
}

void flush_thread_cache() noexcept {
#ifndef TROUPE_SLAB_OFF
  if (cache_on && cache.count > 0) cache.give_back(cache.count);
#endif
}

bool enabled() noexcept {
#ifdef TROUPE_SLAB_OFF
  return false;
#else
  return true;
#endif
}

void* allocate(std::size_t n) {
#ifndef TROUPE_SLAB_OFF
  if (cache_on && cache.count > 0 && n != 0 && n <= cache.block) {
    auto& c = cache;
    auto* p = c.items[--c.count];
    if (c.count > 0) prefetch_for_write(c.items[c.count - 1], c.block); // the next one
    return p;
  }
  if (auto* p = the_slab().allocate(n)) return p;
#endif
  return ::operator new(n, std::align_val_t{line});
}

void deallocate(void* p, std::size_t n) noexcept {
  if (p == nullptr) return;
#ifndef TROUPE_SLAB_OFF
  if (cache_on && n != 0 && n <= cache.block_size()) {
    auto& c = cache;
    if (c.count == cache_cap) c.give_back(refill);
    c.items[c.count++] = p;
    return;
  }
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
