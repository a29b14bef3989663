#pragma once

// Internal: a recycling allocator for the small blocks troupe allocates per message, per job
// and per coroutine (coroutine frames, pool records, shared cells).
//
// Why: in an actor system a block is often allocated on one worker thread and freed on the
// other (a job record made where the pool actor ran last, freed where it runs now). glibc's
// per-thread cache holds 7 blocks per size; past that every such free takes the owning
// arena's lock while that thread allocates from it, and the two threads convoy on the futex
// (measured: 10% of `pool_dispatch` in futex waits under `_int_free`). Here a thread keeps
// two magazines of up to 64 blocks per size class and trades whole magazines with a shared
// depot, so blocks that cross threads cost one lock per 64 (Bonwick's magazine design).
//
// Where blocks come from: `::operator new` of the class size, until a burst has taken 1 MB
// of one class; from then on that class's blocks come from 2 MB chunks of its own (see
// actors/src/chunk_slab.hpp; huge pages only on request), because glibc grows a worker
// thread's heap one page at a time with a page fault and an `mprotect` call each, and a page
// fault is dear. So a block must be freed through `deallocate`, never `::operator delete`.
// Under AddressSanitizer the recycler is off (every call goes to `::operator new` /
// `::operator delete`), so a use after free is still caught.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace troupe::detail::recycler {

/// Blocks up to this size are recycled; larger ones go to `::operator new`.
inline constexpr std::size_t max_small = 4096;

/// Returns a block of at least `n` bytes, aligned for any fundamental type.
void* allocate(std::size_t n);

/// Frees a block `allocate(n)` returned (`n`: the same size).
void deallocate(void* p, std::size_t n) noexcept;

/// Counters of this process (for tests and diagnostics). The depot counts are exact; a
/// thread adds its hits and misses when it asks for `stats()`, every 1024 misses, and when
/// it ends.
struct counters {
  /// Blocks served from a thread's magazines, and trips beyond them and the depot (to
  /// `::operator new` for one block, or to the class's chunks for up to 32).
  uint64_t hits = 0;
  uint64_t misses = 0;
  /// Magazines handed to the depot full, and taken from it.
  uint64_t depot_puts = 0;
  uint64_t depot_takes = 0;
  /// Blocks freed to `::operator delete` because the depot was at its cap.
  uint64_t overflow_frees = 0;
  /// Blocks the reaper gave back (they sat unused in the depot through a whole interval),
  /// and the reaping intervals begun.
  uint64_t reaped = 0;
  uint64_t reaps = 0;
  /// Blocks taken from the size classes' own 2 MB chunks (a class's blocks come from
  /// there once a burst took 1 MB of it from `::operator new`), and the chunks mapped now.
  uint64_t chunk_blocks = 0;
  uint64_t chunks = 0;
};
counters stats() noexcept;

/// Lets the reaper run if an interval has passed (cheap otherwise: a clock read). The depot
/// keeps the blocks of a burst for the next one, up to 64 MB per size class, and gives back
/// every 10 s those that sat unused all through the last 10 s; trades with the depot call
/// this, and so do troupe's idle workers when their sleep times out, so an idle process
/// gives a burst's memory back within about 20-30 s (paced: ~0.5% of a core at most).
void reap_idle() noexcept;

/// Begins a reaping interval now and frees what sat unused through the last one (tests:
/// two calls in a row free every block the depot holds above its floor).
void reap_now() noexcept;

/// Returns the blocks the depot holds for the size class of `n` bytes (diagnostics).
std::size_t depot_blocks(std::size_t n) noexcept;

/// Sets the reaping interval (10 s unless set; tests set it to zero, so every `reap_idle`
/// begins an interval); returns the one it replaces.
std::chrono::nanoseconds set_reap_interval(std::chrono::nanoseconds d) noexcept;

/// Returns whether blocks are recycled in this build (false under AddressSanitizer).
bool enabled() noexcept;

/// A standard allocator over the recycler (for node containers and `allocate_shared`).
/// Over-aligned types go to the aligned `::operator new`.
template <class T>
struct allocator {
  using value_type = T;
  allocator() noexcept = default;
  template <class U>
  allocator(const allocator<U>&) noexcept {} // NOLINT: rebinding is implicit
  static constexpr bool over_aligned = alignof(T) > __STDCPP_DEFAULT_NEW_ALIGNMENT__;
  T* allocate(std::size_t n) {
    if constexpr (over_aligned)
      return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{alignof(T)}));
    else
      return static_cast<T*>(recycler::allocate(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if constexpr (over_aligned)
      ::operator delete(p, std::align_val_t{alignof(T)});
    else
      recycler::deallocate(p, n * sizeof(T));
  }
  template <class U>
  bool operator==(const allocator<U>&) const noexcept {
    return true;
  }
};

/// `std::make_shared` through the recycler.
template <class T, class... Ts>
std::shared_ptr<T> make_shared(Ts&&... xs) {
  return std::allocate_shared<T>(allocator<T>{}, std::forward<Ts>(xs)...);
}

} // namespace troupe::detail::recycler
