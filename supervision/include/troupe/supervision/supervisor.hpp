#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "troupe/messages/clock.hpp"
#include "troupe/messages/supervision.hpp"
#include "troupe/supervision/spec.hpp"

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace troupe {

/// The supervisor's interface as its clients use it: every request a client may send, with
/// its reply, so a wrong request does not compile. (It lives here, not in messages/,
/// because `child_spec` -- a local-only payload holding the start function -- is defined by
/// this module.) The supervisor actor itself stays dynamically typed: it also handles CAF's
/// exit and down messages, its children's end notices and its own timers (`sup_down`,
/// `sup_unsub`, `sup_tick`, internal).
using supervisor_type = caf::typed_actor<
    caf::replies_to<atoms::sup_state_atom>::with<supervisor_state>,
    caf::replies_to<atoms::sup_events_atom>::with<std::vector<supervisor_event>>,
    caf::replies_to<atoms::sup_events_atom, uint64_t>::with<std::vector<supervisor_event>>,
    caf::replies_to<atoms::sup_wait_atom>::with<supervisor_state>,
    caf::replies_to<atoms::sup_stop_atom, int64_t>::with<supervisor_state>,
    caf::replies_to<atoms::sup_add_atom, child_spec>::with<child_state>,
    caf::replies_to<atoms::sup_add_atom, caf::message>::with<child_state>,
    caf::replies_to<atoms::sup_term_atom, std::string>::with<bool>,
    caf::replies_to<atoms::sup_restart_atom, std::string>::with<child_state>,
    caf::replies_to<atoms::sup_delete_atom, std::string>::with<bool>,
    caf::replies_to<atoms::sup_metrics_atom>::with<supervisor_metrics>,
    caf::replies_to<atoms::sup_count_atom>::with<child_counts>,
    caf::replies_to<atoms::sup_subscribe_atom, caf::actor>::with<bool>,
    caf::replies_to<atoms::sup_subscribe_atom, caf::actor, bool>::with<bool>,
    caf::replies_to<atoms::sup_subscribe_atom, caf::actor, bool, std::string>::with<bool>>;

/// What a supervisor leaves behind at its terminal transition (it exits then, so that its
/// parent sees it): the final state and the whole event log.
struct supervisor_final {
  std::mutex mtx;
  std::optional<supervisor_state> state;
  std::vector<supervisor_event> events;
  child_counts counts;
  supervisor_metrics metrics;
};

/// A supervisor and its final-state slot.
struct supervisor_ref {
  caf::actor actor;
  std::shared_ptr<supervisor_final> final;
};

/// Validates `spec` completely, then spawns its supervisor in `sys`, timed by `clk`.
/// The supervisor's children start in order before this returns (OTP's start_link): a
/// start failure stops the ones started, in reverse order, and answers `start_failed`
/// whose field is the path of the child that failed ("outer/inner/child", through nested
/// supervisors) and whose `errors_of()` holds the start function's own error. The
/// supervisor monitors its children and answers the protocol in messages/supervision.hpp.
/// Asked to exit (an exit message from its parent), it stops its children first (in
/// reverse order; a dynamic supervisor's concurrently).
/// On a start failure this returns at once, while the failed supervisor still stops the
/// children it started (it cannot block: it may be called from an actor). `rt.supervise`,
/// `troupe::supervise` and a parent starting a subtree answer only once those children
/// have stopped, as OTP's start_link does.
[[nodiscard]] caf::expected<caf::actor> spawn_supervisor(caf::actor_system& sys, troupe::clock& clk,
                                           supervisor_spec spec,
                                           std::shared_ptr<supervisor_final> final = nullptr);

namespace detail {
/// `spawn_supervisor`, and on a start failure the supervisor still stopping the children
/// it started, in `stopping` (it ends by itself once they have stopped; nothing to ask it).
[[nodiscard]] caf::expected<caf::actor>
spawn_supervisor_or_stopping(caf::actor_system& sys, troupe::clock& clk, supervisor_spec spec,
                             std::shared_ptr<supervisor_final> final, caf::actor& stopping);
} // namespace detail

/// The start function of a subtree (what `supervisor_child` returns); a supervisor
/// recognises it: such a child counts as a supervisor, its shutdown defaults to
/// `infinity`, and its events reach the parent's subscribers path-qualified.
struct subtree_start {
  troupe::clock* clk;
  supervisor_spec spec;
  start_result operator()(caf::actor_system& sys) const;
};

/// Returns a start function for a child that is itself a supervisor (a subtree): its
/// failure (intensity exceeded, escalation) is a failure of that child in the parent, and
/// a subtree that cannot start fails the parent's start (`start_failed` naming the path).
start_fn supervisor_child(troupe::clock& clk, supervisor_spec spec);

/// Returns a child spec named `name` running the subtree `spec` (kind supervisor,
/// shutdown `infinity`, restart always).
child_spec supervisor_child_spec(std::string name, troupe::clock& clk, supervisor_spec spec);

} // namespace troupe
