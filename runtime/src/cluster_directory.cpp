#include "cluster_directory.hpp"

#include <algorithm>
#include <deque>
#include <functional>
#include <optional>
#include <map>
#include <random>
#include <set>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <mutex>
#include <netinet/in.h>
#include <sys/socket.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <caf/actor_registry.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/io/basp/instance.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "troupe/messages/errc.hpp"

namespace troupe::detail {

namespace {

using namespace troupe::atoms;

/// The events a directory keeps for subscribers (older ones go).
constexpr size_t max_events = 4096;

/// The longest wait between two attempts to reach a member that is down.
constexpr int64_t max_retry_ms = 30'000;

/// Every this many heartbeats, a node tells each member every member it knows (so that a
/// gossip lost to a broken connection is repeated).
constexpr uint64_t gossip_every = 10;

struct peer {
  member_info info;
  member_status status = member_status::down;
  directory_actor handle;
  /// The runtime clock's milliseconds (`now_ms`) of the last message from it.
  int64_t last_heard = -1;
  int64_t since = 0;
  std::string reason;
  /// While down: when to try to reach it again, and the delay after that (doubling from
  /// one heartbeat up to `max_retry_ms`: a member gone for good costs little).
  int64_t next_retry = 0;
  int64_t retry_delay = 0;
};

struct member_waiter {
  uint64_t id;
  std::string node;
  member_status status;
  caf::typed_response_promise<member_state> rp;
  clock::timer_id timer = 0;
};

struct event_waiter {
  uint64_t after;
  caf::typed_response_promise<std::vector<cluster_event>> rp;
};

struct directory_state {
  directory_settings s;
  member_info self;
  std::map<std::string, peer> peers;
  /// `host:port` of the connections being opened (one attempt at a time per address).
  std::set<std::string> connecting;
  std::map<std::string, global_name> names;
  std::deque<cluster_event> events;
  uint64_t next_seq = 1;
  std::vector<event_waiter> event_waiters;
  /// Actors that receive every event as it happens (`cl_subscribe_atom`).
  std::vector<caf::actor> subscribers;
  std::vector<member_waiter> member_waiters;
  uint64_t next_waiter = 1;
  uint64_t lamport = 0;
  uint64_t ticks = 0;
  bool started = false;
  bool leaving = false;
  /// A leave that waits for the joins under way to end before it says goodbye.
  std::optional<caf::typed_response_promise<bool>> leave_rp;

