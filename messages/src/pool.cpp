#include "troupe/messages/pool.hpp"

#include <array>
#include <cstdio>

#include "troupe/messages/errc.hpp"

namespace troupe {

namespace {

template <class E, size_t N>
std::string_view name_in(const std::array<std::string_view, N>& names, E x) noexcept {
  auto i = static_cast<size_t>(x);
  return i < N ? names[i] : std::string_view{"?"};
}

constexpr std::array<std::string_view, 4> queue_names{"priority", "fifo", "lifo",
                                                      "fair_round_robin"};
constexpr std::array<std::string_view, 4> backpressure_names{"unbounded", "queue", "fail_fast",
                                                             "ring_buffer"};
constexpr std::array<std::string_view, 4> on_full_names{"block_submitter", "drop_oldest",
                                                        "drop_newest", "fail_submitter"};
constexpr std::array<std::string_view, 3> restart_names{"permanent", "transient", "temporary"};
constexpr std::array<std::string_view, 5> lifecycle_names{"starting", "idle", "busy", "draining",
                                                          "stopped"};
constexpr std::array<std::string_view, 3> audit_names{"none", "drops", "receipts"};
constexpr std::array<std::string_view, 4> scope_names{"session", "pipeline", "tenant", "org"};
constexpr std::array<std::string_view, 6> status_names{"queued",   "running",  "completed",
                                                       "failed",   "rejected", "cancelled"};

caf::error bad(std::string field, std::string detail) {
  return make_error(errc::invalid_pool_spec, std::move(field), std::move(detail));
}

/// Reads the enum named by `j[key]` (a string among `names`) into `out`.
template <class E, size_t N>
caf::error read_name(const nlohmann::json& j, const char* key, const std::string& field,
                     const std::array<std::string_view, N>& names, E& out) {
  auto i = j.find(key);
  if (i == j.end()) return {};
  if (!i->is_string()) return bad(field, "must be a string");
  auto s = i->get<std::string>();
  for (size_t k = 0; k < N; ++k)
    if (names[k] == s) {
      out = static_cast<E>(k);
      return {};
    }
  std::string known;
  for (auto& n : names)
    known += (known.empty() ? "" : ", ") + std::string{n};
  return bad(field, "unknown name \"" + s + "\" (known: " + known + ")");
}

caf::error read_int(const nlohmann::json& j, const char* key, const std::string& field,
                    int64_t& out) {
  auto i = j.find(key);
  if (i == j.end()) return {};
  if (!i->is_number_integer()) return bad(field, "must be an integer");
  out = i->get<int64_t>();
  return {};
}

caf::error only_keys(const nlohmann::json& j, std::initializer_list<std::string_view> keys,
                     const std::string& prefix) {
  for (auto& [k, v] : j.items()) {
    bool known = false;
    for (auto& x : keys)
      known = known || x == k;
    if (!known) return bad(prefix + k, "unknown key");
  }
  return {};
}

} // namespace

std::string_view to_string(pool_queue_kind x) noexcept { return name_in(queue_names, x); }
std::string_view to_string(pool_backpressure_kind x) noexcept {
  return name_in(backpressure_names, x);
}
std::string_view to_string(pool_on_full x) noexcept { return name_in(on_full_names, x); }
std::string_view to_string(pool_restart x) noexcept { return name_in(restart_names, x); }
std::string_view to_string(runner_lifecycle x) noexcept { return name_in(lifecycle_names, x); }
std::string_view to_string(pool_audit x) noexcept { return name_in(audit_names, x); }
std::string_view to_string(pool_scope x) noexcept { return name_in(scope_names, x); }
std::string_view to_string(pool_task_status x) noexcept { return name_in(status_names, x); }

caf::error check_pool_spec(const pool_spec& x) {
  if (x.name.empty()) return bad("name", "a pool needs a name");
  if (x.max_concurrent < 1)
    return bad("max_concurrent", "must be at least 1, got " + std::to_string(x.max_concurrent));
  if (static_cast<size_t>(x.scope) >= scope_names.size()) return bad("scope", "unknown scope");
  if (static_cast<size_t>(x.queue.kind) >= queue_names.size())
    return bad("queue.strategy", "unknown strategy");
  if (x.queue.kind == pool_queue_kind::fair_round_robin && x.queue.key.empty())
    return bad("queue.key", "fair_round_robin needs the name of the key it partitions by");
  switch (x.backpressure.kind) {
    case pool_backpressure_kind::unbounded:
    case pool_backpressure_kind::fail_fast:
      break;
    case pool_backpressure_kind::queue:
      if (x.backpressure.max_depth < 1)
        return bad("backpressure.max_depth",
                   "must be at least 1, got " + std::to_string(x.backpressure.max_depth));
      if (static_cast<size_t>(x.backpressure.on_full) >= on_full_names.size())
        return bad("backpressure.on_full", "unknown policy");
      break;
    case pool_backpressure_kind::ring_buffer:
      if (x.backpressure.capacity < 1)
        return bad("backpressure.capacity",
                   "must be at least 1, got " + std::to_string(x.backpressure.capacity));
      break;
    default:
      return bad("backpressure.policy", "unknown policy");
  }
  if (static_cast<size_t>(x.audit) >= audit_names.size()) return bad("audit", "unknown audit");
  if (x.runners.max != 0 || x.runners.min != 0) {
    if (x.runners.min < 1)
      return bad("runners.min", "must be at least 1, got " + std::to_string(x.runners.min));
    if (x.runners.max < x.runners.min)
      return bad("runners.max", "must be at least min (" + std::to_string(x.runners.min) +
                                    "), got " + std::to_string(x.runners.max));
    if (x.max_concurrent < x.runners.min || x.max_concurrent > x.runners.max)
      return bad("max_concurrent", "the initial runners must be within [min, max], got " +
                                       std::to_string(x.max_concurrent));
    if (static_cast<size_t>(x.runners.restart) >= restart_names.size())
      return bad("runners.restart", "unknown restart mode");
  }
  if (x.keep_terminal < 1)
    return bad("keep_terminal", "must be at least 1, got " + std::to_string(x.keep_terminal));
  for (size_t i = 0; i < x.remote.nodes.size(); ++i)
    if (x.remote.nodes[i].empty())
      return bad("remote.nodes[" + std::to_string(i) + "]", "a node name is not empty");
  return {};
}

caf::expected<pool_spec> pool_spec_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return bad("spec", "a pool spec is a JSON object");
  if (auto err = only_keys(j, {"name", "max_concurrent", "scope", "queue", "backpressure",
                               "keep_terminal", "audit", "runners", "remote"},
                           ""))
    return err;
  pool_spec out;
  if (auto i = j.find("name"); i != j.end()) {
    if (!i->is_string()) return bad("name", "must be a string");
    out.name = i->get<std::string>();
  }
  if (auto err = read_int(j, "max_concurrent", "max_concurrent", out.max_concurrent)) return err;
  if (auto err = read_name(j, "scope", "scope", scope_names, out.scope)) return err;
  if (auto err = read_int(j, "keep_terminal", "keep_terminal", out.keep_terminal)) return err;
  if (auto err = read_name(j, "audit", "audit", audit_names, out.audit)) return err;
  if (auto i = j.find("runners"); i != j.end()) {
    const auto& r = *i;
    if (!r.is_object()) return bad("runners", "must be an object {min, max, initial, restart}");
    if (auto err = only_keys(r, {"min", "max", "initial", "restart"}, "runners.")) return err;
    if (auto err = read_int(r, "min", "runners.min", out.runners.min)) return err;
    if (auto err = read_int(r, "max", "runners.max", out.runners.max)) return err;
    if (auto err = read_int(r, "initial", "runners.initial", out.max_concurrent)) return err;
    if (auto err = read_name(r, "restart", "runners.restart", restart_names, out.runners.restart))
      return err;
  }
  if (auto i = j.find("remote"); i != j.end()) {
    const auto& r = *i;
    if (!r.is_object()) return bad("remote", "must be an object {nodes, retry_on_node_down}");
    if (auto err = only_keys(r, {"nodes", "retry_on_node_down"}, "remote.")) return err;
    if (auto n = r.find("nodes"); n != r.end()) {
      if (!n->is_array()) return bad("remote.nodes", "must be an array of node names");
      for (size_t k = 0; k < n->size(); ++k) {
        if (!(*n)[k].is_string())
          return bad("remote.nodes[" + std::to_string(k) + "]", "must be a string");
        out.remote.nodes.push_back((*n)[k].get<std::string>());
      }
    }
    if (auto b = r.find("retry_on_node_down"); b != r.end()) {
      if (!b->is_boolean()) return bad("remote.retry_on_node_down", "must be true or false");
      out.remote.retry_on_node_down = b->get<bool>();
    }
  }
  if (auto i = j.find("queue"); i != j.end()) {
    const auto& q = *i;
    if (q.is_string()) { // "queue": "fifo"
      if (auto err = read_name(nlohmann::json{{"strategy", q}}, "strategy", "queue.strategy",
                               queue_names, out.queue.kind))
        return err;
    } else if (q.is_object()) {
      if (auto err = only_keys(q, {"strategy", "key"}, "queue.")) return err;
      if (auto err = read_name(q, "strategy", "queue.strategy", queue_names, out.queue.kind))
        return err;
      if (auto k = q.find("key"); k != q.end()) {
        if (!k->is_string()) return bad("queue.key", "must be a string");
        out.queue.key = k->get<std::string>();
      }
    } else {
      return bad("queue", "must be a strategy name or an object {strategy, key}");
    }
  }
  if (auto i = j.find("backpressure"); i != j.end()) {
    const auto& b = *i;
    if (b.is_string()) {
      if (auto err = read_name(nlohmann::json{{"policy", b}}, "policy", "backpressure.policy",
                               backpressure_names, out.backpressure.kind))
        return err;
    } else if (b.is_object()) {
      if (auto err = only_keys(b, {"policy", "max_depth", "on_full", "capacity"}, "backpressure."))
        return err;
      if (auto err = read_name(b, "policy", "backpressure.policy", backpressure_names,
                               out.backpressure.kind))
        return err;
      if (auto err = read_int(b, "max_depth", "backpressure.max_depth",
                              out.backpressure.max_depth))
        return err;
      if (auto err = read_name(b, "on_full", "backpressure.on_full", on_full_names,
                               out.backpressure.on_full))
        return err;
      if (auto err = read_int(b, "capacity", "backpressure.capacity", out.backpressure.capacity))
        return err;
    } else {
      return bad("backpressure", "must be a policy name or an object {policy, ...}");
    }
  }
  if (auto err = check_pool_spec(out)) return err;
  return out;
}

