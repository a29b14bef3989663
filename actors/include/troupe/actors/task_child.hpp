#pragma once

#include <functional>
#include <string>
#include <type_traits>

#include <caf/message.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/actors/detail/runner.hpp"
#include "troupe/actors/detail/task_actor.hpp"
#include "troupe/actors/structured.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/supervision.hpp"

namespace troupe {

/// Options of a task run as a supervised child.
struct task_child_options {
  /// The task's name (`cx.name()`); the child's name when empty.
  std::string name;
};

namespace detail {

/// Wraps a task body so that a returned error (an `expected` holding one) is a failure.
template <class F>
auto call_body(F& body, context& cx) {
  if constexpr (takes_context_v<F>)
    return std::invoke(body, cx);
  else
    return std::invoke(body);
}

template <class F>
auto supervised_body(F body) {
  return [body = std::move(body)](context& cx) mutable -> task<void> {
    using T = body_value_t<F>;
    if constexpr (std::is_void_v<T>) {
      co_await call_body(body, cx);
    } else {
      auto v = co_await call_body(body, cx);
      if constexpr (is_expected<T>::value)
        if (!v) throw task_error{v.error()};
    }
  };
}

inline caf::error not_a_runtime() {
  return make_error(errc::invalid_argument, "system",
                    "task_child needs the actor system of a troupe runtime");
}

} // namespace detail

/// Returns a start function that runs `body` (`task<T>(context&)` or `task<T>()`) as a
/// supervised child: each start runs a fresh task of the body. Its failure (a throw, or a
/// returned `expected` holding an error) is the child's failure (`last_error` renders it);
/// its normal return a normal exit; a cancellation a shutdown exit (a clean end). The
/// supervisor's shutdown is a graceful cancel of the task (its pending `co_await` throws
/// `task_cancelled`, so cleanup may still await) bounded by the child's `shutdown_ms`,
/// then a forced one (the frame is destroyed; RAII runs). Its result is not kept.
template <class F>
start_fn task_child(F body, task_child_options opts = {}) {
  return [body = std::move(body), opts](caf::actor_system& sys) -> start_result {
    auto* env = detail::env_of(sys);
    if (env == nullptr) return detail::not_a_runtime();
    auto r = detail::make_runner(detail::supervised_body(body));
    return std::optional<caf::actor>{
        detail::task_actor::spawn_supervised(sys, env, std::move(r), opts.name)};
  };
}

/// Returns a template start function (a dynamic supervisor's `child_template.start`) that
/// runs `body(cx, args)` as a supervised child, as `task_child` does; `args` are the
/// arguments given to `start_child`.
template <class F>
template_start_fn task_child_template(F body, task_child_options opts = {}) {
  return [body = std::move(body), opts](caf::actor_system& sys,
                                        const caf::message& args) -> start_result {
    auto* env = detail::env_of(sys);
    if (env == nullptr) return detail::not_a_runtime();
    auto bound = [body, args](context& cx) mutable { return std::invoke(body, cx, args); };
    auto r = detail::make_runner(detail::supervised_body(std::move(bound)));
    return std::optional<caf::actor>{
        detail::task_actor::spawn_supervised(sys, env, std::move(r), opts.name)};
  };
}

} // namespace troupe
