#pragma once

// Internal: a slab of fixed-size blocks in 2 MB chunks of its own (mapped 2 MB-aligned;
// marked for transparent huge pages only with TROUPE_HUGEPAGES=1, see `huge_pages_`), one
// lock. Two users:
// - the actor slab (actor_slab.cpp): every task actor's storage;
// - the recycler (recycler.cpp): the blocks of a size class once a burst has taken more than
//   a few MB of that class from the system (see `burst_bytes` there).
// Why chunks of its own: glibc grows a worker thread's heap one 4 KB page at a time, each
// with an `mprotect` call and a page fault of its own, and a page fault is dear on this
// project's CI machines (2-16 us per 4 KB page, depending on whether the host still backs
// the memory; see docs/benchmarks.md). A chunk's pages need no `mprotect`; an emptied chunk
// kept for the next burst needs no fault at all; and a fresh chunk's pages come in runs of
// one system call each, just ahead of the blocks handed out (`plan_prefault`), made on a
// helper thread (`prefault_helper`).
// The rules that keep the memory honest are in actor_slab.hpp: blocks come from the fullest
// chunk with room, an empty chunk waits for the next burst up to a cap (none for the
// recycler: its depot keeps the working set above the slab) and goes back to the system
// once it sat unused through a whole reaping interval, down to a floor.
//
// Chunks of a registered slab (the recycler's) are also noted in `chunk_registry`, so a
// block can be told from one `::operator new` made: the recycler's blocks of one class come
// from both.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string_view>
#include <thread>

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include "reap_clock.hpp"
#include "troupe/actors/detail/actor_slab.hpp"
#include "troupe/actors/detail/idle_hint.hpp"

