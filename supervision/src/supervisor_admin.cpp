// The supervisor actor: administration (start, terminate, restart and delete children).

#include "supervisor_actor.hpp"

namespace troupe::detail {

caf::result<child_state> supervisor_actor::add_static(child_spec c) {
  if (stopping_)
    return make_error(errc::supervisor_stopping, "supervisor", name_ + " is stopping");
  if (template_spec_)
    return make_error(errc::invalid_spec, "child_template",
                      "a dynamic supervisor starts children of its template only");
  if (auto err = validate_child(c, "child", auto_shutdown_)) return err;
  if (auto* o = find(c.name)) { // OTP's {error, {already_started, Pid}} / already_present
    if (o->actor || o->terminating)
      return make_error(errc::already_started, "name", "child \"" + c.name + "\" runs already");
    return make_error(errc::already_present, "name",
                      "child \"" + c.name +
                          "\" is kept, not running: restart_child or delete_child it");
  }
  auto& k = add_rec(std::make_shared<const child_spec>(std::move(c)));
  return started_or_error(k);
}

caf::result<child_state> supervisor_actor::add_templated(caf::message args) {
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

caf::error supervisor_actor::start_admin(child_rec& k, caf::actor& failed_subtree) {
  subtree_sink_scope sink{&failed_subtree};
  return start_child(k);
}

caf::result<child_state> supervisor_actor::answer_when_stopped(caf::actor failed_subtree,
                                                              caf::error out) {
  if (!failed_subtree) return out;
  // OTP: start_child / restart_child of a subtree that cannot start answers once that
  // subtree has stopped what it started. Answered on this actor's turn (a promise
  // delivered from the ending actor's thread would race with this one).
  auto id = ++held_answer_seq_;
  held_answers_.emplace(id, std::make_pair(make_response_promise(), std::move(out)));
  tick_when_ended(failed_subtree, id);
  return held_answers_.at(id).first;
}

void supervisor_actor::tick_when_ended(const caf::actor& subtree, uint64_t gen) {
  // A message to ourselves, never a promise delivered from the ending actor's thread.
  auto self = caf::actor_cast<caf::actor_addr>(this);
  subtree->attach_functor([self, gen] {
    if (auto me = caf::actor_cast<caf::actor>(self))
      caf::anon_send(me, sup_tick_atom::value, sup_tick::subtree_stopped, uint64_t{0}, gen);
  });
}

caf::result<child_state> supervisor_actor::started_or_error(child_rec& k) {
  caf::actor failed_subtree;
  if (auto err = start_admin(k, failed_subtree)) {
    auto out = make_error(errc::start_failed, k.name, k.last_error, {err});
    forget(k);
    return answer_when_stopped(std::move(failed_subtree), std::move(out));
  }
  auto st = child_of(k);
  // OTP: an ignoring dynamic or temporary child is not kept.
  if (!k.actor && (k.templated || k.temporary())) forget(k);
  return st;
}

caf::result<bool> supervisor_actor::terminate_child(const std::string& name) {
  auto* kp = find(name);
  if (kp == nullptr) return make_error(errc::unknown_child, "name", name);
  // The stop takes the children down one at a time in reverse start order (OTP's
  // supervisor is inside terminate/2 then and acts on no call).
  if (stopping_)
    return make_error(errc::supervisor_stopping, "supervisor", name_ + " is stopping");
  auto& k = *kp;
  bool was_due = k.due_to_restart();
  k.held = true;
  set_pending(k, false);
  k.retry_pending = false;
  supersede_restart(k); // no restart is pending any more
  if (k.status == child_status::waiting || k.status == child_status::circuit_open ||
      (was_due && !k.actor)) {
    k.status = child_status::stopped;
    k.next_restart_ms = -1;
  }
  // A group restart waiting for this child does not start the children it governs.
  if (was_due || k.uid == group_blocker_) cancel_group(k.uid);
  if (!k.actor) {
    if (k.temporary() || k.templated) forget(k); // OTP: deleted with it
    return false;
  }
  auto rp = make_response_promise();
  k.on_stopped.push_back(rp);
  if (!k.terminating) terminate(k);
  return rp;
}

void supervisor_actor::cancel_group(uint64_t uid) {
  if (strategy_ != strategy::one_for_all && strategy_ != strategy::rest_for_one) return;
  auto first = strategy_ == strategy::one_for_all ? kids_.begin() : kids_.upper_bound(uid);
  for (auto it = first; it != kids_.end(); ++it) {
    auto& o = it->second;
    // One a group restart was still to stop (it stops the last started first) keeps running:
    // the restart that stop was for is cancelled.
    if (o.group_stop && !o.terminating) set_group_stop(o, false);
    if (!o.pending) continue;
    set_pending(o, false);
    supersede_restart(o);
    o.next_restart_ms = -1;
    o.wait_reason.clear();
    // One that still stops for the group restart becomes `stopped` at its down.
    if (!o.terminating) o.status = o.actor ? child_status::running : child_status::stopped;
  }
  // The group restart goes on for the children still waiting for it (rest_for_one: those
  // before `uid`, the failed one among them); with none left, its backoff is over.
  if (pending_count_ == 0) {
    ++group_gen_;
    if (group_timer_ != 0) clk_->cancel(std::exchange(group_timer_, 0));
    group_backoff_ = false;
    group_blocker_ = 0;
  }
}

caf::result<child_state> supervisor_actor::restart_child(const std::string& name) {
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
  supersede_restart(k);
  caf::actor failed_subtree;
  if (auto err = start_admin(k, failed_subtree)) {
    // OTP: the child stays as it was (not running); nothing is scheduled.
    k.held = was_held;
    k.status = child_status::failed;
    event(supervisor_event_kind::failed, k.name, k.last_error);
    return answer_when_stopped(std::move(failed_subtree),
                               make_error(errc::start_failed, name, k.last_error, {err}));
  }
  ++k.restarts;
  event(supervisor_event_kind::restarted, k.name, "restart_child");
  auto st = child_of(k);
  continue_group(); // children a group restart left waiting behind it start now
  return st;
}

caf::result<bool> supervisor_actor::delete_child(const std::string& name) {
  auto* kp = find(name);
  if (kp == nullptr) return make_error(errc::unknown_child, "name", name);
  auto& k = *kp;
  if (k.templated)
    return make_error(errc::template_child, "name",
                      name + " is a dynamic child: terminate_child removes it");
  if (k.actor || k.terminating)
    return make_error(errc::child_running, "name", name + " is running: terminate it first");
  if (stopping_)
    return make_error(errc::supervisor_stopping, "supervisor", name_ + " is stopping");
  if (k.due_to_restart())
    return make_error(errc::restarting, "name",
                      name + " is waiting to be restarted: terminate it first");
  event(supervisor_event_kind::deleted, name, "");
  forget(k);
  continue_group(); // a group restart's round that stopped at this child goes on
  return true;
}

} // namespace troupe::detail
