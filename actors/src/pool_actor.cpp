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

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <caf/all.hpp>

#include "primitive_actors.hpp"
#include "troupe/actors/context.hpp"
#include "troupe/actors/detail/pool_queue.hpp"
#include "troupe/actors/detail/task_actor.hpp"
#include "troupe/messages/directory.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/pool.hpp"
#include "troupe/messages/storage.hpp"

namespace troupe::detail {

namespace {

using namespace troupe::atoms;

caf::error deadline_error() {
  return make_error(errc::deadline_exceeded, "deadline",
                    "the submitter's deadline passed before the task finished");
}

/// The loop body of a worker: pull a batch, run its jobs in order, pull again.
task<void> pool_worker_loop(context& cx, caf::actor pool, uint32_t slot) {
  auto* self = access::impl(cx);
  constexpr int64_t report_every_ns = 1'000'000; // a long batch reports every millisecond
  for (;;) {
    auto batch = co_await cx.request<pool_batch>(pool, pool_pull_atom::value, slot);
    if (!batch) co_return; // the pool is gone or stops this worker
    auto last_report = cx.now().time_since_epoch().count();
    for (size_t i = 0; i < batch->jobs.size(); ++i) {
      auto& a = batch->jobs[i];
      auto& cell = *a.cell;
      uint8_t expected = pool_job_cell::queued;
      if (!cell.state.compare_exchange_strong(expected, pool_job_cell::started))
        continue; // withdrawn by the pool (a cancel, a deadline): it answered for it
      cell.started_ns = cx.now().time_since_epoch().count();
      if (a.deadline_ns >= 0 && cell.started_ns >= a.deadline_ns) {
        cell.out.err = deadline_error();
      } else {
        self->locals(std::static_pointer_cast<const task_locals::element_type>(a.locals));
        if (a.deadline_ns >= 0)
          self->deadline(clock::time_point{clock::duration{a.deadline_ns}});
        else
          self->deadline(std::nullopt);
        try {
          cell.out = co_await a.body->run(cx);
        } catch (const task_cancelled&) {
          throw; // the worker itself is being stopped (the runtime stops)
        } catch (...) {
          cell.out.err = error_from_current_exception("body");
        }
      }
      cell.ended_ns = cx.now().time_since_epoch().count();
      a.body.reset(); // what the body captured goes now, not with the batch
      a.locals.reset();
      cell.state.store(pool_job_cell::finished, std::memory_order_release);
      if (i + 1 < batch->jobs.size() && cell.ended_ns - last_report >= report_every_ns) {
        last_report = cell.ended_ns;
        self->send(pool, pool_report_atom::value, slot);
      }
    }
  }
}

/// A ring of the most recent samples, for p50 / p99.
class sample_ring {
 public:
  void add(int64_t x) {
    if (xs_.size() < cap) {
      xs_.push_back(x);
    } else {
      xs_[next_] = x;
      next_ = (next_ + 1) % cap;
    }
  }
  [[nodiscard]] int64_t percentile(double p) const {
    if (xs_.empty()) return 0;
    auto v = xs_;
    auto k = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return v[k];
  }

 private:
  static constexpr size_t cap = 4096;
  std::vector<int64_t> xs_;
  size_t next_ = 0;
};

class pool_actor final : public caf::event_based_actor {
 public:
  pool_actor(caf::actor_config& cfg, pool_spec spec, std::string id)
      : caf::event_based_actor(cfg), spec_(std::move(spec)), id_(std::move(id)),
        queue_(spec_.queue.kind) {}

  const char* name() const override { return "troupe.pool"; }

