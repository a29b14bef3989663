#include "troupe/supervision/supervisor.hpp"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/response_promise.hpp>

#include "troupe/messages/errc.hpp"
#include "troupe/supervision/restart_budget.hpp"

namespace troupe {

namespace {

using namespace troupe::atoms;

/// A duration of 100 years or more never ends (and fits any clock arithmetic).
constexpr int64_t never_ms = int64_t{100} * 366 * 24 * 3600 * 1000;

constexpr int64_t default_worker_shutdown_ms = 5000;

/// Returns whether a child's exit reason is a failure: normal and shutdown exits (OTP's
/// `normal`, `shutdown` and `{shutdown, _}`: user_shutdown, with or without context) are
/// clean ends for every restart mode.
bool is_failure(const caf::error& reason) {
  if (!reason) return false;
  return !(reason.category() == caf::atom("exit") &&
           (reason.code() == static_cast<uint8_t>(caf::exit_reason::user_shutdown) ||
            reason.code() == static_cast<uint8_t>(caf::exit_reason::normal)));
}

int64_t shutdown_of(const child_spec& c, child_kind kind) {
  if (c.shutdown_ms) return *c.shutdown_ms;
  return kind == child_kind::supervisor ? infinity : default_worker_shutdown_ms;
}

child_kind kind_of(const child_spec& c) {
  if (c.kind) return *c.kind;
  return c.start.target<subtree_start>() != nullptr ? child_kind::supervisor : child_kind::worker;
}

struct child_rec {
  std::shared_ptr<const child_spec> spec; // a template child shares its supervisor's
  std::string name;
  caf::message args; // a template child's start arguments
  caf::actor actor;
  child_budget budget; // its own budget: restarts within spec->window_ms, half-open try
  std::string last_error;
  std::string wait_reason;
  std::vector<caf::response_promise> on_stopped; // terminate_child callers
  int64_t next_restart_ms = -1;
  uint64_t restarts = 0;
  uint64_t gen = 0;      // invalidates stale restart timers
  uint64_t kill_gen = 0; // the kill timer of the current termination
  troupe::clock::timer_id kill_timer = 0; // cancelled when the child stops in time
  uint64_t uid = 0;      // position (start order) and the name of the child in timers
  child_status status = child_status::stopped;
  child_kind kind = child_kind::worker;
  bool terminating = false;
  bool pending = false;       // restart when the group's terminations are done
  bool retry_pending = false; // a failed restart's retry message is on its way
  bool held = false;          // stopped by terminate_child: no restart until restart_child
  bool templated = false;     // a dynamic supervisor's child
  bool subtree = false;       // started by supervisor_child: relays its events to us

  [[nodiscard]] bool temporary() const noexcept { return spec->restart == restart_mode::never; }
  [[nodiscard]] bool due_to_restart() const noexcept {
    return pending || retry_pending || status == child_status::waiting ||
           status == child_status::circuit_open;
  }
};

class supervisor_actor final : public caf::event_based_actor {
 public:
  supervisor_actor(caf::actor_config& cfg, caf::actor_system* sys, troupe::clock* clk,
                   supervisor_spec spec, std::shared_ptr<supervisor_final> final,
                   caf::error* start_error)
      : caf::event_based_actor(cfg), sys_(sys), clk_(clk), final_(std::move(final)),
        name_(std::move(spec.name)), strategy_(spec.strategy), auto_shutdown_(spec.auto_shutdown),
        keep_ended_(spec.keep_ended_temporaries), budget_(spec.intensity, spec.period_ms) {
    if (spec.child_template) {
      auto& t = *spec.child_template;
      auto c = std::make_shared<child_spec>(spec_of(t));
      c->kind = c->kind.value_or(child_kind::worker);
      c->shutdown_ms = shutdown_of(*c, *c->kind);
      template_spec_ = std::move(c);
      template_start_ = std::move(t.start);
    }
    for (auto& c : spec.children)
      add_rec(std::make_shared<const child_spec>(std::move(c)));
    // OTP's start_link: the children start in order before the spawn returns, so that a
    // subtree that cannot start fails its parent's start instead of a restart loop.
    std::vector<uint64_t> ignored_temporaries;
    for (auto& [uid, k] : kids_) {
      auto err = start_child(k);
      if (!err) {
        if (!k.actor && k.temporary()) ignored_temporaries.push_back(uid); // OTP: not kept
        continue;
      }
      k.status = child_status::failed;
      event(supervisor_event_kind::failed, k.name, k.last_error);
      failed_start_ = start_failure(k, err);
      if (start_error != nullptr) *start_error = failed_start_;
      break;
    }
    for (auto uid : ignored_temporaries)
      forget(kids_.at(uid));
  }

  const char* name() const override { return "troupe.supervisor"; }

  void on_exit() override {
    // Dying any other way than through finish() (a kill, say): no child outlives us.
    for (auto& [uid, k] : kids_)
      if (k.actor) caf::anon_send_exit(k.actor, caf::exit_reason::kill);
    self_ref_ = nullptr;
  }

