#include "troupe/messages/cluster.hpp"

namespace troupe {

const char* to_string(member_status x) noexcept {
  switch (x) {
    case member_status::up:
      return "up";
    case member_status::down:
      return "down";
    case member_status::left:
      return "left";
  }
  return "?";
}

const char* to_string(cluster_event_kind x) noexcept {
  switch (x) {
    case cluster_event_kind::member_up:
      return "member_up";
    case cluster_event_kind::member_down:
      return "member_down";
    case cluster_event_kind::member_left:
      return "member_left";
    case cluster_event_kind::name_lost:
      return "name_lost";
  }
  return "?";
}

} // namespace troupe
