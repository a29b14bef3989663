#include <string>
#include <unordered_map>
#include <vector>

#include <caf/all.hpp>

#include "lock_graph.hpp"
#include "primitive_actors.hpp"
#include "troupe/actors/detail/primitives.hpp"
#include "troupe/messages/directory.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/interfaces.hpp"

namespace troupe::detail {

namespace {

using namespace troupe::atoms;

std::string_view kind_name(primitive_kind k) {
  switch (k) {
    case primitive_kind::channel:
      return "channel";
    case primitive_kind::mailbox:
      return "mailbox";
    case primitive_kind::cell:
      return "shared cell";
    case primitive_kind::map:
      return "shared map";
    case primitive_kind::atomic:
      return "atomic";
    case primitive_kind::sync:
      return "sync primitive";
    case primitive_kind::pool:
      return "pool";
  }
  return "?";
}

/// Finds or creates the named primitives of one runtime. Keys carry the kind and the
/// scope (`mailbox|tenant|acme|jobs`), so equal names in two scopes are two objects. Entries
/// of a task scope go when their task ends. Anonymous channels are tracked too (the
/// deadlock detector reaches every channel through here).
class registry_actor final : public registry_type::base {
 public:
  registry_actor(caf::actor_config& cfg, troupe::clock* clock, caf::actor services)
      : registry_type::base(cfg), clock_(clock), services_(std::move(services)) {}

  const char* name() const override { return "troupe.registry"; }

  void on_exit() override {
    // The runtime stops: so do the primitives (a handle still held elsewhere keeps only a
    // dead actor).
    for (auto& kvp : entries_)
      caf::anon_send_exit(kvp.second.actor, caf::exit_reason::user_shutdown);
    for (auto& addr : anonymous_)
      if (auto a = caf::actor_cast<caf::actor>(addr))
        caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    entries_.clear();
    anonymous_.clear();
    owned_.clear();
    if (services_) caf::anon_send_exit(services_, caf::exit_reason::user_shutdown);
    services_ = nullptr;
  }

  behavior_type make_behavior() override {
    if (services_) monitor(services_); // a provider that ends is not asked any more
    set_down_handler([this](caf::down_msg& dm) {
      if (services_ && dm.source == services_.address()) {
        services_ = nullptr;
        provider_ended_ = true;
        return;
      }
      auto i = owned_.find(dm.source.id());
      if (i == owned_.end()) return;
      for (auto& key : i->second) {
        auto j = entries_.find(key);
        if (j == entries_.end()) continue;
        if (j->second.kind == primitive_kind::channel || j->second.kind == primitive_kind::mailbox)
          caf::anon_send(j->second.actor, q_close_atom::value); // no answer wanted
        entries_.erase(j);
      }
      owned_.erase(i);
    });
    return {
        [this](reg_open_atom, primitive_spec& spec) -> caf::result<caf::actor> {
          if (spec.key.empty()) { // an anonymous channel
            auto a = make(spec);
            prune();
            anonymous_.push_back(caf::actor_cast<caf::actor_addr>(a));
            return a;
          }
          if (auto i = entries_.find(spec.key); i != entries_.end()) {
            auto& e = i->second;
            if (e.kind != spec.kind)
              return make_error(errc::sync_conflict, "name",
                                "\"" + spec.name + "\" is a " + std::string{kind_name(e.kind)} +
                                    ", not a " + std::string{kind_name(spec.kind)});
            if (spec.kind == primitive_kind::sync && spec.create &&
                (e.sync != spec.sync || e.capacity != spec.capacity))
              return make_error(errc::sync_conflict, "capacity",
                                "\"" + spec.name + "\" is a " + std::string{to_string(e.sync)} +
                                    " with capacity " + std::to_string(e.capacity));
            if ((spec.kind == primitive_kind::channel || spec.kind == primitive_kind::mailbox) &&
                spec.create && spec.capacity != e.capacity)
              return make_error(errc::sync_conflict, "capacity",
                                "\"" + spec.name + "\" exists with capacity " +
                                    std::to_string(e.capacity));
            if (spec.kind == primitive_kind::pool && spec.create && spec.pool && e.pool &&
                !(*spec.pool == *e.pool))
              return make_error(errc::sync_conflict, "spec",
                                "pool \"" + spec.name + "\" is open with another spec: " +
                                    to_json(*e.pool).dump());
            if (spec.type_hash != 0 && e.type_hash != 0 && spec.type_hash != e.type_hash)
              return make_error(errc::wrong_type, "type",
                                "channel \"" + spec.name + "\" carries " + e.type_name + ", not " +
                                    spec.type_name);
            return e.actor;
          }
          if (!spec.create)
            return make_error(errc::not_found, "name",
                              "no " + std::string{kind_name(spec.kind)} + " \"" + spec.name +
                                  "\" in this scope");
          auto a = make(spec);
          entries_.emplace(spec.key, entry{a, spec.kind, spec.type_hash, spec.type_name,
                                           spec.capacity, spec.sync, spec.pool});
          if (spec.owner) {
            auto& keys = owned_[spec.owner.id()];
            if (keys.empty()) monitor(spec.owner);
            keys.push_back(spec.key);
          }
          return a;
        },
        [this](reg_list_atom, primitive_kind kind) {
          std::vector<caf::actor> out;
          for (auto& kvp : entries_)
            if (kvp.second.kind == kind) out.push_back(kvp.second.actor);
          if (kind == primitive_kind::channel)
            for (auto& addr : anonymous_)
              if (auto a = caf::actor_cast<caf::actor>(addr)) out.push_back(std::move(a));
          return out;
        },
        [this](dir_find_atom atom, runtime_service which, std::string& path,
               bool may_open) -> caf::result<caf::actor> {
          if (!services_)
            return make_error(errc::storage_unavailable, "storage",
                              provider_ended_
                                  ? "the runtime's service provider ended"
                                  : "this runtime has no " + std::string{to_string(which)});
          delegate(services_, atom, which, std::move(path), may_open);
          return caf::delegated<caf::actor>{}; // the provider answers the requester
        },
        [this](deadlock_atom) {
          for (auto& kvp : entries_)
            if (kvp.second.kind == primitive_kind::channel ||
                kvp.second.kind == primitive_kind::mailbox ||
                kvp.second.kind == primitive_kind::sync)
              caf::anon_send(kvp.second.actor, deadlock_atom::value);
          for (auto& addr : anonymous_)
            if (auto a = caf::actor_cast<caf::actor>(addr)) caf::anon_send(a, deadlock_atom::value);
        },
    };
  }

