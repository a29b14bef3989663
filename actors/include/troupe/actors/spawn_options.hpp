#pragma once

#include <string>

namespace troupe {

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
