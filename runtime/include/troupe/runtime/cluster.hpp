#pragma once

// Cluster membership and cluster names from inside a task: every call is `co_await`ed
// and answers an `expected`; none blocks a thread. (From `main`, the `runtime` members of
// the same names block the calling thread instead.) Every call answers
// `cluster_unavailable` on a runtime that is not a cluster node.
//
// A node joins by configuration (`runtime_config::cluster`, JSON `cluster`): it listens,
// contacts its seeds, and the member list spreads until every member is connected to every
// other. Membership changes are events (`cluster_next_events`); `cluster_state` lists the
// members as this node sees them. Events are pulled (`cluster_next_events`) or pushed to a
// subscribed actor (`subscribe_cluster`).

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/expected.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/actors/task.hpp"
#include "troupe/messages/cluster.hpp"

namespace troupe {

/// Returns every member as this node sees it, this node first (`self` set).
[[nodiscard]] task<caf::expected<std::vector<member_state>>> cluster_state(context& cx);

/// A subscription: waits until the node has cluster events with `seq > after` and returns
/// them (member_up, member_down, member_left, name_lost). Loop with the last `seq` seen;
/// the node keeps its last 4096 events.
[[nodiscard]] task<caf::expected<std::vector<cluster_event>>>
cluster_next_events(context& cx, uint64_t after);

/// A push subscription: `who` (any actor, e.g. a plain CAF actor with a
/// `[](const troupe::cluster_event&)` handler) receives every later cluster event of this
/// node as a message, in order, as it happens; with `replay`, the events still in the log
/// first. Answers true, or false when `who` is subscribed already; it is dropped when it ends.
[[nodiscard]] task<caf::expected<bool>> subscribe_cluster(context& cx, caf::actor who,
                                                         bool replay = false);

/// Ends `who`'s subscription; false when it had none.
[[nodiscard]] task<caf::expected<bool>> unsubscribe_cluster(context& cx, caf::actor_addr who);

/// Waits until member `node` has `status` (at once when it has) and returns it;
/// `deadline_exceeded` (field `node`) when `timeout` passes first. No timeout: waits on.
[[nodiscard]] task<caf::expected<member_state>>
await_member(context& cx, std::string node, member_status status,
             std::optional<std::chrono::milliseconds> timeout = std::nullopt);

/// Joins the node listening at `host:port` (and through it, its cluster), as a seed in
/// the configuration does at boot; answers once joined. `node_unreachable` (field
/// `address`) when nothing answers there, `node_name_conflict` when a member that is up has
/// this node's name.
[[nodiscard]] task<caf::expected<bool>> join_cluster(context& cx, std::string host, uint16_t port);

/// Leaves the cluster gracefully: every member is told (and reports `member_left`, not
/// `member_down`) and answers within a second; the node then stops heartbeating. The stop
/// choreography of a cluster node does this by itself (step 4).
[[nodiscard]] task<caf::expected<bool>> leave_cluster(context& cx);

/// Registers `actor` under the cluster-wide `name`: every member learns it, and it goes when
/// the actor ends or its node goes down or leaves. It answers once every member this node
/// sees up has merged it (a member that does not answer within the failure timeout learns
/// it when it joins again; one this node has not joined yet, when it does). Answers true, or false when `name` was
/// held by that actor already; `name_taken` when another actor holds it; `invalid_name`.
/// Two nodes that register one name before they hear of each other: the registration
/// with the smaller (Lamport stamp, node name) wins on every node, and the other node
/// records a `name_lost` event.
[[nodiscard]] task<caf::expected<bool>> register_global(context& cx, std::string name,
                                                       caf::actor actor);

/// Removes this node's registration of `name`; false when this node holds no such name.
[[nodiscard]] task<caf::expected<bool>> unregister_global(context& cx, std::string name);

/// Returns the actor registered under `name` anywhere in the cluster (`unknown_name`). The
/// answer comes from this node's copy of the cluster's names: no network round trip.
[[nodiscard]] task<caf::expected<caf::actor>> whereis(context& cx, std::string name);

/// Returns every cluster name this node knows.
[[nodiscard]] task<caf::expected<std::vector<global_name>>> global_names(context& cx);

} // namespace troupe
