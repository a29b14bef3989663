#include "troupe/durable/pool_triggers.hpp"

#include <deque>

#include <caf/all.hpp>

#include "troupe/actors/pool.hpp"
#include "troupe/durable/channels.hpp"
#include "troupe/messages/directory.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/messaging.hpp"
#include "troupe/messages/storage.hpp"

namespace troupe {

namespace {

using namespace troupe::atoms;

/// The job of one event: the factory's body with the event it was made for.
struct trigger_job {
  std::function<task<void>(context&, const channel_event&)> factory;
  channel_event event;
  task<void> operator()(context& cx) { return factory(cx, event); }
};

/// Receives a binding's matches and submits one job per event to the named pool; an event
/// the pool cannot take (no such pool, an error answer) goes to the dead-letter topic.
class pool_dispatcher final : public caf::event_based_actor {
 public:
  pool_dispatcher(caf::actor_config& cfg, caf::actor registry, std::string session,
                  spawn_to_pool target)
      : caf::event_based_actor(cfg), registry_(std::move(registry)),
        session_(std::move(session)), target_(std::move(target)) {}

  const char* name() const override { return "troupe.pool_dispatcher"; }

  caf::behavior make_behavior() override {
    return {
        [this](ch_trigger_atom, channel_match& m) {
          for (auto& e : m.events)
            backlog_.push_back(std::move(e));
          pump();
        },
    };
  }

 private:
  /// Submits the backlog in order; looks the pool up first when it is not known.
  void pump() {
    if (resolving_) return;
    if (!pool_) {
      if (backlog_.empty()) return;
      resolving_ = true;
      primitive_spec ps;
      ps.kind = primitive_kind::pool;
      ps.key = "pool|session|" + session_ + "|" + target_.pool;
      ps.name = target_.pool;
      ps.create = false;
      request(registry_, caf::infinite, reg_open_atom::value, std::move(ps))
          .then(
              [this](caf::actor& a) {
                resolving_ = false;
                pool_ = std::move(a);
                pump();
              },
              [this](caf::error& err) {
                resolving_ = false;
                auto why = is(err, errc::not_found)
                               ? make_error(errc::unknown_pool, "pool",
                                            "no pool \"" + target_.pool + "\" is open")
                               : err;
                while (!backlog_.empty()) { // every event waiting goes to the dead letters
                  dead_letter(backlog_.front(), why);
                  backlog_.pop_front();
                }
              });
      return;
    }
    while (!backlog_.empty()) {
      auto ev = std::move(backlog_.front());
      backlog_.pop_front();
      submit(std::move(ev));
    }
  }

  void submit(channel_event ev) {
    auto payload = nlohmann::json::parse(ev.payload, nullptr, false);
    pool_submission sub;
    sub.priority = priority_from_json(target_.priority_from.empty()
                                          ? nullptr
                                          : json_at(payload, target_.priority_from));
    if (!target_.key_from.empty())
      if (auto* k = json_at(payload, target_.key_from)) {
        if (k->is_string()) {
          sub.key = k->get<std::string>();
          sub.has_key = true;
        } else if (k->is_number()) {
          sub.key = k->dump();
          sub.has_key = true;
        }
      }
    sub.body = std::make_shared<detail::pool_body_impl<trigger_job>>(
        trigger_job{target_.task_factory, ev});
    request(pool_, caf::infinite, pool_submit_atom::value, std::move(sub), false)
        .then([](pool_ack&) {}, // accepted, or rejected by a policy (the pool audits it)
              [this, ev](caf::error& err) {
                if (err == caf::sec::request_receiver_down) pool_ = nullptr; // look up again
                dead_letter(ev, err);
              });
  }

  void dead_letter(const channel_event& ev, const caf::error& err) {
    ++dead_letters_;
    nlohmann::json rec{{"pool", target_.pool},
                       {"error", render(err)},
                       {"event",
                        {{"name", ev.receipt.name_resolved},
                         {"event_id", ev.receipt.event_id},
                         {"id", ev.id},
                         {"payload", nlohmann::json::parse(ev.payload, nullptr, false)}}}};
    auto text = rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    auto append = [this, text](caf::actor st) {
      if (!st) return;
      storage_ = st;
      request(st, caf::infinite, st_append_atom::value, target_.dead_letter_topic, text)
          .then([](const event_receipt&) {}, [](caf::error&) {});
    };
    if (storage_) {
      append(storage_);
      return;
    }
    request(registry_, caf::infinite, dir_find_atom::value, runtime_service::storage,
            std::string{}, true)
        .then([append](caf::actor& st) { append(st); }, [](caf::error&) {});
  }

  caf::actor registry_;
  std::string session_;
  spawn_to_pool target_;
  caf::actor pool_;
  caf::actor storage_;
  std::deque<channel_event> backlog_;
  bool resolving_ = false;
  uint64_t dead_letters_ = 0;
};

} // namespace

const nlohmann::json* json_at(const nlohmann::json& payload, const std::string& path) {
  if (path.empty()) return &payload;
  if (path.front() == '/') {
    try {
      auto ptr = nlohmann::json::json_pointer{path};
      return payload.contains(ptr) ? &payload.at(ptr) : nullptr;
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  std::string_view rest{path};
  if (rest.rfind("$.", 0) == 0) rest.remove_prefix(2);
  const nlohmann::json* at = &payload;
  while (!rest.empty()) {
    auto dot = rest.find('.');
    auto part = rest.substr(0, dot);
    if (!at->is_object()) return nullptr;
    auto i = at->find(std::string{part});
    if (i == at->end()) return nullptr;
    at = &*i;
    rest = dot == std::string_view::npos ? std::string_view{} : rest.substr(dot + 1);
  }
  return at;
}

int64_t priority_from_json(const nlohmann::json* value) noexcept {
  if (value == nullptr) return 0;
  if (value->is_number_integer()) return value->get<int64_t>();
  if (value->is_string()) {
    const auto& s = value->get_ref<const std::string&>();
    try {
      size_t used = 0;
      auto n = std::stoll(s, &used);
      if (used == s.size()) return n;
    } catch (...) {
    }
  }
  return 0;
}

task<caf::expected<uint64_t>> durable_bind_to_pool(context& cx, nlohmann::json binding,
                                                   spawn_to_pool target) {
  if (target.pool.empty())
    co_return make_error(errc::invalid_binding, "pool", "spawn_to_pool needs a pool name");
  if (!target.task_factory)
    co_return make_error(errc::invalid_binding, "task_factory",
                         "spawn_to_pool needs a task factory");
  if (auto err = check_topic(target.dead_letter_topic))
    co_return make_error(errc::invalid_binding, "dead_letter_topic", render(err));
  auto& env = detail::access::impl(cx)->env();
  auto dispatcher = cx.self()->home_system().spawn<pool_dispatcher>(
      env.registry, env.session_id, std::move(target));
  auto id = co_await durable_bind(cx, std::move(binding), dispatcher);
  if (!id) caf::anon_send_exit(dispatcher, caf::exit_reason::user_shutdown);
  co_return id;
}

} // namespace troupe
