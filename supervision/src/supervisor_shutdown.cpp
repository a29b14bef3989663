// The supervisor actor: escalation and the stop sequence.

#include "supervisor_actor.hpp"

namespace troupe::detail {

void supervisor_actor::escalate(caf::error err) {
  event(supervisor_event_kind::escalated, "", render(err));
  shutdown(supervisor_status::failed, std::move(err), "");
}

void supervisor_actor::shutdown(supervisor_status final_status, caf::error err, std::string why) {
  if (stopping_) return;
  stopping_ = true;
  self_ref_ = caf::actor_cast<caf::actor>(this); // alive until finish(), whoever holds us
  final_status_ = final_status;
  exit_reason_ = std::move(err);
  reason_ = exit_reason_ ? render(exit_reason_) : std::move(why);
  status_ = supervisor_status::stopping;
  event(supervisor_event_kind::shutdown, "", reason_);
  // No restart happens any more: their timers would only hold this actor (and all it keeps)
  // alive until they fire, and on virtual time stay pending for `advance`.
  if (group_timer_ != 0) clk_->cancel(std::exchange(group_timer_, 0));
  for (auto& [uid, k] : kids_) {
    supersede_restart(k);
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

void supervisor_actor::shutdown_next() {
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
        kill_all_timer_ =
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
      prefetch_before(it);
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

void supervisor_actor::prefetch_before(child_table::iterator it) noexcept {
  // The child stopped next: its record now, and the first lines of its actor (what its exit
  // touches), while the current one stops. At 100k children neither is in any cache, and
  // the stop sequence would wait for both, child after child.
  if (it == kids_.begin()) return;
  --it;
  const auto& next = it->second;
  __builtin_prefetch(&next);
  if (!next.actor) return;
  // The control block, then the actor object behind it.
  auto* p = reinterpret_cast<const char*>(caf::actor_cast<caf::actor_control_block*>(next.actor));
  for (int line = 0; line < 8; ++line)
    __builtin_prefetch(p + line * CAF_CACHE_LINE_SIZE);
}

void supervisor_actor::record_final() {
  auto st = state();
  if (final_) {
    std::lock_guard<std::mutex> guard{final_->mtx};
    final_->state = st;
    final_->events = events_.after(0);
    final_->counts = counts();
    final_->metrics = metrics();
  }
  for (auto& rp : waiters_)
    rp.deliver(st);
  waiters_.clear();
  for (auto& [id, held] : held_answers_) // (its subtree may still be stopping)
    held.first.deliver(std::move(held.second));
  held_answers_.clear();
  for (auto& [after, rp] : event_waiters_) // no more events: an empty answer says so
    rp.deliver(std::vector<supervisor_event>{});
  event_waiters_.clear();
}

void supervisor_actor::finish() {
  status_ = final_status_;
  finished_ = true;
  // Every child has stopped: the timers of the stop would only hold this actor (and all it
  // keeps) alive until they fire, and on virtual time stay pending for `advance`.
  cancel_timers();
  kill_heap_.clear();
  kills_live_ = 0;
  record_final();
  if (exit_reason_)
    quit(exit_reason_);
  else
    quit(parent_reason_ ? parent_reason_ : caf::error{});
  self_ref_ = nullptr;
}

} // namespace troupe::detail
