#pragma once

#include <coroutine>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include <caf/error.hpp>

#include "troupe/actors/detail/access.hpp"
#include "troupe/actors/detail/recycler.hpp"

namespace troupe {

/// Thrown inside a task body by the first `co_await` after the task was asked to stop
/// (and by every one after it). It does not derive from `std::exception`, so a
/// `catch (const std::exception&)` in user code does not swallow a cancellation; the task
/// ends with the `cancelled` outcome, which is not a failure. Catch it with `catch (...)`
/// only to clean up, then rethrow.
struct task_cancelled {};

/// Thrown by a task body to fail its task with a specific typed error: the awaiter sees
/// exactly `error()` rather than the generic `task_failed`.
class task_error : public std::exception {
 public:
  explicit task_error(caf::error err);
  /// Returns the error the task fails with.
  [[nodiscard]] const caf::error& error() const noexcept { return err_; }
  /// Returns the rendered error.
  [[nodiscard]] const char* what() const noexcept override { return what_.c_str(); }

 private:
  caf::error err_;
  std::string what_;
};

template <class T = void>
class task;

namespace detail {

/// Returns the error that describes the exception being handled (call from a `catch`).
caf::error error_from_current_exception(const char* field);

/// A task's top-level body is ending with an exception (called from its promise, before
/// the exception is turned into the task's error): a failure, not `task_cancelled`, stops
/// the task's fail-fast siblings now.
void body_threw() noexcept;

class promise_base {
 public:
  struct final_awaiter {
    bool await_ready() const noexcept { return false; }
    template <class Promise>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<Promise> h) noexcept {
      auto next = h.promise().continuation_;
      return next ? next : std::noop_coroutine();
    }
    void await_resume() const noexcept {}
  };

  /// Coroutine frames come from the recycler (a task body, a sub-task, a pool job: one or
  /// more frames per message exchange, often freed on another thread than the one that
  /// made them).
  static void* operator new(std::size_t n) { return recycler::allocate(n); }
  static void operator delete(void* p, std::size_t n) noexcept { recycler::deallocate(p, n); }

  std::suspend_always initial_suspend() const noexcept { return {}; }
  final_awaiter final_suspend() const noexcept { return {}; }
  void unhandled_exception() noexcept {
    exception_ = std::current_exception();
    if (!continuation_) body_threw(); // the top-level body (a sub-task has its awaiter)
  }

  /// The coroutine to resume when this one finishes (a parent body awaiting a sub-task).
  std::coroutine_handle<> continuation_;
  std::exception_ptr exception_;
};

template <class T>
class promise : public promise_base {
 public:
  task<T> get_return_object() noexcept;

  template <class U = T>
  void return_value(U&& x) {
    value_.emplace(std::forward<U>(x));
  }

  /// Returns the value, or rethrows what the body threw.
  T take() {
    if (exception_) std::rethrow_exception(exception_);
    return std::move(*value_);
  }

 private:
  std::optional<T> value_;
};

template <>
class promise<void> : public promise_base {
 public:
  task<void> get_return_object() noexcept;
  void return_void() const noexcept {}
  void take() const {
    if (exception_) std::rethrow_exception(exception_);
  }
};

} // namespace detail

/// A C++20 coroutine returning `T`: the body of a troupe task. A task actor drives it;
/// inside it, `co_await` suspends on a message exchange and never blocks a thread.
///
/// A `task<T>` can also be `co_await`ed directly from another task body: then it runs as
/// a plain sub-routine inside the same task actor (no new actor, no message), and its
/// exception, if any, propagates to the awaiting body. Use `context::spawn` for
/// concurrency. A task is lazy: it starts when driven or awaited. Move-only.
template <class T>
class [[nodiscard]] task {
 public:
  using promise_type = detail::promise<T>;
  using value_type = T;
  using handle_type = std::coroutine_handle<promise_type>;

  task() noexcept = default;
  explicit task(handle_type h) noexcept : h_(h) {}
  task(task&& other) noexcept : h_(std::exchange(other.h_, {})) {}
  task& operator=(task&& other) noexcept {
    if (this != &other) {
      reset();
      h_ = std::exchange(other.h_, {});
    }
    return *this;
  }
  task(const task&) = delete;
  task& operator=(const task&) = delete;
  ~task() { reset(); }

  /// Destroys the coroutine frame, running the destructors of its live locals.
  void reset() noexcept {
    if (h_) std::exchange(h_, {}).destroy();
  }

  /// Runs this task as a sub-routine of the awaiting body and returns its value.
  auto operator co_await() && noexcept {
    struct awaiter {
      handle_type h;
      bool await_ready() const noexcept { return !h || h.done(); }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<> caller) noexcept {
        h.promise().continuation_ = caller;
        return h;
      }
      T await_resume() {
        if (!h) throw task_error{caf::error{}};
        return h.promise().take();
      }
    };
    return awaiter{h_};
  }

 private:
  friend struct detail::access;
  handle_type h_;
};

namespace detail {

template <class T>
task<T> promise<T>::get_return_object() noexcept {
  return task<T>{std::coroutine_handle<promise<T>>::from_promise(*this)};
}

inline task<void> promise<void>::get_return_object() noexcept {
  return task<void>{std::coroutine_handle<promise<void>>::from_promise(*this)};
}

template <class T>
struct is_task : std::false_type {};

template <class T>
struct is_task<task<T>> : std::true_type {};

} // namespace detail

} // namespace troupe