  static inline const char* name = "troupe.cluster_directory";
};

using dir_ptr = directory_actor::stateful_pointer<directory_state>;

int64_t now(dir_ptr self) {
  return self->state.s.clk->now_ms();
}

/// The runtime clock's wall milliseconds of the monotonic instant `mono`.
int64_t wall_of(dir_ptr self, int64_t mono) {
  if (mono < 0) return -1;
  auto* clk = self->state.s.clk;
  return clk->wall_ms() - (clk->now_ms() - mono);
}

std::string address_key(const std::string& host, uint16_t port) {
  return host + ":" + std::to_string(port);
}

member_state state_of(dir_ptr self, const peer& p) {
  member_state out;
  out.info = p.info;
  out.status = p.status;
  out.last_heard_ms = wall_of(self, p.last_heard);
  out.since_ms = wall_of(self, p.since);
  out.reason = p.reason;
  return out;
}

member_state self_state(dir_ptr self) {
  member_state out;
  out.info = self->state.self;
  out.status = member_status::up;
  out.self = true;
  out.last_heard_ms = self->state.s.clk->wall_ms();
  return out;
}

void deliver_events(dir_ptr self) {
  auto& st = self->state;
  auto& ws = st.event_waiters;
  for (auto i = ws.begin(); i != ws.end();) {
    std::vector<cluster_event> out;
    for (auto& e : st.events)
      if (e.seq > i->after) out.push_back(e);
    if (out.empty()) {
      ++i;
      continue;
    }
    i->rp.deliver(std::move(out));
    i = ws.erase(i);
  }
}

/// Answers the waiters for `p`'s name whose status it now has.
void deliver_members(dir_ptr self, const peer& p) {
  auto& ws = self->state.member_waiters;
  for (auto i = ws.begin(); i != ws.end();) {
    if (i->node != p.info.name || i->status != p.status) {
      ++i;
      continue;
    }
    if (i->timer != 0) self->state.s.clk->cancel(i->timer);
    i->rp.deliver(state_of(self, p));
    i = ws.erase(i);
  }
}

void emit(dir_ptr self, cluster_event_kind kind, std::string node, std::string detail,
          uint64_t incarnation) {
  auto& st = self->state;
  cluster_event e;
  e.seq = st.next_seq++;
  e.at_ms = st.s.clk->wall_ms();
  e.kind = kind;
  e.node = std::move(node);
  e.detail = std::move(detail);
  e.incarnation = incarnation;
  for (auto& sub : st.subscribers)
    caf::anon_send(sub, e); // a typed actor sends to untyped ones anonymously
  st.events.push_back(std::move(e));
  if (st.events.size() > max_events) st.events.pop_front();
  deliver_events(self);
}

std::vector<global_name> names_of(dir_ptr self) {
  std::vector<global_name> out;
  for (auto& kvp : self->state.names)
    out.push_back(kvp.second);
  return out;
}

/// Forgets the names node `node` registered (it went down or left, or restarted).
void drop_names_of(dir_ptr self, const std::string& node) {
  auto& names = self->state.names;
  for (auto i = names.begin(); i != names.end();)
    i = i->second.node == node ? names.erase(i) : std::next(i);
}

bool wins(const global_name& a, const global_name& b) {
  return std::tie(a.stamp, a.node) < std::tie(b.stamp, b.node);
}

/// Merges a registration from another node: of two for one name, the smaller (stamp,
/// node) wins on every node; a node whose registration lost records `name_lost`.
void merge_name(dir_ptr self, global_name e) {
  auto& st = self->state;
  st.lamport = std::max(st.lamport, e.stamp);
  // This node is the authority on its own names: a copy coming back from another node is
  // either what it has, or stale (unregistered meanwhile, its actor ended).
  if (e.node == st.self.name) return;
  auto p = st.peers.find(e.node);
  if (p == st.peers.end() || p->second.status != member_status::up) return; // gone already
  auto i = st.names.find(e.name);
  if (i == st.names.end()) {
    st.names.emplace(e.name, std::move(e));
    return;
  }
  auto& cur = i->second;
  if (cur.node == e.node) {
    // Two of one node: that node is the authority on its names, and its stamps grow. The
    // newer replaces a stale copy whose drop this node missed (it came while the node was
    // not up here yet); before, the stale one "won" until that node went down.
    if (e.stamp > cur.stamp) cur = std::move(e);
    return;
  }
  if (!wins(e, cur)) return;
  if (cur.node == st.self.name)
    emit(self, cluster_event_kind::name_lost, e.node,
         e.name + " (registered on node " + e.node + " first)", 0);
  cur = std::move(e);
}

void broadcast_up(dir_ptr self, const std::string& except, auto&&... xs) {
  for (auto& kvp : self->state.peers)
    if (kvp.second.status == member_status::up && kvp.first != except && kvp.second.handle)
      self->send(kvp.second.handle, xs...);
}

/// Sends `xs` as a request to every member that is up and answers `rp` (if any) true once
/// each has answered or `timeout` passed (a member that missed it learns it when it rejoins).
template <class... Ts>
void broadcast_acked(dir_ptr self, std::optional<caf::typed_response_promise<bool>> rp,
                     caf::timespan timeout, Ts... xs) {
  auto& st = self->state;
  std::vector<directory_actor> to;
  for (auto& kvp : st.peers)
    if (kvp.second.status == member_status::up && kvp.second.handle)
      to.push_back(kvp.second.handle);
  if (to.empty()) {
    if (rp) rp->deliver(true);
    return;
  }
  auto left = std::make_shared<size_t>(to.size());
  for (auto& h : to) {
    auto one = [rp, left]() mutable {
      if (--*left == 0 && rp) rp->deliver(true);
    };
    self->request(h, timeout, xs...).then([one](bool) mutable { one(); },
                                          [one](const caf::error&) mutable { one(); });
  }
}

/// The failure timeout, as CAF's request timeout.
caf::timespan failure_timeout(dir_ptr self) {
  return std::chrono::duration_cast<caf::timespan>(self->state.s.cfg.failure_timeout);
}

/// Says goodbye to every member that is up and answers the pending leave once they answered
/// (at most a second).
void finish_leave(dir_ptr self) {
  auto& st = self->state;
  if (!st.leave_rp) return;
  auto rp = std::move(*st.leave_rp);
  st.leave_rp.reset();
  broadcast_acked(self, std::move(rp),
                  std::min<caf::timespan>(std::chrono::seconds{1}, failure_timeout(self)),
                  cl_bye_atom::value, st.self.name, st.self.incarnation);
}

/// A join attempt ended (joined or failed): a leave that waited for it goes on.
void join_ended(dir_ptr self) {
  if (self->state.leave_rp && self->state.connecting.empty()) finish_leave(self);
}

/// Sends `dir` every name this node registered (merged there by the usual rule).
void announce_own_names(dir_ptr self, const directory_actor& dir) {
  auto& st = self->state;
  for (auto& kvp : st.names)
    if (kvp.second.node == st.self.name)
      self->request(dir, failure_timeout(self), cl_announce_atom::value, kvp.second)
          .then([](bool) {}, [](const caf::error&) {});
}

void set_status(dir_ptr self, peer& p, member_status status, std::string reason) {
  p.status = status;
  p.since = now(self);
  p.reason = std::move(reason);
  deliver_members(self, p);
}

void mark_gone(dir_ptr self, peer& p, member_status status, std::string reason);

/// Marks `p` up with `handle` (joined, or back); emits `member_up` unless it was up already.
void mark_up(dir_ptr self, const member_info& info, const directory_actor& handle) {
  auto& st = self->state;
  auto& p = st.peers[info.name];
  bool same = p.info.incarnation == info.incarnation;
  // A new incarnation of a node this one still sees up (it restarted and joined through
  // another member before this one timed the old one out): the old one is down first, so
  // what watches for its member_down (remote children's owners) stops its work.
  if (!same && p.info.incarnation != 0 && p.status == member_status::up)
    mark_gone(self, p, member_status::down, "replaced by a new incarnation");
  bool was_up = p.status == member_status::up && same && p.handle;
  if (!same && p.info.incarnation != 0) drop_names_of(self, info.name); // a restarted node
  if (p.handle && p.handle != handle) self->demonitor(p.handle.address());
  if (p.handle != handle) self->monitor(handle);
  p.info = info;
  p.handle = handle;
  p.last_heard = now(self);
  p.retry_delay = 0;
  p.next_retry = 0;
  if (was_up) return;
  set_status(self, p, member_status::up, "");
  emit(self, cluster_event_kind::member_up, info.name, "", info.incarnation);
}

void mark_gone(dir_ptr self, peer& p, member_status status, std::string reason) {
  if (p.handle) self->demonitor(p.handle.address());
  p.handle = nullptr;
  drop_names_of(self, p.info.name);
  auto detail = reason;
  set_status(self, p, status, std::move(reason));
  emit(self,
       status == member_status::left ? cluster_event_kind::member_left
                                     : cluster_event_kind::member_down,
       p.info.name, std::move(detail), p.info.incarnation);
}

void joined(dir_ptr self, const directory_actor& dir, join_reply& r);

/// Opens a connection to the directory at `host:port` and joins it (idempotent on both
/// sides). One attempt per address at a time; a failed one is retried by the heartbeat.
/// `done` (if any) hears the outcome: an empty error once joined.
void connect_and_join(dir_ptr self, const std::string& host, uint16_t port,
                      std::function<void(caf::error)> done = nullptr) {
  auto& st = self->state;
  auto key = address_key(host, port);
  auto fail = [&](std::string why) {
    if (done) done(make_error(errc::node_unreachable, "address", key + ": " + why));
  };
  if (st.leaving) return fail("this node is leaving");
  if (!st.started) return fail("this node has not started listening yet");
  if (key == address_key(st.self.host, st.self.port)) return fail("that is this node");
  if (!st.connecting.insert(key).second) return fail("a connection attempt is under way");
  auto timeout = failure_timeout(self);
  auto failed = [self, key, done](const caf::error& e) {
    self->state.connecting.erase(key);
    join_ended(self);
    if (done)
      done(is(e, errc::node_name_conflict)
               ? e
               : make_error(errc::node_unreachable, "address", key + ": " + self->system().render(e)));
  };
  self->request(st.s.mm, timeout, caf::connect_atom::value, host, port)
      .then(
          [self, key, timeout, done, failed](const caf::node_id& nid,
                                             const caf::strong_actor_ptr& ptr,
                                             const std::set<std::string>&) {
            if (!ptr || nid == self->node()) {
              self->state.connecting.erase(key);
              join_ended(self);
              if (done)
                done(make_error(errc::node_unreachable, "address",
                                key + (ptr ? ": that is this node" : ": no directory there")));
              return;
            }
            auto dir = caf::actor_cast<directory_actor>(ptr);
            self->request(dir, timeout, cl_join_atom::value, self->state.self, names_of(self))
                .then(
                    [self, key, dir, done](join_reply& r) {
                      self->state.connecting.erase(key);
                      joined(self, dir, r);
                      join_ended(self);
                      if (done) done(caf::error{});
                    },
                    failed);
          },
          failed);
}

/// A member the node heard of (a join reply, a gossip): the node with the smaller name
/// opens the connection, so that each pair connects once.
void consider(dir_ptr self, const member_info& m) {
  auto& st = self->state;
  if (m.name == st.self.name) return;
  auto i = st.peers.find(m.name);
  if (i != st.peers.end() && i->second.info.incarnation == m.incarnation &&
      i->second.status != member_status::down)
    return; // up already, or left (that incarnation never comes back)
  if (st.self.name < m.name) connect_and_join(self, m.host, m.port);
}

void joined(dir_ptr self, const directory_actor& dir, join_reply& r) {
  auto& st = self->state;
  if (st.leaving) {
    // A join that completes while this node leaves: that member added this node, so it
    // hears goodbye too (member_left, not member_down): in the goodbye that waits for the
    // joins under way, or at once when that one went out already.
    if (st.leave_rp)
      mark_up(self, r.self, dir);
    else
      self->request(dir, failure_timeout(self), cl_bye_atom::value, st.self.name,
                    st.self.incarnation)
          .then([](bool) {}, [](const caf::error&) {});
    return;
  }
  mark_up(self, r.self, dir);
  for (auto& m : r.members)
    consider(self, m);
  // Only the answering node's own names: a copy of a third node's name may be stale (that
  // node restarted, its drop never broadcast) and would outlive it here. Every node hears
  // each other node's names from that node (each pair joins once, and anti-entropy
  // re-announces them).
  for (auto& n : r.names)
    if (n.node == r.self.name) merge_name(self, std::move(n));
  // What this node registered after its join request left is not in that request.
  announce_own_names(self, dir);
}

std::vector<member_info> up_members(dir_ptr self, const std::string& except) {
  std::vector<member_info> out;
  for (auto& kvp : self->state.peers)
    if (kvp.second.status == member_status::up && kvp.first != except)
      out.push_back(kvp.second.info);
  return out;
}

void schedule_tick(dir_ptr self) {
  auto& st = self->state;
  st.s.clk->schedule(st.s.clk->now() + st.s.cfg.heartbeat, caf::actor_cast<caf::actor>(self),
                     caf::make_message(cl_tick_atom::value));
}

void tick(dir_ptr self) {
  auto& st = self->state;
  if (st.leaving) return;
  auto t = now(self);
  auto limit = st.s.cfg.failure_timeout.count();
  bool any_up = false;
  for (auto& kvp : st.peers) {
    auto& p = kvp.second;
    if (p.status == member_status::up) {
      if (t - p.last_heard > limit) {
        mark_gone(self, p, member_status::down,
                  "no heartbeat for " + std::to_string(t - p.last_heard) + " ms");
        continue;
      }
      any_up = true;
      self->send(p.handle, cl_beat_atom::value, st.self.name, st.self.incarnation);
    } else if (p.status == member_status::down && st.self.name < p.info.name &&
               t >= p.next_retry) {
      // Back after a partition or a restart? Tried again with a doubling delay.
      p.retry_delay = std::clamp<int64_t>(p.retry_delay * 2, st.s.cfg.heartbeat.count(),
                                          max_retry_ms);
      p.next_retry = t + p.retry_delay;
      connect_and_join(self, p.info.host, p.info.port);
    }
  }
  if (!any_up)
    for (auto& seed : st.s.cfg.seeds)
      connect_and_join(self, seed.host, seed.port);
  if (any_up && ++st.ticks % gossip_every == 0) {
    // Anti-entropy: the members, and this node's own names, again (a join or an announce
    // lost with a broken connection is repaired within `gossip_every` heartbeats).
    for (auto& kvp : st.peers) {
      if (kvp.second.status != member_status::up) continue;
      self->send(kvp.second.handle, cl_gossip_atom::value, up_members(self, kvp.first));
      announce_own_names(self, kvp.second.handle);
    }
  }
  schedule_tick(self);
}

void on_down(dir_ptr self, const caf::down_msg& dm) {
  auto& st = self->state;
  for (auto& kvp : st.peers) {
    auto& p = kvp.second;
    if (p.handle && p.handle.address() == dm.source) {
      if (p.status == member_status::up)
        mark_gone(self, p, member_status::down, "connection lost (" + to_string(dm.reason) + ")");
      return;
    }
  }
  // A subscriber ended.
  std::erase_if(st.subscribers, [&](const caf::actor& a) { return a.address() == dm.source; });
  // An actor registered by this node ended (or its node went): its names go, everywhere.
  for (auto i = st.names.begin(); i != st.names.end();) {
    auto& n = i->second;
    if (n.node == st.self.name && n.actor.address() == dm.source) {
      broadcast_acked(self, std::nullopt, failure_timeout(self), cl_drop_atom::value, n.name,
                      n.node, n.stamp);
      i = st.names.erase(i);
    } else {
      ++i;
    }
  }
}

directory_actor::behavior_type directory(dir_ptr self, directory_settings s) {
  auto& st = self->state;
  st.s = std::move(s);
  st.self.name = st.s.cfg.node;
  std::random_device rd;
  st.self.incarnation = (uint64_t{rd()} << 32 | rd()) | 1; // never 0
  self->set_down_handler([self](caf::down_msg& dm) { on_down(self, dm); });
  return {
      // -- node to node ------------------------------------------------------------------
      [self](cl_join_atom, member_info& info,
             std::vector<global_name>& names) -> caf::result<join_reply> {
        auto& st = self->state;
        if (st.leaving)
          return make_error(errc::node_unreachable, "node", st.self.name + " is leaving");
        // Published but not started: its own names (the before_join hooks', runtime.hpp)
        // are not all registered yet, and its address is not set. The joiner retries.
        if (!st.started)
          return make_error(errc::node_unreachable, "node",
                            st.self.name + " has not started yet");
        if (info.name == st.self.name)
          return make_error(errc::node_name_conflict, "node",
                            "\"" + info.name + "\" is the name of the node it joins");
        auto i = st.peers.find(info.name);
        if (i != st.peers.end() && i->second.status == member_status::up &&
            i->second.info.incarnation != info.incarnation &&
            now(self) - i->second.last_heard <= st.s.cfg.failure_timeout.count())
          return make_error(errc::node_name_conflict, "node",
                            "a node named \"" + info.name + "\" is up at " +
                                address_key(i->second.info.host, i->second.info.port));
        auto sender = caf::actor_cast<directory_actor>(self->current_sender());
        mark_up(self, info, sender);
        for (auto& n : names) // the joiner's own names only (see joined)
          if (n.node == info.name) merge_name(self, std::move(n));
        broadcast_up(self, info.name, cl_gossip_atom::value, std::vector<member_info>{info});
        return join_reply{st.self, up_members(self, info.name), names_of(self)};
      },
      [self](cl_gossip_atom, std::vector<member_info>& members) {
        for (auto& m : members)
          consider(self, m);
      },
      [self](cl_beat_atom, std::string& node, uint64_t incarnation) {
        auto& st = self->state;
        auto i = st.peers.find(node);
        if (i == st.peers.end() || i->second.info.incarnation != incarnation) return;
        auto& p = i->second;
        if (p.status == member_status::up)
          p.last_heard = now(self);
        else if (p.status == member_status::down) // it hears us again: join anew (names too)
          connect_and_join(self, p.info.host, p.info.port);
      },
      [self](cl_bye_atom, std::string& node, uint64_t incarnation) {
        auto& st = self->state;
        auto i = st.peers.find(node);
        if (i != st.peers.end() && i->second.info.incarnation == incarnation &&
            i->second.status != member_status::left)
          mark_gone(self, i->second, member_status::left, "left");
        return true;
      },
      [self](cl_announce_atom, global_name& n) {
        merge_name(self, std::move(n));
        return true;
      },
      [self](cl_drop_atom, std::string& name, std::string& node, uint64_t stamp) {
        auto& names = self->state.names;
        auto i = names.find(name);
        if (i != names.end() && i->second.node == node && i->second.stamp == stamp)
          names.erase(i);
        return true;
      },
      [self](cl_join_atom, std::string& host, uint16_t port) -> caf::result<bool> {
        auto rp = self->make_response_promise<bool>();
        connect_and_join(self, host, port, [rp](caf::error err) mutable {
          if (err)
            rp.deliver(std::move(err));
          else
            rp.deliver(true);
        });
        return rp;
      },
      // -- local -------------------------------------------------------------------------
      [self](cl_start_atom, uint16_t port) {
        auto& st = self->state;
        if (st.started) return;
        st.started = true;
        auto& adv = st.s.cfg.advertise;
        st.self.host = adv.host.empty() ? st.s.cfg.listen.host : adv.host;
        st.self.port = adv.port != 0 ? adv.port : port;
        for (auto& seed : st.s.cfg.seeds)
          connect_and_join(self, seed.host, seed.port);
        schedule_tick(self);
      },
      [self](cl_tick_atom) { tick(self); },
      [self](cl_state_atom) {
        std::vector<member_state> out{self_state(self)};
        for (auto& kvp : self->state.peers)
          out.push_back(state_of(self, kvp.second));
        return out;
      },
      [self](cl_events_atom, uint64_t after) -> caf::result<std::vector<cluster_event>> {
        auto& st = self->state;
        std::vector<cluster_event> out;
        for (auto& e : st.events)
          if (e.seq > after) out.push_back(e);
        if (!out.empty()) return out;
        auto rp = self->make_response_promise<std::vector<cluster_event>>();
        st.event_waiters.push_back({after, rp});
        return rp;
      },
      [self](cl_subscribe_atom, caf::actor& who, bool replay) -> caf::result<bool> {
        auto& st = self->state;
        if (!who) return make_error(errc::invalid_argument, "actor", "an empty actor handle");
        for (auto& a : st.subscribers)
          if (a == who) return false;
        if (replay)
          for (auto& e : st.events)
            caf::anon_send(who, e);
        self->monitor(who);
        st.subscribers.push_back(std::move(who));
        return true;
      },
      [self](cl_unsubscribe_atom, caf::actor_addr& who) {
        auto n = std::erase_if(self->state.subscribers,
                               [&](const caf::actor& a) { return a.address() == who; });
        return n > 0;
      },
      [self](cl_await_atom, std::string& node, member_status status,
             int64_t timeout_ms) -> caf::result<member_state> {
        auto& st = self->state;
        if (node == st.self.name) {
          if (status == member_status::up) return self_state(self);
          return make_error(errc::invalid_argument, "node",
                            "\"" + node + "\" is this node, which is up");
        }
        auto i = st.peers.find(node);
        if (i != st.peers.end() && i->second.status == status) return state_of(self, i->second);
        auto rp = self->make_response_promise<member_state>();
        member_waiter w{st.next_waiter++, node, status, rp};
        if (timeout_ms >= 0)
          w.timer = st.s.clk->schedule(
              st.s.clk->now() + std::chrono::milliseconds{timeout_ms},
              caf::actor_cast<caf::actor>(self),
              caf::make_message(cl_await_atom::value, w.id));
        st.member_waiters.push_back(std::move(w));
        return rp;
      },
      [self](cl_await_atom, uint64_t id) {
        auto& st = self->state;
        auto& ws = st.member_waiters;
        auto i = std::find_if(ws.begin(), ws.end(), [id](auto& w) { return w.id == id; });
        if (i == ws.end()) return;
        auto p = st.peers.find(i->node);
        std::string now_is = p == st.peers.end() ? "unknown to this node"
                                                 : std::string{"it is "} + to_string(p->second.status);
        i->rp.deliver(make_error(errc::deadline_exceeded, "node",
                                 "member \"" + i->node + "\" was not " + to_string(i->status) +
                                     " in time (" + now_is + ")"));
        ws.erase(i);
      },
      [self](cl_leave_atom) -> caf::result<bool> {
        auto& st = self->state;
        if (st.leaving) return true;
        auto rp = self->make_response_promise<bool>();
        st.leaving = true;
        // Every member hears goodbye; the node waits at most a second for their answers.
        // A join under way first ends (bounded by its request timeouts): the node it joins
        // has added this one already and hears goodbye too.
        st.leave_rp = rp;
        if (st.connecting.empty()) finish_leave(self);
        return rp;
      },
      [self](cl_register_atom, std::string& name, caf::actor& who) -> caf::result<bool> {
        auto& st = self->state;
        if (name.empty()) return make_error(errc::invalid_name, "name", "an empty cluster name");
        if (!who) return make_error(errc::invalid_argument, "actor", "an empty actor handle");
        if (st.leaving)
          return make_error(errc::node_unreachable, "node", st.self.name + " is leaving");
        auto i = st.names.find(name);
        if (i != st.names.end()) {
          if (i->second.actor == who) return false;
          return make_error(errc::name_taken, "name",
                            "\"" + name + "\" is held by an actor of node " + i->second.node);
        }
        global_name n{name, who, st.self.name, ++st.lamport};
        st.names.emplace(name, n);
        // Monitored wherever it lives: a name goes when its actor ends, or its node goes
        // (a remote actor's monitor fires on either; before, only local ones were watched
        // and a name for an actor of another node outlived it).
        self->monitor(who);
        auto rp = self->make_response_promise<bool>();
        broadcast_acked(self, rp, failure_timeout(self), cl_announce_atom::value, n);
        return rp;
      },
      [self](cl_unregister_atom, std::string& name) -> caf::result<bool> {
        auto& st = self->state;
        auto i = st.names.find(name);
        if (i == st.names.end() || i->second.node != st.self.name) return false;
        auto stamp = i->second.stamp;
        st.names.erase(i);
        auto rp = self->make_response_promise<bool>();
        broadcast_acked(self, rp, failure_timeout(self), cl_drop_atom::value, name,
                        st.self.name, stamp);
        return rp;
      },
      [self](cl_whereis_atom, std::string& name) -> caf::result<caf::actor> {
        auto& names = self->state.names;
        auto i = names.find(name);
        if (i == names.end())
          return make_error(errc::unknown_name, "name", "no actor holds \"" + name + "\"");
        return i->second.actor;
      },
      [self](cl_names_atom) { return names_of(self); },
  };
}

} // namespace

caf::expected<cluster_node>
start_cluster_node(caf::actor_system& sys, const cluster_config& cfg, troupe::clock* clk,
                   std::function<caf::error(const directory_actor&, uint16_t port)> before_join) {
  directory_settings s;
  s.cfg = cfg;
  s.clk = clk;
  s.mm = cfg.tls() ? sys.openssl_manager().actor_handle() : sys.middleman().actor_handle();
  auto dir = sys.spawn(directory, std::move(s));
  auto port = cfg.tls() ? caf::openssl::publish(dir, cfg.listen.port, cfg.listen.host.c_str(), true)
                        : sys.middleman().publish(dir, cfg.listen.port, cfg.listen.host.c_str(), true);
  if (!port) {
    caf::anon_send_exit(dir, caf::exit_reason::kill);
    return make_error(errc::runtime_start_failed, "cluster.listen",
                      "cannot listen on " + address_key(cfg.listen.host, cfg.listen.port) + ": " +
                          sys.render(port.error()));
  }
  sys.registry().put(cluster_directory_key(), caf::actor_cast<caf::strong_actor_ptr>(dir));
  if (before_join) {
    if (auto err = before_join(dir, *port)) {
      sys.registry().erase(cluster_directory_key());
      caf::anon_send_exit(dir, caf::exit_reason::kill);
      return err;
    }
  }
  caf::anon_send(dir, cl_start_atom::value, *port);
  return cluster_node{dir, *port};
}

} // namespace troupe::detail

