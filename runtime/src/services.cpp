#include "services.hpp"

#include <algorithm>
#include <filesystem>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "troupe/messages/atoms.hpp"
#include "troupe/messages/directory.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/supervision.hpp"
#include "troupe/persistence/channel_hub.hpp"

namespace troupe::detail {

storage_config service_provider::storage_cfg(std::string path) {
  storage_config sc;
  sc.path = std::move(path);
  sc.fsync_every_commit = cfg.storage_fsync;
  sc.busy_timeout = cfg.storage_busy_timeout;
  sc.max_batch = cfg.storage_max_batch;
  // at_ms is wall time on real time (the steady clock restarts at boot), virtual in tests.
  sc.clock = cfg.virtual_time ? clock_ : nullptr;
  sc.detached = !cfg.virtual_time; // blocking I/O off the scheduler; in tests, deterministic
  sc.write_fault = write_fault;
  return sc;
}

caf::error service_provider::check_open() {
  if (stopped.load())
    return make_error(errc::runtime_stopped, "runtime", "the runtime has been stopped");
  return {};
}

// Opening a database is file I/O that may wait for another process's lock: it holds
// only open_mtx (opens are serialised), never storage_mtx, which every lookup takes.

/// Returns the storage actor: the live one (also while the runtime stops: stop
/// participants, attempts finishing and the lifecycle forwarders write their last rows
/// until step 6 ends it), or a new one when `may_open` and the runtime is not stopping,
/// or an empty actor.
caf::expected<caf::actor> service_provider::open_storage(bool may_open) {
  {
    std::lock_guard<std::mutex> guard{storage_mtx};
    if (storage_actor.live()) return storage_actor.handle;
    if (!may_open) return caf::actor{};
    if (auto err = check_open()) return err;
  }
  std::lock_guard<std::mutex> opening{open_mtx};
  {
    std::lock_guard<std::mutex> guard{storage_mtx};
    if (storage_actor.live()) return storage_actor.handle; // another open came first
  }
  std::string key;
  std::shared_ptr<std::atomic<bool>> gone;
  caf::expected<caf::actor> a{caf::actor{}};
  if (find_remote_storage) {
    // Another node's storage, through a link that answers for it when that node goes.
    auto found = find_remote_storage();
    if (!found) return std::move(found.error());
    gone = std::make_shared<std::atomic<bool>>(false);
    found->gone = gone;
    a = spawn_storage_link(*sys, std::move(*found)); // no key: it stays with the owner
  } else {
    a = spawn_storage(*sys, storage_cfg(cfg.storage), &key);
    if (!a) return std::move(a.error());
    if (storage_opened)
      if (auto err = storage_opened(*a)) {
        caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
        return err;
      }
  }
  std::lock_guard<std::mutex> guard{storage_mtx};
  if (auto err = check_open()) { // stopped meanwhile
    caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
    return err;
  }
  signing_key = std::move(key);
  // A link whose owner went away lives on for whoever still holds it (it answers
  // storage_unavailable) until the runtime stops.
  if (storage_actor.handle && storage_actor.gone && storage_actor.gone->load())
    retired_links.push_back(storage_actor.handle);
  storage_actor.set(*a, std::move(gone));
  start_forwarders();
  return storage_actor.handle;
}

/// Requires storage_mtx: returns the live hub, moved to the live storage if that was
/// opened again (its bindings and session channels stay), or an empty actor.
caf::actor service_provider::live_hub() {
  if (!channel_hub.live() || !storage_actor.live()) return {};
  if (hub_storage != storage_actor.handle) {
    caf::anon_send(channel_hub.handle, atoms::ch_storage_atom::value, storage_actor.handle);
    hub_storage = storage_actor.handle;
  }
  return channel_hub.handle;
}

caf::expected<caf::actor> service_provider::open_channels(bool may_open) {
  {
    std::lock_guard<std::mutex> guard{storage_mtx};
    // The live hub also while the runtime stops (step 5 flushes it; a participant may
    // append): only a new hub is refused then.
    if (auto hub = live_hub()) return hub;
    if (!may_open) return caf::actor{};
    if (auto err = check_open()) return err;
  }
  auto st = open_storage(true);
  if (!st) return st;
  std::lock_guard<std::mutex> guard{storage_mtx};
  if (auto err = check_open()) return err;
  if (auto hub = live_hub()) return hub;
  // None yet, or it ended: a new hub (an ended hub's bindings and session events are gone).
  channel_hub.set(spawn_channel_hub(
      *sys, channel_hub_config{*st, signing_key, clock_, cfg.session_channel_capacity}));
  hub_storage = *st;
  return channel_hub.handle;
}

caf::expected<caf::actor> service_provider::open_storage_at(const std::string& path, bool may_open) {
  std::error_code ec;
  auto abs = std::filesystem::absolute(path, ec).lexically_normal().string();
  auto main = std::filesystem::absolute(cfg.storage, ec).lexically_normal().string();
  if (abs == main) return open_storage(may_open);
  auto cached = [&]() -> caf::actor {
    auto i = other_storage.find(abs);
    return i != other_storage.end() && i->second.live() ? i->second.handle : caf::actor{};
  };
  {
    std::lock_guard<std::mutex> guard{storage_mtx};
    if (auto a = cached(); a || !may_open) return a;
    if (auto err = check_open()) return err;
  }
  std::lock_guard<std::mutex> opening{open_mtx};
  {
    std::lock_guard<std::mutex> guard{storage_mtx};
    if (auto a = cached()) return a;
  }
  auto a = spawn_storage(*sys, storage_cfg(path));
  if (!a) return std::move(a.error());
  std::lock_guard<std::mutex> guard{storage_mtx};
  if (auto err = check_open()) {
    caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
    return err;
  }
  other_storage[abs].set(*a);
  return *a;
}


/// Records a supervisor for `supervisor.lifecycle`; forwards at once when the storage is
/// open (else when it opens: its log is replayed then). No cost while there is none.
void service_provider::watch_lifecycle(const caf::actor& sup, std::string name) {
  std::lock_guard<std::mutex> guard{storage_mtx};
  lifecycle.erase(std::remove_if(lifecycle.begin(), lifecycle.end(),
                                 [](const auto& e) { return !e.sup.lock(); }),
                  lifecycle.end());
  lifecycle.push_back(
      lifecycle_entry{caf::actor_cast<caf::weak_actor_ptr>(sup), std::move(name), false});
  if (storage_actor.live()) start_forwarders();
}

/// Requires storage_mtx: gives every recorded supervisor without one a forwarder that
/// appends its events (the log so far, then live) to the event log.
void service_provider::start_forwarders() {
  using watch_atom = atoms::fwd_watch_atom;
  using end_atom = atoms::fwd_end_atom;
  for (auto& e : lifecycle) {
    auto sup = caf::actor_cast<caf::actor>(e.sup.lock());
    if (!sup || e.forwarding) continue;
    e.forwarding = true;
    auto fwd = sys->spawn([this, name = e.name](caf::event_based_actor* self) -> caf::behavior {
      // Ends after the supervisor: its down message may come first (it is urgent), so
      // the quit is queued behind the events the supervisor sent before it ended.
      self->set_down_handler([self](caf::down_msg&) { self->send(self, end_atom::value); });
      return {[self](watch_atom, const caf::actor& s) { self->monitor(s); },
              [self](end_atom) { self->quit(); },
              [this, name](const supervisor_event& ev) {
                // the storage in use now (it may have been opened again since)
                auto st = open_storage(false);
                if (!st || !*st) return;
                nlohmann::json row{{"supervisor", name},
                                   {"path", ev.child.empty() ? name : name + "/" + ev.child},
                                   {"at_ms", ev.at_ms},
                                   {"kind", to_string(ev.kind)},
                                   {"child", ev.child},
                                   {"reason", ev.reason}};
                // rows of several nodes may meet in one shared storage
                if (!cfg.cluster.node.empty()) row["node"] = cfg.cluster.node;
                caf::anon_send(
                    *st, atoms::st_append_atom::value, std::string{supervisor_lifecycle_topic},
                    row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
              }};
    });
    caf::anon_send(fwd, watch_atom::value, sup); // a monitor: no reference kept
    caf::anon_send(sup, atoms::sup_subscribe_atom::value, fwd, true);
  }
}

caf::expected<caf::actor> service_provider::find(runtime_service which, const std::string& path,
                                                  bool may_open) {
  switch (which) {
    case runtime_service::storage:
      return open_storage(may_open);
    case runtime_service::storage_at:
      return open_storage_at(path, may_open);
    case runtime_service::channel_hub:
      return open_channels(may_open);
  }
  return caf::actor{};
}

/// Spawns the provider of the service directory (messages/directory.hpp): the registry
/// delegates `dir_find` to it. A live service is answered at once (a lookup takes only the
/// short `storage_mtx`, never waits for an open in progress). Opening is file I/O that may
/// wait for another process's lock (up to the busy timeout): on real time each open runs
/// on a worker thread of its own (a detached actor that delivers the answer and ends), so
/// neither a scheduler thread nor the provider waits; on virtual time it runs inline,
/// deterministically.
caf::actor service_provider::spawn_provider() {
  auto body = [this](caf::event_based_actor* self) -> caf::behavior {
    return {[this, self](atoms::dir_find_atom, runtime_service which, const std::string& path,
                         bool may_open) -> caf::result<caf::actor> {
      auto live = find(which, path, false);
      if (!live) return std::move(live.error()); // runtime_stopped
      if (*live || !may_open) return std::move(*live);
      if (cfg.virtual_time) {
        auto a = find(which, path, true);
        if (!a) return std::move(a.error());
        return std::move(*a);
      }
      // The answer is delivered here, on the provider's own turn: a response promise
      // delivered from the worker's thread would read the provider's execution context
      // while the provider runs (a data race ThreadSanitizer reported).
      auto rp = self->make_response_promise<caf::actor>();
      auto worker = sys->spawn<caf::detached>([this, which, path](caf::event_based_actor* w)
                                                  -> caf::behavior {
        return {[this, w, which, path](atoms::dir_find_atom) -> caf::result<caf::actor> {
          w->quit();
          auto a = find(which, path, true);
          if (!a) return std::move(a.error());
          return std::move(*a);
        }};
      });
      self->request(worker, caf::infinite, atoms::dir_find_atom::value)
          .then([rp](caf::actor& a) mutable { rp.deliver(std::move(a)); },
                [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
      return rp;
    }};
  };
  return sys->spawn(body);
}

void service_provider::stop() noexcept {
    std::lock_guard<std::mutex> guard{storage_mtx};
    channel_hub.stop();
    hub_storage = nullptr; // a reference would keep the storage thread alive
    for (auto& kvp : other_storage)
      kvp.second.stop();
    other_storage.clear();
    // A storage thread ends only once nothing refers to its actor any more: the system's
    // shutdown waits for that thread.
    storage_actor.stop();
    for (auto& link : retired_links)
      caf::anon_send_exit(link, caf::exit_reason::user_shutdown);
    retired_links.clear();
}

} // namespace troupe::detail
