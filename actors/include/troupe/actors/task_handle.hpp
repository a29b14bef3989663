#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include <caf/actor.hpp>

#include "troupe/actors/detail/access.hpp"
#include "troupe/messages/outcome.hpp"

namespace troupe {

namespace detail {

/// Where a child task leaves its outcome when it ends before anyone awaits it: the child
/// publishes and exits, and the await that comes later takes the outcome from here without
/// a message. Written once by the child (`box`, then `ready` with release order); taken
/// once, by the await that holds the handle's `awaited` flag.
struct result_cell {
  std::atomic<bool> ready{false};
  bool taken = false;
  outcome_box box;
  /// Returns whether the outcome is here and not taken yet (the reader holds `awaited`).
  [[nodiscard]] bool available() const noexcept {
    return !taken && ready.load(std::memory_order_acquire);
  }
  /// Takes the published outcome (call only when `available()`).
  outcome_box take() noexcept {
    taken = true;
    return std::move(box);
  }
};

/// Shared by all copies of one handle.
struct handle_state {
  handle_state(caf::actor a, std::string i, const void* rt)
      : actor(std::move(a)), id(std::move(i)), runtime(rt) {}
  caf::actor actor;
  std::string id;
  const void* runtime;
  /// Set by the first await: the result is handed out once.
  std::atomic<bool> awaited{false};
  /// A result that arrived after its await was abandoned (the awaiting task was asked to
  /// stop): the next await takes it. Written before `awaited` is cleared.
  std::unique_ptr<outcome_box> orphan;
  /// Set while the reply of an abandoned await is still on its way to `pending_owner`.
  const void* pending_owner = nullptr;
  /// The park sequence number of an await that waits for that reply.
  uint64_t pending_waiter = 0;
  /// The child's published outcome (children of tasks and jobs; null for other tasks).
  std::shared_ptr<result_cell> cell;
};

} // namespace detail

/// Refers to a spawned task whose result is a `T`. Copies share one identity: the result
/// is handed to the first await of any copy; later awaits answer `already_awaited`.
/// A default-constructed handle is empty (`valid()` is false; awaiting it answers
/// `invalid_handle`).
template <class T>
class task_handle {
 public:
  using value_type = T;

  task_handle() noexcept = default;
  explicit task_handle(std::shared_ptr<detail::handle_state> st) noexcept : st_(std::move(st)) {}

  /// Returns whether this handle refers to a task.
  [[nodiscard]] bool valid() const noexcept { return st_ != nullptr; }
  explicit operator bool() const noexcept { return valid(); }

  /// Returns the task's id ("1.4.2": root 1, its 4th child, that one's 2nd child).
  [[nodiscard]] const std::string& id() const noexcept {
    static const std::string none;
    return st_ ? st_->id : none;
  }

  /// Returns the task actor (for monitoring or linking from plain CAF code).
  [[nodiscard]] const caf::actor& actor() const noexcept {
    static const caf::actor none;
    return st_ ? st_->actor : none;
  }

  /// Returns the shared state (for troupe's own awaiters).

 private:
  friend struct detail::access;
  std::shared_ptr<detail::handle_state> st_;
};

} // namespace troupe
