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

#include "reap_clock.hpp"
#include "under_asan.hpp"

#ifdef TROUPE_UNDER_ASAN
#define TROUPE_SLAB_OFF 1
#endif

namespace troupe::detail::actor_slab {

namespace {

constexpr std::size_t line = 64;

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
  bool listed = false;        // on the list of chunks with room
};
constexpr std::size_t header_bytes = (sizeof(chunk) + line - 1) / line * line;

class slab {
 public:
  /// A block, or null when `n` is not the slab's block size class: larger than the block
  /// (set by the first call), zero, or too large for a chunk.
  void* allocate(std::size_t n) {
    std::unique_lock<std::mutex> lk{mtx_};
    if (block_ == 0) {
      if (n == 0 || n > chunk_bytes - header_bytes) return nullptr;
      block_ = (n + line - 1) / line * line;
      per_chunk_ = static_cast<uint32_t>((chunk_bytes - header_bytes) / block_);
    }
    if (n > block_) return nullptr;
    chunk* spare = nullptr; // a chunk mapped meanwhile by another thread too: kept or given back
    while (current_ == nullptr || !has_room(current_)) {
      if (take_listed() || take_empty()) break;
      // No chunk has room: map one, the system calls and the first touch of the huge page
      // outside the lock (the other workers free actors meanwhile).
      lk.unlock();
      auto* fresh = map();
      lk.lock();
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
    auto* c = current_;
    void* p;
    if (c->free != nullptr) {
      p = c->free;
      c->free = c->free->next;
    } else {
      p = reinterpret_cast<char*>(c) + header_bytes + std::size_t{c->bumped++} * block_;
    }
    ++c->live;
    ++live_;
    ++allocated_;
    lk.unlock();
    if (spare != nullptr) ::munmap(spare, chunk_bytes);
    return p;
  }

  /// Takes back a block of `n` bytes; false when `n` is not the slab's size class (the
  /// block came from `::operator new`).
  bool deallocate(void* p, std::size_t n) noexcept {
    auto* c = reinterpret_cast<chunk*>(reinterpret_cast<uintptr_t>(p) & ~(chunk_bytes - 1));
    chunk* dropped = nullptr;
    bool emptied = false;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      if (n == 0 || n > block_) return false;
      auto* b = static_cast<free_block*>(p);
      b->next = c->free;
      c->free = b;
      --live_;
      // The current chunk stays current when it empties (the next block comes from it).
      if (c != current_) {
        if (!c->listed) link(c); // it was full: it has room now
        if (--c->live == 0) {
          // Empty: it waits for the next burst with the other empty ones, up to the cap.
          emptied = true;
          unlink(c);
          if (!park_empty(c)) {
            retire(c);
            dropped = c;
          }
        }
      } else {
        --c->live;
      }
    }
    if (dropped != nullptr) ::munmap(dropped, chunk_bytes); // outside the lock
    if (emptied) reap_idle(); // a chunk emptied: the reaper may be due
    return true;
  }

  counters stats() {
    std::lock_guard<std::mutex> guard{mtx_};
    uint64_t empty = empties_ + (current_ != nullptr && current_->live == 0 ? 1 : 0);
    return {live_, allocated_, chunks_, unmapped_, empty, per_chunk_, block_, reaped_, reaps_};
  }

  /// Reaps when an interval has passed or doomed chunks are left (a clock read otherwise).
  void reap_idle() noexcept {
    if (clock_.elect()) {
      reap_pass(true);
      return;
    }
    if (backlog_.load(std::memory_order_relaxed)) reap_pass(false);
  }

  /// Frees up to `reap_budget` doomed chunks, beginning a new interval first when
  /// `new_interval`; returns whether doomed ones are left.
  bool reap_pass(bool new_interval) noexcept {
    chunk* out[reap_budget];
    std::size_t k = 0;
    bool left = false;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      if (new_interval) {
        // The empty chunks that sat unused all through the last interval (its lowest count),
        // above the floor, are doomed; the count starts again from now.
        doomed_ = std::min(low_, empties_ > floor_chunks ? empties_ - floor_chunks : 0);
        low_ = empties_;
        ++reaps_;
      }
      doomed_ = std::min(doomed_, empties_); // taken meanwhile: the newest went first
      while (doomed_ > 0 && k < reap_budget) {
        auto* c = empty_tail_; // the oldest
        pop_empty(c);
        retire(c);
        out[k++] = c;
        --doomed_;
      }
      low_ = std::min(low_, empties_);
      reaped_ += k;
      left = doomed_ > 0;
      backlog_.store(left, std::memory_order_relaxed);
    }
    for (std::size_t i = 0; i < k; ++i)
      ::munmap(out[i], chunk_bytes);
    return left;
  }

  std::chrono::nanoseconds set_reap_interval(std::chrono::nanoseconds d) noexcept {
    return clock_.set_interval(d);
  }

  /// Held across a fork, so the child never inherits it locked by a thread it lacks.
  std::mutex mtx_;

 private:
  /// Empty chunks kept at most (the working set a burst leaves: 256 MB, about 180k task
  /// actors), and kept for good (one: a burst's first blocks never wait for a mapping).
  static constexpr std::size_t cap_chunks = 128;
  static constexpr std::size_t floor_chunks = 1;
  /// Chunks one reaping pass unmaps at most (the rest at the next call).
  static constexpr std::size_t reap_budget = 16;

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
    current_ = c;
    return true;
  }

  /// Puts an empty chunk (on no list) with the empty ones; false at the cap.
  bool park_empty(chunk* c) noexcept {
    if (empties_ >= cap_chunks) return false;
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

  /// Maps a chunk (no lock held): 2 MB-aligned, its header written.
  chunk* map() {
    // Twice the size, then the unaligned ends trimmed: a 2 MB-aligned chunk.
    auto* raw = ::mmap(nullptr, 2 * chunk_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc{};
    auto base = reinterpret_cast<uintptr_t>(raw);
    auto aligned = (base + chunk_bytes - 1) & ~(chunk_bytes - 1);
    if (aligned > base) ::munmap(raw, aligned - base);
    auto tail = base + 2 * chunk_bytes - (aligned + chunk_bytes);
    if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + chunk_bytes), tail);
#ifdef MADV_HUGEPAGE
    if (huge_pages_) ::madvise(reinterpret_cast<void*>(aligned), chunk_bytes, MADV_HUGEPAGE);
#endif
    return new (reinterpret_cast<void*>(aligned)) chunk{};
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

  /// Whether chunks are marked for huge pages: yes unless TROUPE_HUGEPAGES=0 (the kernel
  /// may compact memory to find a huge page when a chunk is first touched; a service that
  /// must never wait for that turns it off).
  const bool huge_pages_ = [] {
    const char* v = std::getenv("TROUPE_HUGEPAGES");
    return v == nullptr || std::string_view{v} != "0";
  }();
  std::size_t block_ = 0;
  uint32_t per_chunk_ = 0;
  chunk* current_ = nullptr;
  chunk* head_ = nullptr; // chunks with room, other than the current one
  uint64_t live_ = 0;
  uint64_t allocated_ = 0;
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

/// Never destroyed: an actor freed during static destruction still finds it.
slab& the_slab() {
  static auto* s = [] {
    auto* sl = new slab;
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
