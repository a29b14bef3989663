#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include <caf/actor.hpp>

#include "troupe/messages/clock.hpp"

namespace troupe {

/// Runs blocking or CPU-heavy jobs off the scheduler threads.
class blocking_executor {
 public:
  virtual ~blocking_executor() = default;
  /// Queues `job`; it runs on a thread that is not a CAF scheduler thread.
  virtual void submit(std::function<void()> job) = 0;
};

/// What every task of one runtime shares: its clock, its blocking executor, and its
/// identity. Owned by the runtime, which outlives all of its tasks.
struct task_env {
  troupe::clock* clock = nullptr;
  blocking_executor* blocking = nullptr;
  /// Adopts a task that has no task owner (a root, or a detached child) so the runtime
  /// can stop it; may be empty.
  std::function<void(const caf::actor&)> adopt;
  /// Numbers root tasks: "1", "2", ...
  std::atomic<uint64_t> next_root{0};
};

/// Options of a spawn.
struct spawn_options {
  /// A name for logs and introspection; "task" when empty.
  std::string name;
  /// The group this task joins (siblings of one parallel call share one); when empty,
  /// the task is a group of its own and its group id is its task id.
  std::string group;
  /// When true, the task is owned by the runtime instead of the spawning task: it is
  /// neither joined nor cancelled when the spawner ends. Spell it only when you mean it.
  bool detached = false;
};

} // namespace troupe
