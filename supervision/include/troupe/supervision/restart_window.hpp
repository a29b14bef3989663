#pragma once

#include <cstdint>
#include <vector>

namespace troupe {

/// A sliding window of restart times: how many restarts happened within the last
/// `period` milliseconds. The policy core of both budgets (a supervisor's intensity and a
/// child's own), a plain class without an actor. Saturating: a period of `infinity` keeps
/// every entry, and no arithmetic overflows whatever the period.
class restart_window {
 public:
  /// Records a restart at `now` and forgets those before `now - period`; returns how many
  /// remain (this one included). A restart exactly `period` old still counts (OTP keeps
  /// `R >= Now - Period`).
  size_t record(int64_t now, int64_t period) {
    prune(now, period);
    // Restarts at the same millisecond share one entry: a child restarted 500k times a
    // second under a one-second window keeps at most 1000 entries, not 500k.
    if (first_ < times_.size() && times_.back().at == now)
      ++times_.back().count;
    else
      times_.push_back({now, 1});
    return ++total_;
  }

  /// Forgets the restarts before `now - period`.
  void prune(int64_t now, int64_t period) {
    // now - t > period, written without computing now - period (which may overflow).
    while (first_ < times_.size() && now - times_[first_].at > period)
      total_ -= times_[first_++].count;
    if (first_ > 0 && first_ * 2 >= times_.size()) { // compact: amortised O(1)
      times_.erase(times_.begin(), times_.begin() + static_cast<std::ptrdiff_t>(first_));
      first_ = 0;
    }
  }

  /// Returns how many restarts are in the window.
  [[nodiscard]] size_t size() const noexcept { return total_; }

  /// Forgets every restart.
  void clear() noexcept {
    times_.clear();
    first_ = 0;
    total_ = 0;
  }

 private:
  struct entry {
    int64_t at;     // ms
    size_t count;   // restarts at `at`
  };
  std::vector<entry> times_; // ascending `at` (the callers' clock does not go back)
  size_t first_ = 0;
  size_t total_ = 0;
};

} // namespace troupe
