#pragma once

// Internal: the worker pool's actor (see pool_actor.cpp for what it is). Its members are
// defined by concern: pool_actor.cpp (protocol, submits, backpressure, dispatch, cancels,
// ends, views), pool_workers.cpp (starting, replacing and scaling workers: the pool's own
// supervision and runner pools), pool_durable.cpp (pipeline pools' records and the audit
// topic), pool_worker.cpp (the workers' loop body).

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <caf/all.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/actors/detail/pool_queue.hpp"
#include "troupe/actors/detail/record_table.hpp"
#include "troupe/actors/detail/task_actor.hpp"
#include "troupe/messages/interfaces.hpp"
#include "troupe/messages/pool.hpp"
#include "troupe/messages/storage.hpp"

namespace troupe::detail {

/// Returns the error of a job whose submitter's deadline passed.
caf::error pool_deadline_error();

/// The loop body of a worker of `pool` in slot `slot` (pool_worker.cpp).
task<void> pool_worker_loop(context& cx, caf::actor pool, uint32_t slot);

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

class pool_actor final : public pool_actor_type::base {
 public:
  pool_actor(caf::actor_config& cfg, pool_spec spec, std::string id)
      : pool_actor_type::base(cfg), spec_(std::move(spec)), id_(std::move(id)),
        queue_(spec_.queue.kind) {}

  const char* name() const override { return "troupe.pool"; }

  behavior_type make_behavior() override;

  void on_exit() override;

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
    /// Its place in arrival order (a credited post's id was reserved earlier: the queue
    /// orders by this, not by the id).
    uint64_t seq = 0;
    /// Cancelled through its handle (a `cancelled` error from its body is a failure).
    bool cancel_requested = false;
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

  [[nodiscard]] bool bounded() const noexcept;

  /// Returns whether a bounded queue has room for one more (reserved credits count).
  [[nodiscard]] bool has_room() const noexcept;

  caf::result<pool_ack> on_submit(pool_submission sub, bool wants_credits);

  /// A durable pool answers a submit once the record is committed.
  caf::result<pool_ack> after_save(uint64_t id);
  /// Answers `rp` once a save of job `id`'s record has committed (saving it again if its
  /// last save failed).
  void ack_after_save(uint64_t id, caf::response_promise rp);

  /// Answers an accepted submit, with credits when the submitter wants some.
  pool_ack ack_for(uint64_t id, bool wants_credits);

  /// A submit paid with a credit: room was reserved, so it is never blocked or refused.
  void on_post(uint64_t id, pool_submission sub);

  job* find_idempotent(const std::string& key);

  /// Records a new job under `id`; queues it when `enqueue`.
  job& accept(uint64_t id, pool_submission sub, clock::time_point now, bool enqueue);

  /// Returns the fair_round_robin partition of a submit: its key, or the submitter's
  /// task-local value named by the strategy's key.
  std::pair<std::string, bool> partition_of(bool has_key, const job& j) const;

  void evict_oldest(const char* policy, int64_t max_depth);

  void reject(job& j, std::string reason, const char* policy, int64_t max_depth);

  // -- workers --------------------------------------------------------------------------

  [[nodiscard]] size_t free_workers() const noexcept;
  [[nodiscard]] bool starts_now() const noexcept;

  void start_worker(uint32_t slot);

  /// Returns the workers that take work (not stopped, not draining).
  [[nodiscard]] size_t live_workers() const noexcept;

  // -- runner pools -----------------------------------------------------------------------

  caf::result<runner_state> on_scale(int64_t n);

  runner_state runner_view();

  caf::result<pool_batch> on_pull(uint32_t slot);

  /// Takes the outcomes the worker left in its cells: every job of its batch when the
  /// batch is done (`all`), else those finished so far.
  void collect(worker& w, bool all);
  /// Settles what every worker finished since its last report (for a view of the pool).
  void collect_finished() {
    for (auto& w : workers_)
      collect(w, false);
  }

  /// Completes `j` when its worker has finished it (its cell says so); returns whether
  /// `j` is terminal.
  bool settle(job& j);

  /// Pops the next jobs for `slot`: one, or several from a deep queue.
  pool_batch make_batch(uint32_t slot);

