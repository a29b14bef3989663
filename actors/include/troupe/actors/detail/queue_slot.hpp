#pragma once

// Internal: the hand-over slot a channel or mailbox shares with the tasks that send to it
// (see queue_actor.cpp, queue_send_awaiter).

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>

#include <caf/abstract_actor.hpp>
#include <caf/actor.hpp>
#include <caf/actor_cast.hpp>

namespace troupe::detail {

/// The slot's lock: a test-and-set flag. Held for a few loads and stores; the owner's
/// thread never blocks while holding it. Senders and renewing receivers only try it (a taken
/// lock means the queue is busy with the slot: they take the queue's path); the queue waits.
/// A pthread mutex cost ~40 ns per hand-over here, this costs one exchange and one store.
class slot_lock {
 public:
  bool try_lock() noexcept {
    return !busy_.load(std::memory_order_relaxed) &&
           !busy_.exchange(true, std::memory_order_acquire);
  }
  void lock() noexcept {
    for (unsigned n = 0; !try_lock(); ++n)
      if (n >= 64) std::this_thread::yield();
  }
  void unlock() noexcept { busy_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> busy_{false};
};

/// While a receiver waits on an empty queue under a receive grant, the queue actor arms this
/// slot with that receiver and a budget of room. A sender on the same node that finds it
/// armed hands its value straight to the receiver, one CAF message instead of two (sender
/// to queue, queue to receiver), and the slot counts it; the queue folds the count into its
/// own books (capacity, sequence numbers, metrics) before it handles its next message.
///
/// The queue's own state stays the queue actor's: the slot is disarmed whenever the queue
/// runs a handler, so a direct hand-over happens only between two of its messages, when the
/// queue is idle and its buffer empty. Per-sender FIFO: a sender with posts the queue has
/// not handled yet (`posts_in_flight`, or posts it has not sent yet) takes the slow path.
///
/// A receiver whose grant was used up by direct hand-overs renews it here, in place of a
/// `q_recv` message (see queue_recv_awaiter::renew_here): only while the queue is idle with
/// that grant as its only taker, with its consumed count as the room it frees. A ping-pong
/// between two tasks then costs one CAF message per hop and never wakes the queue actor.
struct queue_slot {
  slot_lock mtx;
  // -- guarded by mtx ------------------------------------------------------------------------
  bool armed = false;
  /// Values senders may still hand over directly (room the queue reserved for them).
  int64_t budget = 0;
  /// The waiting receiver (held alive by the queue's entry for its grant while armed).
  caf::abstract_actor* receiver = nullptr;
  uint64_t grant_seq = 0;
  /// The type key a value must have (0: any).
  size_t type = 0;
  /// The queue's numbering of values, continued while armed.
  uint64_t next_seq = 0;
  /// Values handed over directly since the slot was armed.
  uint64_t handed = 0;
  /// What is left of the armed grant (the receiver's `q_recv` max, less what was handed).
  int64_t grant_left = 0;
  /// Room beyond `budget` (the queue's room when armed, less the budget): values the
  /// receiver consumed meanwhile add to it.
  int64_t spare = 0;
  /// The receiver's count of values it consumed, as the queue knows it (or as the receiver
  /// reported it here when it renewed its grant).
  uint64_t reported = 0;
  /// The armed grant is the queue's only waiting taker: its receiver may renew it here.
  bool exclusive = false;
  /// The receiver renewed its grant here (the queue books `reported` when it disarms).
  bool renewed = false;
  // -- shared --------------------------------------------------------------------------------
  /// Post messages sent to the queue and not handled by it yet.
  std::atomic<int64_t> posts_in_flight{0};
};

/// The base a queue actor carries its slot in (found from an actor handle by cross-cast).
struct queue_slot_host {
  queue_slot slot_;
};

/// Returns the slot of `queue` when it is a queue actor of this process, else null.
inline queue_slot* find_queue_slot(const caf::actor& queue) noexcept {
  auto ptr = caf::actor_cast<caf::abstract_actor*>(queue);
  if (ptr == nullptr) return nullptr;
  auto host = dynamic_cast<queue_slot_host*>(ptr);
  return host != nullptr ? &host->slot_ : nullptr;
}

} // namespace troupe::detail
