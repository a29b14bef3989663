// The task actors' slab (see actor_slab.hpp): 2 MB chunks of fixed-size blocks, one lock.

#include "troupe/actors/detail/actor_slab.hpp"

#include <cstdlib>
#include <mutex>
#include <new>
#include <string_view>
#include <utility>

#include <pthread.h>
#include <sys/mman.h>

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
    chunk* spare = nullptr; // a chunk mapped meanwhile by another thread too: given back
    while (current_ == nullptr || !has_room(current_)) {
      if (take_listed()) break;
      // No chunk has room: map one, the system calls and the first touch of the huge page
      // outside the lock (the other workers free actors meanwhile).
      lk.unlock();
      auto* fresh = map();
      lk.lock();
      ++chunks_;
      // It joins the list as the kept empty chunk, unless there is one already (another
      // thread mapped one meanwhile); the loop then takes the fullest with room.
      if (kept_ == nullptr && !(current_ != nullptr && current_->live == 0)) {
        link(fresh);
        kept_ = fresh;
      } else {
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
    {
      std::lock_guard<std::mutex> guard{mtx_};
      if (n == 0 || n > block_) return false;
      auto* b = static_cast<free_block*>(p);
      b->next = c->free;
      c->free = b;
      --live_;
      if (c == current_) {
        // Empty: it is the one empty chunk kept for the next burst.
        if (--c->live == 0 && kept_ != nullptr) {
          dropped = std::exchange(kept_, nullptr);
          unlink(dropped);
          retire(dropped);
        }
      } else {
        if (!c->listed) link(c); // it was full: it has room now
        if (--c->live == 0) {
          // Empty: keep one empty chunk for the next burst (unless the current one is
          // empty), give the others back.
          if (kept_ == nullptr && current_->live > 0) {
            kept_ = c;
          } else {
            unlink(c);
            retire(c);
            dropped = c;
          }
        }
      }
    }
    if (dropped != nullptr) ::munmap(dropped, chunk_bytes); // outside the lock
    return true;
  }

  counters stats() {
    std::lock_guard<std::mutex> guard{mtx_};
    uint64_t empty = (kept_ != nullptr ? 1 : 0) + (current_ != nullptr && current_->live == 0 ? 1 : 0);
    return {live_, allocated_, chunks_, unmapped_, empty, per_chunk_, block_};
  }

  /// Held across a fork, so the child never inherits it locked by a thread it lacks.
  std::mutex mtx_;

 private:
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
    if (best == kept_) kept_ = nullptr;
    current_ = best;
    return true;
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
  chunk* kept_ = nullptr;  // an empty chunk on the list, kept for the next burst
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

} // namespace troupe::detail::actor_slab
