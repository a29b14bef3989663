#pragma once

// Whole-application simulation: a runtime on the virtual clock whose deterministic scheduler
// picks the next runnable actor from a seeded generator. The same seed replays the same
// interleaving exactly; another seed explores another. Fault points switch on by seed and
// probability. An hour of backoff passes in milliseconds.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/runtime/runtime.hpp"

namespace troupe {

/// Which faults a simulation injects, each a probability in [0, 1] per occasion.
struct fault_plan {
  /// A job attempt fails with `injected_fault` before its body runs.
  double job_attempt = 0;
  /// A supervised child (`task_child`) exits environmentally (`injected_fault`) shortly
  /// after each start; its supervisor sees a failure.
  double service_exit = 0;
  /// A group commit of the storage actor fails: nothing of it is written and each writer
  /// gets `storage_failed`.
  double storage_write = 0;
};

/// One event of a simulation's trace: virtual time, what happened, to what.
struct trace_entry {
  /// Virtual time, in microseconds since the simulation started.
  int64_t at_us = 0;
  /// "run" (the scheduler ran an actor: subject = its name and id), "job.submitted",
  /// "job.attempt", "job.attempt_failed", "job.backoff", "job.succeeded", "job.failed",
  /// "job.refused", "fault", "mark" (`simulation::mark`).
  std::string kind;
  std::string subject;
  std::string detail;
  friend bool operator==(const trace_entry&, const trace_entry&) = default;
};

/// A runtime under simulation: `troupe::simulation sim{seed}` (or with a builder for lanes,
/// resources, supervisors' storage...), then `sim->submit(...)`, `sim.run_for(1h)`,
/// `sim.trace()`. Virtual time is forced on.
class simulation {
 public:
  explicit simulation(uint64_t seed, runtime::builder b = runtime::builder{});
  ~simulation();
  simulation(const simulation&) = delete;
  simulation& operator=(const simulation&) = delete;

  /// Returns whether the runtime was built; `error()` says why not.
  [[nodiscard]] bool ok() const noexcept { return rt_.has_value(); }
  [[nodiscard]] const caf::error& error() const noexcept { return err_; }

  /// Returns the simulated runtime (requires `ok()`).
  [[nodiscard]] runtime& rt() { return *rt_; }
  runtime* operator->() { return &*rt_; }

  [[nodiscard]] uint64_t seed() const noexcept;

  /// Sets the fault plan (from now on).
  void faults(fault_plan p);

  /// Whether the trace records every scheduler step ("run" entries; on by default).
  void trace_steps(bool on);

  /// Runs the application for `d` of virtual time; returns the timers fired.
  size_t run_for(clock::duration d);

  /// Appends a user event to the trace (kind "mark").
  void mark(std::string subject, std::string detail = {});

  /// Returns the trace so far.
  [[nodiscard]] std::vector<trace_entry> trace() const;
  /// Returns the trace without "run" steps: the application's own events.
  [[nodiscard]] std::vector<trace_entry> events() const;
  /// Renders entries one per line: `+12.345ms kind subject detail`.
  [[nodiscard]] static std::string render(const std::vector<trace_entry>& xs);

 private:
  struct hooks;
  std::unique_ptr<hooks> hooks_; // before rt_: destroyed after the runtime stops
  std::optional<runtime> rt_;
  caf::error err_;
};

} // namespace troupe
