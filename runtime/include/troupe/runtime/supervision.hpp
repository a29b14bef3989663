#pragma once

// Supervision from inside a task: every call is `co_await`ed and answers an `expected`;
// none blocks a thread. (From `main`, the `runtime` members of the same names block the
// calling thread instead.) A call to a supervisor that has ended answers from its final
// state where there is one (state, wait, events, counts, metrics, which_children).

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <caf/expected.hpp>
#include <caf/message.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/actors/task.hpp"
#include "troupe/messages/supervision.hpp"
#include "troupe/supervision/supervisor.hpp"

namespace troupe {

/// Validates `spec` and starts its supervisor on the runtime's clock; its children have
/// started when this answers (`start_failed` naming the path of the child that did not).
/// The runtime owns it like one started with `runtime::supervise`: `stop()` stops it.
[[nodiscard]] task<caf::expected<supervisor_ref>> supervise(context& cx, supervisor_spec spec);

/// Returns the supervisor's state (its final state once it has ended).
[[nodiscard]] task<caf::expected<supervisor_state>> supervisor_state_of(context& cx,
                                                                       supervisor_ref sup);

/// Waits for the supervisor's terminal transition (stopped or failed) and returns its
/// final state; with a `timeout` on the runtime clock, `deadline_exceeded` when it passes.
[[nodiscard]] task<caf::expected<supervisor_state>>
supervisor_wait(context& cx, supervisor_ref sup,
                std::optional<std::chrono::milliseconds> timeout = std::nullopt);

/// Stops the supervisor (children per their shutdown, what is left killed after
/// `timeout`) and returns its final state.
[[nodiscard]] task<caf::expected<supervisor_state>>
supervisor_stop(context& cx, supervisor_ref sup, std::chrono::milliseconds timeout);

/// Returns the supervisor's counters.
[[nodiscard]] task<caf::expected<supervisor_metrics>> supervisor_metrics_of(context& cx,
                                                                           supervisor_ref sup);

/// Returns the supervisor's recent events (the last 1024 at least).
[[nodiscard]] task<caf::expected<std::vector<supervisor_event>>>
supervisor_events(context& cx, supervisor_ref sup);

/// A subscription for a task: waits until the supervisor has events with `seq > after`
/// and returns them (its nested supervisors' included, path-qualified). An empty vector:
/// the supervisor has ended and there will be no more. Loop with the last `seq` seen.
[[nodiscard]] task<caf::expected<std::vector<supervisor_event>>>
supervisor_next_events(context& cx, supervisor_ref sup, uint64_t after);

/// Starts a new child under `sup` (validated like a spec entry; names stay unique).
[[nodiscard]] task<caf::expected<child_state>> start_child(context& cx, supervisor_ref sup,
                                                          child_spec child);

/// Starts a child of a dynamic supervisor's template with `args`; the answer's `name` is
/// its generated id (`no_template` for a supervisor without a template).
[[nodiscard]] task<caf::expected<child_state>> start_child(context& cx, supervisor_ref sup,
                                                          caf::message args);

/// Stops child `name` per its shutdown and keeps it stopped until `restart_child` (a
/// temporary or dynamic child is forgotten); false when it was not running.
[[nodiscard]] task<caf::expected<bool>> terminate_child(context& cx, supervisor_ref sup,
                                                       std::string name);

/// Starts a stopped child again (`restarting` while it waits to be restarted anyway).
[[nodiscard]] task<caf::expected<child_state>> restart_child(context& cx, supervisor_ref sup,
                                                            std::string name);

/// Forgets a child that is not running.
[[nodiscard]] task<caf::expected<bool>> delete_child(context& cx, supervisor_ref sup,
                                                    std::string name);

/// Returns every child with its status.
[[nodiscard]] task<caf::expected<std::vector<child_state>>> which_children(context& cx,
                                                                          supervisor_ref sup);

/// Returns OTP's counts: specs, active, supervisors, workers.
[[nodiscard]] task<caf::expected<child_counts>> count_children(context& cx, supervisor_ref sup);

} // namespace troupe
