#pragma once

#include <cstdint>
#include <string>

#include <caf/meta/type_name.hpp>

namespace troupe {

/// Why an abort token tripped. `code` is required (a stable, machine-readable word such as
/// "lane_red"); `message` is for people.
struct abort_reason {
  std::string code;
  std::string message;
  /// The runtime clock's milliseconds when the token tripped (set by the token).
  int64_t at_ms = 0;
  friend bool operator==(const abort_reason&, const abort_reason&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, abort_reason& x) {
  return f(caf::meta::type_name("troupe.abort_reason"), x.code, x.message, x.at_ms);
}

/// An abort token's answer to a poll.
struct abort_state {
  bool requested = false;
  abort_reason reason;
  friend bool operator==(const abort_state&, const abort_state&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, abort_state& x) {
  return f(caf::meta::type_name("troupe.abort_state"), x.requested, x.reason);
}

} // namespace troupe
