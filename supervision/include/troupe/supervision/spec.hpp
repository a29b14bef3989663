#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/expected.hpp>
#include <nlohmann/json.hpp>

#include "troupe/messages/supervision.hpp"
#include "troupe/messages/types.hpp"

namespace troupe {

/// Which children a failure restarts (Erlang/OTP's strategies, plus escalation).
enum class strategy : uint8_t {
  one_for_one,        ///< only the failed child
  one_for_all,        ///< every child: the others are stopped (reverse order), all restarted
  rest_for_one,       ///< the failed child and those started after it
  escalate_to_parent, ///< none: the supervisor stops its children and fails itself
};

/// When a child is restarted (OTP: permanent, transient, temporary).
enum class restart_mode : uint8_t {
  always,     ///< whenever it exits (permanent)
  on_failure, ///< only when it exits abnormally (transient)
  never,      ///< never (temporary)
};

/// When a supervisor stops by itself because significant children ended (OTP 24).
enum class auto_shutdown : uint8_t {
  never,           ///< significant children are not allowed
  any_significant, ///< the first significant child that ends by itself stops the supervisor
  all_significant, ///< the supervisor stops once every significant child has ended
};

/// One child of a supervisor.
struct child_spec {
  /// Unique within its supervisor; required.
  std::string name;
  /// Required.
  start_fn start;
  restart_mode restart = restart_mode::always;
  /// Shutdown: an exit request (user_shutdown), then a kill after `shutdown_ms`
  /// (`troupe::infinity`: never killed, as OTP's `infinity`). Unset: 5000 for a worker,
  /// `infinity` for a supervisor (OTP's defaults).
  std::optional<int64_t> shutdown_ms;
  /// Shutdown: kill at once.
  bool brutal_kill = false;
  /// Worker or supervisor (OTP's child type, counted by `count_children`). Unset: a
  /// supervisor when `start` came from `supervisor_child`, a worker otherwise.
  std::optional<child_kind> kind;
  /// Per-child budget: more than `max_restarts` restarts within `window_ms` and the child
  /// is `suppressed` (no more restarts) while its siblings go on. 0 = no per-child budget.
  int64_t max_restarts = 0;
  int64_t window_ms = 60'000;
  /// Restart pacing: the n-th restart within the window waits
  /// min(backoff_ms * factor^(n-1), max_backoff_ms) + jitter, where the jitter is a
  /// deterministic function of (name, n) in [0, jitter_ms]: a replay waits the same.
  int64_t backoff_ms = 0;
  double factor = 2.0;
  int64_t max_backoff_ms = 30'000;
  int64_t jitter_ms = 0;
  /// Circuit breaker: when the per-child budget is spent, instead of `suppressed` the child
  /// waits `circuit_open` this long, then gets one half-open try on a clean budget; if that
  /// try fails within `window_ms`, the circuit opens again. 0 = no circuit (suppress).
  int64_t circuit_open_ms = 0;
  /// Its own end (not restarted, not terminated by the supervisor) may stop the supervisor
  /// (see `auto_shutdown`). Only for `on_failure` and `never` children, as in OTP.
  bool significant = false;
};

/// The one kind of child of a dynamic supervisor (OTP's simple_one_for_one): each
/// `start_child(sup, args)` starts one with its own arguments and a generated id
/// ("<name>-<n>"). The fields mean what they mean in `child_spec`.
struct child_template {
  /// The prefix of generated ids; required.
  std::string name = "child";
  /// Required.
  template_start_fn start;
  /// Default: never (temporary), the usual choice for workers that come and go.
  restart_mode restart = restart_mode::never;
  std::optional<int64_t> shutdown_ms;
  bool brutal_kill = false;
  std::optional<child_kind> kind;
  int64_t max_restarts = 0;
  int64_t window_ms = 60'000;
  int64_t backoff_ms = 0;
  double factor = 2.0;
  int64_t max_backoff_ms = 30'000;
  int64_t jitter_ms = 0;
  int64_t circuit_open_ms = 0;
};

/// A supervisor. The per-supervisor budget is OTP's: more than `intensity` restarts within
/// `period_ms` and the supervisor stops its children and fails (escalating to its parent).
/// Defaults are OTP's: intensity 1 within 5 s.
///
/// Order of the budgets: a failure is first charged to the child's own budget
/// (`max_restarts` within `window_ms`); a child that is suppressed (or whose circuit opens)
/// is not restarted, so its failure does not count toward `intensity`. Only restarts that
/// happen count there.
struct supervisor_spec {
  std::string name = "supervisor";
  troupe::strategy strategy = strategy::one_for_one;
  int64_t intensity = 1;
  int64_t period_ms = 5000;
  troupe::auto_shutdown auto_shutdown = auto_shutdown::never;
  std::vector<child_spec> children;
  /// A dynamic supervisor: no static children, `start_child(sup, args)` starts children of
  /// this template; the strategy must be one_for_one. Stop terminates its children
  /// concurrently (OTP), bounded by the template's shutdown.
  std::optional<child_template> child_template;
  /// Temporary (`never`) children are forgotten when they end (OTP). With a cap above 0,
  /// the most recent `keep_ended_temporaries` ended ones stay listed (stopped or failed).
  size_t keep_ended_temporaries = 0;
};

/// Returns an `invalid_spec` error naming the first offending field, or nothing. The whole
/// spec is checked before the first child starts.
[[nodiscard]] caf::error validate(const supervisor_spec& spec);

/// Returns the child spec every child of template `t` shares: its fields, no start
/// function (a template child starts through `t.start` with its arguments).
child_spec spec_of(const child_template& t);

/// Returns an `invalid_spec` error naming the field of `c` (as `at.field`), or nothing;
/// `mode` is the supervisor's auto_shutdown (significant children need one).
[[nodiscard]] caf::error validate_child(const child_spec& c, const std::string& at,
                          troupe::auto_shutdown mode);

/// Returns the spec described by `doc`; a child's `"start"` names an entry of `factories`,
/// the `"child_template"`'s `"start"` an entry of `template_factories`.
/// Keys: name, strategy ("one_for_one" | "one_for_all" | "rest_for_one" |
/// "escalate_to_parent"), intensity, period_ms, auto_shutdown ("never" | "any_significant" |
/// "all_significant"), keep_ended_temporaries, children: [{name, start, restart ("always" |
/// "on_failure" | "never"), type ("worker" | "supervisor"), shutdown_ms or shutdown:
/// "brutal_kill" | "infinity", significant, max_restarts, window_ms, backoff_ms, factor,
/// max_backoff_ms, jitter_ms, circuit_open_ms}], child_template: {the same keys}. Unknown
/// keys, wrong types and bad values are `invalid_spec` errors naming the field (e.g.
/// "children[1].restart").
caf::expected<supervisor_spec>
spec_from_json(const nlohmann::json& doc, const std::map<std::string, start_fn>& factories,
               const std::map<std::string, template_start_fn>& template_factories = {});

/// Returns the wait before the `attempt`-th restart (1-based) of `c`, in milliseconds
/// (saturating: never more than `infinity`).
int64_t restart_delay_ms(const child_spec& c, uint64_t attempt) noexcept;

/// The same for a child named `name` (a template child's generated id).
int64_t restart_delay_ms(const child_spec& c, const std::string& name, uint64_t attempt) noexcept;

/// Returns `a + b` for non-negative durations, saturating at `infinity`.
constexpr int64_t saturating_add(int64_t a, int64_t b) noexcept {
  return b > 0 && a > infinity - b ? infinity : a + b;
}

} // namespace troupe

// A child spec travels (locally) in `sup_add_atom`: it holds a start function.
// Holds the start function: a supervisor on another node takes a child_template's
// arguments (`start_child(sup, caf::message)`), never a child_spec.
TROUPE_LOCAL_ONLY_MESSAGE_TYPE(troupe::child_spec)
