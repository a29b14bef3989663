#pragma once

// Internal: the one door from troupe's public types to their internals, for troupe's own
// awaiters, runners and clients. Not part of the API (it may change any time): a user never
// needs it.

#include <memory>

namespace troupe {

class context;
template <class T>
class task;
template <class T>
class task_handle;

namespace detail {

class task_actor;
struct handle_state;

struct access {
  /// Returns the task actor that runs `cx`'s task.
  [[nodiscard]] static task_actor* impl(const context& cx) noexcept;

  /// Returns the coroutine handle of `t` (for the task actor that drives it).
  template <class T>
  [[nodiscard]] static auto handle(const task<T>& t) noexcept {
    return t.h_;
  }

  /// Returns the state shared by the copies of `h`.
  template <class T>
  [[nodiscard]] static const std::shared_ptr<handle_state>& state(const task_handle<T>& h) noexcept {
    return h.st_;
  }
};

} // namespace detail

} // namespace troupe
