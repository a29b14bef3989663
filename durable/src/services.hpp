#pragma once

#include <string>

#include <caf/actor.hpp>
#include <caf/expected.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/messages/directory.hpp"
#include "troupe/messages/interfaces.hpp"

namespace troupe::detail {

/// Returns the runtime's storage actor (`path` for `storage_at`) or channel hub, asking the
/// registry (the service directory, messages/directory.hpp). The first use opens it: SQLite
/// file I/O, which the runtime's provider does off the scheduler threads. Errors:
/// `storage_unavailable`, `runtime_stopped` (also when the registry has already stopped).
task<caf::expected<caf::actor>> open_service(context& cx, runtime_service which,
                                             std::string path = {});

/// Returns the storage actor of the runtime's database (`path` empty) or of another file,
/// through its typed interface.
task<caf::expected<storage_actor_type>> find_storage(context& cx, std::string path = {});

/// Returns the channel hub through its typed interface.
task<caf::expected<channel_hub_type>> find_hub(context& cx);

} // namespace troupe::detail
