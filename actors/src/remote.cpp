// Remote work: running registered bodies on other nodes (the caller's side), choosing
// nodes for placements, remote supervised children, and the spawner that runs bodies on
// behalf of other nodes.

#include "troupe/actors/remote.hpp"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <random>
#include <set>
#include <unordered_map>

#include <caf/actor_registry.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include "troupe/actors/detail/spawner.hpp"
#include "troupe/actors/detail/task_actor.hpp"
#include "troupe/messages/cluster.hpp"

namespace troupe::detail {

using namespace troupe::atoms;

namespace {

caf::expected<directory_actor> directory_in(caf::actor_system& sys) {
  auto ptr = sys.registry().get(cluster_directory_key());
  if (!ptr)
    return make_error(errc::cluster_unavailable, "cluster.node",
                      "this runtime is not a cluster node (no cluster.node configured)");
  return caf::actor_cast<directory_actor>(ptr);
}

/// A run key unique across the cluster with overwhelming probability: a random salt per
/// process plus a counter.
uint64_t next_key() noexcept {
  static const uint64_t salt = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  static std::atomic<uint64_t> n{0};
  return salt + n.fetch_add(1, std::memory_order_relaxed);
}

/// How long a task that stopped awaiting a remote run waits for that run's end beyond the
/// grace it gave it: the run's node answers at once unless it is silent (a stalled
/// connection; a node seen down answers through its proxy's end).
constexpr auto remote_cancel_slack = std::chrono::seconds{5};

/// Cancels a remote run whose caller stopped waiting (its task was cancelled: the frame
/// unwinds or is destroyed at the `co_await`). A graceful cancel passes on as one, with the
/// grace the caller has left; a forced one forces. Structured: the caller's task ends once
/// the run has ended (the spawner answers the cancel then), so what the run held on its
/// node (a wait in a queue, a lock) is given back before the caller's scope, deadline or
/// cancel returns; at most the grace plus `remote_cancel_slack` when the node is silent.
struct cancel_on_unwind {
  caf::actor spawner;
  uint64_t key = 0;
  task_actor* owner = nullptr; // the task that awaits the run
  bool armed = true;
  ~cancel_on_unwind() {
    if (!armed || !spawner) return;
    auto mode = cancel_mode::force();
    // Unwinding in the body (a graceful cancel's throw): the grace it has left. Destroyed
    // from outside the body (a forced stop): forced.
    if (owner != nullptr && task_actor::current() == owner)
      if (auto left = owner->grace_left()) mode = cancel_mode::graceful(*left);
    if (owner == nullptr || !owner->hold_end()) {
      caf::anon_send(spawner, rs_cancel_atom::value, key, mode);
      return;
    }
    auto bound = std::chrono::duration_cast<caf::timespan>(remote_cancel_slack);
    if (mode.is_bounded_grace()) bound += caf::timespan{mode.grace_ns};
    auto* o = owner;
    o->request(spawner, bound, rs_cancel_atom::value, key, mode)
        .then([o](bool) { o->release_end(); }, [o](caf::error&) { o->release_end(); });
  }
};

/// The members of `members` that are up and may take work under `where`, in preference
/// order (the listed order, or the member list's order), without `exclude`.
std::vector<std::string> up_candidates(const std::vector<member_state>& members,
                                       const placement& where,
                                       const std::vector<std::string>& exclude) {
  auto usable = [&](const std::string& n) {
    if (std::find(exclude.begin(), exclude.end(), n) != exclude.end()) return false;
    for (auto& m : members)
      if (m.info.name == n) return m.status == member_status::up;
    return false;
  };
  std::vector<std::string> out;
  if (where.nodes.empty()) {
    for (auto& m : members)
      if (usable(m.info.name)) out.push_back(m.info.name);
    std::sort(out.begin(), out.end()); // the same order on every node
  } else {
    for (auto& n : where.nodes)
      if (usable(n) && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
  return out;
}

caf::error none_available(const placement& where) {
  std::string which = "every member";
  if (!where.nodes.empty()) {
    which.clear();
    for (auto& n : where.nodes)
      which += (which.empty() ? "" : ", ") + n;
  }
  return make_error(errc::no_node_available, "placement",
                    "no member of the placement (" + which + ") is up");
}

/// The spawners this process found, per runtime and node: a weak reference each (a node's
/// spawner is stable while the node runs), so a run needs no directory lookup; dropped when
/// a run there fails.
struct spawner_cache {
  std::mutex mtx;
  std::map<std::pair<const caf::actor_system*, std::string>, caf::weak_actor_ptr> entries;

  caf::actor find(const caf::actor_system* sys, const std::string& node) {
    std::lock_guard<std::mutex> guard{mtx};
    auto i = entries.find({sys, node});
    if (i == entries.end()) return {};
    auto strong = i->second.lock();
    // Gone, or a runtime's system at a reused address: look it up again.
    if (!strong || strong->home_system != sys) {
      entries.erase(i);
      return {};
    }
    return caf::actor_cast<caf::actor>(std::move(strong));
  }
  void put(const caf::actor_system* sys, const std::string& node, const caf::actor& a) {
    std::lock_guard<std::mutex> guard{mtx};
    entries[{sys, node}] = caf::actor_cast<caf::weak_actor_ptr>(a);
  }
  void drop(const caf::actor_system* sys, const std::string& node) {
    std::lock_guard<std::mutex> guard{mtx};
    entries.erase({sys, node});
  }
};

spawner_cache& spawners() {
  static spawner_cache x;
  return x;
}

task<caf::expected<spawner_actor>> find_spawner(context& cx, std::string node) {
  auto* sys = &cx.self()->home_system();
  if (auto cached = spawners().find(sys, node))
    co_return caf::actor_cast<spawner_actor>(std::move(cached));
  auto dir = directory_in(*sys);
  if (!dir) co_return std::move(dir.error());
  auto a = co_await cx.request(*dir, cl_whereis_atom::value, spawner_name(node));
  if (a && *a) {
    spawners().put(sys, node, *a);
    co_return caf::actor_cast<spawner_actor>(std::move(*a));
  }
  // Why not: no such member, or it is down.
  auto members = co_await cx.request(*dir, cl_state_atom::value);
  if (!members) co_return std::move(members.error());
  for (auto& m : *members) {
    if (m.info.name != node) continue;
    if (m.status == member_status::up)
      co_return make_error(errc::node_unreachable, "node",
                           node + " is up but its spawner is not known here yet");
    co_return make_error(errc::node_down, "node", node + " is " + to_string(m.status) +
                                                      (m.reason.empty() ? "" : " (" + m.reason + ")"));
  }
  co_return make_error(errc::unknown_node, "node", "no member is named \"" + node + "\"");
}

} // namespace

task<remote_outcome> run_on_node(context& cx, std::string node, std::string body,
                                 caf::message args) {
  auto* sys = &cx.self()->home_system();
  for (int attempt = 0;; ++attempt) {
    auto sp = co_await find_spawner(cx, node);
    if (!sp) co_return remote_outcome{caf::message{}, std::move(sp.error())};
    cancel_on_unwind guard{caf::actor_cast<caf::actor>(*sp), next_key(), task_actor::current()};
    auto r = co_await cx.request(*sp, rs_run_atom::value, guard.key, body, args);
    guard.armed = false;
    if (r) co_return std::move(*r);
    spawners().drop(sys, node);
    // A spawner that no longer exists (its proxy ended before the request went out): the
    // run never started, so one fresh lookup may find the node's new spawner (a restarted
    // node); otherwise its node stopped or went away, as a node_down while waiting.
    if (r.error() == caf::sec::request_receiver_down) {
      if (attempt == 0) continue;
      co_return remote_outcome{caf::message{},
                               make_error(errc::node_down, "node",
                                          node + " is gone (its spawner no longer exists)")};
    }
    co_return remote_outcome{caf::message{}, std::move(r.error())};
  }
}

task<void> settle_node_down(context& cx, std::string node) {
  auto dir = directory_in(cx.self()->home_system());
  if (!dir) co_return;
  auto members = co_await cx.request(*dir, cl_state_atom::value);
  if (!members) co_return;
  for (auto& m : *members)
    if (m.info.name == node && m.status != member_status::up) co_return; // it knows
  // A broken connection reaches the directory at about the time it failed the run; a
  // silent node, within the failure timeout (bounded here in case it is longer).
  (void)co_await cx.request(*dir, cl_await_atom::value, std::move(node), member_status::down,
                            int64_t{5000});
}

task<caf::expected<std::string>> pick_node(context& cx, placement where, uint64_t turn,
                                           std::vector<std::string> exclude) {
  auto dir = directory_in(cx.self()->home_system());
  if (!dir) co_return std::move(dir.error());
  auto members = co_await cx.request(*dir, cl_state_atom::value);
  if (!members) co_return std::move(members.error());
  auto cands = up_candidates(*members, where, exclude);
  if (cands.empty()) co_return none_available(where);
  co_return cands[turn % cands.size()];
}

// -- the spawner ----------------------------------------------------------------------------

namespace {

struct spawner_state {
  static inline const char* name = "troupe.spawner";
  caf::actor_system* sys = nullptr;
  task_env* env = nullptr;
  directory_actor directory;
  /// A run for another node: its promise, its task, who asked.
  struct run {
    caf::typed_response_promise<remote_outcome> rp;
    caf::actor task;
    caf::actor_addr requester;
    /// Cancelled at its caller's word (`rs_cancel`, the caller gone); else only this
    /// node's stop cancels a run.
    bool cancel_asked = false;
    /// Cancelled gracefully with a bounded grace: its own timer forces it, so its caller's
    /// end does not.
    bool under_grace = false;
    /// Cancels asked by the caller, answered once the run's task has ended.
    std::vector<caf::typed_response_promise<bool>> cancellers;
  };
  std::unordered_map<uint64_t, run> runs;
  std::map<caf::actor_addr, uint64_t> run_of_task;
  std::map<caf::actor_addr, std::set<uint64_t>> runs_of_requester;
  /// A child started for a supervisor: its actor and the supervisor's node (incarnation).
  struct child {
    caf::actor actor;
    std::string owner;
    uint64_t owner_incarnation = 0;
  };
  std::map<caf::actor_addr, child> children;
  /// Runs that reported their end while a cancel waits: answered when the task is gone.
  std::map<caf::actor_addr, std::vector<caf::typed_response_promise<bool>>> ending;
  uint64_t events_after = 0;
};

using spawner_impl = caf::stateful_actor<spawner_state, spawner_actor::base>;

caf::error no_body(const std::string& body, const std::string& node) {
  return make_error(errc::unknown_body, "body",
                    "no body \"" + body + "\" is registered on node " + node);
}

void forget_run(spawner_impl* self, uint64_t key) {
  auto& st = self->state;
  auto i = st.runs.find(key);
  if (i == st.runs.end()) return;
  for (auto& rp : i->second.cancellers)
    rp.deliver(true);
  st.run_of_task.erase(i->second.task.address());
  auto r = st.runs_of_requester.find(i->second.requester);
  if (r != st.runs_of_requester.end()) {
    r->second.erase(key);
    if (r->second.empty()) {
      self->demonitor(i->second.requester);
      st.runs_of_requester.erase(r);
    }
  }
  st.runs.erase(i);
}

void poll_events(spawner_impl* self) {
  self->request(self->state.directory, caf::infinite, cl_events_atom::value,
                self->state.events_after)
      .then(
          [self](std::vector<cluster_event>& evs) {
            if (evs.empty()) return; // the directory stopped
            auto& st = self->state;
            for (auto& ev : evs) {
              st.events_after = ev.seq;
              if (ev.kind != cluster_event_kind::member_down &&
                  ev.kind != cluster_event_kind::member_left)
                continue;
              // No remote child outlives the node of its supervisor (that incarnation: the
              // children a restarted owner started since stay).
              for (auto& [addr, c] : st.children)
                if (c.owner == ev.node && c.owner_incarnation == ev.incarnation)
                  task_actor::send_cancel(c.actor, cancel_mode::force());
            }
            poll_events(self);
          },
          [](caf::error&) {});
}

spawner_actor::behavior_type spawner(spawner_impl* self, task_env* env, directory_actor dir) {
  auto& st = self->state;
  st.sys = &self->home_system();
  st.env = env;
  st.directory = std::move(dir);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (auto e = st.ending.find(dm.source); e != st.ending.end()) {
      for (auto& rp : e->second)
        rp.deliver(true);
      st.ending.erase(e);
    } else if (auto t = st.run_of_task.find(dm.source); t != st.run_of_task.end()) {
      auto key = t->second;
      auto& r = st.runs[key];
      // The task ended without reporting: it was cancelled at the caller's word, or this
      // node stops (for the caller, its node goes away while it waits: node_down).
      bool cancelled = !dm.reason || is_cancellation(dm.reason) ||
                       dm.reason == caf::exit_reason::user_shutdown ||
                       dm.reason == caf::exit_reason::kill;
      auto err = !cancelled ? dm.reason
                 : r.cancel_asked
                     ? make_error(errc::cancelled, "task",
                                  "the remote run was cancelled before it ended")
                     : make_error(errc::node_down, "node",
                                  "node " + st.env->node + " stopped while the run was under way");
      r.rp.deliver(std::move(err));
      forget_run(self, key);
    } else if (auto q = st.runs_of_requester.find(dm.source); q != st.runs_of_requester.end()) {
      // Whoever waited is gone (its task ended, its node went away): stop its runs.
      for (auto key : q->second)
        if (auto i = st.runs.find(key); i != st.runs.end() && !i->second.under_grace) {
          i->second.cancel_asked = true;
          task_actor::send_cancel(i->second.task, cancel_mode::force());
        }
      st.runs_of_requester.erase(q);
    } else {
      st.children.erase(dm.source);
    }
  });
  poll_events(self);
  return {
      [self](rs_run_atom, uint64_t key, std::string& body,
             caf::message& args) -> caf::result<remote_outcome> {
        auto& st = self->state;
        const remote_body_fn* fn = st.env->bodies ? st.env->bodies->find(body) : nullptr;
        if (fn == nullptr) return no_body(body, st.env->node);
        if (st.runs.count(key) != 0)
          return make_error(errc::invalid_argument, "key", "a run with this key is running");
        auto rp = self->make_response_promise<remote_outcome>();
        auto me = caf::actor_cast<caf::actor_addr>(self);
        auto r = make_runner([f = *fn, args = std::move(args), me, key](context& cx) -> task<void> {
          remote_outcome out;
          try {
            out = co_await f(cx, args);
          } catch (const task_cancelled&) {
            throw; // reported by the spawner's monitor
          } catch (...) {
            out.err = error_from_current_exception("body");
          }
          if (auto sp = caf::actor_cast<caf::actor>(me))
            caf::anon_send(sp, rs_done_atom::value, key, std::move(out));
        });
        spawn_options opts;
        opts.name = body;
        auto h = task_actor::spawn_root(*st.sys, st.env, std::move(r), std::move(opts),
                                        std::shared_ptr<root_slot>{});
        auto requester = caf::actor_cast<caf::actor_addr>(self->current_sender());
        self->monitor(h->actor);
        // Nobody awaits the task (its outcome travels as `rs_done`): it quits once done, so
        // that a cancelled run's end reaches the monitor (and its cancellers), and its actor
        // is not kept by the run's entry.
        caf::anon_send(h->actor, cancel_atom::value, cancel_mode::wait());
        st.run_of_task[h->actor.address()] = key;
        if (requester) {
          auto& keys = st.runs_of_requester[requester];
          if (keys.empty()) self->monitor(requester);
          keys.insert(key);
        }
        st.runs.emplace(key, spawner_state::run{rp, h->actor, requester, false, false, {}});
        return rp;
      },
      [self](rs_cancel_atom, uint64_t key, cancel_mode mode) -> caf::result<bool> {
        mode = mode.normalized(); // from another node
        auto& st = self->state;
        auto i = st.runs.find(key);
        if (i == st.runs.end()) return false; // ended already, or never started
        i->second.cancel_asked = true;
        i->second.under_grace = mode.is_bounded_grace();
        task_actor::send_cancel(i->second.task, mode);
        auto rp = self->make_response_promise<bool>();
        i->second.cancellers.push_back(rp);
        return rp;
      },
      [self](rs_start_atom, std::string& owner, uint64_t owner_incarnation, std::string& body,
             caf::message& args, std::string& name) -> caf::result<caf::actor> {
        auto& st = self->state;
        const remote_body_fn* fn = st.env->bodies ? st.env->bodies->find(body) : nullptr;
        if (fn == nullptr) return no_body(body, st.env->node);
        auto r = make_runner([f = *fn, args = std::move(args)](context& cx) -> task<void> {
          auto out = co_await f(cx, args);
          if (out.err) throw task_error{out.err}; // a failure of the child
        });
        auto a = task_actor::spawn_supervised(*st.sys, st.env, std::move(r),
                                              name.empty() ? body : name);
        if (st.env->owner != nullptr) st.env->owner->adopt(a); // the stop reaches it
        self->monitor(a);
        st.children.emplace(a.address(),
                            spawner_state::child{a, std::move(owner), owner_incarnation});
        return a;
      },
      [self](rs_bodies_atom) {
        auto* b = self->state.env->bodies.get();
        return b != nullptr ? b->names() : std::vector<std::string>{};
      },
      [self](rs_done_atom, uint64_t key, remote_outcome& out) {
        auto& st = self->state;
        auto i = st.runs.find(key);
        if (i == st.runs.end()) return;
        i->second.rp.deliver(std::move(out));
        if (i->second.cancellers.empty()) {
          self->demonitor(i->second.task);
        } else {
          // The body returned as the cancel came: the cancel is answered once its task is
          // gone (it gives back what it held as it ends).
          st.ending[i->second.task.address()] = std::move(i->second.cancellers);
          i->second.cancellers.clear();
        }
        forget_run(self, key);
      },
  };
}

} // namespace

spawner_actor spawn_spawner(caf::actor_system& sys, task_env* env, directory_actor dir) {
  return sys.spawn(spawner, env, std::move(dir));
}

} // namespace troupe::detail

