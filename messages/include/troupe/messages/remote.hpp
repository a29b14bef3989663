#pragma once

// The protocol of a node's spawner: it runs task bodies registered by name on behalf of
// other nodes (closures cannot travel, names and serialisable arguments can). Every node
// of a cluster runs one and registers it under the cluster name `spawner_name(node)`.

#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/message.hpp>
#include <caf/typed_actor.hpp>

#include "troupe/messages/cancel.hpp"
#include "troupe/messages/outcome.hpp"

namespace troupe {

namespace atoms {

/// `(rs_run_atom, uint64_t key, std::string body, caf::message args)` -> remote_outcome:
/// runs `body` as a root task of the spawner's node and answers its outcome when it ends
/// (the body's value, its failure, `cancelled`). `key` names the run for `rs_cancel_atom`
/// (unique per requester). The requester is monitored: when it ends (or its node's
/// connection breaks), the run is cancelled. Errors: `unknown_body` (field `body`),
/// `body_type_mismatch` (field `args`), `runtime_stopped`.
using rs_run_atom = caf::atom_constant<caf::atom("r_run")>;
/// `(rs_cancel_atom, uint64_t key, cancel_mode mode)` -> bool: cancels the sender's run `key`
/// (mode as `cancel_atom`: graceful with the grace left, or force) and answers
/// once the run's task has ended (true), or at once when no such run is under way (false).
/// The run's own answer says `cancelled`.
using rs_cancel_atom = caf::atom_constant<caf::atom("r_cancel")>;
/// `(rs_start_atom, std::string owner_node, uint64_t owner_incarnation, std::string body,
/// caf::message args, std::string name)` -> caf::actor: starts `body` as a supervised child
/// task (its failure is the actor's exit reason; its return a normal exit) and answers the
/// actor at once; the caller monitors it. The child is cancelled when that incarnation of
/// `owner_node` goes down or leaves (a restarted owner's new children stay), so that no
/// remote child outlives the supervisor that started it. Errors as `rs_run_atom`.
using rs_start_atom = caf::atom_constant<caf::atom("r_start")>;
/// `(rs_bodies_atom)` -> std::vector<std::string>: the body names registered on the node.
using rs_bodies_atom = caf::atom_constant<caf::atom("r_bodies")>;
/// `(rs_done_atom, uint64_t run, remote_outcome)`: internal, a run's task reports its end.
using rs_done_atom = caf::atom_constant<caf::atom("r_done")>;

} // namespace atoms

/// A node's spawner.
using spawner_actor = caf::typed_actor<
    caf::replies_to<atoms::rs_run_atom, uint64_t, std::string, caf::message>::with<remote_outcome>,
    caf::replies_to<atoms::rs_cancel_atom, uint64_t, cancel_mode>::with<bool>,
    caf::replies_to<atoms::rs_start_atom, std::string, uint64_t, std::string, caf::message,
                    std::string>::with<caf::actor>,
    caf::replies_to<atoms::rs_bodies_atom>::with<std::vector<std::string>>,
    caf::reacts_to<atoms::rs_done_atom, uint64_t, remote_outcome>>;

/// Returns the cluster name of `node`'s spawner.
[[nodiscard]] inline std::string spawner_name(const std::string& node) {
  return "troupe.spawner/" + node;
}

} // namespace troupe