  caf::behavior make_behavior() override {
    // Deaths of children arrive as `sup_down_atom` messages from a functor attached to each
    // child (no links: a link's exit message can arrive after the notice of the same death,
    // and a link is dropped when the child receives our exit request); the message names
    // the child, so no lookup by actor is needed. It comes after every message the child
    // sent before it ended. on_exit takes the children along if we die.
    set_exit_handler([this](caf::exit_msg& em) { on_exit_msg(em); });
    become(caf::behavior{
        [this](sup_state_atom) { return state(); },
        [this](sup_events_atom) { return events_; },
        [this](sup_events_atom, uint64_t after) -> caf::result<std::vector<supervisor_event>> {
          if (!events_.empty() && events_.back().seq > after) return events_after(after);
          auto rp = make_response_promise();
          event_waiters_.emplace_back(after, rp);
          return rp;
        },
        [this](sup_wait_atom) -> caf::response_promise {
          auto rp = make_response_promise();
          waiters_.push_back(rp);
          return rp;
        },
        [this](sup_stop_atom, int64_t timeout_ms) -> caf::response_promise {
          auto rp = make_response_promise();
          waiters_.push_back(rp);
          if (!stopping_) {
            shutdown(supervisor_status::stopped, caf::error{}, "stop requested");
            if (timeout_ms >= 0) schedule(timeout_ms, sup_tick::stop, 0, ++stop_gen_);
          }
          return rp;
        },
        [this](sup_down_atom, uint64_t child, caf::actor_id id, caf::error& reason) {
          on_down(child, id, reason);
        },
        [this](sup_tick_atom, sup_tick kind, uint64_t child, uint64_t gen) {
          on_tick(kind, child, gen);
        },
        [this](sup_add_atom, child_spec& c) -> caf::result<child_state> {
          return add_static(std::move(c));
        },
        [this](sup_add_atom, caf::message& args) -> caf::result<child_state> {
          return add_templated(std::move(args));
        },
        [this](sup_term_atom, std::string& name) -> caf::result<bool> {
          return terminate_child(name);
        },
        [this](sup_restart_atom, std::string& name) -> caf::result<child_state> {
          return restart_child(name);
        },
        [this](sup_delete_atom, std::string& name) -> caf::result<bool> {
          return delete_child(name);
        },
        [this](sup_metrics_atom) { return metrics(); },
        [this](sup_count_atom) { return counts(); },
        [this](sup_subscribe_atom, caf::actor& who) {
          subscribe(std::move(who), false, {});
          return true;
        },
        [this](sup_subscribe_atom, caf::actor& who, bool replay) {
          subscribe(std::move(who), replay, {});
          return true;
        },
        [this](sup_subscribe_atom, caf::actor& who, bool replay, std::string& prefix) {
          subscribe(std::move(who), replay, std::move(prefix));
          return true;
        },
        [this](sup_unsub_atom, const caf::actor_addr& who) {
          subscribers_.erase(std::remove_if(subscribers_.begin(), subscribers_.end(),
                                            [&](const subscriber& s) {
                                              return s.who.address() == who;
                                            }),
                             subscribers_.end());
        },
        // An event of a nested supervisor (already path-qualified by it): into our log and
        // on to our subscribers, not into our metrics.
        [this](supervisor_event& e) { publish(std::move(e)); },
    });
    initialized_ = true;
    for (auto& [uid, k] : kids_)
      if (k.actor) watch(k);
    if (failed_start_) {
      // Finish in a later message: whoever asks for the state right after still sees why.
      starting_failed_ = true;
      shutdown(supervisor_status::failed, failed_start_, render(failed_start_));
      return {};
    }
    status_ = supervisor_status::running;
    return {};
  }

 private:
  struct subscriber {
    caf::actor who;
    std::string prefix; // a parent supervisor: our events under its child name
  };

  // -- bookkeeping ---------------------------------------------------------------------------

  /// Adds a subscriber (with the log so far when `replay`: nothing missed, nothing twice);
  /// it is dropped when it ends.
  void subscribe(caf::actor who, bool replay, std::string prefix) {
    if (!who) return;
    if (replay)
      for (auto& e : events_)
        caf::anon_send(who, qualified(e, prefix));
    auto self = caf::actor_cast<caf::actor_addr>(this);
    who->attach_functor([self, addr = who.address()] {
      if (auto sup = caf::actor_cast<caf::actor>(self))
        caf::anon_send(sup, sup_unsub_atom::value, addr);
    });
    subscribers_.push_back(subscriber{std::move(who), std::move(prefix)});
  }

  int64_t now_ms() const { return clk_->now_ms(); }

  child_rec& add_rec(std::shared_ptr<const child_spec> spec, std::string name = {}) {
    auto uid = ++next_uid_;
    auto& k = kids_[uid];
    k.uid = uid;
    k.kind = kind_of(*spec);
    k.subtree = spec->start && spec->start.target<subtree_start>() != nullptr;
    k.name = name.empty() ? spec->name : std::move(name);
    k.spec = std::move(spec);
    by_name_.emplace(k.name, uid);
    if (k.kind == child_kind::supervisor) ++supervisor_specs_;
    return k;
  }

