#include "troupe/supervision/supervisor.hpp"

#include <deque>
#include <string>
#include <vector>

#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/response_promise.hpp>

#include "troupe/messages/errc.hpp"

namespace troupe {

namespace {

using namespace troupe::atoms;

struct child_rec {
  child_spec spec;
  caf::actor actor;
  child_status status = child_status::stopped;
  uint64_t restarts = 0;
  std::deque<int64_t> window; // restart times within spec.window_ms (backoff attempts)
  std::string last_error;
  caf::error start_error;
  int64_t next_restart_ms = -1;
  std::string wait_reason;
  uint64_t gen = 0; // invalidates stale restart / shutdown timers
  bool terminating = false;
  bool pending = false;         // restart when the group's terminations are done
  int64_t half_open_since = -1; // when the half-open try started, or -1
  uint64_t kill_gen = 0;        // the kill timer of the current termination
  bool retry_pending = false;   // a failed restart's retry message is on its way
  uint64_t uid = 0;             // names the child in timers
  bool held = false;            // stopped by terminate_child: no restart until restart_child
  std::vector<caf::response_promise> on_stopped; // terminate_child callers
};

class supervisor_actor final : public caf::event_based_actor {
 public:
  supervisor_actor(caf::actor_config& cfg, troupe::clock* clk, supervisor_spec spec,
                   std::shared_ptr<supervisor_final> final)
      : caf::event_based_actor(cfg), clk_(clk), final_(std::move(final)),
        name_(std::move(spec.name)), strategy_(spec.strategy), intensity_(spec.intensity),
        period_ms_(spec.period_ms), auto_shutdown_(spec.auto_shutdown) {
    for (auto& c : spec.children) {
      child_rec k;
      k.spec = std::move(c);
      k.uid = ++next_uid_;
      kids_.push_back(std::move(k));
    }
  }

  const char* name() const override { return "troupe.supervisor"; }

  void on_exit() override {
    // Dying any other way than through finish() (a kill, say): no child outlives us.
    for (auto& k : kids_)
      if (k.actor) caf::anon_send_exit(k.actor, caf::exit_reason::kill);
  }

