#include "troupe/actors/stream.hpp"

#include <caf/send.hpp>

#include "troupe/actors/detail/task_actor.hpp"
#include "troupe/actors/task_handle.hpp"

namespace troupe::detail {

task_actor* running_task() noexcept {
  return task_actor::current();
}

void cancel_detached(const std::shared_ptr<handle_state>& st) noexcept {
  if (st && st->actor)
    task_actor::send_cancel(st->actor, cancel_mode::force());
}

} // namespace troupe::detail
