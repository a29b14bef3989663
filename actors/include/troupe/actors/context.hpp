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

#include "troupe/actors/task.hpp"
#include "troupe/actors/task_env.hpp"
#include "troupe/actors/task_handle.hpp"
#include "troupe/messages/clock.hpp"

namespace troupe {

namespace detail {
class task_actor;
} // namespace detail

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

  /// Runs `fn()` on the runtime's blocking executor, off the scheduler threads, and
  /// suspends until it returns: `co_await` yields `caf::expected<R>` (an exception from
  /// `fn` becomes `blocking_failed`). A cancelled task stops waiting at once; `fn` itself
  /// cannot be interrupted and its result is dropped.
  template <class F>
  [[nodiscard]] auto spawn_blocking(F&& fn);

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

  /// Removes a task-local value; returns whether it existed.
  bool erase_local(std::string_view key);

  // -- escape hatch -----------------------------------------------------------------------

  /// Returns the CAF actor that runs this task (for plain CAF calls such as `send`).
  [[nodiscard]] caf::event_based_actor* self() const noexcept;

  /// Returns the task actor (for troupe's own awaiters).
  [[nodiscard]] detail::task_actor* impl() const noexcept { return self_; }

private:
  [[nodiscard]] const task_locals& locals() const noexcept;
  void locals(task_locals x);

  detail::task_actor* self_;
};

} // namespace troupe

#include "troupe/actors/detail/context_impl.hpp"
