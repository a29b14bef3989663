#pragma once

// The cluster protocol: what the directories of two nodes tell each other (join, gossip,
// heartbeats, leave, cluster names) and what a node's own tasks ask its directory. Every
// node publishes exactly one directory actor on its listen port; everything here crosses
// nodes (registered, with `inspect()`).

#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace troupe {

/// A member's status as one node sees it.
enum class member_status : uint8_t {
  /// Connected, and heard from within the failure timeout.
  up,
  /// Its connection broke, or nothing was heard from it for longer than the failure
  /// timeout. A down member that comes back is `up` again (a new `member_up` event).
  down,
  /// It said goodbye (`leave`, or the stop choreography of its runtime).
  left,
};

/// Returns "up", "down" or "left".
[[nodiscard]] const char* to_string(member_status x) noexcept;

/// A node as it introduces itself on the wire (join, gossip).
struct member_info {
  /// The node's name, unique in the cluster.
  std::string name;
  /// The address other nodes connect to (the listen address, or `advertise`).
  std::string host;
  uint16_t port = 0;
  /// Random per start of a runtime: a node restarted under the same name is a new
  /// incarnation, and its old incarnation's registrations are gone.
  uint64_t incarnation = 0;
  friend bool operator==(const member_info&, const member_info&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, member_info& x) {
  return f(caf::meta::type_name("troupe.member_info"), x.name, x.host, x.port, x.incarnation);
}

/// One member as this node sees it (`cluster_state`).
struct member_state {
  member_info info;
  member_status status = member_status::up;
  /// Whether this entry is the node that answers (the list includes it, always `up`).
  bool self = false;
  /// The runtime clock's milliseconds when it was last heard from (-1: never).
  int64_t last_heard_ms = -1;
  /// The runtime clock's milliseconds of its last status change.
  int64_t since_ms = 0;
  /// Why it is down or left ("connection lost", "no heartbeat for 1000 ms", "left").
  std::string reason;
  friend bool operator==(const member_state&, const member_state&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, member_state& x) {
  return f(caf::meta::type_name("troupe.member_state"), x.info, x.status, x.self,
           x.last_heard_ms, x.since_ms, x.reason);
}

/// What happened in the cluster, as one node saw it.
enum class cluster_event_kind : uint8_t {
  member_up,   ///< a member joined (or came back after being down)
  member_down, ///< a member's connection broke or its heartbeats stopped
  member_left, ///< a member left gracefully
  name_lost,   ///< a cluster name this node had registered went to another node's actor
};

/// Returns "member_up", "member_down", "member_left" or "name_lost".
[[nodiscard]] const char* to_string(cluster_event_kind x) noexcept;

/// One entry of a node's cluster event log.
struct cluster_event {
  /// 1, 2, ...: the subscription cursor (`cluster_next_events(cx, after)`).
  uint64_t seq = 0;
  /// The runtime clock's milliseconds.
  int64_t at_ms = 0;
  cluster_event_kind kind = cluster_event_kind::member_up;
  /// The member the event is about (for `name_lost`: the node that won the name).
  std::string node;
  /// Why (down, left), or the name lost.
  std::string detail;
  /// The member's incarnation the event is about (member_up, member_down, member_left): a
  /// node restarted under the same name is another incarnation. 0 for name_lost.
  uint64_t incarnation = 0;
  friend bool operator==(const cluster_event&, const cluster_event&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cluster_event& x) {
  return f(caf::meta::type_name("troupe.cluster_event"), x.seq, x.at_ms, x.kind, x.node,
           x.detail, x.incarnation);
}

/// The cluster name a storage shared as `name` (`cluster_config::share_storage`) is
/// registered under.
[[nodiscard]] inline std::string shared_storage_name(const std::string& name) {
  return "troupe.storage/" + name;
}

/// A cluster-wide name: `register_global(name, actor)` on one node, `whereis(name)` on any.
struct global_name {
  std::string name;
  caf::actor actor;
  /// The node that registered it (its registrations go when it goes down or leaves).
  std::string node;
  /// A Lamport stamp: of two registrations of one name, the smaller (stamp, node) wins
  /// on every node, whichever order they arrive in.
  uint64_t stamp = 0;
  friend bool operator==(const global_name&, const global_name&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, global_name& x) {
  return f(caf::meta::type_name("troupe.global_name"), x.name, x.actor, x.node, x.stamp);
}

/// The answer to a join: the answering node, the members it knows (up), and its names.
struct join_reply {
  member_info self;
  std::vector<member_info> members;
  std::vector<global_name> names;
  friend bool operator==(const join_reply&, const join_reply&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_reply& x) {
  return f(caf::meta::type_name("troupe.join_reply"), x.self, x.members, x.names);
}

namespace atoms {

// node to node
/// `(cl_join_atom, member_info joiner, std::vector<global_name>)` -> join_reply. Adds the
/// joiner as up (`node_name_conflict` when its name is this node's, or another
/// incarnation's that is still up) and gossips it to the other members.
using cl_join_atom = caf::atom_constant<caf::atom("c_join")>;
/// `(cl_gossip_atom, std::vector<member_info>)`: members the receiver may not know yet.
using cl_gossip_atom = caf::atom_constant<caf::atom("c_gossip")>;
/// `(cl_beat_atom, std::string node, uint64_t incarnation)`: a heartbeat.
using cl_beat_atom = caf::atom_constant<caf::atom("c_beat")>;
/// `(cl_bye_atom, std::string node, uint64_t incarnation)` -> bool: the sender leaves.
using cl_bye_atom = caf::atom_constant<caf::atom("c_bye")>;
/// `(cl_announce_atom, global_name)` -> bool: a registration (merged by the (stamp, node)
/// rule); the answer says it is merged, so a registration returns only once every member
/// that is up knows it.
using cl_announce_atom = caf::atom_constant<caf::atom("c_annce")>;
/// `(cl_drop_atom, std::string name, std::string node, uint64_t stamp)` -> bool: an
/// unregistration.
using cl_drop_atom = caf::atom_constant<caf::atom("c_drop")>;

// a node's own tasks to its directory
/// `(cl_join_atom, std::string host, uint16_t port)` -> bool: joins the node at that
/// address (and, through it, its cluster); `node_unreachable` when it cannot be contacted.
/// `(cl_start_atom, uint16_t bound_port)`: sent once by the runtime after publishing.
using cl_start_atom = caf::atom_constant<caf::atom("c_start")>;
/// `(cl_tick_atom)`: the heartbeat timer.
using cl_tick_atom = caf::atom_constant<caf::atom("c_tick")>;
/// `(cl_state_atom)` -> std::vector<member_state>, this node first.
using cl_state_atom = caf::atom_constant<caf::atom("c_state")>;
/// `(cl_events_atom, uint64_t after)` -> std::vector<cluster_event>: the events with
/// `seq > after`, answered once there is one (empty: the directory stopped).
using cl_events_atom = caf::atom_constant<caf::atom("c_events")>;
/// `(cl_subscribe_atom, caf::actor who, bool replay)` -> bool: `who` receives every later
/// `cluster_event` as a message, as it happens (with `replay`: the events in the log first);
/// false when it is subscribed already. It is dropped when it ends.
using cl_subscribe_atom = caf::atom_constant<caf::atom("c_sub")>;
/// `(cl_unsubscribe_atom, caf::actor_addr who)` -> bool: false when it was not subscribed.
using cl_unsubscribe_atom = caf::atom_constant<caf::atom("c_unsub")>;
/// `(cl_await_atom, std::string node, member_status, int64_t timeout_ms)` -> member_state
/// once the member has that status (`deadline_exceeded` past the timeout; -1: none).
using cl_await_atom = caf::atom_constant<caf::atom("c_await")>;
/// `(cl_leave_atom)` -> bool: tells every member goodbye and waits for their answers
/// (bounded); the node then stops heartbeating and joining.
using cl_leave_atom = caf::atom_constant<caf::atom("c_leave")>;
/// `(cl_register_atom, std::string name, caf::actor)` -> bool (false: it was registered
/// to that actor already). `name_taken` when another actor holds it.
using cl_register_atom = caf::atom_constant<caf::atom("c_reg")>;
/// `(cl_unregister_atom, std::string name)` -> bool (false: not registered by this node).
using cl_unregister_atom = caf::atom_constant<caf::atom("c_unreg")>;
/// `(cl_whereis_atom, std::string name)` -> caf::actor (`unknown_name`).
using cl_whereis_atom = caf::atom_constant<caf::atom("c_where")>;
/// `(cl_names_atom)` -> std::vector<global_name>: every cluster name this node knows.
using cl_names_atom = caf::atom_constant<caf::atom("c_names")>;

} // namespace atoms

/// The directory of one node: published on its listen port, found by tasks of its own
/// runtime through CAF's registry under `cluster_directory_key()`.
using directory_actor = caf::typed_actor<
    // node to node
    caf::replies_to<atoms::cl_join_atom, member_info, std::vector<global_name>>::with<join_reply>,
    caf::reacts_to<atoms::cl_gossip_atom, std::vector<member_info>>,
    caf::reacts_to<atoms::cl_beat_atom, std::string, uint64_t>,
    caf::replies_to<atoms::cl_bye_atom, std::string, uint64_t>::with<bool>,
    caf::replies_to<atoms::cl_announce_atom, global_name>::with<bool>,
    caf::replies_to<atoms::cl_drop_atom, std::string, std::string, uint64_t>::with<bool>,
    // local
    caf::replies_to<atoms::cl_join_atom, std::string, uint16_t>::with<bool>,
    caf::reacts_to<atoms::cl_start_atom, uint16_t>, caf::reacts_to<atoms::cl_tick_atom>,
    caf::replies_to<atoms::cl_state_atom>::with<std::vector<member_state>>,
    caf::replies_to<atoms::cl_events_atom, uint64_t>::with<std::vector<cluster_event>>,
    caf::replies_to<atoms::cl_subscribe_atom, caf::actor, bool>::with<bool>,
    caf::replies_to<atoms::cl_unsubscribe_atom, caf::actor_addr>::with<bool>,
    caf::replies_to<atoms::cl_await_atom, std::string, member_status, int64_t>::with<member_state>,
    caf::reacts_to<atoms::cl_await_atom, uint64_t>, // the timer of an await's timeout
    caf::replies_to<atoms::cl_leave_atom>::with<bool>,
    caf::replies_to<atoms::cl_register_atom, std::string, caf::actor>::with<bool>,
    caf::replies_to<atoms::cl_unregister_atom, std::string>::with<bool>,
    caf::replies_to<atoms::cl_whereis_atom, std::string>::with<caf::actor>,
    caf::replies_to<atoms::cl_names_atom>::with<std::vector<global_name>>>;

/// Returns the key of the node's directory in CAF's actor registry.
[[nodiscard]] constexpr caf::atom_value cluster_directory_key() noexcept {
  return caf::atom("t_cluster");
}

} // namespace troupe
