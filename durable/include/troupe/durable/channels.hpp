#pragma once

// Durable channels: named streams of JSON events in a scope (session, pipeline, tenant),
// appended with signed receipts and idempotency ids, read oldest first, and watched by
// trigger bindings (with batch aggregation). See the README, "Durable channels".

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/messages/durable.hpp"

namespace troupe {

/// The task-local key naming the active tenant (also used by tenant mailboxes).
inline constexpr std::string_view tenant_local = "tenant_id";
/// The task-local key naming the active pipeline (`pipeline:` channels need one).
inline constexpr std::string_view pipeline_local = "pipeline_id";
/// The tenant bare names resolve to when no tenant is active.
inline constexpr std::string_view default_tenant = "default";

/// Limits on names (resolved names stay within an event-log topic's 200 bytes).
inline constexpr size_t max_channel_name_bytes = 120;
inline constexpr size_t max_scope_id_bytes = 64;
inline constexpr size_t max_event_id_bytes = 256;

/// What a name resolves against: the runtime's session and the active tenant and pipeline
/// (empty: none active).
struct channel_scope {
  std::string session_id;
  std::string tenant_id;
  std::string pipeline_id;
};

/// A resolved channel name or selector.
struct channel_name {
  std::string scope; ///< "session", "pipeline" or "tenant"
  std::string scope_id;
  std::string name;    ///< the local name (a selector's prefix when `prefix`)
  bool prefix = false; ///< a selector ending in `*`
  /// Returns `<scope>:<scope_id>:<name>`.
  [[nodiscard]] std::string resolved() const;
};

/// Resolves `name`: a bare name is `tenant:<active tenant or "default">:<name>`; prefixes
/// `session:`, `pipeline:`, `tenant:` take the active context's id, and `<scope>:<id>:` names
/// one (refused with `scope_conflict` when a context of that scope is active with another
/// id; `session:<id>` must be this runtime's session). `org:` is reserved
/// (`scope_reserved`); `pipeline:` without an active pipeline is `no_scope_context`; empty
/// segments (`:` or `.`), unknown scopes, names over 120 bytes or ids over 64, control
/// characters and invalid UTF-8 are `invalid_channel_name`; an explicit pipeline id needs
/// an active pipeline too. With `selector`, the name may end in `*` (a prefix; `*` alone
/// matches every name of the scope).
[[nodiscard]] caf::expected<channel_name> resolve_channel_name(std::string_view name, const channel_scope& sc,
                                                 bool selector = false);

/// Returns the scope context of the calling task (its session, and its tenant and pipeline
/// task-locals: a `std::string` or a C string; another type is `invalid_scope`).
[[nodiscard]] caf::expected<channel_scope> channel_scope_of(context& cx);

/// Options of `durable_append`.
struct append_options {
  /// An idempotency id (at most 256 bytes): re-appending the same id to the same resolved
  /// name answers the original receipt with `duplicate` true, across restarts too.
  std::string id;
};

/// Appends `payload` (a JSON object) to the channel `name`; yields the signed receipt once
/// it is committed (durable scopes) or recorded (session). Errors: the resolution errors,
/// `invalid_payload`, `invalid_event_id`, `storage_*`.
task<caf::expected<channel_receipt>>
durable_append(context& cx, std::string name, nlohmann::json payload, append_options opts = {});

/// Options of `durable_events`.
struct events_options {
  int64_t after = 0; ///< the event id to read after (a cursor)
  int64_t limit = 100;
};

/// Reads up to `limit` events of channel `name` after the cursor, oldest first.
[[nodiscard]] task<caf::expected<std::vector<channel_event>>> durable_events(context& cx, std::string name,
                                                               events_options opts = {});

/// Yields whether `receipt` is genuine: false when any signed field (at_ms, event_id,
/// name_resolved, scope, scope_id, emitted_by) or the signature was altered.
[[nodiscard]] task<caf::expected<bool>> durable_verify(context& cx, channel_receipt receipt);

/// Binds `handler` to appends matching the binding: `{"channel": "channel:<selector>",
/// "batch": {"count": N, "window": ms, "key": "<payload field>", "expire_action":
/// "fire_partial"|"discard"}}` (`batch` optional; in it `count` is required). The handler
/// receives `(ch_trigger, channel_match)`. Yields the binding id. Errors: `invalid_binding`
/// naming the field, and the selector's resolution errors.
[[nodiscard]] task<caf::expected<uint64_t>> durable_bind(context& cx, nlohmann::json binding, caf::actor handler);

/// As above with a callable, run by an actor of its own (matches one at a time, in order).
/// A callable that throws ends its binding.
[[nodiscard]] task<caf::expected<uint64_t>> durable_bind(context& cx, nlohmann::json binding,
                                           std::function<void(const channel_match&)> handler);

/// Removes a binding (its buffered events are dropped); yields whether it existed.
[[nodiscard]] task<caf::expected<bool>> durable_unbind(context& cx, uint64_t binding);

/// For tests: waits for appends in flight, then expires every open batch window now (its
/// expire action applies); yields the number of matches fired.
[[nodiscard]] task<caf::expected<uint64_t>> durable_flush(context& cx);

/// Yields the hub's counters.
[[nodiscard]] task<caf::expected<channel_metrics>> durable_metrics_of(context& cx);

/// Parses a binding (without its handler): `invalid_binding` naming the field.
[[nodiscard]] caf::expected<channel_binding> parse_binding(const nlohmann::json& binding,
                                             const channel_scope& sc);

// -- former names (one release): "channel" now means the in-memory channel<T> only -----------

[[deprecated("renamed durable_append")]] inline auto
channel_append(context& cx, std::string name, nlohmann::json payload, append_options opts = {}) {
  return durable_append(cx, std::move(name), std::move(payload), std::move(opts));
}
[[deprecated("renamed durable_events")]] inline auto
channel_events(context& cx, std::string name, events_options opts = {}) {
  return durable_events(cx, std::move(name), opts);
}
[[deprecated("renamed durable_verify")]] inline auto channel_verify(context& cx,
                                                                    channel_receipt receipt) {
  return durable_verify(cx, std::move(receipt));
}
[[deprecated("renamed durable_bind")]] inline auto
channel_bind(context& cx, nlohmann::json binding, caf::actor handler) {
  return durable_bind(cx, std::move(binding), std::move(handler));
}
[[deprecated("renamed durable_bind")]] inline auto
channel_bind(context& cx, nlohmann::json binding,
             std::function<void(const channel_match&)> handler) {
  return durable_bind(cx, std::move(binding), std::move(handler));
}
[[deprecated("renamed durable_unbind")]] inline auto channel_unbind(context& cx,
                                                                    uint64_t binding) {
  return durable_unbind(cx, binding);
}
[[deprecated("renamed durable_flush")]] inline auto channel_flush(context& cx) {
  return durable_flush(cx);
}
[[deprecated("renamed durable_metrics_of")]] inline auto channel_metrics_of(context& cx) {
  return durable_metrics_of(cx);
}

} // namespace troupe