namespace troupe::detail {

// -- fresh pages faulted in ahead, on a helper thread ---------------------------------------

/// Whether runs of fresh pages are faulted in ahead at all: a kernel older than 5.14 (no
/// MADV_POPULATE_WRITE) refuses the call once, and no run is asked for again.
/// `TROUPE_NO_PREFAULT=1` switches it off.
inline std::atomic<bool>& prefault_works() noexcept {
#ifdef MADV_POPULATE_WRITE
  static std::atomic<bool> works{std::getenv("TROUPE_NO_PREFAULT") == nullptr};
#else
  static std::atomic<bool> works{false};
#endif
  return works;
}

/// Faults in a run of pages with one system call. A burst writes every block of a fresh
/// chunk: one page fault per 4 KB page cost 2-16 us on this project's virtual machines, and
/// one call for 16 to 128 pages costs a fraction of their faults. Pages touched meanwhile by
/// another thread are skipped.
inline void prefault_now(char* at, std::size_t len) noexcept {
#ifdef MADV_POPULATE_WRITE
  if (::madvise(at, len, MADV_POPULATE_WRITE) != 0 && errno == EINVAL)
    prefault_works().store(false, std::memory_order_relaxed);
#else
  (void)at;
  (void)len;
#endif
}

/// A thread of the process's own that faults in the runs a slab asks for (one whose shape
/// says `prefault_on_helper`: the actor slab's), so that the thread taking the blocks does
/// not wait for the kernel: a spawning loop is serial by nature, and in a burst the other
/// core idles (the children start only once the body suspends). Used only while one of
/// troupe's workers is parked (idle_hint.hpp): with every core busy the helper would take a
/// core from a worker, maybe one holding a lane's lock. Off with `TROUPE_PREFAULT_HELPER=0`
/// and on one core; a run the helper does not take (no worker parked, its queue of 64 full,
/// a forked child) is faulted in by the caller as before, and one it has not reached yet
/// costs the faults the blocks' first writes then take. A chunk that goes back to the system
/// is forgotten first (`forget`: its queued runs dropped, a run of it in progress waited
/// for), so the helper never touches memory mapped at that address afterwards. The
/// helper is never joined: it sleeps when there is nothing to do, and its state is never
/// destroyed (a process's exit does not wait for it).
class prefault_helper {
 public:
  /// Hands the run to the helper (started at the first); false: the caller faults it in.
  static bool post(char* at, std::size_t len) noexcept {
    if (parked_workers().load(std::memory_order_relaxed) <= 0 &&
        !always_.load(std::memory_order_relaxed))
      return false;
    auto* s = instance();
    if (s == nullptr || s->pid != ::getpid()) return false;
    {
      // Held only to move a run in or out (a forked child, where it may have been held at the
      // fork, never gets here: its pid differs).
      std::lock_guard<std::mutex> lk{s->mtx};
      if (s->count == capacity) return false;
      s->ring[(s->head + s->count) % capacity] = run{at, len};
      ++s->count;
    }
    s->wake.notify_one();
    return true;
  }
  /// Drops the queued runs within [at, at + len) and waits for a run of it in progress:
  /// called before the range is unmapped (another mapping may take the address).
  static void forget(char* at, std::size_t len) noexcept {
    auto* s = started_.load(std::memory_order_acquire); // not started: nothing to forget
    if (s == nullptr || s->pid != ::getpid()) return;
    auto within = [at, len](const run& r) { return r.at >= at && r.at < at + len; };
    std::unique_lock<std::mutex> lk{s->mtx};
    std::size_t kept = 0;
    for (std::size_t i = 0; i < s->count; ++i) {
      auto& r = s->ring[(s->head + i) % capacity];
      if (!within(r)) s->ring[(s->head + kept++) % capacity] = r;
    }
    s->count = kept;
    s->idle.wait(lk, [&] { return !s->busy || !within(s->current); });
  }
  /// Waits until every run handed over so far has been faulted in (tests).
  static void drain() noexcept {
    auto* s = instance();
    if (s == nullptr) return;
    std::unique_lock<std::mutex> lk{s->mtx};
    s->idle.wait(lk, [s] { return s->count == 0 && !s->busy; });
  }
  /// Returns whether the helper runs in this process (not with `TROUPE_PREFAULT_HELPER=0`,
  /// on one core, or when its thread could not be made); starts it.
  static bool enabled() noexcept { return instance() != nullptr; }
  /// Hands every run to the helper, whether a worker is parked or not (tests).
  static void set_always(bool on) noexcept { always_.store(on, std::memory_order_relaxed); }
  /// Returns how many runs the helper faulted in (tests).
  static uint64_t runs_done() noexcept {
    auto* s = instance();
    return s == nullptr ? 0 : s->done.load(std::memory_order_relaxed);
  }

 private:
  static constexpr std::size_t capacity = 64;
  static inline std::atomic<bool> always_{false};
  struct state;
  static inline std::atomic<state*> started_{nullptr};
  struct run {
    char* at = nullptr;
    std::size_t len = 0;
  };
  struct state {
    std::mutex mtx;
    std::condition_variable wake;
    std::condition_variable idle;
    run ring[capacity];
    std::size_t head = 0;
    std::size_t count = 0;
    bool busy = false;
    run current; // the run being faulted in, while `busy`
    pid_t pid = ::getpid();
    std::atomic<uint64_t> done{0};
  };

  static state* instance() noexcept {
    static state* s = start();
    return s;
  }

  static state* start() noexcept {
    const char* env = std::getenv("TROUPE_PREFAULT_HELPER");
    if ((env != nullptr && std::string_view{env} == "0") || std::thread::hardware_concurrency() < 2)
      return nullptr;
    auto* s = new (std::nothrow) state;
    if (s == nullptr) return nullptr;
    try {
      std::thread{[s] {
        // It handles no signal (whatever the thread that started it allowed): a process
        // signal goes to a thread that does.
        sigset_t all;
        ::sigfillset(&all);
        ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
        ::pthread_setname_np(::pthread_self(), "troupe.prefault");
        loop(*s);
      }}.detach();
    } catch (...) {
      delete s;
      return nullptr;
    }
    started_.store(s, std::memory_order_release);
    return s;
  }

