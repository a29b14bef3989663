#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/messages/storage.hpp"

namespace troupe {

/// Appends `payload` (a JSON object) to the event log's `topic` in the runtime's database;
/// `co_await` yields the receipt `{event_id, at_ms}` once the transaction holding it has
/// committed (concurrent appends share transactions). Errors: `invalid_payload` (not an
/// object), `invalid_topic`, `storage_*`.
[[nodiscard]] task<caf::expected<event_receipt>> event_append(context& cx, std::string topic,
                                                nlohmann::json payload);

/// Appends every payload to `topic` keeping up to `window` appends in flight; yields the
/// receipts in order, or the first error (appends already acknowledged stay).
task<caf::expected<std::vector<event_receipt>>>
event_append_all(context& cx, std::string topic, std::vector<nlohmann::json> payloads,
                 size_t window = 256);

/// Reads up to `limit` events of `topic` whose cursor (event id) is after `after_cursor`,
/// oldest first.
task<caf::expected<std::vector<event_record>>>
event_read(context& cx, std::string topic, int64_t after_cursor = 0, int64_t limit = 100);

/// Subscribes `subscriber` to `topic`: it receives `(st_event, event_record)` for every
/// event after `from_cursor` -- the backlog first, then each commit -- in order and once. A
/// subscriber that restarts subscribes again from the last cursor it handled and misses
/// nothing; subscribing again replaces the earlier subscription. Yields true.
[[nodiscard]] task<caf::expected<bool>> event_subscribe(context& cx, std::string topic, int64_t from_cursor,
                                          caf::actor subscriber);

/// Ends a subscription; yields whether there was one.
[[nodiscard]] task<caf::expected<bool>> event_unsubscribe(context& cx, std::string topic,
                                            caf::actor subscriber);

/// Yields the storage actor's counters (transactions, rows, largest group, ...).
[[nodiscard]] task<caf::expected<storage_metrics>> storage_metrics_of(context& cx);

} // namespace troupe
