#pragma once

// Internal: spawning troupe's messaging and shared-state actors. The runtime spawns the
// registry and the deadlock detector; the registry spawns the rest on demand.

#include <chrono>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "troupe/actors/detail/task_env.hpp"
#include "troupe/actors/spawn_options.hpp"
#include "troupe/messages/messaging.hpp"

namespace troupe::detail {

/// Spawns the registry of named primitives; `clock` times the sync primitives' timeouts.
/// `services` answers the directory's `dir_find` (see messages/directory.hpp); the registry
/// owns it (stops it when it stops). Empty: a lookup answers `storage_unavailable`.
caf::actor spawn_registry(caf::actor_system& sys, troupe::clock* clock,
                          caf::actor services = {});

/// Spawns the deadlock detector: a stuck census that stays unchanged for `period` on the
/// runtime clock makes the registry fail every unbounded channel wait with `deadlock`.
caf::actor spawn_deadlock_detector(caf::actor_system& sys, task_env* env, clock::duration period);

} // namespace troupe::detail
