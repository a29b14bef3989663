#pragma once

// JSON in messages: a `nlohmann::json` travels as its compact text, so a message holding
// one (a shared value, a spec) can cross to another node. The receiver parses it back; a
// text that is not JSON, or nested deeper than 512 levels, fails the load with
// `invalid_payload`.

#include <cstddef>
#include <string>

#include <caf/error.hpp>
#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>
#include <nlohmann/json.hpp>

namespace troupe::detail {

/// Returns `x` as compact text (invalid UTF-8 replaced, never throws).
[[nodiscard]] std::string json_text(const nlohmann::json& x);

/// The deepest nesting a JSON value from another node may have.
inline constexpr size_t max_json_depth = 512;

/// Parses `text` into `x`: `invalid_payload` when it is not JSON or nested deeper than
/// `max_json_depth`.
[[nodiscard]] caf::error json_parse(const std::string& text, nlohmann::json& x);

} // namespace troupe::detail

namespace nlohmann {

/// CAF 0.17 inspection of a JSON value (found by argument-dependent lookup): its text.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, json& x) {
  std::string text;
  if constexpr (Inspector::reads_state)
    text = troupe::detail::json_text(x);
  auto load = caf::meta::load_callback([&]() -> caf::error {
    return troupe::detail::json_parse(text, x);
  });
  return f(caf::meta::type_name("json"), text, load);
}

} // namespace nlohmann
