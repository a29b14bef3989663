#include "troupe/durable/event_log.hpp"

#include <caf/all.hpp>

#include "services.hpp"
#include "text.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/storage.hpp"


namespace troupe {

namespace {

using namespace troupe::atoms;

caf::error check_payload(const nlohmann::json& payload) {
  if (!payload.is_object())
    return make_error(errc::invalid_payload, "payload",
                      std::string{"an event payload is a JSON object, got "} + payload.type_name());
  return {};
}

/// Keeps up to `window` appends in flight from one task, sent in chunks of up to 64 per
/// message (each append still acknowledged only after its own commit; a chunk's payloads
/// travel in one buffer), and resumes once all are answered. A chunk is serialised when it
/// is sent, so the storage starts writing while later chunks are still JSON.
class append_window_awaiter : public detail::parked_awaiter {
 public:
  append_window_awaiter(detail::task_actor* self, storage_actor_type storage, std::string topic,
                        std::vector<nlohmann::json> payloads, size_t window)
      : parked_awaiter(self), storage_(std::move(storage)), topic_(std::move(topic)),
        payloads_(std::move(payloads)), window_(std::max<size_t>(window, 1)),
        per_chunk_(std::min<size_t>(64, window_)), receipts_(payloads_.size()) {}

  bool await_ready() noexcept {
    if (check_cancelled() || payloads_.empty()) return true;
    // The first chunk is serialised here: a payload it cannot serialise ends the await
    // before anything is sent.
    return !make_chunk(ready_);
  }

  void await_suspend(std::coroutine_handle<> h) {
    seq_ = park(h);
    send_more();
  }

  caf::expected<std::vector<event_receipt>> await_resume() {
    rethrow_if_cancelled();
    if (err_) return std::move(err_);
    return std::move(receipts_);
  }

 private:
  void send_more() {
    // A failure stops new chunks; a chunk goes when it fits the window.
    while (!err_ && next_ < payloads_.size() && in_flight_ + chunk_size() <= window_)
      send_next();
  }

  size_t chunk_size() const noexcept { return std::min(per_chunk_, payloads_.size() - next_); }

  /// Serialises the next chunk into `part`; false (and `err_` set) when a payload cannot be.
  bool make_chunk(payload_batch& part) noexcept {
    auto first = next_;
    auto n = chunk_size();
    size_t i = 0;
    try {
      for (; i < n; ++i) {
        auto text = payloads_[first + i].dump();
        if (i == 0) part.reserve(n, n * (text.size() + 8));
        part.push_back(text);
      }
    } catch (const std::exception& e) { // a string that is not UTF-8 (or out of memory)
      err_ = make_error(errc::invalid_payload, "payloads[" + std::to_string(first + i) + "]",
                        e.what());
      return false;
    }
    for (i = 0; i < n; ++i)
      payloads_[first + i] = nullptr; // serialised: its memory goes now
    return true;
  }

  void send_next() {
    auto first = next_;
    auto n = chunk_size();
    payload_batch part;
    if (!ready_.empty())
      part = std::move(ready_);
    else if (!make_chunk(part))
      return;
    ready_ = payload_batch{};
    next_ += n;
    in_flight_ += n;
    auto st = self_;
    auto seq = seq_;
    self_->request(storage_, caf::infinite, st_append_many_atom::value, topic_, std::move(part))
        .then(
            [st, seq, first, n](std::vector<event_receipt>& rs) {
              if (!st->is_parked(seq)) return;
              auto me = static_cast<append_window_awaiter*>(st->parked());
              std::copy(rs.begin(), rs.end(), me->receipts_.begin() + first);
              me->answered(n);
            },
            [st, seq, n](caf::error& e) {
              if (!st->is_parked(seq)) return;
              auto me = static_cast<append_window_awaiter*>(st->parked());
              if (!me->err_) me->err_ = std::move(e);
              me->answered(n);
            });
  }

