#pragma once

// Async streams: a coroutine that `co_yield`s values and may `co_await` anything a task
// can, pulled lazily by a consumer task (`co_await s.next()`).

#include <coroutine>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <optional>
#include <type_traits>
#include <utility>

#include <caf/send.hpp>

#include "troupe/actors/channel.hpp"
#include "troupe/actors/context.hpp"
#include "troupe/actors/structured.hpp"
#include "troupe/actors/task.hpp"
#include "troupe/messages/atoms.hpp"
#include "troupe/messages/errc.hpp"

namespace troupe {

template <class T>
class stream;

namespace detail {

/// Internal: the running task, when a task body runs on this thread (streams check that
/// they are pulled from the task they were made in).
task_actor* running_task() noexcept;

template <class T>
class stream_promise : public promise_base {
 public:
  stream_promise() = default;
  /// A stream made with the task's context as its first parameter remembers that task:
  /// its `co_await`s park that task, so only that task may pull it.
  template <class... Args>
  explicit stream_promise(context& cx, Args&&...) noexcept : owner_(access::impl(cx)) {}
  /// The same for a lambda or member function (the object comes first).
  template <class Self, class... Args>
    requires(!std::is_same_v<std::decay_t<Self>, context>)
  stream_promise(Self&&, context& cx, Args&&...) noexcept : owner_(access::impl(cx)) {}
  template <class... Args>
  explicit stream_promise(Args&&...) noexcept {}

  stream<T> get_return_object() noexcept;

  /// Hands the value to the pulling task and suspends until the next pull.
  struct yield_awaiter {
    bool await_ready() const noexcept { return false; }
    std::coroutine_handle<> await_suspend(std::coroutine_handle<stream_promise> h) noexcept {
      auto next = h.promise().continuation_;
      return next ? next : std::noop_coroutine();
    }
    void await_resume() const noexcept {}
  };

  template <class U = T>
    requires std::is_constructible_v<T, U&&>
  yield_awaiter yield_value(U&& x) {
    value_.emplace(std::forward<U>(x));
    return {};
  }
  void return_void() const noexcept {}

  std::optional<T> value_;
  task_actor* owner_ = nullptr;
};

} // namespace detail

/// A lazy, single-pass async stream of `T`: the return type of a coroutine that
/// `co_yield`s values and may `co_await` anything a task body can (sleeps, requests,
/// channels, locks, sub-tasks).
///
/// ```cpp
/// troupe::stream<int> ticks(troupe::context& cx, int n) {
///   for (int i = 0; i < n; ++i) {
///     co_await cx.sleep(10ms);
///     co_yield i;
///   }
/// }
/// auto s = ticks(cx, 5);
/// while (auto v = co_await s.next()) use(*v);
/// ```
///
/// - The producer runs only when pulled, inside the pulling task (no actor, no message per
///   value): between pulls it is suspended at its `co_yield`. `buffer(cx, n, ...)` runs one
///   ahead by up to `n` values in a task of its own.
/// - `next()` yields the next value, or nothing once the producer returned. A throw in the
///   producer is rethrown by the pull that reaches it (its type kept); the stream is over
///   after that.
/// - Destroying the stream destroys the suspended producer: its RAII runs. Cancelling the
///   consumer cancels the producer with it: a producer suspended in a `co_await` gets
///   `task_cancelled` there and unwinds before the consumer does.
/// - A stream whose coroutine takes the task's `context&` first belongs to that task:
///   pulling it from another task throws `task_error` (`invalid_argument`, field `stream`).
/// - Move-only; single-pass.
template <class T>
class [[nodiscard]] stream {
 public:
  using promise_type = detail::stream_promise<T>;
  using value_type = T;
  using handle_type = std::coroutine_handle<promise_type>;

  stream() noexcept = default;
  explicit stream(handle_type h) noexcept : h_(h) {}
  stream(stream&& other) noexcept : h_(std::exchange(other.h_, {})) {}
  stream& operator=(stream&& other) noexcept {
    if (this != &other) {
      reset();
      h_ = std::exchange(other.h_, {});
    }
    return *this;
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() { reset(); }

  /// Destroys the producer where it is suspended (its RAII runs).
  void reset() noexcept {
    if (h_) std::exchange(h_, {}).destroy();
  }

  /// Whether the producer has finished (returned or thrown), or there is none.
  [[nodiscard]] bool done() const noexcept { return !h_ || h_.done(); }

  /// Pulls the next value: `co_await s.next()` yields `std::optional<T>` (nothing at the
  /// end) and rethrows what the producer threw.
  [[nodiscard]] auto next() noexcept {
    struct awaiter {
      handle_type h;
      bool await_ready() const noexcept { return !h || h.done(); }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<> consumer) {
        auto& p = h.promise();
        if (p.owner_ != nullptr && p.owner_ != detail::running_task())
          throw task_error{make_error(errc::invalid_argument, "stream",
                                      "a stream is pulled from the task it was made in (its "
                                      "co_awaits suspend that task)")};
        p.continuation_ = consumer;
        p.value_.reset();
        return h;
      }
      std::optional<T> await_resume() {
        if (!h) return std::nullopt;
        auto& p = h.promise();
        if (p.exception_) std::rethrow_exception(std::exchange(p.exception_, nullptr));
        if (h.done()) return std::nullopt;
        return std::move(p.value_);
      }
    };
    return awaiter{h_};
  }

