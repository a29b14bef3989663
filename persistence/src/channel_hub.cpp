#include "troupe/persistence/channel_hub.hpp"

#include <deque>
#include <map>
#include <unordered_map>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "signing.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/interfaces.hpp"
#include "troupe/messages/storage.hpp"

namespace troupe {

namespace {

using namespace troupe::atoms;

/// The hub: session channels in memory, durable ones through the storage actor, and the
/// trigger bindings. Every append is dispatched after it is committed (durable) or recorded
/// (session), in the order the receipts come, once: a duplicate is not dispatched again.
class channel_hub final : public channel_hub_type::base {
 public:
  channel_hub(caf::actor_config& cfg, channel_hub_config hc)
      : channel_hub_type::base(cfg), cfg_(std::move(hc)), remote_(cfg_.signing_key.empty()) {
    // In front of another node's storage: session receipts get a key of this hub's own.
    if (remote_) cfg_.signing_key = detail::new_signing_key();
  }

  /// Whether the storage is another node's (its key stays there: durable receipts are
  /// verified by asking it).
  [[nodiscard]] bool remote_storage() const noexcept { return remote_; }

  const char* name() const override { return "troupe.channel_hub"; }

  /// The storage actor, through its interface (requests to it are checked at compile time).
  [[nodiscard]] storage_actor_type storage() const {
    return caf::actor_cast<storage_actor_type>(cfg_.storage);
  }

