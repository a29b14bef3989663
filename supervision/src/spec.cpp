#include "troupe/supervision/spec.hpp"

#include <cmath>
#include <string_view>
#include <unordered_set>

#include "troupe/messages/errc.hpp"

namespace troupe {

namespace {

caf::error bad(std::string field, std::string detail) {
  return make_error(errc::invalid_spec, std::move(field), std::move(detail));
}

using json = nlohmann::json;

caf::error read_int(const json& obj, const std::string& key, const std::string& field,
                    int64_t& out) {
  auto i = obj.find(key);
  if (i == obj.end()) return {};
  if (!i->is_number_integer())
    return bad(field, std::string{"expected an integer, got "} + i->type_name());
  out = i->get<int64_t>();
  return {};
}

} // namespace

caf::error validate_child(const child_spec& c, const std::string& at,
                          troupe::auto_shutdown mode) {
  if (c.name.empty()) return bad(at + ".name", "a child needs a name");
  if (!c.start) return bad(at + ".start", "child \"" + c.name + "\" has no start function");
  if (static_cast<uint8_t>(c.restart) > static_cast<uint8_t>(restart_mode::never))
    return bad(at + ".restart", "unknown restart mode " +
                                    std::to_string(static_cast<int>(c.restart)));
  if (c.kind && static_cast<uint8_t>(*c.kind) > static_cast<uint8_t>(child_kind::supervisor))
    return bad(at + ".type", "unknown child type " + std::to_string(static_cast<int>(*c.kind)));
  if (c.shutdown_ms && *c.shutdown_ms < 0) return bad(at + ".shutdown_ms", "cannot be negative");
  if (c.max_restarts < 0) return bad(at + ".max_restarts", "cannot be negative");
  if (c.window_ms <= 0) return bad(at + ".window_ms", "must be positive");
  if (c.backoff_ms < 0) return bad(at + ".backoff_ms", "cannot be negative");
  if (!(c.factor >= 1.0) || !std::isfinite(c.factor))
    return bad(at + ".factor", "must be a finite number >= 1");
  if (c.max_backoff_ms < c.backoff_ms)
    return bad(at + ".max_backoff_ms", "must be at least backoff_ms");
  if (c.jitter_ms < 0) return bad(at + ".jitter_ms", "cannot be negative");
  if (c.circuit_open_ms < 0) return bad(at + ".circuit_open_ms", "cannot be negative");
  if (c.significant && c.restart == restart_mode::always)
    return bad(at + ".significant", "a significant child cannot restart always (permanent)");
  if (c.significant && mode == auto_shutdown::never)
    return bad(at + ".significant", "significant children need auto_shutdown other than never");
  return {};
}

child_spec spec_of(const child_template& t) {
  child_spec c;
  c.name = t.name;
  c.restart = t.restart;
  c.shutdown_ms = t.shutdown_ms;
  c.brutal_kill = t.brutal_kill;
  c.kind = t.kind;
  c.max_restarts = t.max_restarts;
  c.window_ms = t.window_ms;
  c.backoff_ms = t.backoff_ms;
  c.factor = t.factor;
  c.max_backoff_ms = t.max_backoff_ms;
  c.jitter_ms = t.jitter_ms;
  c.circuit_open_ms = t.circuit_open_ms;
  return c;
}

caf::error validate(const supervisor_spec& spec) {
  if (spec.name.empty()) return bad("name", "a supervisor needs a name");
  if (static_cast<uint8_t>(spec.strategy) > static_cast<uint8_t>(strategy::escalate_to_parent))
    return bad("strategy",
               "unknown strategy " + std::to_string(static_cast<int>(spec.strategy)));
  if (static_cast<uint8_t>(spec.auto_shutdown) >
      static_cast<uint8_t>(auto_shutdown::all_significant))
    return bad("auto_shutdown",
               "unknown auto_shutdown " + std::to_string(static_cast<int>(spec.auto_shutdown)));
  if (spec.intensity < 0)
    return bad("intensity", "cannot be negative, got " + std::to_string(spec.intensity));
  if (spec.period_ms <= 0)
    return bad("period_ms", "must be positive, got " + std::to_string(spec.period_ms));
  std::unordered_set<std::string_view> names; // O(1) per child (a set of strings: O(log n))
  names.reserve(spec.children.size());
  for (size_t i = 0; i < spec.children.size(); ++i) {
    auto& c = spec.children[i];
    auto at = "children[" + std::to_string(i) + "]";
    if (auto err = validate_child(c, at, spec.auto_shutdown)) return err;
    if (!names.insert(c.name).second)
      return bad(at + ".name", "duplicate child name \"" + c.name + "\"");
  }
  if (spec.child_template) {
    auto& t = *spec.child_template;
    if (!spec.children.empty())
      return bad("children", "a supervisor with a child_template has no static children");
    if (spec.strategy != strategy::one_for_one)
      return bad("strategy", "a supervisor with a child_template is one_for_one");
    // OTP 27 refuses auto_shutdown for simple_one_for_one: its children are not significant.
    if (spec.auto_shutdown != auto_shutdown::never)
      return bad("auto_shutdown",
                 "a supervisor with a child_template has no significant children: "
                 "auto_shutdown is never");
    if (!t.start) return bad("child_template.start", "the child template has no start function");
    auto c = spec_of(t);
    // validate_child wants a start function: the template's is checked above.
    c.start = [](caf::actor_system&) -> start_result { return std::optional<caf::actor>{}; };
    if (auto err = validate_child(c, "child_template", spec.auto_shutdown)) return err;
  }
  return {};
}

namespace {

/// Reads the keys a child spec and a child template share into `cs`; `start` reads "start".
template <class Child, class ReadStart>
caf::error read_child(const json& c, const std::string& at, Child& cs, ReadStart start) {
  if (!c.is_object()) return bad(at, "expected an object");
  for (auto& [ck, cv] : c.items()) {
    auto field = at + "." + ck;
    if (ck == "name") {
      if (!cv.is_string()) return bad(field, "expected a string");
      cs.name = cv.get<std::string>();
    } else if (ck == "start") {
      if (!cv.is_string()) return bad(field, "expected the name of a start function");
      if (auto err = start(cv.get<std::string>(), field)) return err;
    } else if (ck == "restart") {
      auto s = cv.is_string() ? cv.get<std::string>() : std::string{};
      if (s == "always")
        cs.restart = restart_mode::always;
      else if (s == "on_failure")
        cs.restart = restart_mode::on_failure;
      else if (s == "never")
        cs.restart = restart_mode::never;
      else
        return bad(field, "unknown restart mode " + cv.dump());
    } else if (ck == "type") {
      auto s = cv.is_string() ? cv.get<std::string>() : std::string{};
      if (s == "worker")
        cs.kind = child_kind::worker;
      else if (s == "supervisor")
        cs.kind = child_kind::supervisor;
      else
        return bad(field, "unknown child type " + cv.dump() + " (worker or supervisor)");
    } else if (ck == "shutdown") {
      if (cv == "brutal_kill")
        cs.brutal_kill = true;
      else if (cv == "infinity")
        cs.shutdown_ms = infinity;
      else
        return bad(field, "expected \"brutal_kill\" or \"infinity\" (or use shutdown_ms)");
    } else if (ck == "significant") {
      if constexpr (std::is_same_v<Child, child_spec>) {
        if (!cv.is_boolean()) return bad(field, "expected a boolean");
        cs.significant = cv.get<bool>();
      } else {
        return bad(field, "unknown key");
      }
    } else if (ck == "factor") {
      if (!cv.is_number()) return bad(field, "expected a number");
      cs.factor = cv.get<double>();
    } else if (ck == "shutdown_ms") {
      int64_t v = 0;
      if (auto err = read_int(c, ck, field, v)) return err;
      cs.shutdown_ms = v;
    } else if (ck == "max_restarts" || ck == "window_ms" || ck == "backoff_ms" ||
               ck == "max_backoff_ms" || ck == "jitter_ms" || ck == "circuit_open_ms") {
      int64_t* slot = ck == "max_restarts"     ? &cs.max_restarts
                      : ck == "window_ms"      ? &cs.window_ms
                      : ck == "backoff_ms"     ? &cs.backoff_ms
                      : ck == "max_backoff_ms" ? &cs.max_backoff_ms
                      : ck == "jitter_ms"      ? &cs.jitter_ms
                                               : &cs.circuit_open_ms;
      if (auto err = read_int(c, ck, field, *slot)) return err;
    } else {
      return bad(field, "unknown key");
    }
  }
  return {};
}

} // namespace

caf::expected<supervisor_spec>
spec_from_json(const json& doc, const std::map<std::string, start_fn>& factories,
               const std::map<std::string, template_start_fn>& template_factories) {
  if (!doc.is_object())
    return bad("", std::string{"expected a JSON object, got "} + doc.type_name());
  supervisor_spec spec;
  for (auto& [key, v] : doc.items()) {
    if (key == "name") {
      if (!v.is_string()) return bad("name", "expected a string");
      spec.name = v.get<std::string>();
    } else if (key == "strategy") {
      auto s = v.is_string() ? v.get<std::string>() : std::string{};
      if (s == "one_for_one")
        spec.strategy = strategy::one_for_one;
      else if (s == "one_for_all")
        spec.strategy = strategy::one_for_all;
      else if (s == "rest_for_one")
        spec.strategy = strategy::rest_for_one;
      else if (s == "escalate_to_parent")
        spec.strategy = strategy::escalate_to_parent;
      else
        return bad("strategy", "unknown strategy " + v.dump());
    } else if (key == "auto_shutdown") {
      auto a = v.is_string() ? v.get<std::string>() : std::string{};
      if (a == "never")
        spec.auto_shutdown = auto_shutdown::never;
      else if (a == "any_significant")
        spec.auto_shutdown = auto_shutdown::any_significant;
      else if (a == "all_significant")
        spec.auto_shutdown = auto_shutdown::all_significant;
      else
        return bad("auto_shutdown", "unknown auto_shutdown " + v.dump());
    } else if (key == "intensity" || key == "period_ms") {
      if (auto err = read_int(doc, key, key, key == "intensity" ? spec.intensity : spec.period_ms))
        return err;
    } else if (key == "keep_ended_temporaries") {
      int64_t n = 0;
      if (auto err = read_int(doc, key, key, n)) return err;
      if (n < 0) return bad(key, "cannot be negative");
      spec.keep_ended_temporaries = static_cast<size_t>(n);
    } else if (key == "children") {
      if (!v.is_array()) return bad("children", "expected an array");
      for (size_t i = 0; i < v.size(); ++i) {
        child_spec cs;
        auto err = read_child(v[i], "children[" + std::to_string(i) + "]", cs,
                              [&](const std::string& name, const std::string& field) {
                                auto f = factories.find(name);
                                if (f == factories.end())
                                  return bad(field, "no start function named \"" + name + "\"");
                                cs.start = f->second;
                                return caf::error{};
                              });
        if (err) return err;
        spec.children.push_back(std::move(cs));
      }
    } else if (key == "child_template") {
      child_template t;
      auto err = read_child(v, "child_template", t,
                            [&](const std::string& name, const std::string& field) {
                              auto f = template_factories.find(name);
                              if (f == template_factories.end())
                                return bad(field,
                                           "no template start function named \"" + name + "\"");
                              t.start = f->second;
                              return caf::error{};
                            });
      if (err) return err;
      spec.child_template = std::move(t);
    } else {
      return bad(key, "unknown key");
    }
  }
  if (auto err = validate(spec)) return err;
  return spec;
}

int64_t restart_delay_ms(const child_spec& c, uint64_t attempt) noexcept {
  return restart_delay_ms(c, c.name, attempt);
}

int64_t restart_delay_ms(const child_spec& c, const std::string& name, uint64_t attempt) noexcept {
  if (attempt == 0) return 0;
  int64_t delay = 0;
  if (c.backoff_ms > 0) {
    // factor^(attempt-1) overflows to infinity for large attempts: clamp before multiplying
    // (0 * inf would be NaN); a double at or above 2^63 does not convert to int64_t.
    double growth = std::pow(c.factor, double(attempt - 1));
    double base = std::isfinite(growth) ? static_cast<double>(c.backoff_ms) * growth
                                        : static_cast<double>(c.max_backoff_ms);
    base = std::min(base, static_cast<double>(c.max_backoff_ms));
    delay = base >= 9.2e18 ? c.max_backoff_ms : static_cast<int64_t>(base);
  }
  if (c.jitter_ms > 0) {
    // FNV-1a over (name, attempt): no random source, so a replay waits the same.
    uint64_t h = 1469598103934665603ull;
    for (unsigned char ch : name)
      h = (h ^ ch) * 1099511628211ull;
    for (int i = 0; i < 8; ++i)
      h = (h ^ ((attempt >> (8 * i)) & 0xff)) * 1099511628211ull;
    auto span = c.jitter_ms == infinity ? static_cast<uint64_t>(infinity)
                                        : static_cast<uint64_t>(c.jitter_ms) + 1;
    delay = saturating_add(delay, static_cast<int64_t>(h % span));
  }
  return delay;
}

} // namespace troupe
