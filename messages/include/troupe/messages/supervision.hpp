#pragma once

// The supervision protocol's vocabulary: what a supervisor reports about itself and its
// children. (The spec, which holds start functions, is local: supervision/spec.hpp.)

#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>
#include <caf/expected.hpp>
#include <caf/message.hpp>
#include <caf/meta/type_name.hpp>

namespace troupe {

/// A duration that never ends (milliseconds fields: `shutdown_ms`, `circuit_open_ms`, ...).
/// Every millisecond field saturates: a value of 100 years or more means the same.
inline constexpr int64_t infinity = std::numeric_limits<int64_t>::max();

// -- local only: start functions (closures cannot cross a node) -----------------------------

/// What a start function returns: the child's actor, nothing ("ignore": the child is
/// recorded as stopped and not restarted), or an error (the start failed).
using start_result = caf::expected<std::optional<caf::actor>>;

/// Starts one child in `sys`. Local only.
using start_fn = std::function<start_result(caf::actor_system& sys)>;

/// Starts one child of a dynamic supervisor's template with the arguments given to
/// `start_child`. Local only.
using template_start_fn = std::function<start_result(caf::actor_system& sys, const caf::message& args)>;

namespace atoms {
/// `(sup_state_atom)` -> supervisor_state.
using sup_state_atom = caf::atom_constant<caf::atom("s_state")>;
/// `(sup_events_atom)` -> std::vector<supervisor_event>: the log.
/// `(sup_events_atom, uint64_t after)` -> std::vector<supervisor_event>: the events with
/// `seq > after`, answered once there is one (empty: the supervisor ended).
using sup_events_atom = caf::atom_constant<caf::atom("s_events")>;
/// `(sup_wait_atom)` -> supervisor_state, answered at the terminal transition.
using sup_wait_atom = caf::atom_constant<caf::atom("s_wait")>;
/// `(sup_stop_atom, int64_t timeout_ms)` -> supervisor_state once stopped.
using sup_stop_atom = caf::atom_constant<caf::atom("s_stop")>;
/// `(sup_subscribe_atom, caf::actor)` -> bool: the actor receives every later
/// `supervisor_event` as a message, as it happens (a live timeline, no polling).
/// `(sup_subscribe_atom, caf::actor, bool replay)`: with `replay`, the events still in the
/// log first (the runtime's `supervisor.lifecycle` forwarder uses it).
/// `(sup_subscribe_atom, caf::actor, bool replay, std::string prefix)`: the same with every
/// event's child path-qualified under `prefix` (a parent supervisor subscribes to a subtree so).
using sup_subscribe_atom = caf::atom_constant<caf::atom("s_sub")>;
/// `(sup_add_atom, child_spec)` -> child_state: starts a new child (local only).
/// `(sup_add_atom, caf::message args)` -> child_state: starts a child of the supervisor's
/// template with `args`; its name is the generated id ("<template name>-<n>").
using sup_add_atom = caf::atom_constant<caf::atom("s_add")>;
/// `(sup_term_atom, name)` -> bool: stops a child (per its shutdown policy), answered once it
/// has stopped; it is not restarted until `sup_restart_atom`. False: it was not running.
using sup_term_atom = caf::atom_constant<caf::atom("s_term")>;
/// `(sup_restart_atom, name)` -> child_state: starts a stopped child again.
using sup_restart_atom = caf::atom_constant<caf::atom("s_restart")>;
/// `(sup_delete_atom, name)` -> bool: forgets a child that is not running.
using sup_delete_atom = caf::atom_constant<caf::atom("s_delete")>;
/// `(sup_count_atom)` -> child_counts.
using sup_count_atom = caf::atom_constant<caf::atom("s_count")>;
/// `(sup_metrics_atom)` -> supervisor_metrics.
using sup_metrics_atom = caf::atom_constant<caf::atom("s_metrics")>;
/// `(sup_down_atom, uint64_t child, caf::actor_id, caf::error reason)`: internal, sent by a
/// functor attached to each child when it terminates (names the child: no lookup by actor).
using sup_down_atom = caf::atom_constant<caf::atom("s_down")>;
/// `(sup_unsub_atom, caf::actor_addr)`: internal, a subscriber ended (sent by a functor
/// attached to it when it subscribed): it is dropped from the subscribers.
using sup_unsub_atom = caf::atom_constant<caf::atom("s_unsub")>;
/// `(sup_tick_atom, sup_tick kind, uint64_t child, uint64_t gen)`: internal timers.
using sup_tick_atom = caf::atom_constant<caf::atom("s_tick")>;
} // namespace atoms

/// What an internal supervisor timer is for.
enum class sup_tick : uint8_t {
  restart,   ///< a child's backoff (or open circuit) ended
  kill,      ///< a child's cooperative shutdown took too long
  retry,     ///< a restart failed to start: handled like a failure, in a fresh message
  group,     ///< a group restart's backoff ended
  stop,      ///< stop(timeout) expired: kill what is left
  kill_all,  ///< a dynamic supervisor's concurrent shutdown took too long
  finish,    ///< end after a failed start (so that a state request right after sees why)
  subtree_stopped, ///< a subtree child that failed to start has stopped what it started
};

/// Whether a child is a worker or a supervisor (OTP's child type).
enum class child_kind : uint8_t { worker, supervisor };

/// Returns "worker" or "supervisor".
const char* to_string(child_kind x) noexcept;

/// The status of one supervised child.
enum class child_status : uint8_t { running, waiting, circuit_open, stopped, failed, suppressed };

/// Returns "running", "waiting", ...
const char* to_string(child_status x) noexcept;

/// One child as the supervisor sees it.
struct child_state {
  std::string name;
  child_status status = child_status::stopped;
  uint64_t restarts = 0;
  std::string last_error;
  /// The runtime clock's milliseconds of the next restart (status waiting), or -1.
  int64_t next_restart_ms = -1;
  std::string wait_reason;
  /// The child's current actor (empty unless running).
  caf::actor actor;
  /// Worker or supervisor.
  child_kind kind = child_kind::worker;
  friend bool operator==(const child_state&, const child_state&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, child_state& x) {
  return f(caf::meta::type_name("troupe.child_state"), x.name, x.status, x.restarts, x.last_error,
           x.next_restart_ms, x.wait_reason, x.actor, x.kind);
}

/// The answer to `sup_count_atom` (OTP's count_children: `[specs, active, supervisors,
/// workers]`; supervisors + workers = specs).
struct child_counts {
  uint64_t specs = 0;       ///< children known
  uint64_t active = 0;      ///< children running
  uint64_t supervisors = 0; ///< children that are supervisors, running or not
  uint64_t workers = 0;     ///< children that are workers, running or not
  friend bool operator==(const child_counts&, const child_counts&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, child_counts& x) {
  return f(caf::meta::type_name("troupe.child_counts"), x.specs, x.active, x.supervisors,
           x.workers);
}

/// The answer to `sup_metrics_atom`: counters since the supervisor started.
struct supervisor_metrics {
  uint64_t started = 0;       ///< child starts, restarts included
  uint64_t restarts = 0;      ///< restarts
  uint64_t failures = 0;      ///< abnormal child exits and failed restarts
  uint64_t normal_exits = 0;  ///< children that ended normally by themselves
  uint64_t suppressed = 0;    ///< children whose budget was spent
  uint64_t circuit_opens = 0; ///< circuits opened
  uint64_t kills = 0;         ///< children killed after their shutdown timeout
  uint64_t escalations = 0;   ///< this supervisor gave up (0 or 1)
  uint64_t children = 0;      ///< children known now
  uint64_t active = 0;        ///< children running now
  uint64_t subscribers = 0;   ///< live event subscribers (an ended one is dropped)
  friend bool operator==(const supervisor_metrics&, const supervisor_metrics&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, supervisor_metrics& x) {
  return f(caf::meta::type_name("troupe.supervisor_metrics"), x.started, x.restarts, x.failures,
           x.normal_exits, x.suppressed, x.circuit_opens, x.kills, x.escalations, x.children,
           x.active, x.subscribers);
}

/// A supervisor's own status.
enum class supervisor_status : uint8_t { starting, running, stopping, stopped, failed };

/// Returns "starting", "running", ...
const char* to_string(supervisor_status x) noexcept;

/// The answer to `sup_state_atom`.
struct supervisor_state {
  std::string name;
  supervisor_status status = supervisor_status::starting;
  std::string reason;
  std::vector<child_state> children;
  friend bool operator==(const supervisor_state&, const supervisor_state&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, supervisor_state& x) {
  return f(caf::meta::type_name("troupe.supervisor_state"), x.name, x.status, x.reason, x.children);
}

/// What happened, when, to whom, why.
/// What happened, in a supervisor's event (docs/supervision.md, "Events", says when each
/// is emitted). Rendered to text at the edge: `to_string`, the event log's rows.
enum class supervisor_event_kind : uint8_t {
  started,
  stopped,
  failed,
  restarted,
  waiting,
  suppressed,
  ignored,
  circuit_open,
  half_open,
  killed,
  deleted,
  escalated,
  shutdown,
  forgotten,
};

/// Returns the name of `x` ("started", "circuit_open", ...).
[[nodiscard]] const char* to_string(supervisor_event_kind x) noexcept;

/// Parses a kind's name; nothing for an unknown one.
[[nodiscard]] std::optional<supervisor_event_kind> parse_supervisor_event_kind(std::string_view x) noexcept;

/// Every event kind, in declaration order.
inline constexpr supervisor_event_kind every_supervisor_event_kind[] = {
    supervisor_event_kind::started,      supervisor_event_kind::stopped,
    supervisor_event_kind::failed,       supervisor_event_kind::restarted,
    supervisor_event_kind::waiting,      supervisor_event_kind::suppressed,
    supervisor_event_kind::ignored,      supervisor_event_kind::circuit_open,
    supervisor_event_kind::half_open,    supervisor_event_kind::killed,
    supervisor_event_kind::deleted,      supervisor_event_kind::escalated,
    supervisor_event_kind::shutdown,     supervisor_event_kind::forgotten,
};
static_assert(std::size(every_supervisor_event_kind) ==
                  static_cast<size_t>(supervisor_event_kind::forgotten) + 1,
              "every_supervisor_event_kind lists every kind");

struct supervisor_event {
  /// Milliseconds since the Unix epoch on real time (the clock of the event log's rows),
  /// virtual milliseconds on virtual time.
  int64_t at_ms = 0;
  supervisor_event_kind kind = supervisor_event_kind::started;
  /// The child's name; for an event of a nested supervisor, its path below this supervisor
  /// ("parsers/parser-3"); empty for the supervisor itself.
  std::string child;
  std::string reason;
  /// The event's number in its supervisor's log: 1, 2, ... (a subscription cursor).
  uint64_t seq = 0;
  friend bool operator==(const supervisor_event&, const supervisor_event&) = default;
};


template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, supervisor_event& x) {
  return f(caf::meta::type_name("troupe.supervisor_event"), x.at_ms, x.kind, x.child, x.reason,
           x.seq);
}

} // namespace troupe
