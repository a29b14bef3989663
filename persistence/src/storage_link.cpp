// A local stand-in for another node's storage actor (see spawn_storage_link): every request
// passes through it, so the owner's death answers what is in flight, typed, at once.

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "troupe/messages/cluster.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/interfaces.hpp"
#include "troupe/persistence/storage.hpp"

namespace troupe {

namespace {

using namespace troupe::atoms;

class storage_link final : public caf::event_based_actor {
 public:
  storage_link(caf::actor_config& cfg, storage_link_config lc)
      : caf::event_based_actor(cfg), cfg_(std::move(lc)) {}

  const char* name() const override { return "troupe.storage_link"; }

  caf::behavior make_behavior() override {
    monitor(cfg_.remote);
    if (cfg_.directory)
      request(caf::actor_cast<directory_actor>(cfg_.directory), std::chrono::seconds{10},
              cl_subscribe_atom::value, caf::actor_cast<caf::actor>(this), false)
          .then([](bool) {}, [](caf::error&) {}); // without it: the monitor alone
    set_down_handler([this](caf::down_msg& dm) {
      if (dm.source == cfg_.remote.address())
        go("its actor ended or its connection broke (" + to_string(dm.reason) + ")");
    });
    return {
        [this](st_append_atom a, std::string& topic, std::string& payload) {
          return pass<event_receipt>(a, std::move(topic), std::move(payload));
        },
        [this](st_append_many_atom a, std::string& topic, payload_batch& batch) {
          return pass<std::vector<event_receipt>>(a, std::move(topic), std::move(batch));
        },
        [this](st_chan_append_atom a, channel_write& w) {
          return pass<channel_receipt>(a, std::move(w));
        },
        [](st_commit_atom) {}, // the owner's own timer
        [this](st_read_atom a, std::string& topic, int64_t after, int64_t limit) {
          return pass<std::vector<event_record>>(a, std::move(topic), after, limit);
        },
        [this](st_chan_read_atom a, std::string& name, int64_t after, int64_t limit) {
          return pass<std::vector<channel_event>>(a, std::move(name), after, limit);
        },
        [this](st_chan_verify_atom a, channel_receipt& r) { return pass<bool>(a, std::move(r)); },
        [this](st_rate_acquire_atom a, std::vector<rate_bucket>& buckets, int64_t max_wait_ms) {
          return pass<rate_attempt>(a, std::move(buckets), max_wait_ms);
        },
        [this](st_subscribe_atom a, std::string& topic, int64_t from, caf::actor& who) {
          // a second subscription replaces the first (the owner's rule): listed once
          std::erase_if(subscribers_, [&](const auto& s) { return s.first == topic && s.second == who; });
          if (!gone_ && who) subscribers_.emplace_back(topic, who);
          return pass<bool>(a, std::move(topic), from, std::move(who));
        },
        [this](st_unsubscribe_atom a, std::string& topic, caf::actor& who) {
          std::erase_if(subscribers_, [&](const auto& s) { return s.first == topic && s.second == who; });
          return pass<bool>(a, std::move(topic), std::move(who));
        },
        [this](st_pool_save_atom a, std::string& pool, std::vector<pool_row>& rows, int64_t keep) {
          return pass<uint64_t>(a, std::move(pool), std::move(rows), keep);
        },
        [this](st_pool_load_atom a, std::string& pool) {
          return pass<std::vector<pool_row>>(a, std::move(pool));
        },
        [this](st_metrics_atom a) { return pass<storage_metrics>(a); },
        [this](const cluster_event& ev) {
          if (ev.node != cfg_.node) return;
          if (ev.kind == cluster_event_kind::member_down)
            go("its node " + ev.node + " is down (" + ev.detail + ")");
          else if (ev.kind == cluster_event_kind::member_left)
            go("its node " + ev.node + " left the cluster");
        },
    };
  }

  void on_exit() override {
    fail_all(unavailable("this node's link to it stopped"));
    if (cfg_.directory)
      caf::anon_send(caf::actor_cast<directory_actor>(cfg_.directory), cl_unsubscribe_atom::value,
                     address());
    cfg_.directory = nullptr; // no handle kept past the end (the directory held this one)
    cfg_.remote = nullptr;
    subscribers_.clear();
  }

 private:
  /// Passes a request on; its answer (or the owner's error, or the owner's going away)
  /// goes back to the requester, once.
  template <class R, class... Ts>
  caf::result<R> pass(Ts&&... xs) {
    if (gone_) return why_;
    auto rp = make_response_promise<R>();
    auto id = ++next_;
    pending_.emplace(id, [rp](const caf::error& e) mutable { rp.deliver(e); });
    request(cfg_.remote, caf::infinite, std::forward<Ts>(xs)...)
        .then(
            [this, rp, id](R& r) mutable {
              if (pending_.erase(id) > 0) rp.deliver(std::move(r));
            },
            [this, rp, id](caf::error& err) mutable {
              if (pending_.count(id) == 0) return;
              // CAF's own errors (the receiver is gone, the connection broke) say the
              // owner is unreachable: the link is gone, for every call; troupe's errors
              // are the owner's answer.
              if (err.category() == caf::atom("system")) {
                go(system().render(err));
                return;
              }
              pending_.erase(id);
              rp.deliver(std::move(err));
            });
    return rp;
  }

  [[nodiscard]] caf::error unavailable(const std::string& why) const {
    return make_error(errc::storage_unavailable, "storage",
                      "the storage \"" + cfg_.name + "\" on node " + cfg_.node + ": " + why);
  }

  void fail_all(const caf::error& err) {
    auto pending = std::move(pending_);
    pending_.clear();
    for (auto& kvp : pending)
      kvp.second(err);
  }

  /// The owner went away: what waits answers now, later requests at once; the runtime
  /// looks the storage up again on its next use.
  void go(const std::string& why) {
    if (gone_) return;
    gone_ = true;
    why_ = unavailable(why);
    if (cfg_.gone) cfg_.gone->store(true);
    fail_all(why_);
    for (auto& [topic, who] : subscribers_)
      caf::anon_send(who, st_ended_atom::value, topic, why_);
    subscribers_.clear();
    demonitor(cfg_.remote);
    cfg_.remote = nullptr; // the proxy is not kept alive by a link nobody can use
    if (cfg_.directory) {
      caf::anon_send(caf::actor_cast<directory_actor>(cfg_.directory), cl_unsubscribe_atom::value,
                     address());
      cfg_.directory = nullptr;
    }
  }

  storage_link_config cfg_;
  bool gone_ = false;
  caf::error why_;
  uint64_t next_ = 0;
  std::unordered_map<uint64_t, std::function<void(const caf::error&)>> pending_;
  std::vector<std::pair<std::string, caf::actor>> subscribers_;
};

} // namespace

caf::actor spawn_storage_link(caf::actor_system& sys, storage_link_config cfg) {
  return sys.spawn<storage_link>(std::move(cfg));
}

} // namespace troupe
