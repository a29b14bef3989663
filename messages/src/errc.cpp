#include "troupe/messages/errc.hpp"
#include "troupe/messages/supervision.hpp"

#include <array>

#include <caf/message.hpp>

namespace troupe {

namespace {

struct errc_info {
  errc value;
  std::string_view code;
  std::string_view name;
  std::string_view description;
};

constexpr std::array<errc_info, 80> errc_table{{
    {errc::config_not_json, "TROUPE-CFG-001", "config_not_json",
     "the configuration is not valid JSON"},
    {errc::config_unknown_key, "TROUPE-CFG-002", "config_unknown_key",
     "the configuration names a key troupe does not know"},
    {errc::config_wrong_type, "TROUPE-CFG-003", "config_wrong_type",
     "a configuration value has the wrong JSON type"},
    {errc::config_out_of_range, "TROUPE-CFG-004", "config_out_of_range",
     "a configuration value is outside its allowed range"},
    {errc::config_unreadable, "TROUPE-CFG-005", "config_unreadable",
     "the configuration file cannot be read"},
    {errc::runtime_stopped, "TROUPE-RT-001", "runtime_stopped",
     "the runtime has been stopped and accepts no new work"},
    {errc::runtime_start_failed, "TROUPE-RT-002", "runtime_start_failed",
     "the actor system could not be started"},
    {errc::stalled, "TROUPE-RT-003", "stalled",
     "virtual time: the body waits, nothing can run and no timer is pending"},
    {errc::empty_body, "TROUPE-TSK-001", "empty_body", "a task body is a null function"},
    {errc::task_failed, "TROUPE-TSK-002", "task_failed",
     "the task body threw an exception; the detail holds its message"},
    {errc::already_awaited, "TROUPE-TSK-003", "already_awaited",
     "the task's result was already taken by an earlier await"},
    {errc::foreign_task, "TROUPE-TSK-004", "foreign_task",
     "the handle belongs to a task of another runtime"},
    {errc::cancelled, "TROUPE-TSK-005", "cancelled",
     "the task was cancelled before it produced a result"},
    {errc::invalid_handle, "TROUPE-TSK-006", "invalid_handle",
     "the handle is empty (default-constructed or moved from)"},
    {errc::blocking_failed, "TROUPE-TSK-007", "blocking_failed",
     "a spawn_blocking function threw an exception"},
    {errc::invalid_argument, "TROUPE-TSK-008", "invalid_argument",
     "an argument is outside its domain"},
    {errc::deadline_exceeded, "TROUPE-SC-001", "deadline_exceeded",
     "the deadline passed before the body finished; the body was cancelled"},
    {errc::abandoned, "TROUPE-SC-002", "abandoned",
     "the branch stopped or never started because its abort token tripped"},
    {errc::all_failed, "TROUPE-SC-003", "all_failed",
     "every branch of a race failed; errors_of() lists each branch's error"},
    {errc::invalid_spec, "TROUPE-SUP-001", "invalid_spec",
     "a supervisor or child spec is invalid; the field names the offending entry"},
    {errc::start_failed, "TROUPE-SUP-002", "start_failed",
     "a child could not be started while its supervisor started"},
    {errc::intensity_exceeded, "TROUPE-SUP-003", "intensity_exceeded",
     "more restarts than the supervisor's intensity allows within its period"},
    {errc::child_failed, "TROUPE-SUP-004", "child_failed",
     "a child failed under escalate_to_parent: the supervisor escalates"},
    {errc::unknown_child, "TROUPE-SUP-005", "unknown_child", "no child of that name"},
    {errc::restarting, "TROUPE-SUP-006", "restarting",
     "the child is waiting to be restarted by its supervisor; its restart loop goes on"},
    {errc::child_running, "TROUPE-SUP-007", "child_running",
     "the child runs: restart_child and delete_child need it stopped (terminate_child) first"},
    {errc::supervisor_stopping, "TROUPE-SUP-008", "supervisor_stopping",
     "the supervisor is stopping and starts no child any more"},
    {errc::template_child, "TROUPE-SUP-009", "template_child",
     "restart_child and delete_child do not apply to a dynamic supervisor's children"},
    {errc::no_template, "TROUPE-SUP-010", "no_template",
     "start_child with arguments needs a supervisor with a child template"},
    {errc::already_started, "TROUPE-SUP-011", "already_started",
     "start_child of a name whose child runs already"},
    {errc::already_present, "TROUPE-SUP-012", "already_present",
     "start_child of a name whose child is kept but not running: restart_child or delete_child it"},
    {errc::channel_closed, "TROUPE-MSG-001", "channel_closed",
     "the channel is closed: sends fail at once, receives once what was buffered is drained"},
    {errc::deadlock, "TROUPE-MSG-002", "deadlock",
     "every live task waits on a channel operation that no other task can complete"},
    {errc::wrong_type, "TROUPE-MSG-003", "wrong_type",
     "a value, or a named primitive, has another type than the one asked for"},
    {errc::not_found, "TROUPE-MSG-004", "not_found",
     "no mailbox or shared primitive of that name exists in that scope"},
    {errc::mailbox_closed, "TROUPE-MSG-005", "mailbox_closed",
     "the mailbox is closed and what it buffered has been received"},
    {errc::invalid_capacity, "TROUPE-MSG-006", "invalid_capacity",
     "a capacity (or limit) is 0 or negative"},
    {errc::invalid_scope, "TROUPE-MSG-007", "invalid_scope",
     "an unknown scope, or tenant scope without a tenant id"},
    {errc::invalid_name, "TROUPE-MSG-008", "invalid_name", "a name or key is empty"},
    {errc::reentrant_acquire, "TROUPE-SYN-001", "reentrant_acquire",
     "the task already holds this mutex key; acquiring it again would deadlock"},
    {errc::permits_exceed_capacity, "TROUPE-SYN-002", "permits_exceed_capacity",
     "a weighted acquire asks for more permits than the semaphore has (or fewer than 1)"},
    {errc::sync_conflict, "TROUPE-SYN-003", "sync_conflict",
     "the name is in use by another kind of primitive or with another capacity"},
    {errc::storage_unavailable, "TROUPE-STO-001", "storage_unavailable",
     "the database cannot be opened or created (missing permissions, not a database)"},
    {errc::schema_too_new, "TROUPE-STO-002", "schema_too_new",
     "the database was written by a newer troupe; it is refused and left untouched"},
    {errc::storage_failed, "TROUPE-STO-003", "storage_failed",
     "SQLite reported an error (full disk, read-only file, I/O); the write was not committed"},
    {errc::storage_busy, "TROUPE-STO-004", "storage_busy",
     "another process held the database lock longer than the retry bound"},
    {errc::invalid_payload, "TROUPE-STO-005", "invalid_payload",
     "the payload is not what the operation needs (a JSON object)"},
    {errc::invalid_topic, "TROUPE-STO-006", "invalid_topic",
     "a topic or name is empty, too long, or has empty segments"},
    {errc::invalid_rate_limit, "TROUPE-STO-007", "invalid_rate_limit",
     "a rate-limit request is malformed (no buckets, limit or units below 1, duplicate key)"},
    {errc::invalid_channel_name, "TROUPE-CHN-001", "invalid_channel_name",
     "a channel name or selector is empty, too long, or has an empty segment"},
    {errc::scope_reserved, "TROUPE-CHN-002", "scope_reserved",
     "the scope is reserved by troupe (org:) and cannot be used"},
    {errc::scope_conflict, "TROUPE-CHN-003", "scope_conflict",
     "an explicit scope id differs from the active context's; it is refused, not overridden"},
    {errc::no_scope_context, "TROUPE-CHN-004", "no_scope_context",
     "pipeline: was used outside an active pipeline context"},
    {errc::invalid_binding, "TROUPE-CHN-005", "invalid_binding",
     "a trigger binding is malformed (missing field, count below 1, unknown expire_action)"},
    {errc::invalid_event_id, "TROUPE-CHN-006", "invalid_event_id",
     "an idempotency id is longer than 256 bytes"},
    {errc::pool_queue_full, "TROUPE-POL-001", "pool_queue_full",
     "fail_submitter: the pool's queue is at its max depth; the submit was not queued"},
    {errc::pool_no_worker, "TROUPE-POL-002", "pool_no_worker",
     "fail_fast: no worker of the pool is free; the submit was not queued"},
    {errc::pool_closed, "TROUPE-POL-003", "pool_closed",
     "the pool is closed (or its runtime stopped) and accepts no submit"},
    {errc::invalid_pool_spec, "TROUPE-POL-004", "invalid_pool_spec",
     "a pool spec or submit is malformed; the field names the offending entry"},
    {errc::unknown_pool, "TROUPE-POL-005", "unknown_pool", "no pool of that name or id"},
    {errc::pool_scope_unsupported, "TROUPE-POL-006", "pool_scope_unsupported",
     "the pool scope needs a host (tenant, org) and is refused in-process"},
    {errc::pool_task_rejected, "TROUPE-POL-007", "pool_task_rejected",
     "the job was rejected by the pool's backpressure policy; its snapshot says which and why"},
    {errc::pool_task_stale, "TROUPE-POL-008", "pool_task_stale",
     "the durable job was queued or running when its process died; it never finished"},
    {errc::invalid_lane, "TROUPE-JOB-001", "invalid_lane",
     "a lane catalog entry boot refuses (zero width, duplicate or empty name, zero or two defaults)"},
    {errc::unknown_lane, "TROUPE-JOB-002", "unknown_lane", "the lane catalog declares no lane of that name"},
    {errc::self_lane, "TROUPE-JOB-003", "self_lane",
     "a child job was submitted to its parent's own serial lane, where it could never run"},
    {errc::undeclarable_pacing, "TROUPE-JOB-004", "undeclarable_pacing",
     "a job policy's backoff or timeout cannot be honoured (a cap of zero or below the base)"},
    {errc::timed_out, "TROUPE-JOB-005", "timed_out", "the job's last attempt ran past its timeout"},
    {errc::injected_fault, "TROUPE-SIM-001", "injected_fault",
     "a fault switched on by a simulation's seed and probability"},
    {errc::cluster_unavailable, "TROUPE-CLU-001", "cluster_unavailable",
     "the runtime is not a cluster node: its configuration names no cluster.node"},
    {errc::node_name_conflict, "TROUPE-CLU-002", "node_name_conflict",
     "a node tried to join under the name of a member that is up"},
    {errc::name_taken, "TROUPE-CLU-003", "name_taken", "another actor holds that cluster name"},
    {errc::unknown_name, "TROUPE-CLU-004", "unknown_name", "no actor holds that cluster name"},
    {errc::insecure_cluster, "TROUPE-CLU-005", "insecure_cluster",
     "a cluster configuration with neither TLS settings nor insecure: true"},
    {errc::node_unreachable, "TROUPE-CLU-006", "node_unreachable",
     "a seed or member could not be contacted"},
    {errc::node_down, "TROUPE-CLU-007", "node_down",
     "the node of a requested actor went down (or its connection broke) before it answered"},
    {errc::unknown_body, "TROUPE-CLU-008", "unknown_body",
     "no body of that name is registered on the node asked to run it"},
    {errc::body_type_mismatch, "TROUPE-CLU-009", "body_type_mismatch",
     "a remote body's arguments or result are not of the types it was registered with"},
    {errc::unknown_node, "TROUPE-CLU-010", "unknown_node", "no member of the cluster has that name"},
    {errc::no_node_available, "TROUPE-CLU-011", "no_node_available",
     "a placement found no member that is up"},
}};

} // namespace

std::vector<errc> every_errc() {
  std::vector<errc> out;
  for (auto& i : errc_table)
    out.push_back(i.value);
  return out;
}

namespace {

const errc_info* find(errc x) noexcept {
  for (auto& i : errc_table)
    if (i.value == x) return &i;
  return nullptr;
}

} // namespace

caf::error make_error(errc x) {
  return caf::error{static_cast<uint8_t>(x), error_category()};
}

caf::error make_error(errc x, std::string field, std::string detail) {
  return caf::error{static_cast<uint8_t>(x), error_category(),
                    caf::make_message(std::move(field), std::move(detail))};
}

std::string_view code_of(errc x) noexcept {
  auto i = find(x);
  return i ? i->code : std::string_view{"TROUPE-UNKNOWN"};
}

std::string_view name_of(errc x) noexcept {
  auto i = find(x);
  return i ? i->name : std::string_view{"unknown"};
}

std::string_view describe(errc x) noexcept {
  auto i = find(x);
  return i ? i->description : std::string_view{"unknown troupe error"};
}

namespace {

bool has_field_detail(const caf::message& ctx) {
  return ctx.size() >= 2 && ctx.match_element<std::string>(0) && ctx.match_element<std::string>(1);
}

} // namespace

std::string field_of(const caf::error& x) {
  if (!x || x.category() != error_category() || !has_field_detail(x.context())) return {};
  return x.context().get_as<std::string>(0);
}

std::string detail_of(const caf::error& x) {
  if (!x || x.category() != error_category() || !has_field_detail(x.context())) return {};
  return x.context().get_as<std::string>(1);
}

caf::error make_error(errc x, std::string field, std::string detail,
                      std::vector<caf::error> causes) {
  return caf::error{static_cast<uint8_t>(x), error_category(),
                    caf::make_message(std::move(field), std::move(detail), std::move(causes))};
}

std::vector<caf::error> errors_of(const caf::error& x) {
  if (!x) return {}; // an empty error has no context to read
  auto& ctx = x.context();
  if (x.category() != error_category() || ctx.size() < 3 ||
      !ctx.match_element<std::vector<caf::error>>(2))
    return {};
  return ctx.get_as<std::vector<caf::error>>(2);
}

std::string render_error_context(uint8_t code, const caf::message& context) {
  auto x = static_cast<errc>(code);
  std::string out{code_of(x)};
  out += ' ';
  out += name_of(x);
  if (has_field_detail(context)) {
    auto& field = context.get_as<std::string>(0);
    auto& detail = context.get_as<std::string>(1);
    out += ':';
    if (!field.empty()) {
      out += " field \"";
      out += field;
      out += "\":";
    }
    if (!detail.empty()) {
      out += ' ';
      out += detail;
    }
    if (context.size() >= 3 && context.match_element<std::vector<caf::error>>(2)) {
      auto& causes = context.get_as<std::vector<caf::error>>(2);
      out += " [";
      for (size_t i = 0; i < causes.size(); ++i) {
        if (i > 0) out += "; ";
        out += std::to_string(i) + ": " + render(causes[i]);
      }
      out += ']';
    }
  } else if (!context.empty()) {
    out += ' ';
    out += caf::to_string(context);
  }
  return out;
}

const char* to_string(child_kind x) noexcept {
  return x == child_kind::supervisor ? "supervisor" : "worker";
}

const char* to_string(supervisor_event_kind x) noexcept {
  switch (x) {
    case supervisor_event_kind::started:
      return "started";
    case supervisor_event_kind::stopped:
      return "stopped";
    case supervisor_event_kind::failed:
      return "failed";
    case supervisor_event_kind::restarted:
      return "restarted";
    case supervisor_event_kind::waiting:
      return "waiting";
    case supervisor_event_kind::suppressed:
      return "suppressed";
    case supervisor_event_kind::ignored:
      return "ignored";
    case supervisor_event_kind::circuit_open:
      return "circuit_open";
    case supervisor_event_kind::half_open:
      return "half_open";
    case supervisor_event_kind::killed:
      return "killed";
    case supervisor_event_kind::deleted:
      return "deleted";
    case supervisor_event_kind::escalated:
      return "escalated";
    case supervisor_event_kind::shutdown:
      return "shutdown";
    case supervisor_event_kind::forgotten:
      return "forgotten";
  }
  return "?";
}

std::optional<supervisor_event_kind> parse_supervisor_event_kind(std::string_view x) noexcept {
  for (auto k : every_supervisor_event_kind)
    if (x == to_string(k)) return k;
  return std::nullopt;
}

const char* to_string(child_status x) noexcept {
  switch (x) {
    case child_status::running:
      return "running";
    case child_status::waiting:
      return "waiting";
    case child_status::circuit_open:
      return "circuit_open";
    case child_status::stopped:
      return "stopped";
    case child_status::failed:
      return "failed";
    case child_status::suppressed:
      return "suppressed";
  }
  return "?";
}

const char* to_string(supervisor_status x) noexcept {
  switch (x) {
    case supervisor_status::starting:
      return "starting";
    case supervisor_status::running:
      return "running";
    case supervisor_status::stopping:
      return "stopping";
    case supervisor_status::stopped:
      return "stopped";
    case supervisor_status::failed:
      return "failed";
  }
  return "?";
}

std::string render(const caf::error& x) {
  if (!x) return "none";
  if (x.category() != error_category()) return caf::to_string(x);
  return render_error_context(x.code(), x.context());
}

} // namespace troupe
