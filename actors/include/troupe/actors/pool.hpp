#pragma once

// Worker pools: a pool is an actor with `max_concurrent` workers (task actors it
// supervises); `submit` queues a task body under the pool's queue strategy and
// backpressure policy. See docs/pools.md.

#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/interfaces.hpp"
#include "troupe/messages/messaging.hpp"
#include "troupe/messages/pool.hpp"

namespace troupe {

/// A handle to an open pool (an actor); cheap to copy and to hand to other tasks.
class pool {
 public:
  pool() = default;
  pool(caf::actor a, std::string name, std::string id)
      : actor_(std::move(a)), name_(std::move(name)), id_(std::move(id)) {}
  [[nodiscard]] const caf::actor& actor() const noexcept { return actor_; }
  /// Returns the pool viewed through its typed interface (`pool_actor_type`).
  [[nodiscard]] pool_actor_type typed() const { return caf::actor_cast<pool_actor_type>(actor_); }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// Returns the deterministic id: a hash of scope, scope id and name.
  [[nodiscard]] const std::string& id() const noexcept { return id_; }
  [[nodiscard]] explicit operator bool() const noexcept { return static_cast<bool>(actor_); }

 private:
  caf::actor actor_;
  std::string name_;
  std::string id_;
};

/// How one submit is queued.
struct submit_options {
  /// Higher starts first under the `priority` strategy.
  int64_t priority = 0;
  /// The partition under `fair_round_robin{"key"}`; also shown in the snapshot.
  std::optional<std::string> key;
  /// A second submit with the same key returns the same task (its terminal snapshot if it
  /// finished) instead of queuing another.
  std::string idempotency_key;
};

/// Returns submit options read from JSON (`priority`: an integer, or a string holding one;
/// `key`, `idempotency_key`: strings), or `invalid_pool_spec` naming the field.
[[nodiscard]] caf::expected<submit_options> submit_options_from_json(const nlohmann::json& j);

/// A submitted job whose body returns `T`. Copies share one identity (the pool's task id)
/// and one immutable snapshot of the submit (a handle is its pool's actor and a shared
/// pointer to that snapshot: cheap to move and copy).
template <class T>
class pool_task {
 public:
  using value_type = T;
  pool_task() = default;
  pool_task(caf::actor pool, pool_task_snapshot at_submit)
      : pool_(std::move(pool)),
        snap_(detail::recycler::make_shared<pool_task_snapshot>(std::move(at_submit))) {}
  pool_task(caf::actor pool, std::shared_ptr<const pool_task_snapshot> at_submit) noexcept
      : pool_(std::move(pool)), snap_(std::move(at_submit)) {}
  [[nodiscard]] uint64_t id() const noexcept { return snap_ ? snap_->id : 0; }
  /// Returns the snapshot the submit answered (`status` as of then; `wait` for the end).
  [[nodiscard]] const pool_task_snapshot& at_submit() const noexcept {
    static const pool_task_snapshot none;
    return snap_ ? *snap_ : none;
  }
  [[nodiscard]] pool_task_status status() const noexcept { return at_submit().status; }
  [[nodiscard]] int64_t submitted_at_ms() const noexcept { return at_submit().submitted_at_ms; }
  [[nodiscard]] int64_t priority() const noexcept { return at_submit().priority; }
  [[nodiscard]] const std::string& key() const noexcept { return at_submit().key; }
  [[nodiscard]] const caf::actor& pool_actor() const noexcept { return pool_; }
  /// Returns its pool viewed through the typed interface.
  [[nodiscard]] pool_actor_type typed_pool() const {
    return caf::actor_cast<pool_actor_type>(pool_);
  }
  [[nodiscard]] bool valid() const noexcept { return pool_ && id() != 0; }

