// The scheduler matrix: plain CAF programs (no troupe code on the path) under CAF's
// `sharing` and `stealing` with opts.threads workers, under one thread, and under troupe's
// scheduler with opts.threads workers. Each row prints all four and troupe's share of the best
// CAF column, so any troupe-bench ratio can be read against the best CAF configuration. Each
// column runs in a fresh process (measure_apart), so that none inherits the allocator state
// another column's threads left.
//
//   sched_pingpong       two actors sending one message back and forth (messages/s)
//   sched_request_chain  one actor awaiting n requests to another, one after another (/s)
//   sched_spawn_burst    one actor spawning n children that each message it once (/s)
//   sched_send_idle      one actor messaging n idle actors that each answer once (/s)
//   sched_restarts       monitor + respawn of a child that stops at once (restarts/s)
//   sched_cpu_pool       n jobs of 10 us each through a pool of 2 actors, 8 in flight at each
//                        (jobs/s)
//   sched_idle           CPU used by an idle system over 1 s, and how long a sleeping worker
//                        takes to run an actor messaged from outside (median, p99); also the
//                        memory given back meanwhile (a whole pass's earlier bursts: the
//                        slab's reaper unmaps their chunks 10-20 s later, on an idle worker,
//                        and that CPU is in the figure). TROUPE_BENCH_IDLE_THREADS=1 prints
//                        each thread's CPU time in the idle second (stderr).

#include <dirent.h>
#include <sys/resource.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "bench_support.hpp"
#include "troupe/actors/detail/actor_slab.hpp"
#include "troupe/actors/detail/recycler.hpp"