  caf::behavior make_behavior() override {
    env_ = env_of(home_system());
    if (env_ == nullptr) {
      quit(make_error(errc::invalid_pool_spec, "runtime", "a pool needs a troupe runtime"));
      return {};
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
        [this](pool_post_atom, uint64_t id, pool_submission& sub) { on_post(id, std::move(sub)); },
        [this](q_posts_atom, std::vector<caf::message>& posts) {
          // Credited submits sent together (the submitter's posts, flushed when it suspends).
          for (auto& m : posts)
            if (m.match_elements<pool_post_atom, uint64_t, pool_submission>())
              on_post(m.get_as<uint64_t>(1), std::move(m.get_mutable_as<pool_submission>(2)));
        },
        [this](q_return_atom, int64_t credits, value_batch&, bool) {
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
        [this](pool_stats_atom) { return snapshot(); },
        [this](pool_idle_atom) -> caf::result<pool_snapshot> {
          for (auto& w : workers_)
            collect(w, false);
          if (idle()) return snapshot();
          auto rp = make_response_promise<pool_snapshot>();
          idle_waiters_.push_back(rp);
          return rp;
        },
        [this](pool_close_atom) {
          if (closed_) return false;
          closed_ = true;
          for (auto& b : blocked_) // blocked submitters never get room now
            b.rp.deliver(closed_error());
          blocked_.clear();
          check_idle();
          return true;
        },
        [this](pool_spec_atom) { return spec_; },
        [this](pool_scale_atom, int64_t n) -> caf::result<runner_state> { return on_scale(n); },
        [this](pool_runners_atom) { return runner_view(); },
        [this](pool_ready_atom) -> caf::result<bool> {
          if (loading_) {
            auto rp = make_response_promise<bool>();
            ready_waiters_.push_back(rp);
            return rp;
          }
          if (load_error_) return load_error_;
          return true;
        },
        [this](pool_tasks_atom) {
          std::vector<uint64_t> ids;
          ids.reserve(jobs_.size());
          for (auto& kvp : jobs_)
            ids.push_back(kvp.first);
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

  void on_exit() override {
    stopping_ = true;
    auto err = closed_error();
    for (auto& w : workers_) {
      if (w.actor) caf::anon_send_exit(w.actor, caf::exit_reason::user_shutdown);
      if (w.pull.pending()) w.pull.deliver(err);
    }
    for (auto& b : blocked_)
      b.rp.deliver(err);
    blocked_.clear();
    for (auto& kvp : jobs_) {
      auto& j = kvp.second;
      if (is_terminal(j.snap.status)) continue;
      j.snap.status = pool_task_status::failed;
      j.snap.error = err;
      j.out.err = err;
      for (auto& w : j.waiters)
        w.deliver(pool_result_box{j.snap, j.out});
      j.waiters.clear();
      for (auto& c : j.cancellers)
        c.deliver(false);
      j.cancellers.clear();
    }
    for (auto& rp : idle_waiters_)
      rp.deliver(err);
    idle_waiters_.clear();
    for (auto& rp : ready_waiters_)
      rp.deliver(err);
    ready_waiters_.clear();
    if (!save_buf_.empty() && storage_) // the records so far still go (no answer awaited)
      caf::anon_send(storage_, st_pool_save_atom::value, id_, std::move(save_buf_), int64_t{0});
    for (auto& a : unsaved_acks_)
      a.first.deliver(err);
    unsaved_acks_.clear();
    workers_.clear();
    jobs_.clear();
  }

 private:
  struct job {
    pool_task_snapshot snap;
    std::shared_ptr<pool_body> body;
    std::shared_ptr<const void> locals;
    int64_t deadline_ns = -1;
    outcome_box out;
    std::vector<caf::response_promise> waiters;
    std::vector<caf::response_promise> cancellers;
    clock::time_point submitted{};
    clock::timer_id timer = 0;
    /// The worker it was handed to (-1: none) and the cell the two share.
    int64_t slot = -1;
    std::shared_ptr<pool_job_cell> cell;
    /// Why its worker is being stopped: a cancel or its deadline (empty: not stopped).
    caf::error stop_reason;
    /// The fair_round_robin partition (kept for a requeue).
    std::string partition;
    bool has_partition = false;
  };

  struct worker {
    caf::actor actor;
    /// The jobs of its current batch, in start order (empty: idle).
    std::vector<uint64_t> batch;
    /// Its parked pull while it waits for work.
    caf::response_promise pull;
    /// Being stopped (a job of it was cancelled): gets no new job, replaced when it ends.
    bool retiring = false;
    /// A batch handed out before the worker's first pull (a fresh worker is free at once).
    std::optional<pool_batch> pending;
    /// Its generation (a runner pool's `scale` starts a new one).
    uint64_t generation = 1;
    /// Of an old generation: finishes what it holds, takes nothing new, then stops.
    bool draining = false;
    /// Times this slot's worker was replaced.
    uint64_t restarts = 0;
    /// It has pulled at least once (a fresh worker has not).
    bool pulled = false;
    /// Returns whether it can take work now.
    [[nodiscard]] bool free() const noexcept {
      return batch.empty() && !retiring && !draining && actor;
    }
  };

  struct blocked_submit {
    caf::response_promise rp;
    pool_submission sub;
    clock::time_point at;
    bool wants_credits;
  };

  // -- submit ---------------------------------------------------------------------------

  [[nodiscard]] bool bounded() const noexcept {
    return spec_.backpressure.kind == pool_backpressure_kind::queue;
  }

  /// Returns whether a bounded queue has room for one more (reserved credits count).
  [[nodiscard]] bool has_room() const noexcept {
    return static_cast<int64_t>(queue_.size()) + outstanding_ < spec_.backpressure.max_depth;
  }

  caf::result<pool_ack> on_submit(pool_submission sub, bool wants_credits) {
    if (loading_ || load_error_)
      return load_error_ ? load_error_
                         : make_error(errc::pool_closed, "pool", "the pool is still loading");
    if (closed_) return closed_error();
    if (!sub.body)
      return make_error(errc::invalid_pool_spec, "body", "the submitted body is empty");
    if (auto* j = find_idempotent(sub.idempotency_key)) {
      if (durable_ && unsaved_.count(j->snap.id) > 0) return after_save(j->snap.id);
      return pool_ack{view(*j), 0, 0};
    }
    auto now = env_->clock->now();
    auto& bp = spec_.backpressure;
    switch (bp.kind) {
      case pool_backpressure_kind::unbounded:
        break;
      case pool_backpressure_kind::fail_fast:
        if (free_workers() == 0 || !queue_.empty())
          return make_error(errc::pool_no_worker, "pool",
                            "pool \"" + spec_.name + "\" has no free worker (fail_fast, " +
                                std::to_string(spec_.max_concurrent) + " running)");
        break;
      case pool_backpressure_kind::ring_buffer:
        if (free_workers() == 0 && static_cast<int64_t>(queue_.size()) >= bp.capacity)
          evict_oldest("ring_buffer", bp.capacity);
        break;
      case pool_backpressure_kind::queue:
        if (free_workers() > 0 || has_room()) {
          if (!blocked_.empty()) { // FIFO among submitters: wait behind the blocked ones
            auto rp = make_response_promise<pool_ack>();
            blocked_.push_back(blocked_submit{rp, std::move(sub), now, wants_credits});
            return rp;
          }
          break;
        }
        switch (bp.on_full) {
          case pool_on_full::block_submitter: {
            auto rp = make_response_promise<pool_ack>();
            blocked_.push_back(blocked_submit{rp, std::move(sub), now, wants_credits});
            return rp;
          }
          case pool_on_full::drop_oldest:
            evict_oldest("drop_oldest", bp.max_depth);
            break;
          case pool_on_full::drop_newest: {
            auto& j = accept(++next_id_, std::move(sub), now, false);
            auto id = j.snap.id;
            reject(j, "queue full: the new task was dropped", "drop_newest", bp.max_depth);
            if (durable_) return after_save(id);
            return pool_ack{jobs_.at(id).snap, 0, 0};
          }
          case pool_on_full::fail_submitter:
            return make_error(errc::pool_queue_full, "pool",
                              "pool \"" + spec_.name + "\" has " + std::to_string(queue_.size()) +
                                  " queued (max_depth " + std::to_string(bp.max_depth) + ")");
        }
        break;
    }
    auto id = accept(++next_id_, std::move(sub), now, true).snap.id;
    dispatch();
    if (durable_) return after_save(id);
    return ack_for(id, wants_credits);
  }

  /// A durable pool answers a submit once the record is committed.
  caf::result<pool_ack> after_save(uint64_t id) {
    auto rp = make_response_promise<pool_ack>();
    unsaved_acks_.emplace_back(rp, id);
    return rp;
  }

  /// Answers an accepted submit, with credits when the submitter wants some.
  pool_ack ack_for(uint64_t id, bool wants_credits) {
    pool_ack ack;
    if (auto i = jobs_.find(id); i != jobs_.end()) ack.snapshot = view(i->second);
    if (!wants_credits || closed_ || durable_) return ack;
    int64_t grant = 0;
    switch (spec_.backpressure.kind) {
      case pool_backpressure_kind::unbounded:
      case pool_backpressure_kind::ring_buffer:
        grant = max_grant;
        break;
      case pool_backpressure_kind::queue:
        if (spec_.backpressure.on_full == pool_on_full::drop_oldest) {
          grant = max_grant; // a full queue evicts: no room to reserve
        } else {
          auto room = spec_.backpressure.max_depth - static_cast<int64_t>(queue_.size()) -
                      outstanding_;
          grant = std::clamp<int64_t>(room / 2, 0, max_grant);
          outstanding_ += grant;
        }
        break;
      case pool_backpressure_kind::fail_fast:
        break;
    }
    if (grant > 0) {
      ack.credits = grant;
      ack.first_id = next_id_ + 1;
      next_id_ += static_cast<uint64_t>(grant);
    }
    return ack;
  }

  /// A submit paid with a credit: room was reserved, so it is never blocked or refused.
  void on_post(uint64_t id, pool_submission sub) {
    auto now = env_->clock->now();
    if (bounded() && spec_.backpressure.on_full != pool_on_full::drop_oldest)
      outstanding_ = std::max<int64_t>(0, outstanding_ - 1);
    if (closed_ || !sub.body) { // recorded, so that its handle can tell
      auto& j = accept(id, std::move(sub), now, false);
      complete(j, outcome_box{nullptr, closed_ ? closed_error()
                                               : make_error(errc::invalid_pool_spec, "body",
                                                            "the submitted body is empty")});
      return;
    }
    auto& bp = spec_.backpressure;
    if (bp.kind == pool_backpressure_kind::ring_buffer && free_workers() == 0 &&
        static_cast<int64_t>(queue_.size()) >= bp.capacity)
      evict_oldest("ring_buffer", bp.capacity);
    else if (bounded() && bp.on_full == pool_on_full::drop_oldest && free_workers() == 0 &&
             static_cast<int64_t>(queue_.size()) >= bp.max_depth)
      evict_oldest("drop_oldest", bp.max_depth);
    accept(id, std::move(sub), now, true);
    dispatch();
  }

  job* find_idempotent(const std::string& key) {
    if (key.empty()) return nullptr;
    auto i = idem_.find(key);
    if (i == idem_.end()) return nullptr;
    auto j = jobs_.find(i->second);
    return j == jobs_.end() ? nullptr : &j->second;
  }

  /// Records a new job under `id`; queues it when `enqueue`.
  job& accept(uint64_t id, pool_submission sub, clock::time_point now, bool enqueue) {
    auto& j = jobs_[id];
    j.snap.id = id;
    j.snap.status = pool_task_status::queued;
    j.snap.submitted_at_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
    j.snap.priority = sub.priority;
    j.snap.key = sub.has_key ? sub.key : std::string{};
    j.snap.idempotency_key = sub.idempotency_key;
    j.body = std::move(sub.body);
    j.locals = std::move(sub.locals);
    j.deadline_ns = sub.deadline_ns;
    j.submitted = now;
    ++total_;
    if (!j.snap.idempotency_key.empty()) idem_[j.snap.idempotency_key] = id;
    if (durable_) save(j);
    if (enqueue) {
      std::tie(j.partition, j.has_partition) = partition_of(sub.has_key, j);
      queue_.push(id, id, j.snap.priority, j.partition, j.has_partition);
      max_depth_seen_ = std::max<uint64_t>(max_depth_seen_, queue_.size());
      if (j.deadline_ns >= 0)
        j.timer = env_->clock->schedule(clock::time_point{clock::duration{j.deadline_ns}},
                                        caf::actor_cast<caf::actor>(this),
                                        caf::make_message(pool_tick_atom::value, id));
      if (audits("submit")) audit("submit", j, {});
    }
    return j;
  }

  /// Returns the fair_round_robin partition of a submit: its key, or the submitter's
  /// task-local value named by the strategy's key.
  std::pair<std::string, bool> partition_of(bool has_key, const job& j) const {
    if (spec_.queue.kind != pool_queue_kind::fair_round_robin) return {{}, false};
    if (spec_.queue.key == "key") return {j.snap.key, has_key};
    auto locals = std::static_pointer_cast<const task_locals::element_type>(j.locals);
    if (!locals) return {{}, false};
    auto i = locals->find(spec_.queue.key);
    if (i == locals->end()) return {{}, false};
    if (auto* s = std::any_cast<std::string>(&i->second)) return {*s, true};
    if (auto* n = std::any_cast<int64_t>(&i->second)) return {std::to_string(*n), true};
    if (auto* n = std::any_cast<int>(&i->second)) return {std::to_string(*n), true};
    return {{}, false};
  }

  void evict_oldest(const char* policy, int64_t max_depth) {
    auto victim = queue_.oldest();
    if (!victim) return;
    queue_.remove(*victim);
    reject(jobs_.at(*victim), "evicted by a newer task", policy, max_depth);
  }

  void reject(job& j, std::string reason, const char* policy, int64_t max_depth) {
    j.snap.status = pool_task_status::rejected;
    j.snap.rejection_reason = std::move(reason);
    j.snap.rejection_policy = policy;
    j.out.err = make_error(errc::pool_task_rejected, "task",
                           "rejected by " + std::string{policy} + ": " + j.snap.rejection_reason);
    j.snap.error = j.out.err;
    ++rejected_;
    ++drops_[policy];
    if (audits("drop"))
      audit("drop", j, {{"policy", policy}, {"depth", queue_.size()}, {"max_depth", max_depth}});
    finish(j);
  }

  // -- workers --------------------------------------------------------------------------

  [[nodiscard]] size_t free_workers() const noexcept {
    size_t n = 0;
    for (auto& w : workers_)
      n += w.free() ? 1 : 0;
    return n;
  }

  void start_worker(uint32_t slot) {
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

  /// Returns the workers that take work (not stopped, not draining).
  [[nodiscard]] size_t live_workers() const noexcept {
    size_t n = 0;
    for (auto& w : workers_)
      n += w.actor && !w.draining ? 1 : 0;
    return n;
  }

  // -- runner pools -----------------------------------------------------------------------

  caf::result<runner_state> on_scale(int64_t n) {
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

  runner_state runner_view() {
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

  caf::result<pool_batch> on_pull(uint32_t slot) {
    if (slot >= workers_.size() ||
        current_sender() != caf::actor_cast<caf::strong_actor_ptr>(workers_[slot].actor))
      return make_error(errc::invalid_argument, "slot", "not a worker of this pool");
    auto& w = workers_[slot];
    if (w.pending) { // its first pull: the batch handed out before it
      auto b = std::move(*w.pending);
      w.pending.reset();
      return b;
    }
    w.pulled = true;
    collect(w, true);
    if (w.retiring || w.draining || stopping_)
      return closed_error(); // it is being stopped, or its generation drains: no new job
    auto b = make_batch(slot);
    if (!b.jobs.empty()) {
      admit_blocked();
      return b;
    }
    w.pull = make_response_promise<pool_batch>();
    check_idle();
    return w.pull;
  }

  /// Takes the outcomes the worker left in its cells: every job of its batch when the
  /// batch is done (`all`), else those finished so far.
  void collect(worker& w, bool all) {
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

  /// Completes `j` when its worker has finished it (its cell says so); returns whether
  /// `j` is terminal.
  bool settle(job& j) {
    if (is_terminal(j.snap.status)) return true;
    if (!j.cell || j.cell->state.load(std::memory_order_acquire) != pool_job_cell::finished)
      return false;
    complete(j, std::move(j.cell->out));
    return true;
  }

  /// Pops the next jobs for `slot`: one, or several from a deep queue.
  pool_batch make_batch(uint32_t slot) {
    pool_batch b;
    auto per_worker = queue_.size() / (2 * std::max<size_t>(live_workers(), 1));
    auto n = std::clamp<size_t>(per_worker, 1, max_batch);
    auto now_ns = env_->clock->now().time_since_epoch().count();
    while (b.jobs.size() < n) {
      auto next = queue_.pop();
      if (!next) break;
      auto& j = jobs_.at(*next);
      if (j.deadline_ns >= 0 && j.deadline_ns <= now_ns) { // passed while queued
        complete(j, outcome_box{nullptr, deadline_error()});
        continue;
      }
      j.snap.status = pool_task_status::running;
      j.slot = slot;
      j.cell = std::make_shared<pool_job_cell>();
      workers_[slot].batch.push_back(*next);
      waits_.add(std::chrono::duration_cast<std::chrono::microseconds>(
                     env_->clock->now() - j.submitted)
                     .count());
      if (audits("dequeue")) audit("dequeue", j, {});
      b.jobs.push_back(pool_assignment{*next, j.body, j.locals, j.deadline_ns, j.cell});
    }
    return b;
  }

  /// Hands queued jobs to free workers.
  void dispatch() {
    for (uint32_t i = 0; i < workers_.size() && !queue_.empty(); ++i)
      if (workers_[i].free()) give(i);
    admit_blocked();
  }

  /// Hands a batch to the free worker `slot` (its parked pull, or held for its first pull).
  void give(uint32_t slot) {
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

  /// Admits blocked submitters (FIFO) while there is room.
  void admit_blocked() {
    while (!blocked_.empty() && !closed_ && (has_room() || (free_workers() > 0 && queue_.empty()))) {
      auto b = std::move(blocked_.front());
      blocked_.pop_front();
      if (auto* j = find_idempotent(b.sub.idempotency_key)) {
        b.rp.deliver(pool_ack{view(*j), 0, 0});
        continue;
      }
      auto id = accept(++next_id_, std::move(b.sub), b.at, true).snap.id;
      for (uint32_t i = 0; i < workers_.size(); ++i) // a free worker starts it right away
        if (workers_[i].free()) {
          give(i);
          break;
        }
      if (durable_)
        unsaved_acks_.emplace_back(b.rp, id);
      else
        b.rp.deliver(ack_for(id, b.wants_credits));
    }
  }

  void on_worker_down(caf::down_msg& dm) {
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
      for (auto i = back.rbegin(); i != back.rend(); ++i) {
        auto& j = jobs_.at(*i);
        j.snap.status = pool_task_status::queued;
        j.slot = -1;
        j.cell.reset();
        queue_.requeue(*i, *i, j.snap.priority, j.partition, j.has_partition);
      }
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

  // -- cancel and deadlines -------------------------------------------------------------

  caf::result<bool> on_cancel(uint64_t id) {
    auto i = jobs_.find(id);
    if (i == jobs_.end()) return unknown_job(id);
    auto& j = i->second;
    if (settle(j)) return false;
    if (withdraw(j, make_error(errc::cancelled))) return true;
    auto rp = make_response_promise<bool>();
    j.cancellers.push_back(rp);
    stop_running(j, make_error(errc::cancelled));
    return rp;
  }

  void on_deadline(uint64_t id) {
    auto i = jobs_.find(id);
    if (i == jobs_.end()) return;
    auto& j = i->second;
    j.timer = 0;
    if (settle(j) || withdraw(j, deadline_error())) return;
    stop_running(j, deadline_error());
  }

  /// Ends a job that has not started with `reason` (a queued one leaves the queue, one
  /// handed to a worker is withdrawn from its batch); returns false when it has started.
  bool withdraw(job& j, caf::error reason) {
    if (j.snap.status == pool_task_status::queued) {
      queue_.remove(j.snap.id);
    } else {
      uint8_t expected = pool_job_cell::queued;
      if (!j.cell || !j.cell->state.compare_exchange_strong(expected, pool_job_cell::withdrawn))
        return false;
    }
    complete(j, outcome_box{nullptr, std::move(reason)});
    admit_blocked();
    return true;
  }

  /// Stops the worker running `j` (forced: the body is destroyed at its suspension point,
  /// its RAII cleanup runs, its children are cancelled); `reason` becomes its outcome.
  void stop_running(job& j, caf::error reason) {
    if (j.stop_reason || j.slot < 0) return; // already being stopped
    j.stop_reason = std::move(reason);
    auto& w = workers_[static_cast<size_t>(j.slot)];
    w.retiring = true;
    caf::anon_send(w.actor, cancel_atom::value, cancel_force);
  }

  // -- ends -----------------------------------------------------------------------------

  void complete(job& j, outcome_box out) {
    if (is_terminal(j.snap.status)) return;
    if (j.cell && j.cell->state.load(std::memory_order_acquire) == pool_job_cell::finished)
      runs_.add((j.cell->ended_ns - j.cell->started_ns) / 1000);
    if (!out.err) {
      j.snap.status = pool_task_status::completed;
      ++completed_;
    } else if (is(out.err, errc::cancelled)) {
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

  /// Answers the waiters of a job that is now terminal and trims old records.
  void finish(job& j) {
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
        jobs_.erase(i);
      }
    }
    check_idle();
  }

  [[nodiscard]] bool idle() const noexcept {
    if (!queue_.empty() || !blocked_.empty()) return false;
    for (auto& w : workers_)
      if (!w.batch.empty()) return false;
    return true;
  }

  void check_idle() {
    if (idle_waiters_.empty() || !idle()) return;
    auto snap = snapshot();
    for (auto& rp : idle_waiters_)
      rp.deliver(snap);
    idle_waiters_.clear();
  }

  // -- views ----------------------------------------------------------------------------

  /// Returns the job's snapshot: a job handed to a worker that has not started it yet is
  /// still `queued`.
  pool_task_snapshot view(const job& j) const {
    auto s = j.snap;
    if (s.status == pool_task_status::running && j.cell &&
        j.cell->state.load(std::memory_order_acquire) == pool_job_cell::queued)
      s.status = pool_task_status::queued;
    return s;
  }

  pool_snapshot snapshot() const {
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

  caf::error closed_error() const {
    return make_error(errc::pool_closed, "pool", "pool \"" + spec_.name + "\" is closed");
  }

  caf::error unknown_job(uint64_t id) const {
    return make_error(errc::not_found, "task",
                      "pool \"" + spec_.name + "\" has no task " + std::to_string(id) +
                          " (unknown, or its terminal record was trimmed: keep_terminal " +
                          std::to_string(spec_.keep_terminal) + ")");
  }

  // -- durable (pipeline) pools -------------------------------------------------------

  /// Finds the storage, then reloads this pool's records: terminal ones as they were, the
  /// ones queued or running when the process died as stale failures.
  void load() {
    loading_ = true;
    auto fail = [this](caf::error& err) {
      load_error_ = err ? err : make_error(errc::storage_unavailable, "storage", "no storage");
      loading_ = false;
      closed_ = true;
      for (auto& rp : ready_waiters_)
        rp.deliver(load_error_);
      ready_waiters_.clear();
    };
    if (!env_->registry) {
      caf::error err = make_error(errc::storage_unavailable, "storage", "no registry");
      fail(err);
      return;
    }
    request(env_->registry, caf::infinite, dir_find_atom::value, runtime_service::storage,
            std::string{}, true)
        .then(
            [this, fail](caf::actor& st) mutable {
              if (!st) {
                caf::error err = make_error(errc::storage_unavailable, "storage",
                                            "a pipeline pool needs the runtime's storage");
                fail(err);
                return;
              }
              storage_ = std::move(st);
              request(storage_, caf::infinite, st_pool_load_atom::value, id_)
                  .then([this](std::vector<pool_row>& rows) { reload(rows); }, fail);
            },
            fail);
  }

  void reload(std::vector<pool_row>& rows) {
    for (auto& r : rows) {
      auto j = nlohmann::json::parse(r.record, nullptr, false);
      auto snap = pool_task_snapshot_from_json(j);
      if (!snap) continue; // not ours to interpret: left in the store as it is
      auto& rec = jobs_[snap->id];
      rec.snap = std::move(*snap);
      if (!is_terminal(rec.snap.status)) { // its closure died with its process
        rec.snap.status = pool_task_status::failed;
        rec.snap.stale = true;
        rec.snap.error = make_error(errc::pool_task_stale, "task",
                                    "the task was queued or running when its process died");
        save(rec);
      }
      rec.out.err = rec.snap.error;
      next_id_ = std::max(next_id_, rec.snap.id);
      ++total_;
      switch (rec.snap.status) {
        case pool_task_status::completed:
          ++completed_;
          break;
        case pool_task_status::rejected:
          ++rejected_;
          break;
        case pool_task_status::cancelled:
          ++cancelled_;
          break;
        default:
          ++failed_;
      }
      // A stale task's closure is gone: a resubmit with its key runs fresh.
      if (!rec.snap.idempotency_key.empty() && !rec.snap.stale)
        idem_[rec.snap.idempotency_key] = rec.snap.id;
      terminal_order_.push_back(rec.snap.id);
    }
    loading_ = false;
    for (auto& rp : ready_waiters_)
      rp.deliver(true);
    ready_waiters_.clear();
  }

  /// Queues the record of `j` for the next save.
  void save(const job& j) {
    save_buf_.push_back(pool_row{j.snap.id, j.snap.status, to_json(j.snap).dump()});
    unsaved_.insert(j.snap.id);
    schedule_flush();
  }

  void schedule_flush() {
    if (flush_sent_) return;
    flush_sent_ = true;
    send(this, pool_flush_atom::value);
  }

  /// Saves the queued records in one message; answers the submits they hold after the
  /// commit.
  void flush_saves() {
    if (save_buf_.empty() || !storage_) return;
    int64_t keep = 0;
    if (terminal_saves_ >= compact_every) {
      keep = spec_.keep_terminal;
      terminal_saves_ = 0;
    }
    auto acks = std::move(unsaved_acks_);
    unsaved_acks_.clear();
    std::vector<uint64_t> ids;
    ids.reserve(save_buf_.size());
    for (auto& r : save_buf_)
      ids.push_back(r.task_id);
    request(storage_, caf::infinite, st_pool_save_atom::value, id_, std::exchange(save_buf_, {}),
            keep)
        .then(
            [this, acks, ids](uint64_t) mutable {
              for (auto id : ids)
                unsaved_.erase(id);
              for (auto& [rp, id] : acks) {
                auto i = jobs_.find(id);
                if (i != jobs_.end())
                  rp.deliver(pool_ack{view(i->second), 0, 0});
                else
                  rp.deliver(unknown_job(id));
              }
            },
            [acks](caf::error& err) mutable {
              for (auto& a : acks)
                a.first.deliver(err);
            });
  }

  // -- audit ----------------------------------------------------------------------------

  void find_storage() {
    if (!env_->registry || spec_.audit == pool_audit::none) return;
    request(env_->registry, caf::infinite, dir_find_atom::value, runtime_service::storage,
            std::string{}, true)
        .then([this](caf::actor& st) { storage_ = std::move(st); }, [](caf::error&) {});
  }

  /// Returns whether `event` goes to the audit topic.
  [[nodiscard]] bool audits(std::string_view event) const noexcept {
    if (!storage_ || spec_.audit == pool_audit::none) return false;
    return spec_.audit == pool_audit::receipts || event == "drop";
  }

  /// Records a receipt or a drop for the `pool.audit` topic when a storage actor is
  /// present; each turn's records go in one message (see `pool_flush`).
  void audit(const char* event, const job& j, nlohmann::json extra) {
    nlohmann::json rec{{"event", event}, {"pool", spec_.name}, {"pool_id", id_},
                       {"task", j.snap.id}};
    if (extra.is_object())
      for (auto& [k, v] : extra.items())
        rec[k] = v;
    audit_buf_.push_back(rec.dump());
    schedule_flush();
    if (audit_buf_.size() >= 256) flush_audit();
  }

  void flush_audit() {
    if (audit_buf_.empty() || !storage_) return;
    request(storage_, caf::infinite, st_append_many_atom::value, std::string{"pool.audit"},
            std::exchange(audit_buf_, payload_batch{}))
        .then([](const std::vector<event_receipt>&) {}, [](caf::error&) {});
  }

  /// The most credits one grant hands out, and the most jobs one batch holds.
  static constexpr int64_t max_grant = 32;
  static constexpr size_t max_batch = 16;

  pool_spec spec_;
  std::string id_;
  task_env* env_ = nullptr;
  pool_queue queue_;
  std::vector<worker> workers_;
  std::unordered_map<uint64_t, job> jobs_;
  std::unordered_map<std::string, uint64_t> idem_;
  std::deque<uint64_t> terminal_order_;
  std::deque<blocked_submit> blocked_;
  std::vector<caf::response_promise> idle_waiters_;
  caf::actor storage_;
  payload_batch audit_buf_;
  bool flush_sent_ = false;
  /// Durable (pipeline) pools: the reload, the records not saved yet, the submits waiting
  /// for their record's commit.
  bool durable_ = false;
  bool loading_ = false;
  caf::error load_error_;
  std::vector<caf::response_promise> ready_waiters_;
  std::vector<pool_row> save_buf_;
  std::unordered_set<uint64_t> unsaved_;
  std::vector<std::pair<caf::response_promise, uint64_t>> unsaved_acks_;
  int64_t terminal_saves_ = 0;
  /// Terminal records saved between two compactions.
  static constexpr int64_t compact_every = 256;
  uint64_t next_id_ = 0;
  /// The runners' generation (1 at the start; each `scale` starts the next).
  uint64_t generation_ = 1;
  /// Credits granted and not used or returned yet (room reserved in a bounded queue).
  int64_t outstanding_ = 0;
  uint64_t completed_ = 0;
  uint64_t failed_ = 0;
  uint64_t rejected_ = 0;
  uint64_t cancelled_ = 0;
  uint64_t total_ = 0;
  uint64_t max_depth_seen_ = 0;
  uint64_t worker_restarts_ = 0;
  std::map<std::string, uint64_t> drops_;
  sample_ring waits_;
  sample_ring runs_;
  bool closed_ = false;
  bool stopping_ = false;
};

} // namespace

caf::actor spawn_pool(caf::actor_system& sys, pool_spec spec, std::string id) {
  return sys.spawn<pool_actor>(std::move(spec), std::move(id));
}

} // namespace troupe::detail