nlohmann::json to_json(const pool_spec& x) {
  nlohmann::json q{{"strategy", std::string{to_string(x.queue.kind)}}};
  if (!x.queue.key.empty()) q["key"] = x.queue.key;
  nlohmann::json b{{"policy", std::string{to_string(x.backpressure.kind)}}};
  if (x.backpressure.kind == pool_backpressure_kind::queue) {
    b["max_depth"] = x.backpressure.max_depth;
    b["on_full"] = std::string{to_string(x.backpressure.on_full)};
  } else if (x.backpressure.kind == pool_backpressure_kind::ring_buffer) {
    b["capacity"] = x.backpressure.capacity;
  }
  return {{"name", x.name},
          {"max_concurrent", x.max_concurrent},
          {"scope", std::string{to_string(x.scope)}},
          {"queue", q},
          {"backpressure", b},
          {"keep_terminal", x.keep_terminal},
          {"audit", std::string{to_string(x.audit)}},
          {"runners",
           {{"min", x.runners.min},
            {"max", x.runners.max},
            {"initial", x.max_concurrent},
            {"restart", std::string{to_string(x.runners.restart)}}}},
          {"remote",
           {{"nodes", x.remote.nodes}, {"retry_on_node_down", x.remote.retry_on_node_down}}}};
}