  [[noreturn]] static void loop(state& s) noexcept {
    std::unique_lock<std::mutex> lk{s.mtx};
    for (;;) {
      s.wake.wait(lk, [&s] { return s.count > 0; });
      auto r = s.ring[s.head];
      s.head = (s.head + 1) % capacity;
      --s.count;
      s.busy = true;
      s.current = r;
      lk.unlock();
      prefault_now(r.at, r.len);
      s.done.fetch_add(1, std::memory_order_relaxed);
      lk.lock();
      s.busy = false;
      s.idle.notify_all(); // a drain, or a forget waiting for this run
    }
  }
};

/// Which 2 MB-aligned regions are chunks of a registered slab: one bit per 2 MB of the
/// 47-bit user address space (8 MB of address space reserved once, of which only the pages
/// covering mapped chunks are ever touched: one 4 KB page covers 64 GB). Lock-free.
class chunk_registry {
 public:
  static constexpr std::size_t chunk_shift = 21;
  static constexpr std::size_t address_bits = 47;

  /// Notes `base` (a chunk's start) as mapped (`on`) or about to be unmapped.
  static void mark(const void* base, bool on) noexcept {
    auto a = reinterpret_cast<uintptr_t>(base) >> chunk_shift;
    auto* w = word(a);
    auto bit = uint64_t{1} << (a & 63);
    if (on)
      w->fetch_or(bit, std::memory_order_release);
    else
      w->fetch_and(~bit, std::memory_order_release);
  }

  /// Returns whether `p` lies in a chunk of a registered slab.
  static bool owns(const void* p) noexcept {
    auto u = reinterpret_cast<uintptr_t>(p);
    if ((u >> address_bits) != 0) return false;
    auto a = u >> chunk_shift;
    return (word(a)->load(std::memory_order_acquire) >> (a & 63)) & 1;
  }

  /// Returns whether a chunk at `base` can be registered (it lies below 2^47).
  static bool registrable(const void* base) noexcept {
    return (reinterpret_cast<uintptr_t>(base) >> address_bits) == 0;
  }

 private:
  static std::atomic<uint64_t>* word(uintptr_t a) noexcept { return bits() + (a >> 6); }
  static std::atomic<uint64_t>* bits() noexcept {
    static auto* b = [] {
      constexpr std::size_t bytes = (std::size_t{1} << (address_bits - chunk_shift)) / 8;
      auto* raw = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (raw == MAP_FAILED) std::abort(); // 8 MB of address space at start: nothing to do
      return static_cast<std::atomic<uint64_t>*>(raw);
    }();
    return b;
  }
};
static_assert(sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free);
static_assert((std::size_t{1} << chunk_registry::chunk_shift) == actor_slab::chunk_bytes);

/// Asks for the cache lines of the block at `p` (`n` bytes), for writing: a block a burst
/// hands out again was freed long before and is cold, and its lines then arrive while the
/// caller fills the current one. (The slabs' and the recycler's next block.)
inline void prefetch_for_write(const void* p, std::size_t n) noexcept {
  auto* b = static_cast<const char*>(p);
  for (std::size_t off = 0; off < n; off += 64)
    __builtin_prefetch(b + off, 1, 3);
}

/// How a chunk slab is shaped.
struct chunk_slab_shape {
  /// The block size; 0: set by the first allocation (rounded up to `align`).
  std::size_t block = 0;
  /// Every block's alignment (a power of two, at most 64).
  std::size_t align = 64;
  /// Empty chunks kept at most, and kept for good.
  std::size_t cap_chunks = 0;
  std::size_t floor_chunks = 0;
  /// Chunks one pass of `reap_now` unmaps at most (the rest at the next call; a reaper's
  /// own pass, paced, takes at most `paced_reap_budget`).
  std::size_t reap_budget = 16;
  /// Note the chunks in `chunk_registry` (and map none above 2^47).
  bool registered = false;
  /// Prefetch (for writing) the block the next allocation will hand out.
  bool prefetch_next = false;
  /// Hand the faulting-in of fresh pages to the helper thread (prefault_helper) while a
  /// worker is parked. The actor slab's: `scope_fanout` 1.17-1.20x. Not the recycler's: with
  /// them too, `job_submit` ran at 0.87-0.93x, and `scope_fanout` at 0.94x of the actor slab
  /// alone. A submitting loop also grows glibc's heap (`mprotect`, which waits for the
  /// mmap lock the helper's calls hold); that is the likely cost, not measured apart.
  bool prefault_on_helper = false;
};

/// The slab's counters: the actor slab's (its fields say what each counts).
using chunk_slab_counters = actor_slab::counters;

template <class Lock>
class chunk_slab {
 public:
  /// The size of a chunk (and its alignment): one transparent huge page.
  static constexpr std::size_t chunk_bytes = actor_slab::chunk_bytes;