  caf::behavior make_behavior() override {
    // Deaths of children arrive as down messages. No links: a link's exit message can
    // arrive after the down message of the same death (and after the restart), and a link
    // is dropped when the child receives our exit request. on_exit takes the children along
    // if this supervisor dies.
    set_down_handler([this](caf::down_msg& dm) {
      auto i = find(dm.source);
      if (i >= 0) on_child_exit(static_cast<size_t>(i), dm.reason);
    });
    set_exit_handler([this](caf::exit_msg& em) { on_exit_msg(em); });
    become(caf::behavior{
        [this](sup_state_atom) { return state(); },
        [this](sup_events_atom) { return events_; },
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
            if (timeout_ms >= 0) schedule(timeout_ms, stop_timer(), ++stop_gen_);
          }
          return rp;
        },
        [this](sup_tick_atom, uint64_t child, uint64_t gen) { on_tick(child, gen); },
        [this](sup_add_atom, child_spec& c) -> caf::result<child_state> {
          if (stopping_) return make_error(errc::invalid_argument, "supervisor", "it is stopping");
          supervisor_spec one;
          one.children = {c};
          if (auto err = validate(one)) return err;
          if (index_of(c.name) >= 0)
            return make_error(errc::invalid_spec, "name",
                              "duplicate child name \"" + c.name + "\"");
          child_rec k;
          k.spec = std::move(c);
          k.uid = ++next_uid_;
          kids_.push_back(std::move(k));
          auto i = kids_.size() - 1;
          if (!start_child(i)) {
            auto err = make_error(errc::start_failed, kids_[i].spec.name, kids_[i].last_error);
            kids_.pop_back();
            return err;
          }
          return child_of(i);
        },
        [this](sup_term_atom, std::string& name) -> caf::result<bool> {
          auto i = index_of(name);
          if (i < 0) return make_error(errc::unknown_child, "name", name);
          auto& k = kids_[static_cast<size_t>(i)];
          k.held = true;
          k.pending = false;
          ++k.gen; // no restart is pending any more
          if (k.status == child_status::waiting || k.status == child_status::circuit_open) {
            k.status = child_status::stopped;
            k.next_restart_ms = -1;
          }
          if (!k.actor) return false;
          auto rp = make_response_promise();
          k.on_stopped.push_back(rp);
          if (!k.terminating) terminate(static_cast<size_t>(i));
          return rp;
        },
        [this](sup_restart_atom, std::string& name) -> caf::result<child_state> {
          auto i = index_of(name);
          if (i < 0) return make_error(errc::unknown_child, "name", name);
          auto idx = static_cast<size_t>(i);
          auto& k = kids_[idx];
          if (k.actor || k.terminating)
            return make_error(errc::invalid_argument, "name", name + " is running");
          if (stopping_) return make_error(errc::invalid_argument, "supervisor", "it is stopping");
          k.held = false;
          k.pending = false; // a pending group restart must not start it a second time
          k.half_open_since = -1;
          ++k.gen;
          if (!start_child(idx)) {
            k.status = child_status::failed;
            return make_error(errc::start_failed, name, k.last_error);
          }
          ++k.restarts;
          event("restarted", k.spec.name, "restart_child");
          return child_of(idx);
        },
        [this](sup_delete_atom, std::string& name) -> caf::result<bool> {
          auto i = index_of(name);
          if (i < 0) return make_error(errc::unknown_child, "name", name);
          auto& k = kids_[static_cast<size_t>(i)];
          if (k.actor || k.terminating)
            return make_error(errc::invalid_argument, "name",
                              name + " is running: terminate it first");
          kids_.erase(kids_.begin() + i);
          event("deleted", name, "");
          return true;
        },
        [this](sup_metrics_atom) {
          auto m = metrics_;
          m.children = kids_.size();
          for (auto& k : kids_)
            m.active += k.actor ? 1 : 0;
          return m;
        },
        [this](sup_count_atom) {
          child_counts n;
          n.specs = kids_.size();
          for (auto& k : kids_)
            n.active += k.actor ? 1 : 0;
          return n;
        },
        [this](sup_subscribe_atom, caf::actor& who) {
          subscribers_.push_back(std::move(who));
          return true;
        },
        [this](sup_subscribe_atom, caf::actor& who, bool replay) {
          if (replay) // the log so far, then every later event: nothing missed, nothing twice
            for (auto& e : events_)
              caf::anon_send(who, e);
          subscribers_.push_back(std::move(who));
          return true;
        },
    });
    status_ = supervisor_status::starting;
    for (size_t i = 0; i < kids_.size(); ++i) {
      if (!start_child(i)) {
        auto err = make_error(errc::start_failed, kids_[i].spec.name,
                              "child \"" + kids_[i].spec.name +
                                  "\" failed to start: " + kids_[i].last_error);
        kids_[i].status = child_status::failed;
        event("failed", kids_[i].spec.name, kids_[i].last_error);
        // Finish in a later message: whoever asked for the state right after the spawn
        // still sees why the start failed.
        starting_failed_ = true;
        shutdown(supervisor_status::failed, err, render(err));
        return {};
      }
    }
    status_ = supervisor_status::running;
    return {};
  }

 private:
  // -- helpers -------------------------------------------------------------------------------

  int64_t now_ms() const { return clk_->now_ms(); }
  // Timers name a child by its uid (indexes shift when a child is deleted).
  static constexpr uint64_t group_timer() { return UINT64_MAX; }
  static constexpr uint64_t stop_timer() { return UINT64_MAX - 1; }
  static constexpr uint64_t finish_timer() { return UINT64_MAX - 2; }

  int index_of(uint64_t uid) const {
    for (size_t i = 0; i < kids_.size(); ++i)
      if (kids_[i].uid == uid) return static_cast<int>(i);
    return -1;
  }

