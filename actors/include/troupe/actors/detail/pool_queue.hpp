#pragma once

// Internal: a pool's queue strategy as a plain class (no actor), unit-tested alone.

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
/// an eviction) is O(log n); the FIFO-like strategies skip removed entries lazily.
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
      case pool_queue_kind::priority: {
        auto i = by_priority_.begin();
        auto seq = i->second;
        by_priority_.erase(i);
        return take(seq);
      }
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
    if (kind_ == pool_queue_kind::priority) by_priority_.erase({-entries_.at(seq).priority, seq});
    entries_.erase(seq);
    by_id_.erase(i);
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
    int64_t priority;
  };

  /// Queues a job at the back of its order, or (`back_in`) where a job taken and put back was.
  void insert(uint64_t id, uint64_t seq, int64_t priority, const std::string& key, bool has_key,
              bool back_in) {
    entries_.emplace(seq, entry{id, priority});
    by_id_.emplace(id, seq);
    switch (kind_) {
      case pool_queue_kind::priority:
        by_priority_.emplace(-priority, seq);
        break;
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

  void skip_removed(std::deque<uint64_t>& part) const {
    while (!part.empty() && entries_.count(part.front()) == 0)
      part.pop_front();
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
  /// priority: (-priority, seq), so the first is the highest priority, oldest among equals.
  std::set<std::pair<int64_t, uint64_t>, std::less<>,
           recycler::allocator<std::pair<int64_t, uint64_t>>>
      by_priority_;
  /// fifo / lifo: seqs in submit order (removed ones skipped when reached).
  std::deque<uint64_t> order_;
  /// fair_round_robin: the partitions and the order they were first seen in.
  std::unordered_map<std::string, std::deque<uint64_t>> partitions_;
  std::vector<std::string> rotation_;
  size_t cursor_ = 0;
};

} // namespace troupe::detail