  void set_pending(child_rec& k, bool on) {
    if (k.pending == on) return;
    k.pending = on;
    if (on)
      ++pending_count_;
    else
      --pending_count_;
  }

  /// Removes a child that is not running from every index.
  void forget(child_rec& k) {
    set_pending(k, false);
    if (k.kill_timer != 0) clk_->cancel(std::exchange(k.kill_timer, 0));
    by_name_.erase(k.name);
    if (k.kind == child_kind::supervisor) --supervisor_specs_;
    kids_.erase(k.uid);
  }

  /// A temporary child ended: forgotten (OTP), or kept listed under the cap.
  void ended_temporary(child_rec& k) {
    if (stopping_) return; // the final state lists it
    if (keep_ended_ == 0) {
      event(supervisor_event_kind::forgotten, k.name, "a temporary child is forgotten when it ends");
      forget(k);
      return;
    }
    ended_.push_back(k.uid);
    while (ended_.size() > keep_ended_) {
      auto it = kids_.find(ended_.front());
      ended_.pop_front();
      if (it != kids_.end() && !it->second.actor && !it->second.terminating)
        forget(it->second);
    }
  }

  child_rec* find(const std::string& name) {
    auto i = by_name_.find(name);
    return i == by_name_.end() ? nullptr : &kids_.at(i->second);
  }

  child_rec* find(uint64_t uid) {
    auto i = kids_.find(uid);
    return i == kids_.end() ? nullptr : &i->second;
  }

  void set_actor(child_rec& k, caf::actor a) {
    k.actor = std::move(a);
    ++active_;
    if (k.spec->significant) ++significant_running_;
    if (initialized_) watch(k);
  }

  void clear_actor(child_rec& k) {
    if (!k.actor) return;
    k.actor = nullptr;
    --active_;
    if (k.spec->significant) --significant_running_;
  }

  /// Monitors a child; a subtree also sends us its events (its log so far, then live)
  /// under its name.
  void watch(child_rec& k) {
    // A weak reference: a child does not keep its supervisor alive.
    auto self = caf::actor_cast<caf::actor_addr>(this);
    k.actor->attach_functor([self, uid = k.uid, id = k.actor.id()](const caf::error& reason) {
      if (auto sup = caf::actor_cast<caf::actor>(self))
        caf::anon_send(sup, sup_down_atom::value, uid, id, reason);
    });
    if (k.subtree) // a troupe supervisor; anonymous: its `true` reply would come back here
      caf::anon_send(k.actor, sup_subscribe_atom::value, caf::actor_cast<caf::actor>(this),
                     true, k.name);
  }

  troupe::clock::timer_id schedule(int64_t delay_ms, sup_tick kind, uint64_t child,
                                   uint64_t gen) {
    if (delay_ms >= never_ms) return 0; // infinity: never fires
    return clk_->schedule(clk_->now() + std::chrono::milliseconds(std::max<int64_t>(delay_ms, 0)),
                   caf::actor_cast<caf::actor>(this),
                   caf::make_message(sup_tick_atom::value, kind, child, gen));
  }

  static supervisor_event qualified(const supervisor_event& e, const std::string& prefix) {
    if (prefix.empty()) return e;
    auto q = e;
    q.child = e.child.empty() ? prefix : prefix + "/" + e.child;
    return q;
  }

  static constexpr size_t max_events = 1024;

  void event(supervisor_event_kind kind, const std::string& child, std::string reason) {
    switch (kind) {
      case supervisor_event_kind::started:
        ++metrics_.started;
        break;
      case supervisor_event_kind::restarted:
        ++metrics_.restarts;
        break;
      case supervisor_event_kind::failed:
        ++metrics_.failures;
        break;
      case supervisor_event_kind::suppressed:
        ++metrics_.suppressed;
        break;
      case supervisor_event_kind::circuit_open:
        ++metrics_.circuit_opens;
        break;
      case supervisor_event_kind::killed:
        ++metrics_.kills;
        break;
      case supervisor_event_kind::escalated:
        ++metrics_.escalations;
        break;
      default:
        break;
    }
    publish(supervisor_event{clk_->wall_ms(), kind, child, std::move(reason)});
  }

  std::vector<supervisor_event> events_after(uint64_t after) const {
    auto it = std::upper_bound(events_.begin(), events_.end(), after,
                               [](uint64_t a, const supervisor_event& e) { return a < e.seq; });
    return {it, events_.end()};
  }

  void publish(supervisor_event e) {
    e.seq = ++event_seq_;
    events_.push_back(std::move(e));
    if (!event_waiters_.empty()) {
      for (auto& [after, rp] : event_waiters_)
        rp.deliver(events_after(after));
      event_waiters_.clear();
    }
    for (auto& sub : subscribers_)
      send(sub.who, qualified(events_.back(), sub.prefix));
    // The log keeps the most recent events only (a supervisor may restart millions of times).
    if (events_.size() > 2 * max_events) events_.erase(events_.begin(), events_.end() - max_events);
  }

