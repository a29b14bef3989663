#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/actors/context.hpp"
#include "troupe/actors/detail/queue_ops.hpp"

namespace troupe {

/// Options of a channel.
struct channel_options {
  /// The most buffered values one receive takes at once (the rest wait in the receiving
  /// task for its next receives). 1 shares values most evenly between competing receivers.
  uint64_t receive_batch = 16;
};

/// A bounded FIFO channel of `T` values between tasks: a handle to a channel actor, cheap to
/// copy and to hand to other tasks. Open it with `open_channel`.
///
/// Every operation is awaited from a task body (`co_await ch.send(cx, v)`):
/// - `send` suspends while the channel is full (backpressure) and fails with
///   `channel_closed` once it is closed;
/// - `receive` suspends while it is empty; once closed, it drains what is buffered, then
///   fails with `channel_closed`;
/// - `try_receive` never suspends for a value: nothing when empty (closed or not);
/// - `next` is the loop form: the next value, or nothing once closed and drained.
///
/// A wait no other task can end (every live task stuck on channels) fails with `deadlock`.
/// A cancelled receive takes no value: one already on its way stays with the task for its
/// next receive, and a task that ends gives the values it took but did not consume back to
/// the channel, in order.
template <class T>
class channel {
 public:
  using value_type = T;

  channel() = default;
  channel(caf::actor queue, std::string name, int64_t capacity, uint64_t batch)
      : queue_(std::move(queue)), name_(std::move(name)), capacity_(capacity), batch_(batch) {}

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] int64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] const caf::actor& actor() const noexcept { return queue_; }
  [[nodiscard]] explicit operator bool() const noexcept { return static_cast<bool>(queue_); }

  struct send_awaiter : detail::typed_send_awaiter<T> {
    using detail::typed_send_awaiter<T>::typed_send_awaiter;
    caf::expected<void> await_resume() {
      if (auto err = this->take_error()) return err;
      return {};
    }
  };

  // A value handed over in place (`direct_`) is taken only once the error checks passed.
  struct receive_awaiter : detail::typed_recv_awaiter<T> {
    using detail::typed_recv_awaiter<T>::typed_recv_awaiter;
    caf::expected<T> await_resume() {
      caf::error err;
      auto* m = this->take_in_place(err);
      if (err) return err;
      if (this->direct_) return std::move(*this->direct_);
      if (m == nullptr) return make_error(errc::channel_closed, "channel", "no value");
      return detail::unbox_value<T>(*m);
    }
  };

  struct try_receive_awaiter : detail::typed_recv_awaiter<T> {
    using detail::typed_recv_awaiter<T>::typed_recv_awaiter;
    caf::expected<std::optional<T>> await_resume() {
      auto r = this->take();
      if (!r) {
        if (is(r.error(), errc::channel_closed)) return std::optional<T>{};
        return std::move(r.error());
      }
      if (this->direct_) return std::optional<T>{std::move(*this->direct_)};
      if (!*r) return std::optional<T>{};
      return std::optional<T>{detail::unbox_value<T>(**r)};
    }
  };

  struct next_awaiter : detail::typed_recv_awaiter<T> {
    using detail::typed_recv_awaiter<T>::typed_recv_awaiter;
    std::optional<T> await_resume() {
      auto r = this->take();
      if (!r) {
        if (is(r.error(), errc::channel_closed)) return std::nullopt;
        throw task_error{std::move(r.error())};
      }
      if (this->direct_) return std::move(*this->direct_);
      if (!*r) return std::nullopt;
      return detail::unbox_value<T>(**r);
    }
  };

  /// Sends `value`; `co_await` yields `caf::expected<void>` (`channel_closed` once closed).
  [[nodiscard]] send_awaiter send(context& cx, T value) const {
    return send_awaiter{detail::access::impl(cx), queue_, std::move(value)};
  }

  /// Receives the next value; `co_await` yields `caf::expected<T>`.
  [[nodiscard]] receive_awaiter receive(context& cx) const {
    return receive_awaiter{detail::access::impl(cx), queue_, batch_, 0, true};
  }

  /// Takes a value if one is buffered; `co_await` yields `caf::expected<std::optional<T>>`
  /// (nothing when empty, closed or not).
  [[nodiscard]] try_receive_awaiter try_receive(context& cx) const {
    return try_receive_awaiter{detail::access::impl(cx), queue_, batch_, 0, false};
  }

  /// Receives the next value; `co_await` yields it, or nothing once the channel is closed
  /// and drained. Other failures (`deadlock`) throw `task_error`. The loop of a consumer:
  /// `while (auto v = co_await ch.next(cx)) use(*v);`
  [[nodiscard]] next_awaiter next(context& cx) const {
    return next_awaiter{detail::access::impl(cx), queue_, batch_, 0, true};
  }

  /// Closes the channel; `co_await` yields `caf::expected<bool>` (false when it was closed
  /// already). Waiting senders fail with `channel_closed`; receivers drain what is left.
  [[nodiscard]] auto close(context& cx) const {
    return detail::handle_request<bool>(cx, queue_, "channel", atoms::q_close_atom::value);
  }

  /// Returns the channel's counters; `co_await` yields `caf::expected<queue_metrics>`.
  [[nodiscard]] auto metrics(context& cx) const {
    return detail::handle_request<queue_metrics>(cx, queue_, "channel",
                                                 atoms::q_metrics_atom::value);
  }

 private:
  caf::actor queue_;
  std::string name_;
  int64_t capacity_ = 0;
  uint64_t batch_ = 16;
};

