#include "troupe/messages/durable.hpp"

namespace troupe {

void to_json(nlohmann::json& j, const channel_receipt& x) {
  j = nlohmann::json{{"event_id", x.event_id},
                     {"name_resolved", x.name_resolved},
                     {"duplicate", x.duplicate},
                     {"emitted_at",
                      {{"at_ms", x.emitted_at.at_ms},
                       {"scope", x.emitted_at.scope},
                       {"scope_id", x.emitted_at.scope_id},
                       {"emitted_by", x.emitted_at.emitted_by},
                       {"sig", x.emitted_at.sig}}}};
}

void from_json(const nlohmann::json& j, channel_receipt& x) {
  j.at("event_id").get_to(x.event_id);
  j.at("name_resolved").get_to(x.name_resolved);
  j.at("duplicate").get_to(x.duplicate);
  auto& e = j.at("emitted_at");
  e.at("at_ms").get_to(x.emitted_at.at_ms);
  e.at("scope").get_to(x.emitted_at.scope);
  e.at("scope_id").get_to(x.emitted_at.scope_id);
  e.at("emitted_by").get_to(x.emitted_at.emitted_by);
  e.at("sig").get_to(x.emitted_at.sig);
}

void to_json(nlohmann::json& j, const channel_match& x) {
  auto ids = nlohmann::json::array();
  for (auto& e : x.events)
    ids.push_back(e.receipt.event_id);
  j = nlohmann::json{{"match_id", x.match_id}, {"binding", x.binding}, {"key", x.key},
                     {"reason", x.reason},     {"at_ms", x.at_ms},     {"event_ids", ids}};
}

} // namespace troupe