 private:
  caf::actor pool_;
  std::shared_ptr<const pool_task_snapshot> snap_;
};

/// A job's terminal snapshot and, when it completed, its value.
template <class T>
struct pool_outcome {
  pool_task_snapshot snapshot;
  /// The value (completed jobs of a non-void body only).
  std::optional<T> value;
  [[nodiscard]] pool_task_status status() const noexcept { return snapshot.status; }
  /// Returns the value, or the error: the job's failure, `cancelled`,
  /// `pool_task_rejected` (the snapshot says which policy and why), `pool_task_stale`.
  [[nodiscard]] caf::expected<T> result() const {
    if (snapshot.status == pool_task_status::completed && value) return *value;
    return snapshot.error ? snapshot.error : make_error(errc::task_failed, "task", "no value");
  }
};

template <>
struct pool_outcome<void> {
  pool_task_snapshot snapshot;
  [[nodiscard]] pool_task_status status() const noexcept { return snapshot.status; }
  /// Returns nothing for a completed job, or its error.
  [[nodiscard]] caf::error result() const {
    if (snapshot.status == pool_task_status::completed) return {};
    return snapshot.error ? snapshot.error : make_error(errc::task_failed, "task", "no value");
  }
};

namespace detail {

template <class F>
task<outcome_box> run_pool_body(context& cx, F& body) {
  using T = body_value_t<F>;
  if constexpr (std::is_void_v<T>) {
    if constexpr (takes_context_v<F>)
      co_await std::invoke(body, cx);
    else
      co_await std::invoke(body);
    co_return outcome_box{};
  } else {
    if constexpr (takes_context_v<F>)
      co_return outcome_box{recycler::make_shared<T>(co_await std::invoke(body, cx)), caf::error{}};
    else
      co_return outcome_box{recycler::make_shared<T>(co_await std::invoke(body)), caf::error{}};
  }
}

template <class F>
class pool_body_impl final : public pool_body {
 public:
  using value_type = body_value_t<F>;
  explicit pool_body_impl(F f) : f_(std::move(f)) {}
  task<outcome_box> run(context& cx) override { return run_pool_body(cx, f_); }
  nlohmann::json result_json(const outcome_box& b) const override {
    if constexpr (!std::is_void_v<value_type>) {
      if constexpr (std::is_constructible_v<nlohmann::json, const value_type&>) {
        if (b.value) return nlohmann::json(*static_cast<const value_type*>(b.value.get()));
      }
    }
    return nullptr;
  }

