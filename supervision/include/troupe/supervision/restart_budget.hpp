#pragma once

#include <cstdint>
#include <string>

#include "troupe/supervision/restart_window.hpp"

namespace troupe {

/// What the budgets decide about a child that ended and would be restarted.
enum class budget_verdict : uint8_t {
  restart,      ///< within both budgets: restart it (after its backoff)
  circuit_open, ///< its own budget is spent (or its half-open try failed): open its circuit
  suppressed,   ///< its own budget is spent and it has no circuit: leave it down
  escalate,     ///< the supervisor's intensity is spent: the supervisor fails
};

/// The limits of one child's own budget (from its spec).
struct child_budget_limits {
  int64_t max_restarts = 0; ///< 0: no budget of its own
  int64_t window_ms = 0;
  int64_t circuit_open_ms = 0; ///< 0: no circuit (suppressed instead)
};

/// One child's budget state: its recent restarts and whether it is on its half-open try.
struct child_budget {
  restart_window window;
  /// When the half-open try (after an open circuit) started; -1: not half open.
  int64_t half_open_since = -1;
};

/// The outcome of `restart_budget::on_end`.
struct budget_decision {
  budget_verdict verdict = budget_verdict::restart;
  /// The child's restarts within its window, this one included (the backoff's exponent).
  size_t in_window = 0;
  /// The supervisor's restarts within its period, this one included (0 when the child's
  /// own budget decided first).
  size_t restarts = 0;
  /// Why, for the child's wait reason or the escalation (empty for `restart`).
  std::string why;
};

/// The two restart budgets, in their defined order: first the child's own (`max_restarts`
/// within `window_ms`; a failed half-open try reopens the circuit at once), then the
/// supervisor's intensity (OTP: more than `intensity` restarts within `period_ms`). A child
/// its own budget stops does not count toward the intensity. A plain class without an
/// actor: the supervisor wires it to its children's ends.
class restart_budget {
 public:
  restart_budget(int64_t intensity, int64_t period_ms) noexcept
      : intensity_(intensity), period_ms_(period_ms) {}

  /// Records the end (at `now`, milliseconds) of a child that would be restarted and
  /// returns the verdict.
  budget_decision on_end(child_budget& c, const child_budget_limits& lim, int64_t now) {
    budget_decision d;
    d.in_window = c.window.record(now, lim.window_ms);
    // "Within" the window includes its edge, as for the restarts themselves.
    bool reopen = c.half_open_since >= 0 && now - c.half_open_since <= lim.window_ms;
    c.half_open_since = -1;
    if (reopen ||
        (lim.max_restarts > 0 && static_cast<int64_t>(d.in_window) > lim.max_restarts)) {
      d.why = reopen ? std::string{"the half-open try failed"}
                     : "restart budget spent: " + std::to_string(d.in_window) +
                           " restarts within " + std::to_string(lim.window_ms) + " ms";
      d.verdict = lim.circuit_open_ms > 0 ? budget_verdict::circuit_open
                                          : budget_verdict::suppressed;
      return d;
    }
    d.restarts = intensity_window_.record(now, period_ms_);
    if (static_cast<int64_t>(d.restarts) > intensity_) {
      d.verdict = budget_verdict::escalate;
      d.why = std::to_string(d.restarts) + " restarts within " + std::to_string(period_ms_) +
              " ms (intensity " + std::to_string(intensity_) + ")";
    }
    return d;
  }

  /// Returns the supervisor's restarts within its period as of the last record.
  [[nodiscard]] size_t restarts() const noexcept { return intensity_window_.size(); }

 private:
  int64_t intensity_;
  int64_t period_ms_;
  restart_window intensity_window_;
};

} // namespace troupe
