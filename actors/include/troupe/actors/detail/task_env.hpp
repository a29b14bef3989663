#pragma once

#include <any>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>
#include <functional>
#include <mutex>
#include <vector>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/expected.hpp>

#include "troupe/messages/clock.hpp"

// Internal: what every task of one runtime shares (not installed as API: its layout changes
// without notice). The public face of it is `runtime` and `context`.

namespace troupe::detail {

/// Runs blocking or CPU-heavy jobs off the scheduler threads.
class blocking_executor {
 public:
  virtual ~blocking_executor() = default;
  /// Queues `job`; it runs on a thread that is not a CAF scheduler thread.
  virtual void submit(std::function<void()> job) = 0;
};

/// Counts what the live tasks of one runtime wait on, for the deadlock detector: when
/// every task whose body runs is parked on a channel operation without a bound (no
/// timeout, no deadline) or on other tasks, and that stays so for a check period, no task
/// can complete another's channel operation: the detector fails those waits with
/// `deadlock`.
///
/// A task's activation counts its changes on its own thread and applies their sum at its
/// end (census_batch): a ping-pong task is woken and parks again in every activation, a
/// sum of zero, so a hop costs no atomic step on a line every worker shares. While an
/// activation runs, the shared counts may lag; what tells the detector that tasks still
/// move is each thread's slot: `busy` from an activation's first change to its end, and
/// `activations` counting the activations that changed anything.
struct wait_census {
  wait_census() noexcept;
  wait_census(const wait_census&) = delete;
  wait_census& operator=(const wait_census&) = delete;
  /// Which count a change is about.
  enum field : unsigned { live, channel, tasks };
  /// Bodies started and not ended (from spawn: a child about to start counts).
  std::atomic<int64_t> live_count{0};
  /// channel | tasks << 32: one atomic add per wait, and a consistent view of both.
  std::atomic<uint64_t> waits{0};
  /// Set by any change after the detector cleared it: "something moved".
  std::atomic<bool> moved{false};
  std::atomic<bool> check_pending{false};
  /// Receives `(deadlock_atom, 0)` to start a check; empty: detection is off.
  caf::actor detector;
  /// Returns whether the counts say every live task is stuck.
  [[nodiscard]] static bool stuck(uint64_t w, int64_t live) noexcept {
    auto c = static_cast<int64_t>(w & 0xFFFFFFFFu);
    auto t = static_cast<int64_t>(w >> 32);
    return c > 0 && c + t >= live;
  }
  [[nodiscard]] bool stuck() const noexcept { return stuck(waits.load(), live_count.load()); }
  /// Records a change of `f` by `delta` (+1 or -1): in the running activation's batch when
  /// this thread runs one of this census's tasks, else at once (see apply).
  void change(field f, int64_t delta) noexcept;
  /// Adds the changes to the counts (`dwaits`: channel + tasks << 32, modulo 2^64) and
  /// asks the detector for a check when every live task is stuck.
  void apply(int64_t dlive, uint64_t dwaits) noexcept;

  /// One thread's signs of life for the detector (written by that thread only).
  struct alignas(64) slot {
    std::atomic<uint64_t> activations{0};
    std::atomic<bool> busy{false};
    std::atomic<uint64_t> owner{0}; // the thread's number (thread_number()); 0: free
  };
  static constexpr size_t max_slots = 64;
  /// This thread's slot, claimed at its first activation; null when all are taken (the
  /// thread's changes are then applied at once, as before batching).
  slot* slot_of_this_thread() noexcept;
  /// The activations counted so far over every slot, and whether one runs now.
  [[nodiscard]] std::pair<uint64_t, bool> activity() const noexcept;
  /// Distinguishes censuses (a thread's cached slot is for one of them).
  const uint64_t uid;

 private:
  slot slots_[max_slots];
  std::atomic<size_t> slots_used_{0};
};

/// The running activation's batch of census changes (one per thread; see wait_census).
struct census_batch {
  wait_census* census = nullptr; // null: no batch, changes go to the counts at once
  wait_census::slot* slot = nullptr;
  int64_t live = 0;
  uint64_t waits = 0;
  bool any = false; // a change was counted (its sum may be zero)
};

/// Opens a batch for an activation of one of `c`'s tasks and applies it at the end (the
/// previous batch, if any, is kept aside and restored).
class census_scope {
 public:
  explicit census_scope(wait_census& c) noexcept;
  census_scope(const census_scope&) = delete;
  census_scope& operator=(const census_scope&) = delete;
  ~census_scope();

