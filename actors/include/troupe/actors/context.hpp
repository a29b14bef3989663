#pragma once

#include <any>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include <caf/actor.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/expected.hpp>
#include <caf/is_typed_actor.hpp>
#include <caf/response_type.hpp>

#include "troupe/actors/detail/access.hpp"
#include "troupe/actors/detail/runner.hpp"
#include "troupe/actors/structured.hpp"
#include "troupe/actors/task.hpp"
#include "troupe/actors/detail/task_env.hpp"
#include "troupe/actors/spawn_options.hpp"
#include "troupe/actors/task_handle.hpp"
#include "troupe/messages/clock.hpp"

namespace troupe {


/// Task-local values: an immutable map shared by snapshot; a write copies it.
using task_locals = std::shared_ptr<const std::map<std::string, std::any, std::less<>>>;

/// What a task body sees of its task: identity, cancellation, the clock, spawning children
/// and awaiting. Every `co_await` on a context operation suspends the body without
/// blocking a thread.
///
/// Cancellation: a graceful cancel makes the pending `co_await` (or, if none, the next one)
/// throw `task_cancelled` -- once. `is_cancelled()` stays true; later awaits work again so
/// that cleanup can still await, bounded by the grace period after which the task is
/// forced. A forced cancel destroys the body at its suspension point: no code of the body
/// runs any more, but the destructors of its live locals do (RAII cleanup).
///
/// A context belongs to one task actor; use it only from that task's body.
class context {
 public:
  explicit context(detail::task_actor* self) noexcept : self_(self) {}
  context(const context&) = delete;
  context& operator=(const context&) = delete;

  // -- identity ---------------------------------------------------------------------------

  /// Returns this task's id: deterministic, "1" for the first root, "1.3" for its third
  /// child, whatever the thread interleaving.
  [[nodiscard]] const std::string& task_id() const noexcept;
  /// Returns the spawning task's id (empty for a root).
  [[nodiscard]] std::string parent_task_id() const;
  /// Returns the id of the root of this task's tree.
  [[nodiscard]] std::string root_task_id() const;
  /// Returns the group id shared by the siblings of one parallel call (or this task's id).
  [[nodiscard]] std::string task_group_id() const;
  /// Returns the task's name ("task" unless spawned with one).
  [[nodiscard]] std::string name() const;
  /// Returns a fresh group id for siblings spawned together (`spawn_options::group`).
  [[nodiscard]] std::string new_group_id();

  // -- cancellation and time --------------------------------------------------------------

  /// Returns whether the task was asked to stop (a graceful cancel); a long computation
  /// that never awaits should poll this.
  [[nodiscard]] bool is_cancelled() const noexcept;
  /// Returns the runtime clock's current time.
  [[nodiscard]] clock::time_point now() const noexcept;
  /// Returns the runtime clock.
  [[nodiscard]] troupe::clock& clock() const noexcept;

  /// Suspends for `d` on the runtime clock. `co_await` yields nothing.
  [[nodiscard]] auto sleep(clock::duration d);
  /// Suspends until `t` on the runtime clock.
  [[nodiscard]] auto sleep_until(clock::time_point t);
  /// Suspends until this task's pending messages (a cancel, an await) have been handled,
  /// then resumes: the suspension point of a long loop that never awaits anything else.
  [[nodiscard]] auto yield_now();

  // -- tasks ------------------------------------------------------------------------------

  /// Spawns a child task running `body` (`task<T>(context&)` or `task<T>()`) and returns
  /// its handle. The child is owned by this task: when this task ends, children it has
  /// not awaited are cancelled and joined (unless spawned with `detached`).
  template <class F>
  [[nodiscard]] auto spawn(F&& body, spawn_options opts = {});

  /// Awaits `h`: `co_await` yields `caf::expected<T>` holding the task's value, or its
  /// error (`cancelled` when it was cancelled, `already_awaited` on a second await,
  /// `invalid_handle`, `foreign_task`).
  template <class T>
  [[nodiscard]] auto await(const task_handle<T>& h);

  /// Forces `h` to stop: its body is destroyed at its current suspension point (its RAII
  /// cleanup runs) and its own children are cancelled too. `co_await` yields
  /// `caf::expected<bool>`: true when this call stopped it, false when it had already
  /// finished (its result stays awaitable).
  template <class T>
  [[nodiscard]] auto cancel(const task_handle<T>& h);

