#pragma once

// The vocabulary of lanes and jobs: a lane's declaration and metrics, a job's retry policy
// and its backoff (a pure function of the policy and the failure index: a replay waits
// exactly the same).

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>

#include "troupe/messages/clock.hpp"

namespace troupe {

/// How many attempts a lane runs at once.
enum class lane_kind : uint8_t {
  serial,     ///< one at a time
  concurrent, ///< up to the lane's width
  unbounded,  ///< every attempt at once (never queues)
};

/// Returns "serial", "concurrent" or "unbounded".
std::string_view to_string(lane_kind x) noexcept;

/// One lane of the catalog declared at boot.
struct lane_decl {
  std::string name;
  lane_kind kind = lane_kind::unbounded;
  /// Attempts at once: 1 for serial, n for concurrent(n), 0 (no bound) for unbounded.
  int64_t width = 0;
  /// The lane a job lands on when it names none (exactly one; always unbounded).
  bool is_default = false;

  /// A lane running one attempt at a time.
  static lane_decl serial(std::string name) { return {std::move(name), lane_kind::serial, 1, false}; }
  /// A lane running up to `n` attempts at once (`n` >= 1).
  static lane_decl concurrent(std::string name, int64_t n) {
    return {std::move(name), lane_kind::concurrent, n, false};
  }
  /// A lane that never queues.
  static lane_decl unbounded(std::string name) {
    return {std::move(name), lane_kind::unbounded, 0, false};
  }
  /// The default lane (unbounded): where a job naming no lane runs.
  static lane_decl default_lane(std::string name = "default") {
    return {std::move(name), lane_kind::unbounded, 0, true};
  }
  friend bool operator==(const lane_decl&, const lane_decl&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, lane_decl& x) {
  return f(caf::meta::type_name("troupe.lane_decl"), x.name, x.kind, x.width, x.is_default);
}

/// Checks a lane catalog: a zero (or negative) width, a duplicate or empty name, zero or two
/// defaults, a bounded default all answer `invalid_lane` naming the lane (`lanes[2]` plus
/// its name in the detail). An empty catalog is valid: the runtime adds the default lane
/// `default`.
[[nodiscard]] caf::error validate_lanes(const std::vector<lane_decl>& lanes);

/// The counters of one lane (`rt.lane_metrics(name)`, `lane_metrics_of(cx, name)`).
struct lane_metrics {
  std::string name;
  lane_kind kind = lane_kind::unbounded;
  int64_t width = 0;
  /// Attempts waiting for admission now (FIFO).
  int64_t queue_depth = 0;
  /// The most that ever waited at once.
  int64_t max_queue_depth = 0;
  /// Attempts running now.
  int64_t running = 0;
  /// Attempts admitted so far.
  uint64_t admitted = 0;
  /// Attempts that left the queue without running (cancelled, or refused at stop).
  uint64_t withdrawn = 0;
  /// Summed wait between asking and admission, in milliseconds (mean = total / admitted).
  double total_wait_ms = 0;
  friend bool operator==(const lane_metrics&, const lane_metrics&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, lane_metrics& x) {
  return f(caf::meta::type_name("troupe.lane_metrics"), x.name, x.kind, x.width, x.queue_depth,
           x.max_queue_depth, x.running, x.admitted, x.withdrawn, x.total_wait_ms);
}

/// How a job retries: `retries` more attempts after the first, each bounded by `timeout`,
/// separated by a backoff of `backoff_base` doubled per failure, capped at `backoff_cap`,
/// plus a jitter computed from the attempt index alone (see `backoff_delay`).
struct job_policy {
  /// Attempts after the first (0: one attempt).
  uint32_t retries = 0;
  /// Bound of each attempt; `infinite_timeout` (the default): none.
  clock::duration timeout = infinite_timeout;
  clock::duration backoff_base = std::chrono::milliseconds{10};
  clock::duration backoff_cap = std::chrono::seconds{5};

  static constexpr clock::duration infinite_timeout = clock::duration::max();
  friend bool operator==(const job_policy&, const job_policy&) = default;
};

/// Checks a policy at submission: a cap of zero or below the base, a negative base, a
/// timeout of zero or below answer `undeclarable_pacing` naming the field.
[[nodiscard]] caf::error validate(const job_policy& p);

/// Returns the jitter fraction of failure `index` in thousandths (0..99): a fixed hash of
/// the index, no random source.
[[nodiscard]] uint32_t backoff_jitter_permille(uint32_t index) noexcept;

/// Returns the wait after failure `index` (0 = after the first attempt): `base * 2^index`
/// capped at `cap` (saturating), plus `backoff_jitter_permille(index)` thousandths of it.
[[nodiscard]] clock::duration backoff_delay(const job_policy& p, uint32_t index) noexcept;

} // namespace troupe