  int index_of(const std::string& name) const {
    for (size_t i = 0; i < kids_.size(); ++i)
      if (kids_[i].spec.name == name) return static_cast<int>(i);
    return -1;
  }
  static constexpr size_t max_events = 1024;
  /// Marks kill timers: they have their own generation, so that cancelling a pending
  /// restart (++gen) never cancels the kill of a child being terminated.
  static constexpr uint64_t kill_tag = uint64_t{1} << 63;

  void schedule(int64_t delay_ms, uint64_t child, uint64_t gen) {
    clk_->schedule(clk_->now() + std::chrono::milliseconds(delay_ms),
                   caf::actor_cast<caf::actor>(this),
                   caf::make_message(sup_tick_atom::value, child, gen));
  }

  void event(std::string kind, const std::string& child, std::string reason) {
    if (kind == "started")
      ++metrics_.started;
    else if (kind == "restarted")
      ++metrics_.restarts;
    else if (kind == "failed")
      ++metrics_.failures;
    else if (kind == "suppressed")
      ++metrics_.suppressed;
    else if (kind == "circuit_open")
      ++metrics_.circuit_opens;
    else if (kind == "killed")
      ++metrics_.kills;
    else if (kind == "escalated")
      ++metrics_.escalations;
    events_.push_back(supervisor_event{now_ms(), std::move(kind), child, std::move(reason)});
    for (auto& sub : subscribers_)
      caf::anon_send(sub, events_.back());
    // The log keeps the most recent events only (a supervisor may restart millions of times).
    if (events_.size() > 2 * max_events) events_.erase(events_.begin(), events_.end() - max_events);
  }

  child_state child_of(size_t i) const {
    auto& k = kids_[i];
    return child_state{k.spec.name,       k.status,      k.restarts, k.last_error,
                       k.next_restart_ms, k.wait_reason, k.actor};
  }

  supervisor_state state() const {
    supervisor_state st;
    st.name = name_;
    st.status = status_;
    st.reason = reason_;
    for (auto& k : kids_)
      st.children.push_back(child_state{k.spec.name, k.status, k.restarts, k.last_error,
                                        k.next_restart_ms, k.wait_reason, k.actor});
    return st;
  }

  /// Starts child i; false (with last_error set) when its start function failed.
  bool start_child(size_t i) {
    auto& k = kids_[i];
    start_result r{caf::error{}};
    try {
      r = k.spec.start(home_system());
    } catch (const std::exception& e) {
      r = make_error(errc::start_failed, k.spec.name, e.what());
    } catch (...) {
      r = make_error(errc::start_failed, k.spec.name, "a non-standard exception");
    }
    if (!r) {
      k.start_error = r.error();
      k.last_error = render(r.error());
      return false;
    }
    k.next_restart_ms = -1;
    k.wait_reason.clear();
    if (!*r) { // "ignore": recorded, not running, never restarted
      k.status = child_status::stopped;
      event("ignored", k.spec.name, "the start function answered ignore");
      return true;
    }
    k.actor = std::move(**r);
    monitor(k.actor);
    k.status = child_status::running;
    event("started", k.spec.name, "");
    return true;
  }

  int find(const caf::actor_addr& src) const {
    for (size_t i = 0; i < kids_.size(); ++i)
      if (kids_[i].actor && kids_[i].actor.address() == src) return static_cast<int>(i);
    return -1;
  }

  // -- exits ---------------------------------------------------------------------------------

  void on_exit_msg(caf::exit_msg& em) {
    // Our parent (or someone) asks us to exit. Stop the children first.
    if (!stopping_) {
      parent_reason_ = em.reason;
      shutdown(supervisor_status::stopped, caf::error{}, "asked to exit");
    }
  }

  void on_child_exit(size_t i, const caf::error& reason) {
    auto& k = kids_[i];
    k.actor = nullptr;
    if (k.terminating) { // we stopped it
      k.terminating = false;
      --terminating_;
      ++k.gen;
      if (!k.pending) k.status = child_status::stopped;
      event("stopped", k.spec.name, "shut down by its supervisor");
      for (auto& rp : k.on_stopped)
        rp.deliver(true);
      k.on_stopped.clear();
      proceed();
      return;
    }
    bool abnormal = static_cast<bool>(reason);
    k.last_error = abnormal ? render(reason) : std::string{};
    if (!abnormal) ++metrics_.normal_exits;
    event(abnormal ? "failed" : "stopped", k.spec.name, abnormal ? k.last_error : "normal exit");
    on_child_down(i, abnormal);
  }

