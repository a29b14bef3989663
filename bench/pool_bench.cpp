// Worker pools: pool_dispatch (trivial jobs) and pool_dispatch_10us (10 µs of CPU each)
// through a pool of 2 workers bounded at 64 queued with block_submitter, against a raw CAF
// dispatcher keeping 64 requests in flight over 2 worker actors.

#include <vector>

#include "bench_support.hpp"

namespace troupe_bench {

namespace {

using go_atom = caf::atom_constant<caf::atom("b_pgo")>;

/// Spins the CPU for `us` microseconds (the job's work; 0: none).
inline void spin(long us) {
  if (us <= 0) return;
  auto end = clk::now() + std::chrono::microseconds{us};
  while (clk::now() < end) {
  }
}

struct pool_dispatcher_state {
  long total = 0;
  long sent = 0;
  long done = 0;
  long sum = 0;
  std::vector<caf::actor> workers;
  caf::response_promise finished;
};

void send_next(caf::stateful_actor<pool_dispatcher_state>* self) {
  auto& st = self->state;
  auto w = st.workers[static_cast<size_t>(st.sent % static_cast<long>(st.workers.size()))];
  ++st.sent;
  self->request(w, caf::infinite, int{1}).then([self](int v) {
    auto& s = self->state;
    s.sum += v;
    if (++s.done == s.total) {
      s.finished.deliver(s.sum);
      return;
    }
    if (s.sent < s.total) send_next(self);
  });
}

} // namespace

double troupe_pool_dispatch(long n, long work_us) {
  auto rt = make_runtime();
  auto t0 = clk::now();
  auto r = rt.run([n, work_us](context& cx) -> task<long> {
    troupe::pool_spec spec;
    spec.name = "bench";
    spec.max_concurrent = 2;
    spec.backpressure.kind = troupe::pool_backpressure_kind::queue;
    spec.backpressure.max_depth = 64;
    spec.backpressure.on_full = troupe::pool_on_full::block_submitter;
    auto p = co_await troupe::open_pool(cx, spec);
    if (!p) co_return -1;
    for (long i = 0; i < n; ++i) {
      auto h = co_await troupe::submit(cx, *p, [work_us](context&) -> task<int> {
        spin(work_us);
        co_return 1;
      });
      if (!h) co_return -2;
    }
    auto snap = co_await troupe::wait_idle(cx, *p);
    co_return snap ? static_cast<long>(snap->completed) : -3;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "pool_dispatch: wrong result\n");
  return s;
}

double caf_pool_dispatch(long n, long work_us) {
  caf_env env;
  std::vector<caf::actor> workers;
  for (int i = 0; i < 2; ++i)
    workers.push_back(env.sys->spawn([work_us]() -> caf::behavior {
      return {[work_us](int x) {
        spin(work_us);
        return x;
      }};
    }));
  auto driver = env.sys->spawn(
      [n, workers](caf::stateful_actor<pool_dispatcher_state>* self) -> caf::behavior {
        return {[self, n, workers](go_atom) {
          self->state.total = n;
          self->state.workers = workers;
          self->state.finished = self->make_response_promise();
          for (long i = 0; i < std::min(64L, n); ++i)
            send_next(self);
          return self->state.finished;
        }};
      });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  self->request(driver, caf::infinite, go_atom::value)
      .receive([](long) {}, [](caf::error&) { std::fprintf(stderr, "caf dispatcher failed\n"); });
  auto s = seconds_since(t0);
  self->send_exit(driver, caf::exit_reason::user_shutdown);
  for (auto& w : workers)
    self->send_exit(w, caf::exit_reason::user_shutdown);
  return s;
}

} // namespace troupe_bench
