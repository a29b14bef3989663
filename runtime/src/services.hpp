#pragma once

#include <string>

#include <caf/actor.hpp>
#include <caf/expected.hpp>

#include "troupe/actors/context.hpp"

namespace troupe::detail {

enum class service { storage, storage_at, channels };

/// Returns the runtime's storage actor (`path` for `storage_at`) or channel hub. The first
/// open (SQLite file I/O, which may wait for another process's lock) runs on the blocking
/// executor, never on a scheduler thread; later calls find the actor at once.
task<caf::expected<caf::actor>> open_service(context& cx, service which, std::string path = {});

} // namespace troupe::detail
