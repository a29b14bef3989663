#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/make_message.hpp>

namespace troupe {

/// Every error troupe reports. The numeric values are stable (they travel inside
/// `caf::error`) and each has a stable public code such as `TROUPE-CFG-002`; the table
/// in docs/errors.md lists them. Zero is not used: CAF treats code 0 as "no error".
enum class errc : uint8_t {
  // configuration (TROUPE-CFG-*)
  config_not_json = 1, ///< a config file or string is not valid JSON
  config_unknown_key,  ///< a config key troupe does not know
  config_wrong_type,   ///< a config value of the wrong JSON type
  config_out_of_range, ///< a config value outside its range (threads = 0, ...)
  config_unreadable,   ///< the config file could not be read
  // runtime (TROUPE-RT-*)
  runtime_stopped = 20, ///< the runtime was stopped; no new work is accepted
  runtime_start_failed, ///< the actor system could not start
  stalled,              ///< virtual time: nothing can run and no timer is pending
  // tasks (TROUPE-TSK-*)
  empty_body = 40,  ///< a null function was given as a task body
  task_failed,      ///< the body threw; the context holds the message
  already_awaited,  ///< the handle's result was already taken by an earlier await
  foreign_task,     ///< the handle belongs to another runtime
  cancelled,        ///< the task was cancelled (an outcome of its own, not a failure)
  invalid_handle,   ///< a default-constructed (empty) handle
  blocking_failed,  ///< a spawn_blocking function threw
  invalid_argument, ///< an argument outside its domain (negative grace period, ...)
  // structured concurrency (TROUPE-SC-*)
  deadline_exceeded = 60, ///< a deadline passed before the body finished
  abandoned,              ///< a branch stopped (or never started) because an abort token tripped
  all_failed,             ///< every branch of a race failed; the context lists each error
  // supervision (TROUPE-SUP-*)
  invalid_spec = 80,  ///< a supervisor or child spec is invalid; the field names it
  start_failed,       ///< a child's start function failed while the supervisor started
  intensity_exceeded, ///< more restarts than the intensity allows within the period
  child_failed,       ///< escalate_to_parent: a child failed and the supervisor gives up
  unknown_child,      ///< no child of that name (dynamic child operations)
  restarting,         ///< the child is waiting to be restarted by its supervisor
  child_running,      ///< the child runs: restart / delete need it stopped first
  supervisor_stopping, ///< the supervisor is stopping: no child is started any more
  template_child,     ///< restart / delete do not apply to a dynamic supervisor's child
  no_template,        ///< start_child with arguments: the supervisor has no child template
  already_started,    ///< start_child of a name whose child runs (OTP's already_started)
  already_present,    ///< start_child of a name whose child is kept, not running (OTP's)
  // messaging and shared state (TROUPE-MSG-*)
  channel_closed = 100, ///< a send to a closed channel, or a receive once it is closed and drained
  deadlock,             ///< every live task waits on a channel operation no other task can complete
  wrong_type,           ///< a value (or a named primitive) of another type than the one asked for
  not_found,            ///< no mailbox or primitive of that name in that scope
  mailbox_closed,       ///< a receive from a mailbox that is closed and drained
  invalid_capacity,     ///< a capacity of 0 or less
  invalid_scope,        ///< an unknown scope, or tenant scope without a tenant id
  invalid_name,         ///< an empty name
  // synchronisation (TROUPE-SYN-*)
  reentrant_acquire = 120, ///< a task acquires a mutex key it already holds
  permits_exceed_capacity, ///< a weighted acquire asks for more permits than exist
  sync_conflict,           ///< a name in use by another kind of primitive, or with another capacity
  // persistence (TROUPE-STO-*)
  storage_unavailable = 140, ///< the database cannot be opened or created (path, permissions)
  schema_too_new,            ///< the database was written by a newer troupe: refused, untouched
  storage_failed,            ///< SQLite reported an error (full disk, read-only file, I/O)
  storage_busy,              ///< another process held the database lock past the retry bound
  invalid_payload,           ///< a payload that is not what the operation needs (a JSON object)
  invalid_topic,             ///< a topic or name that is empty, too long, or has empty segments
  invalid_rate_limit,        ///< a rate-limit request that is malformed; the field names it
  // durable channels (TROUPE-CHN-*)
  invalid_channel_name = 160, ///< a channel name or selector with an empty or too long segment
  scope_reserved,             ///< a scope troupe reserves (`org:`)
  scope_conflict,             ///< an explicit scope id that differs from the active context's
  no_scope_context,           ///< `pipeline:` without an active pipeline context
  invalid_binding,            ///< a malformed trigger binding; the field names it
  invalid_event_id,           ///< an idempotency id longer than 256 bytes
  // worker pools (TROUPE-POL-*)
  pool_queue_full = 180,  ///< fail_submitter: the pool's queue is full; nothing was queued
  pool_no_worker,         ///< fail_fast: no worker is free; nothing was queued
  pool_closed,            ///< a submit to a closed (or stopped) pool
  invalid_pool_spec,      ///< a malformed pool spec or submit; the field names it
  unknown_pool,           ///< no pool of that name or id
  pool_scope_unsupported, ///< a pool scope that needs a host (tenant, org)
  pool_task_rejected,     ///< the awaited job was rejected by the pool's backpressure
  pool_task_stale,        ///< a durable job was queued or running when its process died
  // lanes and jobs (TROUPE-JOB-*)
  invalid_lane = 200,  ///< a lane catalog entry that boot refuses; the field names the lane
  unknown_lane,        ///< a job names a lane the catalog does not declare
  self_lane,           ///< a child job submitted to its parent's own serial lane (it would wait forever)
  undeclarable_pacing, ///< a job policy whose backoff or timeout cannot be honoured
  timed_out,           ///< the job's last attempt ran past its timeout
  // simulation (TROUPE-SIM-*)
  injected_fault = 220, ///< a fault a simulation switched on (seed and probability)
  // clusters (TROUPE-CLU-*)
  cluster_unavailable = 240, ///< the runtime is not a cluster node (no `cluster.node` configured)
  node_name_conflict,        ///< a node joins under a name another up member has
  name_taken,                ///< register_global: another actor holds that cluster name
  unknown_name,              ///< whereis: no actor holds that cluster name
  insecure_cluster,          ///< a cluster config with neither TLS nor `insecure: true`
  node_unreachable,          ///< a seed or member could not be contacted
  node_down,                 ///< the node of a requested actor went down before it answered
  unknown_body,              ///< spawn_on / remote_child: no body of that name on the node
  body_type_mismatch,        ///< a remote body's arguments or result are not the registered types
  unknown_node,              ///< spawn_on: no member of that name
  no_node_available,         ///< a placement (remote child, remote pool) found no member up
};

/// Returns the atom naming troupe's error category inside `caf::error`.
constexpr caf::atom_value error_category() noexcept {
  return caf::atom("troupe");
}

/// Returns an error with `x` and no context.
[[nodiscard]] caf::error make_error(errc x);

/// Returns an error with `x` that names the offending `field` and says what is wrong.
[[nodiscard]] caf::error make_error(errc x, std::string field, std::string detail);

/// Returns an error with `x`, a field, a detail, and the errors that caused it (an
/// aggregate such as `all_failed`).
[[nodiscard]] caf::error make_error(errc x, std::string field, std::string detail,
                      std::vector<caf::error> causes);

/// Returns the causes recorded in an aggregate error (empty for other errors).
std::vector<caf::error> errors_of(const caf::error& x);

/// Returns every error code troupe defines, in enum order (the error table's rows).
[[nodiscard]] std::vector<errc> every_errc();

/// Returns the stable public code of `x`, e.g. "TROUPE-CFG-002".
std::string_view code_of(errc x) noexcept;

/// Returns the enumerator's name, e.g. "config_unknown_key".
std::string_view name_of(errc x) noexcept;

/// Returns a one-line description of what `x` means.
std::string_view describe(errc x) noexcept;

/// Returns `x` rendered with its code, name, field and detail, e.g.
/// `TROUPE-CFG-002 config_unknown_key: field "treads": unknown key`. Errors of other
/// categories are rendered by CAF's `to_string`.
std::string render(const caf::error& x);

/// Returns the offending field recorded in `x`, or an empty string.
std::string field_of(const caf::error& x);

/// Returns the detail text recorded in `x`, or an empty string.
std::string detail_of(const caf::error& x);

/// Returns whether `x` is troupe's error `code` (false for an empty error).
inline bool is(const caf::error& x, errc code) noexcept {
  // CAF 0.17 reads an empty error's category through a null pointer: test first.
  return static_cast<bool>(x) && x.category() == error_category() &&
         x.code() == static_cast<uint8_t>(code);
}

/// Returns whether `x` reports a cancellation (stopping is not failing).
inline bool is_cancellation(const caf::error& x) noexcept {
  return is(x, errc::cancelled);
}

/// Renders error context for CAF's `add_error_category`; used by the runtime.
std::string render_error_context(uint8_t code, const caf::message& context);

} // namespace troupe
