#pragma once

// Internal: a pool's queue strategy as a plain class (no actor), unit-tested alone.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "troupe/actors/detail/recycler.hpp"
#include "troupe/messages/pool.hpp"

namespace troupe::detail {

/// The queued jobs of one pool, in the order its strategy starts them. A job is named by
/// its id; `seq` is its submit order (the oldest has the smallest). A job is found by its
/// seq in O(1) (a window of slots indexed by seq; see `slots_`), so queueing, starting and
/// removing one (a cancel, an eviction) cost no tree or hash node; every strategy's order
/// skips removed entries lazily.
class pool_queue {
 public:
  explicit pool_queue(pool_queue_kind kind = pool_queue_kind::priority) : kind_(kind) {}

  /// Queues job `id`, submitted as the `seq`-th, with `priority` and partition `key`
  /// (`has_key` false: the default partition).
  void push(uint64_t id, uint64_t seq, int64_t priority, const std::string& key, bool has_key) {
    insert(id, seq, priority, key, has_key, false);
  }

  /// Puts back a job taken by `pop` that never started (its worker ended): it goes where it
  /// was (priority: by its seq among equals; fifo: by its seq, so jobs put back by two
  /// workers in either order start oldest first; fair: by its seq in its partition, and a
  /// partition that ran empty meanwhile rejoins the rotation at the next turn; lifo: on
  /// top). Put several back in the reverse of the order they were popped.
  void requeue(uint64_t id, uint64_t seq, int64_t priority, const std::string& key, bool has_key) {
    insert(id, seq, priority, key, has_key, true);
  }

  /// Takes the next job to start; nothing when empty.
  std::optional<uint64_t> pop() {
    if (size_ == 0) return std::nullopt;
    switch (kind_) {
      case pool_queue_kind::priority:
        while (!buckets_.empty()) {
          auto b = buckets_.begin(); // the highest priority queued
          auto& q = b->second;
          stale_ -= skip_removed(q);
          if (q.empty()) {
            buckets_.erase(b);
            continue;
          }
          auto seq = q.front();
          q.pop_front();
          // An emptied bucket goes unless it is the only one (the usual case: every job
          // at the same priority; it is not made afresh for each job).
          if (q.empty() && buckets_.size() > 1) buckets_.erase(b);
          auto id = take(seq);
          // Nothing queued: nothing held. Removed ones never outnumber the queued ones by
          // more than 64 (checked at each removal, and here as the queue shrinks).
          if ((size_ == 0 && stale_ != 0) || stale_ > size_ + 64) compact();
          return id;
        }
        break;
      case pool_queue_kind::fifo:
        while (!order_.empty()) {
          auto seq = order_.front();
          order_.pop_front();
          if (queued(seq)) return take(seq);
        }
        break;
      case pool_queue_kind::lifo:
        while (!order_.empty()) {
          auto seq = order_.back();
          order_.pop_back();
          if (queued(seq)) return take(seq);
        }
        break;
      case pool_queue_kind::fair_round_robin:
        // One job per visit, partitions in first-seen order. A partition that runs empty
        // leaves the rotation (a key seen again later joins at the end): the rotation holds
        // only partitions with queued jobs, however many keys come and go.
        while (!rotation_.empty()) {
          if (cursor_ >= rotation_.size()) cursor_ = 0;
          auto& part = partitions_[rotation_[cursor_]];
          skip_removed(part);
          if (part.empty()) {
            drop_partition(cursor_); // the cursor now points at the next one
            continue;
          }
          auto seq = part.front();
          part.pop_front();
          skip_removed(part);
          if (part.empty())
            drop_partition(cursor_);
          else
            ++cursor_;
          if (cursor_ >= rotation_.size()) cursor_ = 0; // wrap now: keys seen later go after
          return take(seq);
        }
        break;
    }
    return std::nullopt; // unreachable while the slots and the orders agree
  }

