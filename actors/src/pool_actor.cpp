// The worker pool: one actor that owns the queue, the job records and max_concurrent
// workers. Each worker is a task actor running a loop body: it asks the pool for work
// (`pool_pull`, a parked response promise while there is none), runs each job of the
// batch it gets as a sub-routine of its own task, and leaves each outcome in the job's
// cell. The pool supervises its workers itself: it monitors each one and replaces a worker
// that ends while the pool is open (one_for_one, permanent; every crash consumes the job
// that caused it, so a crash loop is bounded by the jobs queued); the jobs of the dead
// worker's batch that had not started go back to the queue.
//
// Submitters that hold credits (room the pool reserved for them) submit with a one-way
// `pool_post` and do not suspend; see pool.hpp.

#include "pool_actor.hpp"

#include "primitive_actors.hpp"
#include "troupe/messages/directory.hpp"
#include "troupe/messages/errc.hpp"

namespace troupe::detail {

using namespace troupe::atoms;

pool_actor::behavior_type pool_actor::make_behavior() {
  env_ = env_of(home_system());
  if (env_ == nullptr) {
    quit(make_error(errc::invalid_pool_spec, "runtime", "a pool needs a troupe runtime"));
    return behavior_type{behavior_type::unsafe_init{}, caf::behavior{}};
  }
  workers_.resize(static_cast<size_t>(spec_.max_concurrent));
  for (uint32_t i = 0; i < workers_.size(); ++i)
    start_worker(i);
  set_down_handler([this](caf::down_msg& dm) { on_worker_down(dm); });
  durable_ = spec_.scope == pool_scope::pipeline;
  if (durable_)
    load();
  else
    find_storage();
  return {
      [this](pool_submit_atom, pool_submission& sub,
             bool wants_credits) -> caf::result<pool_ack> {
        return on_submit(std::move(sub), wants_credits);
      },
      [this](pool_post_atom, uint64_t id, pool_submission& sub) {
        on_post(id, std::move(sub));
      },
      [this](pool_withdraw_atom) {
        // A blocked submitter gave up (its task was cancelled while it waited for room):
        // its submit never runs. (A task waits in one submit at a time, and its withdrawal
        // comes before any later submit of its own.)
        auto who = current_sender();
        for (auto i = blocked_.begin(); i != blocked_.end(); ++i)
          if (i->rp.source() == who) {
            i->rp.deliver(make_error(errc::cancelled, "", "the submitter was cancelled"));
            blocked_.erase(i);
            break;
          }
        check_idle();
      },
      [this](q_posts_atom, std::vector<caf::message>& posts) {
        // Credited submits sent together (the submitter's posts, flushed when it suspends).
        for (auto& m : posts)
          if (m.match_elements<pool_post_atom, uint64_t, pool_submission>())
            on_post(m.get_as<uint64_t>(1), std::move(m.get_mutable_as<pool_submission>(2)));
      },
      [this](q_return_atom, int64_t credits, value_batch&, bool, uint64_t) -> caf::result<bool> {
        outstanding_ = std::max<int64_t>(0, outstanding_ - credits);
        admit_blocked();
        return true;
      },
      [this](pool_pull_atom, uint32_t slot) -> caf::result<pool_batch> { return on_pull(slot); },
      [this](pool_report_atom, uint32_t slot) {
        if (slot < workers_.size()) collect(workers_[slot], false);
      },
      [this](pool_await_atom, uint64_t id) -> caf::result<pool_result_box> {
        auto i = jobs_.find(id);
        if (i == jobs_.end()) return unknown_job(id);
        settle(i->second);
        if (is_terminal(i->second.snap.status))
          return pool_result_box{i->second.snap, i->second.out};
        auto rp = make_response_promise<pool_result_box>();
        i->second.waiters.push_back(rp);
        return rp;
      },
      [this](pool_status_atom, uint64_t id) -> caf::result<pool_task_snapshot> {
        auto i = jobs_.find(id);
        if (i == jobs_.end()) return unknown_job(id);
        settle(i->second);
        return view(i->second);
      },
      [this](pool_cancel_atom, uint64_t id) -> caf::result<bool> { return on_cancel(id); },
      [this](pool_stats_atom) -> caf::result<pool_snapshot> {
        collect_finished(); // finished since the last report: ended, not active
        return snapshot();
      },
      [this](pool_idle_atom) -> caf::result<pool_snapshot> {
        collect_finished();
        if (idle()) return snapshot();
        auto rp = make_response_promise<pool_snapshot>();
        idle_waiters_.push_back(rp);
        return rp;
      },
      [this](pool_close_atom) -> caf::result<bool> {
        if (closed_) return false;
        closed_ = true;
        for (auto& b : blocked_) // blocked submitters never get room now
          b.rp.deliver(closed_error());
        blocked_.clear();
        check_idle();
        return true;
      },
      [this](pool_spec_atom) -> caf::result<pool_spec> { return spec_; },
      [this](pool_scale_atom, int64_t n) -> caf::result<runner_state> { return on_scale(n); },
      [this](pool_runners_atom) -> caf::result<runner_state> { return runner_view(); },
      [this](pool_ready_atom) -> caf::result<bool> {
        if (loading_) {
          auto rp = make_response_promise<bool>();
          ready_waiters_.push_back(rp);
          return rp;
        }
        if (load_error_) return load_error_;
        return true;
      },
      [this](pool_tasks_atom) -> caf::result<std::vector<pool_task_snapshot>> {
        collect_finished();
        std::vector<uint64_t> ids;
        ids.reserve(jobs_.size());
        jobs_.for_each([&](uint64_t id, job&) { ids.push_back(id); });
        std::sort(ids.begin(), ids.end());
        std::vector<pool_task_snapshot> out;
        out.reserve(ids.size());
        for (auto id : ids)
          out.push_back(view(jobs_.at(id)));
        return out;
      },
      [this](pool_tick_atom, uint64_t id) { on_deadline(id); },
      [this](pool_flush_atom) {
        flush_sent_ = false;
        flush_audit();
        flush_saves();
      },
  };
}

void pool_actor::on_exit() {
  stopping_ = true;
  auto err = closed_error();
  for (auto& w : workers_) {
    // Forced: the pool ends (its runtime stops), so a job that ignores a cancellation must
    // not hold the stop up. The bodies are destroyed at their suspension points (their RAII
    // cleanup runs); a durable pool finds those jobs stale after a restart.
    if (w.actor) caf::anon_send_exit(w.actor, caf::exit_reason::kill);
    if (w.pull.pending()) w.pull.deliver(err);
  }
  for (auto& b : blocked_)
    b.rp.deliver(err);
  blocked_.clear();
  jobs_.for_each([&](uint64_t, job& j) {
    if (is_terminal(j.snap.status)) return;
    j.snap.status = pool_task_status::failed;
    j.snap.error = err;
    j.out.err = err;
    for (auto& w : j.waiters)
      w.deliver(pool_result_box{j.snap, j.out});
    j.waiters.clear();
    for (auto& c : j.cancellers)
      c.deliver(false);
    j.cancellers.clear();
  });
  for (auto& rp : idle_waiters_)
    rp.deliver(err);
  idle_waiters_.clear();
  for (auto& rp : ready_waiters_)
    rp.deliver(err);
  ready_waiters_.clear();
  if (!save_buf_.empty() && storage_) // the records so far still go (no answer awaited)
    caf::anon_send(storage_, st_pool_save_atom::value, id_, std::move(save_buf_), int64_t{0});
  for (auto& [id, rps] : save_waiters_)
    for (auto& rp : rps)
      rp.deliver(err);
  save_waiters_.clear();
  workers_.clear();
  jobs_.clear();
}

caf::result<pool_batch> pool_actor::on_pull(uint32_t slot) {
  if (slot >= workers_.size() ||
      current_sender() != caf::actor_cast<caf::strong_actor_ptr>(workers_[slot].actor))
    return make_error(errc::invalid_argument, "slot", "not a worker of this pool");
  auto& w = workers_[slot];
  w.pulled = true;
  if (w.pending) { // its first pull: the batch handed out before it
    auto b = std::move(*w.pending);
    w.pending.reset();
    return b;
  }
  collect(w, true);
  if (w.retiring || w.draining || stopping_)
    return closed_error(); // it is being stopped, or its generation drains: no new job
  auto b = make_batch(slot);
  if (!b.jobs.empty()) {
    admit_blocked();
    return b;
  }
  w.pull = make_response_promise<pool_batch>();
  admit_blocked(); // a free worker and an empty queue: room for a blocked submitter
  if (w.pull.pending()) check_idle();
  return w.pull;
}

void pool_actor::collect(worker& w, bool all) {
  size_t kept = 0;
  for (size_t i = 0; i < w.batch.size(); ++i) {
    auto id = w.batch[i];
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    auto& j = it->second;
    if (settle(j)) continue;
    if (!all) {
      w.batch[kept++] = id;
      continue;
    }
    // The worker went past it without finishing it: it was withdrawn (answered).
  }
  w.batch.resize(all ? 0 : kept);
}

bool pool_actor::settle(job& j) {
  if (is_terminal(j.snap.status)) return true;
  if (!j.cell || j.cell->state.load(std::memory_order_acquire) != pool_job_cell::finished)
    return false;
  complete(j, std::move(j.cell->out));
  return true;
}

pool_batch pool_actor::make_batch(uint32_t slot) {
  pool_batch b;
  auto per_worker = queue_.size() / std::max<size_t>(live_workers(), 1);
  auto n = std::clamp<size_t>(per_worker, 1, max_batch);
  auto now_ns = env_->clock->now().time_since_epoch().count();
  while (b.jobs.size() < n) {
    auto next = queue_.pop();
    if (!next) break;
    auto& j = jobs_.at(*next);
    if (j.deadline_ns >= 0 && j.deadline_ns <= now_ns) { // passed while queued
      complete(j, outcome_box{nullptr, pool_deadline_error()});
      continue;
    }
    j.snap.status = pool_task_status::running;
    j.slot = slot;
    j.cell = recycler::make_shared<pool_job_cell>();
    workers_[slot].batch.push_back(*next);
    waits_.add((now_ns - j.submitted.time_since_epoch().count()) / 1000);
    if (audits("dequeue")) audit("dequeue", j, {});
    b.jobs.push_back(pool_assignment{*next, j.body, j.locals, j.deadline_ns, j.cell});
  }
  return b;
}

void pool_actor::dispatch() {
  for (uint32_t i = 0; i < workers_.size() && !queue_.empty(); ++i)
    if (workers_[i].free()) give(i);
  admit_blocked();
}

void pool_actor::give(uint32_t slot) {
  auto b = make_batch(slot);
  if (b.jobs.empty()) return;
  auto& w = workers_[slot];
  if (w.pull.pending()) {
    auto rp = std::move(w.pull);
    w.pull = caf::response_promise{};
    rp.deliver(std::move(b));
  } else {
    w.pending = std::move(b);
  }
}

caf::result<bool> pool_actor::on_cancel(uint64_t id) {
  auto i = jobs_.find(id);
  if (i == jobs_.end()) return unknown_job(id);
  auto& j = i->second;
  if (settle(j)) return false;
  j.cancel_requested = true;
  if (withdraw(j, make_error(errc::cancelled))) return true;
  auto rp = make_response_promise<bool>();
  j.cancellers.push_back(rp);
  stop_running(j, make_error(errc::cancelled));
  return rp;
}

void pool_actor::on_deadline(uint64_t id) {
  auto i = jobs_.find(id);
  if (i == jobs_.end()) return;
  auto& j = i->second;
  j.timer = 0;
  if (settle(j) || withdraw(j, pool_deadline_error())) return;
  stop_running(j, pool_deadline_error());
}

bool pool_actor::withdraw(job& j, caf::error reason) {
  if (j.snap.status == pool_task_status::queued) {
    queue_.remove(j.snap.id, j.seq);
  } else {
    uint8_t expected = pool_job_cell::queued;
    if (!j.cell || !j.cell->state.compare_exchange_strong(expected, pool_job_cell::withdrawn))
      return false;
  }
  complete(j, outcome_box{nullptr, std::move(reason)});
  admit_blocked();
  return true;
}

void pool_actor::complete(job& j, outcome_box out) {
  if (is_terminal(j.snap.status)) return;
  if (j.cell && j.cell->state.load(std::memory_order_acquire) == pool_job_cell::finished)
    runs_.add((j.cell->ended_ns - j.cell->started_ns) / 1000);
  if (!out.err) {
    j.snap.status = pool_task_status::completed;
    ++completed_;
  } else if (is(out.err, errc::cancelled) && j.cancel_requested) {
    j.snap.status = pool_task_status::cancelled;
    j.snap.error = out.err;
    ++cancelled_;
  } else {
    j.snap.status = pool_task_status::failed;
    j.snap.error = out.err;
    ++failed_;
  }
  j.out = std::move(out);
  if (spec_.scope == pool_scope::pipeline && j.body &&
      j.snap.status == pool_task_status::completed)
    j.snap.result_json = j.body->result_json(j.out);
  if (audits("end")) audit("end", j, {{"status", std::string{to_string(j.snap.status)}}});
  finish(j);
}

void pool_actor::finish(job& j) {
  if (durable_) {
    save(j);
    ++terminal_saves_;
  }
  if (j.timer != 0) {
    env_->clock->cancel(j.timer);
    j.timer = 0;
  }
  j.body.reset();
  j.locals.reset();
  j.cell.reset();
  for (auto& w : j.waiters)
    w.deliver(pool_result_box{j.snap, j.out});
  j.waiters.clear();
  for (auto& c : j.cancellers)
    c.deliver(j.snap.status == pool_task_status::cancelled);
  j.cancellers.clear();
  terminal_order_.push_back(j.snap.id);
  while (static_cast<int64_t>(terminal_order_.size()) > spec_.keep_terminal) {
    auto old = terminal_order_.front();
    terminal_order_.pop_front();
    if (auto i = jobs_.find(old); i != jobs_.end()) {
      if (!i->second.snap.idempotency_key.empty()) {
        auto k = idem_.find(i->second.snap.idempotency_key);
        if (k != idem_.end() && k->second == old) idem_.erase(k);
      }
      if (save_waiters_.count(old) > 0) // its save is under way: answered from this
        trimmed_waiting_.emplace(old, view(i->second));
      jobs_.erase(i);
    }
    unsaved_.erase(old); // a trimmed record is never saved again
    save_failed_.erase(old);
  }
  // The record trimmed a few jobs from now is cold (10k kept): start loading it.
  constexpr size_t trim_ahead = 4;
  if (terminal_order_.size() > trim_ahead &&
      static_cast<int64_t>(terminal_order_.size()) >= spec_.keep_terminal)
    jobs_.prefetch(terminal_order_[trim_ahead]);
  check_idle();
}

bool pool_actor::idle() const noexcept {
  if (!queue_.empty() || !blocked_.empty()) return false;
  for (auto& w : workers_)
    if (!w.batch.empty()) return false;
  return true;
}

void pool_actor::check_idle() {
  if (idle_waiters_.empty() || !idle()) return;
  auto snap = snapshot();
  for (auto& rp : idle_waiters_)
    rp.deliver(snap);
  idle_waiters_.clear();
}

pool_task_snapshot pool_actor::view(const job& j) const {
  auto s = j.snap;
  if (s.status == pool_task_status::running && j.cell &&
      j.cell->state.load(std::memory_order_acquire) == pool_job_cell::queued)
    s.status = pool_task_status::queued;
  return s;
}

pool_snapshot pool_actor::snapshot() const {
  pool_snapshot s;
  s.name = spec_.name;
  s.id = id_;
  s.max_concurrent = spec_.max_concurrent;
  s.queued = queue_.size();
  for (auto& w : workers_)
    for (auto id : w.batch) {
      auto i = jobs_.find(id);
      if (i == jobs_.end() || is_terminal(i->second.snap.status)) continue;
      if (view(i->second).status == pool_task_status::queued)
        ++s.queued;
      else
        ++s.active;
    }
  s.completed = completed_;
  s.failed = failed_;
  s.rejected = rejected_;
  s.cancelled = cancelled_;
  s.total = total_;
  s.max_depth_seen = max_depth_seen_;
  s.blocked_submitters = blocked_.size();
  s.worker_restarts = worker_restarts_;
  s.wait_p50_us = waits_.percentile(0.50);
  s.wait_p99_us = waits_.percentile(0.99);
  s.run_p50_us = runs_.percentile(0.50);
  s.run_p99_us = runs_.percentile(0.99);
  for (auto& [k, v] : drops_)
    s.drops.emplace_back(k, v);
  s.closed = closed_;
  return s;
}

caf::error pool_actor::closed_error() const {
  return make_error(errc::pool_closed, "pool", "pool \"" + spec_.name + "\" is closed");
}

caf::error pool_actor::unknown_job(uint64_t id) const {
  return make_error(errc::not_found, "task",
                    "pool \"" + spec_.name + "\" has no task " + std::to_string(id) +
                        " (unknown, or its terminal record was trimmed: keep_terminal " +
                        std::to_string(spec_.keep_terminal) + ")");
}

caf::actor spawn_pool(caf::actor_system& sys, pool_spec spec, std::string id) {
  return caf::actor_cast<caf::actor>(sys.spawn<pool_actor>(std::move(spec), std::move(id)));
}

} // namespace troupe::detail
