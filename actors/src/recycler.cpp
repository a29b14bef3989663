// The recycler (see recycler.hpp): per-thread magazines per size class, a shared depot of
// whole magazines per class that keeps its working set (Bonwick & Adams, "Magazines and
// Vmem", 2001, section 3.6): a burst's blocks stay for the next burst, and go back to the
// system once they have sat unused through a whole reaping interval.

#include "troupe/actors/detail/recycler.hpp"

#include <algorithm>
#include <array>
#include <pthread.h>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "chunk_slab.hpp"
#include "troupe/actors/detail/spin_lock.hpp"
#include "reap_clock.hpp"
#include "under_asan.hpp"

#ifdef TROUPE_UNDER_ASAN
#define TROUPE_RECYCLER_OFF 1
#endif

namespace troupe::detail::recycler {

namespace {

// Size classes: 16 bytes apart up to 256 (most of troupe's records, cells and handles are
// 48-240 bytes: a 64-byte step rounded a 136-byte handle to 192), 64 bytes apart above.
constexpr std::size_t fine_granule = 16;
constexpr std::size_t fine_limit = 256;
constexpr std::size_t fine_classes = fine_limit / fine_granule;
constexpr std::size_t granule = 64;
constexpr std::size_t classes = fine_classes + (max_small - fine_limit) / granule;
/// Blocks per magazine.
constexpr uint32_t rounds = 64;
/// The depot keeps at most this many bytes of blocks per class (past it, a full magazine
/// handed in is freed at once)...
constexpr std::size_t depot_bytes = std::size_t{64} << 20;
/// ... but only its working set: every reaping interval (reap_clock), the magazines it
/// held throughout the interval (its lowest count since the last reap: none of them was
/// taken) go back to the system, down to this floor. So a burst of 100k jobs finds the
/// blocks of the last burst (measured: `job_submit` 113-133k/s with a 512 KB cap, whose
/// every burst grew the heap page by page, 190-216k/s with this), and an idle process gives
/// them back within two intervals. With 1 s instead of 10, `job_submit`'s rounds two
/// seconds apart found theirs given back.
constexpr std::size_t depot_floor_bytes = std::size_t{512} << 10;

constexpr std::size_t class_size(std::size_t cls) noexcept {
  return cls < fine_classes ? (cls + 1) * fine_granule
                            : fine_limit + (cls + 1 - fine_classes) * granule;
}
/// The class of a block of `n` bytes (0 < n <= max_small).
constexpr std::size_t class_of(std::size_t n) noexcept {
  return n <= fine_limit ? (n - 1) / fine_granule
                         : fine_classes + (n - fine_limit - 1) / granule;
}
static_assert(class_of(1) == 0 && class_size(0) == 16);
static_assert(class_of(256) == fine_classes - 1 && class_size(fine_classes - 1) == 256);
static_assert(class_of(257) == fine_classes && class_size(fine_classes) == 320);
static_assert(class_of(max_small) == classes - 1 && class_size(classes - 1) == max_small);

void give_back(void* p, std::size_t cls) noexcept;

struct magazine {
  uint32_t count = 0;
  std::array<void*, rounds> items;
  [[nodiscard]] bool full() const noexcept { return count == rounds; }
  /// Gives every block (of class `cls`) back to where it came from.
  void release_all(std::size_t cls) noexcept {
    for (uint32_t i = 0; i < count; ++i)
      give_back(items[i], cls);
    count = 0;
  }
};

struct counter_cells {
  std::atomic<uint64_t> hits{0};
  std::atomic<uint64_t> misses{0};
  std::atomic<uint64_t> depot_puts{0};
  std::atomic<uint64_t> depot_takes{0};
  std::atomic<uint64_t> overflow_frees{0};
  std::atomic<uint64_t> reaped{0};
  std::atomic<uint64_t> reaps{0};
  std::atomic<uint64_t> chunk_blocks{0};
};

/// A depot's lock: one byte (detail/spin_lock.hpp; a trade holds it for a few stores, a
/// waiter yields after 64 tries, e.g. while a fork holds every depot's lock). Not a pthread
/// mutex because the fork handler below holds every depot's lock at once, one per class (76),
/// past the 64 locks ThreadSanitizer's deadlock detector tracks per thread (its check failed
/// inside fork and hung the process).
using depot_lock = spin_lock;

/// A class's blocks once a burst took `burst_bytes` of it from the system: 2 MB chunks of
/// its own (see chunk_slab.hpp). No empty chunk is kept in it: the depot above keeps the
/// working set, and the reaper gives back what sat unused there, then the chunks it emptied.
using class_slab = chunk_slab<depot_lock>;

/// Bytes of a class taken from `::operator new` before its blocks come from chunks. A
/// process that never has such a burst maps no chunk (each would be 2 MB resident, a huge
/// page); one that does pays one fault per 2 MB, not one per 4 KB page with an `mprotect`
/// call each (glibc grows a worker thread's heap page by page). Measured on `job_submit`
/// (100k jobs queued at once, about 1.1 KB of recycled blocks each), one round in a fresh
/// process: 33k page faults with every block from `::operator new`, 8.6k with chunks past
/// 1 MB (15k past 4 MB); one binary with and without chunks, paired: 1.53x the jobs/s.
constexpr std::size_t burst_bytes = std::size_t{1} << 20;

/// Where a class's blocks come from when the depot has none.
struct class_source {
  /// Bytes taken from `::operator new` so far (counts up to `burst_bytes`).
  std::atomic<std::size_t> missed{0};
  /// The class's chunks, once the burst passed (never destroyed, as the recycler).
  std::atomic<class_slab*> slab{nullptr};
};

/// Whole magazines of one class, shared by the threads.
struct depot {
  depot_lock mtx;
  std::vector<magazine*> loaded; // each holds at least one block; the newest last
  std::vector<magazine*> empty;
  std::atomic<std::size_t> nloaded{0};
  std::size_t cap = 0;   // magazines kept at most
  std::size_t floor = 0; // magazines the reaper leaves
  /// The fewest loaded magazines since the interval began: that many sat unused all along.
  std::size_t low = 0;
  /// Magazines of the last interval's idle ones the reaper has not freed yet.
  std::size_t doomed = 0;

