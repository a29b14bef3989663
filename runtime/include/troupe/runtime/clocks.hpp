#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "troupe/messages/clock.hpp"

namespace troupe {

namespace detail {

/// Pending timers ordered by due time, then by scheduling order (FIFO for equal times).
class timer_queue {
 public:
  struct entry {
    clock::timer_id id;
    caf::actor target;
    caf::message msg;
  };
  using key = std::pair<clock::time_point, clock::timer_id>;

  clock::timer_id add(clock::time_point due, caf::actor target, caf::message msg);
  bool remove(clock::timer_id id) noexcept;
  /// Removes and returns the earliest timer due at or before `now`.
  std::optional<std::pair<clock::time_point, entry>> pop_due(clock::time_point now);
  [[nodiscard]] std::optional<clock::time_point> next_due() const;
  [[nodiscard]] size_t size() const noexcept { return by_due_.size(); }
  void clear() noexcept;

 private:
  clock::timer_id next_id_ = 0;
  std::map<key, entry> by_due_;
  std::unordered_map<clock::timer_id, clock::time_point> due_of_;
};

/// Delivers a timer's message to its target (an anonymous enqueue).
void deliver(const caf::actor& target, caf::message msg);

} // namespace detail

/// The production clock: the steady clock, with one timer thread delivering due timers.
class real_clock final : public clock {
 public:
  real_clock();
  ~real_clock() override;
  real_clock(const real_clock&) = delete;
  real_clock& operator=(const real_clock&) = delete;

  time_point now() const noexcept override;
  int64_t wall_ms() const noexcept override;
  timer_id schedule(time_point due, caf::actor target, caf::message msg) override;
  bool cancel(timer_id id) noexcept override;
  bool is_virtual() const noexcept override { return false; }
  size_t pending() const noexcept override;

  /// Stops the timer thread and drops pending timers (releasing their targets).
  void stop() noexcept;

 private:
  void run();

  mutable std::mutex mtx_;
  std::condition_variable cv_;
  detail::timer_queue queue_;
  bool stopping_ = false;
  /// When the timer thread wakes by itself (min: it is awake). Guarded by mtx_.
  time_point wake_at_ = time_point::min();
  std::thread thread_;
};

/// A clock that moves only when told: `advance(50ms)` fires every timer due within the
/// next 50 ms in time order, each at its own instant, running the `on_fire` hook after each
/// (the runtime drains its deterministic scheduler there, so timers scheduled by a fired
/// timer's receiver fire in the same advance when they fall due). Starts at time 0.
class virtual_clock final : public clock {
 public:
  virtual_clock() = default;

  time_point now() const noexcept override;
  timer_id schedule(time_point due, caf::actor target, caf::message msg) override;
  bool cancel(timer_id id) noexcept override;
  bool is_virtual() const noexcept override { return true; }
  size_t pending() const noexcept override;

  /// Moves time forward by `d`, firing everything due, in order; returns how many fired.
  size_t advance(duration d);
  /// Moves time to the next pending timer and fires it (and any due at the same instant);
  /// returns false when no timer is pending.
  bool advance_to_next();
  /// Returns the due time of the next pending timer.
  [[nodiscard]] std::optional<time_point> next_due() const;
  /// Sets what runs after each fired timer (the runtime drains its scheduler there).
  void on_fire(std::function<void()> hook) { on_fire_ = std::move(hook); }
  /// Drops pending timers.
  void clear() noexcept;

 private:
  size_t fire_until(time_point target);

  mutable std::mutex mtx_;
  time_point now_{};
  detail::timer_queue queue_;
  std::function<void()> on_fire_;
};

} // namespace troupe