// -- CAF 0.17's TLS sessions and OpenSSL's per-thread error queue -----------------------------
//
// OpenSSL requires the calling thread's error queue to be empty before an SSL I/O call, or
// SSL_get_error() misreports: CAF 0.17's sessions (libcaf_openssl) never clear it, and all
// of a node's sessions run on one multiplexer thread. So one refused handshake (a rogue
// certificate, a client sending garbage) leaves errors that make the next "want read" of
// every healthy session look fatal, and the node drops all its TLS links at once. These
// definitions take the place of OpenSSL's four I/O entry points in a troupe program (the
// linker exports them, as libcaf_openssl refers to them) and clear the queue first, as the
// OpenSSL documentation requires, then call OpenSSL's own.

namespace {

template <class Fn>
Fn openssl_next(const char* name) noexcept {
  return reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, name));
}

struct refusal_sinks {
  std::mutex mtx;
  uint64_t next = 0;
  std::map<uint64_t, troupe::detail::tls_refusal_sink> sinks;
};

refusal_sinks& sinks() {
  static refusal_sinks x;
  return x;
}

std::string address_text(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {0};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* in = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof(host));
    port = ntohs(in->sin6_port);
  } else {
    return "unknown";
  }
  return std::string{host} + ":" + std::to_string(port);
}