  /// Trades an empty magazine for a loaded one; false when the depot has none.
  bool take_loaded(magazine*& m) {
    if (nloaded.load(std::memory_order_relaxed) == 0) return false;
    std::lock_guard<depot_lock> guard{mtx};
    if (loaded.empty()) return false;
    empty.push_back(m);
    m = loaded.back();
    loaded.pop_back();
    low = std::min(low, loaded.size());
    // Doomed are the oldest, counted: taken back in use, they are no longer doomed (a count
    // the pacer held back must not free the magazines a later burst handed back).
    doomed = std::min(doomed, loaded.size() > floor ? loaded.size() - floor : 0);
    nloaded.store(loaded.size(), std::memory_order_relaxed);
    return true;
  }

  /// A new reaping interval: the magazines that sat unused all through the last one (above
  /// the floor) are doomed; `low` starts again from the count now.
  void begin_interval() {
    std::lock_guard<depot_lock> guard{mtx};
    doomed = std::min(low, loaded.size() > floor ? loaded.size() - floor : 0);
    low = loaded.size();
  }

  /// Moves up to `out`'s spare capacity of doomed magazines, the oldest first, then of the
  /// empty magazines above the floor, into `out` (nothing is allocated under the lock).
  /// Returns whether doomed ones are left.
  bool reap(std::vector<magazine*>& out) {
    std::lock_guard<depot_lock> guard{mtx};
    auto room = out.capacity() - out.size();
    doomed = std::min(doomed, loaded.size()); // taken meanwhile: the newest went first
    auto n = std::min(doomed, room);
    out.insert(out.end(), loaded.begin(), loaded.begin() + static_cast<std::ptrdiff_t>(n));
    loaded.erase(loaded.begin(), loaded.begin() + static_cast<std::ptrdiff_t>(n));
    nloaded.store(loaded.size(), std::memory_order_relaxed);
    doomed -= n;
    low = std::min(low, loaded.size());
    room -= n;
    auto e = std::min(empty.size() > floor ? empty.size() - floor : 0, room);
    out.insert(out.end(), empty.end() - static_cast<std::ptrdiff_t>(e), empty.end());
    empty.resize(empty.size() - e);
    return doomed > 0;
  }

