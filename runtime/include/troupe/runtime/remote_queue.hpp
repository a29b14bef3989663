#pragma once

// Channels and mailboxes by cluster name: a node shares one of its queues under a name
// (`share_channel`, `share_mailbox`), and a task on any node opens it (`open_remote_channel`,
// `open_remote_mailbox`) and sends, receives and closes through the owner's node. Values
// cross as JSON: the shared queue holds `nlohmann::json` values, and a `remote_channel<T>`
// converts with `to_json` / `from_json`. Each operation runs on the owner's node as a
// registered body (`spawn_on`), so its backpressure, FIFO order, close and wrong-type rules
// are the local queue's, and the owner's death is `node_down`. See docs/cluster.md.

#include <optional>
#include <string>
#include <utility>

#include <caf/actor.hpp>
#include <caf/expected.hpp>
#include <nlohmann/json.hpp>

#include "troupe/actors/channel.hpp"
#include "troupe/actors/context.hpp"
#include "troupe/actors/mailbox.hpp"
#include "troupe/actors/remote.hpp"
#include "troupe/actors/task.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/messaging.hpp"

namespace troupe {

/// The cluster names a channel and a mailbox shared as `name` are registered under.
[[nodiscard]] inline std::string shared_channel_name(const std::string& name) {
  return "troupe.channel/" + name;
}
[[nodiscard]] inline std::string shared_mailbox_name(const std::string& name) {
  return "troupe.mailbox/" + name;
}

namespace detail {

/// The bodies that serve shared queues (every cluster node registers them).
inline constexpr const char* queue_send_body = "troupe.queue.send";
inline constexpr const char* queue_receive_body = "troupe.queue.receive";
inline constexpr const char* queue_try_receive_body = "troupe.queue.try_receive";
inline constexpr const char* queue_close_body = "troupe.queue.close";
inline constexpr const char* queue_metrics_body = "troupe.queue.metrics";

/// Adds those bodies to `reg`.
void add_queue_bodies(body_registry& reg);

/// Registers `queue` under `shared_channel_name(name)` or `shared_mailbox_name(name)`.
task<caf::expected<bool>> share_queue(context& cx, caf::actor queue, std::string name,
                                      bool mailbox);

/// Where a shared queue is: its actor and its node (`unknown_name` when none is shared so).
struct queue_location {
  caf::actor queue;
  std::string node;
};
task<caf::expected<queue_location>> find_queue(context& cx, std::string name, bool mailbox);

/// A remote mailbox reports a closed queue as `mailbox_closed`, as a local one does.
inline caf::error queue_error(caf::error err, bool mailbox) {
  if (mailbox && is(err, errc::channel_closed))
    return make_error(errc::mailbox_closed, "mailbox", "the mailbox is closed");
  return err;
}

template <class T>
caf::expected<T> from_queue_json(nlohmann::json& j) {
  if constexpr (std::is_same_v<T, nlohmann::json>) {
    return std::move(j);
  } else {
    try {
      return j.get<T>();
    } catch (const std::exception& e) {
      return make_error(errc::wrong_type, "value",
                        std::string{"the value does not convert: "} + e.what() + "; it was " +
                            j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
  }
}

template <class T>
task<caf::expected<void>> remote_send(context& cx, caf::actor q, std::string node, bool mailbox,
                                      T value) {
  nlohmann::json j = std::move(value);
  auto r = co_await spawn_on<bool>(cx, std::move(node), queue_send_body, std::move(q), std::move(j));
  if (!r) co_return queue_error(std::move(r.error()), mailbox);
  co_return caf::expected<void>{};
}

template <class T>
task<caf::expected<T>> remote_receive(context& cx, caf::actor q, std::string node, bool mailbox) {
  auto r = co_await spawn_on<nlohmann::json>(cx, std::move(node), queue_receive_body, std::move(q));
  if (!r) co_return queue_error(std::move(r.error()), mailbox);
  co_return from_queue_json<T>(*r);
}

template <class T>
task<caf::expected<std::optional<T>>> remote_try_receive(context& cx, caf::actor q,
                                                         std::string node) {
  // `[]` (nothing) or `[value]`: a JSON null is a value too
  auto r = co_await spawn_on<nlohmann::json>(cx, std::move(node), queue_try_receive_body, std::move(q));
  if (!r) co_return std::move(r.error());
  if (!r->is_array() || r->empty()) co_return std::optional<T>{};
  auto v = from_queue_json<T>((*r)[0]);
  if (!v) co_return std::move(v.error());
  co_return std::optional<T>{std::move(*v)};
}

} // namespace detail

/// A channel or mailbox on another node (or this one), opened by cluster name. Cheap to
/// copy. Every operation is one run on the owner's node:
/// - `send` waits while the queue is full (backpressure) and yields once it accepted the
///   value; values sent one after another by one task arrive in that order;
/// - `receive` waits while it is empty; `try_receive` yields nothing at once;
/// - a closed queue: `send` fails `channel_closed`, `receive` fails `channel_closed` once
///   it is drained; a head value that is not JSON (a mailbox's typed mail) fails
///   `wrong_type` and stays;
/// - the owner's node killed, partitioned or leaving: `node_down`, at once;
/// - cancelling the waiting task cancels the wait on the owner (nothing is taken), withdrawn
///   before the task's end is reported.
/// Cross-node delivery is at most once in one case: the owner took the value for a
/// `receive` and its answer was lost because the receiver's node went away meanwhile.
template <class T = nlohmann::json>
class remote_channel {
 public:
  remote_channel() = default;
  remote_channel(caf::actor queue, std::string name, std::string node, bool mailbox = false)
      : queue_(std::move(queue)), name_(std::move(name)), node_(std::move(node)),
        mailbox_(mailbox) {}

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// The node that owns the queue.
  [[nodiscard]] const std::string& node() const noexcept { return node_; }
  [[nodiscard]] const caf::actor& actor() const noexcept { return queue_; }
  /// Whether it is a mailbox (shared with `share_mailbox`).
  [[nodiscard]] bool is_mailbox() const noexcept { return mailbox_; }
  [[nodiscard]] explicit operator bool() const noexcept { return static_cast<bool>(queue_); }

  /// `co_await` yields `caf::expected<void>`.
  [[nodiscard]] auto send(context& cx, T value) const {
    return detail::remote_send<T>(cx, queue_, node_, mailbox_, std::move(value));
  }
  /// `co_await` yields `caf::expected<T>` (`wrong_type` naming `value` when the JSON does
  /// not convert to `T`: that value has been taken).
  [[nodiscard]] auto receive(context& cx) const {
    return detail::remote_receive<T>(cx, queue_, node_, mailbox_);
  }
  /// `co_await` yields `caf::expected<std::optional<T>>`.
  [[nodiscard]] auto try_receive(context& cx) const {
    return detail::remote_try_receive<T>(cx, queue_, node_);
  }
  /// `co_await` yields `caf::expected<bool>` (false: closed already).
  [[nodiscard]] auto close(context& cx) const {
    return spawn_on<bool>(cx, node_, detail::queue_close_body, queue_);
  }
  /// `co_await` yields `caf::expected<queue_metrics>`.
  [[nodiscard]] auto metrics(context& cx) const {
    return spawn_on<queue_metrics>(cx, node_, detail::queue_metrics_body, queue_);
  }

 private:
  caf::actor queue_;
  std::string name_;
  std::string node_;
  bool mailbox_ = false;
};

/// Shares a channel of JSON values with the cluster under `name` (a cluster name,
/// `register_global` rules: the name goes when the channel ends or its node goes down or
/// leaves). `co_await` yields `caf::expected<bool>` (false: shared so already); errors:
/// `name_taken`, `invalid_name`, `cluster_unavailable`.
[[nodiscard]] inline auto share_channel(context& cx, const channel<nlohmann::json>& ch,
                                        std::string name) {
  return detail::share_queue(cx, ch.actor(), std::move(name), false);
}

/// Shares a mailbox under `name` (see `share_channel`; a mailbox and a channel may share
/// one name). Its JSON mail can be received from other nodes; other mail stays for local
/// receivers (`wrong_type` remotely).
[[nodiscard]] inline auto share_mailbox(context& cx, const mailbox& mb, std::string name) {
  return detail::share_queue(cx, mb.actor(), std::move(name), true);
}

/// Opens the channel shared as `name` from any node. `co_await` yields
/// `caf::expected<remote_channel<T>>`; `unknown_name` when no member shares one so,
/// `cluster_unavailable` on a runtime that is not a cluster node.
template <class T = nlohmann::json>
[[nodiscard]] task<caf::expected<remote_channel<T>>> open_remote_channel(context& cx, std::string name) {
  auto at = co_await detail::find_queue(cx, name, false);
  if (!at) co_return std::move(at.error());
  co_return remote_channel<T>{std::move(at->queue), std::move(name), std::move(at->node), false};
}

/// Opens the mailbox shared as `name` (its JSON mail). A closed one answers
/// `mailbox_closed` to receives once drained, and to sends (where a local `mailbox_send`
/// answers false).
[[nodiscard]] task<caf::expected<remote_channel<nlohmann::json>>>
open_remote_mailbox(context& cx, std::string name);

} // namespace troupe