  /// Removes job `id`, queued as the `seq`-th; returns whether it was queued (as that).
  bool remove(uint64_t id, uint64_t seq) {
    auto* s = find(seq);
    if (s == nullptr || *s != id) return false;
    erase(seq); // its place in an order is skipped when reached
    if (kind_ == pool_queue_kind::priority && ++stale_ > size_ + 64)
      compact(); // a bucket that is never reached does not keep removed jobs forever
    return true;
  }

  /// Returns the oldest queued job (the smallest seq) as (id, seq), or nothing.
  [[nodiscard]] std::optional<std::pair<uint64_t, uint64_t>> oldest() const {
    if (size_ == 0) return std::nullopt;
    if (!behind_.empty()) return std::pair{behind_.begin()->second, behind_.begin()->first};
    return std::pair{slots_.front(), base_}; // the window's front is never an empty slot
  }

  [[nodiscard]] size_t size() const noexcept { return size_; }
  /// Returns the fair_round_robin partitions holding queued jobs (or removed ones not yet
  /// skipped).
  [[nodiscard]] size_t partitions() const noexcept { return rotation_.size(); }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  /// Returns the slots the window spans, empty ones included (bounded: at most twice the
  /// jobs it holds, plus 64).
  [[nodiscard]] size_t window_span() const noexcept { return slots_.size(); }
  /// Returns the places the priority buckets hold, removed jobs not yet skipped included
  /// (bounded: at most twice the queued jobs, plus 64).
  [[nodiscard]] size_t bucket_places() const noexcept {
    size_t n = 0;
    for (auto& [p, q] : buckets_)
      n += q.size();
    return n;
  }

  /// Returns the queued ids in submit order (for a snapshot or a stop).
  [[nodiscard]] std::vector<uint64_t> ids() const {
    std::vector<uint64_t> out;
    out.reserve(size_);
    for (auto& kvp : behind_)
      out.push_back(kvp.second);
    for (auto id : slots_)
      if (id != empty_slot) out.push_back(id);
    return out;
  }

 private:
  static constexpr uint64_t empty_slot = 0; // pool job ids start at 1

  /// Queues a job at the back of its order, or (`back_in`) where a job taken and put back was.
  void insert(uint64_t id, uint64_t seq, int64_t priority, const std::string& key, bool has_key,
              bool back_in) {
    place(seq, id);
    switch (kind_) {
      case pool_queue_kind::priority: {
        auto& q = buckets_[-priority];
        if (back_in) // where it was: by its seq among equals (the bucket is in seq order)
          q.insert(std::upper_bound(q.begin(), q.end(), seq), seq);
        else
          q.push_back(seq);
        break;
      }
      case pool_queue_kind::fifo:
        // The order stays sorted by seq (removed entries too, skipped when reached).
        if (back_in)
          order_.insert(std::upper_bound(order_.begin(), order_.end(), seq), seq);
        else
          order_.push_back(seq);
        break;
      case pool_queue_kind::lifo:
        order_.push_back(seq);
        break;
      case pool_queue_kind::fair_round_robin: {
        auto pkey = has_key ? "k:" + key : std::string{"d"};
        auto [i, fresh] = partitions_.try_emplace(pkey);
        if (fresh && back_in) // its turn was taken with this job: it gets it back
          rotation_.insert(rotation_.begin() + static_cast<std::ptrdiff_t>(
                                                   std::min(cursor_, rotation_.size())),
                           pkey);
        else if (fresh)
          rotation_.push_back(pkey);
        auto& part = i->second;
        if (back_in)
          part.insert(std::upper_bound(part.begin(), part.end(), seq), seq);
        else
          part.push_back(seq);
        break;
      }
    }
  }

  /// Drops the removed jobs at the front of `part`; returns how many.
  size_t skip_removed(std::deque<uint64_t>& part) const {
    size_t n = 0;
    while (!part.empty() && !queued(part.front())) {
      part.pop_front();
      ++n;
    }
    return n;
  }

