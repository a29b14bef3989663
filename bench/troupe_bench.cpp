// troupe-bench: each scenario runs troupe and the equivalent raw-CAF code in the same
// process, under the same scheduler settings, and prints the ratio troupe/CAF. The
// scenarios live by feature: tasks_bench.cpp, messaging_bench.cpp, supervision_bench.cpp,
// durable_bench.cpp, pool_bench.cpp, jobs_bench.cpp, cluster_bench.cpp (two processes).
//
//   troupe-bench [--json] [--scenario NAME[,NAME...]] [--threads N] [--scheduler troupe|sharing|stealing]
//                [--max-throughput N] [--n N] [--rounds R] [--side troupe|caf]
//                [--column sharing|stealing|one|troupe]
//
// --rounds R: the scenarios with one troupe and one raw-CAF figure run both sides R times,
// alternating, and print the medians (the machine's speed drifts between runs).
// --side S: those scenarios run only side S (troupe or caf), for a profile or an
// instruction count of one side (`perf stat -e instructions`); the other figure prints 0.
// The scheduler rows (sched_*) have one troupe column and three raw-CAF ones: --side troupe
// runs the troupe-policy column only, --side caf the CAF columns only (ratios print 0).
// Each column runs in a fresh process of its own (this program with --column, which runs
// that one column here); TROUPE_BENCH_MATRIX_INPROC=1 runs the four in this process.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace {

using namespace troupe_bench;

struct scenario {
  const char* name;
  long default_n;
  std::function<void(long)> run;
};

void compare(const char* name, long n, double (*t)(long), double (*c)(long)) {
  report_rounds(name, n, [&] { return t(n); }, [&] { return c(n); });
}

} // namespace

