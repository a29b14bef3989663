#include "troupe/messages/json.hpp"

#include "troupe/messages/errc.hpp"

namespace troupe::detail {

std::string json_text(const nlohmann::json& x) {
  return x.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

caf::error json_parse(const std::string& text, nlohmann::json& x) {
  auto parsed = nlohmann::json::parse(text, nullptr, false);
  if (parsed.is_discarded())
    return make_error(errc::invalid_payload, "json", "a JSON value in a message is not JSON");
  x = std::move(parsed);
  return {};
}

} // namespace troupe::detail