  explicit chunk_slab(chunk_slab_shape s) noexcept : shape_(s) {
    if (s.block != 0) set_block(s.block);
  }

  /// A block, or null when `n` is not the slab's block size class: larger than the block
  /// (set by the first call when the shape has none), zero, or too large for a chunk; or,
  /// for a registered slab, when no chunk could be mapped where the registry reaches.
  void* allocate(std::size_t n) {
    void* p = nullptr;
    return allocate_batch(n, &p, 1) == 1 ? p : nullptr;
  }

  /// Up to `k` blocks (at least one unless it answers 0, as `allocate` answers null) into
  /// `out`, under one lock.
  std::size_t allocate_batch(std::size_t n, void** out, std::size_t k) {
    page_run ahead;
    auto got = take_batch(n, out, k, ahead);
    if (ahead.len != 0 &&
        !(shape_.prefault_on_helper && prefault_helper::post(ahead.at, ahead.len)))
      prefault_now(ahead.at, ahead.len);
    return got;
  }

 private:
  /// A run of a chunk's pages to fault in at once (`len` 0: none).
  struct page_run {
    char* at = nullptr;
    std::size_t len = 0;
  };

  /// allocate_batch's work under the lock; `ahead` is set when the blocks handed out from a
  /// chunk's never-used tail came near the pages faulted in so far.
  std::size_t take_batch(std::size_t n, void** out, std::size_t k, page_run& ahead) {
    std::unique_lock<Lock> lk{mtx_};
    if (block_ == 0) {
      if (n == 0 || n > chunk_bytes - header_bytes) return 0;
      set_block(n);
    }
    if (n == 0 || n > block_) return 0;
    std::size_t got = 0;
    while (got < k) {
      chunk* spare = nullptr; // a chunk mapped meanwhile by another thread too
      while (current_ == nullptr || !has_room(current_)) {
        if (take_listed() || take_empty()) break;
        if (got > 0) return got; // what one chunk gave: no mapping for the rest
        // No chunk has room: map one, the system calls and the first touch of the chunk
        // outside the lock (other threads free blocks meanwhile).
        lk.unlock();
        auto* fresh = map();
        lk.lock();
        if (fresh == nullptr) return 0;
        ++chunks_;
        // Another thread may have found room meanwhile: then the fresh chunk waits with the
        // empty ones (or goes back, past the cap), and the loop takes what has room.
        if (current_ == nullptr || !has_room(current_)) {
          current_ = fresh;
        } else if (!park_empty(fresh)) {
          retire(fresh);
          spare = fresh;
        }
      }
      if (spare != nullptr) {
        lk.unlock();
        unmap(spare);
        lk.lock();
        continue;
      }
      auto* c = current_;
      while (got < k && has_room(c)) {
        if (c->free != nullptr) {
          out[got] = c->free;
          c->free = c->free->next;
        } else {
          out[got] = reinterpret_cast<char*>(c) + header_bytes + std::size_t{c->bumped++} * block_;
        }
        ++got;
        ++c->live;
        ++live_;
        ++allocated_;
      }
      plan_prefault(c, ahead);
      // The block the next allocation hands out, asked for now (for writing): a burst's
      // blocks were freed long before and are cold, and its lines then arrive while the
      // caller fills this one (the actor slab: a task actor is about 22 lines, and a spawn
      // loop wrote them one miss at a time; `scope_fanout`'s spawn loop went from 85-122 ms
      // to 58-66 ms per 100k).
      if (shape_.prefetch_next && has_room(c)) {
        const char* nx = c->free != nullptr
                             ? reinterpret_cast<const char*>(c->free)
                             : reinterpret_cast<char*>(c) + header_bytes + std::size_t{c->bumped} * block_;
        prefetch_for_write(nx, block_);
      }
    }
    return got;
  }