namespace troupe_bench {

namespace {

using s_ping = caf::atom_constant<caf::atom("s_ping")>;
using s_pong = caf::atom_constant<caf::atom("s_pong")>;
using s_go = caf::atom_constant<caf::atom("s_go")>;
using s_hi = caf::atom_constant<caf::atom("s_hi")>;
using s_job = caf::atom_constant<caf::atom("s_job")>;

using program = std::function<void(caf::actor_system&, caf::scoped_actor&, long)>;

/// Runs a driver that answers `go(n)` once its work is done; returns seconds.
double drive(caf::scoped_actor& self, const caf::actor& driver, long n) {
  auto t0 = clk::now();
  self->request(driver, caf::infinite, s_go::value, n)
      .receive([](bool) {}, [](caf::error& e) { std::fprintf(stderr, "driver: %s\n",
                                                             caf::to_string(e).c_str()); });
  auto s = seconds_since(t0);
  self->send_exit(driver, caf::exit_reason::user_shutdown);
  return s;
}

double pingpong(caf::actor_system& sys, caf::scoped_actor& self, long n) {
  auto pong = sys.spawn([](caf::event_based_actor* ev) -> caf::behavior {
    return {[ev](s_ping, long k, caf::actor& from) { ev->send(from, s_pong::value, k); }};
  });
  auto ping = sys.spawn([pong](caf::stateful_actor<countdown_state>* ev) -> caf::behavior {
    return {[ev, pong](s_go, long count) {
              ev->state.left = count;
              ev->state.done = ev->make_response_promise();
              ev->send(pong, s_ping::value, 1L, caf::actor{ev});
              return ev->state.done;
            },
            [ev, pong](s_pong, long k) {
              if (2 * k >= ev->state.left) {
                ev->state.done.deliver(true);
                return;
              }
              ev->send(pong, s_ping::value, k + 1, caf::actor{ev});
            }};
  });
  auto s = drive(self, ping, n);
  self->send_exit(pong, caf::exit_reason::user_shutdown);
  return s;
}

double request_chain(caf::actor_system& sys, caf::scoped_actor& self, long n) {
  auto server = sys.spawn([]() -> caf::behavior { return {[](long k) { return k + 1; }}; });
  auto client = sys.spawn([server](caf::stateful_actor<countdown_state>* ev) -> caf::behavior {
    auto next = std::make_shared<std::function<void(long)>>();
    *next = [ev, server, next](long k) {
      ev->request(server, caf::infinite, k).then([ev, next](long r) {
        if (--ev->state.left == 0)
          ev->state.done.deliver(true);
        else
          (*next)(r);
      });
    };
    return {[ev, next](s_go, long count) {
      ev->state.left = count;
      ev->state.done = ev->make_response_promise();
      (*next)(0);
      return ev->state.done;
    }};
  });
  auto s = drive(self, client, n);
  self->send_exit(server, caf::exit_reason::user_shutdown);
  return s;
}

caf::behavior hello_and_quit(caf::event_based_actor* ev, caf::actor parent) {
  ev->send(parent, s_hi::value);
  ev->quit();
  return {};
}

/// TROUPE_BENCH_PHASES=1: the spawn burst's two phases (the spawning loop; the children's
/// runs and hellos left after it) to stderr, with troupe's scheduler counters at the loop's
/// end and at the end (in the troupe-policy column).
struct burst_phases {
  clk::time_point start, loop_end, last_hello;
  std::string at_loop_end;
};

double spawn_burst(caf::actor_system& sys, caf::scoped_actor& self, long n) {
  static const bool phases = std::getenv("TROUPE_BENCH_PHASES") != nullptr;
  auto ph = std::make_shared<burst_phases>();
  auto parent = sys.spawn([ph](caf::stateful_actor<countdown_state>* ev) -> caf::behavior {
    return {[ev, ph](s_go, long count) {
              ev->state.left = count;
              ev->state.done = ev->make_response_promise();
              if (phases) ph->start = clk::now();
              for (long i = 0; i < count; ++i) ev->spawn(hello_and_quit, caf::actor{ev});
              if (phases) {
                ph->loop_end = clk::now();
                ph->at_loop_end = sched_counters_text(ev->home_system());
              }
              return ev->state.done;
            },
            [ev, ph](s_hi) {
              if (--ev->state.left == 0) {
                if (phases) ph->last_hello = clk::now();
                ev->state.done.deliver(true);
              }
            }};
  });
  auto s = drive(self, parent, n);
  if (phases) {
    auto ms = [](clk::time_point a, clk::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    std::fprintf(stderr, "sched_spawn_burst phases (%zu workers): loop %.1f ms, after it %.1f ms\n",
                 sys.scheduler().num_workers(), ms(ph->start, ph->loop_end),
                 ms(ph->loop_end, ph->last_hello));
    if (!ph->at_loop_end.empty())
      std::fprintf(stderr, "  counters at the loop's end: %s\n  at the end: %s\n",
                   ph->at_loop_end.c_str(), sched_counters_text(sys).c_str());
  }
  return s;
}

struct idle_state : countdown_state {
  std::vector<caf::actor> idle;
};

double send_idle(caf::actor_system& sys, caf::scoped_actor& self, long n) {
  auto driver = sys.spawn([](caf::stateful_actor<idle_state>* ev) -> caf::behavior {
    return {[ev](s_go, long count) {
              if (ev->state.idle.empty())
                for (long i = 0; i < count; ++i)
                  ev->state.idle.push_back(ev->spawn([](caf::event_based_actor* a) -> caf::behavior {
                    return {[a](s_ping, caf::actor& from) { a->send(from, s_hi::value); }};
                  }));
              ev->state.left = count;
              ev->state.done = ev->make_response_promise();
              for (auto& a : ev->state.idle) ev->send(a, s_ping::value, caf::actor{ev});
              return ev->state.done;
            },
            [ev](s_hi) {
              if (--ev->state.left == 0) ev->state.done.deliver(true);
            }};
  });
  // The first round spawns the actors and lets each run its start; the second is timed.
  self->request(driver, caf::infinite, s_go::value, n).receive([](bool) {}, [](caf::error&) {});
  return drive(self, driver, n);
}

double restarts(caf::actor_system& sys, caf::scoped_actor& self, long n) {
  auto driver = sys.spawn([](caf::stateful_actor<countdown_state>* ev) -> caf::behavior {
    auto quit_at_once = [](caf::event_based_actor* c) -> caf::behavior {
      c->quit(caf::exit_reason::user_shutdown);
      return {};
    };
    ev->set_down_handler([ev, quit_at_once](caf::down_msg&) {
      if (--ev->state.left == 0) {
        ev->state.done.deliver(true);
        return;
      }
      ev->spawn<caf::monitored>(quit_at_once);
    });
    return {[ev, quit_at_once](s_go, long count) {
      ev->state.left = count;
      ev->state.done = ev->make_response_promise();
      ev->spawn<caf::monitored>(quit_at_once);
      return ev->state.done;
    }};
  });
  return drive(self, driver, n);
}

void burn(std::chrono::microseconds d) {
  auto until = clk::now() + d;
  while (clk::now() < until) {
  }
}

/// The pool's driver keeps `per_worker` jobs in flight at each worker, refilled as each answer
/// arrives. It used to send all n requests at once: CAF 0.17 keeps an actor's pending
/// responses in a `detail::unordered_flat_map` (a vector searched linearly and shifted at each
/// erase), so 50k requests in flight made every answer cost a scan of ~25k entries (~35 us,
/// 74% of the samples in `libcaf_core`, profiled 2026-12-07) and the row measured that scan on
/// the driver's one thread, not whether 10 us jobs use both cores.
struct cpu_pool_state {
  std::vector<caf::actor> pool;
  long left = 0;   // answers still to come
  long unsent = 0; // jobs not sent yet
  caf::response_promise done;
};

void cpu_pool_send(caf::stateful_actor<cpu_pool_state>* ev, size_t i) {
  --ev->state.unsent;
  ev->request(ev->state.pool[i], caf::infinite, s_job::value).then([ev, i](s_hi) {
    if (--ev->state.left == 0)
      ev->state.done.deliver(true);
    else if (ev->state.unsent > 0)
      cpu_pool_send(ev, i);
  });
}

double cpu_pool(caf::actor_system& sys, caf::scoped_actor& self, long n) {
  constexpr long per_worker = 8;
  auto worker = []() -> caf::behavior {
    return {[](s_job) {
      burn(std::chrono::microseconds(10));
      return s_hi::value;
    }};
  };
  std::vector<caf::actor> pool{sys.spawn(worker), sys.spawn(worker)};
  auto driver = sys.spawn([pool](caf::stateful_actor<cpu_pool_state>* ev) -> caf::behavior {
    ev->state.pool = pool;
    return {[ev](s_go, long count) {
      auto& st = ev->state;
      st.left = count;
      st.unsent = count;
      st.done = ev->make_response_promise();
      for (long k = 0; k < per_worker; ++k)
        for (size_t i = 0; i < st.pool.size() && st.unsent > 0; ++i)
          cpu_pool_send(ev, i);
      return st.done;
    }};
  });
  auto s = drive(self, driver, n);
  for (auto& w : pool) self->send_exit(w, caf::exit_reason::user_shutdown);
  return s;
}

struct row {
  const char* name;
  std::function<double(caf::actor_system&, caf::scoped_actor&, long)> prog;
};

double measure(troupe::scheduler_policy policy, size_t threads, const row& r, long n) {
  caf::actor_system_config cfg;
  set_scheduler(cfg, policy, threads); // also max-throughput
  caf::actor_system sys{cfg};
  double s = 0;
  {
    caf::scoped_actor self{sys};
    s = r.prog(sys, self, n);
  }
  if (!opts.json)
    write_sched_counters(stdout, sys, r.name);
  else if (std::getenv("TROUPE_BENCH_SCHED") != nullptr)
    write_sched_counters(stderr, sys, r.name);
  return n / s;
}

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto tv = [](timeval t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

/// Each thread's CPU time (ns, from /proc/self/task/<tid>/schedstat) and name, by tid: with
/// TROUPE_BENCH_IDLE_THREADS set, sched_idle prints the threads that ran in its idle second
/// (what a whole pass leaves running shows here, not in the process total alone).
std::map<long, std::pair<std::string, long long>> thread_cpu() {
  std::map<long, std::pair<std::string, long long>> out;
  auto* d = opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (auto* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string base = std::string{"/proc/self/task/"} + e->d_name;
    long long ns = 0;
    std::string comm;
    std::ifstream{base + "/schedstat"} >> ns;
    std::getline(std::ifstream{base + "/comm"}, comm);
    out[std::atol(e->d_name)] = {comm, ns};
  }
  closedir(d);
  return out;
}

void print_thread_deltas(const char* name, const std::map<long, std::pair<std::string, long long>>& a,
                         const std::map<long, std::pair<std::string, long long>>& b) {
  std::fprintf(stderr, "sched_idle %s: %zu threads before, %zu after\n", name, a.size(), b.size());
  for (auto& [tid, v] : b) {
    auto it = a.find(tid);
    long long before = it == a.end() ? 0 : it->second.second;
    if (v.second - before > 0 || it == a.end())
      std::fprintf(stderr, "  tid %ld %-16s %8.3f ms%s\n", tid, v.first.c_str(),
                   static_cast<double>(v.second - before) / 1e6, it == a.end() ? " (new)" : "");
  }
  for (auto& [tid, v] : a)
    if (b.find(tid) == b.end())
      std::fprintf(stderr, "  tid %ld %-16s gone\n", tid, v.first.c_str());
}

struct idle_figures {
  double cpu_percent = 0;
  double wake_median_us = 0;
  double wake_p99_us = 0;
  /// Memory given back during the idle second: task-actor chunks the slab unmapped and
  /// blocks the recycler freed (an earlier burst's working set, 10-20 s after it: each 2 MB
  /// chunk unmapped costs a worker about 0.25 ms, which the CPU figure includes).
  uint64_t reaped_chunks = 0;
  uint64_t reaped_blocks = 0;
};

idle_figures idle_and_wake(const char* name, troupe::scheduler_policy policy, long rounds) {
  caf::actor_system_config cfg;
  set_scheduler(cfg, policy, opts.threads);
  caf::actor_system sys{cfg};
  struct shared {
    std::mutex mx;
    std::vector<double> lat_us;
  };
  auto sh = std::make_shared<shared>();
  auto probe = sys.spawn([sh]() -> caf::behavior {
    return {[sh](s_ping, int64_t sent_ns) {
      auto now = clk::now().time_since_epoch().count();
      std::lock_guard<std::mutex> g{sh->mx};
      sh->lat_us.push_back(static_cast<double>(now - sent_ns) / 1e3);
    }};
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100)); // let start-up settle
  bool per_thread = std::getenv("TROUPE_BENCH_IDLE_THREADS") != nullptr;
  auto t_before = per_thread ? thread_cpu() : decltype(thread_cpu()){};
  auto rec0 = troupe::detail::recycler::stats();
  auto slab0 = troupe::detail::actor_slab::stats();
  auto c0 = cpu_seconds();
  auto w0 = clk::now();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  idle_figures out;
  out.cpu_percent = 100.0 * (cpu_seconds() - c0) / seconds_since(w0);
  out.reaped_blocks = troupe::detail::recycler::stats().reaped - rec0.reaped;
  out.reaped_chunks = troupe::detail::actor_slab::stats().unmapped - slab0.unmapped;
  if (per_thread) print_thread_deltas(name, t_before, thread_cpu());
  for (long i = 0; i < rounds; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2)); // the workers go to sleep
    caf::anon_send(probe, s_ping::value,
                   static_cast<int64_t>(clk::now().time_since_epoch().count()));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  caf::anon_send_exit(probe, caf::exit_reason::user_shutdown);
  std::vector<double> lat;
  {
    std::lock_guard<std::mutex> g{sh->mx};
    lat = sh->lat_us;
  }
  std::sort(lat.begin(), lat.end());
  if (!lat.empty()) {
    out.wake_median_us = lat[lat.size() / 2];
    out.wake_p99_us = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
  }
  return out;
}

} // namespace

void scheduler_idle(long rounds) {
  using sp = troupe::scheduler_policy;
  for (auto [name, policy] : {std::pair{"sharing", sp::sharing}, std::pair{"stealing", sp::stealing},
                              std::pair{"troupe", sp::troupe}}) {
    auto f = idle_and_wake(name, policy, rounds);
    if (opts.json)
      std::printf("{\"scenario\": \"sched_idle\", \"scheduler\": \"%s\", \"threads\": %zu, "
                  "\"idle_cpu_percent\": %.2f, \"wake_median_us\": %.1f, \"wake_p99_us\": %.1f, "
                  "\"reaped_chunks\": %llu, \"reaped_blocks\": %llu}\n",
                  name, opts.threads, f.cpu_percent, f.wake_median_us, f.wake_p99_us,
                  static_cast<unsigned long long>(f.reaped_chunks),
                  static_cast<unsigned long long>(f.reaped_blocks));
    else
      std::printf("sched_idle %-9s idle CPU %5.2f%%   wake median %7.1f us   p99 %7.1f us   "
                  "reaped meanwhile: %llu chunks, %llu blocks\n",
                  name, f.cpu_percent, f.wake_median_us, f.wake_p99_us,
                  static_cast<unsigned long long>(f.reaped_chunks),
                  static_cast<unsigned long long>(f.reaped_blocks));
    std::fflush(stdout);
  }
}

namespace {

/// One column of a scheduler row measured in a fresh process: this program again with
/// `--column` (its JSON line read back). A process's first actor system finds glibc's
/// arenas as a program's start does; a later one inherits what the earlier columns left
/// there (heaps grown, trimmed or shared once the process has made 8 arenas per core), and
/// on the spawn burst that moved a column by up to 3x with its place in the row (benchmarks.md,
/// session 47). Returns -1 when the process could not be run or printed no figure for the column.
double measure_apart(const char* row_name, const char* column, long n) {
  // Everything the child needs is made before the fork (it only redirects and execs).
  std::vector<std::string> args{"/proc/self/exe", "--json", "--scenario", row_name,
                                "--column", column, "--n", std::to_string(n),
                                "--threads", std::to_string(opts.threads)};
  args.push_back("--max-throughput"); // 0 too: unlimited, not the child's default
  args.push_back(std::to_string(opts.max_throughput));
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  // Text mode: the column's scheduler counters (stderr), as a column run here prints them.
  std::string counters = "TROUPE_BENCH_SCHED=1";
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e)
    envp.push_back(*e);
  if (!opts.json) envp.push_back(counters.data());
  envp.push_back(nullptr);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return -1; // dup2 clears it on the child's stdout
  auto pid = ::fork();
  if (pid < 0) {
    ::close(out[0]);
    ::close(out[1]);
    return -1;
  }
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    ::execve("/proc/self/exe", argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(out[1]);
  std::string text;
  char buf[512];
  ssize_t k;
  while ((k = ::read(out[0], buf, sizeof buf)) > 0 || (k < 0 && errno == EINTR))
    if (k > 0) text.append(buf, static_cast<size_t>(k));
  ::close(out[0]);
  int status = 0;
  pid_t waited;
  while ((waited = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (waited != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  std::string_view c{column};
  std::string key = c == "troupe" ? "caf_troupe_policy" : c == "one" ? "caf_1thread" : "caf_" + std::string{c};
  key = "\"" + key + "_per_s\": ";
  auto at = text.find(key);
  if (at == std::string::npos) return -1;
  auto v = std::strtod(text.c_str() + at + key.size(), nullptr);
  return v > 0 ? v : -1;
}

} // namespace

void scheduler_matrix(const std::string& only, long n) {
  std::vector<row> rows{
      {"sched_pingpong", pingpong},
      {"sched_request_chain", request_chain},
      {"sched_spawn_burst", spawn_burst},
      {"sched_send_idle", send_idle},
      {"sched_restarts", restarts},
      {"sched_cpu_pool", cpu_pool},
  };
  using sp = troupe::scheduler_policy;
  for (auto& r : rows) {
    if (!only.empty() && only != "scheduler_matrix" && only != r.name) continue;
    // --side troupe: the troupe-policy column only, for comparing builds of troupe's
    // scheduler without the slow columns (stealing's collapse); --side caf: the CAF
    // columns only. What does not run prints 0, and so do the ratios.
    // --column C: that column only, here. Otherwise each column in a process of its own
    // (measure_apart), or all here with TROUPE_BENCH_MATRIX_INPROC=1.
    bool caf_cols = opts.side != "troupe";
    bool own_col = opts.side != "caf";
    auto wanted = [&](const char* c) {
      return opts.column.empty() || opts.column == c;
    };
    static const bool inproc = [] {
      auto* e = std::getenv("TROUPE_BENCH_MATRIX_INPROC");
      return e != nullptr && *e != '\0' && std::string_view{e} != "0";
    }();
    auto column = [&](const char* c, sp policy, size_t threads) {
      if (!wanted(c)) return 0.0;
      if (opts.column.empty() && !inproc) {
        auto v = measure_apart(r.name, c, n);
        if (v > 0) return v;
        std::fprintf(stderr, "%s: column %s measured in this process (its own could not run)\n",
                     r.name, c);
      }
      return measure(policy, threads, r, n);
    };
    auto sharing = caf_cols ? column("sharing", sp::sharing, opts.threads) : 0.0;
    auto stealing = caf_cols ? column("stealing", sp::stealing, opts.threads) : 0.0;
    auto one = caf_cols ? column("one", sp::sharing, 1) : 0.0;
    auto own = own_col ? column("troupe", sp::troupe, opts.threads) : 0.0;
    caf_cols = caf_cols && sharing > 0 && stealing > 0 && one > 0;
    own_col = own_col && own > 0;
    auto best = std::max({sharing, stealing, one});
    auto vs_best = caf_cols && own_col ? own / best : 0.0;
    auto vs_one = caf_cols && own_col ? own / one : 0.0;
    if (opts.json)
      std::printf("{\"scenario\": \"%s\", \"n\": %ld, \"threads\": %zu, \"caf_sharing_per_s\": "
                  "%.0f, \"caf_stealing_per_s\": %.0f, \"caf_1thread_per_s\": %.0f, "
                  "\"caf_troupe_policy_per_s\": %.0f, \"vs_best_caf\": %.3f, "
                  "\"vs_1thread\": %.3f, \"columns\": \"%s\"}\n",
                  r.name, n, opts.threads, sharing, stealing, one, own, vs_best, vs_one,
                  !opts.column.empty() ? "one here" : inproc ? "one process" : "apart");
    else
      std::printf("%-20s n=%-8ld sharing %10.0f  stealing %10.0f  1-thread %10.0f  troupe %10.0f"
                  "   vs best %.3f  vs 1-thread %.3f\n",
                  r.name, n, sharing, stealing, one, own, vs_best, vs_one);
    std::fflush(stdout);
  }
}

} // namespace troupe_bench