  /// priority: drops every removed job from the buckets, and the buckets left empty.
  void compact() {
    for (auto b = buckets_.begin(); b != buckets_.end();) {
      auto& q = b->second;
      q.erase(std::remove_if(q.begin(), q.end(),
                             [this](uint64_t seq) { return !queued(seq); }),
              q.end());
      if (q.empty())
        b = buckets_.erase(b);
      else
        ++b;
    }
    stale_ = 0;
  }

  void drop_partition(size_t i) {
    partitions_.erase(rotation_[i]);
    rotation_.erase(rotation_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  uint64_t take(uint64_t seq) {
    auto id = *find(seq);
    erase(seq);
    return id;
  }

  // -- the queued jobs by seq ---------------------------------------------------------------

  [[nodiscard]] bool queued(uint64_t seq) const noexcept { return find(seq) != nullptr; }

  /// Returns the id queued as `seq`, or null.
  [[nodiscard]] const uint64_t* find(uint64_t seq) const noexcept {
    if (seq >= base_) {
      auto i = seq - base_;
      return i < slots_.size() && slots_[i] != empty_slot ? &slots_[i] : nullptr;
    }
    auto i = behind_.find(seq);
    return i == behind_.end() ? nullptr : &i->second;
  }

  void place(uint64_t seq, uint64_t id) {
    ++size_;
    if (slots_.empty() && seq >= base_) {
      base_ = seq;
      slots_.push_back(id);
      return;
    }
    if (seq < base_) { // put back after the window moved past it
      behind_.emplace(seq, id);
      return;
    }
    auto i = seq - base_;
    if (i >= slots_.size()) slots_.resize(i + 1, empty_slot);
    slots_[i] = id;
    keep_dense();
  }

  void erase(uint64_t seq) {
    --size_;
    if (seq < base_) {
      behind_.erase(seq);
      return;
    }
    slots_[seq - base_] = empty_slot;
    while (!slots_.empty() && slots_.front() == empty_slot) {
      slots_.pop_front();
      ++base_;
    }
    while (!slots_.empty() && slots_.back() == empty_slot)
      slots_.pop_back();
    keep_dense();
  }

  /// Keeps the window at most twice the jobs it holds, plus 64: jobs at its front that the
  /// others pass (a low priority under a flood of higher ones) move to `behind_`.
  void keep_dense() {
    auto in_window = size_ - behind_.size();
    while (slots_.size() > 2 * in_window + 64) {
      if (slots_.front() != empty_slot) behind_.emplace(base_, slots_.front());
      slots_.pop_front();
      ++base_;
      while (!slots_.empty() && slots_.front() == empty_slot) {
        slots_.pop_front();
        ++base_;
      }
      in_window = size_ - behind_.size();
    }
  }

  pool_queue_kind kind_;
  /// Every queued job by seq, the source of truth: `slots_[i]` holds the id queued as the
  /// `base_ + i`-th (`empty_slot`: none, removed or started), its front and back never
  /// empty slots. Seqs grow with each submit, so a job costs a slot at the back, not a
  /// tree or hash node. Jobs older than the window (passed over for long, or put back after
  /// it moved on) are in `behind_`, ordered by seq.
  std::deque<uint64_t> slots_;
  uint64_t base_ = 0;
  std::map<uint64_t, uint64_t> behind_;
  size_t size_ = 0;
  /// priority: a FIFO of seqs per priority, keyed by -priority (the first bucket holds the
  /// highest). A job costs a deque slot, not a tree node; removed ones are skipped when
  /// reached, as in the fifo order.
  std::map<int64_t, std::deque<uint64_t>, std::less<>> buckets_;
  size_t stale_ = 0; // removed jobs still in the buckets (at most; see compact)
  /// fifo / lifo: seqs in submit order (removed ones skipped when reached).
  std::deque<uint64_t> order_;
  /// fair_round_robin: the partitions and the order they were first seen in.
  std::unordered_map<std::string, std::deque<uint64_t>> partitions_;
  std::vector<std::string> rotation_;
  size_t cursor_ = 0;
};

} // namespace troupe::detail
