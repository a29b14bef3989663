#pragma once

// Which protocol payloads may cross a node. Every payload type of a protocol that a remote
// node could need has an `inspect()` and a stable name, registered by `add_message_types`;
// a payload that must stay in its process (it holds a function or a pointer) is declared
// with TROUPE_LOCAL_ONLY_MESSAGE_TYPE, which lets it travel in local messages only and marks
// it `is_local_only` (docs/protocols.md lists both kinds).

#include <string>
#include <type_traits>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/fwd.hpp>

namespace troupe {

/// Whether `T` is a local-only payload (see TROUPE_LOCAL_ONLY_MESSAGE_TYPE).
template <class T>
struct is_local_only : std::false_type {};

template <class T>
inline constexpr bool is_local_only_v = is_local_only<T>::value;

/// Registers every troupe payload that may cross a node with `cfg`, under its stable name
/// (`troupe.<type>`). The runtime calls it at boot; a plain CAF node that talks to troupe
/// actors calls it too.
void add_message_types(caf::actor_system_config& cfg);

/// Returns the names `add_message_types` registers, in registration order.
[[nodiscard]] const std::vector<std::string>& remote_type_names();

} // namespace troupe

/// Declares `T` a payload of local messages only: whitelisted for CAF's local messages (no
/// serialisation) and marked `troupe::is_local_only<T>`. Use at global scope.
#define TROUPE_LOCAL_ONLY_MESSAGE_TYPE(T)                                                     \
  CAF_ALLOW_UNSAFE_MESSAGE_TYPE(T)                                                            \
  namespace troupe {                                                                          \
  template <>                                                                                 \
  struct is_local_only<T> : std::true_type {};                                                \
  }