  /// Child i ended by itself (or failed to restart): apply the restart rules.
  void on_child_down(size_t i, bool abnormal) {
    auto& k = kids_[i];
    if (k.held) { // terminate_child holds it: no restart
      k.status = abnormal ? child_status::failed : child_status::stopped;
      return;
    }
    if (stopping_) {
      k.status = abnormal ? child_status::failed : child_status::stopped;
      proceed();
      return;
    }
    if (strategy_ == strategy::escalate_to_parent && abnormal) {
      k.status = child_status::failed;
      escalate(make_error(errc::child_failed, k.spec.name,
                          "child \"" + k.spec.name + "\" failed: " + k.last_error));
      return;
    }
    bool restart = k.spec.restart == restart_mode::always ||
                   (k.spec.restart == restart_mode::on_failure && abnormal);
    if (!restart) {
      k.status = abnormal ? child_status::failed : child_status::stopped;
      if (k.spec.significant) significant_ended(i);
      return;
    }
    // The supervisor's budget (OTP): more than `intensity` restarts within `period`.
    auto now = now_ms();
    restarts_.push_back(now);
    while (!restarts_.empty() && restarts_.front() <= now - period_ms_)
      restarts_.pop_front();
    if (static_cast<int64_t>(restarts_.size()) > intensity_) {
      k.status = child_status::failed;
      escalate(make_error(errc::intensity_exceeded, name_,
                          std::to_string(restarts_.size()) + " restarts within " +
                              std::to_string(period_ms_) + " ms (intensity " +
                              std::to_string(intensity_) + "); last: " + k.spec.name + ": " +
                              k.last_error));
      return;
    }
    // The child's budget: more than max_restarts within window_ms.
    k.window.push_back(now);
    while (!k.window.empty() && k.window.front() <= now - k.spec.window_ms)
      k.window.pop_front();
    // A half-open child (the one try after an open circuit) that fails within its window
    // opens the circuit again at once.
    bool reopen = k.half_open_since >= 0 && now - k.half_open_since < k.spec.window_ms;
    k.half_open_since = -1;
    if (reopen ||
        (k.spec.max_restarts > 0 && static_cast<int64_t>(k.window.size()) > k.spec.max_restarts)) {
      auto why = reopen ? std::string{"the half-open try failed"}
                        : "restart budget spent: " + std::to_string(k.window.size()) +
                              " restarts within " + std::to_string(k.spec.window_ms) + " ms";
      if (k.spec.circuit_open_ms > 0) {
        k.status = child_status::circuit_open;
        k.next_restart_ms = now + k.spec.circuit_open_ms;
        k.wait_reason = "circuit open: " + why;
        event("circuit_open", k.spec.name, k.wait_reason);
        schedule(k.spec.circuit_open_ms, k.uid, ++k.gen);
        return;
      }
      k.status = child_status::suppressed;
      k.wait_reason = why;
      event("suppressed", k.spec.name, k.wait_reason);
      return;
    }
    auto delay = restart_delay_ms(k.spec, k.window.size());
    switch (strategy_) {
      case strategy::one_for_one:
      case strategy::escalate_to_parent: // a normal exit of a permanent child restarts it
        restart_after(i, delay);
        return;
      case strategy::one_for_all:
      case strategy::rest_for_one: {
        size_t first = strategy_ == strategy::one_for_all ? 0 : i;
        k.pending = true;
        k.status = child_status::waiting;
        for (size_t j = kids_.size(); j-- > first;) {
          if (j == i) continue;
          auto& o = kids_[j];
          if (o.status == child_status::suppressed) continue;
          o.pending =
              !o.held && (o.status == child_status::running || o.status == child_status::waiting);
          if (o.actor && !o.terminating)
            terminate(j);
          else if (o.pending)
            ++o.gen; // a pending own restart is replaced by the group's
        }
        group_delay_ = delay;
        proceed();
        return;
      }
    }
  }

