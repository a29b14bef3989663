#pragma once
// A task's children by key (a child's actor id, or a job ticket's key): the subset of
// `std::unordered_map` the task actor uses, as an open-addressing table of pointers to
// entries. Each entry has a block of its own from troupe's recycler, so a reference to it
// stays valid while others come and go (as a map node's did); the table itself holds
// (key, pointer) pairs in one array, probed linearly.
//
// Why not `std::unordered_map`: a scope that spawns 100k children inserted each into a
// bucket list (a division by a prime for the bucket, the list's links written in two
// buckets) and rehashed the whole node list 17 times on the way, 17% of its spawn loop;
// its drain paid the same to find and unlink each one again.
//
// Keys are placed by their own low bits (children's actor ids come in increasing order, so
// a spawn loop and a drain walk the array in order). A run of keys that collide there (ids
// a multiple of the table's size apart) would make that quadratic: a probe longer than
// `max_probe` switches the table to a multiplicative hash for good.
//
// Iteration goes in insertion order (the entries are also on a list): the same spawns give
// the same order whatever the keys' values, which a simulation's replay needs (a job
// ticket's key comes from a process-wide counter, so a second run in one process has other
// keys). Erasing an entry invalidates only its own iterators. Not thread-safe (the owning
// actor's state).

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>
#include <vector>

#include "troupe/actors/detail/recycler.hpp"

namespace troupe::detail {

template <class T>
class nursery_table {
 public:
  using key_type = uint64_t;

  /// An entry: `first` the key, `second` the value (a map's pair, by name).
  struct node {
    const key_type first;
    T second;
    node* prev = nullptr; // the list in insertion order
    node* next = nullptr;
  };

 private:
  struct slot {
    key_type key = 0;
    node* ptr = nullptr; // null: free
  };

 public:
  class iterator {
   public:
    iterator() = default;
    node& operator*() const noexcept {
      return *n_;
    }
    node* operator->() const noexcept {
      return n_;
    }
    iterator& operator++() noexcept {
      n_ = n_->next;
      return *this;
    }
    bool operator==(const iterator& x) const noexcept {
      return n_ == x.n_;
    }
    bool operator!=(const iterator& x) const noexcept {
      return n_ != x.n_;
    }

   private:
    friend class nursery_table;
    explicit iterator(node* n) noexcept : n_(n) {}
    node* n_ = nullptr;
  };

  /// A probe longer than this switches to the multiplicative hash.
  static constexpr size_t max_probe = 32;

  nursery_table() = default;
  nursery_table(const nursery_table&) = delete;
  nursery_table& operator=(const nursery_table&) = delete;
  ~nursery_table() {
    clear();
  }

  size_t size() const noexcept {
    return size_;
  }
  bool empty() const noexcept {
    return size_ == 0;
  }
  /// Whether a long probe switched the table to the multiplicative hash (tests).
  bool mixed() const noexcept {
    return mixed_;
  }

  iterator begin() noexcept {
    return iterator{head_};
  }
  iterator end() noexcept {
    return iterator{};
  }

  iterator find(key_type k) noexcept {
    auto i = slot_of(k);
    return i == npos ? end() : iterator{slots_[i].ptr};
  }

  /// Inserts (k, v) unless k is present; returns where k is and whether it was inserted.
  std::pair<iterator, bool> emplace(key_type k, T&& v) {
    if (auto i = find(k); i != end()) return {i, false};
    if ((size_ + tombs_ + 1) * 4 > slots_.size() * 3) grow();
    auto* n = static_cast<node*>(recycler::allocate(sizeof(node)));
    try {
      ::new (n) node{k, std::move(v)};
    } catch (...) {
      recycler::deallocate(n, sizeof(node));
      throw;
    }
    auto probe = place(k, n);
    ++size_;
    n->prev = tail_;
    (tail_ != nullptr ? tail_->next : head_) = n;
    tail_ = n;
    if (probe > max_probe && !mixed_) {
      mixed_ = true;
      rehash(slots_.size());
    }
    return {iterator{n}, true};
  }