 private:
  handle_type h_;
};

namespace detail {

template <class T>
stream<T> stream_promise<T>::get_return_object() noexcept {
  return stream<T>{std::coroutine_handle<stream_promise<T>>::from_promise(*this)};
}

/// Cancels a task without waiting (a stream being destroyed cannot await).
void cancel_detached(const std::shared_ptr<handle_state>& st) noexcept;

template <class T>
struct is_stream : std::false_type {};
template <class T>
struct is_stream<stream<T>> : std::true_type {};

} // namespace detail

/// Pulls every value of `s` into `fn` (which may return `void` or `task<void>`); rethrows
/// what the producer or `fn` threw. The range-for of streams:
/// `co_await troupe::for_each(s, [&](int v) { sum += v; });`
template <class T, class F>
task<void> for_each(stream<T>& s, F fn) {
  while (auto v = co_await s.next()) {
    if constexpr (detail::is_task<std::invoke_result_t<F&, T&&>>::value)
      co_await fn(std::move(*v));
    else
      fn(std::move(*v));
  }
}

/// The values of a channel as a stream, until it is closed and drained.
template <class T>
stream<T> stream_from(context& cx, channel<T> ch) {
  while (auto v = co_await ch.next(cx))
    co_yield std::move(*v);
}

/// The results of `cx.as_stream(...)` as a stream of `indexed<R>` in completion order; a
/// failed branch is thrown as `task_error` with its error (the rest were cancelled).
template <class Item, class F, class R>
stream<indexed<R>> stream_from(context& cx, branch_stream<Item, F, R>& s) {
  (void)cx;
  while (auto item = co_await s.next()) {
    if (!*item) throw task_error{std::move(item->error())};
    co_yield std::move(**item);
  }
}

/// Runs the stream `make(c)` makes in a child task of its own, up to `n` values ahead of
/// the consumer (through a channel of capacity `n`), and yields its values. The producer's
/// throw is rethrown at the pull that reaches it; destroying the returned stream cancels
/// the producer's task.
template <class F>
[[nodiscard]] auto buffer(context& cx, int64_t n, F make)
    -> stream<typename std::invoke_result_t<F&, context&>::value_type> {
  using T = typename std::invoke_result_t<F&, context&>::value_type;
  static_assert(detail::is_stream<std::invoke_result_t<F&, context&>>::value,
                "buffer(cx, n, make): make(context&) returns a troupe::stream<T>");
  if (n < 1)
    throw task_error{make_error(errc::invalid_capacity, "n",
                                "a stream buffer holds at least 1 value, got " +
                                    std::to_string(n))};
  auto opened = co_await open_channel<T>(cx, "", n, {.receive_batch = 1});
  if (!opened) throw task_error{std::move(opened.error())};
  auto ch = std::move(*opened);
  auto failed = std::make_shared<std::exception_ptr>();
  auto producer = cx.spawn([ch, failed, make = std::move(make)](context& c) mutable -> task<void> {
    try {
      auto s = make(c);
      while (auto v = co_await s.next())
        if (!co_await ch.send(c, std::move(*v))) break; // the consumer went away
    } catch (const task_cancelled&) {
      throw;
    } catch (...) {
      *failed = std::current_exception();
    }
    (void)co_await ch.close(c);
  });
  // The consumer drops the stream early: stop the producer (it is a child of the
  // consumer's task, so it would otherwise run, blocked on a full channel, until then).
  struct stop_producer {
    std::shared_ptr<detail::handle_state> st;
    bool finished = false;
    ~stop_producer() {
      if (!finished) detail::cancel_detached(st);
    }
  } stopper{detail::access::state(producer)};
  while (auto v = co_await ch.next(cx))
    co_yield std::move(*v);
  stopper.finished = true;
  (void)co_await cx.await(producer);
  if (*failed) std::rethrow_exception(*failed);
}

} // namespace troupe
