#include "troupe/runtime/config.hpp"

#include <cctype>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "troupe/messages/errc.hpp"

namespace troupe {

std::string_view to_string(scheduler_policy x) noexcept {
  switch (x) {
    case scheduler_policy::sharing:
      return "sharing";
    case scheduler_policy::stealing:
      return "stealing";
    case scheduler_policy::troupe:
      break;
  }
  return "troupe";
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

caf::expected<std::chrono::milliseconds> read_ms(const std::string& key, const json& v, size_t lo,
                                                 size_t hi) {
  auto n = read_count(key, v, lo, hi);
  if (!n) return n.error();
  return std::chrono::milliseconds{static_cast<int64_t>(*n)};
}

caf::expected<std::string> read_string(const std::string& key, const json& v) {
  if (!v.is_string()) return wrong_type(key, "a string", v);
  return v.get<std::string>();
}

std::string known_list(std::span<const std::string_view> keys) {
  std::string known;
  for (auto k : keys)
    known += (known.empty() ? "" : ", ") + std::string{k};
  return known;
}

caf::error read_tls(const json& v, cluster_config& c) {
  static constexpr std::string_view keys[] = {"certificate", "key", "cafile"};
  if (!v.is_object()) return wrong_type("cluster.tls", "an object", v);
  for (auto& [key, x] : v.items()) {
    auto field = "cluster.tls." + key;
    auto str = read_string(field, x);
    if (!str) return str.error();
    if (key == "certificate")
      c.tls_certificate = *str;
    else if (key == "key")
      c.tls_key = *str;
    else if (key == "cafile")
      c.tls_cafile = *str;
    else
      return make_error(errc::config_unknown_key, field, "unknown key; known keys: " + known_list(keys));
  }
  return {};
}

caf::error read_cluster(const json& v, cluster_config& c) {
  static constexpr std::string_view keys[] = {"node",         "listen",     "advertise",
                                              "seeds",        "heartbeat_ms",
                                              "failure_timeout_ms", "insecure", "tls",
                                              "share_storage", "remote_storage"};
  if (!v.is_object()) return wrong_type("cluster", "an object", v);
  for (auto& [key, x] : v.items()) {
    auto field = "cluster." + key;
    if (key == "node") {
      auto str = read_string(field, x);
      if (!str) return str.error();
      c.node = *str;
    } else if (key == "listen" || key == "advertise") {
      auto str = read_string(field, x);
      if (!str) return str.error();
      auto a = parse_node_address(*str, field);
      if (!a) return a.error();
      (key == "listen" ? c.listen : c.advertise) = *a;
    } else if (key == "seeds") {
      if (!x.is_array()) return wrong_type(field, "an array of \"host:port\" strings", x);
      c.seeds.clear();
      for (size_t i = 0; i < x.size(); ++i) {
        auto f = field + "[" + std::to_string(i) + "]";
        auto str = read_string(f, x[i]);
        if (!str) return str.error();
        auto a = parse_node_address(*str, f);
        if (!a) return a.error();
        c.seeds.push_back(*a);
      }
    } else if (key == "heartbeat_ms") {
      auto d = read_ms(field, x, 10, 60'000);
      if (!d) return d.error();
      c.heartbeat = *d;
    } else if (key == "failure_timeout_ms") {
      auto d = read_ms(field, x, 20, 600'000);
      if (!d) return d.error();
      c.failure_timeout = *d;
    } else if (key == "insecure") {
      if (!x.is_boolean()) return wrong_type(field, "a boolean", x);
      c.insecure = x.get<bool>();
    } else if (key == "tls") {
      if (auto err = read_tls(x, c)) return err;
    } else if (key == "share_storage" || key == "remote_storage") {
      auto str = read_string(field, x);
      if (!str) return str.error();
      (key == "share_storage" ? c.share_storage : c.remote_storage) = *str;
    } else {
      return make_error(errc::config_unknown_key, field, "unknown key; known keys: " + known_list(keys));
    }
  }
  return {};
}

} // namespace

caf::expected<node_address> parse_node_address(std::string_view text, const std::string& field) {
  auto colon = text.rfind(':');
  auto bad = [&](const std::string& why) {
    return make_error(errc::config_out_of_range, field,
                      "expected \"host:port\", got \"" + std::string{text} + "\": " + why);
  };
  if (colon == std::string_view::npos) return bad("no port");
  node_address out;
  out.host = std::string{text.substr(0, colon)};
  if (out.host.empty()) return bad("an empty host");
  auto digits = text.substr(colon + 1);
  if (digits.empty() || digits.size() > 5) return bad("the port is not a number in 0..65535");
  uint32_t port = 0;
  for (auto ch : digits) {
    if (ch < '0' || ch > '9') return bad("the port is not a number in 0..65535");
    port = port * 10 + static_cast<uint32_t>(ch - '0');
  }
  if (port > 65535) return bad("the port is not a number in 0..65535");
  out.port = static_cast<uint16_t>(port);
  return out;
}

std::span<const std::string_view> runtime_config::keys() noexcept {
  static constexpr std::string_view all[] = {
      "threads",          "scheduler",     "max_throughput",          "blocking_threads",
      "virtual_time",     "storage",       "stop_timeout_ms",         "deadlock_check_ms",
      "storage_fsync",    "storage_busy_timeout_ms", "storage_max_batch",
      "session_channel_capacity", "cluster",
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
      else if (s == "troupe")
        cfg.policy = scheduler_policy::troupe;
      else
        return make_error(errc::config_out_of_range, key,
                          "expected \"troupe\", \"sharing\" or \"stealing\", got \"" + s +
                              "\"");
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
    } else if (key == "cluster") {
      if (auto err = read_cluster(v, cfg.cluster)) return err;
    } else {
      return make_error(errc::config_unknown_key, key, "unknown key; known keys: " + known_list(keys()));
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
  auto check_name = [](const std::string& field, const std::string& name) -> caf::error {
    for (auto ch : name)
      if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.'))
        return make_error(errc::config_out_of_range, field,
                          "a name takes letters, digits, '-', '_' and '.', got \"" + name + "\"");
    if (name.size() > 255) return make_error(errc::config_out_of_range, field, "longer than 255 bytes");
    return {};
  };
  if (cluster.node.empty()) {
    for (auto [field, value] : {std::pair{"cluster.share_storage", &cluster.share_storage},
                                std::pair{"cluster.remote_storage", &cluster.remote_storage}})
      if (!value->empty())
        return make_error(errc::config_out_of_range, field, "needs a cluster node (cluster.node)");
    return {};
  }
  if (auto err = check_name("cluster.node", cluster.node)) return err;
  if (!cluster.share_storage.empty() && !cluster.remote_storage.empty())
    return make_error(errc::config_out_of_range, "cluster.remote_storage",
                      "a node shares its own storage or uses another node's, not both");
  if (auto err = check_name("cluster.share_storage", cluster.share_storage)) return err;
  if (auto err = check_name("cluster.remote_storage", cluster.remote_storage)) return err;
  if (virtual_time)
    return make_error(errc::config_out_of_range, "cluster",
                      "a cluster node runs on real time (virtual_time is set)");
  if (cluster.heartbeat.count() < 10)
    return make_error(errc::config_out_of_range, "cluster.heartbeat_ms", "must be 10 or more");
  if (cluster.failure_timeout <= cluster.heartbeat)
    return make_error(errc::config_out_of_range, "cluster.failure_timeout_ms",
                      "must exceed heartbeat_ms (" + std::to_string(cluster.heartbeat.count()) +
                          "), got " + std::to_string(cluster.failure_timeout.count()));
  bool any_tls = !cluster.tls_certificate.empty() || !cluster.tls_key.empty() ||
                 !cluster.tls_cafile.empty();
  if (any_tls && !cluster.tls()) {
    auto missing = cluster.tls_certificate.empty() ? "certificate"
                   : cluster.tls_key.empty()       ? "key"
                                                   : "cafile";
    return make_error(errc::config_out_of_range, std::string{"cluster.tls."} + missing,
                      "TLS needs a certificate, a key and a cafile");
  }
  if (!any_tls && !cluster.insecure)
    return make_error(errc::insecure_cluster, "cluster.tls",
                      "a cluster node needs TLS (cluster.tls) or an explicit \"insecure\": true");
  return {};
}

} // namespace troupe
