#include "troupe/durable/rate_limit.hpp"

#include <caf/all.hpp>

#include "services.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/storage.hpp"

namespace troupe {

namespace {

using namespace troupe::atoms;

caf::error bad(std::string field, std::string why) {
  return make_error(errc::invalid_rate_limit, std::move(field), std::move(why));
}

} // namespace

caf::expected<rate_limit_request> parse_rate_limit(const nlohmann::json& spec) {
  if (!spec.is_object()) return bad("spec", "a rate-limit request is a JSON object");
  rate_limit_request req;
  for (auto& [k, v] : spec.items())
    if (k != "state_path" && k != "buckets" && k != "timeout_ms")
      return bad(k, "unknown field (state_path, buckets, timeout_ms)");
  if (auto p = spec.find("state_path"); p != spec.end()) {
    if (!p->is_string() || p->get<std::string>().empty())
      return bad("state_path", "must be a non-empty string");
    req.state_path = p->get<std::string>();
  }
  auto t = spec.find("timeout_ms");
  if (t == spec.end()) return bad("timeout_ms", "missing");
  if (!t->is_number_integer()) return bad("timeout_ms", "must be an integer");
  req.timeout_ms = t->get<int64_t>();
  auto bs = spec.find("buckets");
  if (bs == spec.end()) return bad("buckets", "missing");
  if (!bs->is_array()) return bad("buckets", "must be an array");
  for (size_t i = 0; i < bs->size(); ++i) {
    auto& j = (*bs)[i];
    auto field = "buckets[" + std::to_string(i) + "]";
    if (!j.is_object()) return bad(field, "a bucket is an object");
    rate_bucket b;
    for (auto& [k, v] : j.items()) {
      if (k == "key") {
        if (!v.is_string()) return bad(field + ".key", "must be a string");
        b.key = v.get<std::string>();
      } else if (k == "limit" || k == "units" || k == "window_ms") {
        if (!v.is_number_integer()) return bad(field + "." + k, "must be an integer");
        auto x = v.get<int64_t>();
        (k == "limit" ? b.limit : k == "units" ? b.units : b.window_ms) = x;
      } else {
        return bad(field + "." + k, "unknown field (key, limit, units, window_ms)");
      }
    }
    if (!j.contains("key")) return bad(field + ".key", "missing");
    if (!j.contains("limit")) return bad(field + ".limit", "missing");
    req.buckets.push_back(std::move(b));
  }
  return req;
}

task<caf::expected<rate_limit_result>> rate_limit_acquire(context& cx, rate_limit_request req) {
  if (auto err = check_buckets(req.buckets)) co_return err;
  if (req.timeout_ms < 0 || req.timeout_ms > max_rate_window_ms)
    co_return bad("timeout_ms", "must be between 0 and " + std::to_string(max_rate_window_ms));
  if (req.state_path && req.state_path->empty()) co_return bad("state_path", "cannot be empty");
  auto storage = co_await detail::find_storage(cx, req.state_path.value_or(std::string{}));
  if (!storage) co_return std::move(storage.error());
  auto start = cx.now();
  auto deadline = start + std::chrono::milliseconds{req.timeout_ms};
  auto waited = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(cx.now() - start).count();
  };
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - cx.now());
    auto r = co_await cx.request<rate_attempt>(*storage, st_rate_acquire_atom::value, req.buckets,
                                               static_cast<int64_t>(left.count()));
    // Another process holding the database past the busy timeout is a wait, not a failure.
    if (!r && !is(r.error(), errc::storage_busy)) co_return std::move(r.error());
    if (r && r->ok) co_return rate_limit_result{true, false, waited()};
    auto now = cx.now();
    if (now >= deadline) co_return rate_limit_result{false, true, waited()};
    auto after = r ? std::max<int64_t>(r->retry_after_ms, 1) : int64_t{50};
    auto retry = now + std::chrono::milliseconds{after};
    // Waiting outside any transaction; at the deadline one last attempt decides.
    co_await cx.sleep_until(std::min(retry, deadline));
  }
}

task<caf::expected<rate_limit_result>> rate_limit_acquire(context& cx, nlohmann::json spec) {
  auto req = parse_rate_limit(spec);
  if (!req) co_return std::move(req.error());
  co_return co_await rate_limit_acquire(cx, std::move(*req));
}

} // namespace troupe