/// Reports a handshake `ssl` refused (called with OpenSSL's error queue still filled).
void report_refusal(SSL* ssl, int rc) {
  int kind = SSL_get_error(ssl, rc);
  if (kind == SSL_ERROR_WANT_READ || kind == SSL_ERROR_WANT_WRITE) return; // in progress
  char reason[256] = "the connection closed during the handshake";
  if (auto code = ERR_peek_last_error(); code != 0) ERR_error_string_n(code, reason, sizeof(reason));
  int fd = SSL_get_fd(ssl);
  sockaddr_storage local{}, peer{};
  socklen_t len = sizeof(local);
  uint16_t local_port = 0;
  if (fd >= 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0)
    local_port = ntohs(local.ss_family == AF_INET6
                           ? reinterpret_cast<const sockaddr_in6*>(&local)->sin6_port
                           : reinterpret_cast<const sockaddr_in*>(&local)->sin_port);
  len = sizeof(peer);
  std::string who = fd >= 0 && ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0
                        ? address_text(peer)
                        : std::string{"a peer that closed the connection"};
  auto& x = sinks();
  std::lock_guard<std::mutex> guard{x.mtx};
  for (auto& [token, f] : x.sinks)
    f(local_port, who, reason);
}

} // namespace

namespace troupe::detail {

uint64_t add_tls_refusal_sink(tls_refusal_sink f) {
  auto& x = sinks();
  std::lock_guard<std::mutex> guard{x.mtx};
  x.sinks.emplace(++x.next, std::move(f));
  return x.next;
}

void remove_tls_refusal_sink(uint64_t token) {
  auto& x = sinks();
  std::lock_guard<std::mutex> guard{x.mtx};
  x.sinks.erase(token);
}

} // namespace troupe::detail

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static auto next = openssl_next<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return next != nullptr ? next(ssl, buf, num) : -1;
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static auto next = openssl_next<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return next != nullptr ? next(ssl, buf, num) : -1;
}