 public:
  /// Takes back a block of `n` bytes; false when `n` is not the slab's size class (the
  /// block came from `::operator new`).
  bool deallocate(void* p, std::size_t n) noexcept {
    chunk* dropped = nullptr;
    bool emptied = false;
    {
      std::lock_guard<Lock> guard{mtx_};
      if (n == 0 || n > block_) return false;
      emptied = free_locked(p, dropped);
    }
    if (dropped != nullptr) unmap(dropped); // outside the lock
    if (emptied) reap_idle(); // a chunk emptied: the reaper may be due
    return true;
  }

  /// Takes back `k` blocks of the slab's size class (each one `allocate` handed out) under
  /// one lock.
  void deallocate_batch(void* const* ps, std::size_t k) noexcept {
    chunk* dropped[max_reap_budget];
    std::size_t nd = 0;
    bool emptied = false;
    while (k > 0) {
      {
        std::lock_guard<Lock> guard{mtx_};
        // At most as many as could each drop a chunk: those are unmapped outside the lock.
        for (; k > 0 && nd < max_reap_budget; --k, ++ps) {
          chunk* d = nullptr;
          emptied = free_locked(*ps, d) || emptied;
          if (d != nullptr) dropped[nd++] = d;
        }
      }
      for (std::size_t i = 0; i < nd; ++i)
        unmap(dropped[i]);
      nd = 0;
    }
    if (emptied) reap_idle();
  }

  /// Returns the block size (0 until the first allocation set it).
  std::size_t block_size() {
    std::lock_guard<Lock> guard{mtx_};
    return block_;
  }

  chunk_slab_counters stats() {
    std::lock_guard<Lock> guard{mtx_};
    uint64_t empty = empties_ + (current_ != nullptr && current_->live == 0 ? 1 : 0);
    return {live_, allocated_, chunks_, unmapped_, empty, per_chunk_, block_, reaped_, reaps_};
  }

  /// Reaps when an interval has passed or doomed chunks are left (a clock read otherwise),
  /// paced (reap_pacer): an interval still begins while the pacer waits, its chunks go later.
  void reap_idle() noexcept {
    if (clock_.elect()) {
      reap_pass(true, false, true);
      return;
    }
    if (backlog_.load(std::memory_order_relaxed) && reap_pacer::ready()) reap_pass(false, false, true);
  }