  /// A significant child ended by itself: auto_shutdown may stop this supervisor.
  void significant_ended(size_t i) {
    if (auto_shutdown_ == auto_shutdown::any_significant) {
      shutdown(supervisor_status::stopped, caf::error{},
               "auto_shutdown: significant child " + kids_[i].spec.name + " ended");
      return;
    }
    if (auto_shutdown_ == auto_shutdown::all_significant) {
      for (auto& k : kids_)
        if (k.spec.significant &&
            (k.actor || k.terminating || k.pending || k.retry_pending ||
             k.status == child_status::waiting || k.status == child_status::circuit_open))
          return; // still running, or due to run again
      shutdown(supervisor_status::stopped, caf::error{},
               "auto_shutdown: every significant child ended");
    }
  }

  void restart_after(size_t i, int64_t delay) {
    auto& k = kids_[i];
    if (delay <= 0) {
      restart_now(i);
      return;
    }
    k.status = child_status::waiting;
    k.next_restart_ms = now_ms() + delay;
    k.wait_reason = "backoff";
    event("waiting", k.spec.name, "restart in " + std::to_string(delay) + " ms");
    schedule(delay, k.uid, ++k.gen);
  }

  void restart_now(size_t i) {
    auto& k = kids_[i];
    k.pending = false;
    if (!start_child(i)) {
      // A failed restart is a failure like any other, handled in a fresh message (no
      // recursion however often it fails).
      event("failed", k.spec.name, k.last_error);
      k.status = child_status::failed;
      k.retry_pending = true;
      send(this, sup_tick_atom::value, k.uid, uint64_t{0});
      return;
    }
    ++k.restarts;
    event("restarted", k.spec.name, "restart #" + std::to_string(k.restarts));
  }

  void terminate(size_t j) {
    auto& o = kids_[j];
    o.half_open_since = -1;
    o.terminating = true;
    ++terminating_;
    if (o.spec.brutal_kill) {
      send_exit(o.actor, caf::exit_reason::kill);
    } else {
      send_exit(o.actor, caf::exit_reason::user_shutdown);
      schedule(o.spec.shutdown_ms, o.uid, kill_tag | ++o.kill_gen);
    }
  }

  void on_tick(uint64_t child, uint64_t gen) {
    if (child == finish_timer()) {
      finish();
      return;
    }
    if (child == stop_timer()) { // stop(timeout) expired: kill what is left
      if (gen == stop_gen_ && stopping_)
        for (auto& k : kids_)
          if (k.actor) send_exit(k.actor, caf::exit_reason::kill);
      return;
    }
    if (child == group_timer()) {
      if (gen == group_gen_ && !stopping_) restart_group();
      return;
    }
    auto found = index_of(child);
    if (found < 0) return; // deleted since
    auto& k = kids_[static_cast<size_t>(found)];
    child = static_cast<uint64_t>(found);
    if ((gen & kill_tag) != 0) { // the cooperative shutdown took too long
      if ((gen & ~kill_tag) == k.kill_gen && k.terminating && k.actor) {
        event("killed", k.spec.name,
              "did not stop within " + std::to_string(k.spec.shutdown_ms) + " ms");
        send_exit(k.actor, caf::exit_reason::kill);
      }
      return;
    }
    if (gen == 0) { // a restart that failed to start
      k.retry_pending = false;
      if (!stopping_ && !k.held && k.status == child_status::failed) on_child_down(child, true);
      return;
    }
    if (gen != k.gen) return;
    if (k.terminating) {
      return;
    } else if (k.status == child_status::waiting && !stopping_) {
      restart_now(child);
    } else if (k.status == child_status::circuit_open && !stopping_) {
      // The half-open try: one restart on a clean slate; if it fails within its window the
      // circuit opens again.
      k.window.clear();
      k.half_open_since = now_ms();
      event("half_open", k.spec.name, "one try after the open circuit");
      restart_now(child);
    }
  }