int main(int argc, char** argv) {
  // The server side of the cluster scenarios (cluster_bench.cpp): this program again.
  if (argc >= 2 && std::string{argv[1]} == "--serve-cluster") return serve_cluster();
  if (argc >= 4 && std::string{argv[1]} == "--serve-node")
    return serve_node(argv[2], static_cast<uint16_t>(std::stoul(argv[3])));
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json")
      opts.json = true;
    else if (a == "--scenario")
      opts.scenario = next();
    else if (a == "--threads")
      opts.threads = std::stoul(next());
    else if (a == "--max-throughput")
      opts.max_throughput = std::stoul(next());
    else if (a == "--rounds")
      opts.rounds = std::max(1L, std::stol(next()));
    else if (a == "--side") {
      opts.side = next();
      if (opts.side != "troupe" && opts.side != "caf") {
        std::fprintf(stderr, "--side: troupe or caf\n");
        return 2;
      }
    } else if (a == "--column") {
      opts.column = next();
      if (opts.column != "sharing" && opts.column != "stealing" && opts.column != "one" &&
          opts.column != "troupe") {
        std::fprintf(stderr, "--column: sharing, stealing, one or troupe\n");
        return 2;
      }
    } else if (a == "--n")
      opts.n = std::stol(next());
    else if (a == "--scheduler") {
      auto p = next();
      if (p == "sharing")
        opts.policy = troupe::scheduler_policy::sharing;
      else if (p == "stealing")
        opts.policy = troupe::scheduler_policy::stealing;
      else if (p == "troupe")
        opts.policy = troupe::scheduler_policy::troupe;
      else {
        std::fprintf(stderr, "--scheduler: troupe, sharing or stealing\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: troupe-bench [--json] [--scenario NAME] [--threads N] "
                           "[--scheduler troupe|sharing|stealing] [--max-throughput N] [--n N] "
                           "[--rounds R] [--side troupe|caf] "
                           "[--column sharing|stealing|one|troupe]\n");
      return 2;
    }
  }
  if (!opts.column.empty() && !opts.side.empty() &&
      (opts.side == "troupe") != (opts.column == "troupe")) {
    std::fprintf(stderr, "--column %s is not on --side %s\n", opts.column.c_str(), opts.side.c_str());
    return 2;
  }
  std::vector<scenario> all{
      {"parked_rss", 10'000, [](long n) { parked_rss(n); }},
      {"finished_rss", 10'000, [](long n) { finished_rss(n); }},
      {"spawn_await", 100'000,
       [](long n) { compare("spawn_await", n, troupe_spawn_await, caf_spawn_await); }},
      {"sequential_await", 1'000'000,
       [](long n) {
         compare("sequential_await", n, troupe_sequential_await, caf_sequential_await);
       }},
      {"parallel_each", 100'000,
       [](long n) {
         window_arg = 64;
         compare("parallel_each", n, troupe_parallel_each, caf_parallel_each);
       }},
      {"parallel_each_unlimited", 100'000,
       [](long n) {
         window_arg = 0;
         compare("parallel_each_unlimited", n, troupe_parallel_each, caf_parallel_each);
       }},
      {"stream_pull", 1'000'000,
       [](long n) { compare("stream_pull", n, troupe_stream_pull, caf_sequential_await); }},
      {"stream_pull_request", 1'000'000,
       [](long n) {
         compare("stream_pull_request", n, troupe_stream_pull_request, caf_sequential_await);
       }},
      {"scope_fanout", 100'000,
       [](long n) { compare("scope_fanout", n, troupe_scope_fanout, caf_scope_fanout); }},
      {"spawn_unawaited", 100'000,
       [](long n) { compare("spawn_unawaited", n, troupe_spawn_unawaited, caf_scope_fanout); }},
      {"channel_pingpong", 1'000'000,
       [](long n) {
         compare("channel_pingpong", n, troupe_channel_pingpong, caf_channel_pingpong);
       }},
      {"mailbox_throughput", 1'000'000,
       [](long n) {
         compare("mailbox_throughput", n, troupe_mailbox_throughput, caf_mailbox_throughput);
       }},
      {"semaphore_contention", 400'000, [](long n) { semaphore_contention(n); }},
      {"durable_append", 200'000, [](long n) { durable_append(n, 1, "durable_append"); }},
      {"durable_append_ceiling", 200'000,
       [](long n) { durable_append(n, 1000, "durable_append_ceiling"); }},
      {"supervisor_restart", 100'000,
       [](long n) {
         compare("supervisor_restart", n, troupe_supervisor_restart, caf_supervisor_restart);
       }},
      {"supervisor_scale", 100'000, [](long n) { supervisor_scale(n); }},
      {"dynamic_start_stop", 100'000, [](long n) { dynamic_start_stop(n); }},
      {"pool_dispatch", 100'000,
       [](long n) {
         report_rounds("pool_dispatch", n, [n] { return troupe_pool_dispatch(n, 0); },
                       [n] { return caf_pool_dispatch(n, 0); });
       }},
      {"pool_durable_submit", 64'000, [](long n) { pool_durable_submit(n); }},
      {"pool_dispatch_10us", 100'000,
       [](long n) {
         report_rounds("pool_dispatch_10us", n, [n] { return troupe_pool_dispatch(n, 10); },
                       [n] { return caf_pool_dispatch(n, 10); });
       }},
      {"job_submit", 100'000, [](long n) { job_submit_report("job_submit", n, n); }},
      {"job_submit_window64", 100'000,
       [](long n) { job_submit_report("job_submit_window64", n, 64); }},
      {"simulated_backoff", 200, [](long n) { simulated_backoff(n); }},
      {"sched_pingpong", 1'000'000, [](long n) { scheduler_matrix("sched_pingpong", n); }},
      {"sched_request_chain", 500'000,
       [](long n) { scheduler_matrix("sched_request_chain", n); }},
      {"sched_spawn_burst", 100'000, [](long n) { scheduler_matrix("sched_spawn_burst", n); }},
      {"sched_send_idle", 100'000, [](long n) { scheduler_matrix("sched_send_idle", n); }},
      {"sched_restarts", 100'000, [](long n) { scheduler_matrix("sched_restarts", n); }},
      {"sched_cpu_pool", 50'000, [](long n) { scheduler_matrix("sched_cpu_pool", n); }},
      {"sched_idle", 200, [](long n) { scheduler_idle(n); }},
      {"remote_request", 100'000, [](long n) { remote_request(n); }},
      {"remote_pool_dispatch", 100'000, [](long n) { remote_pool_dispatch(n); }},
      {"failure_detection", 5, [](long n) { failure_detection(n); }},
  };
  // `--scenario a,b`: those scenarios, in the table's order, in one process (what an earlier
  // one leaves behind shows in a later one's figures: the full pass runs them all so).
  std::vector<std::string> wanted;
  for (size_t at = 0; at <= opts.scenario.size() && !opts.scenario.empty();) {
    auto comma = opts.scenario.find(',', at);
    if (comma == std::string::npos) comma = opts.scenario.size();
    wanted.push_back(opts.scenario.substr(at, comma - at));
    at = comma + 1;
  }
  for (auto& w : wanted)
    if (std::none_of(all.begin(), all.end(), [&](const auto& s) { return w == s.name; })) {
      std::fprintf(stderr, "unknown scenario: %s\n", w.c_str());
      return 2;
    }
  for (auto& s : all) {
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), s.name) == wanted.end())
      continue;
    s.run(opts.n > 0 ? opts.n : s.default_n);
  }
}