namespace troupe {

start_fn remote_child(std::string body, caf::message args, placement where,
                      remote_child_options opts) {
  auto turns = std::make_shared<std::atomic<uint64_t>>(0);
  return [body = std::move(body), args = std::move(args), where = std::move(where),
          opts = std::move(opts), turns](caf::actor_system& sys) -> start_result {
    using namespace troupe::atoms;
    auto dir = detail::directory_in(sys);
    if (!dir) return std::move(dir.error());
    caf::scoped_actor self{sys};
    auto timeout = std::chrono::milliseconds{std::max<int64_t>(1, opts.start_timeout_ms)};
    std::vector<member_state> members;
    caf::error err;
    self->request(*dir, timeout, cl_state_atom::value)
        .receive([&](std::vector<member_state>& m) { members = std::move(m); },
                 [&](caf::error& e) { err = std::move(e); });
    if (err) return err;
    std::string me;
    uint64_t my_incarnation = 0;
    for (auto& m : members)
      if (m.self) {
        me = m.info.name;
        my_incarnation = m.info.incarnation;
      }
    auto cands = detail::up_candidates(members, where, {});
    if (cands.empty()) return detail::none_available(where);
    size_t first = where.nodes.empty() ? turns->fetch_add(1) % cands.size() : 0;
    caf::error last;
    for (size_t k = 0; k < cands.size(); ++k) {
      const auto& node = cands[(first + k) % cands.size()];
      caf::actor sp;
      self->request(*dir, timeout, cl_whereis_atom::value, spawner_name(node))
          .receive([&](caf::actor& a) { sp = std::move(a); },
                   [&](caf::error& e) { last = std::move(e); });
      if (!sp) continue;
      caf::actor child;
      self->request(caf::actor_cast<spawner_actor>(sp), timeout, rs_start_atom::value, me,
                    my_incarnation, body, args, opts.name)
          .receive([&](caf::actor& a) { child = std::move(a); },
                   [&](caf::error& e) { last = std::move(e); });
      if (child) return std::optional<caf::actor>{std::move(child)};
    }
    return last ? last : detail::none_available(where);
  };
}

} // namespace troupe