  void answered(size_t n) {
    in_flight_ -= n;
    send_more();
    if (in_flight_ == 0) self_->resume_parked();
  }

  storage_actor_type storage_;
  std::string topic_;
  std::vector<nlohmann::json> payloads_;
  payload_batch ready_; // the first chunk, serialised in await_ready
  size_t window_;
  size_t per_chunk_;
  std::vector<event_receipt> receipts_;
  size_t next_ = 0;
  size_t in_flight_ = 0;
  uint64_t seq_ = 0;
  caf::error err_;
};

} // namespace

task<caf::expected<event_receipt>> event_append(context& cx, std::string topic,
                                                nlohmann::json payload) {
  if (auto err = check_payload(payload)) co_return err;
  if (auto err = check_topic(topic)) co_return err;
  std::string text;
  try {
    text = payload.dump();
  } catch (const nlohmann::json::exception& e) { // a string that is not UTF-8
    co_return make_error(errc::invalid_payload, "payload", e.what());
  }
  auto s = co_await detail::find_storage(cx);
  if (!s) co_return std::move(s.error());
  co_return co_await cx.request<event_receipt>(*s, st_append_atom::value, std::move(topic),
                                               std::move(text));
}

task<caf::expected<std::vector<event_receipt>>>
event_append_all(context& cx, std::string topic, std::vector<nlohmann::json> payloads,
                 size_t window) {
  if (auto err = check_topic(topic)) co_return err;
  // Every payload is checked before anything is sent (chunks are serialised as they go):
  // a bad one is refused with nothing written.
  for (size_t i = 0; i < payloads.size(); ++i) {
    if (!payloads[i].is_object())
      co_return make_error(errc::invalid_payload, "payloads[" + std::to_string(i) + "]",
                           std::string{"an event payload is a JSON object, got "} +
                               payloads[i].type_name());
    if (!detail::json_utf8(payloads[i]))
      co_return make_error(errc::invalid_payload, "payloads[" + std::to_string(i) + "]",
                           "a string in the payload is not valid UTF-8");
  }
  auto s = co_await detail::find_storage(cx);
  if (!s) co_return std::move(s.error());
  co_return co_await append_window_awaiter{detail::access::impl(cx), *s, std::move(topic), std::move(payloads),
                                           window};
}

task<caf::expected<std::vector<event_record>>> event_read(context& cx, std::string topic,
                                                          int64_t after_cursor, int64_t limit) {
  if (auto err = check_topic(topic)) co_return err;
  auto s = co_await detail::find_storage(cx);
  if (!s) co_return std::move(s.error());
  co_return co_await cx.request<std::vector<event_record>>(*s, st_read_atom::value,
                                                           std::move(topic), after_cursor, limit);
}

task<caf::expected<bool>> event_subscribe(context& cx, std::string topic, int64_t from_cursor,
                                          caf::actor subscriber) {
  if (auto err = check_topic(topic)) co_return err;
  if (!subscriber)
    co_return make_error(errc::invalid_argument, "subscriber", "a subscription needs an actor");
  auto s = co_await detail::find_storage(cx);
  if (!s) co_return std::move(s.error());
  co_return co_await cx.request<bool>(*s, st_subscribe_atom::value, std::move(topic), from_cursor,
                                      std::move(subscriber));
}

task<caf::expected<bool>> event_unsubscribe(context& cx, std::string topic, caf::actor subscriber) {
  auto s = co_await detail::find_storage(cx);
  if (!s) co_return std::move(s.error());
  co_return co_await cx.request<bool>(*s, st_unsubscribe_atom::value, std::move(topic),
                                      std::move(subscriber));
}

task<caf::expected<storage_metrics>> storage_metrics_of(context& cx) {
  auto s = co_await detail::find_storage(cx);
  if (!s) co_return std::move(s.error());
  co_return co_await cx.request<storage_metrics>(*s, st_metrics_atom::value);
}

} // namespace troupe
