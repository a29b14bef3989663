#pragma once

// The wait-for graph of the sync primitives (mutex, rwlock, semaphore, gate): which task
// waits, without a timeout, on which key, and what blocks it there. Only contended keys are
// in it: a key is published while it has untimed waiters, so an acquire that gets its permit
// at once never touches it. Shared by the sync actors of one runtime (each key is its own
// actor, a cycle crosses several), guarded by one mutex that only the contended path takes.

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
    /// The tasks holding permits of the key (each once).
    std::vector<caf::actor_id> holders;
    /// The untimed waiters in their FIFO order: each is blocked by the holders and by the
    /// waiters ahead of it (strict FIFO: it cannot pass them).
    std::vector<caf::actor_id> waiters;
  };

  /// Replaces the state of `key` (an empty `waiters` removes the key), then looks for a
  /// wait-for cycle through `waiter` (when not 0: the waiter that was just queued). Returns
  /// the keys of the cycle, starting with `key`, or nothing. One lock for both, so that of
  /// two acquires closing one cycle from two threads, the second sees the first.
  std::optional<std::vector<std::string>> publish(const std::string& key, key_state st,
                                                  caf::actor_id waiter);

  /// Removes `key` (its actor ends).
  void forget(const std::string& key);

  /// How many keys are published (tests).
  size_t size() const;

 private:
  /// The tasks blocking `who` in `key` (its holders and the untimed waiters ahead of it).
  void blockers(const key_state& st, caf::actor_id who, std::vector<caf::actor_id>& out) const;

  mutable std::mutex mx_;
  std::unordered_map<std::string, key_state> keys_;
  /// An untimed waiter -> the key it waits on (a task waits on one thing at a time).
  std::unordered_map<caf::actor_id, std::string> waits_;
};

} // namespace troupe::detail
