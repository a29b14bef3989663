#pragma once

#include <caf/atom.hpp>

#include "troupe/messages/cancel.hpp"

/// The atoms of troupe's protocols (CAF 0.17: at most 10 characters each).
namespace troupe::atoms {

/// Asks a task for its result; answered with an `outcome_box` or an error.
using await_atom = caf::atom_constant<caf::atom("t_await")>;
/// Cancels a task: `(cancel_atom, cancel_mode)` -> bool (messages/cancel.hpp: graceful
/// with a grace period, force, join or wait).
using cancel_atom = caf::atom_constant<caf::atom("t_cancel")>;
/// Starts a task's body (`start_atom`). A task is spawned idle (CAF's lazy_init) and started
/// by its parent once the parent's body suspends, so a cancel the parent sent right after
/// the spawn (`spawn` then `cancel`, no await between) reaches it first: the body never runs.
/// A child whose mailbox is still empty then is started with no message (scheduled with its
/// spawner key turned); this message starts one that has messages waiting, behind them.
using start_atom = caf::atom_constant<caf::atom("t_start")>;
/// A child has left its outcome in the handle's cell for the await parked as `seq`
/// (`await_done_atom, seq`, child -> awaiting task; see `result_cell`).
using await_done_atom = caf::atom_constant<caf::atom("t_awdone")>;
/// A clock timer or a yield addressed to a task (`timer_atom, seq`).
using timer_atom = caf::atom_constant<caf::atom("t_timer")>;
/// The end of a graceful cancel's grace period (`force_atom, gen`, the task's own timer):
/// the stop is forced, unless a later cancel set a new deadline (a newer `gen`).
using force_atom = caf::atom_constant<caf::atom("t_force")>;
/// The result of a `spawn_blocking` job (`blocking_atom, seq, outcome_box`).
using blocking_atom = caf::atom_constant<caf::atom("t_block")>;

/// A branch's outcome, child -> parent: `(report_atom, collector, index, child_id,
/// outcome_box)`; collector 0 is a scope child's end notice (the box holds its error, if any).
using report_atom = caf::atom_constant<caf::atom("t_report")>;
/// Scope children have ended (`done_atom`, child -> its scope, no answer): their end
/// notices wait in the scope's list of ended children (`task_actor::post_child_done`), and
/// only the child that finds the list empty sends this; the scope takes the whole list.
using done_atom = caf::atom_constant<caf::atom("t_done")>;
/// Trips an abort token: `(abort_atom, abort_reason)` -> bool (first writer wins).
using abort_atom = caf::atom_constant<caf::atom("t_abort")>;
/// Polls an abort token: `(abort_poll_atom)` -> abort_state.
using abort_poll_atom = caf::atom_constant<caf::atom("t_abpoll")>;

// -- the runtime's own actors ---------------------------------------------------------------

/// Internal: `(fwd_watch_atom, caf::actor supervisor)` to a lifecycle forwarder (the actor
/// that appends a supervisor's events to `supervisor.lifecycle`): watch it, end after it.
using fwd_watch_atom = caf::atom_constant<caf::atom("fwd_watch")>;
/// Internal: `(fwd_end_atom)`, a lifecycle forwarder to itself: the supervisor ended and
/// every event it sent before has been written.
using fwd_end_atom = caf::atom_constant<caf::atom("fwd_end")>;

} // namespace troupe::atoms
