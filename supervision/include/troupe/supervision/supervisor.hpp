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
};

/// A supervisor and its final-state slot.
struct supervisor_ref {
  caf::actor actor;
  std::shared_ptr<supervisor_final> final;
};

/// Validates `spec` completely, then spawns its supervisor in `sys`, timed by `clk`.
/// The supervisor starts its children in order (a start failure stops the ones started,
/// in reverse order, and fails the supervisor with `start_failed`), links to them, and
/// answers the protocol in messages/supervision.hpp. Asked to exit (an exit message from
/// its parent), it stops its children in reverse order first.
caf::expected<caf::actor> spawn_supervisor(caf::actor_system& sys, troupe::clock& clk,
                                           supervisor_spec spec,
                                           std::shared_ptr<supervisor_final> final = nullptr);

/// Returns a start function for a child that is itself a supervisor (a subtree): its
/// failure (intensity exceeded, escalation) is a failure of that child in the parent.
start_fn supervisor_child(troupe::clock& clk, supervisor_spec spec);

} // namespace troupe
