#pragma once

#include <memory>
#include <optional>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "troupe/messages/clock.hpp"
#include "troupe/messages/messaging.hpp"

namespace troupe::detail {

/// The settings of one channel or mailbox.
struct queue_config {
  std::string name;
  int64_t capacity = 1;
  /// The value type (`typeid(boxed<T>).hash_code()`); 0 accepts any.
  size_t type_hash = 0;
  std::string type_name;
  /// A mailbox answers `mailbox_closed`, a channel `channel_closed`.
  bool mailbox = false;
};

caf::actor spawn_queue(caf::actor_system& sys, queue_config cfg);

class lock_graph;

struct sync_config {
  sync_kind kind = sync_kind::mutex;
  std::string key;
  int64_t capacity = 1;
  troupe::clock* clock = nullptr;
  /// Stop watching an actor once it holds and waits for nothing (a lane: each job's task
  /// asks once per attempt, so keeping the monitor only buys a down message per job). A
  /// mutex or semaphore keeps watching: its holders come back, and a monitor per acquire
  /// would cost more than one down message per task.
  bool forget_idle = false;
  /// The runtime's wait-for graph of locks (null: not part of deadlock detection, a lane).
  std::shared_ptr<lock_graph> graph;
};

caf::actor spawn_sync(caf::actor_system& sys, sync_config cfg);

/// Gives back lane `lane`'s grant `id` of a job's ticket on the calling thread (the lane's
/// next tickets are admitted here too); false: nothing done, send `sy_release` instead.
bool release_lane_grant(const caf::actor& lane, uint64_t id);

caf::actor spawn_shared(caf::actor_system& sys, primitive_kind kind, std::string name,
                        std::optional<nlohmann::json> initial = std::nullopt);

/// Spawns a worker pool (its workers are task actors of the runtime that owns `sys`).
caf::actor spawn_pool(caf::actor_system& sys, pool_spec spec, std::string id);

} // namespace troupe::detail
