#pragma once

// Internal: the storage of a task actor comes from the actor slab (actor_slab.hpp).
//
// CAF makes every actor with `new actor_storage<T>` and frees it with `delete` when its last
// reference goes. This explicit specialization for troupe's task actor keeps the layout CAF
// relies on (the control block at offset 0, the actor one cache line in: CAF finds one from
// the other by that offset) and adds class-level `operator new` / `operator delete` routed to
// the slab. It must be visible wherever a task actor is made: only task_spawn.cpp spawns
// task actors, and only it includes this header (a second translation unit spawning one
// without it would make two definitions of the storage: keep spawns there).

#include <cstddef>
#include <new>
#include <utility>

#include <caf/actor_control_block.hpp>
#include <caf/actor_storage.hpp>

#include "troupe/actors/detail/actor_slab.hpp"
#include "troupe/actors/detail/task_actor.hpp"

namespace caf {

template <>
class actor_storage<troupe::detail::task_actor> {
 public:
  using value_type = troupe::detail::task_actor;

  template <class... Us>
  actor_storage(actor_id x, node_id y, actor_system* sys, Us&&... zs)
      : ctrl(x, y, sys, data_dtor, block_dtor) {
    new (&data) value_type(std::forward<Us>(zs)...);
  }
  ~actor_storage() {} // NOLINT: the actor is destroyed by data_dtor, before the block
  actor_storage(const actor_storage&) = delete;
  actor_storage& operator=(const actor_storage&) = delete;

  static void* operator new(std::size_t n) { return troupe::detail::actor_slab::allocate(n); }
  static void operator delete(void* p, std::size_t n) noexcept {
    troupe::detail::actor_slab::deallocate(p, n);
  }

  actor_control_block ctrl;
  char pad[CAF_CACHE_LINE_SIZE - sizeof(actor_control_block)];
  union {
    value_type data;
  };

 private:
  static void data_dtor(abstract_actor* ptr) {
    ptr->on_destroy();
    static_cast<value_type*>(ptr)->~value_type();
  }
  static void block_dtor(actor_control_block* ptr) {
    delete reinterpret_cast<actor_storage*>(ptr);
  }
};

} // namespace caf

namespace troupe::detail {

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
static_assert(offsetof(caf::actor_storage<task_actor>, ctrl) == 0,
              "CAF finds the storage at its control block");
static_assert(offsetof(caf::actor_storage<task_actor>, data) == CAF_CACHE_LINE_SIZE,
              "CAF finds the actor one cache line after its control block");
static_assert(alignof(caf::actor_storage<task_actor>) <= 64, "the slab's blocks are 64-aligned");
static_assert(sizeof(caf::actor_storage<task_actor>) <= actor_slab::chunk_bytes / 64,
              "a chunk holds many task actors");
#pragma GCC diagnostic pop

} // namespace troupe::detail
