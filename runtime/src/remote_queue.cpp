#include "troupe/runtime/remote_queue.hpp"

#include <chrono>
#include <vector>

#include "troupe/actors/detail/task_actor.hpp"
#include "troupe/runtime/cluster.hpp"

namespace troupe::detail {

namespace {

using json = nlohmann::json;

/// The owner's end of a remote operation: a channel of JSON values over the shared queue
/// (a mailbox's queue too: its JSON mail is the same boxed value). One value per receive:
/// nothing is taken beyond what the remote caller asked for.
channel<json> local_view(caf::actor q) {
  return channel<json>{std::move(q), "shared", 1, 1};
}

/// A run serving another node waits for that node's tasks, which this node's deadlock
/// detector cannot see: its waits count as bounded (the caller bounds or cancels them).
void waits_on_others(context& cx) {
  access::impl(cx)->deadline(clock::time_point::max());
}

/// Takes the head value as JSON (a mailbox's typed mail is `wrong_type` and stays): with
/// `wait`, nothing means closed and drained; without, empty or closed.
struct json_take_awaiter : queue_recv_awaiter {
  using queue_recv_awaiter::queue_recv_awaiter;
  caf::expected<std::optional<json>> await_resume() {
    auto r = take();
    if (!r) return std::move(r.error());
    if (!*r) return std::optional<json>{};
    return std::optional<json>{unbox_value<json>(**r)};
  }
};

json_take_awaiter take_json(context& cx, const caf::actor& q, bool wait) {
  return json_take_awaiter{access::impl(cx), q, 1, type_key<json>(), wait};
}

/// Registers `f` as the body `name`.
template <class F>
void add_body(body_registry& reg, const char* name, F f) {
  reg.add(name, make_remote_body(std::move(f), name));
}

caf::error not_a_queue() {
  return make_error(errc::invalid_argument, "queue", "no queue was named");
}

} // namespace

void add_queue_bodies(body_registry& reg) {
  add_body(reg, queue_send_body,
          [](context& cx, caf::actor q, json v) -> task<caf::expected<bool>> {
            if (!q) co_return not_a_queue();
            waits_on_others(cx);
            auto r = co_await local_view(std::move(q)).send(cx, std::move(v));
            if (!r) co_return std::move(r.error());
            co_return true;
          });
  add_body(reg, queue_receive_body,
          [](context& cx, caf::actor q) -> task<caf::expected<json>> {
            if (!q) co_return not_a_queue();
            waits_on_others(cx);
            auto r = co_await take_json(cx, q, true);
            if (!r) co_return std::move(r.error());
            if (!*r) co_return make_error(errc::channel_closed, "channel", "closed and drained");
            co_return std::move(**r);
          });
  add_body(reg, queue_try_receive_body,
          [](context& cx, caf::actor q) -> task<caf::expected<json>> {
            if (!q) co_return not_a_queue();
            auto r = co_await take_json(cx, q, false);
            if (!r) {
              if (is(r.error(), errc::channel_closed) || is(r.error(), errc::mailbox_closed))
                co_return json::array(); // nothing, as a local try_receive
              co_return std::move(r.error());
            }
            json out = json::array();
            if (*r) out.push_back(std::move(**r));
            co_return out;
          });
  add_body(reg, queue_close_body,
          [](context& cx, caf::actor q) -> task<caf::expected<bool>> {
            if (!q) co_return not_a_queue();
            co_return co_await local_view(std::move(q)).close(cx);
          });
  add_body(reg, queue_metrics_body,
          [](context& cx, caf::actor q) -> task<caf::expected<queue_metrics>> {
            if (!q) co_return not_a_queue();
            co_return co_await local_view(std::move(q)).metrics(cx);
          });
}

task<caf::expected<bool>> share_queue(context& cx, caf::actor queue, std::string name,
                                      bool mailbox) {
  if (!queue) co_return make_error(errc::invalid_argument, "queue", "the queue handle is empty");
  co_return co_await register_global(
      cx, mailbox ? shared_mailbox_name(name) : shared_channel_name(name), std::move(queue));
}

task<caf::expected<queue_location>> find_queue(context& cx, std::string name, bool mailbox) {
  auto names = co_await global_names(cx);
  if (!names) co_return std::move(names.error());
  auto key = mailbox ? shared_mailbox_name(name) : shared_channel_name(name);
  for (auto& n : *names)
    if (n.name == key && n.actor) co_return queue_location{std::move(n.actor), std::move(n.node)};
  co_return make_error(errc::unknown_name, "name",
                       std::string{"no member shares a "} + (mailbox ? "mailbox" : "channel") +
                           " named \"" + name + "\"");
}

} // namespace troupe::detail

namespace troupe {

task<caf::expected<remote_channel<nlohmann::json>>> open_remote_mailbox(context& cx,
                                                                         std::string name) {
  auto at = co_await detail::find_queue(cx, name, true);
  if (!at) co_return std::move(at.error());
  co_return remote_channel<nlohmann::json>{std::move(at->queue), std::move(name),
                                           std::move(at->node), true};
}

} // namespace troupe
