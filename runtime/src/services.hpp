#pragma once

// The runtime's service provider: it opens the storage actor of the runtime's database (and
// of other files) and the channel hub on first use, answers the service directory's
// `dir_find` (messages/directory.hpp) through the provider actor the registry delegates
// to, and forwards every recorded supervisor's events to `supervisor.lifecycle`.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "troupe/messages/clock.hpp"
#include "troupe/messages/directory.hpp"
#include "troupe/persistence/storage.hpp"
#include "troupe/runtime/config.hpp"

namespace troupe::detail {

class service_provider {
 public:
  /// `cfg`, `clock` and `stopped` belong to the runtime, which outlives this provider.
  service_provider(const runtime_config& cfg, troupe::clock* clock,
                   const std::atomic<bool>& stopped) noexcept
      : cfg(cfg), clock_(clock), stopped(stopped) {}

  /// Sets the actor system (created after the provider; destroyed before it).
  void bind(caf::actor_system& system) noexcept { sys = &system; }

  /// Returns the storage actor: the live one (also after stop() when not opening: the
  /// lifecycle forwarders write the last events), or a new one when `may_open`, or an
  /// empty actor.
  caf::expected<caf::actor> open_storage(bool may_open = true);
  /// Returns the live channel hub, or a new one when `may_open`, or an empty actor.
  caf::expected<caf::actor> open_channels(bool may_open);
  /// Returns the storage actor of the database at `path` (the runtime's own when it is the
  /// same file).
  caf::expected<caf::actor> open_storage_at(const std::string& path, bool may_open);
  /// Records a supervisor for `supervisor.lifecycle`; forwards at once when the storage is
  /// open (else when it opens: its log is replayed then). No cost while there is none.
  void watch_lifecycle(const caf::actor& sup, std::string name);
  /// Returns the service `which` (`path` for storage_at): live, opened when `may_open`, or
  /// an empty actor.
  caf::expected<caf::actor> find(runtime_service which, const std::string& path, bool may_open);
  /// Spawns the provider actor the registry delegates `dir_find` to.
  caf::actor spawn_provider();
  /// Stops the hub and every storage actor (the handles are dropped: a storage thread ends
  /// only once nothing refers to its actor any more).
  void stop() noexcept;

 private:
  /// An actor the runtime opened on demand, and whether it has terminated since (it is
  /// opened again then): the flag is set by the actor's own exit, from any thread.
  struct cached_actor {
    caf::actor handle;
    std::shared_ptr<std::atomic<bool>> down;
    /// Set by a storage link whose owner went away (the link itself lives on, answering
    /// `storage_unavailable` to whoever still holds it).
    std::shared_ptr<std::atomic<bool>> gone;
    [[nodiscard]] bool live() const noexcept {
      return handle && !down->load() && !(gone && gone->load());
    }
    void set(caf::actor a, std::shared_ptr<std::atomic<bool>> gone_flag = nullptr) {
      gone = std::move(gone_flag);
      down = std::make_shared<std::atomic<bool>>(false);
      a->attach_functor([d = down] { d->store(true); });
      handle = std::move(a);
    }
    void stop() noexcept {
      if (handle) caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
      handle = nullptr;
    }
  };

  storage_config storage_cfg(std::string path);
  caf::error check_open();
  caf::actor live_hub();
  void start_forwarders();

  const runtime_config& cfg;
  troupe::clock* clock_;

 public:
  /// Simulation only: the storage write fault point (see storage_config::write_fault).
  std::function<bool()> write_fault;
  /// A node using another node's storage (`cluster.remote_storage`): finds it (its actor,
  /// node and this node's directory); the storage is then a link to it.
  std::function<caf::expected<storage_link_config>()> find_remote_storage;
  /// A node sharing its storage (`cluster.share_storage`): registers each storage actor it
  /// opens under the cluster name. Runs with no lock of the provider held but `open_mtx`.
  std::function<caf::error(const caf::actor&)> storage_opened;

 private:
  const std::atomic<bool>& stopped;
  caf::actor_system* sys = nullptr;
  std::mutex open_mtx;
  std::mutex storage_mtx;
  cached_actor storage_actor;
  /// Storage links replaced after their owner went away (stopped with the runtime).
  std::vector<caf::actor> retired_links;
  std::string signing_key;
  cached_actor channel_hub;
  /// The storage the hub writes to (it is told when the storage is opened again).
  caf::actor hub_storage;
  /// Storage actors of other files (a rate limiter's `state_path`), by absolute path.
  std::map<std::string, cached_actor> other_storage;
  /// Supervisors whose events go to `supervisor.lifecycle` once the storage is open, and
  /// whether their forwarder exists (guarded by storage_mtx).
  struct lifecycle_entry {
    caf::weak_actor_ptr sup;
    std::string name;
    bool forwarding = false;
  };
  std::vector<lifecycle_entry> lifecycle;
};

} // namespace troupe::detail
