#pragma once

// Helpers shared by the pool test files.

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <troupe/actors/detail/pool_queue.hpp>
#include <troupe/troupe.hpp>

#include "test_support.hpp"

using namespace std::chrono_literals;
using nlohmann::json;
using troupe::context;
using troupe::errc;
using troupe::pool_backpressure_kind;
using troupe::pool_on_full;
using troupe::pool_queue_kind;
using troupe::pool_spec;
using troupe::pool_task_status;
using troupe::task;

namespace pool_test {

using troupe_test::fails_with;
using troupe_test::field_if_failed;
using troupe_test::make_real_rt;
using troupe_test::make_virtual_rt;
using troupe_test::must;

using log_t = std::shared_ptr<std::vector<int>>;

/// A body that sleeps `d` on the runtime clock, then logs `n` and returns it.
inline auto logged(log_t log, int n, std::chrono::milliseconds d = 1ms) {
  return [log, n, d](context& cx) -> task<int> {
    co_await cx.sleep(d);
    log->push_back(n);
    co_return n;
  };
}

inline pool_spec spec_of(std::string name, int64_t workers = 1) {
  pool_spec s;
  s.name = std::move(name);
  s.max_concurrent = workers;
  return s;
}

/// A durable (pipeline) pool's spec; `keep` > 0 sets keep_terminal.
inline pool_spec pipeline_spec(std::string name, int64_t keep = 0) {
  auto s = spec_of(std::move(name));
  s.scope = troupe::pool_scope::pipeline;
  if (keep > 0) s.keep_terminal = keep;
  return s;
}

inline pool_spec bounded(std::string name, int64_t depth, pool_on_full on_full) {
  auto s = spec_of(std::move(name));
  s.backpressure.kind = pool_backpressure_kind::queue;
  s.backpressure.max_depth = depth;
  s.backpressure.on_full = on_full;
  return s;
}

/// Queues jobs `first`..`last` (id = seq) in partition `key` (none when empty).
inline void push_range(troupe::detail::pool_queue& q, uint64_t first, uint64_t last,
                       const std::string& key = "") {
  for (auto i = first; i <= last; ++i)
    q.push(i, i, 0, key, !key.empty());
}

/// Takes `n` jobs, as workers' batches do.
inline void pop_n(troupe::detail::pool_queue& q, int n) {
  for (int i = 0; i < n; ++i)
    q.pop();
}

/// Puts `ids` back in that order (id = seq), in partition `key` (none when empty).
inline void requeue_all(troupe::detail::pool_queue& q, std::initializer_list<uint64_t> ids,
                        const std::string& key = "") {
  for (auto i : ids)
    q.requeue(i, i, 0, key, !key.empty());
}

inline std::vector<int> drain(troupe::detail::pool_queue& q) {
  std::vector<int> out;
  while (auto id = q.pop())
    out.push_back(static_cast<int>(*id));
  return out;
}

} // namespace pool_test

using namespace pool_test;
