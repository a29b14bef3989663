#pragma once

// Internal: a pool's job records by id (see record_table), unit-tested alone.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace troupe::detail {

/// A pool's job records by id: records in a slab (stable addresses; a trimmed record's slot
/// is reused by the next job) and an open-addressing index from id to slot (linear probing,
/// deletion by backward shift, no tombstones). With 10k terminal records kept, trimming the
/// oldest touches its index slot and the record only, which `prefetch` can bring in early
/// (an unordered_map's erase also walks the neighbouring nodes: three cache misses each).
///
/// Lookups answer an `entry*` (`first`: the id, `second`: the record) and `end()` is null,
/// so call sites read as with a map.
template <class Record>
class record_table {
 public:
  struct entry {
    uint64_t first = 0;
    Record second;
  };

  [[nodiscard]] entry* end() const noexcept { return nullptr; }
  [[nodiscard]] size_t size() const noexcept { return size_; }

  [[nodiscard]] entry* find(uint64_t id) noexcept {
    return const_cast<entry*>(std::as_const(*this).find(id));
  }
  [[nodiscard]] const entry* find(uint64_t id) const noexcept {
    if (index_.empty()) return nullptr;
    for (size_t i = home(id);; i = (i + 1) & mask_) {
      auto& s = index_[i];
      if (s.slot == none) return nullptr;
      if (s.id == id) return &slab_[s.slot];
    }
  }

  Record& at(uint64_t id) {
    auto* e = find(id);
    if (e == nullptr) throw std::out_of_range("troupe pool: no record " + std::to_string(id));
    return e->second;
  }

  /// Returns the record of `id`, created empty when there is none.
  Record& operator[](uint64_t id) {
    if (auto* e = find(id)) return e->second;
    if ((size_ + 1) * 2 > index_.size()) grow();
    uint32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      slot = static_cast<uint32_t>(slab_.size());
      slab_.emplace_back();
    }
    slab_[slot].first = id;
    place(id, slot);
    ++size_;
    return slab_[slot].second;
  }

  void erase(entry* e) { erase_id(e->first); }

  /// Hints that the record of `id` is needed soon (a trim a few jobs ahead).
  void prefetch(uint64_t id) noexcept {
    if (auto* e = find(id)) {
      auto* p = reinterpret_cast<const char*>(e);
      for (size_t off = 0; off < sizeof(entry); off += 64)
        __builtin_prefetch(p + off, 1);
    }
  }

  template <class F>
  void for_each(F f) {
    for (auto& s : index_)
      if (s.slot != none) f(slab_[s.slot].first, slab_[s.slot].second);
  }

  void clear() {
    slab_.clear();
    free_.clear();
    index_.clear();
    mask_ = 0;
    size_ = 0;
  }

 private:
  static constexpr uint32_t none = UINT32_MAX;
  struct index_slot {
    uint64_t id = 0;
    uint32_t slot = none;
  };

  [[nodiscard]] size_t home(uint64_t id) const noexcept {
    return static_cast<size_t>((id * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  }

  void place(uint64_t id, uint32_t slot) noexcept {
    auto i = home(id);
    while (index_[i].slot != none)
      i = (i + 1) & mask_;
    index_[i] = index_slot{id, slot};
  }

  void grow() {
    auto old = std::move(index_);
    index_.assign(std::max<size_t>(64, old.size() * 2), index_slot{});
    mask_ = index_.size() - 1;
    for (auto& s : old)
      if (s.slot != none) place(s.id, s.slot);
  }

  void erase_id(uint64_t id) {
    if (index_.empty()) return;
    auto i = home(id);
    while (index_[i].slot != none && index_[i].id != id)
      i = (i + 1) & mask_;
    if (index_[i].slot == none) return;
    auto slot = index_[i].slot;
    // What it held goes now; the slot is reused (destroyed and made afresh in place: no
    // temporary record moved in). An empty record allocates nothing; were its constructor
    // ever to throw, the process stops (noexcept) rather than keep a destroyed record.
    std::destroy_at(&slab_[slot].second);
    [&]() noexcept { std::construct_at(&slab_[slot].second); }();
    slab_[slot].first = 0;
    free_.push_back(slot);
    --size_;
    // Backward shift: pull later entries of the probe run into the hole.
    for (auto j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      if (index_[j].slot == none) break;
      auto h = home(index_[j].id);
      // Move entry j into hole i unless its home lies cyclically in (i, j].
      bool stays = (i <= j) ? (i < h && h <= j) : (i < h || h <= j);
      if (stays) continue;
      index_[i] = index_[j];
      i = j;
    }
    index_[i] = index_slot{};
  }

  std::deque<entry> slab_;
  std::vector<uint32_t> free_;
  std::vector<index_slot> index_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

} // namespace troupe::detail
