#pragma once

// Internal: the reaping interval shared in shape by the recycler's depot and the actor slab.
// Both keep the working set of a burst and give back, once per interval, what sat unused
// through the whole of the last one; any thread that looks at the clock may begin the next
// interval, and exactly one of the threads that look at once does.

#include <algorithm>
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

/// Paces what the reapers give back on their own (an idle worker's timed-out sleep, a depot
/// trade, a chunk that empties; not `reap_now`): one paced pass frees at a time (`claim`),
/// and after one that took `d` to free and unmap, the next waits `pace_factor` × d (at most
/// `max_pause`), so giving back a burst's memory costs an idle process at most ~0.5% of a
/// core, however much the burst left. Unmapping a 2 MB chunk costs 0.25-0.45 ms here:
/// unpaced, an idle process of the benchmark's whole pass gave back up to 66 chunks in one
/// second, 3% of its CPU. The price: 128 kept chunks (256 MB) go back over ~10 s instead of
/// ~1 s. Process-wide: the actor slab's and the recycler's passes share one pace.
class reap_pacer {
 public:
  static constexpr int64_t pace_factor = 200;
  static constexpr std::chrono::seconds max_pause{2};

  /// Returns whether a paced pass may free now (a cheap look before `claim`).
  static bool ready() noexcept { return now() >= resume_.load(std::memory_order_relaxed); }

  /// Claims the pace for one pass: true when the last pass's pause is over and no other
  /// paced pass holds it (the claimer then calls `done`). Concurrent passes (two idle
  /// workers, a depot trade) do not free at once.
  static bool claim() noexcept {
    auto r = resume_.load(std::memory_order_relaxed);
    auto t = now();
    if (t < r) return false;
    return resume_.compare_exchange_strong(r, t + ticks(max_pause), std::memory_order_relaxed);
  }

  /// Ends a claimed pass begun at `start` (a `now()` read): with something freed, the pause
  /// after it; else the pace is free again.
  static void done(int64_t start, bool freed) noexcept {
    if (freed)
      spent(start);
    else
      resume_.store(0, std::memory_order_relaxed);
  }

  /// Sets the pause after a pass that freed something from `start` to now (tests: a pause
  /// of their choosing).
  static void spent(int64_t start) noexcept {
    auto end = now();
    auto pause = std::min<int64_t>((end - start) * pace_factor, ticks(max_pause));
    resume_.store(end + pause, std::memory_order_relaxed);
  }

  /// The steady clock's time, in its ticks.
  static int64_t now() noexcept { return std::chrono::steady_clock::now().time_since_epoch().count(); }

  /// Tests: when the next paced pass may free (0: at once).
  static int64_t resume_at() noexcept { return resume_.load(std::memory_order_relaxed); }

  /// Tests: a paced pass may free at once.
  static void reset() noexcept { resume_.store(0, std::memory_order_relaxed); }

 private:
  static int64_t ticks(std::chrono::nanoseconds d) noexcept {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(d).count();
  }

  static inline std::atomic<int64_t> resume_{0};
};

} // namespace troupe::detail
