#pragma once

#include <chrono>
#include <cstdint>

#include <caf/actor.hpp>
#include <caf/message.hpp>

namespace troupe {

/// The one clock every troupe timer reads: deadlines, sleeps, backoff, windows, leases.
/// A timer is a message delivered to an actor when its time comes (an anonymous send),
/// so a timer is part of an actor's protocol like any other message.
///
/// Two implementations live in the runtime: a real one (a timer thread on the steady
/// clock) and a virtual one that tests advance explicitly.
class clock {
 public:
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<std::chrono::steady_clock, duration>;
  /// Identifies a scheduled timer; 0 is never used.
  using timer_id = uint64_t;

  virtual ~clock() = default;

  /// Returns the current time of this clock.
  [[nodiscard]] virtual time_point now() const noexcept = 0;

  /// Schedules `msg` for `target` at `due` (at once when `due` has passed) and returns
  /// the id that cancels it.
  virtual timer_id schedule(time_point due, caf::actor target, caf::message msg) = 0;

  /// Cancels a pending timer; returns whether it was still pending.
  virtual bool cancel(timer_id id) noexcept = 0;

  /// Returns whether this clock is virtual (advanced by hand, not by time passing).
  [[nodiscard]] virtual bool is_virtual() const noexcept = 0;

  /// Returns the number of timers not yet fired or cancelled.
  [[nodiscard]] virtual size_t pending() const noexcept = 0;

  /// Returns the time to stamp records with, in milliseconds: since the Unix epoch on a
  /// real clock (what the event log's rows carry), `now_ms()` on a virtual one.
  [[nodiscard]] virtual int64_t wall_ms() const noexcept { return now_ms(); }
  /// Returns milliseconds since the clock's epoch; handy for logs and receipts.
  [[nodiscard]] int64_t now_ms() const noexcept {
    return std::chrono::duration_cast<std::chrono::milliseconds>(now().time_since_epoch()).count();
  }
};

} // namespace troupe
