// Worker pools: three tenants flood one pool. Under `fifo`, the small tenants wait behind
// the big one; under `fair_round_robin` (partitioned by the task-local "tenant_id") each
// tenant gets every third start, so the small tenants' p99 wait stays small. Then a
// `ring_buffer` pool under overload keeps only the newest work, and a durable (pipeline)
// pool survives a restart: finished tasks come back with their results, the one that was
// still queued comes back as a stale failure and its idempotency key runs it afresh.
//
// Everything runs on virtual time: the figures are the same on every machine.

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;
using troupe::context;
using troupe::task;

namespace {

using waits_t = std::map<std::string, std::vector<int64_t>>; // tenant -> waits in ms

int64_t p99(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) * 99 / 100];
}

/// Floods a pool of 2 workers with `strategy`: tenant "big" submits 300 jobs, then "small-1"
/// and "small-2" 30 each; every job takes 1 ms. Returns each tenant's waits.
waits_t flood(troupe::pool_queue_kind strategy) {
  auto rt = troupe::runtime::builder{}.virtual_time().build();
  auto waits = std::make_shared<waits_t>();
  auto r = rt->run([strategy, waits](context& cx) -> task<void> {
    troupe::pool_spec spec;
    spec.name = "shared";
    spec.max_concurrent = 2;
    spec.queue = {strategy, strategy == troupe::pool_queue_kind::fair_round_robin ? "tenant_id" : ""};
    auto p = co_await troupe::open_pool(cx, spec);
    if (!p) throw troupe::task_error{p.error()};
    for (auto [tenant, n] : {std::pair{"big", 300}, {"small-1", 30}, {"small-2", 30}}) {
      cx.set_local<std::string>("tenant_id", tenant);
      for (int i = 0; i < n; ++i) {
        auto submitted = cx.now();
        auto h = co_await troupe::submit(cx, *p, [waits, submitted](context& w) -> task<void> {
          auto tenant = w.local<std::string>("tenant_id").value_or("?");
          (*waits)[tenant].push_back(
              std::chrono::duration_cast<std::chrono::milliseconds>(w.now() - submitted).count());
          co_await w.sleep(1ms);
        });
        if (!h) throw troupe::task_error{h.error()};
      }
    }
    (void)co_await troupe::wait_idle(cx, *p);
  });
  if (!r) std::printf("flood failed: %s\n", troupe::render(r.error()).c_str());
  rt->stop();
  return *waits;
}

void print_waits(const char* label, const waits_t& w) {
  std::printf("%-17s", label);
  for (auto& [tenant, v] : w)
    std::printf("  %s p99 wait %4lld ms", tenant.c_str(), static_cast<long long>(p99(v)));
  std::printf("\n");
}

void ring_buffer_overload() {
  auto rt = troupe::runtime::builder{}.virtual_time().build();
  auto r = rt->run([](context& cx) -> task<void> {
    troupe::pool_spec spec;
    spec.name = "telemetry";
    spec.max_concurrent = 1;
    spec.backpressure.kind = troupe::pool_backpressure_kind::ring_buffer;
    spec.backpressure.capacity = 5;
    auto p = co_await troupe::open_pool(cx, spec);
    if (!p) throw troupe::task_error{p.error()};
    auto ran = std::make_shared<std::vector<int>>();
    for (int i = 0; i < 50; ++i)
      (void)co_await troupe::submit(cx, *p, [ran, i](context& w) -> task<void> {
        ran->push_back(i);
        co_await w.sleep(10ms);
      });
    auto snap = co_await troupe::wait_idle(cx, *p);
    std::printf("ring_buffer(5), 50 readings into 1 busy worker: ran");
    for (auto i : *ran)
      std::printf(" %d", i);
    std::printf("; rejected %llu (drops by ring_buffer: %llu)\n",
                static_cast<unsigned long long>(snap->rejected),
                static_cast<unsigned long long>(snap->drops.empty() ? 0 : snap->drops[0].second));
  });
  if (!r) std::printf("ring buffer failed: %s\n", troupe::render(r.error()).c_str());
  rt->stop();
}

