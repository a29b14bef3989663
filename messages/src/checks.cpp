#include "troupe/messages/durable.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/storage.hpp"

// Checks shared by the storage actor and its clients (which refuse bad input before a
// message is sent).

namespace troupe {

caf::error check_topic(const std::string& topic) {
  if (topic.empty()) return make_error(errc::invalid_topic, "topic", "a topic cannot be empty");
  if (topic.size() > 200)
    return make_error(errc::invalid_topic, "topic",
                      "a topic has at most 200 bytes, got " + std::to_string(topic.size()));
  char prev = '.';
  for (auto c : topic) {
    bool sep = c == '.' || c == ':';
    if (sep && (prev == '.' || prev == ':'))
      return make_error(errc::invalid_topic, "topic", "\"" + topic + "\" has an empty segment");
    prev = c;
  }
  if (prev == '.' || prev == ':')
    return make_error(errc::invalid_topic, "topic", "\"" + topic + "\" has an empty segment");
  return {};
}

caf::error check_buckets(const std::vector<rate_bucket>& buckets) {
  if (buckets.empty())
    return make_error(errc::invalid_rate_limit, "buckets", "at least one bucket is needed");
  for (size_t i = 0; i < buckets.size(); ++i) {
    auto& b = buckets[i];
    auto field = "buckets[" + std::to_string(i) + "].";
    if (b.key.empty() || b.key.size() > 200)
      return make_error(errc::invalid_rate_limit, field + "key", "a key has 1 to 200 bytes");
    auto range = [&](const char* name, int64_t x, int64_t max) {
      return x >= 1 && x <= max ? caf::error{}
                                : make_error(errc::invalid_rate_limit, field + name,
                                             "must be between 1 and " + std::to_string(max) +
                                                 ", got " + std::to_string(x));
    };
    if (auto err = range("limit", b.limit, max_rate_units)) return err;
    if (auto err = range("units", b.units, max_rate_units)) return err;
    if (auto err = range("window_ms", b.window_ms, max_rate_window_ms)) return err;
    for (size_t j = 0; j < i; ++j)
      if (buckets[j].key == b.key)
        return make_error(errc::invalid_rate_limit, field + "key",
                          "\"" + b.key + "\" appears twice in one request");
  }
  return {};
}

} // namespace troupe
