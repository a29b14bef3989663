#include <caf/all.hpp>

#include "troupe/actors/channel.hpp"
#include "troupe/actors/mailbox.hpp"
#include "troupe/actors/shared.hpp"
#include "troupe/actors/sync.hpp"

namespace troupe {

namespace detail {

using namespace troupe::atoms;

task<caf::expected<caf::actor>> open_primitive(context& cx, primitive_spec spec) {
  auto& reg = detail::access::impl(cx)->env().registry;
  if (!reg)
    co_return make_error(errc::runtime_stopped, "registry",
                         "this runtime has no registry of named primitives");
  auto a = co_await cx.request<caf::actor>(reg, reg_open_atom::value, std::move(spec));
  if (!a && a.error() == caf::sec::request_receiver_down)
    co_return make_error(errc::runtime_stopped, "registry", "the runtime is stopping");
  co_return a;
}

caf::expected<std::string> scoped_key(context& cx, std::string_view kind, const std::string& scope,
                                      const std::string& tenant, const std::string& name) {
  if (name.empty()) return make_error(errc::invalid_name, "name", "a name cannot be empty");
  auto s = parse_scope(scope);
  if (!s)
    return make_error(errc::invalid_scope, "scope",
                      "unknown scope \"" + scope + "\"; known: task, task_group, process, tenant");
  std::string id;
  switch (*s) {
    case scope_kind::task:
      id = cx.task_id();
      break;
    case scope_kind::task_group:
      id = cx.task_group_id();
      break;
    case scope_kind::process:
      break;
    case scope_kind::tenant:
      id = tenant;
      if (id.empty())
        if (auto t = cx.local<std::string>("tenant_id")) id = *t;
      if (id.empty())
        return make_error(errc::invalid_scope, "tenant_id",
                          "tenant scope needs a tenant id (or a task-local \"tenant_id\")");
      break;
  }
  // The scope's id carries its length: ids and names may hold any character, `|` too, and
  // tenant "acme|eu"'s "jobs" must not be tenant "acme"'s "eu|jobs".
  std::string key{kind};
  key += '|';
  key += to_string(*s);
  key += '|';
  key += std::to_string(id.size());
  key += ':';
  key += id;
  key += '|';
  key += name;
  return key;
}

caf::actor_addr scope_owner(context& cx, const std::string& scope) {
  if (scope == "task") return caf::actor_cast<caf::actor_addr>(cx.self());
  return {};
}

task<caf::expected<mailbox>> mailbox_open_impl(context& cx, mailbox_spec spec, bool create) {
  auto key = scoped_key(cx, "mailbox", spec.scope, spec.tenant_id, spec.name);
  if (!key) co_return std::move(key.error());
  if (spec.capacity <= 0)
    co_return make_error(errc::invalid_capacity, "capacity",
                         "a mailbox holds at least 1 message, got " +
                             std::to_string(spec.capacity));
  if (spec.receive_batch == 0)
    co_return make_error(errc::invalid_argument, "receive_batch", "must be at least 1");
  primitive_spec ps;
  ps.kind = primitive_kind::mailbox;
  ps.key = std::move(*key);
  ps.name = spec.name;
  ps.capacity = spec.capacity;
  ps.owner = scope_owner(cx, spec.scope);
  ps.create = create;
  auto a = co_await open_primitive(cx, std::move(ps));
  if (!a) co_return std::move(a.error());
  // The address names the tenant the mailbox was opened for, also when it came from the
  // opener's task-local: a task of another tenant sending to it reaches this mailbox.
  auto tenant = spec.tenant_id;
  if (tenant.empty() && spec.scope == "tenant")
    if (auto t = cx.local<std::string>("tenant_id")) tenant = *t;
  co_return mailbox{std::move(*a), mailbox_address{spec.scope, std::move(tenant), spec.name},
                    spec.receive_batch};
}

task<caf::expected<caf::actor>> open_shared(context& cx, primitive_kind kind, std::string_view tag,
                                            shared_spec spec) {
  auto key = scoped_key(cx, tag, spec.scope, spec.tenant_id, spec.name);
  if (!key) co_return std::move(key.error());
  if (spec.initial && kind == primitive_kind::map && !spec.initial->is_object())
    co_return make_error(errc::invalid_argument, "initial",
                         std::string{"a map's initial value is a JSON object, got "} +
                             spec.initial->type_name());
  if (spec.initial && kind == primitive_kind::atomic && !spec.initial->is_number_integer())
    co_return make_error(errc::invalid_argument, "initial",
                         std::string{"an atomic's initial value is an integer, got "} +
                             spec.initial->type_name());
  if (spec.initial && kind == primitive_kind::atomic && spec.initial->is_number_unsigned() &&
      spec.initial->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    co_return make_error(errc::invalid_argument, "initial",
                         "an atomic holds a 64-bit signed integer; " + spec.initial->dump() +
                             " does not fit");
  primitive_spec ps;
  ps.initial = std::move(spec.initial);
  ps.kind = kind;
  ps.key = std::move(*key);
  ps.name = spec.name;
  ps.owner = scope_owner(cx, spec.scope);
  co_return co_await open_primitive(cx, std::move(ps));
}

/// An rwlock's capacity: a reader takes one permit, a writer all of them.
constexpr int64_t rw_capacity = int64_t{1} << 40;

task<caf::expected<sync_ref>> open_sync(context& cx, sync_kind kind, std::string key,
                                        int64_t capacity) {
  if (key.empty()) co_return make_error(errc::invalid_name, "key", "a key cannot be empty");
  if (capacity <= 0)
    co_return make_error(errc::invalid_capacity, kind == sync_kind::gate ? "limit" : "capacity",
                         "must be at least 1, got " + std::to_string(capacity));
  primitive_spec ps;
  ps.kind = primitive_kind::sync;
  ps.key = "sync|" + key;
  ps.name = key;
  ps.capacity = capacity;
  ps.sync = kind;
  auto a = co_await open_primitive(cx, std::move(ps));
  if (!a) co_return std::move(a.error());
  co_return sync_ref{std::move(*a), kind, std::move(key), capacity};
}

void acquire_awaiter::await_suspend(std::coroutine_handle<> h) {
  // A wait with neither timeout nor deadline is one the deadlock census counts (with the
  // channel waits: every live task stuck on either is a deadlock); a bounded one ends anyway.
  bool bounded = timeout_ns_ >= 0 || self_->deadline().has_value();
  if (!bounded) wait_kind_ = wait_kind::channel;
  seq_ = park(h);
  auto st = self_;
  auto seq = seq_;
  auto a = a_;
  self_->request(caf::actor_cast<sync_actor_type>(a_), caf::infinite, sy_acquire_atom::value, seq_, units_, bounded, timeout_ns_)
      .then(
          [st, seq, a](uint64_t id) {
            if (!st->is_parked(seq)) { // the acquirer gave up: give the permit back
              if (id != 0) caf::anon_send(a, sy_release_atom::value, id);
              return;
            }
            static_cast<acquire_awaiter*>(st->parked())->id_ = id;
            st->resume_parked();
          },
          [st, seq](caf::error& e) {
            if (!st->is_parked(seq)) return;
            static_cast<acquire_awaiter*>(st->parked())->err_ = std::move(e);
            st->resume_parked();
          });
}

void acquire_awaiter::on_abandon(task_actor* self) noexcept {
  self->send(a_, sy_withdraw_atom::value, seq_);
}

} // namespace detail

// -- shared values ----------------------------------------------------------------------------

namespace {

task<caf::expected<nlohmann::json>> value_of(context& cx, caf::actor a, std::string key) {
  auto v = co_await cx.request<versioned>(caf::actor_cast<shared_actor_type>(a), atoms::sh_get_atom::value, std::move(key));
  if (!v) co_return std::move(v.error());
  co_return std::move(v->value);
}

task<caf::expected<nlohmann::json>> set_value(context& cx, caf::actor a, std::string key,
                                              nlohmann::json value) {
  auto v = co_await cx.request<versioned>(caf::actor_cast<shared_actor_type>(a), atoms::sh_set_atom::value, std::move(key),
                                          std::move(value));
  if (!v) co_return std::move(v.error());
  co_return std::move(v->value);
}

} // namespace

task<caf::expected<nlohmann::json>> shared_cell::get(context& cx) const {
  return value_of(cx, a_, std::string{});
}

task<caf::expected<nlohmann::json>> shared_cell::set(context& cx, nlohmann::json value) const {
  return set_value(cx, a_, std::string{}, std::move(value));
}

task<caf::expected<nlohmann::json>> shared_map::get(context& cx, std::string key) const {
  return value_of(cx, a_, std::move(key));
}

task<caf::expected<nlohmann::json>> shared_map::set(context& cx, std::string key,
                                                    nlohmann::json value) const {
  return set_value(cx, a_, std::move(key), std::move(value));
}

namespace {

task<caf::expected<int64_t>> counter_value(context& cx, caf::actor a) {
  auto v = co_await value_of(cx, std::move(a), std::string{});
  if (!v) co_return std::move(v.error());
  co_return v->is_number_integer() ? v->get<int64_t>() : int64_t{0};
}

task<caf::expected<int64_t>> counter_set(context& cx, caf::actor a, int64_t value) {
  auto v = co_await set_value(cx, std::move(a), std::string{}, value);
  if (!v) co_return std::move(v.error());
  co_return v->is_number_integer() ? v->get<int64_t>() : int64_t{0};
}

} // namespace

task<caf::expected<int64_t>> atomic_counter::get(context& cx) const {
  return counter_value(cx, a_);
}

task<caf::expected<int64_t>> atomic_counter::set(context& cx, int64_t value) const {
  return counter_set(cx, a_, value);
}

task<caf::expected<shared_cell>> open_cell(context& cx, shared_spec spec) {
  auto a = co_await detail::open_shared(cx, primitive_kind::cell, "cell", std::move(spec));
  if (!a) co_return std::move(a.error());
  co_return shared_cell{std::move(*a)};
}

task<caf::expected<shared_map>> open_map(context& cx, shared_spec spec) {
  auto a = co_await detail::open_shared(cx, primitive_kind::map, "map", std::move(spec));
  if (!a) co_return std::move(a.error());
  co_return shared_map{std::move(*a)};
}

task<caf::expected<atomic_counter>> open_atomic(context& cx, shared_spec spec) {
  auto a = co_await detail::open_shared(cx, primitive_kind::atomic, "atomic", std::move(spec));
  if (!a) co_return std::move(a.error());
  co_return atomic_counter{std::move(*a)};
}

// -- synchronisation --------------------------------------------------------------------------

bool permit::release() noexcept {
  if (id_ == 0) return false;
  // What the holder sent under the permit goes out before the next holder can get in.
  if (auto self = detail::task_actor::current()) self->flush_posts();
  caf::anon_send(owner_, atoms::sy_release_atom::value, std::exchange(id_, 0));
  return true;
}

detail::acquire_awaiter sync_ref::acquire(context& cx, int64_t units, acquire_options opts) const {
  caf::error pre;
  if (!a_) pre = make_error(errc::invalid_handle, "sync", "the handle is empty");
  if (kind_ != sync_kind::semaphore && units != 1 && !pre)
    pre = make_error(errc::permits_exceed_capacity, "permits",
                     std::string{to_string(kind_)} + " permits are taken one at a time");
  if (opts.timeout && opts.timeout->count() < 0 && !pre)
    pre = make_error(errc::invalid_argument, "timeout", "a timeout cannot be negative");
  if (kind_ == sync_kind::rwlock) units = 1; // a read; writers go through the rw_mode form
  auto timeout_ns = opts.timeout ? static_cast<int64_t>(opts.timeout->count()) : int64_t{-1};
  return detail::acquire_awaiter{detail::access::impl(cx), a_, units, timeout_ns, std::move(pre)};
}

detail::acquire_awaiter sync_ref::acquire(context& cx, rw_mode mode, acquire_options opts) const {
  caf::error pre;
  if (!a_) pre = make_error(errc::invalid_handle, "sync", "the handle is empty");
  if (kind_ != sync_kind::rwlock && !pre)
    pre = make_error(errc::invalid_argument, "mode",
                     "read/write modes apply to an rwlock, not a " + std::string{to_string(kind_)});
  if (opts.timeout && opts.timeout->count() < 0 && !pre)
    pre = make_error(errc::invalid_argument, "timeout", "a timeout cannot be negative");
  auto units = mode == rw_mode::write ? detail::rw_capacity : int64_t{1};
  auto timeout_ns = opts.timeout ? static_cast<int64_t>(opts.timeout->count()) : int64_t{-1};
  return detail::acquire_awaiter{detail::access::impl(cx), a_, units, timeout_ns, std::move(pre)};
}

task<caf::expected<sync_ref>> open_mutex(context& cx, std::string key) {
  return detail::open_sync(cx, sync_kind::mutex, std::move(key), 1);
}

task<caf::expected<sync_ref>> open_rwlock(context& cx, std::string key) {
  return detail::open_sync(cx, sync_kind::rwlock, std::move(key), detail::rw_capacity);
}

task<caf::expected<sync_ref>> open_semaphore(context& cx, std::string key, int64_t capacity) {
  return detail::open_sync(cx, sync_kind::semaphore, std::move(key), capacity);
}

task<caf::expected<sync_ref>> open_gate(context& cx, std::string key, int64_t limit) {
  return detail::open_sync(cx, sync_kind::gate, std::move(key), limit);
}

task<caf::expected<permit>> lock(context& cx, std::string key, acquire_options opts) {
  auto s = co_await open_mutex(cx, std::move(key));
  if (!s) co_return std::move(s.error());
  co_return co_await s->acquire(cx, 1, opts);
}

task<caf::expected<permit>> lock_rw(context& cx, std::string key, rw_mode mode,
                                   acquire_options opts) {
  auto s = co_await open_rwlock(cx, std::move(key));
  if (!s) co_return std::move(s.error());
  co_return co_await s->acquire(cx, mode, opts);
}

task<caf::expected<permit>> acquire_semaphore(context& cx, std::string key, int64_t capacity,
                                      int64_t permits, acquire_options opts) {
  auto s = co_await open_semaphore(cx, std::move(key), capacity);
  if (!s) co_return std::move(s.error());
  co_return co_await s->acquire(cx, permits, opts);
}

task<caf::expected<permit>> acquire_gate(context& cx, std::string key, int64_t limit,
                                 acquire_options opts) {
  auto s = co_await open_gate(cx, std::move(key), limit);
  if (!s) co_return std::move(s.error());
  co_return co_await s->acquire(cx, 1, opts);
}

task<caf::expected<std::vector<sync_metrics>>>
sync_metrics_of(context& cx, std::optional<sync_kind> kind, std::optional<std::string> key) {
  auto& reg = detail::access::impl(cx)->env().registry;
  auto all = co_await cx.request<std::vector<caf::actor>>(reg, atoms::reg_list_atom::value,
                                                          primitive_kind::sync);
  if (!all) co_return std::move(all.error());
  std::vector<sync_metrics> out;
  for (auto& a : *all) {
    auto m = co_await cx.request<sync_metrics>(caf::actor_cast<sync_actor_type>(a), atoms::sy_metrics_atom::value);
    if (!m) continue; // gone meanwhile
    if (kind && m->kind != *kind) continue;
    if (key && m->key != *key) continue;
    out.push_back(std::move(*m));
  }
  std::sort(out.begin(), out.end(),
            [](const sync_metrics& x, const sync_metrics& y) { return x.key < y.key; });
  co_return out;
}

} // namespace troupe
