#pragma once

// Internal: the table a supervisor keeps its children in.

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace troupe::detail {

/// A record's neighbours in an ordered_table (a member `links` of the record).
template <class Rec>
struct table_links {
  std::pair<const uint64_t, Rec>* prev = nullptr;
  std::pair<const uint64_t, Rec>* next = nullptr;
};

/// Records by a growing uid: found in O(1) (a hash table; its nodes never move, so a record's
/// address is stable until it is erased) and walked in uid order (a list through the
/// records: a new record has the highest uid and goes last). It answers what std::map did
/// for a supervisor's children, which took O(log n) per lookup: at 100k children a lookup
/// walked ~17 nodes no cache held, and a stop (two lookups per child) grew x170-190 from 1k
/// to 100k children.
template <class Rec>
class ordered_table {
 public:
  using value_type = std::pair<const uint64_t, Rec>;

  template <bool Const>
  class basic_iterator {
   public:
    using iterator_category = std::bidirectional_iterator_tag;
    using value_type = ordered_table::value_type;
    using difference_type = std::ptrdiff_t;
    using pointer = std::conditional_t<Const, const value_type*, value_type*>;
    using reference = std::conditional_t<Const, const value_type&, value_type&>;

    basic_iterator() = default;
    basic_iterator(value_type* at, const ordered_table* table) : at_(at), table_(table) {}
    reference operator*() const { return *at_; }
    pointer operator->() const { return at_; }
    basic_iterator& operator++() {
      at_ = at_->second.links.next;
      return *this;
    }
    basic_iterator& operator--() { // end() - 1 is the last record
      at_ = at_ == nullptr ? table_->tail_ : at_->second.links.prev;
      return *this;
    }
    bool operator==(const basic_iterator& o) const { return at_ == o.at_; }
    bool operator!=(const basic_iterator& o) const { return at_ != o.at_; }

   private:
    value_type* at_ = nullptr;
    const ordered_table* table_ = nullptr;
  };
  using iterator = basic_iterator<false>;
  using const_iterator = basic_iterator<true>;

  ordered_table() = default;
  ordered_table(const ordered_table&) = delete;
  ordered_table& operator=(const ordered_table&) = delete;

  iterator begin() { return {head_, this}; }
  iterator end() { return {nullptr, this}; }
  const_iterator begin() const { return {head_, this}; }
  const_iterator end() const { return {nullptr, this}; }
  [[nodiscard]] size_t size() const noexcept { return map_.size(); }
  void reserve(size_t n) { map_.reserve(n); }

  iterator find(uint64_t uid) {
    auto i = map_.find(uid);
    return {i == map_.end() ? nullptr : &*i, this};
  }
  const_iterator find(uint64_t uid) const {
    auto i = map_.find(uid);
    return {i == map_.end() ? nullptr : const_cast<value_type*>(&*i), this};
  }
  [[nodiscard]] size_t count(uint64_t uid) const { return map_.count(uid); }
  Rec& at(uint64_t uid) { return map_.at(uid); }

  /// A new record, last in start order: `uid` is above every uid in the table.
  Rec& append(uint64_t uid) {
    assert(tail_ == nullptr || uid > tail_->first);
    auto [it, fresh] = map_.try_emplace(uid);
    assert(fresh);
    (void)fresh;
    auto* node = &*it;
    node->second.links.prev = tail_;
    if (tail_ != nullptr)
      tail_->second.links.next = node;
    else
      head_ = node;
    tail_ = node;
    if (erased_next_ == nullptr) erased_next_ = node; // now the first after erased_uid_
    return node->second;
  }

  void erase(uint64_t uid) {
    auto i = map_.find(uid);
    if (i == map_.end()) return;
    auto* node = &*i;
    auto* prev = node->second.links.prev;
    auto* next = node->second.links.next;
    (prev != nullptr ? prev->second.links.next : head_) = next;
    (next != nullptr ? next->second.links.prev : tail_) = prev;
    erased_uid_ = uid; // lower_bound's hint: the first child after the erased one
    erased_next_ = next;
    map_.erase(i);
  }

  /// The first record whose uid is `uid` or above, as std::map::lower_bound. O(1) for a
  /// uid in the table, a uid above all of them and the uid erased last; a walk from the
  /// last record otherwise. (A supervisor's stop sequence asks for the child it stopped
  /// last, which stays in the table: a temporary child ending during the stop is forgotten
  /// only with its supervisor.)
  iterator lower_bound(uint64_t uid) {
    if (tail_ == nullptr || uid > tail_->first) return end();
    if (auto i = map_.find(uid); i != map_.end()) return {&*i, this};
    if (uid == erased_uid_) return {erased_next_, this};
    auto* at = tail_;
    while (at->second.links.prev != nullptr && at->second.links.prev->first >= uid)
      at = at->second.links.prev;
    return {at, this};
  }

  /// The first record whose uid is above `uid`, as std::map::upper_bound.
  iterator upper_bound(uint64_t uid) {
    if (auto i = map_.find(uid); i != map_.end()) return {i->second.links.next, this};
    return lower_bound(uid);
  }

 private:
  std::unordered_map<uint64_t, Rec> map_;
  value_type* head_ = nullptr;
  value_type* tail_ = nullptr;
  uint64_t erased_uid_ = 0; // the uid erased last, and the first record after it
  value_type* erased_next_ = nullptr;
};

} // namespace troupe::detail
