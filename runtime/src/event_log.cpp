#include "troupe/runtime/event_log.hpp"

#include <caf/all.hpp>

#include "troupe/messages/errc.hpp"
#include "troupe/persistence/storage.hpp"

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<troupe::event_record>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<troupe::event_receipt>)

namespace troupe {

namespace {

using namespace troupe::atoms;

caf::expected<caf::actor> storage_of(context& cx) {
  auto& env = cx.impl()->env();
  if (!env.storage)
    return make_error(errc::storage_unavailable, "storage", "this runtime has no storage");
  return env.storage();
}

caf::error check_payload(const nlohmann::json& payload) {
  if (!payload.is_object())
    return make_error(errc::invalid_payload, "payload",
                      std::string{"an event payload is a JSON object, got "} + payload.type_name());
  return {};
}

/// Keeps up to `window` appends in flight from one task, sent in chunks of up to 64 per
/// message (each append still acknowledged only after its own commit), and resumes once all
/// are answered.
class append_window_awaiter : public detail::parked_awaiter {
 public:
  append_window_awaiter(detail::task_actor* self, caf::actor storage, std::string topic,
                        std::vector<std::string> texts, size_t window)
      : parked_awaiter(self), storage_(std::move(storage)), topic_(std::move(topic)),
        texts_(std::move(texts)), window_(std::max<size_t>(window, 1)), receipts_(texts_.size()) {}

  bool await_ready() noexcept { return check_cancelled() || texts_.empty(); }

  void await_suspend(std::coroutine_handle<> h) {
    seq_ = park(h);
    while (in_flight_ < window_ && next_ < texts_.size())
      send_next();
  }

  caf::expected<std::vector<event_receipt>> await_resume() {
    rethrow_if_cancelled();
    if (err_) return std::move(err_);
    return std::move(receipts_);
  }

 private:
  static constexpr size_t chunk = 64;

  void send_next() {
    auto first = next_;
    auto n = std::min({chunk, texts_.size() - next_, window_ - in_flight_});
    next_ += n;
    in_flight_ += n;
    std::vector<std::string> part{std::make_move_iterator(texts_.begin() + first),
                                  std::make_move_iterator(texts_.begin() + first + n)};
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
    while (!err_ && next_ < texts_.size() && in_flight_ < window_) // a failure stops new ones
      send_next();
    if (in_flight_ == 0) self_->resume_parked();
  }

  caf::actor storage_;
  std::string topic_;
  std::vector<std::string> texts_;
  size_t window_;
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
  auto s = storage_of(cx);
  if (!s) co_return std::move(s.error());
  co_return co_await cx.request<event_receipt>(*s, st_append_atom::value, std::move(topic),
                                               std::move(text));
}

task<caf::expected<std::vector<event_receipt>>>
event_append_all(context& cx, std::string topic, std::vector<nlohmann::json> payloads,
                 size_t window) {
  if (auto err = check_topic(topic)) co_return err;
  std::vector<std::string> texts;
  texts.reserve(payloads.size());
  for (size_t i = 0; i < payloads.size(); ++i) {
    if (!payloads[i].is_object())
      co_return make_error(errc::invalid_payload, "payloads[" + std::to_string(i) + "]",
                           std::string{"an event payload is a JSON object, got "} +
                               payloads[i].type_name());
    try {
      texts.push_back(payloads[i].dump());
    } catch (const nlohmann::json::exception& e) {
      co_return make_error(errc::invalid_payload, "payloads[" + std::to_string(i) + "]", e.what());
    }
  }
  auto s = storage_of(cx);
  if (!s) co_return std::move(s.error());
  co_return co_await append_window_awaiter{cx.impl(), *s, std::move(topic), std::move(texts),
                                           window};
}

task<caf::expected<std::vector<event_record>>> event_read(context& cx, std::string topic,
                                                          int64_t after_cursor, int64_t limit) {
  if (auto err = check_topic(topic)) co_return err;
  auto s = storage_of(cx);
  if (!s) co_return std::move(s.error());
  co_return co_await cx.request<std::vector<event_record>>(*s, st_read_atom::value,
                                                           std::move(topic), after_cursor, limit);
}

task<caf::expected<storage_metrics>> storage_metrics_of(context& cx) {
  auto s = storage_of(cx);
  if (!s) co_return std::move(s.error());
  co_return co_await cx.request<storage_metrics>(*s, st_metrics_atom::value);
}

} // namespace troupe