int SSL_accept(SSL* ssl) {
  static auto next = openssl_next<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  int rc = next != nullptr ? next(ssl) : -1;
  if (rc <= 0 && next != nullptr) report_refusal(ssl, rc); // a refused peer is logged
  return rc;
}

int SSL_connect(SSL* ssl) {
  static auto next = openssl_next<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return next != nullptr ? next(ssl) : -1;
}

} // extern "C"

// CAF 0.17's BASP entry point trusts a handshake header's payload length: a server or client
// handshake header that announces no payload makes it dereference a null payload, so anyone
// who reaches a plain TCP port could stop the process with 32 bytes. This definition takes
// the place of CAF's (libcaf_io's broker calls it through the PLT; the linker exports it
// from a troupe program): such a header is refused as malformed (the broker closes that
// connection, as for any malformed input); everything else goes to CAF's own.

namespace caf::io::basp {

connection_state instance::handle(execution_unit* ctx, new_data_msg& dm, header& hdr,
                                  bool is_payload) {
  using next_fn = connection_state (*)(instance*, execution_unit*, new_data_msg&, header&, bool);
  static auto next = reinterpret_cast<next_fn>(::dlsym(
      RTLD_NEXT, "_ZN3caf2io4basp8instance6handleEPNS_14execution_unitERNS0_12new_data_msgERNS1_6headerEb"));
  if (!is_payload) {
    header peek;
    binary_deserializer source{ctx, dm.buf};
    if (!source(peek) &&
        (peek.operation == message_type::server_handshake ||
         peek.operation == message_type::client_handshake) &&
        peek.payload_len == 0)
      return malformed_basp_message;
  }
  if (next == nullptr) return close_connection; // cannot happen: libcaf_io is loaded
  return next(this, ctx, dm, hdr, is_payload);
}

} // namespace caf::io::basp
