// The supervisor actor: children's ends, the restart rules, timers and group restarts.

#include "supervisor_actor.hpp"

#include <charconv>

namespace troupe::detail {

void supervisor_actor::on_exit_msg(caf::exit_msg& em) {
  // A linked actor that ended normally: CAF hands its exit to this handler too. OTP's
  // supervisor ignores an EXIT from anyone but its parent; troupe's parents (a supervisor,
  // the runtime) never ask with `normal`, so a normal exit is never a request to stop.
  if (em.reason == caf::exit_reason::normal) return;
  // Our parent (or someone) asks us to exit. Stop the children first.
  if (!stopping_) {
    parent_reason_ = em.reason;
    shutdown(supervisor_status::stopped, caf::error{}, "asked to exit");
  }
}

void supervisor_actor::on_down(uint64_t uid, caf::actor_id id, const caf::error& reason) {
  auto* kp = find(uid);
  if (kp == nullptr || !kp->actor || kp->actor.id() != id) return; // an old incarnation
  auto& k = *kp;
  clear_actor(k);
  const bool awaited_group_stop = k.group_stop;
  set_group_stop(k, false);
  if (k.terminating) { // we stopped it
    k.terminating = false;
    kill_settled(k);
    --terminating_;
    supersede_restart(k);
    if (!k.pending) {
      k.status = child_status::stopped;
    } else { // a group restart's: it waits for the round (not "running" with no actor)
      k.status = child_status::waiting;
      k.wait_reason = "group restart";
    }
    event(supervisor_event_kind::stopped, k.name, "shut down by its supervisor");
    for (auto& rp : k.on_stopped)
      rp.deliver(true);
    k.on_stopped.clear();
    if (!k.pending && (k.temporary() || (k.templated && k.held))) ended_temporary(k);
    proceed();
    return;
  }
  bool failure = is_failure(reason);
  if (failure)
    k.last_error = rendered(reason);
  else
    k.last_error.clear();
  if (!failure) ++metrics_.normal_exits;
  event(failure ? supervisor_event_kind::failed : supervisor_event_kind::stopped, k.name,
        failure ? std::string_view{k.last_error}
                : reason ? std::string_view{"shutdown exit"} : std::string_view{"normal exit"});
  if (awaited_group_stop && !k.held && !stopping_) {
    // It ended by itself while a group restart waited to stop it: the round stops it
    // anyway, so its end is that stop (OTP takes the DOWN as the shutdown's answer), not
    // another restart.
    if (k.pending) {
      k.status = child_status::waiting;
      k.wait_reason = "group restart";
    } else {
      k.status = failure ? child_status::failed : child_status::stopped;
      if (k.temporary() || k.templated) ended_temporary(k);
    }
    proceed();
    return;
  }
  on_child_down(k, failure);
}

void supervisor_actor::on_child_down(child_rec& k, bool failure) {
  if (k.held) { // terminate_child holds it: no restart
    k.status = failure ? child_status::failed : child_status::stopped;
    return;
  }
  if (stopping_) {
    k.status = failure ? child_status::failed : child_status::stopped;
    proceed();
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
  // A failure this supervisor would restart is its parent's to handle (a temporary child's
  // failure, restarted by no one, is forgotten above: as under OTP's intensity 0).
  if (strategy_ == strategy::escalate_to_parent && failure) {
    k.status = child_status::failed;
    escalate(make_error(errc::child_failed, k.name,
                        "child \"" + k.name + "\" failed: " + k.last_error));
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
      schedule_restart(k, k.spec->circuit_open_ms);
      return;
    case budget_verdict::suppressed:
      k.status = child_status::suppressed;
      k.wait_reason = std::move(d.why);
      event(supervisor_event_kind::suppressed, k.name, k.wait_reason);
      // It stays down: a significant child has ended (auto_shutdown).
      if (k.spec->significant) significant_ended(k.name);
      // A dynamic supervisor's child that stays down has ended for good: forgotten, as one
      // not restarted (restart_child and delete_child refuse dynamic children).
      if (k.templated && kids_.count(k.uid) != 0) ended_temporary(k);
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

void supervisor_actor::group_restart(child_rec& k, int64_t delay) {
  // A group restart that waits for its backoff is replaced by this one: its children are
  // in this round (still pending), and its timer must not restart them while this round's
  // terminations are under way.
  ++group_gen_;
  if (group_timer_ != 0) clk_->cancel(std::exchange(group_timer_, 0));
  group_backoff_ = false;
  group_blocker_ = 0;
  set_pending(k, true);
  k.status = child_status::waiting;
  group_stop_cursor_ = 0; // this round stops from the last child down
  auto first = strategy_ == strategy::one_for_all ? kids_.begin() : kids_.find(k.uid);
  for (auto it = kids_.end(); it != first;) {
    --it;
    auto& o = it->second;
    if (o.uid == k.uid || o.status == child_status::suppressed) continue;
    // A child whose failed restart waits for its retry is in this round too (the retry
    // goes stale): left out, the round would start the children after it while it is down.
    set_pending(o, !o.temporary() && !o.held &&
                       (o.status == child_status::running || o.status == child_status::waiting ||
                        o.retry_pending));
    if (o.actor && !o.terminating) {
      set_group_stop(o, true); // stopped in turn, the last started first (proceed())
    } else if (o.pending) {
      supersede_restart(o); // a pending own restart or retry is replaced by the group's
      o.retry_pending = false;
    }
  }
  group_delay_ = delay;
  proceed();
}

void supervisor_actor::significant_ended(const std::string& name) {
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

void supervisor_actor::restart_after(child_rec& k, int64_t delay) {
  if (delay <= 0) {
    restart_now(k);
    return;
  }
  k.status = child_status::waiting;
  k.next_restart_ms = saturating_add(now_ms(), delay);
  k.wait_reason = "backoff";
  event(supervisor_event_kind::waiting, k.name, "restart in " + std::to_string(delay) + " ms");
  schedule_restart(k, delay);
}

bool supervisor_actor::restart_now(child_rec& k) {
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
  char why[32] = "restart #"; // no allocation on the hot path
  auto end = std::to_chars(why + 9, why + sizeof why, k.restarts).ptr;
  event(supervisor_event_kind::restarted, k.name, std::string_view(why, end - why));
  // A dynamic child whose restart answered ignore has ended for good: forgotten (OTP drops
  // a simple_one_for_one child whose restart returns ignore). Dynamic supervisors are
  // one_for_one: no group round iterates the children here.
  if (!k.actor && k.templated) ended_temporary(k);
  return true;
}

void supervisor_actor::terminate(child_rec& o) {
  o.budget.half_open_since = -1;
  o.terminating = true;
  ++terminating_;
  if (o.spec->brutal_kill) {
    send_exit(o.actor, caf::exit_reason::kill);
  } else {
    send_exit(o.actor, caf::exit_reason::user_shutdown);
    ++o.kill_gen;
    arm_kill(o, shutdown_of(*o.spec, o.kind));
  }
}

void supervisor_actor::kill(child_rec& k, const std::string& why) {
  event(supervisor_event_kind::killed, k.name, why);
  send_exit(k.actor, caf::exit_reason::kill);
}

bool supervisor_actor::kill_stale(const kill_deadline& e) const {
  auto i = kids_.find(e.uid);
  return i == kids_.end() || !i->second.kill_armed || i->second.kill_gen != e.gen;
}

void supervisor_actor::arm_kill(child_rec& k, int64_t delay_ms) {
  kill_settled(k); // an earlier deadline of the same child is void
  if (delay_ms >= never_ms) return; // infinity: never killed
  auto due = clk_->now() + std::chrono::milliseconds(std::max<int64_t>(delay_ms, 0));
  kill_heap_.push_back(kill_deadline{due, ++kill_seq_, k.uid, k.kill_gen});
  std::push_heap(kill_heap_.begin(), kill_heap_.end(), std::greater<>{});
  k.kill_armed = true;
  ++kills_live_;
  if (kill_timer_ != 0 && kill_timer_due_ <= due) return; // the armed timer comes first
  if (kill_timer_ != 0) clk_->cancel(kill_timer_);
  kill_timer_due_ = due;
  kill_timer_ = clk_->schedule(due, caf::actor_cast<caf::actor>(this),
                               caf::make_message(sup_tick_atom::value, sup_tick::kill,
                                                 uint64_t{0}, ++kill_timer_gen_));
}

void supervisor_actor::kill_settled(child_rec& k) noexcept {
  if (!k.kill_armed) return;
  k.kill_armed = false;
  if (--kills_live_ == 0) {
    kill_heap_.clear(); // all stale
    // On the real clock the armed timer stays: it finds nothing, or the next termination
    // reuses it (a schedule and a cancel saved per termination). Virtual time cancels it,
    // so that what is pending (and where `advance` or a stalled run jumps to) is exactly
    // what was before the queue: no timer for a child that stopped in time.
    if (kill_timer_ != 0 && clk_->is_virtual()) clk_->cancel(std::exchange(kill_timer_, 0));
  } else if (kill_heap_.size() > 2 * kills_live_ + 64) {
    std::erase_if(kill_heap_, [this](const kill_deadline& e) { return kill_stale(e); });
    std::make_heap(kill_heap_.begin(), kill_heap_.end(), std::greater<>{});
  }
}

void supervisor_actor::sweep_kills(uint64_t timer_gen) {
  if (timer_gen != kill_timer_gen_) return; // replaced by an earlier deadline's timer
  kill_timer_ = 0;
  auto now = clk_->now();
  while (!kill_heap_.empty() && (kill_heap_.front().due <= now || kill_stale(kill_heap_.front()))) {
    std::pop_heap(kill_heap_.begin(), kill_heap_.end(), std::greater<>{});
    auto e = kill_heap_.back();
    kill_heap_.pop_back();
    if (kill_stale(e)) continue;
    auto& k = kids_.at(e.uid);
    k.kill_armed = false;
    --kills_live_;
    if (k.terminating && k.actor)
      kill(k, "did not stop within " + std::to_string(shutdown_of(*k.spec, k.kind)) + " ms");
  }
  if (kill_heap_.empty()) return;
  kill_timer_due_ = kill_heap_.front().due;
  kill_timer_ = clk_->schedule(kill_timer_due_, caf::actor_cast<caf::actor>(this),
                               caf::make_message(sup_tick_atom::value, sup_tick::kill,
                                                 uint64_t{0}, ++kill_timer_gen_));
}

void supervisor_actor::on_tick(sup_tick kind, uint64_t child, uint64_t gen) {
  switch (kind) {
    case sup_tick::finish:
      finish();
      return;
    case sup_tick::subtree_stopped:
      if (gen == 0) { // after a failed start of this supervisor (make_behavior)
        shutdown(supervisor_status::failed, failed_start_, render(failed_start_));
      } else if (auto it = held_answers_.find(gen); it != held_answers_.end()) {
        // A start_child or restart_child whose subtree could not start (answer_when_stopped)
        it->second.first.deliver(std::move(it->second.second));
        held_answers_.erase(it);
      }
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
      if (gen != group_gen_) return; // superseded
      group_timer_ = 0;               // fired
      group_backoff_ = false;
      if (!stopping_) restart_group();
      return;
    case sup_tick::kill: // a kill deadline passed (the kill queue's one timer)
      if (child == 0) {
        sweep_kills(gen);
        return;
      }
      break;
    default:
      break;
  }
  auto* kp = find(child);
  if (kp == nullptr) return; // deleted since
  auto& k = *kp;
  switch (kind) {
    case sup_tick::kill: // (the kill queue's ticks name no child; see above)
      return;
    case sup_tick::retry: // a restart that failed to start
      if (!k.retry_pending || gen != k.gen) return;
      k.retry_pending = false;
      if (!stopping_ && !k.held && k.status == child_status::failed) on_child_down(k, true);
      return;
    case sup_tick::restart:
      if (gen != k.gen) return; // superseded (its timer was cancelled, but had fired)
      k.restart_timer = 0;      // fired
      if (k.terminating || stopping_) return;
      if (k.status == child_status::waiting) {
        if (restart_now(k)) continue_group();
      } else if (k.status == child_status::circuit_open) {
        // The half-open try: one restart on a clean slate; if it fails within its
        // window the circuit opens again.
        k.budget.window.clear();
        k.budget.half_open_since = now_ms();
        event(supervisor_event_kind::half_open, k.name, "one try after the open circuit");
        if (restart_now(k)) continue_group();
      }
      return;
    default:
      return;
  }
}

bool supervisor_actor::stop_next_in_group() {
  // From the child stopped last downwards (a round flags a run of children up to the last,
  // and a new round starts over from the end): each child is visited once per round, not
  // once per step. A cursor whose child is gone starts over from the end.
  auto it = kids_.end();
  const bool from_cursor = group_stop_cursor_ != 0;
  if (from_cursor)
    if (auto c = kids_.find(group_stop_cursor_); c != kids_.end()) it = c;
  while (group_stops_ > 0 && it != kids_.begin()) {
    --it;
    auto& o = it->second;
    if (!o.group_stop) continue;
    set_group_stop(o, false);
    if (o.actor && !o.terminating) {
      group_stop_cursor_ = o.uid;
      terminate(o);
      return true;
    }
  }
  group_stop_cursor_ = 0;
  if (group_stops_ == 0 || !from_cursor) return false;
  return stop_next_in_group(); // flags above the cursor (not expected): once from the end
}

void supervisor_actor::proceed() {
  if (terminating_ > 0) return;
  if (stopping_) {
    shutdown_next();
    return;
  }
  // A group restart stops its children one at a time, each after the one started after it
  // has stopped (OTP: reverse start order, each shutdown awaited).
  if (group_stops_ > 0 && stop_next_in_group()) return;
  if (pending_count_ == 0) return; // O(1): no group restart waits
  // Its backoff runs already, or its round waits for a child whose restart failed: a
  // termination outside the group (a child stopped by hand) changes neither.
  if (group_backoff_ || group_blocked()) return;
  for (auto& [uid, k] : kids_)
    if (k.pending) {
      k.status = child_status::waiting;
      k.next_restart_ms = group_delay_ > 0 ? saturating_add(now_ms(), group_delay_) : -1;
      k.wait_reason = group_delay_ > 0 ? "backoff" : "group restart";
    }
  if (group_delay_ > 0) {
    event(supervisor_event_kind::waiting, "", "group restart in " + std::to_string(group_delay_) + " ms");
    if (group_timer_ != 0) clk_->cancel(std::exchange(group_timer_, 0));
    group_timer_ = schedule(group_delay_, sup_tick::group, 0, ++group_gen_);
    group_backoff_ = true;
  } else {
    restart_group();
  }
}

void supervisor_actor::restart_group() {
  for (auto& [uid, k] : kids_) {
    if (!k.pending || stopping_) continue;
    if (k.actor) { // never started over a live incarnation
      if (k.terminating) return; // its down goes on with the round (proceed())
      set_pending(k, false);     // it runs: nothing to restart
      continue;
    }
    if (!restart_now(k)) { // the children after it wait until it runs
      group_blocker_ = k.uid;
      return;
    }
  }
}

} // namespace troupe::detail