  /// Asks `h` to stop: its current (or next) `co_await` throws `task_cancelled` once, and
  /// `is_cancelled()` turns true; if it has not ended `grace` later on the runtime clock, it
  /// is forced. A body that catches the cancellation and returns a value ends with that
  /// value (cooperative); one that lets it propagate ends `cancelled`. Its children get the
  /// same deadline.
  /// `co_await` yields `caf::expected<bool>` (false when it had already finished);
  /// a negative `grace` answers `invalid_argument`.
  template <class T>
  [[nodiscard]] auto cancel_graceful(const task_handle<T>& h, clock::duration grace);

  /// Sends a request to `dest` and suspends until the reply: `co_await` yields
  /// `caf::expected<R>` (R = void for an empty reply).
  template <class R, class Handle, class... Ts>
  [[nodiscard]] auto request(const Handle& dest, Ts&&... xs);

  /// The same to a typed actor (`caf::typed_actor<...>`, e.g. troupe's service interfaces
  /// in messages/interfaces.hpp): the reply type comes from the interface, and a request
  /// the interface does not list does not compile. `co_await` yields `caf::expected<R>`.
  template <class Handle, class... Ts>
    requires caf::is_typed_actor<Handle>::value
  [[nodiscard]] auto request(const Handle& dest, Ts&&... xs);

  /// Runs `fn()` on the runtime's blocking executor, off the scheduler threads, and
  /// suspends until it returns: `co_await` yields `caf::expected<R>` (an exception from
  /// `fn` becomes `blocking_failed`). A cancelled task stops waiting at once; `fn` itself
  /// cannot be interrupted and its result is dropped.
  template <class F>
  [[nodiscard]] auto spawn_blocking(F&& fn);

  // -- structured concurrency -------------------------------------------------------------
  //
  // Each combinator is a sub-routine of the calling task: `co_await` it. Every branch is a
  // child task actor owned by the call; none outlives it. Bodies take `(context&, item)`
  // (`(context&, size_t)` for `parallel`) and return `task<R>`.

  /// Runs `body` as a scope. By default, when the body returns, the children still running
  /// are CANCELLED; a nursery that waits for them (Trio's, a structured-concurrency
  /// language's) is `{.on_return = scope_exit::join}`.
  ///
  /// A scope is a task whose children's first failure -- of a
  /// child its body is not awaiting -- stops the body, cancels and joins the other
  /// children, and becomes the scope's error. When the body throws, the children still
  /// running are cancelled and joined; when it returns, they are cancelled too, or with
  /// `{.on_return = scope_exit::join}` waited for. Awaiting a handle inside the scope
  /// takes that child out of the nursery: its error is then the await's value. `co_await`
  /// yields `caf::expected<T>`.
  template <class F>
  auto scope(F body, scope_options opts = {}) -> task<caf::expected<detail::body_value_t<F>>>;

  /// Runs `body(cx, item)` for every item; `co_await` yields the results in index order, or
  /// fails fast: the first failure cancels the branches in flight, queued ones never start,
  /// all are joined before the call returns, and the lowest index's error is reported when
  /// several failed. An empty list answers an empty vector at once.
  template <class Item, class F>
  auto parallel_each(std::vector<Item> items, F body, parallel_options opts = {})
      -> task<caf::expected<std::vector<detail::branch_value_t<F, Item>>>>;

  /// `parallel_each` over the indexes 0..n-1 (n <= 0: empty).
  template <class F>
  auto parallel(int64_t n, F body, parallel_options opts = {})
      -> task<caf::expected<std::vector<detail::branch_value_t<F, size_t>>>>;

  /// Runs every branch and never cancels; see `settle_result`.
  template <class Item, class F>
  auto parallel_settle(std::vector<Item> items, F body, parallel_options opts = {})
      -> task<settle_result<detail::branch_value_t<F, Item>>>;

