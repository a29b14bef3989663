#pragma once

// Triggers into pools: a durable-channel binding whose matched events become jobs of a named
// pool. See docs/pools.md#triggers-into-pools.

#include <functional>
#include <string>

#include <caf/expected.hpp>
#include <nlohmann/json.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/actors/task.hpp"
#include "troupe/messages/durable.hpp"

namespace troupe {

/// Where a trigger binding sends its matched events: one job per event in the pool `pool`
/// (a session pool of this runtime, looked up by name when an event comes).
struct spawn_to_pool {
  /// The pool's name.
  std::string pool;
  /// Makes the job of one event: its body, run by a worker of the pool.
  std::function<task<void>(context&, const channel_event&)> task_factory;
  /// A JSON path into the event's payload (`"priority"`, `"a.b"`, `"$.a.b"` or `"/a/b"`) whose
  /// value is the job's priority: an integer, or a string holding one ("7" is 7); missing or
  /// anything else is priority 0. Empty: priority 0.
  std::string priority_from;
  /// A JSON path whose value is the job's key (a string, or a number as text); missing: no key.
  std::string key_from;
  /// The event-log topic where an event goes when the pool does not exist (or refuses the
  /// submit with an error): `{pool, error, event: {name, event_id, id, payload}}`.
  std::string dead_letter_topic = "pool.dead_letter";
};

/// Returns the value at `path` in `payload` (see `spawn_to_pool::priority_from`), or null.
[[nodiscard]] const nlohmann::json* json_at(const nlohmann::json& payload, const std::string& path);

/// Returns the priority a `priority_from` value means (an integer, or a string holding one);
/// 0 otherwise.
[[nodiscard]] int64_t priority_from_json(const nlohmann::json* value) noexcept;

/// Binds appends matching `binding` (as `durable_bind`) to jobs of a pool: each event of a
/// match becomes one submit, in order, with the priority and key read from its payload. The
/// pool's strategy, cap and backpressure apply: a `drop_newest` rejection is audited by the
/// pool and is not an error of the dispatch. Yields the binding id. Errors: `invalid_binding`
/// naming the field (`pool`, `task_factory`, and those of the binding).
[[nodiscard]] task<caf::expected<uint64_t>> durable_bind_to_pool(context& cx, nlohmann::json binding,
                                                                 spawn_to_pool target);

} // namespace troupe
