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
  // TROUPE_BENCH_PHASES=1: when the body first awaited (with everything submitted at once:
  // the submitting loop's end), its first answer came and the body ended (ms from the
  // start), printed to stderr.
  clk::time_point loop_end{}, first_answer{}, body_end{};
  auto r = rt->run([n, window, &loop_end, &first_answer, &body_end](context& cx) -> task<long> {
    // Up to `window` jobs submitted ahead (n: all at once); the lane admits 4 at a time.
    std::deque<troupe::job_handle<long>> hs;
    long sum = 0;
    bool first = true;
    for (long i = 0; i < n; ++i) {
      auto h = troupe::submit(cx, trivial_job{i});
      if (!h) co_return -1;
      hs.push_back(std::move(*h));
      if (static_cast<long>(hs.size()) >= window) {
        if (first) loop_end = clk::now();
        auto v = co_await cx.await(hs.front());
        if (first) first_answer = clk::now();
        first = false;
        hs.pop_front();
        if (!v) co_return -1;
        sum += *v;
      }
    }
    if (first) loop_end = clk::now();
    for (auto& h : hs) {
      auto v = co_await cx.await(h);
      if (first) first_answer = clk::now();
      first = false;
      if (!v) co_return -1;
      sum += *v;
    }
    body_end = clk::now();
    co_return sum;
  });
  auto s = seconds_since(t0);
  if (std::getenv("TROUPE_BENCH_PHASES") != nullptr) {
    auto ms = [t0](clk::time_point t) { return std::chrono::duration<double, std::milli>(t - t0).count(); };
    std::fprintf(stderr, "%s phases (ms from start): first await %.1f, its answer %.1f, body end %.1f, run end %.1f\n",
                 window >= n ? "job_submit" : "job_submit_window", ms(loop_end), ms(first_answer),
                 ms(body_end), 1e3 * s);
  }
  print_sched_counters(rt->system(), window >= n ? "job_submit" : "job_submit_window");
  if (!r || *r != n * (n + 1) / 2) std::fprintf(stderr, "troupe job_submit failed\n");
  return s;
}

double caf_job_submit(long n) {
  // The bare raw-CAF dispatch loop: every job is an actor of its own (as every troupe attempt
  // runs in a task), 4 in flight; a reply admits the next (the parallel_each baseline, window
  // 4). Nobody submits: the loop counts jobs, so no job is a message, waits in a queue or has
  // an answer of its own.
  return caf_dispatch_window(n, 4);
}

namespace {

using job_atom = caf::atom_constant<caf::atom("b_job")>;
using done_atom = caf::atom_constant<caf::atom("b_jdone")>;
using go_atom = caf::atom_constant<caf::atom("b_jgo")>;

/// The raw-CAF lane: a dispatcher actor that queues submitted jobs in arrival order and keeps
/// 4 in flight, each job an actor of its own, and answers each submission with its job's
/// outcome. Submissions and answers are plain messages carrying the job's number: CAF 0.17
/// looks a response up by scanning the actor's pending requests, so 100k submissions made as
/// requests collapse (13.6k/s here, quadratic in the number outstanding).
struct caf_lane_state {
  std::deque<std::pair<long, caf::actor>> queue;
  long running = 0;
};

void caf_lane_admit(caf::stateful_actor<caf_lane_state>* self) {
  auto& st = self->state;
  while (st.running < 4 && !st.queue.empty()) {
    auto x = st.queue.front().first;
    auto from = std::move(st.queue.front().second);
    st.queue.pop_front();
    ++st.running;
    auto w = self->spawn([](caf::event_based_actor* me) -> caf::behavior {
      return {[me](long v) {
        me->quit();
        return v + 1;
      }};
    });
    self->request(w, caf::infinite, x).then([self, x, from](long v) {
      self->send(from, done_atom::value, x, v);
      --self->state.running;
      caf_lane_admit(self);
    });
  }
}

/// The submitter: `ahead` submissions out at a time (n: all at once), each answer summed.
struct caf_submitter_state {
  long next = 0;
  long received = 0;
  long sum = 0;
  caf::response_promise done;
};

} // namespace

