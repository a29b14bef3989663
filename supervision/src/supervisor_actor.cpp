// The supervisor actor: its behaviour, bookkeeping, events and state.

#include "supervisor_actor.hpp"

namespace troupe::detail {

void supervisor_actor::on_exit() {
  // Dying any other way than through finish() (a kill from outside, say): no child outlives
  // us, and no timer holds this actor.
  for (auto& [uid, k] : kids_)
    if (k.actor) caf::anon_send_exit(k.actor, caf::exit_reason::kill);
  cancel_timers();
  if (!finished_) {
    // A final state all the same, so the read calls answer it and the administration calls
    // answer supervisor_stopping, as after any other end. CAF calls on_exit before the actor
    // counts as dead, so a request bounced from here on finds the final state recorded.
    // Paths here: a kill from outside (or from a parent at its shutdown timeout, perhaps
    // during our own stop), an exception escaping a handler, the last reference dropped.
    time_scope turn{this};
    finished_ = true;
    status_ = supervisor_status::failed;
    const auto& why = fail_state();
    std::string how = why == caf::make_error(caf::exit_reason::kill) ? std::string{"killed"}
                      : why                                          ? render(why)
                                                                     : std::string{"unreachable"};
    reason_ = how + (stopping_ ? ": ended before its stop sequence finished (" + reason_ + ")"
                               : std::string{": ended without its stop sequence"}) +
              "; its children were killed with it";
    for (auto& [uid, k] : kids_) {
      for (auto& rp : k.on_stopped) // terminate_child callers: it is stopped (killed)
        rp.deliver(true);
      k.on_stopped.clear();
      if (k.actor || k.terminating || k.due_to_restart() ||
          k.status == child_status::running) {
        k.status = child_status::stopped; // running or about to: killed with us
        k.last_error = "killed with its supervisor";
        k.next_restart_ms = -1;
        k.wait_reason.clear();
        k.pending = k.retry_pending = k.terminating = false;
      }
      k.actor = nullptr; // the final state holds no actor
    }
    event(supervisor_event_kind::shutdown, "", reason_);
    active_ = 0;
    record_final();
  }
  self_ref_ = nullptr;
}

void supervisor_actor::cancel_timers() noexcept {
  for (auto* t : {&kill_timer_, &stop_timer_, &kill_all_timer_, &group_timer_})
    if (*t != 0) clk_->cancel(std::exchange(*t, 0));
  for (auto& [uid, k] : kids_)
    if (k.restart_timer != 0) clk_->cancel(std::exchange(k.restart_timer, 0));
}

caf::behavior supervisor_actor::make_behavior() {
  // Deaths of children arrive as `sup_down_atom` messages from a functor attached to each
  // child (no links: a link's exit message can arrive after the notice of the same death,
  // and a link is dropped when the child receives our exit request); the message names
  // the child, so no lookup by actor is needed. It comes after every message the child
  // sent before it ended. on_exit takes the children along if we die.
  set_exit_handler([this](caf::exit_msg& em) { on_exit_msg(em); });
  become(caf::behavior{
      // The hot messages first: CAF tries a behavior's handlers in order.
      [this](sup_down_atom, uint64_t child, caf::actor_id id, caf::error& reason) {
        time_scope turn{this};
        on_down(child, id, reason);
      },
      [this](sup_tick_atom, sup_tick kind, uint64_t child, uint64_t gen) {
        time_scope turn{this};
        on_tick(kind, child, gen);
      },
      [this](sup_state_atom) { return state(); },
      [this](sup_events_atom) { return events_.after(0); },
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
          // (Unless the stop is over already: no child was running.)
          if (timeout_ms >= 0 && !finished_)
            stop_timer_ = schedule(timeout_ms, sup_tick::stop, 0, ++stop_gen_);
        }
        return rp;
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
  if (failed_start_) {
    // Finish in a later message: whoever asks for the state right after still sees why.
    starting_failed_ = true;
    if (failed_subtree_) {
      // A subtree child failed to start: OTP's start_link of that subtree returns once it
      // has stopped what it started, and only then are the children before it stopped.
      // (Its attach runs at once if it has ended already.) The one reference to it is the
      // functor's, dropped when it runs.
      self_ref_ = caf::actor_cast<caf::actor>(this); // alive until then, whoever holds us
      tick_when_ended(std::exchange(failed_subtree_, nullptr), 0);
      return {};
    }
    shutdown(supervisor_status::failed, failed_start_, render(failed_start_));
    return {};
  }
  status_ = supervisor_status::running;
  return {};
}

void supervisor_actor::subscribe(caf::actor who, bool replay, std::string prefix) {
  if (!who) return;
  if (replay)
    for (size_t i = 0; i < events_.size(); ++i)
      caf::anon_send(who, qualified(events_[i], prefix));
  auto self = caf::actor_cast<caf::actor_addr>(this);
  who->attach_functor([self, addr = who.address()] {
    if (auto sup = caf::actor_cast<caf::actor>(self))
      caf::anon_send(sup, sup_unsub_atom::value, addr);
  });
  subscribers_.push_back(subscriber{std::move(who), std::move(prefix)});
}

child_rec& supervisor_actor::add_rec(std::shared_ptr<const child_spec> spec, std::string name) {
  auto uid = ++next_uid_;
  auto& k = kids_.append(uid);
  k.uid = uid;
  k.kind = kind_of(*spec);
  k.subtree = spec->start && spec->start.target<subtree_start>() != nullptr;
  k.name = name.empty() ? spec->name : std::move(name);
  k.spec = std::move(spec);
  by_name_.emplace(k.name, &k);
  if (k.kind == child_kind::supervisor) ++supervisor_specs_;
  return k;
}

void supervisor_actor::set_pending(child_rec& k, bool on) {
  if (k.pending == on) return;
  k.pending = on;
  if (on)
    ++pending_count_;
  else
    --pending_count_;
}

void supervisor_actor::forget(child_rec& k) {
  set_pending(k, false);
  set_group_stop(k, false);
  if (k.restart_timer != 0) clk_->cancel(std::exchange(k.restart_timer, 0));
  kill_settled(k);
  by_name_.erase(k.name);
  if (k.kind == child_kind::supervisor) --supervisor_specs_;
  kids_.erase(k.uid);
}

void supervisor_actor::ended_temporary(child_rec& k) {
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

child_rec* supervisor_actor::find(const std::string& name) {
  auto i = by_name_.find(name);
  return i == by_name_.end() ? nullptr : i->second;
}

child_rec* supervisor_actor::find(uint64_t uid) {
  auto i = kids_.find(uid);
  return i == kids_.end() ? nullptr : &i->second;
}

void supervisor_actor::set_actor(child_rec& k, caf::actor a) {
  k.actor = std::move(a);
  ++active_;
  if (k.spec->significant) ++significant_running_;
  // Also from the constructor (the static children start there, OTP's start_link): while
  // the child's memory is in the cache, not in a second pass over every child. A down
  // message that comes before this actor runs waits in its mailbox (CAF schedules an actor
  // for the first time at its launch, whatever its mailbox holds).
  watch(k);
}

void supervisor_actor::clear_actor(child_rec& k) {
  if (!k.actor) return;
  k.actor = nullptr;
  --active_;
  if (k.spec->significant) --significant_running_;
}

void supervisor_actor::watch(child_rec& k) {
  // A weak reference: a child does not keep its supervisor alive.
  auto self = caf::actor_cast<caf::actor_addr>(this);
  k.actor->attach_functor([self, uid = k.uid, id = k.actor.id()](const caf::error& reason) {
    auto sup = caf::actor_cast<caf::actor>(self);
    if (!sup) return;
    // A child on another node whose node went away (or whose connection broke): CAF ends
    // its proxy with remote_link_unreachable; to the supervisor that is a failure.
    if (reason == caf::exit_reason::remote_link_unreachable)
      caf::anon_send(sup, sup_down_atom::value, uid, id,
                     make_error(errc::node_down, "child",
                                "the child's node went down or its connection broke"));
    else
      caf::anon_send(sup, sup_down_atom::value, uid, id, reason);
  });
  if (k.subtree) // a troupe supervisor; anonymous: its `true` reply would come back here
    caf::anon_send(k.actor, sup_subscribe_atom::value, caf::actor_cast<caf::actor>(this),
                   true, k.name);
}

troupe::clock::timer_id supervisor_actor::schedule(int64_t delay_ms, sup_tick kind, uint64_t child,
                                 uint64_t gen) {
  if (delay_ms >= never_ms) return 0; // infinity: never fires
  return clk_->schedule(clk_->now() + std::chrono::milliseconds(std::max<int64_t>(delay_ms, 0)),
                 caf::actor_cast<caf::actor>(this),
                 caf::make_message(sup_tick_atom::value, kind, child, gen));
}

supervisor_event supervisor_actor::qualified(const supervisor_event& e, const std::string& prefix) {
  if (prefix.empty()) return e;
  auto q = e;
  q.child = e.child.empty() ? prefix : prefix + "/" + e.child;
  return q;
}

void supervisor_actor::event(supervisor_event_kind kind, const std::string& child,
                             std::string_view reason) {
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
  // Written in place: the slot's strings keep their buffers.
  auto& e = events_.next_slot();
  e.at_ms = wall_ms();
  e.kind = kind;
  e.child = child;
  e.reason = reason;
  e.seq = ++event_seq_;
  published();
}

const std::string& supervisor_actor::rendered(const caf::error& reason) {
  // caf::error compares code and category only: an error with context is rendered afresh.
  if (!reason || !reason.context().empty() || reason != last_reason_ || !last_reason_) {
    last_rendered_ = render(reason);
    last_reason_ = reason && reason.context().empty() ? reason : caf::error{};
  }
  return last_rendered_;
}

std::vector<supervisor_event> supervisor_actor::events_after(uint64_t after) const {
  return events_.after(after);
}

void supervisor_actor::publish(supervisor_event e) {
  e.seq = ++event_seq_;
  events_.next_slot() = std::move(e);
  published();
}

void supervisor_actor::published() {
  if (!event_waiters_.empty()) {
    for (auto& [after, rp] : event_waiters_)
      rp.deliver(events_after(after));
    event_waiters_.clear();
  }
  for (auto& sub : subscribers_)
    send(sub.who, qualified(events_.back(), sub.prefix));
}

child_state supervisor_actor::child_of(const child_rec& k) const {
  return child_state{k.name,        k.status,  k.restarts, k.last_error, k.next_restart_ms,
                     k.wait_reason, k.actor, k.kind};
}

supervisor_state supervisor_actor::state() const {
  supervisor_state st;
  st.name = name_;
  st.status = status_;
  st.reason = reason_;
  st.children.reserve(kids_.size());
  for (auto& [uid, k] : kids_)
    st.children.push_back(child_of(k));
  return st;
}

child_counts supervisor_actor::counts() const {
  child_counts n;
  n.active = active_;
  n.supervisors = supervisor_specs_;
  n.workers = kids_.size() - supervisor_specs_;
  // A dynamic supervisor has one spec, its template (OTP's simple_one_for_one); its
  // children are counted as workers or supervisors.
  n.specs = template_start_ ? 1 : kids_.size();
  return n;
}

supervisor_metrics supervisor_actor::metrics() const {
  auto m = metrics_;
  m.children = kids_.size();
  m.active = active_;
  m.subscribers = subscribers_.size();
  return m;
}

caf::error supervisor_actor::start_child(child_rec& k) {
  start_result r{caf::error{}};
  try {
    r = k.templated ? template_start_(*sys_, k.args) : k.spec->start(*sys_);
  } catch (const std::exception& e) {
    r = make_error(errc::start_failed, k.name, e.what());
  } catch (...) {
    r = make_error(errc::start_failed, k.name, "a non-standard exception");
  }
  time_moved(); // the start function may have taken a while
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

caf::error supervisor_actor::start_failure(const child_rec& k, const caf::error& err) {
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

} // namespace troupe::detail
