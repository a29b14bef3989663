#pragma once

// Internal: the hand-over slot a channel or mailbox shares with the tasks that send to it
// (see queue_actor.cpp, queue_send_awaiter).

#include <atomic>
#include <cstdint>
#include <mutex>

#include <caf/abstract_actor.hpp>
#include <caf/actor.hpp>
#include <caf/actor_cast.hpp>

namespace troupe::detail {

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
struct queue_slot {
  std::mutex mtx;
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
