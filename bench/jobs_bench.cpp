// Lanes and jobs: job_submit (trivial jobs through a concurrent(4) lane vs a raw-CAF
// dispatcher keeping 4 in flight) and simulated_backoff (virtual seconds per real second).

#include <deque>
#include <vector>

#include "bench_support.hpp"

namespace troupe_bench {

namespace {

struct trivial_job {
  static constexpr std::string_view lane = "work";
  long x = 0;
  task<caf::expected<long>> attempt(troupe::attempt_scope&) { co_return x + 1; }
};

} // namespace

double troupe_job_submit(long n, long window) {
  auto rt = troupe::runtime::builder{}
                .threads(opts.threads)
                .scheduler(opts.policy)
                .max_throughput(opts.max_throughput)
                .lanes({troupe::lane_decl::default_lane(), troupe::lane_decl::concurrent("work", 4)})
                .build();
  if (!rt) {
    std::fprintf(stderr, "runtime: %s\n", troupe::render(rt.error()).c_str());
    std::exit(2);
  }
  auto t0 = clk::now();
  auto r = rt->run([n, window](context& cx) -> task<long> {
    // Up to `window` jobs submitted ahead (n: all at once); the lane admits 4 at a time.
    std::deque<troupe::job_handle<long>> hs;
    long sum = 0;
    for (long i = 0; i < n; ++i) {
      auto h = troupe::submit(cx, trivial_job{i});
      if (!h) co_return -1;
      hs.push_back(std::move(*h));
      if (static_cast<long>(hs.size()) >= window) {
        auto v = co_await cx.await(hs.front());
        hs.pop_front();
        if (!v) co_return -1;
        sum += *v;
      }
    }
    for (auto& h : hs) {
      auto v = co_await cx.await(h);
      if (!v) co_return -1;
      sum += *v;
    }
    co_return sum;
  });
  auto s = seconds_since(t0);
  print_sched_counters(rt->system(), window >= n ? "job_submit" : "job_submit_window");
  if (!r || *r != n * (n + 1) / 2) std::fprintf(stderr, "troupe job_submit failed\n");
  return s;
}

double caf_job_submit(long n) {
  // The raw-CAF dispatcher: every job is an actor of its own (as every troupe attempt runs in
  // a task), 4 in flight; a reply admits the next (the parallel_each baseline, window 4).
  return caf_dispatch_window(n, 4);
}

namespace {

struct always_down {
  static troupe::job_policy policy() { return {.retries = 10}; }
  task<caf::expected<int>> attempt(troupe::attempt_scope&) {
    co_return troupe::make_error(troupe::errc::not_found, "remote", "down");
  }
};

} // namespace

void simulated_backoff(long n) {
  // n simulations of one job retrying 10 times with the default policy (10.637 s each).
  double virtual_s = 0;
  auto t0 = clk::now();
  for (long i = 0; i < n; ++i) {
    troupe::simulation sim{static_cast<uint64_t>(i)};
    sim.trace_steps(false);
    auto h = sim->submit(always_down{});
    if (!h) {
      std::fprintf(stderr, "submit: %s\n", troupe::render(h.error()).c_str());
      return;
    }
    sim.run_for(std::chrono::seconds{11});
    auto r = sim->await(*h);
    if (r) std::fprintf(stderr, "simulated_backoff: the job should have failed\n");
    virtual_s += std::chrono::duration<double>(sim->clock().now().time_since_epoch()).count();
  }
  auto real_s = seconds_since(t0);
  auto speed = virtual_s / real_s;
  if (opts.json)
    std::printf("{\"scenario\": \"simulated_backoff\", \"n\": %ld, \"virtual_s\": %.3f, "
                "\"real_s\": %.4f, \"virtual_per_real\": %.0f}\n",
                n, virtual_s, real_s, speed);
  else
    std::printf("%-18s n=%-8ld %.1f virtual s in %.4f real s: %.0fx real time (target >= "
                "10000x)\n",
                "simulated_backoff", n, virtual_s, real_s, speed);
  std::fflush(stdout);
}

} // namespace troupe_bench