nlohmann::json to_json(const pool_task_snapshot& x) {
  nlohmann::json j{{"id", x.id},
                   {"status", std::string{to_string(x.status)}},
                   {"submitted_at_ms", x.submitted_at_ms},
                   {"priority", x.priority},
                   {"key", x.key},
                   {"idempotency_key", x.idempotency_key},
                   {"rejection_reason", x.rejection_reason},
                   {"rejection_policy", x.rejection_policy},
                   {"stale", x.stale},
                   {"result", x.result_json}};
  if (x.error) {
    nlohmann::json e{{"text", render(x.error)}};
    if (x.error.category() == error_category()) {
      e["errc"] = x.error.code();
      e["field"] = field_of(x.error);
      e["detail"] = detail_of(x.error);
    }
    j["error"] = std::move(e);
  }
  return j;
}

caf::expected<pool_task_snapshot> pool_task_snapshot_from_json(const nlohmann::json& j) {
  auto bad = [](std::string field) {
    return make_error(errc::invalid_payload, std::move(field), "not a pool task record");
  };
  if (!j.is_object()) return bad("record");
  pool_task_snapshot x;
  try {
    x.id = j.at("id").get<uint64_t>();
    auto status = j.at("status").get<std::string>();
    bool known = false;
    for (size_t k = 0; k < status_names.size(); ++k)
      if (status_names[k] == status) {
        x.status = static_cast<pool_task_status>(k);
        known = true;
      }
    if (!known) return bad("status");
    x.submitted_at_ms = j.value("submitted_at_ms", int64_t{0});
    x.priority = j.value("priority", int64_t{0});
    x.key = j.value("key", std::string{});
    x.idempotency_key = j.value("idempotency_key", std::string{});
    x.rejection_reason = j.value("rejection_reason", std::string{});
    x.rejection_policy = j.value("rejection_policy", std::string{});
    x.stale = j.value("stale", false);
    if (auto r = j.find("result"); r != j.end()) x.result_json = *r;
    if (auto e = j.find("error"); e != j.end() && e->is_object()) {
      if (auto c = e->find("errc"); c != e->end() && c->is_number_unsigned() && c->get<unsigned>() > 0)
        x.error = make_error(static_cast<errc>(c->get<unsigned>()), e->value("field", std::string{}),
                             e->value("detail", std::string{}));
      else
        x.error = make_error(errc::task_failed, "error", e->value("text", std::string{}));
    }
  } catch (const std::exception&) {
    return bad("record");
  }
  return x;
}

std::string pool_id_of(pool_scope scope, std::string_view scope_id, std::string_view name) {
  // FNV-1a, 64 bits, over "scope\0scope_id\0name": stable across processes and builds.
  uint64_t h = 14695981039346656037ull;
  auto mix = [&h](std::string_view s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
    h ^= 0;
    h *= 1099511628211ull;
  };
  mix(to_string(scope));
  mix(scope_id);
  mix(name);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

} // namespace troupe