  behavior_type make_behavior() override {
    set_down_handler([this](caf::down_msg& dm) {
      for (auto i = bindings_.begin(); i != bindings_.end();)
        if (i->second.spec.handler.address() == dm.source) {
          drop_timers(i->second);
          i = bindings_.erase(i);
        } else {
          ++i;
        }
    });
    return {
        [this](ch_append_atom, channel_write& a) -> caf::result<channel_receipt> {
          if (a.scope == "session") return append_session(std::move(a));
          auto rp = make_response_promise<channel_receipt>();
          // The payload stays here until the commit: a binding made meanwhile gets it too.
          auto seq = ++next_seq_;
          in_flight_.emplace(seq, rp);
          std::string id = a.id;
          std::string payload = a.payload;
          request(storage(), caf::infinite, st_chan_append_atom::value, std::move(a))
              .then(
                  [this, rp, seq, id = std::move(id),
                   payload = std::move(payload)](channel_receipt& r) mutable {
                    count(r);
                    if (!r.duplicate) dispatch(channel_event{r, std::move(id), std::move(payload)});
                    rp.deliver(std::move(r));
                    settled(seq);
                  },
                  [this, rp, seq](caf::error& err) mutable {
                    rp.deliver(std::move(err));
                    settled(seq);
                  });
          return rp;
        },
        [this](ch_events_atom, const std::string& name, const std::string& scope, int64_t after,
               int64_t limit) -> caf::result<std::vector<channel_event>> {
          if (limit <= 0) return make_error(errc::invalid_argument, "limit", "must be at least 1");
          if (scope == "session") {
            std::vector<channel_event> out;
            if (auto i = session_.find(name); i != session_.end()) {
              auto& evs = i->second.events;
              auto it = std::upper_bound(
                  evs.begin(), evs.end(), after,
                  [](int64_t x, const channel_event& e) { return x < e.receipt.event_id; });
              for (; it != evs.end() && static_cast<int64_t>(out.size()) < limit; ++it)
                out.push_back(*it);
            }
            return out;
          }
          auto rp = make_response_promise<std::vector<channel_event>>();
          request(storage(), caf::infinite, st_chan_read_atom::value, name, after, limit)
              .then([rp](std::vector<channel_event>& xs) mutable { rp.deliver(std::move(xs)); },
                    [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
          return rp;
        },
        [this](ch_verify_atom, const channel_receipt& r) -> caf::result<bool> {
          if (!remote_storage() || r.emitted_at.scope == "session")
            return detail::verify_receipt(cfg_.signing_key, r);
          // The key of a durable receipt stays on the node that owns the database.
          auto rp = make_response_promise<bool>();
          request(storage(), caf::infinite, st_chan_verify_atom::value, r)
              .then([rp](bool ok) mutable { rp.deliver(ok); },
                    [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
          return rp;
        },
        [this](ch_bind_atom, channel_binding& b) -> caf::result<uint64_t> {
          if (auto err = check_binding(b)) return err;
          auto id = ++next_binding_;
          monitor(b.handler);
          bindings_.emplace(id, binding_state{std::move(b), {}});
          return id;
        },
        [this](ch_unbind_atom, uint64_t id) {
          auto i = bindings_.find(id);
          if (i == bindings_.end()) return false;
          drop_timers(i->second);
          bindings_.erase(i);
          return true;
        },
        [this](ch_flush_atom) -> caf::result<uint64_t> {
          auto rp = make_response_promise<uint64_t>();
          if (in_flight_.empty())
            rp.deliver(flush());
          else // waits for the appends sent before it, not for later ones
            flush_waiters_.emplace_back(next_seq_, rp);
          return rp;
        },
        [this](ch_window_atom, uint64_t binding, const std::string& key, uint64_t gen) {
          auto b = bindings_.find(binding);
          if (b == bindings_.end()) return;
          auto p = b->second.parts.find(key);
          if (p == b->second.parts.end() || p->second.generation != gen) return;
          p->second.timer = 0;
          expire(b->first, b->second, p, "window");
        },
        [this](ch_storage_atom, caf::actor& st) { cfg_.storage = std::move(st); },
        [this](ch_metrics_atom) {
          auto m = metrics_;
          m.bindings = bindings_.size();
          m.buffered = 0;
          for (auto& kvp : bindings_)
            for (auto& part : kvp.second.parts)
              m.buffered += part.second.events.size();
          return m;
        },
    };
  }

  void on_exit() override {
    // Nobody is left waiting: appends still in flight and flushes get an error.
    auto err = make_error(errc::runtime_stopped, "channels", "the channel hub stopped");
    for (auto& kvp : in_flight_)
      if (kvp.second.pending()) kvp.second.deliver(err);
    in_flight_.clear();
    for (auto& w : flush_waiters_)
      w.second.deliver(err);
    flush_waiters_.clear();
    for (auto& kvp : bindings_)
      drop_timers(kvp.second);
    bindings_.clear();
    session_.clear();
    cfg_.storage = nullptr;
  }

 private:
  struct partition {
    std::deque<channel_event> events;
    uint64_t generation = 0;
    clock::timer_id timer = 0;
  };

  struct binding_state {
    channel_binding spec;
    std::map<std::string, partition> parts;
  };

  /// A session channel: its newest events (at most `session_capacity`) and the ids of
  /// those, each to its event id.
  struct session_channel {
    std::deque<channel_event> events;
    std::unordered_map<std::string, int64_t> by_id;
  };

  int64_t now_ms() const {
    if (cfg_.clock != nullptr && cfg_.clock->is_virtual()) return cfg_.clock->now_ms();
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  void count(const channel_receipt& r) {
    ++metrics_.appends;
    if (r.duplicate) ++metrics_.duplicates;
  }

  /// Session events live here only; their receipts are signed like durable ones, and the
  /// audit row still goes to the event log.
  channel_receipt append_session(channel_write a) {
    auto& ch = session_[a.name_resolved];
    if (!a.id.empty())
      if (auto i = ch.by_id.find(a.id); i != ch.by_id.end()) {
        // the events are in id order: the original is found by its event id
        auto it = std::lower_bound(
            ch.events.begin(), ch.events.end(), i->second,
            [](const channel_event& e, int64_t x) { return e.receipt.event_id < x; });
        auto r = it->receipt;
        r.duplicate = true;
        count(r);
        audit_append(r);
        return r;
      }
    channel_event e;
    e.receipt.event_id = ++session_seq_;
    e.receipt.name_resolved = a.name_resolved;
    e.receipt.emitted_at = emitted_at{now_ms(), a.scope, a.scope_id, a.emitted_by, {}};
    e.receipt.emitted_at.sig = detail::sign_receipt(cfg_.signing_key, e.receipt);
    e.id = std::move(a.id);
    e.payload = std::move(a.payload);
    if (!e.id.empty()) ch.by_id.emplace(e.id, e.receipt.event_id);
    ch.events.push_back(e);
    if (ch.events.size() > cfg_.session_capacity) { // memory only: the oldest go
      if (!ch.events.front().id.empty()) ch.by_id.erase(ch.events.front().id);
      ch.events.pop_front();
      ++metrics_.session_evicted;
    }
    auto r = e.receipt;
    count(r);
    audit_append(r);
    dispatch(std::move(e));
    return r;
  }

  void audit(const char* topic, nlohmann::json row) {
    // Names are checked UTF-8; replacing stays a safety net (a throw would end the hub).
    auto text = row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    request(storage(), caf::infinite, st_append_atom::value, std::string{topic}, std::move(text))
        .then([](event_receipt&) {}, [this](caf::error&) { ++metrics_.audit_failures; });
  }

  void audit_append(const channel_receipt& r) {
    nlohmann::json row = r;
    row["kind"] = "append";
    audit(channel_audit_topic, std::move(row));
  }

  static bool matches(const channel_binding& b, const channel_receipt& r) {
    auto& em = r.emitted_at;
    if (b.scope != em.scope || b.scope_id != em.scope_id) return false;
    auto skip = em.scope.size() + em.scope_id.size() + 2;
    if (r.name_resolved.size() < skip) return false;
    std::string_view local{r.name_resolved};
    local.remove_prefix(skip);
    if (b.prefix) return local.substr(0, b.pattern.size()) == b.pattern;
    return local == b.pattern;
  }

  static std::string partition_key(const channel_binding& b, const std::string& payload) {
    if (b.key.empty()) return {};
    auto j = nlohmann::json::parse(payload, nullptr, false);
    if (!j.is_object()) return {};
    auto i = j.find(b.key);
    if (i == j.end()) return {};
    return i->is_string() ? i->get<std::string>() : i->dump();
  }

  void dispatch(channel_event e) {
    for (auto& [id, st] : bindings_) {
      auto& b = st.spec;
      if (!matches(b, e.receipt)) continue;
      if (b.count == 0 && b.window_ms == 0) {
        std::vector<channel_event> one{e};
        fire(id, b, {}, "append", std::move(one));
        continue;
      }
      auto key = partition_key(b, e.payload);
      auto& part = st.parts[key];
      if (part.events.empty()) part.generation = ++next_generation_; // a stale timer misses
      part.events.push_back(e);
      if (static_cast<int64_t>(part.events.size()) > b.max_buffer) {
        auto old = std::move(part.events.front());
        part.events.pop_front();
        ++metrics_.dropped;
        audit(channel_warning_topic, {{"kind", "buffer_overflow"},
                                      {"binding", id},
                                      {"selector", b.selector},
                                      {"key", key},
                                      {"dropped_event_id", old.receipt.event_id},
                                      {"max_buffer", b.max_buffer}});
      }
      if (b.count > 0 && static_cast<int64_t>(part.events.size()) >= b.count) {
        auto p = st.parts.find(key);
        release(id, st, p, "count", true);
        continue;
      }
      if (b.window_ms > 0 && part.timer == 0 && cfg_.clock != nullptr)
        part.timer = cfg_.clock->schedule(
            cfg_.clock->now() + std::chrono::milliseconds{b.window_ms},
            caf::actor_cast<caf::actor>(this),
            caf::make_message(ch_window_atom::value, id, key, part.generation));
    }
  }

  /// Empties a partition, firing its events (or discarding them).
  void release(uint64_t id, binding_state& st, std::map<std::string, partition>::iterator p,
               const char* reason, bool fire_it) {
    auto events = std::move(p->second.events);
    if (p->second.timer != 0) cfg_.clock->cancel(p->second.timer);
    auto key = p->first;
    st.parts.erase(p);
    if (events.empty()) return;
    if (fire_it) {
      fire(id, st.spec, std::move(key), reason,
           std::vector<channel_event>(std::make_move_iterator(events.begin()),
                                      std::make_move_iterator(events.end())));
    } else {
      metrics_.discarded += events.size();
    }
  }

  void expire(uint64_t id, binding_state& st, std::map<std::string, partition>::iterator p,
              const char* reason) {
    release(id, st, p, reason, st.spec.fire_partial);
  }

  void fire(uint64_t id, const channel_binding& b, std::string key, const char* reason,
            std::vector<channel_event> events) {
    channel_match m;
    m.match_id = ++next_match_;
    m.binding = id;
    m.key = std::move(key);
    m.reason = reason;
    m.at_ms = now_ms();
    m.events = std::move(events);
    ++metrics_.matches;
    ++fired_;
    nlohmann::json row = m;
    row["kind"] = "match";
    row["selector"] = b.selector;
    audit(channel_audit_topic, std::move(row));
    caf::anon_send(b.handler, ch_trigger_atom::value, std::move(m));
  }

  uint64_t flush() {
    auto before = fired_;
    for (auto& [id, st] : bindings_)
      while (!st.parts.empty())
        expire(id, st, st.parts.begin(), "flush");
    return fired_ - before;
  }

  /// An append came back: flushes waiting only for appends sent before them may go.
  void settled(uint64_t seq) {
    in_flight_.erase(seq);
    if (flush_waiters_.empty()) return;
    auto oldest = in_flight_.empty() ? next_seq_ + 1 : in_flight_.begin()->first;
    auto ready = flush_waiters_.begin();
    while (ready != flush_waiters_.end() && ready->first < oldest)
      ++ready;
    if (ready == flush_waiters_.begin()) return;
    auto n = flush();
    for (auto i = flush_waiters_.begin(); i != ready; ++i)
      i->second.deliver(n);
    flush_waiters_.erase(flush_waiters_.begin(), ready);
  }

  void drop_timers(binding_state& st) {
    for (auto& part : st.parts)
      if (part.second.timer != 0 && cfg_.clock != nullptr) cfg_.clock->cancel(part.second.timer);
  }

  channel_hub_config cfg_;
  bool remote_ = false;
  std::unordered_map<std::string, session_channel> session_;
  int64_t session_seq_ = 0;
  std::map<uint64_t, binding_state> bindings_;
  uint64_t next_binding_ = 0;
  uint64_t next_generation_ = 0;
  int64_t next_match_ = 0;
  uint64_t fired_ = 0;
  /// Durable appends sent and not answered, by sequence number (oldest first).
  std::map<uint64_t, caf::response_promise> in_flight_;
  uint64_t next_seq_ = 0;
  /// Flushes waiting for the appends sent before them: (last sequence then, promise).
  std::vector<std::pair<uint64_t, caf::response_promise>> flush_waiters_;
  channel_metrics metrics_;
};

} // namespace

caf::error check_binding(const channel_binding& b) {
  if (!b.handler) return make_error(errc::invalid_binding, "handler", "a binding needs a handler");
  if (b.scope.empty() || b.scope_id.empty())
    return make_error(errc::invalid_binding, "channel", "the selector is not resolved");
  if (b.count < 0) return make_error(errc::invalid_binding, "batch.count", "must be at least 1");
  if (b.window_ms < 0)
    return make_error(errc::invalid_binding, "batch.window", "must be at least 1");
  if (b.max_buffer < 1)
    return make_error(errc::invalid_binding, "batch.max_buffer", "must be at least 1");
  return {};
}

caf::actor spawn_channel_hub(caf::actor_system& sys, channel_hub_config cfg) {
  return caf::actor_cast<caf::actor>(sys.spawn<channel_hub>(std::move(cfg)));
}

} // namespace troupe