  /// Frees up to the budget of doomed chunks, beginning a new interval first when
  /// `new_interval`; returns whether doomed ones are left. With `drop_current`, a current
  /// chunk that is empty and gave out no block since the last such call goes back too
  /// (the recycler's slabs keep no empty chunk for good). `paced`: a reaper's own pass
  /// (reap_pacer; a smaller budget), else `reap_now`'s.
  bool reap_pass(bool new_interval, bool drop_current = false, bool paced = false) noexcept {
    chunk* out[max_reap_budget + 1];
    std::size_t k = 0;
    bool left = false;
    // A paced pass claims the pace or frees no doomed chunk (the interval still begins).
    bool claimed = paced && reap_pacer::claim();
    bool may_free = !paced || claimed;
    {
      std::lock_guard<Lock> guard{mtx_};
      if (new_interval) {
        // The empty chunks that sat unused all through the last interval (its lowest count),
        // above the floor, are doomed; the count starts again from now.
        doomed_ = std::min(low_, above_floor());
        low_ = empties_;
        ++reaps_;
      }
      doomed_ = std::min(doomed_, above_floor()); // taken meanwhile: the newest went first
      auto budget = !may_free ? 0
                              : std::min(paced ? paced_reap_budget : shape_.reap_budget, max_reap_budget);
      while (doomed_ > 0 && k < budget) {
        auto* c = empty_tail_; // the oldest
        pop_empty(c);
        retire(c);
        out[k++] = c;
        --doomed_;
      }
      // (Not held back by the pacer: at most one chunk a slab an interval, and it is only
      // looked at when an interval begins.)
      if (drop_current && current_ != nullptr) {
        if (current_->live == 0 && allocated_ == allocated_at_drop_check_) {
          retire(current_);
          out[k++] = current_;
          current_ = nullptr;
        }
        allocated_at_drop_check_ = allocated_;
      }
      low_ = std::min(low_, empties_);
      reaped_ += k;
      left = doomed_ > 0;
      backlog_.store(left, std::memory_order_relaxed);
    }
    auto started = claimed ? reap_pacer::now() : 0; // the unmapping is the cost
    for (std::size_t i = 0; i < k; ++i)
      unmap(out[i]);
    if (claimed) reap_pacer::done(started, k > 0);
    return left;
  }

  std::chrono::nanoseconds set_reap_interval(std::chrono::nanoseconds d) noexcept {
    return clock_.set_interval(d);
  }

  /// Held across a fork, so the child never inherits it locked by a thread it lacks.
  Lock mtx_;

 private:
  static constexpr std::size_t line = 64;
  static constexpr std::size_t max_reap_budget = 64;
  /// Chunks a paced pass unmaps at most (~1-2 ms: the pause after it is 200 times that).
  static constexpr std::size_t paced_reap_budget = 4;

  /// A free block: the next one of its chunk's free list.
  struct free_block {
    free_block* next;
  };

  /// A chunk's header, at its start (blocks follow, from the next cache line on). A chunk
  /// with room that is not the current one is on the slab's list of chunks with room.
  struct chunk {
    chunk* prev = nullptr;
    chunk* next = nullptr;
    free_block* free = nullptr; // blocks given back
    uint32_t bumped = 0;        // blocks handed out from the never-used tail so far
    uint32_t live = 0;          // blocks handed out and not freed
    uint32_t faulted = 0;       // bytes from the chunk's start asked to be faulted in
    bool listed = false;        // on the list of chunks with room
  };
  static constexpr std::size_t header_bytes = (sizeof(chunk) + line - 1) / line * line;

  void set_block(std::size_t n) noexcept {
    block_ = (n + shape_.align - 1) / shape_.align * shape_.align;
    per_chunk_ = static_cast<uint32_t>((chunk_bytes - header_bytes) / block_);
  }

  /// Frees block `p` (the lock held); true when its chunk emptied, and `dropped` set when
  /// that chunk is past the cap (the caller unmaps it without the lock).
  bool free_locked(void* p, chunk*& dropped) noexcept {
    auto* c = reinterpret_cast<chunk*>(reinterpret_cast<uintptr_t>(p) & ~(chunk_bytes - 1));
    auto* b = static_cast<free_block*>(p);
    b->next = c->free;
    c->free = b;
    --live_;
    // The current chunk stays current when it empties (the next block comes from it).
    if (c == current_) {
      --c->live;
      return false;
    }
    if (!c->listed) link(c); // it was full: it has room now
    if (--c->live != 0) return false;
    // Empty: it waits for the next burst with the other empty ones, up to the cap.
    unlink(c);
    if (!park_empty(c)) {
      retire(c);
      dropped = c;
    }
    return true;
  }

  [[nodiscard]] bool has_room(const chunk* c) const noexcept {
    return c->free != nullptr || c->bumped < per_chunk_;
  }

