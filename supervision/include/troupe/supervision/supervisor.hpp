#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "troupe/messages/clock.hpp"
#include "troupe/messages/supervision.hpp"
#include "troupe/supervision/spec.hpp"

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace troupe {

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
[[nodiscard]] caf::expected<caf::actor> spawn_supervisor(caf::actor_system& sys, troupe::clock& clk,
                                           supervisor_spec spec,
                                           std::shared_ptr<supervisor_final> final = nullptr);

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