  child_state child_of(const child_rec& k) const {
    return child_state{k.name,        k.status,  k.restarts, k.last_error, k.next_restart_ms,
                       k.wait_reason, k.actor, k.kind};
  }

  supervisor_state state() const {
    supervisor_state st;
    st.name = name_;
    st.status = status_;
    st.reason = reason_;
    st.children.reserve(kids_.size());
    for (auto& [uid, k] : kids_)
      st.children.push_back(child_of(k));
    return st;
  }

  child_counts counts() const {
    child_counts n;
    n.specs = kids_.size();
    n.active = active_;
    n.supervisors = supervisor_specs_;
    n.workers = n.specs - n.supervisors;
    return n;
  }

  supervisor_metrics metrics() const {
    auto m = metrics_;
    m.children = kids_.size();
    m.active = active_;
    m.subscribers = subscribers_.size();
    return m;
  }

  /// Starts `k`; an error (with last_error set) when its start function failed.
  caf::error start_child(child_rec& k) {
    start_result r{caf::error{}};
    try {
      r = k.templated ? template_start_(*sys_, k.args) : k.spec->start(*sys_);
    } catch (const std::exception& e) {
      r = make_error(errc::start_failed, k.name, e.what());
    } catch (...) {
      r = make_error(errc::start_failed, k.name, "a non-standard exception");
    }
    if (!r) {
      auto err = std::move(r.error());
      if (!err) err = make_error(errc::start_failed, k.name, "the start function failed");
      k.last_error = render(err);
      return err;
    }
    k.next_restart_ms = -1;
    k.wait_reason.clear();
    if (!*r) { // "ignore": recorded, not running, never restarted
      k.status = child_status::stopped;
      event(supervisor_event_kind::ignored, k.name, "the start function answered ignore");
      return {};
    }
    set_actor(k, std::move(**r));
    k.status = child_status::running;
    event(supervisor_event_kind::started, k.name, "");
    return {};
  }

  /// Returns the `start_failed` error for child `k`'s start error `err`: the field is the
  /// path of the child that failed (through nested supervisors), the cause the start
  /// function's own error.
  caf::error start_failure(const child_rec& k, const caf::error& err) {
    auto path = name_ + "/" + k.name;
    std::vector<caf::error> causes{err};
    if (k.kind == child_kind::supervisor && is(err, errc::start_failed)) {
      // A subtree that could not start: its path continues below its own name.
      auto inner = field_of(err);
      if (auto slash = inner.find('/'); slash != std::string::npos)
        path += inner.substr(slash);
      if (auto nested = errors_of(err); !nested.empty()) causes = std::move(nested);
    }
    return make_error(errc::start_failed, path,
                      "child \"" + k.name + "\" failed to start: " + render(err),
                      std::move(causes));
  }

  // -- administration ------------------------------------------------------------------------

  caf::result<child_state> add_static(child_spec c) {
    if (stopping_)
      return make_error(errc::supervisor_stopping, "supervisor", name_ + " is stopping");
    if (template_spec_)
      return make_error(errc::invalid_spec, "child_template",
                        "a dynamic supervisor starts children of its template only");
    if (auto err = validate_child(c, "child", auto_shutdown_)) return err;
    if (by_name_.count(c.name) != 0)
      return make_error(errc::invalid_spec, "name", "duplicate child name \"" + c.name + "\"");
    auto& k = add_rec(std::make_shared<const child_spec>(std::move(c)));
    return started_or_error(k);
  }

  caf::result<child_state> add_templated(caf::message args) {
    if (!template_spec_)
      return make_error(errc::no_template, "supervisor",
                        name_ + " has no child template: start_child needs a child spec");
    if (stopping_)
      return make_error(errc::supervisor_stopping, "supervisor", name_ + " is stopping");
    auto& k = add_rec(template_spec_, template_spec_->name + "-" + std::to_string(++next_id_));
    k.templated = true;
    k.args = std::move(args);
    return started_or_error(k);
  }

  caf::result<child_state> started_or_error(child_rec& k) {
    if (auto err = start_child(k)) {
      auto out = make_error(errc::start_failed, k.name, k.last_error, {err});
      forget(k);
      return out;
    }
    auto st = child_of(k);
    // OTP: an ignoring dynamic or temporary child is not kept.
    if (!k.actor && (k.templated || k.temporary())) forget(k);
    return st;
  }

  caf::result<bool> terminate_child(const std::string& name) {
    auto* kp = find(name);
    if (kp == nullptr) return make_error(errc::unknown_child, "name", name);
    auto& k = *kp;
    bool was_due = k.due_to_restart();
    k.held = true;
    set_pending(k, false);
    k.retry_pending = false;
    ++k.gen; // no restart is pending any more
    if (k.status == child_status::waiting || k.status == child_status::circuit_open ||
        (was_due && !k.actor)) {
      k.status = child_status::stopped;
      k.next_restart_ms = -1;
    }
    // A group restart waiting for this child does not start the children it governs.
    if (was_due && !k.actor) cancel_group(k.uid);
    if (!k.actor) {
      if (k.temporary() || k.templated) forget(k); // OTP: deleted with it
      return false;
    }
    auto rp = make_response_promise();
    k.on_stopped.push_back(rp);
    if (!k.terminating) terminate(k);
    return rp;
  }

