#pragma once

#include <coroutine>
#include <functional>
#include <memory>
#include <type_traits>

#include "troupe/actors/task.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/outcome.hpp"

namespace troupe {
class context;
struct abort_token;
} // namespace troupe

namespace troupe::detail {

/// Owns a task body and its coroutine for the task actor, erasing the result type.
class runner_base {
 public:
  /// A task's body holder, one per spawn, freed where the task ends: through the recycler
  /// (the virtual destructor hands the concrete size to the sized delete).
  static void* operator new(std::size_t n) { return recycler::allocate(n); }
  static void operator delete(void* p, std::size_t n) noexcept { recycler::deallocate(p, n); }

  virtual ~runner_base() = default;
  /// Creates the root coroutine (suspended) by calling the body; returns an error for an
  /// empty body or a body that threw before its first suspension.
  virtual caf::error create(context& cx) = 0;
  /// Returns the root coroutine.
  [[nodiscard]] virtual std::coroutine_handle<> handle() const noexcept = 0;
  /// Returns the outcome of the finished root coroutine.
  virtual outcome_box take_outcome() = 0;
  /// Destroys the coroutine frame, running the destructors of its live locals.
  virtual void destroy() noexcept = 0;
};

template <class F>
constexpr bool takes_context_v = std::is_invocable_v<F&, context&>;

template <class F>
struct body_result {
  using type = std::conditional_t<takes_context_v<F>, std::invoke_result<F&, context&>,
                                  std::invoke_result<F&>>;
};

/// Returns the `task<T>` type that the body `F` returns.
template <class F>
using body_task_t = typename body_result<F>::type::type;

/// The value type of the task that body `F` returns.
template <class F>
using body_value_t = typename body_task_t<std::decay_t<F>>::value_type;

/// The value type of a branch body `F(context&, const Item&)`.
template <class F, class Item>
using branch_value_t =
    typename std::invoke_result_t<const std::decay_t<F>&, context&, const Item&>::value_type;

/// The value type of an abort branch body `F(context&, const Item&, abort_token)`.
template <class F, class Item>
using abort_branch_value_t = typename std::invoke_result_t<const std::decay_t<F>&, context&,
                                                           const Item&, abort_token>::value_type;

template <class T, class F>
class runner final : public runner_base {
 public:
  using value_type = T;

  explicit runner(F body) : body_(std::move(body)) {}

  caf::error create(context& cx) override {
    if constexpr (std::is_constructible_v<bool, const F&>) {
      if (!static_cast<bool>(body_))
        return make_error(errc::empty_body, "body", "the task body is a null function");
    }
    try {
      if constexpr (takes_context_v<F>)
        task_ = std::invoke(body_, cx);
      else
        task_ = std::invoke(body_);
    } catch (...) {
      return error_from_current_exception("body");
    }
    if (!access::handle(task_))
      return make_error(errc::empty_body, "body", "the body returned an empty task");
    return {};
  }

  std::coroutine_handle<> handle() const noexcept override { return access::handle(task_); }

  outcome_box take_outcome() override {
    try {
      if constexpr (std::is_void_v<T>) {
        access::handle(task_).promise().take();
        return {};
      } else {
        return {recycler::make_shared<T>(access::handle(task_).promise().take()), caf::error{}};
      }
    } catch (...) {
      return {nullptr, error_from_current_exception("body")};
    }
  }

  void destroy() noexcept override { task_.reset(); }

 private:
  F body_;
  task<T> task_;
};

/// Returns a runner for `body`.
template <class F>
auto make_runner(F&& body) {
  using D = std::decay_t<F>;
  using R = body_task_t<D>;
  static_assert(is_task<R>::value, "a task body must return troupe::task<T>");
  return std::make_unique<runner<typename R::value_type, D>>(std::forward<F>(body));
}

} // namespace troupe::detail