  /// Continues after a termination: the group restart, or the shutdown sequence.
  void proceed() {
    if (terminating_ > 0) return;
    if (stopping_) {
      shutdown_next();
      return;
    }
    bool any = false;
    for (auto& k : kids_)
      any = any || k.pending;
    if (!any) return;
    if (group_delay_ > 0) {
      for (auto& k : kids_)
        if (k.pending) {
          k.status = child_status::waiting;
          k.next_restart_ms = now_ms() + group_delay_;
          k.wait_reason = "backoff";
        }
      event("waiting", "", "group restart in " + std::to_string(group_delay_) + " ms");
      schedule(group_delay_, group_timer(), ++group_gen_);
    } else {
      restart_group();
    }
  }

  void restart_group() {
    for (size_t i = 0; i < kids_.size(); ++i)
      if (kids_[i].pending && !stopping_) restart_now(i);
  }

  // -- shutdown ------------------------------------------------------------------------------

  void escalate(caf::error err) {
    event("escalated", "", render(err));
    shutdown(supervisor_status::failed, std::move(err), "");
  }

  void shutdown(supervisor_status final_status, caf::error err, std::string why) {
    if (stopping_) return;
    stopping_ = true;
    final_status_ = final_status;
    exit_reason_ = std::move(err);
    reason_ = exit_reason_ ? render(exit_reason_) : std::move(why);
    status_ = supervisor_status::stopping;
    event("shutdown", "", reason_);
    for (auto& k : kids_) { // no restart happens any more
      ++k.gen;
      k.pending = false;
      if (k.status == child_status::waiting || k.status == child_status::circuit_open) {
        k.status = child_status::stopped;
        k.next_restart_ms = -1;
      }
    }
    proceed();
  }

  /// Stops the last running child (children stop one by one, in reverse order).
  void shutdown_next() {
    for (size_t j = kids_.size(); j-- > 0;)
      if (kids_[j].actor) {
        terminate(j);
        return;
      }
    if (starting_failed_) {
      starting_failed_ = false;
      send(this, sup_tick_atom::value, finish_timer(), uint64_t{1});
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
    }
    for (auto& rp : waiters_)
      rp.deliver(st);
    waiters_.clear();
    if (exit_reason_)
      quit(exit_reason_);
    else
      quit(parent_reason_ ? parent_reason_ : caf::error{});
  }

  troupe::clock* clk_;
  std::shared_ptr<supervisor_final> final_;
  std::string name_;
  troupe::strategy strategy_;
  int64_t intensity_;
  int64_t period_ms_;
  troupe::auto_shutdown auto_shutdown_;
  supervisor_metrics metrics_;
  std::vector<child_rec> kids_;
  supervisor_status status_ = supervisor_status::starting;
  supervisor_status final_status_ = supervisor_status::stopped;
  std::string reason_;
  caf::error exit_reason_;
  caf::error parent_reason_;
  std::deque<int64_t> restarts_;
  std::vector<supervisor_event> events_;
  std::vector<caf::actor> subscribers_;
  std::vector<caf::response_promise> waiters_;
  bool stopping_ = false;
  bool starting_failed_ = false;
  size_t terminating_ = 0;
  int64_t group_delay_ = 0;
  uint64_t group_gen_ = 0;
  uint64_t next_uid_ = 0;
  uint64_t stop_gen_ = 0;
};

} // namespace

caf::expected<caf::actor> spawn_supervisor(caf::actor_system& sys, troupe::clock& clk,
                                           supervisor_spec spec,
                                           std::shared_ptr<supervisor_final> final) {
  if (auto err = validate(spec)) return err;
  return sys.spawn<supervisor_actor>(&clk, std::move(spec), std::move(final));
}

start_fn supervisor_child(troupe::clock& clk, supervisor_spec spec) {
  auto* c = &clk;
  return [c, spec](caf::actor_system& sys) -> start_result {
    auto a = spawn_supervisor(sys, *c, spec);
    if (!a) return a.error();
    return std::optional<caf::actor>{std::move(*a)};
  };
}

} // namespace troupe
