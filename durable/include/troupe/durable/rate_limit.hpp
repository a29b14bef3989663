#pragma once

// The durable rate limiter: sliding-window reservations kept in SQLite, so every process
// sharing a state file shares the quota.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/messages/durable.hpp"

namespace troupe {

/// A reservation across buckets: all of them or none.
struct rate_limit_request {
  /// The SQLite file holding the reservations; empty: the runtime's database.
  std::optional<std::string> state_path;
  std::vector<rate_bucket> buckets;
  /// How long to wait for room (runtime clock); 0: answer at once.
  int64_t timeout_ms = 0;
};

/// What `rate_limit_acquire` yields: reserved (`ok`), or not within the timeout.
struct rate_limit_result {
  bool ok = false;
  bool timed_out = false;
  int64_t waited_ms = 0;
};

/// Reserves `units` (default 1) in every bucket's sliding window of `window_ms` (default
/// 60 s), all in one transaction or none. Without room it waits (outside any transaction,
/// on the runtime clock) until the fullest bucket frees enough or the timeout passes, then
/// yields `{ok: false, timed_out: true, waited_ms}`. A reservation larger than its bucket's
/// limit is admitted once the bucket is empty, charged as the whole limit for one window.
/// A database another process holds past the busy timeout counts as no room (retried until
/// the timeout). Errors: `invalid_rate_limit` naming the field (no buckets, duplicate keys,
/// limit, units or window below 1 or above the bounds in `durable.hpp`, a timeout below 0
/// or above 366 days), `storage_*`.
[[nodiscard]] task<caf::expected<rate_limit_result>> rate_limit_acquire(context& cx, rate_limit_request req);

/// The same from JSON: `{"state_path"?: "...", "buckets": [{"key", "limit", "units"?,
/// "window_ms"?}], "timeout_ms": N}`.
[[nodiscard]] task<caf::expected<rate_limit_result>> rate_limit_acquire(context& cx, nlohmann::json spec);

/// Parses the JSON form (`invalid_rate_limit` naming the field).
[[nodiscard]] caf::expected<rate_limit_request> parse_rate_limit(const nlohmann::json& spec);

} // namespace troupe