namespace detail {

task<caf::expected<caf::actor>> open_primitive(context& cx, primitive_spec spec);

template <class T>
task<caf::expected<channel<T>>> open_channel_impl(context& cx, std::string name, int64_t capacity,
                                                  channel_options opts) {
  if (capacity <= 0)
    co_return make_error(errc::invalid_capacity, "capacity",
                         "a channel holds at least 1 value, got " + std::to_string(capacity));
  if (opts.receive_batch == 0)
    co_return make_error(errc::invalid_argument, "receive_batch", "must be at least 1");
  primitive_spec spec;
  spec.kind = primitive_kind::channel;
  spec.key = name.empty() ? std::string{} : "channel|" + name;
  spec.name = name.empty() ? "anonymous" : name;
  spec.type_hash = type_key<T>();
  spec.type_name = type_label<T>();
  spec.capacity = capacity;
  auto a = co_await open_primitive(cx, std::move(spec));
  if (!a) co_return std::move(a.error());
  co_return channel<T>{std::move(*a), std::move(name), capacity, opts.receive_batch};
}

} // namespace detail

/// Opens the channel `name` of `T` values holding up to `capacity`, creating it when it does
/// not exist (an empty name: a new anonymous channel). `co_await` yields
/// `caf::expected<channel<T>>`: `invalid_capacity` for a capacity below 1, `wrong_type` when
/// `name` is a channel of another type, `sync_conflict` when it names another primitive.
template <class T>
[[nodiscard]] auto open_channel(context& cx, std::string name, int64_t capacity, channel_options opts = {}) {
  return detail::open_channel_impl<T>(cx, std::move(name), capacity, opts);
}

/// Options of a select: a timeout case, or a default case (`nonblocking`), not both.
struct select_options {
  /// Give up after this long on the runtime clock: the result says `timed_out`.
  std::optional<clock::duration> timeout;
  /// The default case: take a value only if one is ready now, else say `none`.
  bool nonblocking = false;
};

/// What a dynamic select yields: the index of the winning channel and its value, or that
/// the timeout or default case was taken.
template <class T>
struct select_result {
  enum kind_t : uint8_t { value, timed_out, none };
  kind_t kind = none;
  size_t index = 0;
  std::optional<T> item;
  [[nodiscard]] bool has_value() const noexcept { return kind == value; }
};

