#pragma once

// The wait-for graph of the sync primitives (mutex, rwlock, semaphore, gate): which task
// waits, without a timeout, on which key, and what blocks it there. Only contended keys are
// in it: a key is published while it has untimed waiters, so an acquire that gets its permit
// at once never touches it. Shared by the sync actors of one runtime (each key is its own
// actor, a cycle crosses several), guarded by one mutex that only the contended path takes.
// Keys are the sync actors' ids; a key's name is kept for the error message only.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/actor_addr.hpp>

namespace troupe::detail {

class lock_graph {
 public:
  /// What a key looks like while it has untimed waiters.
  struct key_state {
    /// The key's permits in all.
    int64_t capacity = 1;
    /// The tasks holding permits of the key (each once), with how many they hold.
    std::vector<std::pair<caf::actor_id, int64_t>> holders;
    /// The untimed waiters in FIFO order, with how many permits each asks.
    std::vector<std::pair<caf::actor_id, int64_t>> waiters;
  };

  /// Replaces the state of key `key` (named `name`; empty `waiters` removes the key), then
  /// looks for a wait-for cycle through `waiter` (when not 0: the waiter that was just
  /// queued). Returns the names of the cycle's keys, starting with `key`, or nothing. One
  /// lock for both, so that of two acquires closing one cycle from two threads, the second
  /// sees the first. `st` is copied (its buffers can be reused by the caller).
  std::optional<std::vector<std::string>> publish(uint64_t key, const std::string& name,
                                                  const key_state& st, caf::actor_id waiter);

  /// Removes `key` (its actor ends).
  void forget(uint64_t key);

  /// How many keys are published (tests).
  size_t size() const;

 private:
  struct entry {
    key_state st;
    std::string name;
  };

  /// Appends the tasks `who`'s wait in `st` cannot end without: see the .cpp.
  static void blockers(const key_state& st, caf::actor_id who, std::vector<caf::actor_id>& out);

  void unpublish(uint64_t key, entry& e);

  mutable std::mutex mx_;
  std::unordered_map<uint64_t, entry> keys_;
  /// An untimed waiter -> the key it waits on (a task waits on one thing at a time).
  std::unordered_map<caf::actor_id, uint64_t> waits_;
};

} // namespace troupe::detail
