#include "troupe/runtime/config.hpp"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "troupe/messages/errc.hpp"

namespace troupe {

std::string_view to_string(scheduler_policy x) noexcept {
  return x == scheduler_policy::sharing ? "sharing" : "stealing";
}

size_t default_threads() noexcept {
  auto n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : std::min<size_t>(n, 256);
}

namespace {

using json = nlohmann::json;

caf::error wrong_type(const std::string& key, const char* expected, const json& v) {
  return make_error(errc::config_wrong_type, key,
                    std::string{"expected "} + expected + ", got " + v.type_name());
}

caf::expected<size_t> read_count(const std::string& key, const json& v, size_t lo, size_t hi) {
  if (!v.is_number_integer()) return wrong_type(key, "an integer", v);
  auto n = v.get<int64_t>();
  if (n < static_cast<int64_t>(lo) || n > static_cast<int64_t>(hi))
    return make_error(errc::config_out_of_range, key,
                      "must be in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " +
                          std::to_string(n));
  return static_cast<size_t>(n);
}

} // namespace

std::span<const std::string_view> runtime_config::keys() noexcept {
  static constexpr std::string_view all[] = {
      "threads",          "scheduler",     "max_throughput",          "blocking_threads",
      "virtual_time",     "storage",       "stop_timeout_ms",         "deadlock_check_ms",
      "storage_fsync",    "storage_busy_timeout_ms", "storage_max_batch",
      "session_channel_capacity",
  };
  return all;
}

caf::expected<runtime_config> runtime_config::from_json(std::string_view text,
                                                        runtime_config base) {
  json doc = json::parse(text.begin(), text.end(), nullptr, false);
  if (doc.is_discarded())
    return make_error(errc::config_not_json, "", "the configuration is not valid JSON");
  if (!doc.is_object())
    return make_error(errc::config_wrong_type, "",
                      std::string{"expected a JSON object, got "} + doc.type_name());
  auto cfg = std::move(base);
  for (auto& [key, v] : doc.items()) {
    if (key == "threads") {
      auto n = read_count(key, v, 1, 256);
      if (!n) return n.error();
      cfg.threads = *n;
    } else if (key == "scheduler") {
      if (!v.is_string()) return wrong_type(key, "a string", v);
      auto s = v.get<std::string>();
      if (s == "sharing")
        cfg.policy = scheduler_policy::sharing;
      else if (s == "stealing")
        cfg.policy = scheduler_policy::stealing;
      else
        return make_error(errc::config_out_of_range, key,
                          "expected \"sharing\" or \"stealing\", got \"" + s + "\"");
    } else if (key == "max_throughput") {
      auto n = read_count(key, v, 0, 1u << 30);
      if (!n) return n.error();
      cfg.max_throughput = *n;
    } else if (key == "blocking_threads") {
      auto n = read_count(key, v, 1, 1024);
      if (!n) return n.error();
      cfg.blocking_threads = *n;
    } else if (key == "virtual_time") {
      if (!v.is_boolean()) return wrong_type(key, "a boolean", v);
      cfg.virtual_time = v.get<bool>();
    } else if (key == "storage") {
      if (!v.is_string()) return wrong_type(key, "a string", v);
      cfg.storage = v.get<std::string>();
      if (cfg.storage.empty())
        return make_error(errc::config_out_of_range, key, "the storage path is empty");
    } else if (key == "stop_timeout_ms") {
      auto n = read_count(key, v, 0, 3'600'000);
      if (!n) return n.error();
      cfg.stop_timeout = std::chrono::milliseconds{static_cast<int64_t>(*n)};
    } else if (key == "deadlock_check_ms") {
      auto n = read_count(key, v, 0, 3'600'000);
      if (!n) return n.error();
      cfg.deadlock_check = std::chrono::milliseconds{static_cast<int64_t>(*n)};
    } else if (key == "storage_fsync") {
      if (!v.is_boolean()) return wrong_type(key, "a boolean", v);
      cfg.storage_fsync = v.get<bool>();
    } else if (key == "storage_busy_timeout_ms") {
      auto n = read_count(key, v, 0, 3'600'000);
      if (!n) return n.error();
      cfg.storage_busy_timeout = std::chrono::milliseconds{static_cast<int64_t>(*n)};
    } else if (key == "storage_max_batch") {
      auto n = read_count(key, v, 1, 1'000'000);
      if (!n) return n.error();
      cfg.storage_max_batch = *n;
    } else if (key == "session_channel_capacity") {
      auto n = read_count(key, v, 1, 10'000'000);
      if (!n) return n.error();
      cfg.session_channel_capacity = *n;
    } else {
      std::string known;
      for (auto k : keys())
        known += (known.empty() ? "" : ", ") + std::string{k};
      return make_error(errc::config_unknown_key, key, "unknown key; known keys: " + known);
    }
  }
  if (auto err = cfg.validate()) return err;
  return cfg;
}

caf::expected<runtime_config> runtime_config::from_file(const std::string& path,
                                                        runtime_config base) {
  std::ifstream in{path};
  if (!in) return make_error(errc::config_unreadable, path, "cannot open the configuration file");
  std::stringstream buf;
  buf << in.rdbuf();
  auto res = from_json(buf.str(), std::move(base));
  if (!res && is(res.error(), errc::config_not_json))
    return make_error(errc::config_not_json, path, "the configuration file is not valid JSON");
  return res;
}

caf::expected<runtime_config> runtime_config::from_json(std::string_view text) {
  return from_json(text, runtime_config{});
}

caf::expected<runtime_config> runtime_config::from_file(const std::string& path) {
  return from_file(path, runtime_config{});
}

caf::error runtime_config::validate() const {
  if (threads < 1 || threads > 256)
    return make_error(errc::config_out_of_range, "threads",
                      "must be in 1..256, got " + std::to_string(threads));
  if (blocking_threads < 1 || blocking_threads > 1024)
    return make_error(errc::config_out_of_range, "blocking_threads",
                      "must be in 1..1024, got " + std::to_string(blocking_threads));
  if (stop_timeout.count() < 0)
    return make_error(errc::config_out_of_range, "stop_timeout_ms", "cannot be negative");
  if (storage.empty())
    return make_error(errc::config_out_of_range, "storage", "the storage path is empty");
  return {};
}

} // namespace troupe
