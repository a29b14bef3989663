#pragma once

// The worker-pool protocol: submitters, the pool actor and its workers (each a task actor
// that runs one job body at a time). The spec, the snapshots and the metrics cross nodes
// (registered, with `inspect()`); a job's body and its outcome are local-only.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/meta/type_name.hpp>
#include <nlohmann/json.hpp>

#include "troupe/messages/json.hpp"
#include "troupe/messages/outcome.hpp"
#include "troupe/messages/types.hpp"

namespace troupe {

/// The order in which queued jobs start.
enum class pool_queue_kind : uint8_t {
  /// Highest priority first, FIFO among equal priorities (the default).
  priority,
  /// Oldest first.
  fifo,
  /// Newest first.
  lifo,
  /// Partitions by the submit's key, visited in first-seen order, one job per visit, FIFO
  /// inside a partition; submits without a key share the default partition.
  fair_round_robin,
};

/// What a full pool does with a new submit.
enum class pool_backpressure_kind : uint8_t {
  /// No bound (the default).
  unbounded,
  /// At most `max_depth` queued; `on_full` says what happens to the next submit.
  queue,
  /// Accept only when a worker is free (nothing is ever queued): otherwise TROUPE-POL-002.
  fail_fast,
  /// Keep the newest `capacity` queued jobs: the oldest queued one is rejected.
  ring_buffer,
};

/// What a bounded queue (`pool_backpressure_kind::queue`) does when it is full.
enum class pool_on_full : uint8_t {
  /// The submitting task waits (suspended, not a thread) until there is room; blocked
  /// submitters are admitted in FIFO order.
  block_submitter,
  /// The oldest queued job is rejected; the new one is accepted.
  drop_oldest,
  /// The new job is rejected (its handle shows why).
  drop_newest,
  /// The submit answers TROUPE-POL-001; nothing is queued.
  fail_submitter,
};

/// Where a pool's records live.
enum class pool_scope : uint8_t {
  /// In memory, for this runtime's life (the default).
  session,
  /// Persisted through the storage actor (terminal records and the idempotency index).
  pipeline,
  /// Needs a host (a multi-tenant server): refused in-process (TROUPE-POL-006).
  tenant,
  /// Needs a host: refused in-process (TROUPE-POL-006).
  org,
};

/// What a pool appends to the `pool.audit` event-log topic when a storage actor is present.
enum class pool_audit : uint8_t {
  /// Nothing.
  none,
  /// Every drop (eviction or rejection by a policy): pool, task, policy, depth, max depth
  /// (the default).
  drops,
  /// Drops, and a receipt for every submit, dequeue and end (one row each: an audit trail
  /// that costs a database write per transition).
  receipts,
};

/// When a runner pool replaces a worker that ended (OTP's restart types).
enum class pool_restart : uint8_t {
  /// Always (the default).
  permanent,
  /// After an abnormal end (a crash) only.
  transient,
  /// Never, unless the pool would fall below its `min` runners.
  temporary,
};

/// Where a runner slot is in its life.
enum class runner_lifecycle : uint8_t { starting, idle, busy, draining, stopped };

/// The status of one pooled job.
enum class pool_task_status : uint8_t {
  queued,
  running,
  completed,
  failed,
  rejected,
  /// Cancelled through its handle (stopping is not failing: a kind of its own).
  cancelled,
};

/// Returns "priority", "fifo", ... (the JSON names).
[[nodiscard]] std::string_view to_string(pool_queue_kind x) noexcept;
/// Returns "unbounded", "queue", "fail_fast", "ring_buffer".
[[nodiscard]] std::string_view to_string(pool_backpressure_kind x) noexcept;
/// Returns "block_submitter", "drop_oldest", "drop_newest", "fail_submitter".
[[nodiscard]] std::string_view to_string(pool_on_full x) noexcept;
/// Returns "none", "drops", "receipts".
[[nodiscard]] std::string_view to_string(pool_audit x) noexcept;
/// Returns "permanent", "transient", "temporary".
[[nodiscard]] std::string_view to_string(pool_restart x) noexcept;
/// Returns "starting", "idle", "busy", "draining", "stopped".
[[nodiscard]] std::string_view to_string(runner_lifecycle x) noexcept;
/// Returns "session", "pipeline", "tenant", "org".
[[nodiscard]] std::string_view to_string(pool_scope x) noexcept;
/// Returns "queued", "running", "completed", "failed", "rejected", "cancelled".
[[nodiscard]] std::string_view to_string(pool_task_status x) noexcept;

/// The queue strategy of a pool.
struct pool_queue_spec {
  pool_queue_kind kind = pool_queue_kind::priority;
  /// fair_round_robin: the name of the submit field that partitions ("key" names the
  /// submit's `key`; any other name is a task-local value of the submitter read as text).
  std::string key;
  friend bool operator==(const pool_queue_spec&, const pool_queue_spec&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pool_queue_spec& x) {
  return f(caf::meta::type_name("troupe.pool_queue_spec"), x.kind, x.key);
}

/// The backpressure policy of a pool.
struct pool_backpressure_spec {
  pool_backpressure_kind kind = pool_backpressure_kind::unbounded;
  /// queue: the most queued jobs (>= 1).
  int64_t max_depth = 0;
  /// queue: what a full queue does.
  pool_on_full on_full = pool_on_full::block_submitter;
  /// ring_buffer: the most queued jobs kept (>= 1).
  int64_t capacity = 0;
  friend bool operator==(const pool_backpressure_spec&, const pool_backpressure_spec&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pool_backpressure_spec& x) {
  return f(caf::meta::type_name("troupe.pool_backpressure_spec"), x.kind, x.max_depth,
           x.on_full, x.capacity);
}

/// A runner pool's bounds: `max` > 0 makes the pool scalable (`scale_pool`) between `min`
/// and `max` runners, starting with `max_concurrent` of them (the initial generation).
struct pool_runners_spec {
  int64_t min = 0;
  int64_t max = 0;
  pool_restart restart = pool_restart::permanent;
  friend bool operator==(const pool_runners_spec&, const pool_runners_spec&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pool_runners_spec& x) {
  return f(caf::meta::type_name("troupe.pool_runners_spec"), x.min, x.max, x.restart);
}

/// Where a pool runs the jobs submitted with `submit_remote` (bodies registered by name):
/// each such job runs on the next member, round robin, among `nodes` (every member that is
/// up, this node included, when empty) that is up when the job starts.
struct pool_remote_spec {
  std::vector<std::string> nodes;
  /// A job whose node goes down (or leaves, or whose connection breaks) while it runs is
  /// run again on another member that is up, instead of failing with `node_down`: it may
  /// then run twice (at least once). Off: it fails with `node_down` (at most once).
  bool retry_on_node_down = false;
  friend bool operator==(const pool_remote_spec&, const pool_remote_spec&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pool_remote_spec& x) {
  return f(caf::meta::type_name("troupe.pool_remote_spec"), x.nodes, x.retry_on_node_down);
}

/// What `open_pool` creates.
struct pool_spec {
  std::string name;
  /// The most jobs running at once: the number of workers (>= 1).
  int64_t max_concurrent = 1;
  pool_scope scope = pool_scope::session;
  pool_queue_spec queue;
  pool_backpressure_spec backpressure;
  /// Terminal records kept (in memory; for pipeline pools also in the store) before the
  /// oldest are trimmed (>= 1).
  int64_t keep_terminal = 10000;
  /// What goes to the `pool.audit` topic when a storage actor is present.
  pool_audit audit = pool_audit::drops;
  /// A runner pool's bounds and restart mode (`max` 0: a fixed pool).
  pool_runners_spec runners;
  /// Where jobs submitted by body name (`submit_remote`) run (cluster nodes only).
  pool_remote_spec remote;
  friend bool operator==(const pool_spec&, const pool_spec&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pool_spec& x) {
  return f(caf::meta::type_name("troupe.pool_spec"), x.name, x.max_concurrent, x.scope, x.queue,
           x.backpressure, x.keep_terminal, x.audit, x.runners, x.remote);
}

/// Returns the spec `j` describes, or a typed error naming the offending field
/// (`invalid_pool_spec`). Keys: name, max_concurrent, scope, queue {strategy, key},
/// backpressure {policy, max_depth, on_full, capacity}, keep_terminal, audit, runners
/// {min, max, initial, restart}, remote {nodes, retry_on_node_down}.
[[nodiscard]] caf::expected<pool_spec> pool_spec_from_json(const nlohmann::json& j);

/// Returns the spec as JSON (the form `pool_spec_from_json` reads).
[[nodiscard]] nlohmann::json to_json(const pool_spec& x);

/// Returns an error (`invalid_pool_spec`, naming the field) when `x` is not a valid spec.
[[nodiscard]] caf::error check_pool_spec(const pool_spec& x);

/// Returns the deterministic id of a pool: a hash of its scope, scope id and name, as 16
/// hex digits.
[[nodiscard]] std::string pool_id_of(pool_scope scope, std::string_view scope_id,
                                     std::string_view name);

/// One pooled job as the pool sees it (a snapshot; terminal once completed, failed,
/// rejected or cancelled).
struct pool_task_snapshot {
  uint64_t id = 0;
  pool_task_status status = pool_task_status::queued;
  /// The runtime clock's milliseconds at the submit.
  int64_t submitted_at_ms = 0;
  int64_t priority = 0;
  std::string key;
  std::string idempotency_key;
  /// failed / cancelled: why.
  caf::error error;
  /// rejected: why ("queue full", "evicted by a newer task", ...) and by which policy.
  std::string rejection_reason;
  std::string rejection_policy;
  /// failed: the job was queued or running when a process running a durable pool died;
  /// its closure could not be rebuilt.
  bool stale = false;
  /// completed: the result as JSON when it is JSON-serialisable (durable pools), else null.
  nlohmann::json result_json;
  friend bool operator==(const pool_task_snapshot&, const pool_task_snapshot&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pool_task_snapshot& x) {
  return f(caf::meta::type_name("troupe.pool_task_snapshot"), x.id, x.status, x.submitted_at_ms,
           x.priority, x.key, x.idempotency_key, x.error, x.rejection_reason, x.rejection_policy,
           x.stale, x.result_json);
}

/// Returns the snapshot as JSON (the error as its code, name, field and detail): the form a
/// durable pool stores.
[[nodiscard]] nlohmann::json to_json(const pool_task_snapshot& x);

/// Returns the snapshot `j` holds, or `invalid_payload` naming the field.
[[nodiscard]] caf::expected<pool_task_snapshot> pool_task_snapshot_from_json(const nlohmann::json& j);

/// One durable pool record as the storage actor keeps it: the task id, its status (for the
/// reload and the compaction) and the snapshot as JSON text (`to_json(snapshot).dump()`).
/// A save may carry the snapshot itself instead (`encode`): the storage actor writes its
/// JSON text, so the pool's own turn does not spend its time encoding records.
struct pool_row {
  uint64_t task_id = 0;
  pool_task_status status = pool_task_status::queued;
  std::string record;
  bool encode = false;          // a save: `record` is to be made from `snapshot`
  pool_task_snapshot snapshot;  // with `encode`; else empty
  friend bool operator==(const pool_row&, const pool_row&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pool_row& x) {
  return f(caf::meta::type_name("troupe.pool_row"), x.task_id, x.status, x.record, x.encode,
           x.snapshot);
}

/// Returns whether `x` is terminal (completed, failed, rejected or cancelled).
[[nodiscard]] constexpr bool is_terminal(pool_task_status x) noexcept {
  return x != pool_task_status::queued && x != pool_task_status::running;
}

/// One runner slot of a pool.
struct runner_slot_state {
  uint32_t slot = 0;
  uint64_t generation = 0;
  runner_lifecycle lifecycle = runner_lifecycle::starting;
  /// Times its worker was replaced.
  uint64_t restarts = 0;
  friend bool operator==(const runner_slot_state&, const runner_slot_state&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, runner_slot_state& x) {
  return f(caf::meta::type_name("troupe.runner_slot_state"), x.slot, x.generation, x.lifecycle,
           x.restarts);
}

/// A runner pool's state: its current generation, how many runners it wants, how many are
/// online (not stopped; draining ones included) and busy, and every slot.
struct runner_state {
  std::string pool;
  uint64_t generation = 0;
  int64_t desired = 0;
  uint64_t online = 0;
  uint64_t busy = 0;
  std::vector<runner_slot_state> slots;
  friend bool operator==(const runner_state&, const runner_state&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, runner_state& x) {
  return f(caf::meta::type_name("troupe.runner_state"), x.pool, x.generation, x.desired, x.online,
           x.busy, x.slots);
}

/// A pool's counters and its latency percentiles.
struct pool_snapshot {
  std::string name;
  std::string id;
  int64_t max_concurrent = 0;
  uint64_t active = 0;
  uint64_t queued = 0;
  uint64_t completed = 0;
  uint64_t failed = 0;
  uint64_t rejected = 0;
  uint64_t cancelled = 0;
  /// Every submit accepted or rejected (idempotent repeats are not counted again).
  uint64_t total = 0;
  uint64_t max_depth_seen = 0;
  /// Submitters waiting for room (block_submitter).
  uint64_t blocked_submitters = 0;
  /// Workers replaced after a crash.
  uint64_t worker_restarts = 0;
  /// Wait (submit to start) and run (start to end) times, in microseconds of the runtime
  /// clock, over the most recent 4096 jobs.
  int64_t wait_p50_us = 0;
  int64_t wait_p99_us = 0;
  int64_t run_p50_us = 0;
  int64_t run_p99_us = 0;
  /// Rejections by policy name ("drop_oldest", "drop_newest", "ring_buffer").
  std::vector<std::pair<std::string, uint64_t>> drops;
  bool closed = false;
  /// active + queued.
  [[nodiscard]] uint64_t size() const noexcept { return active + queued; }
  friend bool operator==(const pool_snapshot&, const pool_snapshot&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pool_snapshot& x) {
  return f(caf::meta::type_name("troupe.pool_snapshot"), x.name, x.id, x.max_concurrent, x.active,
           x.queued, x.completed, x.failed, x.rejected, x.cancelled, x.total, x.max_depth_seen,
           x.blocked_submitters, x.worker_restarts, x.wait_p50_us, x.wait_p99_us, x.run_p50_us,
           x.run_p99_us, x.drops, x.closed);
}

} // namespace troupe

namespace troupe {

class context;
template <class T>
class task;

namespace detail {

/// A job's body with its result type erased: `run` is awaited by a worker as a
/// sub-routine and yields the outcome (the body's exception, if any, propagates).
class pool_body {
 public:
  virtual ~pool_body() = default;
  virtual task<outcome_box> run(context& cx) = 0;
  /// Returns the result as JSON when its type converts (durable pools), else null.
  virtual nlohmann::json result_json(const outcome_box&) const { return nullptr; }
  /// Called by the pool when it accepts the job as its job `id`, before any worker may run
  /// it: a body that depends on the pool's settings (`submit_remote`: `spec.remote`, and
  /// the id for its round robin) reads them here.
  virtual void bind(const pool_spec&, uint64_t /*id*/) {}
};

} // namespace detail

/// A submit: the body and what it runs with. Local-only (it holds a function).
struct pool_submission {
  std::shared_ptr<detail::pool_body> body;
  int64_t priority = 0;
  /// The submit's key (fair_round_robin partitions by it); `has_key` false: no key.
  std::string key;
  bool has_key = false;
  std::string idempotency_key;
  /// The submitter's task-local values (a snapshot; a `task_locals` erased to void).
  std::shared_ptr<const void> locals;
  /// The submitter's deadline in nanoseconds of the runtime clock, or -1.
  int64_t deadline_ns = -1;
  /// A credited post: the runtime clock's nanoseconds when the submitter made it (the
  /// submit time its handle shows; the pool does not read the clock again). -1: the pool
  /// takes its own clock at arrival.
  int64_t submitted_ns = -1;
};

/// Shared by the pool and the worker a job was handed to: the worker claims the job
/// (`queued` -> `started`) before it runs it and leaves the outcome here (`finished`); the
/// pool takes back a job not started yet (`queued` -> `withdrawn`: a cancel, a deadline).
struct pool_job_cell {
  enum state_t : uint8_t { queued, started, finished, withdrawn };
  std::atomic<uint8_t> state{queued};
  /// Written by the worker before `finished`; read by the pool after it.
  outcome_box out;
  /// The runtime clock's nanoseconds when the worker started and ended the job.
  int64_t started_ns = 0;
  int64_t ended_ns = 0;
};

/// What a worker runs next. Local-only.
struct pool_assignment {
  uint64_t id = 0;
  std::shared_ptr<detail::pool_body> body;
  std::shared_ptr<const void> locals;
  int64_t deadline_ns = -1;
  std::shared_ptr<pool_job_cell> cell;
};

/// The jobs a worker takes at once (one, or several from a deep queue), in start order.
struct pool_batch {
  std::vector<pool_assignment> jobs;
};

/// The answer to a submit: the job's snapshot, and credits for submits that need no
/// answer (each a one-way `pool_post` with an id from `first_id` on). Local-only.
struct pool_ack {
  pool_task_snapshot snapshot;
  int64_t credits = 0;
  uint64_t first_id = 0;
};

/// A terminal snapshot with the job's outcome (the value for a completed job). Local-only.
struct pool_result_box {
  pool_task_snapshot snapshot;
  outcome_box out;
};

} // namespace troupe

TROUPE_LOCAL_ONLY_MESSAGE_TYPE(troupe::pool_submission)
TROUPE_LOCAL_ONLY_MESSAGE_TYPE(troupe::pool_assignment)
TROUPE_LOCAL_ONLY_MESSAGE_TYPE(troupe::pool_batch)
TROUPE_LOCAL_ONLY_MESSAGE_TYPE(troupe::pool_ack)
TROUPE_LOCAL_ONLY_MESSAGE_TYPE(troupe::pool_result_box)

namespace troupe::atoms {

/// `(pool_submit, pool_submission, bool wants_credits)` -> pool_ack | error: answered when
/// the job is accepted (queued or running) or rejected (drop_newest: the snapshot says so);
/// a block_submitter pool answers when there is room. An idempotent repeat answers the
/// first job's snapshot. Errors: pool_queue_full, pool_no_worker, pool_closed.
using pool_submit_atom = caf::atom_constant<caf::atom("p_submit")>;
/// `(pool_post, uint64 id, pool_submission)`: a submit paid with a credit (room the pool
/// reserved for this submitter), under an id of the granted range; no answer. Unused
/// credits come back with `(q_return, int64 credits, value_batch, bool)` when the
/// submitter ends.
using pool_post_atom = caf::atom_constant<caf::atom("p_post")>;
/// `(pool_withdraw)`, no answer: the sender's blocked submit (a full block_submitter pool)
/// is dropped, never to run: its task was cancelled while it waited for room. Nothing
/// blocked from the sender: nothing happens (a submit already accepted runs).
using pool_withdraw_atom = caf::atom_constant<caf::atom("p_wdraw")>;
/// Internal, worker -> pool: `(pool_report, uint32 slot)`: jobs of its batch finished
/// (their cells hold the outcomes); sent while a long batch goes on.
using pool_report_atom = caf::atom_constant<caf::atom("p_report")>;
/// `(pool_await, uint64 id)` -> pool_result_box | error: answered once the job is terminal
/// (any number of waiters; the result is shared). Unknown id: not_found.
using pool_await_atom = caf::atom_constant<caf::atom("p_await")>;
/// `(pool_status, uint64 id)` -> pool_task_snapshot | error (not_found).
using pool_status_atom = caf::atom_constant<caf::atom("p_status")>;
/// `(pool_cancel, uint64 id)` -> bool: true when this stopped it (queued: removed, never
/// runs; running: its worker is stopped and replaced), false when already terminal.
using pool_cancel_atom = caf::atom_constant<caf::atom("p_cancel")>;
/// `(pool_stats)` -> pool_snapshot.
using pool_stats_atom = caf::atom_constant<caf::atom("p_stats")>;
/// Internal: `(pool_flush)`, the pool to itself: append the audit records gathered.
using pool_flush_atom = caf::atom_constant<caf::atom("p_flush")>;
/// `(pool_idle)` -> pool_snapshot: answered once nothing is queued or running.
using pool_idle_atom = caf::atom_constant<caf::atom("p_idle")>;
/// `(pool_close)` -> bool: later submits answer pool_closed; queued and running jobs
/// finish; false when closed already.
using pool_close_atom = caf::atom_constant<caf::atom("p_close")>;
/// `(pool_ready)` -> bool: answered once the pool can take submits (a pipeline pool has
/// reloaded its records; error: its storage is unavailable).
using pool_ready_atom = caf::atom_constant<caf::atom("p_ready")>;
/// `(pool_tasks)` -> std::vector<pool_task_snapshot>: every record the pool holds (live and
/// terminal, reloaded ones included), by id.
using pool_tasks_atom = caf::atom_constant<caf::atom("p_tasks")>;
/// `(pool_scale, int64 n)` -> runner_state: starts a new generation of `n` runners; the old
/// generation finishes what it holds, takes nothing new, and stops. Errors: a fixed pool or
/// `n` outside [min, max] (`invalid_pool_spec`, field `n`).
using pool_scale_atom = caf::atom_constant<caf::atom("p_scale")>;
/// `(pool_runners)` -> runner_state.
using pool_runners_atom = caf::atom_constant<caf::atom("p_runners")>;
/// `(pool_spec_q)` -> pool_spec: the spec the pool runs with.
using pool_spec_atom = caf::atom_constant<caf::atom("p_spec")>;
/// Internal, worker -> pool: `(pool_pull, uint32 slot)` -> pool_batch: the worker's batch
/// is done (the cells hold the outcomes); it asks for the next, answered when there is one.
using pool_pull_atom = caf::atom_constant<caf::atom("p_pull")>;
/// Internal: `(pool_tick, uint64 id)`, a job's deadline timer.
using pool_tick_atom = caf::atom_constant<caf::atom("p_tick")>;

} // namespace troupe::atoms