  /// Trades a loaded magazine for an empty one (`want_empty`), or just takes it (a thread
  /// that ends); false, keeping nothing, when the depot is at its cap.
  bool put_loaded(magazine*& m, bool want_empty = true) {
    {
      std::lock_guard<depot_lock> guard{mtx};
      if (loaded.size() >= cap) return false;
      loaded.push_back(m);
      nloaded.store(loaded.size(), std::memory_order_relaxed);
      m = nullptr;
      if (want_empty && !empty.empty()) {
        m = empty.back();
        empty.pop_back();
      }
    }
    // A fresh magazine is allocated outside the lock (the fork handler holds every depot
    // lock; an allocator's own fork lock must never wait behind one).
    if (want_empty && m == nullptr) m = new magazine;
    return true;
  }
};

struct shared_state {
  std::array<depot, classes> depots;
  std::array<class_source, classes> sources;
  counter_cells counters;
  /// The reaping interval: the thread that moves it on begins the next one.
  reap_clock clock;
  /// A thread is reaping (at most one at a time).
  std::atomic<bool> reaping{false};
  /// Doomed magazines are left (a reap frees at most `reap_budget` at a time).
  std::atomic<bool> backlog{false};
  shared_state() {
    for (std::size_t c = 0; c < classes; ++c) {
      auto& d = depots[c];
      d.cap = std::max<std::size_t>(2, depot_bytes / (rounds * class_size(c)));
      d.floor = std::max<std::size_t>(2, depot_floor_bytes / (rounds * class_size(c)));
      // No growth under the lock (an allocator's fork handler may hold its locks while
      // troupe's waits for a depot lock): every magazine that exists is in one of these.
      d.loaded.reserve(d.cap);
      d.empty.reserve(d.cap + 2);
    }
  }
};

shared_state& shared();

void unlock_all() noexcept {
  for (auto& src : shared().sources)
    if (auto* sl = src.slab.load(std::memory_order_acquire)) sl->mtx_.unlock();
  for (auto& d : shared().depots)
    d.mtx.unlock();
}

/// Never destroyed: blocks freed during static destruction still find it (and what it holds
/// stays reachable, so leak checkers do not report it).
shared_state& shared() {
  static auto* s = [] {
    auto* st = new shared_state;
    // A fork (without exec) while another thread trades a magazine would leave that
    // depot's mutex locked in the child: hold them all across the fork, as malloc does.
    // The class slabs' locks too, after the depots' (a slab is made under its depot's
    // lock, and no thread takes a depot's lock while it holds a slab's).
    ::pthread_atfork(
        [] {
          for (auto& d : shared().depots)
            d.mtx.lock();
          for (auto& src : shared().sources)
            if (auto* sl = src.slab.load(std::memory_order_acquire)) sl->mtx_.lock();
        },
        [] { unlock_all(); }, [] { unlock_all(); });
    return st;
  }();
  return *s;
}

/// One thread's magazines; handed to the depot when the thread ends.
struct thread_cache {
  struct slot {
    magazine* loaded = nullptr;
    magazine* previous = nullptr;
  };
  std::array<slot, classes> slots{};
  uint64_t hits = 0;
  uint64_t misses = 0;