  void erase(iterator it) noexcept {
    auto* n = it.n_;
    auto i = slot_of(n->first);
    (n->prev != nullptr ? n->prev->next : head_) = n->next;
    (n->next != nullptr ? n->next->prev : tail_) = n->prev;
    --size_;
    // A tombstone, so that probes for later keys go on past it (a backward shift would
    // scan the rest of its run: a spawn loop's keys make one run, and draining them in
    // order was quadratic). Before a free slot it is free itself, as are the tombstones
    // just before it.
    auto mask = slots_.size() - 1;
    if (slots_[(i + 1) & mask].ptr == nullptr) {
      slots_[i] = slot{};
      for (size_t j = (i - 1) & mask; slots_[j].ptr == tomb(); j = (j - 1) & mask) {
        slots_[j] = slot{};
        --tombs_;
      }
    } else {
      slots_[i] = slot{0, tomb()};
      ++tombs_;
    }
    destroy(n); // last: the table is whole if the value's destructor looks at it
  }

  size_t erase(key_type k) noexcept {
    auto i = find(k);
    if (i == end()) return 0;
    erase(i);
    return 1;
  }

  /// Destroys every entry and gives the array back (the table is empty before the first
  /// value's destructor runs).
  void clear() noexcept {
    auto* n = std::exchange(head_, nullptr);
    tail_ = nullptr;
    std::vector<slot>{}.swap(slots_);
    size_ = 0;
    tombs_ = 0;
    mixed_ = false;
    while (n != nullptr)
      destroy(std::exchange(n, n->next));
  }

 private:
  static constexpr size_t npos = ~size_t{0};

  /// An erased entry's slot (never an entry's address: entries are aligned).
  static node* tomb() noexcept {
    return reinterpret_cast<node*>(uintptr_t{1});
  }

  /// The slot holding key k, or npos.
  size_t slot_of(key_type k) const noexcept {
    if (size_ == 0) return npos;
    auto mask = slots_.size() - 1;
    for (size_t i = home(k);; i = (i + 1) & mask) {
      auto& s = slots_[i];
      if (s.ptr == nullptr) return npos;
      if (s.key == k && s.ptr != tomb()) return i;
    }
  }

  size_t home(key_type k) const noexcept {
    auto mask = slots_.size() - 1;
    if (!mixed_) return static_cast<size_t>(k) & mask;
    // Fibonacci hashing: the top bits of the product, as many as the table's size has.
    return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> (64 - shift_)) & mask;
  }

  /// Puts (k, n) in the first free slot (or tombstone) from k's home; returns the probe's
  /// length.
  size_t place(key_type k, node* n) noexcept {
    auto mask = slots_.size() - 1;
    size_t d = 0;
    size_t i = home(k);
    while (slots_[i].ptr != nullptr && slots_[i].ptr != tomb()) {
      i = (i + 1) & mask;
      ++d;
    }
    if (slots_[i].ptr == tomb()) --tombs_;
    slots_[i] = slot{k, n};
    return d;
  }

  /// Room for one more: twice the array, or the same size without its tombstones when the
  /// entries fill less than half of it.
  void grow() {
    if (slots_.empty())
      rehash(8);
    else
      rehash(size_ * 2 < slots_.size() ? slots_.size() : slots_.size() * 2);
  }

  void rehash(size_t cap) {
    std::vector<slot> old(cap);
    old.swap(slots_);
    tombs_ = 0;
    shift_ = 0;
    while ((size_t{1} << shift_) < cap)
      ++shift_;
    for (auto& s : old)
      if (s.ptr != nullptr && s.ptr != tomb()) place(s.key, s.ptr);
  }

  static void destroy(node* n) noexcept {
    n->~node();
    recycler::deallocate(n, sizeof(node));
  }

  std::vector<slot> slots_;
  node* head_ = nullptr; // the oldest entry
  node* tail_ = nullptr; // the newest
  size_t size_ = 0;
  size_t tombs_ = 0;   // erased entries' slots (see erase)
  unsigned shift_ = 0; // log2 of the array's size
  bool mixed_ = false;
};

} // namespace troupe::detail