  /// Makes a listed chunk the current one: the fullest of the first few listed (most
  /// recently given room); false when none is listed. The one given up is full, so it goes
  /// on no list (its first freed block lists it).
  bool take_listed() noexcept {
    chunk* best = nullptr;
    int looked = 0;
    for (auto* c = head_; c != nullptr && looked < 16; c = c->next, ++looked)
      if (best == nullptr || c->live > best->live) best = c;
    if (best == nullptr) return false;
    unlink(best);
    current_ = best;
    return true;
  }

  /// Makes the most recently emptied chunk the current one (its pages are the warmest);
  /// false when none waits. A current chunk that is itself empty stays (it has room).
  bool take_empty() noexcept {
    if (empty_head_ == nullptr) return false;
    auto* c = empty_head_;
    pop_empty(c);
    low_ = std::min(low_, empties_);
    // Doomed are the oldest empty chunks, counted: a burst that takes them all back in use
    // leaves none doomed (a backlog the pacer left must not unmap the chunks it empties
    // again later).
    if (doomed_ > above_floor()) {
      doomed_ = above_floor();
      if (doomed_ == 0) backlog_.store(false, std::memory_order_relaxed);
    }
    current_ = c;
    return true;
  }

  /// Empty chunks above the floor (the most that may be doomed).
  [[nodiscard]] std::size_t above_floor() const noexcept {
    return empties_ > shape_.floor_chunks ? empties_ - shape_.floor_chunks : 0;
  }

  /// Puts an empty chunk (on no list) with the empty ones; false at the cap.
  bool park_empty(chunk* c) noexcept {
    if (empties_ >= shape_.cap_chunks) return false;
    c->prev = nullptr;
    c->next = empty_head_;
    if (empty_head_ != nullptr) empty_head_->prev = c;
    empty_head_ = c;
    if (empty_tail_ == nullptr) empty_tail_ = c;
    ++empties_;
    return true;
  }

  void pop_empty(chunk* c) noexcept {
    if (c->prev != nullptr)
      c->prev->next = c->next;
    else
      empty_head_ = c->next;
    if (c->next != nullptr)
      c->next->prev = c->prev;
    else
      empty_tail_ = c->prev;
    c->prev = c->next = nullptr;
    --empties_;
  }

