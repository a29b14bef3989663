#pragma once

#include <algorithm>
#include <vector>

// What every benchmark file shares: options, the runtime and raw-CAF environments under the
// same scheduler settings, and the report line.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include <sys/resource.h>

#include <caf/all.hpp>

#include <troupe/troupe.hpp>

namespace troupe_bench {

using clk = std::chrono::steady_clock;
using troupe::context;
using troupe::task;

struct options {
  bool json = false;
  std::string scenario;
  size_t threads = troupe::runtime_config{}.threads;
  troupe::scheduler_policy policy = troupe::runtime_config{}.policy;
  size_t max_throughput = troupe::runtime_config{}.max_throughput;
  long n = 0; // 0: each scenario's default
  /// Alternating troupe / raw-CAF runs whose medians are reported (scenarios with one
  /// figure per side): the machine's speed drifts, and alternation spreads a drift over
  /// both sides alike.
  long rounds = 1;
  /// `--side troupe|caf`: only that side of a two-sided scenario runs (for profiling and
  /// counting instructions); its figure is printed, the other and the ratio are 0.
  std::string side;
  /// `--column sharing|stealing|one|troupe`: a scheduler row (sched_*) runs only that column,
  /// in this process. Without it each column runs in a fresh process of its own (this
  /// program again, with `--column`); `TROUPE_BENCH_MATRIX_INPROC=1` runs them all in this
  /// process, one after the other.
  std::string column;
};

inline options opts;

inline double seconds_since(clk::time_point t0) {
  return std::chrono::duration<double>(clk::now() - t0).count();
}

inline long rss_kib() {
  std::ifstream in{"/proc/self/status"};
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

inline troupe::runtime make_runtime() {
  auto rt = troupe::runtime::builder{}
                .threads(opts.threads)
                .scheduler(opts.policy)
                .max_throughput(opts.max_throughput)
                .build();
  if (!rt) {
    std::fprintf(stderr, "runtime: %s\n", troupe::render(rt.error()).c_str());
    std::exit(2);
  }
  return std::move(*rt);
}

/// Writes what troupe's scheduler did in `sys` to `out`; nothing under CAF's own policies.
/// The scheduler counters of `sys` as one line of text (empty when `sys` does not run on
/// troupe's scheduler).
inline std::string sched_counters_text(caf::actor_system& sys) {
  troupe::scheduler_counters c;
  if (!troupe::read_scheduler_counters(sys, c)) return {};
  char buf[384];
  std::snprintf(buf, sizeof buf,
                "slot %lu, local %lu, inject %lu, steals %lu moving %lu (probes %lu, cheap %lu), "
                "slot steals %lu, parks %lu, wakes %lu, rescued %lu, ends without timer %lu, "
                "with timer %lu",
                (unsigned long)c.slot_runs, (unsigned long)c.local_runs,
                (unsigned long)c.inject_runs, (unsigned long)c.steals, (unsigned long)c.stolen,
                (unsigned long)c.probes, (unsigned long)c.cheap_probes,
                (unsigned long)c.slot_steals, (unsigned long)c.parks, (unsigned long)c.wakes,
                (unsigned long)c.rescued, (unsigned long)c.ends_without_timer,
                (unsigned long)c.ends_with_timer);
  return buf;
}

inline void write_sched_counters(std::FILE* out, caf::actor_system& sys, const char* tag) {
  auto text = sched_counters_text(sys);
  if (!text.empty()) std::fprintf(out, "  [%s] %s\n", tag, text.c_str());
}

/// With TROUPE_BENCH_SCHED set: the counters of `sys` to stderr.
inline void print_sched_counters(caf::actor_system& sys, const char* tag) {
  if (std::getenv("TROUPE_BENCH_SCHED") != nullptr) write_sched_counters(stderr, sys, tag);
}

/// Gives a raw-CAF configuration troupe's scheduler settings (policy, threads, throughput).
inline void set_scheduler(caf::actor_system_config& cfg, troupe::scheduler_policy policy,
                          size_t threads) {
  if (policy == troupe::scheduler_policy::troupe)
    troupe::load_troupe_scheduler(cfg);
  else
    cfg.set("scheduler.policy", policy == troupe::scheduler_policy::sharing
                                    ? caf::atom("sharing")
                                    : caf::atom("stealing"));
  cfg.set("scheduler.max-threads", static_cast<caf::config_value::integer>(threads));
  if (opts.max_throughput > 0)
    cfg.set("scheduler.max-throughput",
            static_cast<caf::config_value::integer>(opts.max_throughput));
}

inline void same_scheduler(caf::actor_system_config& cfg) {
  set_scheduler(cfg, opts.policy, opts.threads);
}

/// The raw-CAF side runs under the very same scheduler settings.
struct caf_env {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf_env() {
    same_scheduler(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};

/// What one side's rounds cost the process besides wall time, summed over its rounds
/// (getrusage deltas, every thread of the process): minor page faults, user and system CPU.
/// On this project's machines a fresh 4 KB page costs 2-16 us and a fresh 2 MB huge page
/// up to ~4 ms (docs/benchmarks.md, session 34), so a scenario that keeps 100k records alive
/// at once pays much of its first round in faults. `--json` prints these per round next to
/// the rates for the scenarios run through report_rounds (`compare`) and for job_submit;
/// the others print none.
struct side_costs {
  long rounds = 0;
  long faults = 0;
  double user_s = 0;
  double sys_s = 0;
};
inline side_costs troupe_costs, caf_costs;

/// Runs one round (`run` returns its seconds) and adds what it cost to `c`.
template <class F>
double costed(side_costs& c, F&& run) {
  rusage a{}, b{};
  getrusage(RUSAGE_SELF, &a);
  double s = run();
  getrusage(RUSAGE_SELF, &b);
  auto secs = [](const timeval& x, const timeval& y) {
    return static_cast<double>(y.tv_sec - x.tv_sec) +
           static_cast<double>(y.tv_usec - x.tv_usec) / 1e6;
  };
  ++c.rounds;
  c.faults += b.ru_minflt - a.ru_minflt;
  c.user_s += secs(a.ru_utime, b.ru_utime);
  c.sys_s += secs(a.ru_stime, b.ru_stime);
  return s;
}

/// The costs per round as JSON members (`, "troupe_faults": ...`), empty for a side that ran
/// no costed round; both sides' counts are reset.
inline std::string take_costs_json() {
  std::string out;
  auto one = [&out](const char* side, side_costs& c) {
    if (c.rounds == 0) return;
    char buf[160];
    auto per_round = [&c](double x) { return 1e3 * x / static_cast<double>(c.rounds); };
    std::snprintf(buf, sizeof buf,
                  ", \"%s_faults\": %ld, \"%s_user_ms\": %.1f, \"%s_sys_ms\": %.1f", side,
                  c.faults / c.rounds, side, per_round(c.user_s), side, per_round(c.sys_s));
    out += buf;
    c = side_costs{};
  };
  one("troupe", troupe_costs);
  one("caf", caf_costs);
  return out;
}

inline void report(const char* scenario, long n, double troupe_s, double caf_s, long rounds = 1) {
  double t = troupe_s > 0 ? n / troupe_s : 0;
  double c = caf_s > 0 ? n / caf_s : 0;
  auto costs = take_costs_json(); // taken in either format: the next scenario starts at 0
  if (opts.json)
    std::printf("{\"scenario\": \"%s\", \"n\": %ld, \"troupe_per_s\": %.0f, \"caf_per_s\": %.0f, "
                "\"ratio\": %.3f, \"threads\": %zu, \"scheduler\": \"%s\", "
                "\"max_throughput\": %zu, \"rounds\": %ld%s}\n",
                scenario, n, t, c, c > 0 ? t / c : 0, opts.threads,
                std::string{troupe::to_string(opts.policy)}.c_str(), opts.max_throughput, rounds,
                costs.c_str());
  else if (rounds > 1)
    std::printf("%-18s n=%-8ld troupe %12.0f/s   caf %12.0f/s   ratio %.3f   (medians of %ld "
                "alternating rounds)\n",
                scenario, n, t, c, c > 0 ? t / c : 0, rounds);
  else
    std::printf("%-18s n=%-8ld troupe %12.0f/s   caf %12.0f/s   ratio %.3f\n", scenario, n, t, c,
                c > 0 ? t / c : 0);
  std::fflush(stdout);
}

inline double median_of(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  auto m = xs.size() / 2;
  return xs.size() % 2 == 1 ? xs[m] : (xs[m - 1] + xs[m]) / 2;
}

/// Runs each side `opts.rounds` times and reports the median seconds of each. Rounds
/// alternate which side goes first (troupe first in the first round, as with one round), so
/// what one run leaves behind (a grown heap, warm caches) favours neither side.
template <class T, class C>
void report_rounds(const char* scenario, long n, T troupe_run, C caf_run) {
  auto rounds = std::max(1L, opts.rounds);
  std::vector<double> ts, cs;
  if (opts.side == "troupe" || opts.side == "caf") {
    auto& xs = opts.side == "troupe" ? ts : cs;
    for (long r = 0; r < rounds; ++r)
      xs.push_back(opts.side == "troupe" ? costed(troupe_costs, troupe_run)
                                         : costed(caf_costs, caf_run));
    report(scenario, n, ts.empty() ? 0 : median_of(ts), cs.empty() ? 0 : median_of(cs), rounds);
    return;
  }
  for (long r = 0; r < rounds; ++r) {
    if (r % 2 == 0) {
      ts.push_back(costed(troupe_costs, troupe_run));
      cs.push_back(costed(caf_costs, caf_run));
    } else {
      cs.push_back(costed(caf_costs, caf_run));
      ts.push_back(costed(troupe_costs, troupe_run));
    }
  }
  report(scenario, n, median_of(ts), median_of(cs), rounds);
}


/// A raw-CAF driver's state: how many children or answers are still due, and the promise
/// delivered when none is.
struct countdown_state {
  long left = 0;
  caf::response_promise done;
};

// The scenarios, by feature. Each `troupe_x` / `caf_x` pair answers seconds for n operations.

// cluster_bench.cpp
void remote_request(long n);
void remote_pool_dispatch(long n);
void failure_detection(long rounds);
int serve_cluster();
int serve_node(const std::string& name, uint16_t seed);

// jobs_bench.cpp
/// Raw CAF: n trivial jobs, each an actor of its own, `window` in flight (tasks_bench.cpp).
double caf_dispatch_window(long n, long window);
double troupe_job_submit(long n, long window);
double caf_job_submit(long n);
/// Raw CAF: n jobs submitted as requests to a dispatcher actor keeping 4 in flight, `ahead`
/// submissions out at a time, each answered with its job's result.
double caf_job_service(long n, long ahead);
/// job_submit's report: troupe, the bare dispatch loop, the lane fed the same submissions.
void job_submit_report(const char* scenario, long n, long window);
void simulated_backoff(long n);

// tasks_bench.cpp
double troupe_spawn_await(long n);
double caf_spawn_await(long n);
double troupe_sequential_await(long n);
double caf_sequential_await(long n);
void parked_rss(long n);
void finished_rss(long n);
/// parallel_each's window (0: unlimited), set by the scenario table.
inline long window_arg = 64;
double troupe_parallel_each(long n);
double caf_parallel_each(long n);
double troupe_scope_fanout(long n);
double caf_scope_fanout(long n);
double troupe_spawn_unawaited(long n);
/// 1M values pulled from a stream (a pure producer), against raw CAF's request/response
/// per value (the yardstick); `_request`: the producer makes one request per value.
double troupe_stream_pull(long n);
double troupe_stream_pull_request(long n);

// messaging_bench.cpp
double troupe_channel_pingpong(long n);
double caf_channel_pingpong(long n);
double troupe_mailbox_throughput(long n);
double caf_mailbox_throughput(long n);
void semaphore_contention(long n);

// supervision_bench.cpp
double troupe_supervisor_restart(long n);
double caf_supervisor_restart(long n);
void supervisor_scale(long n);
void dynamic_start_stop(long n);

// durable_bench.cpp
void durable_append(long n, long rows_per_txn, const char* name);

/// Returns the path of a fresh database in a temporary directory; `drop_db` removes both.
std::string bench_db(const char* tag);
void drop_db(const std::string& path);

// scheduler_bench.cpp
/// Raw CAF programs under CAF's sharing and stealing (opts.threads), one thread, and troupe's
/// scheduler (opts.threads): one row per program, with the best CAF column and troupe's share.
void scheduler_matrix(const std::string& only, long n);
/// Idle CPU and wake-up latency under sharing, stealing and troupe's scheduler.
void scheduler_idle(long rounds);

// pool_bench.cpp
double troupe_pool_dispatch(long n, long work_us);
double caf_pool_dispatch(long n, long work_us);
void pool_durable_submit(long n);

} // namespace troupe_bench