  /// Cancels the pending group restart that child `uid` belongs to (rest_for_one: the
  /// children after it; one_for_all: all of them): they stay stopped.
  void cancel_group(uint64_t uid) {
    if (strategy_ != strategy::one_for_all && strategy_ != strategy::rest_for_one) return;
    auto first = strategy_ == strategy::one_for_all ? kids_.begin() : kids_.upper_bound(uid);
    bool any = false;
    for (auto it = first; it != kids_.end(); ++it) {
      auto& o = it->second;
      if (!o.pending || o.terminating) continue;
      set_pending(o, false);
      ++o.gen;
      o.status = child_status::stopped;
      o.next_restart_ms = -1;
      o.wait_reason.clear();
      any = true;
    }
    if (any) ++group_gen_;
  }

  caf::result<child_state> restart_child(const std::string& name) {
    auto* kp = find(name);
    if (kp == nullptr) return make_error(errc::unknown_child, "name", name);
    auto& k = *kp;
    if (k.templated)
      return make_error(errc::template_child, "name",
                        name + " is a dynamic child: start another with start_child");
    if (k.actor || k.terminating)
      return make_error(errc::child_running, "name", name + " is running");
    if (stopping_)
      return make_error(errc::supervisor_stopping, "supervisor", name_ + " is stopping");
    if (k.due_to_restart())
      return make_error(errc::restarting, "name",
                        name + " is waiting to be restarted (" + to_string(k.status) + ")");
    bool was_held = k.held;
    k.held = false;
    k.budget.half_open_since = -1;
    ++k.gen;
    if (auto err = start_child(k)) {
      // OTP: the child stays as it was (not running); nothing is scheduled.
      k.held = was_held;
      k.status = child_status::failed;
      event(supervisor_event_kind::failed, k.name, k.last_error);
      return make_error(errc::start_failed, name, k.last_error, {err});
    }
    ++k.restarts;
    event(supervisor_event_kind::restarted, k.name, "restart_child");
    return child_of(k);
  }

  caf::result<bool> delete_child(const std::string& name) {
    auto* kp = find(name);
    if (kp == nullptr) return make_error(errc::unknown_child, "name", name);
    auto& k = *kp;
    if (k.templated)
      return make_error(errc::template_child, "name",
                        name + " is a dynamic child: terminate_child removes it");
    if (k.actor || k.terminating)
      return make_error(errc::child_running, "name", name + " is running: terminate it first");
    if (k.due_to_restart())
      return make_error(errc::restarting, "name",
                        name + " is waiting to be restarted: terminate it first");
    event(supervisor_event_kind::deleted, name, "");
    forget(k);
    return true;
  }

  // -- exits ---------------------------------------------------------------------------------

  void on_exit_msg(caf::exit_msg& em) {
    // Our parent (or someone) asks us to exit. Stop the children first.
    if (!stopping_) {
      parent_reason_ = em.reason;
      shutdown(supervisor_status::stopped, caf::error{}, "asked to exit");
    }
  }

  void on_down(uint64_t uid, caf::actor_id id, const caf::error& reason) {
    auto* kp = find(uid);
    if (kp == nullptr || !kp->actor || kp->actor.id() != id) return; // an old incarnation
    auto& k = *kp;
    clear_actor(k);
    if (k.terminating) { // we stopped it
      k.terminating = false;
      if (k.kill_timer != 0) clk_->cancel(std::exchange(k.kill_timer, 0));
      --terminating_;
      ++k.gen;
      if (!k.pending) k.status = child_status::stopped;
      event(supervisor_event_kind::stopped, k.name, "shut down by its supervisor");
      for (auto& rp : k.on_stopped)
        rp.deliver(true);
      k.on_stopped.clear();
      if (!k.pending && (k.temporary() || (k.templated && k.held))) ended_temporary(k);
      proceed();
      return;
    }
    bool failure = is_failure(reason);
    k.last_error = failure ? render(reason) : std::string{};
    if (!failure) ++metrics_.normal_exits;
    event(failure ? supervisor_event_kind::failed : supervisor_event_kind::stopped, k.name,
          failure ? k.last_error : reason ? "shutdown exit" : "normal exit");
    on_child_down(k, failure);
  }