  /// Maps a chunk (no lock held): 2 MB-aligned, its header written. Null for a registered
  /// slab when the chunk lies beyond the registry; an unregistered one throws `bad_alloc`
  /// when the system has no memory.
  chunk* map() {
    // Twice the size, then the unaligned ends trimmed: a 2 MB-aligned chunk.
    auto* raw = ::mmap(nullptr, 2 * chunk_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
      if (shape_.registered) return nullptr;
      throw std::bad_alloc{};
    }
    auto base = reinterpret_cast<uintptr_t>(raw);
    auto aligned = (base + chunk_bytes - 1) & ~(chunk_bytes - 1);
    if (aligned > base) ::munmap(raw, aligned - base);
    auto tail = base + 2 * chunk_bytes - (aligned + chunk_bytes);
    if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + chunk_bytes), tail);
    auto* at = reinterpret_cast<void*>(aligned);
    if (shape_.registered && !chunk_registry::registrable(at)) {
      ::munmap(at, chunk_bytes);
      return nullptr;
    }
#ifdef MADV_HUGEPAGE
    if (huge_pages_) ::madvise(at, chunk_bytes, MADV_HUGEPAGE);
#endif
    auto* c = new (at) chunk{};
    if (shape_.registered) chunk_registry::mark(at, true);
    return c;
  }

  /// The first run of a chunk's pages faulted in at once, and the largest (each run is as
  /// long as what the chunk has faulted in so far, between the two).
  static constexpr std::size_t first_run = 64 * 1024;
  static constexpr std::size_t max_run = 512 * 1024;

  /// Notes in `ahead` the next run of `c`'s pages to fault in (the lock held) when the
  /// blocks handed out from its never-used tail came within half a run of the pages asked
  /// for so far. Each run is asked for once: whoever notes it faults it in, without the lock.
  /// One run per batch (a batch that spans two chunks leaves the second's to its next one).
  void plan_prefault(chunk* c, page_run& ahead) noexcept {
    if (ahead.len != 0 || !prefault_works().load(std::memory_order_relaxed)) return;
    std::size_t end = header_bytes + std::size_t{c->bumped} * block_;
    std::size_t run = std::clamp<std::size_t>(c->faulted, first_run, max_run);
    if (c->faulted >= chunk_bytes || end + run / 2 <= c->faulted) return;
    auto from = std::max<std::size_t>(c->faulted, end & ~std::size_t{4095});
    auto to = std::min(chunk_bytes, (end + run + 4095) & ~std::size_t{4095});
    c->faulted = static_cast<uint32_t>(to);
    ahead.at = reinterpret_cast<char*>(c) + from;
    ahead.len = to - from;
  }

  /// Gives a retired chunk back to the system (no lock held).
  void unmap(chunk* c) noexcept {
    if (shape_.registered) chunk_registry::mark(c, false);
    if (shape_.prefault_on_helper) prefault_helper::forget(reinterpret_cast<char*>(c), chunk_bytes);
    ::munmap(c, chunk_bytes);
  }

  /// Counts an unlinked empty chunk as given back (the caller unmaps it, outside the lock).
  void retire(chunk*) noexcept {
    --chunks_;
    ++unmapped_;
  }

  void link(chunk* c) noexcept {
    c->prev = nullptr;
    c->next = head_;
    if (head_ != nullptr) head_->prev = c;
    head_ = c;
    c->listed = true;
  }

  void unlink(chunk* c) noexcept {
    if (c->prev != nullptr)
      c->prev->next = c->next;
    else
      head_ = c->next;
    if (c->next != nullptr) c->next->prev = c->prev;
    c->prev = c->next = nullptr;
    c->listed = false;
  }

  const chunk_slab_shape shape_;
  /// Whether chunks are marked for huge pages: only with TROUPE_HUGEPAGES=1. Off by default
  /// because a fresh huge page can cost far more than the 512 small pages it replaces: in a
  /// virtual machine that hands free memory back to its host (free page reporting, as on
  /// this project's CI machines), a huge page is mostly taken from memory the host has
  /// discarded, and its first touch cost ~4 ms there, against ~2 us per small page that
  /// the guest reuses. A 100k-task burst in a fresh process started 4 s after the last:
  /// 2.2-2.4x faster with small pages. On memory the host still backs (processes run back
  /// to back) huge pages won some runs and lost others (docs/benchmarks.md, session 34). On
  /// bare metal the huge pages' fewer faults and TLB misses may pay: measure, then opt in.
  /// The kernel may also compact memory to find a huge page at the first touch.
  const bool huge_pages_ = [] {
    const char* v = std::getenv("TROUPE_HUGEPAGES");
    return v != nullptr && std::string_view{v} == "1";
  }();
  std::size_t block_ = 0;
  uint32_t per_chunk_ = 0;
  chunk* current_ = nullptr;
  chunk* head_ = nullptr; // chunks with room, other than the current one
  uint64_t live_ = 0;
  uint64_t allocated_ = 0;
  uint64_t allocated_at_drop_check_ = 0;
  uint64_t chunks_ = 0;
  uint64_t unmapped_ = 0;
  uint64_t reaped_ = 0;
  uint64_t reaps_ = 0;
  /// Empty chunks other than the current one (a list of their own, the most recently
  /// emptied first), their fewest since the reaping interval began, and how many of those
  /// the reaper still has to give back.
  chunk* empty_head_ = nullptr;
  chunk* empty_tail_ = nullptr;
  std::size_t empties_ = 0;
  std::size_t low_ = 0;
  std::size_t doomed_ = 0;
  std::atomic<bool> backlog_{false};
  /// The reaping interval (the recycler's: 10 s unless set).
  reap_clock clock_;
};

} // namespace troupe::detail