  /// The first branch to succeed wins; the others are cancelled and joined. A branch that
  /// returns an `expected` holding an error has failed (a race is never won by a failure).
  /// When all fail:
  /// `all_failed`, whose `errors_of()` lists every branch's error in index order. An empty
  /// list answers `all_failed` with no causes.
  template <class Item, class F>
  auto parallel_race(std::vector<Item> items, F body, parallel_options opts = {})
      -> task<caf::expected<race_winner<detail::branch_value_t<F, Item>>>>;

  /// Returns a stream of the results in completion order (`co_await s.next()` yields
  /// `std::optional<caf::expected<indexed<R>>>`, nothing at the end); a failure surfaces
  /// when the consumer reaches it and cancels the rest. Destroying the stream cancels what
  /// still runs (the task joins them when it ends).
  template <class Item, class F>
  auto as_stream(std::vector<Item> items, F body, parallel_options opts = {});

  /// Runs `body(cx, item, token)` for every item with a shared abort token: a branch fails
  /// when it throws or returns an error as a value; `max_failures` failures or an
  /// `abort_on` reason trip the token; queued branches never start once it tripped, and
  /// running ones stop at their next poll (`check_abort`). `co_await` yields the
  /// `abort_outcome`, or `invalid_argument` for `max_failures` < 1.
  template <class Item, class F>
  auto settle_with_abort(std::vector<Item> items, F body, abort_options opts = {})
      -> task<caf::expected<abort_outcome<detail::abort_branch_value_t<F, Item>>>>;

  /// Runs `body` under a deadline `d` from now: at the deadline it is cancelled and the call
  /// yields `deadline_exceeded`. Deadlines nest: the tighter one applies, also to the
  /// children the body spawns.
  template <class F>
  auto deadline(clock::duration d, F body) -> task<caf::expected<detail::body_value_t<F>>>;

  /// Returns the deadline this task runs under, if any.
  [[nodiscard]] std::optional<clock::time_point> current_deadline() const noexcept;

  /// Runs `body` up to `attempts` times until it succeeds (a thrown failure, or an
  /// `expected` holding an error, is a failure); yields the last error otherwise.
  /// The result is flat: a body returning `expected<U>` (or `U`) gives `expected<U>`.
  /// `attempts` < 1 answers `invalid_argument`.
  template <class F>
  auto retry(int64_t attempts, F body, retry_options opts = {})
      -> task<typename detail::flat_expected<detail::body_value_t<F>>::type>;

  /// Returns a new abort token.
  [[nodiscard]] abort_token make_abort_token();
  /// Trips `token` with `reason` (first writer wins): yields true when this call tripped it;
  /// a reason without a code answers `invalid_argument`.
  task<caf::expected<bool>> request_abort(abort_token token, abort_reason reason);
  /// Yields the reason when `token` has tripped, nothing otherwise.
  task<std::optional<abort_reason>> abort_requested(abort_token token);
  /// Throws `task_error{abandoned}` when `token` has tripped: the poll of a branch.
  task<void> check_abort(abort_token token);

  // -- task-local values ------------------------------------------------------------------

  /// Sets a task-local value. Children spawned afterwards see a snapshot of all values;
  /// later writes here or there do not leak across.
  template <class T>
  void set_local(std::string key, T value);

  /// Returns a copy of the task-local value under `key`, or nothing when absent or of
  /// another type. (A copy: a later `set_local` may free the map it came from. Store a
  /// `std::shared_ptr` for large values.)
  template <class T>
  [[nodiscard]] std::optional<T> local(std::string_view key) const;

  /// Returns whether a task-local value (of any type) is set under `key`.
  [[nodiscard]] bool has_local(std::string_view key) const;

  /// Removes a task-local value; returns the value it held (`std::any_cast<T>` it), or
  /// nothing when there was none.
  std::optional<std::any> erase_local(std::string_view key);

  // -- escape hatch -----------------------------------------------------------------------

  /// Returns the CAF actor that runs this task (for plain CAF calls such as `send`).
  [[nodiscard]] caf::event_based_actor* self() const noexcept;

 private:
  friend struct detail::access;

  [[nodiscard]] const task_locals& locals() const noexcept;
  void locals(task_locals x);

  detail::task_actor* self_;
};

inline detail::task_actor* detail::access::impl(const context& cx) noexcept {
  return cx.self_;
}

} // namespace troupe

#include "troupe/actors/detail/context_impl.hpp"