  /// Child `k` ended by itself (or failed to restart): apply the restart rules.
  void on_child_down(child_rec& k, bool failure) {
    if (k.held) { // terminate_child holds it: no restart
      k.status = failure ? child_status::failed : child_status::stopped;
      return;
    }
    if (stopping_) {
      k.status = failure ? child_status::failed : child_status::stopped;
      proceed();
      return;
    }
    if (strategy_ == strategy::escalate_to_parent && failure) {
      k.status = child_status::failed;
      escalate(make_error(errc::child_failed, k.name,
                          "child \"" + k.name + "\" failed: " + k.last_error));
      return;
    }
    bool restart = k.spec->restart == restart_mode::always ||
                   (k.spec->restart == restart_mode::on_failure && failure);
    if (!restart) {
      k.status = failure ? child_status::failed : child_status::stopped;
      if (k.spec->significant) significant_ended(k.name);
      // Temporary children, and a dynamic supervisor's children that end for good, are
      // forgotten (OTP).
      if ((k.temporary() || k.templated) && kids_.count(k.uid) != 0) ended_temporary(k);
      return;
    }
    auto now = now_ms();
    // The budgets, in their order (restart_budget): the child's own, then the intensity.
    auto d = budget_.on_end(
        k.budget, {k.spec->max_restarts, k.spec->window_ms, k.spec->circuit_open_ms}, now);
    switch (d.verdict) {
      case budget_verdict::circuit_open:
        k.status = child_status::circuit_open;
        k.next_restart_ms = saturating_add(now, k.spec->circuit_open_ms);
        k.wait_reason = "circuit open: " + d.why;
        event(supervisor_event_kind::circuit_open, k.name, k.wait_reason);
        schedule(k.spec->circuit_open_ms, sup_tick::restart, k.uid, ++k.gen);
        return;
      case budget_verdict::suppressed:
        k.status = child_status::suppressed;
        k.wait_reason = std::move(d.why);
        event(supervisor_event_kind::suppressed, k.name, k.wait_reason);
        return;
      case budget_verdict::escalate:
        k.status = child_status::failed;
        escalate(make_error(errc::intensity_exceeded, name_,
                            d.why + "; last: " + k.name + ": " + k.last_error));
        return;
      case budget_verdict::restart:
        break;
    }
    auto delay = restart_delay_ms(*k.spec, k.name, d.in_window);
    switch (strategy_) {
      case strategy::one_for_one:
      case strategy::escalate_to_parent: // a normal exit of a permanent child restarts it
        restart_after(k, delay);
        return;
      case strategy::one_for_all:
      case strategy::rest_for_one:
        group_restart(k, delay);
        return;
    }
  }

  /// Stops the children `k`'s failure takes along (in reverse order) and restarts them
  /// with it once they have stopped. Temporary children are stopped, never restarted.
  void group_restart(child_rec& k, int64_t delay) {
    set_pending(k, true);
    k.status = child_status::waiting;
    auto first = strategy_ == strategy::one_for_all ? kids_.begin() : kids_.find(k.uid);
    for (auto it = kids_.end(); it != first;) {
      --it;
      auto& o = it->second;
      if (o.uid == k.uid || o.status == child_status::suppressed) continue;
      set_pending(o, !o.temporary() && !o.held &&
                         (o.status == child_status::running || o.status == child_status::waiting));
      if (o.actor && !o.terminating)
        terminate(o);
      else if (o.pending)
        ++o.gen; // a pending own restart is replaced by the group's
    }
    group_delay_ = delay;
    proceed();
  }

  /// A significant child ended by itself: auto_shutdown may stop this supervisor.
  void significant_ended(const std::string& name) {
    if (auto_shutdown_ == auto_shutdown::any_significant) {
      shutdown(supervisor_status::stopped, caf::error{},
               "auto_shutdown: significant child " + name + " ended");
      return;
    }
    if (auto_shutdown_ == auto_shutdown::all_significant) {
      if (significant_running_ > 0) return; // O(1) while any runs
      for (auto& [uid, k] : kids_)
        if (k.spec->significant && (k.actor || k.terminating || k.due_to_restart()))
          return; // still running, or due to run again
      shutdown(supervisor_status::stopped, caf::error{},
               "auto_shutdown: every significant child ended");
    }
  }

  void restart_after(child_rec& k, int64_t delay) {
    if (delay <= 0) {
      restart_now(k);
      return;
    }
    k.status = child_status::waiting;
    k.next_restart_ms = saturating_add(now_ms(), delay);
    k.wait_reason = "backoff";
    event(supervisor_event_kind::waiting, k.name, "restart in " + std::to_string(delay) + " ms");
    schedule(delay, sup_tick::restart, k.uid, ++k.gen);
  }

  /// Restarts `k`; false when its start failed (its retry is on its way).
  bool restart_now(child_rec& k) {
    set_pending(k, false);
    if (start_child(k)) {
      // A failed restart is a failure like any other, handled in a fresh message (no
      // recursion however often it fails).
      event(supervisor_event_kind::failed, k.name, k.last_error);
      k.status = child_status::failed;
      k.retry_pending = true;
      send(this, sup_tick_atom::value, sup_tick::retry, k.uid, k.gen);
      return false;
    }
    ++k.restarts;
    event(supervisor_event_kind::restarted, k.name, "restart #" + std::to_string(k.restarts));
    return true;
  }

  void terminate(child_rec& o) {
    o.budget.half_open_since = -1;
    o.terminating = true;
    ++terminating_;
    if (o.spec->brutal_kill) {
      send_exit(o.actor, caf::exit_reason::kill);
    } else {
      send_exit(o.actor, caf::exit_reason::user_shutdown);
      o.kill_timer = schedule(shutdown_of(*o.spec, o.kind), sup_tick::kill, o.uid, ++o.kill_gen);
    }
  }

