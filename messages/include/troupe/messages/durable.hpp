#pragma once

// The protocols of durable channels (the channel hub and the storage actor) and of the
// durable rate limiter (the storage actor).

#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>
#include <nlohmann/json.hpp>

#include "troupe/messages/json.hpp"

namespace troupe {

// -- durable channels -----------------------------------------------------------------------

/// When and by whom an event was recorded, signed: `sig` is the hex HMAC-SHA-256, under a
/// key kept in the database, of (at_ms, event_id, name_resolved, scope, scope_id,
/// emitted_by). Changing any of them (or the event id) makes `channel_verify` answer false.
struct emitted_at {
  int64_t at_ms = 0;
  std::string scope;
  std::string scope_id;
  std::string emitted_by;
  std::string sig;
  friend bool operator==(const emitted_at&, const emitted_at&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, emitted_at& x) {
  return f(caf::meta::type_name("troupe.emitted_at"), x.at_ms, x.scope, x.scope_id, x.emitted_by,
           x.sig);
}

/// What a durable-channel append answers. `duplicate` says the `(name_resolved, id)` pair was
/// appended before (by this process or an earlier one): the receipt is the original one.
struct channel_receipt {
  int64_t event_id = 0;
  std::string name_resolved;
  bool duplicate = false;
  troupe::emitted_at emitted_at;
  friend bool operator==(const channel_receipt&, const channel_receipt&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, channel_receipt& x) {
  return f(caf::meta::type_name("troupe.channel_receipt"), x.event_id, x.name_resolved, x.duplicate,
           x.emitted_at);
}

/// One event of a durable channel: its receipt (`duplicate` false), the caller's id (empty
/// when none was given) and the payload as JSON text.
struct channel_event {
  channel_receipt receipt;
  std::string id;
  std::string payload;
  friend bool operator==(const channel_event&, const channel_event&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, channel_event& x) {
  return f(caf::meta::type_name("troupe.channel_event"), x.receipt, x.id, x.payload);
}

/// An append as the hub and the storage actor see it: the name already resolved.
struct channel_write {
  std::string name_resolved; ///< `<scope>:<scope_id>:<name>`
  std::string scope;         ///< "session", "pipeline" or "tenant"
  std::string scope_id;
  std::string id; ///< the caller's idempotency id; empty: none (never a duplicate)
  std::string emitted_by;
  std::string payload; ///< a JSON object as text
  friend bool operator==(const channel_write&, const channel_write&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, channel_write& x) {
  return f(caf::meta::type_name("troupe.channel_write"), x.name_resolved, x.scope, x.scope_id, x.id,
           x.emitted_by, x.payload);
}

/// A trigger binding, checked: matches appends in one scope id whose name equals `pattern`,
/// or starts with it when `prefix` (a selector ending in `*`).
struct channel_binding {
  std::string selector; ///< as the user wrote it, for audit and errors
  std::string scope;
  std::string scope_id;
  std::string pattern;
  bool prefix = false;
  caf::actor handler; ///< receives `(ch_trigger, channel_match)`
  /// Batch aggregation: 0 = none (every match fires alone).
  int64_t count = 0;
  /// Window in ms from a partition's first buffered event; 0 = none.
  int64_t window_ms = 0;
  /// Payload field naming the partition; empty: one partition.
  std::string key;
  /// At window expiry: fire what is buffered (true) or discard it.
  bool fire_partial = true;
  /// Events a partition holds at most; beyond, the oldest is dropped with a warning.
  int64_t max_buffer = 1024;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, channel_binding& x) {
  return f(caf::meta::type_name("troupe.channel_binding"), x.selector, x.scope, x.scope_id,
           x.pattern, x.prefix, x.handler, x.count, x.window_ms, x.key, x.fire_partial,
           x.max_buffer);
}

/// What a trigger handler receives: the events of one match (one, or a batch), in order, and
/// the match receipt (id, binding, partition key, why it fired, when).
struct channel_match {
  int64_t match_id = 0;
  uint64_t binding = 0;
  std::string key;    ///< the partition (batch bindings with a key), else empty
  std::string reason; ///< "append", "count", "window" or "flush"
  int64_t at_ms = 0;
  std::vector<channel_event> events;
  friend bool operator==(const channel_match&, const channel_match&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, channel_match& x) {
  return f(caf::meta::type_name("troupe.channel_match"), x.match_id, x.binding, x.key, x.reason,
           x.at_ms, x.events);
}

/// The channel hub's counters.
struct channel_metrics {
  uint64_t appends = 0;         ///< receipts answered (duplicates included)
  uint64_t duplicates = 0;      ///< of which duplicates
  uint64_t matches = 0;         ///< trigger dispatches
  uint64_t dropped = 0;         ///< events dropped from full batch buffers
  uint64_t discarded = 0;       ///< events discarded at window expiry (`discard`)
  uint64_t bindings = 0;        ///< bindings in place
  uint64_t buffered = 0;        ///< events waiting in batch buffers
  uint64_t audit_failures = 0;  ///< audit or warning rows the storage refused
  uint64_t session_evicted = 0; ///< session events dropped past a channel's capacity
  friend bool operator==(const channel_metrics&, const channel_metrics&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, channel_metrics& x) {
  return f(caf::meta::type_name("troupe.channel_metrics"), x.appends, x.duplicates, x.matches,
           x.dropped, x.discarded, x.bindings, x.buffered, x.audit_failures, x.session_evicted);
}

/// JSON forms (`nlohmann::json j = receipt;`): `{event_id, name_resolved, duplicate,
/// emitted_at: {at_ms, scope, scope_id, emitted_by, sig}}`; `from_json` throws
/// `nlohmann::json::exception` on a missing or mistyped field.
void to_json(nlohmann::json& j, const channel_receipt& x);
void from_json(const nlohmann::json& j, channel_receipt& x);
/// `{match_id, binding, key, reason, at_ms, event_ids: [...]}` (the audit form).
void to_json(nlohmann::json& j, const channel_match& x);

/// The event-log topic that receives one receipt per append and one per trigger match.
constexpr const char* channel_audit_topic = "lifecycle.channel.audit";
/// The event-log topic that receives warnings (a batch buffer dropping its oldest event).
constexpr const char* channel_warning_topic = "lifecycle.channel.warning";

// -- durable rate limiter -------------------------------------------------------------------

/// One bucket of a reservation: `units` out of `limit` per sliding `window_ms`.
struct rate_bucket {
  std::string key;
  int64_t limit = 0;
  int64_t units = 1;
  int64_t window_ms = 60000;
  friend bool operator==(const rate_bucket&, const rate_bucket&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rate_bucket& x) {
  return f(caf::meta::type_name("troupe.rate_bucket"), x.key, x.limit, x.units, x.window_ms);
}

/// Bounds of a rate-limit request (beyond them a request is `invalid_rate_limit`): a window
/// or timeout of at most 366 days; limit and units of at most 10^12.
constexpr int64_t max_rate_window_ms = int64_t{366} * 24 * 3600 * 1000;
constexpr int64_t max_rate_units = 1'000'000'000'000;

/// Checks a rate-limit request: at least one bucket; keys of 1..200 bytes, each once;
/// limit, units and window_ms at least 1 (`invalid_rate_limit` naming the field).
[[nodiscard]] caf::error check_buckets(const std::vector<rate_bucket>& buckets);

/// The storage actor's answer to one reservation attempt: reserved (all buckets), or not
/// (none) and how long until the fullest bucket frees enough.
struct rate_attempt {
  bool ok = false;
  int64_t retry_after_ms = 0;
  friend bool operator==(const rate_attempt&, const rate_attempt&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rate_attempt& x) {
  return f(caf::meta::type_name("troupe.rate_attempt"), x.ok, x.retry_after_ms);
}

} // namespace troupe


namespace troupe::atoms {

/// Storage: `(st_chan_append, channel_write)` -> channel_receipt (signed; a known
/// `(name_resolved, id)` answers the original receipt, `duplicate` true), after commit.
using st_chan_append_atom = caf::atom_constant<caf::atom("st_capp")>;
/// Storage: `(st_chan_read, name_resolved, after, limit)` -> vector<channel_event>.
using st_chan_read_atom = caf::atom_constant<caf::atom("st_cread")>;
/// Storage: `(st_chan_verify, channel_receipt)` -> bool: whether the receipt's signature
/// holds under the database's key (the key never leaves the node that owns the file: a
/// hub in front of another node's storage asks it).
using st_chan_verify_atom = caf::atom_constant<caf::atom("st_cverify")>;
/// Storage: `(st_rate_acquire, vector<rate_bucket>, int64 max_wait_ms)` -> rate_attempt, in
/// one transaction; another process's lock is waited for `max_wait_ms` at most (bounded by
/// the storage's busy timeout), then `storage_busy`.
using st_rate_acquire_atom = caf::atom_constant<caf::atom("st_rate")>;

/// Hub: `(ch_append, channel_write)` -> channel_receipt.
using ch_append_atom = caf::atom_constant<caf::atom("ch_append")>;
/// Hub: `(ch_events, name_resolved, scope, after, limit)` -> vector<channel_event>.
using ch_events_atom = caf::atom_constant<caf::atom("ch_events")>;
/// Hub: `(ch_verify, channel_receipt)` -> bool.
using ch_verify_atom = caf::atom_constant<caf::atom("ch_verify")>;
/// Hub: `(ch_bind, channel_binding)` -> uint64 binding id; `(ch_unbind, id)` -> bool.
using ch_bind_atom = caf::atom_constant<caf::atom("ch_bind")>;
using ch_unbind_atom = caf::atom_constant<caf::atom("ch_unbind")>;
/// Hub: `(ch_flush)` -> uint64 matches fired: waits for appends in flight, then every open
/// batch window expires now (its expire action applies).
using ch_flush_atom = caf::atom_constant<caf::atom("ch_flush")>;
/// Hub: `(ch_metrics)` -> channel_metrics.
using ch_metrics_atom = caf::atom_constant<caf::atom("ch_metrics")>;
/// Hub, from the runtime: `(ch_storage, actor)`: the storage was opened again; write there.
using ch_storage_atom = caf::atom_constant<caf::atom("ch_storage")>;
/// Hub, internal: a batch window's timer `(ch_window, binding, key, generation)`.
using ch_window_atom = caf::atom_constant<caf::atom("ch_window")>;
/// To a trigger handler: `(ch_trigger, channel_match)`.
using ch_trigger_atom = caf::atom_constant<caf::atom("ch_trigger")>;

} // namespace troupe::atoms