  /// Hands queued jobs to free workers.
  void dispatch();

  /// Hands a batch to the free worker `slot` (its parked pull, or held for its first pull).
  void give(uint32_t slot);

  /// Admits blocked submitters (FIFO) while there is room.
  void admit_blocked();

  void on_worker_down(caf::down_msg& dm);

  // -- cancel and deadlines -------------------------------------------------------------

  caf::result<bool> on_cancel(uint64_t id);

  void on_deadline(uint64_t id);

  /// Ends a job that has not started with `reason` (a queued one leaves the queue, one
  /// handed to a worker is withdrawn from its batch); returns false when it has started.
  bool withdraw(job& j, caf::error reason);

  /// Stops the worker running `j` (forced: the body is destroyed at its suspension point,
  /// its RAII cleanup runs, its children are cancelled); `reason` becomes its outcome.
  void stop_running(job& j, caf::error reason);
  /// Puts jobs a worker was handed and never started back in the queue, where they were
  /// (`ids` in the order the worker had them).
  void put_back(const std::vector<uint64_t>& ids);

  // -- ends -----------------------------------------------------------------------------

  void complete(job& j, outcome_box out);

  /// Answers the waiters of a job that is now terminal and trims old records.
  void finish(job& j);

  [[nodiscard]] bool idle() const noexcept;

  void check_idle();

  // -- views ----------------------------------------------------------------------------

  /// Returns the job's snapshot: a job handed to a worker that has not started it yet is
  /// still `queued`.
  pool_task_snapshot view(const job& j) const;

  pool_snapshot snapshot() const;

  caf::error closed_error() const;

  caf::error unknown_job(uint64_t id) const;

  // -- durable (pipeline) pools -------------------------------------------------------

  /// Finds the storage, then reloads this pool's records: terminal ones as they were, the
  /// ones queued or running when the process died as stale failures.
  void load();

  void reload(std::vector<pool_row>& rows);

  /// Queues the record of `j` for the next save.
  void save(const job& j);

  void schedule_flush();

  /// Saves the queued records in one message; answers the submits they hold after the
  /// commit.
  void flush_saves();

  // -- audit ----------------------------------------------------------------------------

  void find_storage();

  /// Returns whether `event` goes to the audit topic.
  [[nodiscard]] bool audits(std::string_view event) const noexcept;

  /// Records a receipt or a drop for the `pool.audit` topic when a storage actor is
  /// present; each turn's records go in one message (see `pool_flush`).
  void audit(const char* event, const job& j, nlohmann::json extra);

  void flush_audit();

  /// The most credits one grant hands out, and the most jobs one batch holds.
  static constexpr int64_t max_grant = 64;
  static constexpr size_t max_batch = 32;

  pool_spec spec_;
  std::string id_;
  task_env* env_ = nullptr;
  pool_queue queue_;
  std::vector<worker> workers_;
  /// Job records by id.
  record_table<job> jobs_;
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
  /// Submits (and idempotent repeats) answered once a save of their record commits.
  std::unordered_map<uint64_t, std::vector<caf::response_promise>> save_waiters_;
  /// Records whose last save failed and that were not saved since: a repeat saves again.
  std::unordered_set<uint64_t> save_failed_;
  /// Records trimmed (past keep_terminal) while submitters waited for their save: the
  /// save's answer gives them this snapshot, not `not_found`. Emptied by that answer.
  std::unordered_map<uint64_t, pool_task_snapshot> trimmed_waiting_;
  int64_t terminal_saves_ = 0;
  /// Terminal records saved between two compactions: 256, or a quarter of keep_terminal when
  /// that is more. A compaction walks the newest keep_terminal records to find its cut, so
  /// its cost per terminal save stays at a few rows (at 10000 kept and every 256 saves it
  /// was ~40 rows per save, ~13% of a durable pool's throughput).
  [[nodiscard]] int64_t compact_every() const noexcept {
    return std::max<int64_t>(256, spec_.keep_terminal / 4);
  }
  uint64_t next_id_ = 0;
  /// Arrival order of accepted jobs.
  uint64_t next_seq_ = 0;
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

} // namespace troupe::detail