 private:
  F f_;
};

template <class T>
pool_outcome<T> to_pool_outcome(pool_result_box& r) {
  pool_outcome<T> out;
  out.snapshot = std::move(r.snapshot);
  if constexpr (!std::is_void_v<T>) {
    static_assert(std::is_copy_constructible_v<T>,
                  "a pooled body's result is shared by every waiter: it must be copyable");
    if (!r.out.err && r.out.value) {
      out.value = *static_cast<const T*>(r.out.value.get());
    } else if constexpr (std::is_same_v<T, nlohmann::json> ||
                         nlohmann::detail::has_from_json<nlohmann::json, T>::value) {
      // A record a durable pool reloaded: its value comes back from its JSON form.
      if (out.snapshot.status == pool_task_status::completed && !out.snapshot.result_json.is_null()) {
        try {
          out.value = out.snapshot.result_json.template get<T>();
        } catch (const std::exception&) {
          out.snapshot.error = make_error(errc::wrong_type, "result",
                                          "the stored result is not a " + std::string{typeid(T).name()});
        }
      }
    }
  }
  return out;
}

task<caf::expected<pool>> pool_open_impl(context& cx, pool_spec spec, bool create);
task<caf::expected<std::vector<pool_snapshot>>> pool_list_impl(context& cx);
task<caf::expected<pool>> pool_find_impl(context& cx, std::string id);
/// The submitter's side of a submit: fills in its task-local values and deadline.
pool_submission make_submission(context& cx, std::shared_ptr<pool_body> body,
                                const submit_options& opts);

/// Submits with a credit this task holds for pool actor `p` (a one-way `pool_post`, no
/// suspension); returns the handle's snapshot, or null when it holds none (or the submit
/// needs an answer: an idempotency key, an empty body). Moves `body` only when it posts.
std::shared_ptr<const pool_task_snapshot> pool_try_post(context& cx, const caf::actor& p,
                                                        std::shared_ptr<pool_body>& body,
                                                        const submit_options& opts);

/// Withdraws this task's blocked submit to pool actor `p` (a one-way `pool_withdraw`).
void pool_withdraw(context& cx, const caf::actor& p) noexcept;

/// Withdraws the submit when the await of its answer is abandoned: a graceful cancel
/// throws out of it, a forced one destroys the frame; either way the guard goes armed.
struct pool_submit_guard {
  context* cx;
  const caf::actor* pool;
  bool armed = true;
  pool_submit_guard(context* c, const caf::actor* p) noexcept : cx(c), pool(p) {}
  pool_submit_guard(const pool_submit_guard&) = delete;
  pool_submit_guard& operator=(const pool_submit_guard&) = delete;
  ~pool_submit_guard() {
    if (armed) pool_withdraw(*cx, *pool);
  }
};

/// Keeps the credits an answer granted (for the next submits to `p`).
void pool_keep_credits(context& cx, const caf::actor& p, const pool_ack& ack);

/// Submits to pool actor `p` (the handle's actor only: the handle's names are not copied
/// per submit).
template <class T>
task<caf::expected<pool_task<T>>> pool_submit_impl(context& cx, caf::actor p,
                                                   std::shared_ptr<pool_body> body,
                                                   submit_options opts) {
  if (!p) co_return make_error(errc::unknown_pool, "pool", "the pool handle is empty");
  if (auto posted = pool_try_post(cx, p, body, opts))
    co_return pool_task<T>{std::move(p), std::move(posted)};
  bool wants_credits = body && opts.idempotency_key.empty();
  // Abandoned (the task cancelled while a full pool blocks it): the submit is withdrawn.
  pool_submit_guard guard{&cx, &p};
  auto ack = co_await cx.request(caf::actor_cast<pool_actor_type>(p), atoms::pool_submit_atom::value,
                                 make_submission(cx, std::move(body), opts), wants_credits);
  guard.armed = false;
  if (!ack) co_return std::move(ack.error());
  pool_keep_credits(cx, p, *ack);
  co_return pool_task<T>{std::move(p), std::move(ack->snapshot)};
}

template <class T>
task<caf::expected<pool_outcome<T>>> pool_wait_impl(context& cx, pool_task<T> h) {
  if (!h.valid()) co_return make_error(errc::invalid_handle, "task", "the pool task is empty");
  auto r = co_await cx.request(h.typed_pool(), atoms::pool_await_atom::value, h.id());
  if (!r) co_return std::move(r.error());
  co_return to_pool_outcome<T>(*r);
}

template <class T>
task<caf::expected<std::vector<pool_outcome<T>>>> pool_wait_all_impl(context& cx,
                                                                     std::vector<pool_task<T>> hs) {
  std::vector<pool_outcome<T>> out;
  out.reserve(hs.size());
  for (auto& h : hs) {
    auto r = co_await pool_wait_impl<T>(cx, h);
    if (!r) co_return std::move(r.error());
    out.push_back(std::move(*r));
  }
  co_return out;
}

} // namespace detail

/// Opens (finds or creates) a pool. `co_await` yields `caf::expected<pool>`:
/// `invalid_pool_spec` naming the field (`max_concurrent` < 1, `max_depth` < 1, ...),
/// `pool_scope_unsupported` for tenant / org, `sync_conflict` when the name is open with
/// another spec.
[[nodiscard]] inline auto open_pool(context& cx, pool_spec spec) {
  return detail::pool_open_impl(cx, std::move(spec), true);
}

/// Opens a pool from its JSON spec (see `pool_spec_from_json`).
[[nodiscard]] task<caf::expected<pool>> open_pool(context& cx, nlohmann::json spec);

/// Finds an open session pool by name; `co_await` yields `caf::expected<pool>`
/// (`unknown_pool` when none).
[[nodiscard]] inline auto lookup_pool(context& cx, std::string name) {
  pool_spec spec;
  spec.name = std::move(name);
  return detail::pool_open_impl(cx, std::move(spec), false);
}

/// Finds an open pool by its id (`pool::id()`); `co_await` yields `caf::expected<pool>`.
[[nodiscard]] inline auto find_pool(context& cx, std::string id) {
  return detail::pool_find_impl(cx, std::move(id));
}

/// Lists the open pools; `co_await` yields `caf::expected<std::vector<pool_snapshot>>`.
[[nodiscard]] inline auto list_pools(context& cx) { return detail::pool_list_impl(cx); }

/// Submits `body` (`task<T>(context&)` or `task<T>()`) to `p`. `co_await` yields
/// `caf::expected<pool_task<T>>` once the pool accepted it (or rejected it: drop_newest
/// answers a handle whose status is `rejected`); a block_submitter pool that is full
/// suspends the caller until there is room. Errors: `pool_queue_full` (fail_submitter),
/// `pool_no_worker` (fail_fast), `pool_closed`, `invalid_pool_spec` (an empty body).
///
/// The job sees a snapshot of the submitter's task-local values and its deadline (when the
/// deadline passes it is removed if queued, stopped if running: `deadline_exceeded`).
template <class F>
[[nodiscard]] auto submit(context& cx, const pool& p, F body, submit_options opts = {}) {
  using D = std::decay_t<F>;
  using T = detail::body_value_t<D>;
  std::shared_ptr<detail::pool_body> b;
  bool empty = false;
  if constexpr (std::is_constructible_v<bool, const D&>) empty = !static_cast<bool>(body);
  if (!empty) b = detail::recycler::make_shared<detail::pool_body_impl<D>>(std::move(body));
  return detail::pool_submit_impl<T>(cx, p.actor(), std::move(b), std::move(opts));
}

/// Waits until the job is terminal; `co_await` yields `caf::expected<pool_outcome<T>>`
/// (errors: the pool is gone, `not_found` when its record was trimmed).
template <class T>
[[nodiscard]] auto wait_for(context& cx, const pool_task<T>& h) {
  return detail::pool_wait_impl<T>(cx, h);
}

/// Waits for every job; yields their outcomes in the order given.
template <class T>
[[nodiscard]] auto wait_for_all(context& cx, std::vector<pool_task<T>> hs) {
  return detail::pool_wait_all_impl<T>(cx, std::move(hs));
}

/// Returns the job's current snapshot; `co_await` yields `caf::expected<pool_task_snapshot>`.
template <class T>
[[nodiscard]] auto status_of(context& cx, const pool_task<T>& h) {
  return cx.request(h.typed_pool(), atoms::pool_status_atom::value, h.id());
}

/// Cancels the job: a queued one is removed and never runs, a running one is stopped (its
/// worker is replaced). `co_await` yields `caf::expected<bool>`: false when it had ended.
template <class T>
[[nodiscard]] auto cancel_pooled(context& cx, const pool_task<T>& h) {
  return cx.request(h.typed_pool(), atoms::pool_cancel_atom::value, h.id());
}

/// Returns the pool's counters and percentiles; `co_await` yields
/// `caf::expected<pool_snapshot>`.
[[nodiscard]] inline auto snapshot_of(context& cx, const pool& p) {
  return cx.request(p.typed(), atoms::pool_stats_atom::value);
}

/// Returns every record the pool holds (live and terminal; for a pipeline pool also those
/// reloaded, stale ones included), by id; `co_await` yields
/// `caf::expected<std::vector<pool_task_snapshot>>`.
[[nodiscard]] inline auto tasks_of(context& cx, const pool& p) {
  return cx.request(p.typed(), atoms::pool_tasks_atom::value);
}

/// Starts a new generation of `n` runners in a runner pool (`pool_spec::runners`); the old
/// generation finishes what it holds, takes nothing new, and stops: it is not extended.
/// `co_await` yields `caf::expected<runner_state>`; a fixed pool or `n` outside [min, max]
/// is `invalid_pool_spec` (field `n`).
[[nodiscard]] inline auto scale_pool(context& cx, const pool& p, int64_t n) {
  return cx.request(p.typed(), atoms::pool_scale_atom::value, n);
}

/// Returns the runners' state: generation, desired, online, busy and each slot's lifecycle;
/// `co_await` yields `caf::expected<runner_state>`.
[[nodiscard]] inline auto runners_of(context& cx, const pool& p) {
  return cx.request(p.typed(), atoms::pool_runners_atom::value);
}

/// Waits until nothing is queued, running or blocked; yields the snapshot then.
[[nodiscard]] inline auto wait_idle(context& cx, const pool& p) {
  return cx.request(p.typed(), atoms::pool_idle_atom::value);
}

/// Closes the pool: later submits answer `pool_closed`, blocked submitters are answered
/// `pool_closed`, queued and running jobs finish. `co_await` yields `caf::expected<bool>`.
[[nodiscard]] inline auto close_pool(context& cx, const pool& p) {
  return cx.request(p.typed(), atoms::pool_close_atom::value);
}

} // namespace troupe
