#include "troupe/messages/json.hpp"

#include "troupe/messages/errc.hpp"

namespace troupe::detail {

std::string json_text(const nlohmann::json& x) {
  return x.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

caf::error json_parse(const std::string& text, nlohmann::json& x) {
  // A value from another node: refuse absurd nesting before parsing, as troupe's own code
  // (dump, compare, render) recurses into it.
  size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_json_depth)
        return make_error(errc::invalid_payload, "json",
                          "a JSON value in a message is nested deeper than " +
                              std::to_string(max_json_depth) + " levels");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  auto parsed = nlohmann::json::parse(text, nullptr, false);
  if (parsed.is_discarded())
    return make_error(errc::invalid_payload, "json", "a JSON value in a message is not JSON");
  x = std::move(parsed);
  return {};
}

} // namespace troupe::detail
