#include "troupe/messages/messaging.hpp"

namespace troupe {

std::string_view to_string(scope_kind x) noexcept {
  switch (x) {
    case scope_kind::task:
      return "task";
    case scope_kind::task_group:
      return "task_group";
    case scope_kind::process:
      return "process";
    case scope_kind::tenant:
      return "tenant";
  }
  return "?";
}

std::optional<scope_kind> parse_scope(std::string_view x) noexcept {
  for (auto k : {scope_kind::task, scope_kind::task_group, scope_kind::process, scope_kind::tenant})
    if (to_string(k) == x) return k;
  return std::nullopt;
}

std::string_view to_string(sync_kind x) noexcept {
  switch (x) {
    case sync_kind::mutex:
      return "mutex";
    case sync_kind::rwlock:
      return "rwlock";
    case sync_kind::semaphore:
      return "semaphore";
    case sync_kind::gate:
      return "gate";
  }
  return "?";
}

} // namespace troupe
