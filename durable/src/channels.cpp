#include "troupe/durable/channels.hpp"

#include <caf/all.hpp>

#include "services.hpp"
#include "text.hpp"
#include "troupe/messages/errc.hpp"

namespace troupe {

namespace {

using namespace troupe::atoms;

caf::error bad_name(std::string_view name, std::string why) {
  return make_error(errc::invalid_channel_name, "name", "\"" + std::string{name} + "\": " + why);
}

/// Returns "" when `x` is valid UTF-8 without control characters, else what is wrong.
std::string check_text(std::string_view x) {
  for (auto c : x)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return "has a control character";
  return detail::valid_utf8(x) ? std::string{} : std::string{"is not valid UTF-8"};
}

/// Reads a task-local string (a `std::string` or a C string); present with another type is
/// an error rather than a silent fallback to the default scope.
caf::expected<std::string> string_local(context& cx, std::string_view key) {
  if (auto x = cx.local<std::string>(key)) return std::move(*x);
  if (auto x = cx.local<const char*>(key)) return std::string{*x != nullptr ? *x : ""};
  if (auto x = cx.local<std::string_view>(key)) return std::string{*x};
  if (cx.has_local(key))
    return make_error(errc::invalid_scope, std::string{key},
                      "the task-local \"" + std::string{key} + "\" is not a string");
  return std::string{};
}

/// Resolves from a task.
caf::expected<channel_name> resolve_in(context& cx, std::string_view name, bool selector) {
  auto sc = channel_scope_of(cx);
  if (!sc) return std::move(sc.error());
  return resolve_channel_name(name, *sc, selector);
}

} // namespace

std::string channel_name::resolved() const {
  return scope + ":" + scope_id + ":" + name;
}

caf::expected<channel_name> resolve_channel_name(std::string_view name, const channel_scope& sc,
                                                 bool selector) {
  if (name.empty()) return bad_name(name, "a channel name cannot be empty");
  std::vector<std::string_view> segs;
  for (size_t pos = 0;;) {
    auto colon = name.find(':', pos);
    segs.push_back(name.substr(pos, colon == std::string_view::npos ? colon : colon - pos));
    if (colon == std::string_view::npos) break;
    pos = colon + 1;
  }
  for (auto& s : segs)
    if (s.empty()) return bad_name(name, "has an empty segment");
  channel_name out;
  std::string_view explicit_id;
  std::string_view local;
  auto first = segs.front();
  bool scoped = first == "session" || first == "pipeline" || first == "tenant" || first == "org";
  if (!scoped) {
    if (segs.size() > 1)
      return bad_name(name,
                      "unknown scope \"" + std::string{first} + "\" (session, pipeline or tenant)");
    out.scope = "tenant";
    local = first;
  } else {
    if (first == "org")
      return make_error(errc::scope_reserved, "name",
                        "\"" + std::string{name} + "\": the org scope is reserved");
    if (segs.size() == 1) return bad_name(name, "a scope prefix needs a name after it");
    if (segs.size() > 3) return bad_name(name, "has more than <scope>:<id>:<name>");
    out.scope = std::string{first};
    if (segs.size() == 3) explicit_id = segs[1];
    local = segs.back();
  }
  if (local.size() > max_channel_name_bytes)
    return bad_name(name, "a name has at most " + std::to_string(max_channel_name_bytes) +
                              " bytes, got " + std::to_string(local.size()));
  if (explicit_id.size() > max_scope_id_bytes)
    return bad_name(name, "a scope id has at most " + std::to_string(max_scope_id_bytes) +
                              " bytes, got " + std::to_string(explicit_id.size()));
  if (auto why = check_text(name); !why.empty()) return bad_name(name, why);
  for (size_t pos = 0;;) { // `.` separates the parts of a name; none may be empty
    auto dot = local.find('.', pos);
    auto part = local.substr(pos, dot == std::string_view::npos ? dot : dot - pos);
    if (part.empty()) return bad_name(name, "has an empty '.' segment");
    if (dot == std::string_view::npos) break;
    pos = dot + 1;
  }
  auto star = local.find('*');
  if (star != std::string_view::npos) {
    if (!selector) return bad_name(name, "'*' is only for selectors");
    if (star + 1 != local.size()) return bad_name(name, "'*' may only end a selector");
    out.prefix = true;
    local.remove_suffix(1);
  }
  out.name = std::string{local};
  auto conflict = [&](const std::string& active) {
    return make_error(errc::scope_conflict, "name",
                      "\"" + std::string{name} + "\" names " + out.scope + " \"" +
                          std::string{explicit_id} + "\" but the active " + out.scope + " is \"" +
                          active + "\"");
  };
  std::string active;
  if (out.scope == "session") {
    active = sc.session_id;
    if (!explicit_id.empty() && explicit_id != active) return conflict(active);
  } else if (out.scope == "pipeline") {
    active = sc.pipeline_id;
    if (active.empty()) // an explicit id too: a pipeline's channels are its own
      return make_error(errc::no_scope_context, "name",
                        "\"" + std::string{name} + "\" needs an active pipeline (task-local \"" +
                            std::string{pipeline_local} + "\")");
  } else {
    active = sc.tenant_id.empty() ? std::string{default_tenant} : sc.tenant_id;
    if (!explicit_id.empty() && !sc.tenant_id.empty() && explicit_id != sc.tenant_id)
      return conflict(sc.tenant_id);
  }
  if (!explicit_id.empty() && !active.empty() && explicit_id != active && out.scope != "tenant")
    return conflict(active);
  out.scope_id = explicit_id.empty() ? active : std::string{explicit_id};
  if (explicit_id.empty()) { // an id from the context: it must make a valid name too
    auto field = out.scope == "tenant" ? tenant_local : pipeline_local;
    auto why = check_text(out.scope_id);
    if (why.empty() && out.scope_id.find(':') != std::string::npos) why = "contains ':'";
    if (why.empty() && out.scope_id.size() > max_scope_id_bytes)
      why = "has more than " + std::to_string(max_scope_id_bytes) + " bytes";
    if (!why.empty())
      return make_error(errc::invalid_channel_name, std::string{field},
                        "the active " + out.scope + " id \"" + out.scope_id + "\" " + why);
  }
  return out;
}

caf::expected<channel_scope> channel_scope_of(context& cx) {
  channel_scope sc;
  sc.session_id = detail::access::impl(cx)->env().session_id;
  auto t = string_local(cx, tenant_local);
  if (!t) return std::move(t.error());
  sc.tenant_id = std::move(*t);
  auto p = string_local(cx, pipeline_local);
  if (!p) return std::move(p.error());
  sc.pipeline_id = std::move(*p);
  return sc;
}

task<caf::expected<channel_receipt>> durable_append(context& cx, std::string name,
                                                    nlohmann::json payload, append_options opts) {
  auto n = resolve_in(cx, name, false);
  if (!n) co_return std::move(n.error());
  if (!payload.is_object())
    co_return make_error(errc::invalid_payload, "payload",
                         std::string{"a channel payload is a JSON object, got "} +
                             payload.type_name());
  if (opts.id.size() > max_event_id_bytes)
    co_return make_error(errc::invalid_event_id, "id",
                         "an id has at most " + std::to_string(max_event_id_bytes) +
                             " bytes, got " + std::to_string(opts.id.size()));
  channel_write a;
  try {
    a.payload = payload.dump();
  } catch (const nlohmann::json::exception& e) { // a string that is not UTF-8
    co_return make_error(errc::invalid_payload, "payload", e.what());
  }
  a.name_resolved = n->resolved();
  a.scope = std::move(n->scope);
  a.scope_id = std::move(n->scope_id);
  a.id = std::move(opts.id);
  a.emitted_by = "task:" + cx.task_id();
  auto hub = co_await detail::find_hub(cx);
  if (!hub) co_return std::move(hub.error());
  co_return co_await cx.request<channel_receipt>(*hub, ch_append_atom::value, std::move(a));
}

task<caf::expected<std::vector<channel_event>>> durable_events(context& cx, std::string name,
                                                               events_options opts) {
  auto n = resolve_in(cx, name, false);
  if (!n) co_return std::move(n.error());
  if (opts.limit < 1) co_return make_error(errc::invalid_argument, "limit", "must be at least 1");
  auto hub = co_await detail::find_hub(cx);
  if (!hub) co_return std::move(hub.error());
  co_return co_await cx.request<std::vector<channel_event>>(
      *hub, ch_events_atom::value, n->resolved(), n->scope, opts.after, opts.limit);
}

task<caf::expected<bool>> durable_verify(context& cx, channel_receipt receipt) {
  auto hub = co_await detail::find_hub(cx);
  if (!hub) co_return std::move(hub.error());
  co_return co_await cx.request<bool>(*hub, ch_verify_atom::value, std::move(receipt));
}

caf::expected<channel_binding> parse_binding(const nlohmann::json& j, const channel_scope& sc) {
  auto bad = [](std::string field, std::string why) {
    return make_error(errc::invalid_binding, std::move(field), std::move(why));
  };
  if (!j.is_object()) return bad("binding", "a binding is a JSON object");
  for (auto& [k, v] : j.items())
    if (k != "channel" && k != "batch") return bad(k, "unknown field (channel, batch)");
  auto ch = j.find("channel");
  if (ch == j.end()) return bad("channel", "missing (\"channel:<selector>\")");
  if (!ch->is_string()) return bad("channel", "must be a string");
  auto sel = ch->get<std::string>();
  constexpr std::string_view prefix = "channel:";
  if (sel.compare(0, prefix.size(), prefix) != 0)
    return bad("channel", "\"" + sel + "\" must start with \"channel:\"");
  auto n = resolve_channel_name(std::string_view{sel}.substr(prefix.size()), sc, true);
  if (!n) return std::move(n.error());
  channel_binding b;
  b.selector = sel;
  b.scope = std::move(n->scope);
  b.scope_id = std::move(n->scope_id);
  b.pattern = std::move(n->name);
  b.prefix = n->prefix;
  auto batch = j.find("batch");
  if (batch == j.end()) return b;
  if (!batch->is_object()) return bad("batch", "must be an object");
  for (auto& [k, v] : batch->items())
    if (k != "count" && k != "window" && k != "key" && k != "expire_action")
      return bad("batch." + k, "unknown field (count, window, key, expire_action)");
  auto count = batch->find("count");
  if (count == batch->end()) return bad("batch.count", "missing");
  if (!count->is_number_integer()) return bad("batch.count", "must be an integer");
  if (count->get<int64_t>() <= 0) return bad("batch.count", "must be at least 1");
  b.count = count->get<int64_t>();
  if (auto w = batch->find("window"); w != batch->end()) {
    if (!w->is_number_integer()) return bad("batch.window", "must be an integer (ms)");
    if (w->get<int64_t>() <= 0) return bad("batch.window", "must be at least 1 (ms)");
    b.window_ms = w->get<int64_t>();
  }
  if (auto k = batch->find("key"); k != batch->end()) {
    if (!k->is_string()) return bad("batch.key", "must be a string (a payload field)");
    if (k->get<std::string>().empty()) return bad("batch.key", "cannot be empty");
    b.key = k->get<std::string>();
  }
  if (auto e = batch->find("expire_action"); e != batch->end()) {
    if (!e->is_string()) return bad("batch.expire_action", "must be a string");
    auto act = e->get<std::string>();
    if (act == "fire_partial")
      b.fire_partial = true;
    else if (act == "discard")
      b.fire_partial = false;
    else
      return bad("batch.expire_action", "\"" + act + "\": fire_partial or discard");
  }
  return b;
}

task<caf::expected<uint64_t>> durable_bind(context& cx, nlohmann::json binding,
                                           caf::actor handler) {
  auto sc = channel_scope_of(cx);
  if (!sc) co_return std::move(sc.error());
  auto b = parse_binding(binding, *sc);
  if (!b) co_return std::move(b.error());
  if (!handler) co_return make_error(errc::invalid_binding, "handler", "a binding needs a handler");
  b->handler = std::move(handler);
  auto hub = co_await detail::find_hub(cx);
  if (!hub) co_return std::move(hub.error());
  co_return co_await cx.request<uint64_t>(*hub, ch_bind_atom::value, std::move(*b));
}

task<caf::expected<uint64_t>> durable_bind(context& cx, nlohmann::json binding,
                                           std::function<void(const channel_match&)> handler) {
  if (!handler) co_return make_error(errc::invalid_binding, "handler", "a binding needs a handler");
  auto sc = channel_scope_of(cx);
  if (!sc) co_return std::move(sc.error());
  auto b = parse_binding(binding, *sc); // refused before anything is spawned
  if (!b) co_return std::move(b.error());
  auto actor = detail::access::impl(cx)->system().spawn([fn = std::move(handler)]() -> caf::behavior {
    return {[fn](ch_trigger_atom, const channel_match& m) { fn(m); }};
  });
  co_return co_await durable_bind(cx, std::move(binding), std::move(actor));
}

task<caf::expected<bool>> durable_unbind(context& cx, uint64_t binding) {
  auto hub = co_await detail::find_hub(cx);
  if (!hub) co_return std::move(hub.error());
  co_return co_await cx.request<bool>(*hub, ch_unbind_atom::value, binding);
}

task<caf::expected<uint64_t>> durable_flush(context& cx) {
  auto hub = co_await detail::find_hub(cx);
  if (!hub) co_return std::move(hub.error());
  co_return co_await cx.request<uint64_t>(*hub, ch_flush_atom::value);
}

task<caf::expected<channel_metrics>> durable_metrics_of(context& cx) {
  auto hub = co_await detail::find_hub(cx);
  if (!hub) co_return std::move(hub.error());
  co_return co_await cx.request<channel_metrics>(*hub, ch_metrics_atom::value);
}

} // namespace troupe