  ~thread_cache();
  void flush_counters() noexcept {
    auto& c = shared().counters;
    c.hits.fetch_add(hits, std::memory_order_relaxed);
    c.misses.fetch_add(misses, std::memory_order_relaxed);
    hits = misses = 0;
  }
};

// `alive` is a trivially destructible thread-local: it stays readable while the cache's
// own destructor runs and after, when a late free of this thread goes straight to
// `::operator delete`.
thread_local bool alive = false;
thread_local bool dead = false;

thread_local thread_cache cache_storage;

thread_cache::~thread_cache() {
  alive = false;
  dead = true;
  auto& s = shared();
  for (std::size_t c = 0; c < classes; ++c) {
    for (auto* m : {slots[c].loaded, slots[c].previous}) {
      if (m == nullptr) continue;
      if (m->count > 0) {
        auto* given = m;
        if (s.depots[c].put_loaded(given, false)) continue; // the depot owns it now
        m->release_all(c);
      }
      delete m;
    }
    slots[c] = {};
  }
  flush_counters();
}

/// Returns this thread's cache, or null when the thread is ending.
thread_cache* local() noexcept {
  if (alive) [[likely]]
    return &cache_storage;
  if (dead) return nullptr;
  alive = true; // first use: constructs the cache (and registers its destructor)
  return &cache_storage;
}

magazine* fresh(magazine*& m) {
  if (m == nullptr) m = new magazine;
  return m;
}

/// Returns the chunks of class `cls` once its burst passed `burst_bytes` (made on the first
/// call past it), else null.
class_slab* slab_of(std::size_t cls) {
  auto& src = shared().sources[cls];
  if (auto* sl = src.slab.load(std::memory_order_acquire)) return sl;
  auto n = class_size(cls);
  if (src.missed.fetch_add(n, std::memory_order_relaxed) + n < burst_bytes) return nullptr;
  // Made under the depot's lock: a fork (which holds every depot lock) sees every slab
  // there is, and locks it too.
  auto* made = new class_slab{chunk_slab_shape{.block = n, .align = fine_granule, .cap_chunks = 0,
                                               .floor_chunks = 0, .reap_budget = 16,
                                               .registered = true}};
  class_slab* sl = nullptr;
  {
    std::lock_guard<depot_lock> guard{shared().depots[cls].mtx};
    sl = src.slab.load(std::memory_order_acquire);
    if (sl == nullptr) {
      src.slab.store(made, std::memory_order_release);
      return made;
    }
  }
  delete made; // another thread made it first
  return sl;
}

/// Half a magazine: what one trip to a class's chunks brings (one lock per 32 blocks).
constexpr std::size_t chunk_batch = rounds / 2;

/// A block of class `cls` the depot could not give: from the class's chunks (with up to
/// `chunk_batch - 1` more put into `into`, an empty magazine, when given), else from
/// `::operator new`.
void* fresh_block(std::size_t cls, magazine* into) {
  if (auto* sl = slab_of(cls)) {
    void* got[chunk_batch];
    auto k = sl->allocate_batch(class_size(cls), got, into != nullptr ? chunk_batch : 1);
    if (k > 0) {
      shared().counters.chunk_blocks.fetch_add(k, std::memory_order_relaxed);
      for (std::size_t i = 1; i < k; ++i)
        into->items[into->count++] = got[i];
      return got[0];
    }
  }
  return ::operator new(class_size(cls));
}

void give_back(void* p, std::size_t cls) noexcept {
  if (chunk_registry::owns(p)) {
    // Its class's slab exists: it made the chunk.
    shared().sources[cls].slab.load(std::memory_order_acquire)->deallocate(p, class_size(cls));
    return;
  }
  ::operator delete(p);
}

/// Magazines one reap frees at most (64 blocks each: a few milliseconds of frees on the
/// thread that happens to reap, not the whole burst at once); the rest go at the next
/// depot trade or idle worker's wake-up. A reaper's own pass is paced (reap_pacer) and
/// frees at most `paced_reap_budget` (~1 ms).
constexpr std::size_t reap_budget = 256;
constexpr std::size_t paced_reap_budget = 32;

/// Frees up to the budget of doomed magazines, beginning a new interval first when
/// `new_interval`; one thread at a time (false when another one reaps). `paced`: a
/// reaper's own pass (reap_if_due), which frees nothing while the pacer waits.
bool reap_pass(bool new_interval, bool paced = false) {
  auto& s = shared();
  if (s.reaping.exchange(true, std::memory_order_acquire)) return false;
  if (new_interval) {
    for (auto& d : s.depots)
      d.begin_interval();
    s.counters.reaps.fetch_add(1, std::memory_order_relaxed);
  }
  // A paced pass claims the pace (no other paced pass frees meanwhile) or frees nothing:
  // the interval has begun, its doomed magazines wait as backlog.
  bool claimed = paced && reap_pacer::claim();
  auto started = claimed ? reap_pacer::now() : 0; // read only for a claimed pass
  std::vector<magazine*> out;
  try {
    if (!paced || claimed) out.reserve(paced ? paced_reap_budget : reap_budget);
  } catch (...) { // no memory for the list: nothing is freed this time
    if (claimed) reap_pacer::done(started, false);
    s.reaping.store(false, std::memory_order_release);
    return true;
  }
  const bool held_back = paced && !claimed;
  bool left = held_back;
  std::array<std::size_t, classes> ends{}; // out[ends[c-1], ends[c]) are of class c
  std::size_t reached = 0;
  for (; reached < classes && !held_back; ++reached) {
    if (out.size() == out.capacity()) {
      left = true;
      break;
    }
    left = s.depots[reached].reap(out) || left;
    ends[reached] = out.size();
  }
  std::size_t blocks = 0;
  for (std::size_t c = 0, i = 0; c < reached; ++c)
    for (; i < ends[c]; ++i) {
      blocks += out[i]->count;
      out[i]->release_all(c);
      delete out[i];
    }
  // A class's chunks: the current one goes back too once it sat empty through an interval
  // (what the depot gave back above may have emptied it).
  if (new_interval)
    for (auto& src : s.sources)
      if (auto* sl = src.slab.load(std::memory_order_acquire)) sl->reap_pass(true, true, paced);
  if (claimed) reap_pacer::done(started, !out.empty());
  s.backlog.store(left, std::memory_order_relaxed);
  s.counters.reaped.fetch_add(blocks, std::memory_order_relaxed);
  s.reaping.store(false, std::memory_order_release);
  return true;
}

/// Reaps when an interval has passed or doomed magazines are left (paced: reap_pacer).
void reap_if_due() noexcept {
  auto& s = shared();
  if (auto last = s.clock.elect()) {
    // Elected: begins the interval (if another thread reaps right now, at the next
    // trade; the interval's start stays).
    if (!reap_pass(true, true)) s.clock.undo(*last);
    return;
  }
  if (s.backlog.load(std::memory_order_relaxed) && reap_pacer::ready()) reap_pass(false, true);
}

} // namespace

bool enabled() noexcept {
#ifdef TROUPE_RECYCLER_OFF
  return false;
#else
  return true;
#endif
}

/// Hands out a loaded magazine's top block and prefetches, for writing, the block the next
/// allocation of the class will take (up to its first 8 lines): a burst's blocks were freed
/// long before and are cold, and the misses then overlap the work between two allocations.
/// Measured, paired: `scope_fanout` 1.15x with two lines; `job_submit` 1.05x with two and
/// 1.04x more with up to eight (a queued job's ticket is five).
template <class M>
void* take_prefetching(M& m, std::size_t cls) noexcept {
  auto* p = m.items[--m.count];
  if (m.count > 0) {
    prefetch_for_write(m.items[m.count - 1], std::min<std::size_t>(class_size(cls), 512));
  }
  return p;
}

void* allocate(std::size_t n) {
#ifndef TROUPE_RECYCLER_OFF
  if (n != 0 && n <= max_small) {
    auto cls = class_of(n);
    if (auto* tc = local()) {
      auto& sl = tc->slots[cls];
      if (sl.loaded != nullptr && sl.loaded->count > 0) {
        ++tc->hits;
        return take_prefetching(*sl.loaded, cls);
      }
      if (sl.previous != nullptr && sl.previous->count > 0) {
        std::swap(sl.loaded, sl.previous);
        ++tc->hits;
        return take_prefetching(*sl.loaded, cls);
      }
      // Both empty: trade one for a loaded magazine of the depot (once per 64 blocks: the
      // time the reaper needs to look at the clock).
      reap_if_due();
      fresh(sl.loaded);
      auto& d = shared().depots[cls];
      if (d.take_loaded(sl.loaded)) {
        shared().counters.depot_takes.fetch_add(1, std::memory_order_relaxed);
        ++tc->hits;
        return sl.loaded->items[--sl.loaded->count];
      }
      if (++tc->misses % 1024 == 0) tc->flush_counters();
      return fresh_block(cls, sl.loaded); // emptied by the trade above
    }
    return fresh_block(cls, nullptr);
  }
#endif
  return ::operator new(n);
}

void deallocate(void* p, std::size_t n) noexcept {
  if (p == nullptr) return;
#ifndef TROUPE_RECYCLER_OFF
  if (n != 0 && n <= max_small) {
    auto cls = class_of(n);
    if (auto* tc = local()) {
      auto& sl = tc->slots[cls];
      auto* m = fresh(sl.loaded);
      if (!m->full()) {
        m->items[m->count++] = p;
        return;
      }
      if (!fresh(sl.previous)->full()) {
        std::swap(sl.loaded, sl.previous);
        sl.loaded->items[sl.loaded->count++] = p;
        return;
      }
      // Both full: the previous one goes to the depot (or back to the system at its cap).
      reap_if_due();
      auto& s = shared();
      if (s.depots[cls].put_loaded(sl.previous)) {
        s.counters.depot_puts.fetch_add(1, std::memory_order_relaxed);
      } else {
        s.counters.overflow_frees.fetch_add(sl.previous->count, std::memory_order_relaxed);
        sl.previous->release_all(cls);
      }
      std::swap(sl.loaded, sl.previous);
      sl.loaded->items[sl.loaded->count++] = p;
      return;
    }
    give_back(p, cls); // a thread that is ending
    return;
  }
#endif
  ::operator delete(p);
}

counters stats() noexcept {
  if (auto* tc = local()) tc->flush_counters();
  auto& c = shared().counters;
  uint64_t chunks = 0;
  for (auto& src : shared().sources)
    if (auto* sl = src.slab.load(std::memory_order_acquire)) chunks += sl->stats().chunks;
  return {c.hits.load(),           c.misses.load(), c.depot_puts.load(), c.depot_takes.load(),
          c.overflow_frees.load(), c.reaped.load(), c.reaps.load(),      c.chunk_blocks.load(),
          chunks};
}

void reap_idle() noexcept {
#ifndef TROUPE_RECYCLER_OFF
  reap_if_due();
#endif
}

void reap_now() noexcept {
#ifndef TROUPE_RECYCLER_OFF
  while (!reap_pass(true))
    std::this_thread::yield();
  while (shared().backlog.load(std::memory_order_relaxed))
    if (!reap_pass(false)) std::this_thread::yield();
#endif
}

std::chrono::nanoseconds set_reap_interval(std::chrono::nanoseconds d) noexcept {
  return shared().clock.set_interval(d);
}

std::size_t depot_blocks(std::size_t n) noexcept {
  if (n == 0 || n > max_small) return 0;
  auto& d = shared().depots[class_of(n)];
  std::lock_guard<depot_lock> guard{d.mtx};
  std::size_t blocks = 0;
  for (auto* m : d.loaded)
    blocks += m->count;
  return blocks;
}

} // namespace troupe::detail::recycler
