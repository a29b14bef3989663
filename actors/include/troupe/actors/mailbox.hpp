#pragma once

#include <optional>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "troupe/actors/channel.hpp"
#include "troupe/actors/context.hpp"
#include "troupe/actors/detail/queue_ops.hpp"

namespace troupe {

/// Names a mailbox: its scope (`"task"`, `"task_group"`, `"process"`, `"tenant"`), the
/// tenant for tenant scope, and the name within the scope. The same name in two scopes (two
/// tenants, two tasks) is two mailboxes.
struct mailbox_address {
  std::string scope = "process";
  std::string tenant_id;
  std::string name;
};

/// What `open_mailbox` creates.
struct mailbox_spec {
  std::string scope = "process";
  std::string tenant_id;
  std::string name;
  /// The most messages it buffers; a send to a full mailbox waits (backpressure).
  int64_t capacity = 1024;
  /// The most buffered messages one receive takes at once (see `channel_options`).
  uint64_t receive_batch = 64;
};

/// A handle to a named mailbox (an actor); cheap to copy and to hand to other tasks.
class mailbox {
 public:
  mailbox() = default;
  mailbox(caf::actor queue, mailbox_address addr, uint64_t batch)
      : queue_(std::move(queue)), addr_(std::move(addr)), batch_(batch) {}
  [[nodiscard]] const caf::actor& actor() const noexcept { return queue_; }
  [[nodiscard]] const mailbox_address& address() const noexcept { return addr_; }
  [[nodiscard]] uint64_t receive_batch() const noexcept { return batch_; }
  [[nodiscard]] explicit operator bool() const noexcept { return static_cast<bool>(queue_); }
  /// Returns the mailbox's counters: `co_await` yields `caf::expected<queue_metrics>`
  /// (depth, capacity, sent, received, failed sends, closed). Keep the handle and ask it:
  /// reopening by name to read metrics may create or find another object.
  [[nodiscard]] auto metrics(context& cx) const {
    return detail::handle_request<queue_metrics>(cx, queue_, "mailbox",
                                                 atoms::q_metrics_atom::value);
  }

 private:
  caf::actor queue_;
  mailbox_address addr_;
  uint64_t batch_ = 64;
};

/// A received message: a JSON value or a typed C++ value, whichever was sent.
class mail {
 public:
  mail() = default;
  explicit mail(caf::message m) : msg_(std::move(m)) {}

  /// Returns whether the message holds a `T` (`nlohmann::json` for JSON messages).
  template <class T>
  [[nodiscard]] bool is() const noexcept {
    return detail::holds_value<T>(msg_);
  }
  /// Returns the `T` the message holds, or null.
  template <class T>
  [[nodiscard]] const T* get_if() const noexcept {
    return is<T>() ? &msg_.get_as<detail::boxed<T>>(msg_.size() - 1).value : nullptr;
  }
  /// Returns whether the message is a JSON value.
  [[nodiscard]] bool is_json() const noexcept { return is<nlohmann::json>(); }
  /// Returns the JSON value, or null when the message is a typed value.
  [[nodiscard]] const nlohmann::json* json() const noexcept { return get_if<nlohmann::json>(); }

