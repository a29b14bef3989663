#pragma once

// Internal: the reaping interval shared in shape by the recycler's depot and the actor slab.
// Both keep the working set of a burst and give back, once per interval, what sat unused
// through the whole of the last one; any thread that looks at the clock may begin the next
// interval, and exactly one of the threads that look at once does.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>

namespace troupe::detail {

class reap_clock {
 public:
  /// 10 s, as jemalloc's default decay time: bursts a few seconds apart find the last
  /// one's memory, and an idle process gives it back within two intervals.
  static constexpr std::chrono::seconds default_interval{10};

  reap_clock() noexcept : last_{now()} {}

  /// When the current interval has passed: moves its start to now and returns the start it
  /// replaced (the caller begins the next interval; `undo` puts it back if it cannot reap
  /// now). Null while the interval lasts, or when another thread was elected.
  std::optional<int64_t> elect() noexcept {
    auto t = now();
    auto last = last_.load(std::memory_order_relaxed);
    if (t - last < interval_.load(std::memory_order_relaxed)) return std::nullopt;
    if (!last_.compare_exchange_strong(last, t, std::memory_order_relaxed)) return std::nullopt;
    return last;
  }

  void undo(int64_t last) noexcept { last_.store(last, std::memory_order_relaxed); }

  /// Sets the interval; returns the one it replaces.
  std::chrono::nanoseconds set_interval(std::chrono::nanoseconds d) noexcept {
    auto old = interval_.exchange(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(d).count(),
        std::memory_order_relaxed);
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::duration{old});
  }

 private:
  static int64_t now() noexcept { return std::chrono::steady_clock::now().time_since_epoch().count(); }

  std::atomic<int64_t> last_;
  std::atomic<int64_t> interval_{
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(default_interval).count()};
};

} // namespace troupe::detail
