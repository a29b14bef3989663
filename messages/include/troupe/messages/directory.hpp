#pragma once

// The service directory: how code finds the runtime's services without knowing the module
// that implements them. A task asks the registry `(dir_find, which, path, may_open)`; the
// registry hands the question to the provider the runtime gave it at boot, which answers
// the live actor (opening it first when `may_open`: SQLite file I/O, which the provider
// does off the scheduler threads). No hook in a header, no include of persistence/.

#include <cstdint>
#include <string_view>

#include <caf/atom.hpp>

namespace troupe {

/// A service of the runtime that the directory finds.
enum class runtime_service : uint8_t {
  /// The storage actor of the runtime's database (the event log, durable channels' rows).
  storage,
  /// The storage actor of another database file, named by the request's path (a rate
  /// limiter's `state_path`).
  storage_at,
  /// The channel hub (durable channels' triggers and session channels).
  channel_hub,
};

/// Returns the name of `x` ("storage", "storage_at", "channel_hub").
[[nodiscard]] constexpr std::string_view to_string(runtime_service x) noexcept {
  switch (x) {
    case runtime_service::storage:
      return "storage";
    case runtime_service::storage_at:
      return "storage_at";
    case runtime_service::channel_hub:
      return "channel_hub";
  }
  return "?";
}

namespace atoms {

/// `(dir_find_atom, runtime_service, std::string path, bool may_open)` -> caf::actor: the
/// live service; an empty actor when it is not open and `may_open` is false. Errors:
/// `storage_unavailable` (no storage configured, or it cannot open), `runtime_stopped`.
/// Sent to the registry, which delegates it to the runtime's provider.
using dir_find_atom = caf::atom_constant<caf::atom("r_dirfind")>;

} // namespace atoms

} // namespace troupe
