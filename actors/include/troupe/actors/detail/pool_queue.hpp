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
/// its id; `seq` is its submit order (the oldest has the smallest). Removal by id (a cancel,
/// an eviction) is O(log n); every strategy's order skips removed entries lazily.
class pool_queue {
 public:
  explicit pool_queue(pool_queue_kind kind = pool_queue_kind::priority) : kind_(kind) {}

  /// Queues job `id`, submitted as the `seq`-th, with `priority` and partition `key`
  /// (`has_key` false: the default partition).
  void push(uint64_t id, uint64_t seq, int64_t priority, const std::string& key, bool has_key) {
    insert(id, seq, priority, key, has_key, false);
  }

  /// Puts back a job taken by `pop` that never started (its worker ended): it goes where it
  /// was (priority: by its seq among equals; fifo and fair: in front; lifo: on top). Put
  /// several back in the reverse of the order they were popped.
  void requeue(uint64_t id, uint64_t seq, int64_t priority, const std::string& key, bool has_key) {
    insert(id, seq, priority, key, has_key, true);
  }

  /// Takes the next job to start; nothing when empty.
  std::optional<uint64_t> pop() {
    if (entries_.empty()) return std::nullopt;
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
          if ((entries_.empty() && stale_ != 0) || stale_ > entries_.size() + 64) compact();
          return id;
        }
        break;
      case pool_queue_kind::fifo:
        while (!order_.empty()) {
          auto seq = order_.front();
          order_.pop_front();
          if (entries_.count(seq) != 0) return take(seq);
        }
        break;
      case pool_queue_kind::lifo:
        while (!order_.empty()) {
          auto seq = order_.back();
          order_.pop_back();
          if (entries_.count(seq) != 0) return take(seq);
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
    return std::nullopt; // unreachable while entries_ and the orders agree
  }

  /// Removes job `id`; returns whether it was queued.
  bool remove(uint64_t id) {
    auto i = by_id_.find(id);
    if (i == by_id_.end()) return false;
    auto seq = i->second;
    entries_.erase(seq); // its place in an order is skipped when reached
    by_id_.erase(i);
    if (kind_ == pool_queue_kind::priority && ++stale_ > entries_.size() + 64)
      compact(); // a bucket that is never reached does not keep removed jobs forever
    return true;
  }

  /// Returns the oldest queued job (the smallest seq), or nothing.
  [[nodiscard]] std::optional<uint64_t> oldest() const {
    if (entries_.empty()) return std::nullopt;
    return entries_.begin()->second.id;
  }

  [[nodiscard]] size_t size() const noexcept { return entries_.size(); }
  /// Returns the fair_round_robin partitions holding queued jobs (or removed ones not yet
  /// skipped).
  [[nodiscard]] size_t partitions() const noexcept { return rotation_.size(); }
  [[nodiscard]] bool empty() const noexcept { return entries_.empty(); }
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
    out.reserve(entries_.size());
    for (auto& kvp : entries_)
      out.push_back(kvp.second.id);
    return out;
  }

 private:
  struct entry {
    uint64_t id;
  };

  /// Queues a job at the back of its order, or (`back_in`) where a job taken and put back was.
  void insert(uint64_t id, uint64_t seq, int64_t priority, const std::string& key, bool has_key,
              bool back_in) {
    entries_.emplace(seq, entry{id});
    by_id_.emplace(id, seq);
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
        if (back_in)
          order_.push_front(seq);
        else
          order_.push_back(seq);
        break;
      case pool_queue_kind::lifo:
        order_.push_back(seq);
        break;
      case pool_queue_kind::fair_round_robin: {
        auto pkey = has_key ? "k:" + key : std::string{"d"};
        auto [i, fresh] = partitions_.try_emplace(pkey);
        if (fresh) rotation_.push_back(pkey);
        if (back_in)
          i->second.push_front(seq);
        else
          i->second.push_back(seq);
        break;
      }
    }
  }

  /// Drops the removed jobs at the front of `part`; returns how many.
  size_t skip_removed(std::deque<uint64_t>& part) const {
    size_t n = 0;
    while (!part.empty() && entries_.count(part.front()) == 0) {
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
                             [this](uint64_t seq) { return entries_.count(seq) == 0; }),
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
    auto i = entries_.find(seq);
    auto id = i->second.id;
    by_id_.erase(id);
    entries_.erase(i);
    return id;
  }

  pool_queue_kind kind_;
  /// Every queued job by submit order: the source of truth.
  /// (The node containers allocate through the recycler: a node per job, freed wherever
  /// the pool actor runs next.)
  std::map<uint64_t, entry, std::less<>, recycler::allocator<std::pair<const uint64_t, entry>>>
      entries_;
  std::unordered_map<uint64_t, uint64_t, std::hash<uint64_t>, std::equal_to<>,
                     recycler::allocator<std::pair<const uint64_t, uint64_t>>>
      by_id_;
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