 private:
  census_batch prev_;
};

/// Internal: what owns the tasks and supervisors that nothing else owns (the runtime), so
/// that its `stop()` reaches them. Ownership, not a service: services are found by asking
/// the registry (messages/directory.hpp).
class root_owner {
 public:
  virtual ~root_owner() = default;
  /// Adopts a task that has no task owner (a root, or a detached child).
  virtual void adopt(const caf::actor& task) = 0;
  /// Records a supervisor started from a task (`supervise(cx, spec)`) like one started by
  /// the runtime: `stop()` stops it, its events reach `supervisor.lifecycle`.
  virtual void adopt_supervisor(const caf::actor& sup, const std::string& name) = 0;
};

class lane_catalog;
class body_registry;

/// Internal: what a simulation listens to and decides (null outside a simulation): the
/// event trace and the fault points, both deterministic for one seed.
class sim_hooks {
 public:
  virtual ~sim_hooks() = default;
  /// Appends an event to the trace (stamped with the runtime clock by the hook).
  virtual void trace(std::string_view kind, std::string_view subject, std::string_view detail) = 0;
  /// Returns whether fault `point` fires for `subject` now.
  virtual bool fault(std::string_view point, std::string_view subject) = 0;
};

/// What every task of one runtime shares: its clock, its blocking executor, and its
/// identity. Owned by the runtime, which outlives all of its tasks.
struct task_env {
  troupe::clock* clock = nullptr;
  blocking_executor* blocking = nullptr;
  /// The owner of the runtime's roots and supervisors; may be null.
  root_owner* owner = nullptr;
  /// Numbers root tasks: "1", "2", ...
  std::atomic<uint64_t> next_root{0};
  /// The registry of named primitives (channels, mailboxes, shared values, locks); also
  /// the service directory (messages/directory.hpp): services are found by asking it.
  caf::actor registry;
  /// This runtime's session: the scope id of `session:` channels (random, per runtime).
  std::string session_id;
  /// The runtime's actor system (set once it exists: before any task runs).
  caf::actor_system* sys = nullptr;
  /// What the live tasks wait on (deadlock detection).
  wait_census census;
  /// Virtual time: roots spawned from outside an actor, started when the deterministic
  /// scheduler next runs out of work (so `rt.spawn` then `rt.cancel` cancels before the
  /// first run). Real time starts them at once.
  std::mutex deferred_mtx;
  std::vector<caf::actor> deferred_starts;
  /// The lane catalog declared at boot (frozen): where jobs run.
  std::shared_ptr<const lane_catalog> lanes;
  /// The one resources value declared at boot (`builder::resources`); null when none.
  std::shared_ptr<const std::any> resources;
  /// The simulation's trace and fault points; null outside a simulation.
  sim_hooks* sim = nullptr;
  /// The task bodies other nodes may run by name (`builder::body`); null when none.
  std::shared_ptr<const body_registry> bodies;
  /// This runtime's cluster node name (empty: not a cluster node).
  std::string node;
  /// The scheduler is troupe's: a scope's end-notice wake-up is scheduled on the worker the
  /// scope last ran on (see task_actor::wake_scope).
  bool notices_go_home = false;
};

/// The actor system configuration of a troupe runtime: it lets code that gets only the
/// actor system (a supervisor's start function) find the runtime's task environment.
struct env_system_config : caf::actor_system_config {
  task_env* env = nullptr;
};

/// Returns the task environment of the runtime that owns `sys`, or null for a plain CAF
/// actor system.
inline task_env* env_of(const caf::actor_system& sys) noexcept {
  auto* cfg = dynamic_cast<const env_system_config*>(&sys.config());
  return cfg != nullptr ? cfg->env : nullptr;
}

/// Records a trace event when the runtime runs under a simulation.
inline void trace_event(task_env& env, std::string_view kind, std::string_view subject,
                        std::string_view detail) {
  if (env.sim != nullptr) env.sim->trace(kind, subject, detail);
}

/// Returns whether the simulation switches fault `point` on for `subject` now.
inline bool fault_fires(task_env& env, std::string_view point, std::string_view subject) {
  return env.sim != nullptr && env.sim->fault(point, subject);
}

} // namespace troupe::detail