troupe::pool_spec durable_spec() {
  troupe::pool_spec spec;
  spec.name = "invoices";
  spec.scope = troupe::pool_scope::pipeline;
  return spec;
}

void durable_restart(const std::string& db) {
  { // the first process: two invoices done, the third still queued when it "dies"
    auto rt = troupe::runtime::builder{}.virtual_time().storage(db).build();
    auto r = rt->run([](context& cx) -> task<void> {
      cx.set_local<std::string>("pipeline_id", "billing");
      auto p = co_await troupe::open_pool(cx, durable_spec());
      if (!p) throw troupe::task_error{p.error()};
      for (int n : {101, 102}) {
        auto h = co_await troupe::submit(cx, *p, [n](context&) -> task<int> { co_return n * 10; },
                                         {.idempotency_key = "invoice-" + std::to_string(n)});
        (void)co_await troupe::wait_for(cx, *h);
      }
      (void)co_await troupe::submit(cx, *p, [](context& w) -> task<int> {
        co_await w.sleep(24h);
        co_return 0;
      }, {.idempotency_key = "invoice-103"});
    });
    if (!r) std::printf("first run failed: %s\n", troupe::render(r.error()).c_str());
    rt->stop();
  }
  auto rt = troupe::runtime::builder{}.virtual_time().storage(db).build();
  auto r = rt->run([](context& cx) -> task<void> {
    cx.set_local<std::string>("pipeline_id", "billing");
    auto p = co_await troupe::open_pool(cx, durable_spec());
    if (!p) throw troupe::task_error{p.error()};
    auto records = co_await troupe::tasks_of(cx, *p);
    std::printf("after the restart, pool %s holds:\n", p->name().c_str());
    for (auto& s : *records)
      std::printf("  task %llu %-11s %-9s%s\n", static_cast<unsigned long long>(s.id),
                  s.idempotency_key.c_str(), std::string{troupe::to_string(s.status)}.c_str(),
                  s.stale ? " (stale: its process died)" : "");
    // Resubmitting a finished invoice answers the stored result; the stale one runs afresh.
    auto again = co_await troupe::submit(cx, *p, [](context&) -> task<int> { co_return -1; },
                                         {.idempotency_key = "invoice-101"});
    auto old = co_await troupe::wait_for(cx, *again);
    std::printf("invoice-101 again: task %llu, result %d (from the store)\n",
                static_cast<unsigned long long>(again->id()), *old->result());
    auto fresh = co_await troupe::submit(cx, *p, [](context&) -> task<int> { co_return 1030; },
                                         {.idempotency_key = "invoice-103"});
    auto out = co_await troupe::wait_for(cx, *fresh);
    std::printf("invoice-103 again: task %llu, result %d (ran afresh)\n",
                static_cast<unsigned long long>(fresh->id()), *out->result());
  });
  if (!r) std::printf("second run failed: %s\n", troupe::render(r.error()).c_str());
  rt->stop();
}

} // namespace

int main() {
  auto fifo = flood(troupe::pool_queue_kind::fifo);
  auto fair = flood(troupe::pool_queue_kind::fair_round_robin);
  print_waits("fifo:", fifo);
  print_waits("fair_round_robin:", fair);
  bool bounded = p99(fair["small-1"]) * 3 < p99(fifo["small-1"]) &&
                 p99(fair["small-2"]) * 3 < p99(fifo["small-2"]);
  std::printf("small tenants' p99 under fair_round_robin is %s\n",
              bounded ? "bounded (a third of fifo's or less)" : "NOT bounded");
  ring_buffer_overload();
  auto dir = std::filesystem::temp_directory_path() / ("troupe-pool-example-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  durable_restart((dir / "state.sqlite").string());
  std::filesystem::remove_all(dir);
  return bounded ? 0 : 1;
}
