// The worker pool: one actor that owns the queue, the job records and max_concurrent
// workers. Each worker is a task actor running a loop body: it asks the pool for a job
// (`pool_pull`, a parked response promise while there is none), runs the job's body as a
// sub-routine of its own task, and reports the outcome with its next pull. The pool
// supervises its workers itself: it monitors each one and replaces a worker that ends
// while the pool is open (one_for_one, permanent; every crash consumes the job that
// caused it, so a crash loop is bounded by the jobs queued).

#include <algorithm>
#include <deque>
#include <unordered_map>
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

/// The loop body of a worker: pull, run, report with the next pull.
task<void> pool_worker_loop(context& cx, caf::actor pool, uint32_t slot) {
  auto* self = access::impl(cx);
  uint64_t done = 0;
  outcome_box out;
  for (;;) {
    auto next = co_await cx.request<pool_assignment>(pool, pool_pull_atom::value, slot, done,
                                                     std::move(out));
    if (!next) co_return; // the pool is gone or stops this worker
    out = outcome_box{};
    done = next->id;
    self->locals(std::static_pointer_cast<const task_locals::element_type>(next->locals));
    if (next->deadline_ns >= 0)
      self->deadline(clock::time_point{clock::duration{next->deadline_ns}});
    else
      self->deadline(std::nullopt);
    try {
      out = co_await next->body->run(cx);
    } catch (const task_cancelled&) {
      throw; // the worker itself is being stopped (the runtime stops)
    } catch (...) {
      out.err = error_from_current_exception("body");
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
    set_exit_handler([this](caf::exit_msg& em) {
      if (em.reason) quit(em.reason);
    });
    find_storage();
    return {
        [this](pool_submit_atom, pool_submission& sub) -> caf::result<pool_task_snapshot> {
          return on_submit(std::move(sub));
        },
        [this](pool_pull_atom, uint32_t slot, uint64_t done,
               outcome_box& out) -> caf::result<pool_assignment> {
          return on_pull(slot, done, std::move(out));
        },
        [this](pool_await_atom, uint64_t id) -> caf::result<pool_result_box> {
          auto i = jobs_.find(id);
          if (i == jobs_.end()) return unknown_job(id);
          if (is_terminal(i->second.snap.status)) return pool_result_box{i->second.snap, i->second.out};
          auto rp = make_response_promise<pool_result_box>();
          i->second.waiters.push_back(rp);
          return rp;
        },
        [this](pool_status_atom, uint64_t id) -> caf::result<pool_task_snapshot> {
          auto i = jobs_.find(id);
          if (i == jobs_.end()) return unknown_job(id);
          return i->second.snap;
        },
        [this](pool_cancel_atom, uint64_t id) -> caf::result<bool> { return on_cancel(id); },
        [this](pool_stats_atom) { return snapshot(); },
        [this](pool_idle_atom) -> caf::result<pool_snapshot> {
          if (active_ == 0 && queue_.empty() && blocked_.empty()) return snapshot();
          auto rp = make_response_promise<pool_snapshot>();
          idle_waiters_.push_back(rp);
          return rp;
        },
        [this](pool_close_atom) {
          if (closed_) return false;
          closed_ = true;
          // Blocked submitters never get room now.
          for (auto& b : blocked_)
            b.rp.deliver(closed_error());
          blocked_.clear();
          check_idle();
          return true;
        },
        [this](pool_spec_atom) { return spec_; },
        [this](pool_tick_atom, uint64_t id) { on_deadline(id); },
    };
  }

  void on_exit() override {
    stopping_ = true;
    for (auto& w : workers_)
      if (w.actor) caf::anon_send_exit(w.actor, caf::exit_reason::user_shutdown);
    auto err = closed_error();
    for (auto& b : blocked_)
      b.rp.deliver(err);
    blocked_.clear();
    for (auto& w : workers_)
      if (w.pull.pending()) w.pull.deliver(err);
    for (auto& kvp : jobs_) {
      auto& j = kvp.second;
      if (is_terminal(j.snap.status)) continue;
      j.snap.status = pool_task_status::failed;
      j.snap.error = err;
      j.out.err = err;
      for (auto& w : j.waiters)
        w.deliver(pool_result_box{j.snap, j.out});
      j.waiters.clear();
    }
    for (auto& rp : idle_waiters_)
      rp.deliver(err);
    idle_waiters_.clear();
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
    clock::time_point started{};
    clock::timer_id timer = 0;
    int64_t slot = -1;
    /// Why its worker is being stopped: a cancel or its deadline (empty: not stopped).
    caf::error stop_reason;
  };

  struct worker {
    caf::actor actor;
    /// The job it runs (0: none).
    uint64_t job = 0;
    /// Its parked pull while it waits for a job.
    caf::response_promise pull;
    /// Being stopped (its job was cancelled): gets no new job, replaced when it ends.
    bool retiring = false;
    /// A job assigned before the worker's first pull (a fresh worker is free at once).
    std::optional<pool_assignment> pending;
    /// Returns whether it can take a job now.
    [[nodiscard]] bool free() const noexcept { return job == 0 && !retiring && actor; }
  };

  struct blocked_submit {
    caf::response_promise rp;
    pool_submission sub;
    clock::time_point at;
  };

  // -- submit ---------------------------------------------------------------------------

  caf::result<pool_task_snapshot> on_submit(pool_submission sub) {
    if (closed_) return closed_error();
    if (!sub.body)
      return make_error(errc::invalid_pool_spec, "body", "the submitted body is empty");
    if (!sub.idempotency_key.empty()) {
      if (auto i = idem_.find(sub.idempotency_key); i != idem_.end())
        if (auto j = jobs_.find(i->second); j != jobs_.end()) return j->second.snap;
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
        if (free_workers() > 0 || static_cast<int64_t>(queue_.size()) < bp.max_depth) {
          if (!blocked_.empty()) { // FIFO among submitters: wait behind the blocked ones
            auto rp = make_response_promise<pool_task_snapshot>();
            blocked_.push_back(blocked_submit{rp, std::move(sub), now});
            return rp;
          }
          break;
        }
        switch (bp.on_full) {
          case pool_on_full::block_submitter: {
            auto rp = make_response_promise<pool_task_snapshot>();
            blocked_.push_back(blocked_submit{rp, std::move(sub), now});
            return rp;
          }
          case pool_on_full::drop_oldest:
            evict_oldest("drop_oldest", bp.max_depth);
            break;
          case pool_on_full::drop_newest: {
            auto& j = accept(std::move(sub), now, false);
            reject(j, "queue full: the new task was dropped", "drop_newest", bp.max_depth);
            return j.snap;
          }
          case pool_on_full::fail_submitter:
            return make_error(errc::pool_queue_full, "pool",
                              "pool \"" + spec_.name + "\" has " + std::to_string(queue_.size()) +
                                  " queued (max_depth " + std::to_string(bp.max_depth) + ")");
        }
        break;
    }
    auto& j = accept(std::move(sub), now, true);
    auto snap = j.snap; // dispatch may start it: the submitter sees it as accepted
    dispatch();
    if (auto i = jobs_.find(snap.id); i != jobs_.end()) snap = i->second.snap;
    return snap;
  }

  /// Records a new job; queues it when `enqueue`.
  job& accept(pool_submission sub, clock::time_point now, bool enqueue) {
    auto id = ++next_id_;
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
    if (enqueue) {
      auto [pkey, has] = partition_of(sub, j);
      queue_.push(id, id, j.snap.priority, pkey, has);
      max_depth_seen_ = std::max<uint64_t>(max_depth_seen_, queue_.size());
      if (j.deadline_ns >= 0)
        j.timer = env_->clock->schedule(clock::time_point{clock::duration{j.deadline_ns}},
                                        caf::actor_cast<caf::actor>(this),
                                        caf::make_message(pool_tick_atom::value, id));
      audit("submit", j, {});
    }
    return j;
  }

  /// Returns the fair_round_robin partition of a submit: its key, or the submitter's
  /// task-local value named by the strategy's key.
  std::pair<std::string, bool> partition_of(const pool_submission& sub, const job& j) const {
    if (spec_.queue.kind != pool_queue_kind::fair_round_robin) return {{}, false};
    if (spec_.queue.key == "key") return {j.snap.key, sub.has_key};
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
    auto& j = jobs_.at(*victim);
    reject(j, "evicted by a newer task", policy, max_depth);
  }

  void reject(job& j, std::string reason, const char* policy, int64_t max_depth) {
    j.snap.status = pool_task_status::rejected;
    j.snap.rejection_reason = std::move(reason);
    j.snap.rejection_policy = policy;
    j.out.err = make_error(errc::pool_task_rejected, "task",
                           "rejected by " + std::string{policy} + ": " + j.snap.rejection_reason);
    j.snap.error = j.out.err;
    ++rejected_;
    auto& n = drops_[policy];
    ++n;
    nlohmann::json extra{{"policy", policy},
                         {"depth", queue_.size()},
                         {"max_depth", max_depth}};
    audit("drop", j, std::move(extra));
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
    workers_[slot] = worker{a, 0, {}, false, std::nullopt};
  }

  caf::result<pool_assignment> on_pull(uint32_t slot, uint64_t done, outcome_box out) {
    if (slot >= workers_.size() ||
        current_sender() != caf::actor_cast<caf::strong_actor_ptr>(workers_[slot].actor))
      return make_error(errc::invalid_argument, "slot", "not a worker of this pool");
    auto& w = workers_[slot];
    if (done != 0) {
      w.job = 0;
      --active_;
      if (auto i = jobs_.find(done); i != jobs_.end()) complete(i->second, std::move(out));
    }
    if (w.retiring || stopping_) return closed_error(); // it is being stopped: no new job
    if (w.pending) { // assigned before this first pull
      auto a = std::move(*w.pending);
      w.pending.reset();
      return a;
    }
    if (auto next = pop_live()) {
      auto a = start(*next, slot);
      admit_blocked();
      return a;
    }
    w.pull = make_response_promise<pool_assignment>();
    check_idle();
    return w.pull;
  }

  /// Marks `id` running on `slot` and returns its assignment.
  pool_assignment start(uint64_t id, uint32_t slot) {
    auto& j = jobs_.at(id);
    auto now = env_->clock->now();
    j.snap.status = pool_task_status::running;
    j.started = now;
    j.slot = slot;
    workers_[slot].job = id;
    ++active_;
    waits_.add(std::chrono::duration_cast<std::chrono::microseconds>(now - j.submitted).count());
    audit("dequeue", j, {});
    return pool_assignment{id, j.body, j.locals, j.deadline_ns};
  }

  /// Hands queued jobs to idle workers.
  void dispatch() {
    for (uint32_t i = 0; i < workers_.size() && !queue_.empty(); ++i)
      if (workers_[i].free()) give_next(i);
    admit_blocked();
  }

  /// Hands the next live queued job to the free worker `slot` (its parked pull, or held
  /// for its first pull).
  void give_next(uint32_t slot) {
    auto next = pop_live();
    if (!next) return;
    auto& w = workers_[slot];
    auto a = start(*next, slot);
    if (w.pull.pending()) {
      auto rp = std::move(w.pull);
      w.pull = caf::response_promise{};
      rp.deliver(std::move(a));
    } else {
      w.pending = std::move(a);
    }
  }

  /// Pops the next queued job whose deadline has not passed (those that passed fail with
  /// `deadline_exceeded` here, even if their timer has not been handled yet).
  std::optional<uint64_t> pop_live() {
    auto now_ns = env_->clock->now().time_since_epoch().count();
    while (auto next = queue_.pop()) {
      auto& j = jobs_.at(*next);
      if (j.deadline_ns < 0 || j.deadline_ns > now_ns) return next;
      complete(j, outcome_box{nullptr, deadline_error()});
    }
    return std::nullopt;
  }

  static caf::error deadline_error() {
    return make_error(errc::deadline_exceeded, "deadline",
                      "the submitter's deadline passed before the task finished");
  }

  /// Admits blocked submitters (FIFO) while there is room.
  void admit_blocked() {
    while (!blocked_.empty() && !closed_ &&
           (static_cast<int64_t>(queue_.size()) < spec_.backpressure.max_depth ||
            (free_workers() > 0 && queue_.empty()))) {
      auto b = std::move(blocked_.front());
      blocked_.pop_front();
      if (!b.sub.idempotency_key.empty()) {
        if (auto i = idem_.find(b.sub.idempotency_key); i != idem_.end())
          if (auto j = jobs_.find(i->second); j != jobs_.end()) {
            b.rp.deliver(j->second.snap);
            continue;
          }
      }
      auto& j = accept(std::move(b.sub), b.at, true);
      auto id = j.snap.id;
      // Start it right away when a worker is free (nothing else is queued then).
      for (uint32_t i = 0; i < workers_.size(); ++i)
        if (workers_[i].free()) {
          give_next(i);
          break;
        }
      b.rp.deliver(jobs_.at(id).snap);
    }
  }

  void on_worker_down(caf::down_msg& dm) {
    for (uint32_t slot = 0; slot < workers_.size(); ++slot) {
      auto& w = workers_[slot];
      if (w.actor.address() != dm.source) continue;
      if (w.job != 0) {
        --active_;
        if (auto i = jobs_.find(w.job); i != jobs_.end()) {
          auto& j = i->second;
          outcome_box out;
          if (j.stop_reason)
            out.err = j.stop_reason;
          else if (dm.reason)
            out.err = dm.reason; // a crash: the job fails with it
          else
            out.err = make_error(errc::task_failed, "worker",
                                 "the worker ended while running the task");
          complete(j, std::move(out));
        }
      }
      if (w.pull.pending()) w.pull.deliver(closed_error());
      if (stopping_) {
        w = worker{};
        return;
      }
      ++worker_restarts_;
      start_worker(slot);
      dispatch();
      return;
    }
  }

  // -- cancel and deadlines -------------------------------------------------------------

  caf::result<bool> on_cancel(uint64_t id) {
    auto i = jobs_.find(id);
    if (i == jobs_.end()) return unknown_job(id);
    auto& j = i->second;
    if (is_terminal(j.snap.status)) return false;
    if (j.snap.status == pool_task_status::queued) {
      queue_.remove(id);
      complete(j, outcome_box{nullptr, make_error(errc::cancelled)});
      admit_blocked();
      check_idle();
      return true;
    }
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
    auto err = deadline_error();
    if (j.snap.status == pool_task_status::queued) {
      queue_.remove(id);
      complete(j, outcome_box{nullptr, std::move(err)});
      admit_blocked();
      check_idle();
    } else if (j.snap.status == pool_task_status::running) {
      stop_running(j, std::move(err));
    }
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
    if (j.snap.status == pool_task_status::running)
      runs_.add(std::chrono::duration_cast<std::chrono::microseconds>(env_->clock->now() -
                                                                      j.started)
                    .count());
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
    if (spec_.scope == pool_scope::pipeline && j.body && j.snap.status == pool_task_status::completed)
      j.snap.result_json = j.body->result_json(j.out);
    audit("end", j, {{"status", std::string{to_string(j.snap.status)}}});
    finish(j);
  }

  /// Answers the waiters of a job that is now terminal and trims old records.
  void finish(job& j) {
    if (j.timer != 0) {
      env_->clock->cancel(j.timer);
      j.timer = 0;
    }
    j.slot = -1;
    j.body.reset();
    j.locals.reset();
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

  void check_idle() {
    if (idle_waiters_.empty() || active_ != 0 || !queue_.empty() || !blocked_.empty()) return;
    auto snap = snapshot();
    for (auto& rp : idle_waiters_)
      rp.deliver(snap);
    idle_waiters_.clear();
  }

  // -- views ----------------------------------------------------------------------------

  pool_snapshot snapshot() const {
    pool_snapshot s;
    s.name = spec_.name;
    s.id = id_;
    s.max_concurrent = spec_.max_concurrent;
    s.active = active_;
    s.queued = queue_.size();
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

  // -- audit ----------------------------------------------------------------------------

  void find_storage() {
    if (!env_->registry) return;
    request(env_->registry, caf::infinite, dir_find_atom::value, runtime_service::storage,
            std::string{}, true)
        .then([this](caf::actor& st) { storage_ = std::move(st); }, [](caf::error&) {});
  }

  /// Appends a receipt or a drop to the `pool.audit` topic when a storage actor is present.
  void audit(const char* event, const job& j, nlohmann::json extra) {
    if (!storage_) return;
    nlohmann::json rec{{"event", event}, {"pool", spec_.name}, {"pool_id", id_},
                       {"task", j.snap.id}};
    if (extra.is_object())
      for (auto& [k, v] : extra.items())
        rec[k] = v;
    request(storage_, caf::infinite, st_append_atom::value, std::string{"pool.audit"}, rec.dump())
        .then([](const event_receipt&) {}, [](caf::error&) {});
  }

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
  uint64_t next_id_ = 0;
  uint64_t active_ = 0;
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