  void kill(child_rec& k, const std::string& why) {
    event(supervisor_event_kind::killed, k.name, why);
    send_exit(k.actor, caf::exit_reason::kill);
  }

  void on_tick(sup_tick kind, uint64_t child, uint64_t gen) {
    switch (kind) {
      case sup_tick::finish:
        finish();
        return;
      case sup_tick::stop: // stop(timeout) expired: kill what is left
        if (gen == stop_gen_ && stopping_)
          for (auto& [uid, k] : kids_)
            if (k.actor) kill(k, "the supervisor's stop timeout passed");
        return;
      case sup_tick::kill_all: // a dynamic supervisor's concurrent shutdown took too long
        if (stopping_)
          for (auto& [uid, k] : kids_)
            if (k.actor && k.terminating)
              kill(k, "did not stop within " +
                          std::to_string(shutdown_of(*k.spec, k.kind)) + " ms");
        return;
      case sup_tick::group:
        if (gen == group_gen_ && !stopping_) restart_group();
        return;
      default:
        break;
    }
    auto* kp = find(child);
    if (kp == nullptr) return; // deleted since
    auto& k = *kp;
    switch (kind) {
      case sup_tick::kill: // the cooperative shutdown took too long
        if (gen == k.kill_gen && k.terminating && k.actor)
          kill(k, "did not stop within " + std::to_string(shutdown_of(*k.spec, k.kind)) +
                      " ms");
        return;
      case sup_tick::retry: // a restart that failed to start
        if (!k.retry_pending || gen != k.gen) return;
        k.retry_pending = false;
        if (!stopping_ && !k.held && k.status == child_status::failed) on_child_down(k, true);
        return;
      case sup_tick::restart:
        if (gen != k.gen || k.terminating || stopping_) return;
        if (k.status == child_status::waiting) {
          restart_now(k);
        } else if (k.status == child_status::circuit_open) {
          // The half-open try: one restart on a clean slate; if it fails within its
          // window the circuit opens again.
          k.budget.window.clear();
          k.budget.half_open_since = now_ms();
          event(supervisor_event_kind::half_open, k.name, "one try after the open circuit");
          restart_now(k);
        }
        return;
      default:
        return;
    }
  }

  /// Continues after a termination: the group restart, or the shutdown sequence.
  void proceed() {
    if (terminating_ > 0) return;
    if (stopping_) {
      shutdown_next();
      return;
    }
    if (pending_count_ == 0) return; // O(1): no group restart waits
    for (auto& [uid, k] : kids_)
      if (k.pending) {
        k.status = child_status::waiting;
        k.next_restart_ms = group_delay_ > 0 ? saturating_add(now_ms(), group_delay_) : -1;
        k.wait_reason = group_delay_ > 0 ? "backoff" : "group restart";
      }
    if (group_delay_ > 0) {
      event(supervisor_event_kind::waiting, "", "group restart in " + std::to_string(group_delay_) + " ms");
      schedule(group_delay_, sup_tick::group, 0, ++group_gen_);
    } else {
      restart_group();
    }
  }

  /// Restarts the pending children in order. A child that fails to start stops the
  /// round: the children after it wait until it runs again (its retry restarts the group).
  void restart_group() {
    for (auto& [uid, k] : kids_) {
      if (!k.pending || stopping_) continue;
      if (!restart_now(k)) return;
    }
  }

  // -- shutdown ------------------------------------------------------------------------------

  void escalate(caf::error err) {
    event(supervisor_event_kind::escalated, "", render(err));
    shutdown(supervisor_status::failed, std::move(err), "");
  }

  void shutdown(supervisor_status final_status, caf::error err, std::string why) {
    if (stopping_) return;
    stopping_ = true;
    self_ref_ = caf::actor_cast<caf::actor>(this); // alive until finish(), whoever holds us
    final_status_ = final_status;
    exit_reason_ = std::move(err);
    reason_ = exit_reason_ ? render(exit_reason_) : std::move(why);
    status_ = supervisor_status::stopping;
    event(supervisor_event_kind::shutdown, "", reason_);
    for (auto& [uid, k] : kids_) { // no restart happens any more
      ++k.gen;
      set_pending(k, false);
      k.retry_pending = false;
      if (k.status == child_status::waiting || k.status == child_status::circuit_open) {
        k.status = child_status::stopped;
        k.next_restart_ms = -1;
      }
    }
    shutdown_cursor_ = no_cursor;
    proceed();
  }