 private:
  struct entry {
    caf::actor actor;
    primitive_kind kind;
    size_t type_hash;
    std::string type_name;
    int64_t capacity;
    sync_kind sync;
    std::optional<pool_spec> pool;
  };

  caf::actor make(const primitive_spec& spec) {
    auto& sys = home_system();
    switch (spec.kind) {
      case primitive_kind::channel:
      case primitive_kind::mailbox:
        return spawn_queue(sys, queue_config{spec.name, spec.capacity, spec.type_hash,
                                             spec.type_name, spec.kind == primitive_kind::mailbox});
      case primitive_kind::sync:
        return spawn_sync(sys, sync_config{spec.sync, spec.name, spec.capacity, clock_, false,
                                           locks_});
      case primitive_kind::cell:
      case primitive_kind::map:
      case primitive_kind::atomic:
        return spawn_shared(sys, spec.kind, spec.name, spec.initial);
      case primitive_kind::pool:
        return spawn_pool(sys, spec.pool.value_or(pool_spec{}), spec.pool_id);
    }
    return {};
  }

  /// Forgets anonymous channels that are gone, now and then.
  void prune() {
    if (anonymous_.size() < prune_at_) return;
    std::vector<caf::actor_addr> live;
    for (auto& addr : anonymous_)
      if (caf::actor_cast<caf::actor>(addr)) live.push_back(addr);
    anonymous_ = std::move(live);
    prune_at_ = std::max<size_t>(64, anonymous_.size() * 2);
  }

  troupe::clock* clock_;
  /// The wait-for graph the sync actors it makes share (exact lock-cycle detection).
  std::shared_ptr<lock_graph> locks_ = std::make_shared<lock_graph>();
  /// Answers `dir_find` (the runtime's provider); empty: no services.
  caf::actor services_;
  bool provider_ended_ = false;
  std::unordered_map<std::string, entry> entries_;
  std::unordered_map<caf::actor_id, std::vector<std::string>> owned_;
  std::vector<caf::actor_addr> anonymous_;
  size_t prune_at_ = 64;
};

/// Confirms a stuck census: every live task must stay stuck, with nothing moving at all,
/// for a whole period.
class deadlock_detector final : public caf::event_based_actor {
 public:
  deadlock_detector(caf::actor_config& cfg, task_env* env, clock::duration period)
      : caf::event_based_actor(cfg), env_(env), period_(period) {}

  const char* name() const override { return "troupe.deadlock_detector"; }

  caf::behavior make_behavior() override {
    return {
        [this](deadlock_atom, uint64_t) { arm(); },
        [this](deadlock_atom, uint64_t, bool) {
          auto& c = env_->census;
          bool moved = c.moved.exchange(false);
          bool stuck = c.stuck();
          // Activations whose changes summed to nothing move no count: a task that ran
          // since the last look, or runs now, moved all the same. Read after the counts:
          // an activation whose changes the counts do not show yet is seen running here.
          auto [activations, busy] = c.activity();
          moved = moved || busy || activations != activations_;
          activations_ = activations;
          if (!stuck) {
            quiet_ = 0;
            c.check_pending = false;
            // A change between the two loads may have found the flag still set.
            if (c.stuck() && !c.check_pending.exchange(true)) arm();
            return;
          }
          if (moved) { // still stuck, but something happened meanwhile: look again later
            quiet_ = 0;
            arm();
            return;
          }
          // Two quiet periods in a row: a machine that stalled every thread for one period
          // (an overloaded host) does not pass for a deadlock.
          if (++quiet_ < 2) {
            arm();
            return;
          }
          quiet_ = 0;
          c.check_pending = false;
          send(env_->registry, deadlock_atom::value);
        },
    };
  }

 private:
  void arm() {
    env_->census.moved = false;
    activations_ = env_->census.activity().first;
    env_->clock->schedule(env_->clock->now() + period_, caf::actor_cast<caf::actor>(this),
                          caf::make_message(deadlock_atom::value, uint64_t{0}, true));
  }

  task_env* env_;
  clock::duration period_;
  int quiet_ = 0;
  /// The census's count of activations at the last look (see wait_census::activity).
  uint64_t activations_ = 0;
};

} // namespace

caf::actor spawn_registry(caf::actor_system& sys, troupe::clock* clock, caf::actor services) {
  return caf::actor_cast<caf::actor>(sys.spawn<registry_actor>(clock, std::move(services)));
}

caf::actor spawn_deadlock_detector(caf::actor_system& sys, task_env* env, clock::duration period) {
  return sys.spawn<deadlock_detector>(env, period);
}

} // namespace troupe::detail
