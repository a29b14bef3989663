// The pool supervises its workers: it starts them, replaces one that ends (the restart
// mode of a runner pool decides), stops one whose job is cancelled, and scales a runner
// pool by generations.

#include "pool_actor.hpp"

#include "primitive_actors.hpp"
#include "troupe/messages/directory.hpp"
#include "troupe/messages/errc.hpp"

namespace troupe::detail {

using namespace troupe::atoms;

size_t pool_actor::free_workers() const noexcept {
  size_t n = 0;
  for (auto& w : workers_)
    n += w.free() ? 1 : 0;
  return n;
}

void pool_actor::start_worker(uint32_t slot) {
  auto self = caf::actor_cast<caf::actor>(this);
  auto body = [self, slot](troupe::context& cx) { return pool_worker_loop(cx, self, slot); };
  auto a = task_actor::spawn_supervised(home_system(), env_, make_runner(std::move(body)),
                                        spec_.name + ".worker" + std::to_string(slot));
  monitor(a);
  auto restarts = workers_[slot].restarts;
  workers_[slot] = worker{};
  workers_[slot].actor = std::move(a);
  workers_[slot].generation = generation_;
  workers_[slot].restarts = restarts;
}

size_t pool_actor::live_workers() const noexcept {
  size_t n = 0;
  for (auto& w : workers_)
    n += w.actor && !w.draining ? 1 : 0;
  return n;
}

caf::result<runner_state> pool_actor::on_scale(int64_t n) {
  if (spec_.runners.max == 0)
    return make_error(errc::invalid_pool_spec, "n",
                      "pool \"" + spec_.name + "\" has a fixed size (open it with runners)");
  if (n < spec_.runners.min || n > spec_.runners.max)
    return make_error(errc::invalid_pool_spec, "n",
                      "must be within [" + std::to_string(spec_.runners.min) + ", " +
                          std::to_string(spec_.runners.max) + "], got " + std::to_string(n));
  if (stopping_ || closed_) return closed_error();
  ++generation_;
  for (auto& w : workers_) { // the old generation drains: nothing new, then it stops
    if (!w.actor || w.draining) continue;
    w.draining = true;
    if (w.pull.pending()) { // idle: it stops now
      auto rp = std::move(w.pull);
      w.pull = caf::response_promise{};
      rp.deliver(closed_error());
    }
  }
  spec_.max_concurrent = n;
  for (int64_t i = 0; i < n; ++i) {
    workers_.emplace_back();
    start_worker(static_cast<uint32_t>(workers_.size() - 1));
  }
  dispatch();
  return runner_view();
}

runner_state pool_actor::runner_view() {
  runner_state s;
  s.pool = spec_.name;
  s.generation = generation_;
  s.desired = spec_.max_concurrent;
  for (uint32_t i = 0; i < workers_.size(); ++i) {
    auto& w = workers_[i];
    collect(w, false);
    runner_slot_state r;
    r.slot = i;
    r.generation = w.generation;
    r.restarts = w.restarts;
    if (!w.actor)
      r.lifecycle = runner_lifecycle::stopped;
    else if (w.draining)
      r.lifecycle = runner_lifecycle::draining;
    else if (!w.batch.empty())
      r.lifecycle = runner_lifecycle::busy;
    else if (w.pull.pending())
      r.lifecycle = runner_lifecycle::idle;
    else
      r.lifecycle = runner_lifecycle::starting;
    if (w.actor) ++s.online;
    if (w.actor && !w.batch.empty()) ++s.busy;
    s.slots.push_back(r);
  }
  return s;
}

void pool_actor::on_worker_down(caf::down_msg& dm) {
  for (uint32_t slot = 0; slot < workers_.size(); ++slot) {
    auto& w = workers_[slot];
    if (w.actor.address() != dm.source) continue;
    // Its batch: finished jobs complete, the started one fails with the crash (or the
    // reason it was stopped), the ones it never started go back to the queue.
    std::vector<uint64_t> back;
    for (auto id : w.batch) {
      auto it = jobs_.find(id);
      if (it == jobs_.end()) continue;
      auto& j = it->second;
      if (settle(j)) continue;
      auto state = j.cell ? j.cell->state.load(std::memory_order_acquire)
                          : uint8_t{pool_job_cell::queued};
      if (state == pool_job_cell::started) {
        caf::error err = j.stop_reason ? j.stop_reason
                         : dm.reason   ? dm.reason
                                       : make_error(errc::task_failed, "worker",
                                                    "the worker ended while running the task");
        complete(j, outcome_box{nullptr, std::move(err)});
      } else if (state == pool_job_cell::queued) {
        back.push_back(id);
      }
    }
    put_back(back);
    if (w.pull.pending()) w.pull.deliver(closed_error());
    bool replace = !stopping_ && !w.draining;
    if (replace && !w.retiring) { // the pool did not stop it: the restart mode decides
      switch (spec_.runners.restart) {
        case pool_restart::permanent:
          break;
        case pool_restart::transient:
          replace = static_cast<bool>(dm.reason);
          break;
        case pool_restart::temporary:
          replace = false;
          break;
      }
      // A runner pool never falls below its min (a fixed pool: below its size).
      auto floor = spec_.runners.max > 0 ? spec_.runners.min : spec_.max_concurrent;
      if (!replace && static_cast<int64_t>(live_workers()) - 1 < floor) replace = true;
    }
    if (!replace) {
      w.actor = nullptr; // stopped: the slot stays in the state, with its lifecycle
      w.batch.clear();
      w.pending.reset();
      dispatch();
      check_idle();
      return;
    }
    ++worker_restarts_;
    ++w.restarts;
    start_worker(slot);
    dispatch();
    check_idle();
    return;
  }
}

void pool_actor::put_back(const std::vector<uint64_t>& ids) {
  for (auto i = ids.rbegin(); i != ids.rend(); ++i) {
    auto& j = jobs_.at(*i);
    j.snap.status = pool_task_status::queued;
    j.slot = -1;
    j.cell.reset();
    queue_.requeue(*i, j.seq, j.snap.priority, j.partition, j.has_partition);
  }
}

void pool_actor::stop_running(job& j, caf::error reason) {
  if (j.stop_reason || j.slot < 0) return; // already being stopped
  auto slot = static_cast<size_t>(j.slot);
  auto& w = workers_[slot];
  // First take back what the worker has not started after `j` (it skips withdrawn cells), so
  // that the stop cannot hit another job; they go back to the queue in their places.
  std::vector<uint64_t> back;
  bool moved_on = false; // the worker started a later job: `j` has finished
  bool after = false;
  for (auto id : w.batch) {
    if (id == j.snap.id) {
      after = true;
      continue;
    }
    if (!after) continue;
    auto it = jobs_.find(id);
    if (it == jobs_.end() || !it->second.cell) continue;
    uint8_t expected = pool_job_cell::queued;
    if (it->second.cell->state.compare_exchange_strong(expected, pool_job_cell::withdrawn))
      back.push_back(id);
    else if (expected != pool_job_cell::withdrawn)
      moved_on = true;
  }
  put_back(back);
  if (!back.empty()) {
    std::erase_if(w.batch, [&](uint64_t id) {
      return std::find(back.begin(), back.end(), id) != back.end();
    });
    dispatch();
  }
  // Finished meanwhile (a worker that started a later job has finished `j`, and the CAS
  // that saw it started makes `j`'s outcome visible): nothing to stop.
  if (settle(j) || moved_on) return;
  j.stop_reason = std::move(reason);
  w.retiring = true;
  caf::anon_send(w.actor, cancel_atom::value, cancel_mode::force());
}

} // namespace troupe::detail