  /// Stops the children: one by one in reverse order (the last running child first), or
  /// a dynamic supervisor's all at once (OTP), bounded by the template's shutdown.
  void shutdown_next() {
    if (template_spec_ && !concurrent_stop_sent_) {
      concurrent_stop_sent_ = true;
      for (auto& [uid, k] : kids_) {
        if (!k.actor || k.terminating) continue;
        k.terminating = true;
        ++terminating_;
        send_exit(k.actor, k.spec->brutal_kill ? caf::exit_reason::kill
                                               : caf::exit_reason::user_shutdown);
      }
      if (terminating_ > 0) {
        if (!template_spec_->brutal_kill)
          schedule(shutdown_of(*template_spec_, *template_spec_->kind), sup_tick::kill_all, 0, 0);
        return;
      }
    }
    // The cursor only moves down: stopping N children costs O(N) in all.
    auto it = kids_.lower_bound(shutdown_cursor_);
    while (it != kids_.begin()) {
      --it;
      if (it->second.actor) {
        shutdown_cursor_ = it->first;
        terminate(it->second);
        return;
      }
    }
    if (starting_failed_) {
      starting_failed_ = false;
      send(this, sup_tick_atom::value, sup_tick::finish, uint64_t{0}, uint64_t{0});
      return;
    }
    finish();
  }

  void finish() {
    status_ = final_status_;
    auto st = state();
    if (final_) {
      std::lock_guard<std::mutex> guard{final_->mtx};
      final_->state = st;
      final_->events = events_;
      final_->counts = counts();
      final_->metrics = metrics();
    }
    for (auto& rp : waiters_)
      rp.deliver(st);
    waiters_.clear();
    for (auto& [after, rp] : event_waiters_) // no more events: an empty answer says so
      rp.deliver(std::vector<supervisor_event>{});
    event_waiters_.clear();
    if (exit_reason_)
      quit(exit_reason_);
    else
      quit(parent_reason_ ? parent_reason_ : caf::error{});
    self_ref_ = nullptr;
  }

  caf::actor_system* sys_;
  troupe::clock* clk_;
  std::shared_ptr<supervisor_final> final_;
  std::string name_;
  troupe::strategy strategy_;
  troupe::auto_shutdown auto_shutdown_;
  size_t keep_ended_;
  std::shared_ptr<const child_spec> template_spec_;
  template_start_fn template_start_;
  supervisor_metrics metrics_;
  /// The children in start order, by uid (a child's end names its uid: O(log n)), and an
  /// index by name (O(1)), whatever the number of children.
  std::map<uint64_t, child_rec> kids_;
  std::unordered_map<std::string, uint64_t> by_name_;
  std::deque<uint64_t> ended_; // ended temporaries kept listed (keep_ended_temporaries)
  size_t active_ = 0;
  size_t pending_count_ = 0;       // children with `pending` set (a group restart waits)
  size_t significant_running_ = 0; // significant children with an actor
  size_t supervisor_specs_ = 0;
  supervisor_status status_ = supervisor_status::starting;
  supervisor_status final_status_ = supervisor_status::stopped;
  std::string reason_;
  caf::error exit_reason_;
  caf::error parent_reason_;
  caf::error failed_start_;
  caf::actor self_ref_;
  /// The two restart budgets (the children's own state lives in their records).
  restart_budget budget_;
  std::vector<supervisor_event> events_;
  std::vector<subscriber> subscribers_;
  std::vector<caf::response_promise> waiters_;
  std::vector<std::pair<uint64_t, caf::response_promise>> event_waiters_;
  uint64_t event_seq_ = 0;
  bool initialized_ = false;
  bool stopping_ = false;
  bool starting_failed_ = false;
  bool concurrent_stop_sent_ = false;
  size_t terminating_ = 0;
  int64_t group_delay_ = 0;
  uint64_t group_gen_ = 0;
  uint64_t next_uid_ = 0;
  uint64_t next_id_ = 0;
  uint64_t stop_gen_ = 0;
  /// The shutdown cursor before the first child is stopped: above every uid.
  static constexpr uint64_t no_cursor = std::numeric_limits<uint64_t>::max();
  uint64_t shutdown_cursor_ = no_cursor;
};

} // namespace

caf::expected<caf::actor> spawn_supervisor(caf::actor_system& sys, troupe::clock& clk,
                                           supervisor_spec spec,
                                           std::shared_ptr<supervisor_final> final) {
  if (auto err = validate(spec)) return err;
  caf::error start_error;
  auto a = sys.spawn<supervisor_actor>(&sys, &clk, std::move(spec), std::move(final),
                                       &start_error);
  // A child that could not start: the supervisor stops the ones started and ends by itself.
  if (start_error) return start_error;
  return a;
}

start_result subtree_start::operator()(caf::actor_system& sys) const {
  auto a = spawn_supervisor(sys, *clk, spec);
  if (!a) return a.error();
  return std::optional<caf::actor>{std::move(*a)};
}

start_fn supervisor_child(troupe::clock& clk, supervisor_spec spec) {
  return subtree_start{&clk, std::move(spec)};
}

child_spec supervisor_child_spec(std::string name, troupe::clock& clk, supervisor_spec spec) {
  child_spec c;
  c.name = std::move(name);
  c.start = supervisor_child(clk, std::move(spec));
  c.kind = child_kind::supervisor;
  c.shutdown_ms = infinity;
  return c;
}

} // namespace troupe
