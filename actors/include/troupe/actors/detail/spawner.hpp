#pragma once

// Internal: the spawner of a cluster node (runs registered bodies for other nodes). The
// runtime spawns it next to the directory and registers it under `spawner_name(node)`.

#include <caf/actor_system.hpp>

#include "troupe/actors/detail/task_env.hpp"
#include "troupe/actors/spawn_options.hpp"
#include "troupe/messages/cluster.hpp"
#include "troupe/messages/remote.hpp"

namespace troupe::detail {

/// Spawns the spawner of the runtime whose task environment is `env` (its bodies and node
/// name are read from there); `dir` is the node's directory (membership events: children
/// started for a node that goes down or leaves are cancelled).
spawner_actor spawn_spawner(caf::actor_system& sys, task_env* env, directory_actor dir);

} // namespace troupe::detail