/// What a select over channels of different types yields: `item` holds the winner's value
/// as alternative `index` of the variant.
template <class... Ts>
struct select_any_result {
  typename select_result<int>::kind_t kind = select_result<int>::none;
  size_t index = 0;
  std::optional<std::variant<Ts...>> item;
  [[nodiscard]] bool has_value() const noexcept { return kind == select_result<int>::value; }
};

namespace detail {

inline caf::error select_precheck(const std::vector<caf::actor>& qs, const select_options& opts) {
  if (qs.empty()) return make_error(errc::invalid_argument, "channels", "a select needs a channel");
  for (size_t i = 0; i < qs.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (qs[i] && qs[i] == qs[j])
        return make_error(errc::invalid_argument, "channels[" + std::to_string(i) + "]",
                          "the same channel appears twice in one select");
  if (opts.timeout && opts.nonblocking)
    return make_error(errc::invalid_argument, "timeout",
                      "a select takes a timeout case or a default case, not both");
  if (opts.timeout && opts.timeout->count() < 0)
    return make_error(errc::invalid_argument, "timeout", "a timeout cannot be negative");
  return {};
}

template <class T>
struct select_awaiter_t : select_awaiter {
  using select_awaiter::select_awaiter;
  caf::expected<select_result<T>> await_resume() {
    auto r = take_result();
    if (!r) return std::move(r.error());
    select_result<T> out;
    out.index = r->index;
    if (r->kind == select_outcome::value) {
      out.kind = select_result<T>::value;
      out.item = unbox_value<T>(r->item);
    } else {
      out.kind =
          r->kind == select_outcome::timeout ? select_result<T>::timed_out : select_result<T>::none;
    }
    return out;
  }
};

template <class... Ts>
struct select_any_awaiter : select_awaiter {
  using select_awaiter::select_awaiter;
  caf::expected<select_any_result<Ts...>> await_resume() {
    auto r = take_result();
    if (!r) return std::move(r.error());
    select_any_result<Ts...> out;
    out.index = r->index;
    if (r->kind == select_outcome::value) {
      out.kind = select_result<int>::value;
      fill(out, r->item, std::index_sequence_for<Ts...>{});
    } else {
      out.kind = r->kind == select_outcome::timeout ? select_result<int>::timed_out
                                                    : select_result<int>::none;
    }
    return out;
  }

 private:
  template <size_t... Is>
  static void fill(select_any_result<Ts...>& out, caf::message& m, std::index_sequence<Is...>) {
    ((out.index == Is ? (out.item.emplace(std::in_place_index<Is>, unbox_value<Ts>(m)), 0) : 0),
     ...);
  }
};

} // namespace detail

/// Waits until one of `chans` has a value and takes it: the first ready wins. `co_await`
/// yields `caf::expected<select_result<T>>` (index and value, or `timed_out` / `none` for
/// the timeout and default cases). A value is never lost: a channel holds its value for a
/// select until the select takes it or withdraws, so losers keep theirs, in order. When every
/// channel is closed and drained: `channel_closed`.
template <class T>
[[nodiscard]] auto select(context& cx, const std::vector<channel<T>>& chans, select_options opts = {}) {
  std::vector<caf::actor> qs;
  qs.reserve(chans.size());
  for (auto& c : chans)
    qs.push_back(c.actor());
  auto pre = detail::select_precheck(qs, opts);
  return detail::select_awaiter_t<T>{detail::access::impl(cx), std::move(qs), opts.timeout, opts.nonblocking,
                                     std::move(pre)};
}

/// `select` over channels of different types: `co_await` yields
/// `caf::expected<select_any_result<Ts...>>`.
template <class... Ts>
[[nodiscard]] auto select_any(context& cx, select_options opts, const channel<Ts>&... chans) {
  std::vector<caf::actor> qs{chans.actor()...};
  auto pre = detail::select_precheck(qs, opts);
  return detail::select_any_awaiter<Ts...>{detail::access::impl(cx), std::move(qs), opts.timeout, opts.nonblocking,
                                           std::move(pre)};
}

} // namespace troupe
