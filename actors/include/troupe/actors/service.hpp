#pragma once

// Resident services: a long-lived value whose `attempt` is retried under a credit policy.
// Environmental faults (the world failed) back off and spend credit; application faults and
// uncaught exceptions deactivate at once; sustained health refills the credit.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/actors/context.hpp"

namespace troupe {

/// How one attempt of a service ended.
struct service_outcome {
  enum kind_t : uint8_t { completed, environmental, application };
  kind_t kind = completed;
  std::string reason;

  /// The service finished its work: it stops.
  static service_outcome done() { return {completed, {}}; }
  /// The world failed (a connection dropped...): back off and retry, spending one credit.
  static service_outcome environmental_fault(std::string why) {
    return {environmental, std::move(why)};
  }
  /// The service itself is wrong: never retried, it deactivates at once.
  static service_outcome application_fault(std::string why) {
    return {application, std::move(why)};
  }
};

/// The credit policy of a service.
struct service_policy {
  /// Environmental faults tolerated before the service deactivates.
  int credit = 3;
  /// An attempt that ran this long before failing refills the credit.
  std::chrono::milliseconds sustained_health{60'000};
  /// Backoff after the n-th consecutive environmental fault: base * 2^(n-1), capped.
  std::chrono::milliseconds backoff_base{100};
  std::chrono::milliseconds backoff_cap{10'000};
};

/// A service's status, as its subscriber sees each change.
struct service_status {
  enum state_t : uint8_t { starting, running, backing_off, stopped, inactive };
  state_t state = starting;
  /// Credit left (running, backing_off).
  int credit = 0;
  /// Why it is inactive (inactive).
  std::string cause;
  /// The faults so far, oldest first ("environmental: ...", "application: ...").
  std::vector<std::string> history;
};

/// Returns "starting", "running", ...
const char* to_string(service_status::state_t x) noexcept;

/// What an attempt sees: the task context plus the service's stop signal.
class service_context {
 public:
  explicit service_context(context& cx) noexcept : cx_(cx) {}
  /// Returns the underlying task context (spawn, request, ...).
  [[nodiscard]] context& task() noexcept { return cx_; }
  /// Sleeps `d` on the runtime clock; yields true when the shutdown woke it instead.
  troupe::task<bool> rest(clock::duration d);
  /// Awaits `t`; yields its value, or nothing when the shutdown came first.
  template <class T>
  troupe::task<std::optional<T>> until_stopping(troupe::task<T> t) {
    try {
      co_return co_await std::move(t);
    } catch (const task_cancelled&) {
      co_return std::nullopt;
    }
  }
  /// Returns whether the service is being stopped.
  [[nodiscard]] bool stopping() const noexcept { return cx_.is_cancelled(); }

 private:
  context& cx_;
};

/// The attempt of a service: called again for every retry.
using service_attempt = std::function<troupe::task<service_outcome>(service_context&)>;

/// Runs a resident service as a task body: `co_await` it, or spawn it with
/// `[=](context& cx) { return run_service(cx, attempt, policy, on_status); }`. It ends when
/// an attempt completes (stopped), when the service deactivates (inactive), or when the task
/// is cancelled (stopped: a graceful cancel wakes `rest` and `until_stopping`). Every status
/// change is handed to `on_status` (on the service's task).
troupe::task<service_status> run_service(context& cx, service_attempt attempt,
                                         service_policy policy,
                                         std::function<void(const service_status&)> on_status);

} // namespace troupe