double caf_job_service(long n, long ahead) {
  // The equivalent of troupe's scenario in raw CAF: a submitter sends every job to a
  // dispatcher actor as a request (all at once, or `ahead` out at a time), the dispatcher
  // queues them and keeps 4 in flight, each job an actor of its own, and answers each
  // request with its job's result; the submitter sums the answers.
  caf_env env;
  ahead = std::min(ahead, n);
  auto lane = env.sys->spawn([](caf::stateful_actor<caf_lane_state>* self) -> caf::behavior {
    return {[self](job_atom, long x, const caf::actor& from) {
      self->state.queue.emplace_back(x, from);
      caf_lane_admit(self);
    }};
  });
  auto submitter = env.sys->spawn(
      [n, ahead, lane](caf::stateful_actor<caf_submitter_state>* self) -> caf::behavior {
        auto submit_one = [self, lane] {
          self->send(lane, job_atom::value, self->state.next++, caf::actor{self});
        };
        return {[self, ahead, submit_one](go_atom) {
                  self->state.done = self->make_response_promise();
                  for (long i = 0; i < ahead; ++i)
                    submit_one();
                  return self->state.done;
                },
                [self, n, submit_one](done_atom, long, long v) {
                  auto& st = self->state;
                  st.sum += v;
                  if (++st.received == n) {
                    st.done.deliver(st.sum);
                    return;
                  }
                  if (st.next < n) submit_one();
                }};
      });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  long sum = -1;
  self->request(submitter, caf::infinite, go_atom::value)
      .receive([&](long x) { sum = x; },
               [](caf::error&) { std::fprintf(stderr, "caf job service failed\n"); });
  auto s = seconds_since(t0);
  if (sum != n * (n + 1) / 2) std::fprintf(stderr, "caf job service: wrong sum %ld\n", sum);
  self->send_exit(submitter, caf::exit_reason::user_shutdown);
  self->send_exit(lane, caf::exit_reason::user_shutdown);
  return s;
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

void job_submit_report(const char* scenario, long n, long window) {
  // Three figures per round, alternated: troupe; the bare raw-CAF dispatch loop (the issue's
  // baseline: `ratio`); the raw-CAF lane fed the same submissions (`ratio_service`: the same
  // work, a message per job in and out). Medians of `--rounds`.
  auto rounds = std::max(1L, opts.rounds);
  bool troupe_side = opts.side != "caf", caf_side = opts.side != "troupe";
  std::vector<double> ts, cs, ss;
  for (long r = 0; r < rounds; ++r) {
    // Costs (faults, CPU) are the bare dispatch loop's on the raw-CAF side, as `ratio`.
    if (r % 2 == 1 && caf_side) {
      cs.push_back(costed(caf_costs, [&] { return caf_job_submit(n); }));
      ss.push_back(caf_job_service(n, window));
    }
    if (troupe_side)
      ts.push_back(costed(troupe_costs, [&] { return troupe_job_submit(n, window); }));
    if (r % 2 == 0 && caf_side) {
      ss.push_back(caf_job_service(n, window));
      cs.push_back(costed(caf_costs, [&] { return caf_job_submit(n); }));
    }
  }
  auto per_s = [n](const std::vector<double>& xs) { return xs.empty() ? 0.0 : n / median_of(xs); };
  double t = per_s(ts), c = per_s(cs), sv = per_s(ss);
  auto ratio = [](double a, double b) { return a > 0 && b > 0 ? a / b : 0.0; };
  auto costs = take_costs_json(); // taken in either format: the next scenario starts at 0
  if (opts.json)
    std::printf("{\"scenario\": \"%s\", \"n\": %ld, \"troupe_per_s\": %.0f, \"caf_per_s\": %.0f, "
                "\"ratio\": %.3f, \"caf_service_per_s\": %.0f, \"ratio_service\": %.3f, "
                "\"threads\": %zu, \"rounds\": %ld%s}\n",
                scenario, n, t, c, ratio(t, c), sv, ratio(t, sv), opts.threads, rounds,
                costs.c_str());
  else
    std::printf("%-18s n=%-8ld troupe %12.0f/s   caf %12.0f/s   ratio %.3f   (caf lane fed the "
                "same submissions %.0f/s, ratio %.3f; medians of %ld rounds)\n",
                scenario, n, t, c, ratio(t, c), sv, ratio(t, sv), rounds);
  std::fflush(stdout);
}

} // namespace troupe_bench
