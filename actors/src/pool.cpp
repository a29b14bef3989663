#include "troupe/actors/pool.hpp"

#include "troupe/actors/channel.hpp"
#include "troupe/actors/detail/task_actor.hpp"

namespace troupe {

namespace detail {

namespace {

using namespace troupe::atoms;

/// Returns the scope id of a pool opened from `cx`: the runtime's session id, or the
/// task-local `pipeline_id` (an error without one).
caf::expected<std::string> pool_scope_id(context& cx, pool_scope scope) {
  switch (scope) {
    case pool_scope::session:
      return access::impl(cx)->env().session_id;
    case pool_scope::pipeline:
      if (auto p = cx.local<std::string>("pipeline_id"); p && !p->empty()) return *p;
      return make_error(errc::no_scope_context, "scope",
                        "a pipeline pool needs an active pipeline (task-local \"pipeline_id\")");
    case pool_scope::tenant:
    case pool_scope::org:
      break;
  }
  return make_error(errc::pool_scope_unsupported, "scope",
                    "scope \"" + std::string{to_string(scope)} +
                        "\" needs a host (a multi-tenant server); in-process pools are "
                        "session or pipeline");
}

} // namespace

task<caf::expected<pool>> pool_open_impl(context& cx, pool_spec spec, bool create) {
  if (spec.name.empty())
    co_return make_error(errc::invalid_pool_spec, "name", "a pool needs a name");
  if (create)
    if (auto err = check_pool_spec(spec)) co_return err;
  auto sid = pool_scope_id(cx, spec.scope);
  if (!sid) co_return std::move(sid.error());
  auto id = pool_id_of(spec.scope, *sid, spec.name);
  primitive_spec ps;
  ps.kind = primitive_kind::pool;
  ps.key = "pool|" + std::string{to_string(spec.scope)} + "|" + *sid + "|" + spec.name;
  ps.name = spec.name;
  ps.create = create;
  ps.pool_id = id;
  auto name = spec.name;
  if (create) ps.pool = std::move(spec);
  auto a = co_await open_primitive(cx, std::move(ps));
  if (!a) {
    if (is(a.error(), errc::not_found))
      co_return make_error(errc::unknown_pool, "name", "no pool \"" + name + "\" is open");
    co_return std::move(a.error());
  }
  // A pipeline pool reloads its records first; a session pool answers at once.
  auto ready = co_await cx.request(caf::actor_cast<pool_actor_type>(*a), pool_ready_atom::value);
  if (!ready) co_return std::move(ready.error());
  co_return pool{std::move(*a), std::move(name), std::move(id)};
}

task<caf::expected<std::vector<pool_snapshot>>> pool_list_impl(context& cx) {
  auto& reg = access::impl(cx)->env().registry;
  if (!reg) co_return make_error(errc::runtime_stopped, "registry", "the runtime is stopping");
  auto all = co_await cx.request<std::vector<caf::actor>>(reg, reg_list_atom::value,
                                                          primitive_kind::pool);
  if (!all) co_return std::move(all.error());
  std::vector<pool_snapshot> out;
  for (auto& a : *all) {
    auto s = co_await cx.request(caf::actor_cast<pool_actor_type>(a), pool_stats_atom::value);
    if (s) out.push_back(std::move(*s)); // a pool that ended meanwhile is not listed
  }
  std::sort(out.begin(), out.end(),
            [](const pool_snapshot& x, const pool_snapshot& y) { return x.name < y.name; });
  co_return out;
}

task<caf::expected<pool>> pool_find_impl(context& cx, std::string id) {
  auto& reg = access::impl(cx)->env().registry;
  if (!reg) co_return make_error(errc::runtime_stopped, "registry", "the runtime is stopping");
  auto all = co_await cx.request<std::vector<caf::actor>>(reg, reg_list_atom::value,
                                                          primitive_kind::pool);
  if (!all) co_return std::move(all.error());
  for (auto& a : *all) {
    auto s = co_await cx.request(caf::actor_cast<pool_actor_type>(a), pool_stats_atom::value);
    if (s && s->id == id) co_return pool{a, s->name, s->id};
  }
  co_return make_error(errc::unknown_pool, "id", "no open pool has id \"" + id + "\"");
}

pool_submission make_submission(context& cx, std::shared_ptr<pool_body> body,
                                const submit_options& opts) {
  pool_submission sub;
  sub.body = std::move(body);
  sub.priority = opts.priority;
  if (opts.key) {
    sub.key = *opts.key;
    sub.has_key = true;
  }
  sub.idempotency_key = opts.idempotency_key;
  sub.locals = access::impl(cx)->locals();
  if (auto d = cx.current_deadline()) sub.deadline_ns = d->time_since_epoch().count();
  return sub;
}

std::shared_ptr<const pool_task_snapshot> pool_try_post(context& cx, const caf::actor& p,
                                                        std::shared_ptr<pool_body>& body,
                                                        const submit_options& opts) {
  if (!body || !opts.idempotency_key.empty()) return nullptr;
  auto* self = access::impl(cx);
  auto* l = self->find_link(p.id());
  if (l == nullptr || l->credits <= 0) return nullptr;
  --l->credits;
  auto made = recycler::make_shared<pool_task_snapshot>(); // built in place, never moved
  auto& snap = *made;
  snap.id = l->next_id++;
  snap.status = pool_task_status::queued;
  auto now_ns = cx.now().time_since_epoch().count();
  snap.submitted_at_ms = now_ns / 1'000'000;
  snap.priority = opts.priority;
  if (opts.key) snap.key = *opts.key;
  auto sub = make_submission(cx, std::move(body), opts);
  sub.submitted_ns = now_ns; // the pool records the same submit time
  // Queued with the task's other one-way sends: they go out together when it suspends.
  self->post(p, caf::make_message(pool_post_atom::value, snap.id, std::move(sub)));
  return made;
}

void pool_withdraw(context& cx, const caf::actor& p) noexcept {
  // From the task itself: the pool finds the blocked submit by its sender.
  if (p) access::impl(cx)->send(p, atoms::pool_withdraw_atom::value);
}

void pool_keep_credits(context& cx, const caf::actor& p, const pool_ack& ack) {
  if (ack.credits <= 0) return;
  auto& l = access::impl(cx)->link(p);
  l.credits = ack.credits; // asked for only when none were left
  l.next_id = ack.first_id;
}

} // namespace detail

task<caf::expected<pool>> open_pool(context& cx, nlohmann::json spec) {
  auto s = pool_spec_from_json(spec);
  if (!s) co_return std::move(s.error());
  co_return co_await detail::pool_open_impl(cx, std::move(*s), true);
}

caf::expected<submit_options> submit_options_from_json(const nlohmann::json& j) {
  auto bad = [](std::string field, std::string detail) {
    return make_error(errc::invalid_pool_spec, std::move(field), std::move(detail));
  };
  if (!j.is_object()) return bad("options", "submit options are a JSON object");
  submit_options out;
  for (auto& [k, v] : j.items()) {
    if (k == "priority") {
      if (v.is_number_integer()) {
        out.priority = v.get<int64_t>();
      } else if (v.is_string()) {
        auto s = v.get<std::string>();
        size_t used = 0;
        try {
          out.priority = std::stoll(s, &used);
        } catch (...) {
          used = 0;
        }
        if (used == 0 || used != s.size())
          return bad("priority", "\"" + s + "\" is not an integer");
      } else {
        return bad("priority", std::string{"must be an integer, got "} + v.type_name());
      }
    } else if (k == "key") {
      if (!v.is_string()) return bad("key", "must be a string");
      out.key = v.get<std::string>();
    } else if (k == "idempotency_key") {
      if (!v.is_string()) return bad("idempotency_key", "must be a string");
      out.idempotency_key = v.get<std::string>();
    } else {
      return bad(k, "unknown key");
    }
  }
  return out;
}

} // namespace troupe
