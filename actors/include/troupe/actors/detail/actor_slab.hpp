#pragma once

// Internal: where task actors live. Every troupe task is a CAF actor whose storage (CAF's
// control block and the actor, about 1.4 KB) is the bulk of what a task costs in memory.
//
// Why not the general allocator: a burst of tasks (a loop spawning 100k, a scope fanning
// out) needs that many blocks at once, and glibc grows a worker thread's heap one 4 KB page
// at a time, each with an `mprotect` call and a page fault of its own. Measured on this
// project's CI machine: 46.5k page faults and 43.6k `mprotect` calls per 100k spawned tasks,
// about half of `spawn_await`'s time in the kernel; touching 180 MB page by page took 0.6 s,
// the same memory as 2 MB huge pages 0.012-0.3 s. So task actors come from 2 MB chunks of
// their own, mapped 2 MB-aligned: no `mprotect`, and a kept chunk needs no fault again.
// `TROUPE_HUGEPAGES=1` in the environment marks them for transparent huge pages
// (MADV_HUGEPAGE); off by default, as a fresh huge page cost ~4 ms on the CI machines, whose
// host takes free memory back (chunk_slab.hpp, docs/architecture.md).
//
// Rules that keep the memory honest:
// - blocks are handed out from the fullest chunk that has room, so the others drain;
// - a chunk whose last block comes back waits, empty and still mapped, for the next burst
//   (its pages, huge ones included, need no fault then): up to 128 empty chunks (256 MB,
//   about 180k task actors); past that it is unmapped at once. The working set, as the
//   recycler's depot keeps it: every 10 s the empty chunks that sat unused all through the
//   last 10 s are unmapped, down to one (at most 4 per pass, paced: reap_pacer, ~0.5% of a
//   core). An idle process gives a burst's chunks back within about 20-30 s.
//   `scope_fanout`'s spawn loop (100k tasks): 44-70 ms per round on kept chunks, 49-259 ms
//   when each burst mapped (and faulted in) fresh ones;
// - one lock serialises the slab (a few stores per call; blocks cross threads, as an actor
//   made on one worker often ends on the other); mapping and unmapping a chunk, and the
//   first touch of a new chunk, happen outside it. troupe's workers keep up to 32 blocks
//   they freed (use_thread_cache) and give 16 back at a time;
// - a chunk stays mapped while any block of it is in use: one long-lived task (or a weak
//   reference to an ended one, such as an `actor_addr` kept somewhere) holds its 2 MB (its
//   touched pages; with huge pages, the whole of it). Handing out blocks from the fullest
//   chunk first keeps such pins few.
// Under AddressSanitizer the slab is off (every block comes from `::operator new`), so a use
// after free of a task actor is still caught.

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace troupe::detail::actor_slab {

/// The size of a chunk (and its alignment): one transparent huge page.
inline constexpr std::size_t chunk_bytes = std::size_t{2} << 20;

/// Returns a block of at least `n` bytes, 64-byte aligned, for a task actor's storage.
/// `n` is the same for every call in a process (the size of the storage class): the first
/// call sets the block size, and a larger request than that, a zero one or one too large
/// for a chunk goes to `::operator new` (aligned), as does every request under ASan.
void* allocate(std::size_t n);

/// Frees a block `allocate(n)` returned (`n`: the same size).
void deallocate(void* p, std::size_t n) noexcept;

/// Lets the calling thread keep up to 32 blocks it freed, handed out again first (the
/// warmest), and give 16 back at a time under one lock (troupe's workers, from their start:
/// a job's end and the next job's admission then skip the slab's lock). The blocks it keeps
/// count as live. It gives them back when it ends or calls flush_thread_cache.
void use_thread_cache() noexcept;

/// Gives the blocks the calling thread keeps back to the slab (a worker that slept through
/// a long park, before the reaper looks at the chunks).
void flush_thread_cache() noexcept;

/// Counters of this process (tests, diagnostics).
struct counters {
  /// Blocks handed out and not yet freed.
  uint64_t live = 0;
  /// Blocks handed out since the process started.
  uint64_t allocated = 0;
  /// Chunks mapped now, and chunks unmapped since the process started.
  uint64_t chunks = 0;
  uint64_t unmapped = 0;
  /// Chunks mapped now that hold no live block (the working set kept for the next burst).
  uint64_t empty_chunks = 0;
  /// Blocks one chunk holds, and the size of a block (0 until the first task actor).
  uint64_t blocks_per_chunk = 0;
  uint64_t block_bytes = 0;
  /// Empty chunks the reaper gave back (they sat unused through a whole interval), and the
  /// reaping intervals begun.
  uint64_t reaped = 0;
  uint64_t reaps = 0;
};
counters stats() noexcept;

/// Lets the reaper run if an interval has passed (cheap otherwise: a clock read). Empty
/// chunks wait for the next burst, up to 128 (256 MB); every 10 s the ones that sat unused
/// all through the last 10 s go back to the system, down to one, paced (~0.5% of a core). A
/// chunk that empties calls this, and so do troupe's idle workers when their sleep times out.
void reap_idle() noexcept;

/// Begins a reaping interval now and gives back what sat unused through the last one
/// (tests: two calls in a row leave the one kept, and the current chunk if it is empty).
void reap_now() noexcept;

/// Sets the reaping interval (10 s unless set); returns the one it replaces.
std::chrono::nanoseconds set_reap_interval(std::chrono::nanoseconds d) noexcept;

/// Returns whether task actors come from the slab in this build (false under
/// AddressSanitizer).
bool enabled() noexcept;

} // namespace troupe::detail::actor_slab
