#pragma once

#include <caf/atom.hpp>

/// The atoms of troupe's protocols (CAF 0.17: at most 10 characters each).
namespace troupe::atoms {

/// Asks a task for its result; answered with an `outcome_box` or an error.
using await_atom = caf::atom_constant<caf::atom("t_await")>;
/// Cancels a task: alone it forces; with a grace period (nanoseconds) it asks first.
using cancel_atom = caf::atom_constant<caf::atom("t_cancel")>;
/// With `cancel_atom`: the owner releases the task (stop it, discard its result).
using join_atom = caf::atom_constant<caf::atom("t_join")>;
/// A clock timer addressed to a task (`timer_atom, seq`).
using timer_atom = caf::atom_constant<caf::atom("t_timer")>;
/// The graceful-cancel deadline of a task (`force_atom, generation`).
using force_atom = caf::atom_constant<caf::atom("t_force")>;
/// The result of a `spawn_blocking` job (`blocking_atom, seq, outcome_box`).
using blocking_atom = caf::atom_constant<caf::atom("t_block")>;

} // namespace troupe::atoms