 private:
  caf::message msg_;
};

namespace detail {

/// What a mailbox carries for a sent `V`: string literals travel as `std::string`.
template <class V>
using mail_value_t =
    std::conditional_t<std::is_convertible_v<const std::decay_t<V>&, std::string_view> &&
                           !std::is_same_v<std::decay_t<V>, nlohmann::json>,
                       std::string, std::decay_t<V>>;

/// Returns the registry key of a scoped name, or an error for a bad scope or name.
caf::expected<std::string> scoped_key(context& cx, std::string_view kind, const std::string& scope,
                                      const std::string& tenant, const std::string& name);

/// Returns the owner whose end drops a task-scoped entry (empty for other scopes).
caf::actor_addr scope_owner(context& cx, const std::string& scope);

task<caf::expected<mailbox>> mailbox_open_impl(context& cx, mailbox_spec spec, bool create);

struct mailbox_send_awaiter : queue_send_awaiter {
  using queue_send_awaiter::queue_send_awaiter;
  caf::expected<bool> await_resume() {
    auto err = take_error();
    if (!err) return true;
    if (is(err, errc::mailbox_closed) || is(err, errc::invalid_handle)) return false;
    return err;
  }
};

struct mailbox_recv_awaiter : queue_recv_awaiter {
  using queue_recv_awaiter::queue_recv_awaiter;
  caf::expected<mail> await_resume() {
    auto r = take();
    if (!r) return std::move(r.error());
    if (!*r) return make_error(errc::mailbox_closed, "mailbox", "no message");
    return mail{std::move(**r)};
  }
};

struct mailbox_try_awaiter : queue_recv_awaiter {
  using queue_recv_awaiter::queue_recv_awaiter;
  caf::expected<std::optional<mail>> await_resume() {
    auto r = take();
    if (!r) {
      if (is(r.error(), errc::mailbox_closed)) return std::optional<mail>{};
      return std::move(r.error());
    }
    if (!*r) return std::optional<mail>{};
    return std::optional<mail>{mail{std::move(**r)}};
  }
};

template <class T>
struct mailbox_recv_as_awaiter : queue_recv_awaiter {
  using queue_recv_awaiter::queue_recv_awaiter;
  caf::expected<T> await_resume() {
    auto r = take();
    if (!r) return std::move(r.error());
    if (!*r) return make_error(errc::mailbox_closed, "mailbox", "no message");
    return unbox_value<T>(**r);
  }
};

template <class V>
task<caf::expected<bool>> mailbox_send_to(context& cx, mailbox_address target, V value) {
  mailbox_spec spec{target.scope, target.tenant_id, target.name, 1, 1};
  auto mb = co_await mailbox_open_impl(cx, std::move(spec), false);
  if (!mb) {
    if (is(mb.error(), errc::not_found)) co_return false;
    co_return std::move(mb.error());
  }
  co_return co_await mailbox_send_awaiter{detail::access::impl(cx), mb->actor(),
                                          box_value(mail_value_t<V>(std::move(value)))};
}

} // namespace detail

/// Opens (finds or creates) a mailbox. `co_await` yields `caf::expected<mailbox>`:
/// `invalid_scope` for an unknown scope or tenant scope without `tenant_id`,
/// `invalid_name` for an empty name, `invalid_capacity` for a capacity below 1.
[[nodiscard]] inline auto open_mailbox(context& cx, mailbox_spec spec) {
  return detail::mailbox_open_impl(cx, std::move(spec), true);
}

/// Finds a mailbox in the caller's view of `addr`'s scope; `co_await` yields
/// `caf::expected<mailbox>`, `not_found` when there is none (a reader in another task,
/// group or tenant does not see it).
[[nodiscard]] inline auto lookup_mailbox(context& cx, mailbox_address addr) {
  return detail::mailbox_open_impl(cx, mailbox_spec{addr.scope, addr.tenant_id, addr.name, 1, 64},
                                   false);
}

/// Sends `value` (a JSON value or any C++ value) to `target`; `co_await` yields
/// `caf::expected<bool>`: true once buffered, false when the mailbox is closed or the
/// handle empty -- never an exception. Waits while the mailbox is full.
template <class V>
[[nodiscard]] auto mailbox_send(context& cx, const mailbox& target, V&& value) {
  return detail::mailbox_send_awaiter{
      detail::access::impl(cx), target.actor(),
      detail::box_value(detail::mail_value_t<V>(std::forward<V>(value)))};
}

/// Sends `value` to the mailbox at `target` (looked up first); yields false when it does not
/// exist or is closed.
template <class V>
[[nodiscard]] auto mailbox_send(context& cx, mailbox_address target, V value) {
  return detail::mailbox_send_to<detail::mail_value_t<V>>(
      cx, std::move(target), detail::mail_value_t<V>(std::move(value)));
}

/// Receives the next message, waiting for one; `co_await` yields `caf::expected<mail>`:
/// `mailbox_closed` once closed and drained; a cancelled task stops waiting.
[[nodiscard]] inline auto mailbox_receive(context& cx, const mailbox& mb) {
  return detail::mailbox_recv_awaiter{detail::access::impl(cx), mb.actor(), mb.receive_batch(), 0, true,
                                      "mailbox"};
}

/// Receives the next message as a `T`; `co_await` yields `caf::expected<T>`: `wrong_type`
/// (the message stays in the mailbox) when the next message is not a `T`.
template <class T>
[[nodiscard]] auto mailbox_receive_as(context& cx, const mailbox& mb) {
  return detail::mailbox_recv_as_awaiter<T>{detail::access::impl(cx), mb.actor(), mb.receive_batch(),
                                            detail::type_key<T>(), true, "mailbox"};
}

/// Takes a message if one is buffered; `co_await` yields
/// `caf::expected<std::optional<mail>>` (nothing when empty or closed).
[[nodiscard]] inline auto mailbox_try_receive(context& cx, const mailbox& mb) {
  return detail::mailbox_try_awaiter{detail::access::impl(cx), mb.actor(), mb.receive_batch(), 0, false,
                                     "mailbox"};
}

/// Closes the mailbox; `co_await` yields `caf::expected<bool>` (false when closed already).
/// Later sends answer false; receivers drain what is buffered, then get `mailbox_closed`.
[[nodiscard]] inline auto mailbox_close(context& cx, const mailbox& mb) {
  return detail::handle_request<bool>(cx, mb.actor(), "mailbox", atoms::q_close_atom::value);
}

// -- former names (one release) -------------------------------------------------------------

[[deprecated("renamed open_mailbox")]] inline auto mailbox_open(context& cx, mailbox_spec spec) {
  return open_mailbox(cx, std::move(spec));
}
[[deprecated("renamed lookup_mailbox")]] inline auto mailbox_lookup(context& cx,
                                                                     mailbox_address addr) {
  return lookup_mailbox(cx, std::move(addr));
}
[[deprecated("use mb.metrics(cx)")]] inline auto mailbox_metrics(context& cx, const mailbox& mb) {
  return mb.metrics(cx);
}

} // namespace troupe
