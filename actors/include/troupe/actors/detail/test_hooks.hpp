#pragma once

/// Seams for tests that must observe an instant inside the runtime which no public API
/// exposes. Not for production use: nothing here is part of troupe's stable API.

#include <memory>

#include <caf/actor.hpp>

namespace troupe::detail {

/// Called on the thread that raised a task's fail-fast group, right after its siblings
/// can see the raise (`yield_now`, `is_cancelled` and every `co_await` of a sibling check
/// it from then on). `nullptr` (the default): no call. The hook must not throw.
using group_raised_hook = void (*)() noexcept;

/// Installs `hook` (or removes it with `nullptr`) for every runtime of the process.
void set_group_raised_hook(group_raised_hook hook) noexcept;

/// Called on the parent's thread right after a child that joins a scope's nursery and
/// starts at once (a nested `scope`'s or `deadline`'s own child) was spawned, before the
/// parent goes on: a test may hold the parent there while the child runs on another
/// thread. `nullptr` (the default): no call. The hook must not throw.
using nursery_spawned_hook = void (*)(const caf::actor& child) noexcept;
void set_nursery_spawned_hook(nursery_spawned_hook hook) noexcept;

struct job_ticket;

/// Called on the thread that admits a ticket its lane granted, after the lane's lock was
/// let go and before the ticket's task is spawned: a test may withdraw the ticket there (a
/// cancel landing between a grant and its admission). `nullptr` (the default): no call.
/// The hook must not throw.
using ticket_granted_hook = void (*)(const std::shared_ptr<job_ticket>& t) noexcept;
void set_ticket_granted_hook(ticket_granted_hook hook) noexcept;

} // namespace troupe::detail
