#pragma once

#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "troupe/messages/clock.hpp"
#include "troupe/messages/durable.hpp"

namespace troupe {

/// How a channel hub runs.
struct channel_hub_config {
  /// The storage actor that holds durable (pipeline, tenant) channels and the audit topic.
  caf::actor storage;
  /// The key that signs receipts (from `spawn_storage`). Empty when the storage is another
  /// node's (`spawn_storage_link`): session receipts are then signed with a key of the hub's
  /// own, and durable receipts are verified by the storage (`st_chan_verify`).
  std::string signing_key;
  /// The runtime clock: batch windows; `at_ms` of session events when virtual.
  troupe::clock* clock = nullptr;
  /// The events one session channel keeps; beyond, the oldest go (and their ids with them).
  size_t session_capacity = 10000;
};

/// Spawns the actor in front of durable channels: it keeps session channels in memory,
/// passes durable appends to the storage actor, verifies receipts, and dispatches every
/// committed append to the trigger bindings that match it (with batch aggregation). Its
/// protocol is `ch_*` in `troupe/messages/durable.hpp`.
caf::actor spawn_channel_hub(caf::actor_system& sys, channel_hub_config cfg);

/// Checks a binding's fields (`invalid_binding` naming the field): a handler, count >= 0,
/// window_ms >= 0, max_buffer >= 1.
[[nodiscard]] caf::error check_binding(const channel_binding& b);

} // namespace troupe
