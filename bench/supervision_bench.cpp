// Supervision at scale: how start, stop, terminate + delete and a mass exit grow from 1k to
// 100k children; memory per supervised idle child; dynamic children started and stopped one
// after another against raw CAF spawn + monitor + exit.

#include <malloc.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench_support.hpp"

namespace troupe_bench {

namespace {

using finish_atom = caf::atom_constant<caf::atom("b_finish")>;
using go_atom = caf::atom_constant<caf::atom("b_go")>;

caf::behavior idle(caf::event_based_actor* self) {
  return {[self](finish_atom) { self->quit(); }, [](int) {}};
}

troupe::start_result start_idle(caf::actor_system& sys) {
  return std::optional<caf::actor>{sys.spawn(idle)};
}

troupe::supervisor_spec many(long n, bool significant) {
  troupe::supervisor_spec spec;
  spec.name = "scale";
  spec.intensity = 1'000'000'000;
  if (significant) spec.auto_shutdown = troupe::auto_shutdown::all_significant;
  spec.children.reserve(static_cast<size_t>(n));
  for (long i = 0; i < n; ++i) {
    troupe::child_spec c;
    c.name = "w" + std::to_string(i);
    c.start = start_idle;
    if (significant) {
      c.restart = troupe::restart_mode::on_failure;
      c.significant = true;
    }
    spec.children.push_back(std::move(c));
  }
  return spec;
}

troupe::supervisor_ref must(caf::expected<troupe::supervisor_ref> x) {
  if (!x) {
    std::fprintf(stderr, "supervise: %s\n", troupe::render(x.error()).c_str());
    std::exit(2);
  }
  return std::move(*x);
}

struct scale_times {
  double start = 0;
  double stop = 0;
  double terminate_delete = 0;
  double mass_exit = 0;
};

scale_times measure(long n) {
  auto rt = make_runtime();
  scale_times out;
  { // start and stop
    auto spec = many(n, false);
    auto t0 = clk::now();
    auto sup = must(rt.supervise(std::move(spec)));
    out.start = seconds_since(t0);
    t0 = clk::now();
    (void)rt.supervisor_stop(sup, std::chrono::seconds(600));
    out.stop = seconds_since(t0);
  }
  { // terminate + delete every child, one by one, from a task
    auto sup = must(rt.supervise(many(n, false)));
    auto t0 = clk::now();
    auto r = rt.run([sup, n](context& cx) -> task<long> {
      long done = 0;
      for (long i = n; i-- > 0;) {
        auto name = "w" + std::to_string(i);
        auto t = co_await troupe::terminate_child(cx, sup, name);
        auto d = co_await troupe::delete_child(cx, sup, name);
        done += (t && d && *d) ? 1 : 0;
      }
      co_return done;
    });
    out.terminate_delete = seconds_since(t0);
    if (!r || *r != n) std::fprintf(stderr, "terminate+delete: %ld of %ld\n", r ? *r : -1, n);
    (void)rt.supervisor_stop(sup, std::chrono::seconds(60));
  }
  { // a mass exit: every child ends at once; the supervisor ends after the last one
    auto sup = must(rt.supervise(many(n, true)));
    auto kids = rt.which_children(sup);
    auto t0 = clk::now();
    for (auto& k : *kids)
      caf::anon_send(k.actor, finish_atom::value);
    (void)rt.supervisor_wait(sup);
    out.mass_exit = seconds_since(t0);
  }
  return out;
}

/// The same work in raw CAF (the supervisor's phases without a supervisor), under the same
/// scheduler: how much of a phase's growth from 1k to 100k is the machine's, not troupe's.
struct raw_times {
  double spawn = 0;     // spawn n idle actors from outside the actor system
  double stop = 0;      // one actor stops them in reverse order: an exit, then its down
  double mass_exit = 0; // n actors end at once; one actor collects the n downs
};

/// One actor holding n idle actors, monitoring each (as a supervisor watches its children):
/// it stops them one by one in reverse order (an exit, then the down), or, in a mass exit,
/// tells them all to finish and collects the downs, letting go of each ended actor as its
/// down comes (as a supervisor does: the last reference, and the actor's teardown, are its).
struct raw_stopper_state {
  std::vector<caf::actor> kids;                        // the stop, in start order
  std::unordered_map<caf::actor_id, caf::actor> by_id; // the mass exit
  bool mass = false;
  caf::actor waiter;
};

using raw_done_atom = caf::atom_constant<caf::atom("b_rdone")>;
using raw_ready_atom = caf::atom_constant<caf::atom("b_rready")>;
using raw_stop_atom = caf::atom_constant<caf::atom("b_rstop")>;
using raw_mass_atom = caf::atom_constant<caf::atom("b_rmass")>;

caf::behavior raw_stopper(caf::stateful_actor<raw_stopper_state>* self,
                          std::vector<caf::actor> kids, bool mass) {
  auto& st = self->state;
  st.mass = mass;
  for (auto& k : kids)
    self->monitor(k);
  if (mass) {
    st.by_id.reserve(kids.size());
    for (auto& k : kids)
      st.by_id.emplace(k.id(), std::move(k));
  } else {
    st.kids = std::move(kids);
  }
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.mass) {
      st.by_id.erase(dm.source.id());
      if (st.by_id.empty()) self->send(st.waiter, raw_done_atom::value);
      return;
    }
    st.kids.pop_back(); // the stop: the next one, in reverse order
    if (st.kids.empty())
      self->send(st.waiter, raw_done_atom::value);
    else
      self->send_exit(st.kids.back(), caf::exit_reason::user_shutdown);
  });
  return {
      [](raw_ready_atom) { return true; }, // the monitors are set: the clock may start
      [self](raw_stop_atom, caf::actor& waiter) {
        auto& st = self->state;
        st.waiter = std::move(waiter);
        if (st.kids.empty())
          self->send(st.waiter, raw_done_atom::value);
        else
          self->send_exit(st.kids.back(), caf::exit_reason::user_shutdown);
      },
      [self](raw_mass_atom, caf::actor& waiter) {
        auto& st = self->state;
        st.waiter = std::move(waiter);
        if (st.by_id.empty()) self->send(st.waiter, raw_done_atom::value);
        for (auto& [id, k] : st.by_id)
          self->send(k, finish_atom::value);
      },
  };
}

raw_times raw_measure(long n) {
  caf_env env;
  raw_times out;
  auto spawn_all = [&] {
    std::vector<caf::actor> kids;
    kids.reserve(static_cast<size_t>(n));
    for (long i = 0; i < n; ++i)
      kids.push_back(env.sys->spawn(idle));
    return kids;
  };
  caf::scoped_actor self{*env.sys};
  auto run = [&](auto atom, std::vector<caf::actor> kids, bool mass) {
    auto stopper = env.sys->spawn(raw_stopper, std::move(kids), mass);
    // Untimed: its start, which monitors every actor (a supervisor does so as it starts).
    self->request(stopper, caf::infinite, raw_ready_atom::value).receive([](bool) {}, [](caf::error&) {});
    auto t0 = clk::now();
    self->send(stopper, atom, caf::actor{self});
    self->receive([](raw_done_atom) {});
    auto s = seconds_since(t0);
    self->send_exit(stopper, caf::exit_reason::user_shutdown);
    return s;
  };
  auto t0 = clk::now();
  auto kids = spawn_all();
  out.spawn = seconds_since(t0);
  out.stop = run(raw_stop_atom::value, std::move(kids), false);
  out.mass_exit = run(raw_mass_atom::value, spawn_all(), true);
  return out;
}

/// Bytes per idle child: a supervised one, and a raw CAF actor held in a vector.
std::pair<double, double> memory_per_child(long n) {
  auto rt = make_runtime();
  auto spec = many(n, false); // the specs the user built are not the supervisor's cost
  malloc_trim(0);
  auto before = rss_kib();
  auto sup = must(rt.supervise(std::move(spec)));
  auto sup_kib = rss_kib() - before;
  (void)rt.supervisor_stop(sup, std::chrono::seconds(600));
  malloc_trim(0);
  before = rss_kib();
  std::vector<caf::actor> raw;
  raw.reserve(static_cast<size_t>(n));
  for (long i = 0; i < n; ++i)
    raw.push_back(rt.system().spawn(idle));
  auto raw_kib = rss_kib() - before;
  for (auto& a : raw)
    caf::anon_send_exit(a, caf::exit_reason::kill);
  raw.clear();
  return {sup_kib * 1024.0 / static_cast<double>(n), raw_kib * 1024.0 / static_cast<double>(n)};
}

} // namespace

/// The median of each phase's measurements.
static scale_times median_of(const std::vector<scale_times>& runs) {
  auto med = [&](double scale_times::*f) {
    std::vector<double> v;
    for (auto& r : runs)
      v.push_back(r.*f);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {med(&scale_times::start), med(&scale_times::stop), med(&scale_times::terminate_delete),
          med(&scale_times::mass_exit)};
}

void supervisor_scale(long n) {
  long small = std::max(n / 100, 1L);
  // Medians of 9 small and 3 big runs, each side (one run of a 1k tree takes a few ms: a
  // single one is at the mercy of a scheduler hiccup), interleaved so that both sizes meet
  // the same machine: this one changes speed by up to 2-3x between minutes, and a ratio of
  // a 1k figure taken in one speed to a 100k figure taken in another is off by as much.
  // The same work in raw CAF, measured alongside, shows how much of a phase's growth is the
  // machine's: 100k actors are memory the process has not touched yet, 1k fit in caches.
  std::vector<scale_times> smalls, bigs;
  std::vector<raw_times> raw_smalls, raw_bigs;
  for (int round = 0; round < 3; ++round) {
    smalls.push_back(measure(small));
    raw_smalls.push_back(raw_measure(small));
    smalls.push_back(measure(small));
    raw_smalls.push_back(raw_measure(small));
    bigs.push_back(measure(n));
    raw_bigs.push_back(raw_measure(n));
    smalls.push_back(measure(small));
    raw_smalls.push_back(raw_measure(small));
  }
  auto a = median_of(smalls);
  auto b = median_of(bigs);
  auto raw_median = [](const std::vector<raw_times>& runs, double raw_times::*f) {
    std::vector<double> v;
    for (auto& r : runs)
      v.push_back(r.*f);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double raw_a = raw_median(raw_smalls, &raw_times::spawn);
  double raw_b = raw_median(raw_bigs, &raw_times::spawn);
  double raw_stop_a = raw_median(raw_smalls, &raw_times::stop);
  double raw_stop_b = raw_median(raw_bigs, &raw_times::stop);
  double raw_mass_a = raw_median(raw_smalls, &raw_times::mass_exit);
  double raw_mass_b = raw_median(raw_bigs, &raw_times::mass_exit);
  auto [sup_bytes, raw_bytes] = memory_per_child(n);
  auto ratio = [](double big, double little) { return little > 0 ? big / little : 0.0; };
  double worst = std::max({ratio(b.start, a.start), ratio(b.stop, a.stop),
                           ratio(b.terminate_delete, a.terminate_delete),
                           ratio(b.mass_exit, a.mass_exit)});
  if (opts.json) {
    std::printf("{\"scenario\": \"supervisor_scale\", \"small\": %ld, \"n\": %ld, "
                "\"start_s\": [%.4f, %.4f], \"start_ratio\": %.1f, "
                "\"stop_s\": [%.4f, %.4f], \"stop_ratio\": %.1f, "
                "\"terminate_delete_s\": [%.4f, %.4f], \"terminate_delete_ratio\": %.1f, "
                "\"mass_exit_s\": [%.4f, %.4f], \"mass_exit_ratio\": %.1f, "
                "\"worst_ratio\": %.1f, \"target_ratio\": 150, "
                "\"raw_caf_spawn_s\": [%.4f, %.4f], \"raw_caf_spawn_ratio\": %.1f, "
                "\"raw_caf_stop_s\": [%.4f, %.4f], \"raw_caf_stop_ratio\": %.1f, "
                "\"raw_caf_mass_exit_s\": [%.4f, %.4f], \"raw_caf_mass_exit_ratio\": %.1f, "
                "\"bytes_per_supervised_child\": %.0f, \"bytes_per_raw_actor\": %.0f, "
                "\"overhead_bytes\": %.0f, \"threads\": %zu}\n",
                small, n, a.start, b.start, ratio(b.start, a.start), a.stop, b.stop,
                ratio(b.stop, a.stop), a.terminate_delete, b.terminate_delete,
                ratio(b.terminate_delete, a.terminate_delete), a.mass_exit, b.mass_exit,
                ratio(b.mass_exit, a.mass_exit), worst, raw_a, raw_b, ratio(raw_b, raw_a),
                raw_stop_a, raw_stop_b, ratio(raw_stop_b, raw_stop_a), raw_mass_a, raw_mass_b,
                ratio(raw_mass_b, raw_mass_a), sup_bytes, raw_bytes,
                sup_bytes - raw_bytes, opts.threads);
  } else {
    std::printf("supervisor_scale   %ld -> %ld children (target: each x <= 150)\n", small, n);
    std::printf("  start            %8.4f s -> %8.4f s   x%.1f\n", a.start, b.start,
                ratio(b.start, a.start));
    std::printf("  stop             %8.4f s -> %8.4f s   x%.1f\n", a.stop, b.stop,
                ratio(b.stop, a.stop));
    std::printf("  terminate+delete %8.4f s -> %8.4f s   x%.1f\n", a.terminate_delete,
                b.terminate_delete, ratio(b.terminate_delete, a.terminate_delete));
    std::printf("  mass exit        %8.4f s -> %8.4f s   x%.1f\n", a.mass_exit, b.mass_exit,
                ratio(b.mass_exit, a.mass_exit));
    std::printf("  raw CAF, the same work without a supervisor (same scheduler):\n");
    std::printf("    spawn          %8.4f s -> %8.4f s   x%.1f\n", raw_a, raw_b,
                ratio(raw_b, raw_a));
    std::printf("    stop           %8.4f s -> %8.4f s   x%.1f   (one actor: an exit, then the "
                "down, in reverse order)\n",
                raw_stop_a, raw_stop_b, ratio(raw_stop_b, raw_stop_a));
    std::printf("    mass exit      %8.4f s -> %8.4f s   x%.1f   (one actor collects the downs)\n",
                raw_mass_a, raw_mass_b, ratio(raw_mass_b, raw_mass_a));
    std::printf("  memory per idle child: supervised %.0f B, raw CAF actor %.0f B, overhead %.0f B "
                "(target <= 1024)\n",
                sup_bytes, raw_bytes, sup_bytes - raw_bytes);
  }
  std::fflush(stdout);
}

// -- dynamic_start_stop ------------------------------------------------------------------------

namespace {

double troupe_dynamic(long n, long clients = 1) {
  auto rt = make_runtime();
  troupe::supervisor_spec spec;
  spec.name = "dyn";
  spec.intensity = 1'000'000'000;
  troupe::child_template t;
  t.name = "c";
  t.start = [](caf::actor_system& sys, const caf::message&) { return start_idle(sys); };
  spec.child_template = t;
  auto sup = must(rt.supervise(spec));
  auto t0 = clk::now();
  // `clients` tasks, each starting and terminating its share one cycle after the other.
  auto r = rt.run([sup, n, clients](context& cx) -> task<long> {
    auto counts = co_await cx.parallel(
        static_cast<size_t>(clients), [sup, n, clients](context& c, size_t) -> task<long> {
          long done = 0;
          caf::message args;
          for (long i = 0; i < n / clients; ++i) {
            auto ch = co_await troupe::start_child(c, sup, args);
            if (!ch) continue;
            auto s = co_await troupe::terminate_child(c, sup, ch->name);
            done += (s && *s) ? 1 : 0;
          }
          co_return done;
        });
    long done = 0;
    if (counts)
      for (auto k : *counts)
        done += k;
    co_return done;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "dynamic_start_stop: %ld of %ld\n", r ? *r : -1, n);
  (void)rt.supervisor_stop(sup, std::chrono::seconds(5));
  return s;
}

double caf_dynamic(long n) {
  caf_env env;
  auto driver = env.sys->spawn([](caf::stateful_actor<countdown_state>* self) -> caf::behavior {
    auto next = [self] {
      auto a = self->spawn(idle);
      self->monitor(a);
      self->send_exit(a, caf::exit_reason::user_shutdown);
    };
    self->set_down_handler([self, next](caf::down_msg&) {
      if (--self->state.left == 0) {
        self->state.done.deliver(true);
        return;
      }
      next();
    });
    return {[self, next](go_atom, long count) {
      self->state.left = count;
      self->state.done = self->make_response_promise();
      next();
      return self->state.done;
    }};
  });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  self->request(driver, caf::infinite, go_atom::value, n)
      .receive([](bool) {}, [](caf::error&) { std::fprintf(stderr, "caf cycle failed\n"); });
  auto s = seconds_since(t0);
  self->send_exit(driver, caf::exit_reason::user_shutdown);
  return s;
}

using start_atom = caf::atom_constant<caf::atom("b_start")>;
using stop_atom = caf::atom_constant<caf::atom("b_stop")>;

struct server_state {
  std::unordered_map<caf::actor_id, caf::actor> kids;
  std::unordered_map<caf::actor_id, caf::response_promise> stopping;
};

struct client_state {
  long left = 0;
  caf::response_promise done;
};

/// The same architecture in raw CAF: a client asks a server actor to start a child (spawn +
/// monitor, answered with its id) and then to stop it (exit, answered at its down message),
/// one after the other.
double caf_dynamic_via_server(long n) {
  caf_env env;
  auto server = env.sys->spawn([](caf::stateful_actor<server_state>* self) -> caf::behavior {
    self->set_down_handler([self](caf::down_msg& dm) {
      auto id = dm.source.id();
      self->state.kids.erase(id);
      auto i = self->state.stopping.find(id);
      if (i != self->state.stopping.end()) {
        i->second.deliver(true);
        self->state.stopping.erase(i);
      }
    });
    return {
        [self](start_atom) {
          auto a = self->spawn(idle);
          self->monitor(a);
          auto id = a.id();
          self->state.kids.emplace(id, std::move(a));
          return static_cast<uint64_t>(id);
        },
        [self](stop_atom, uint64_t id) -> caf::result<bool> {
          auto i = self->state.kids.find(id);
          if (i == self->state.kids.end()) return false;
          self->send_exit(i->second, caf::exit_reason::user_shutdown);
          auto rp = self->make_response_promise();
          self->state.stopping.emplace(id, rp);
          return rp;
        },
    };
  });
  auto client = env.sys->spawn([server](caf::stateful_actor<client_state>* self) -> caf::behavior {
    auto step = std::make_shared<std::function<void()>>();
    *step = [self, server, step] {
      self->request(server, caf::infinite, start_atom::value).then([self, server, step](uint64_t id) {
        self->request(server, caf::infinite, stop_atom::value, id).then([self, step](bool) {
          if (--self->state.left == 0) {
            self->state.done.deliver(true);
            return;
          }
          (*step)();
        });
      });
    };
    return {[self, step](go_atom, long count) {
      self->state.left = count;
      self->state.done = self->make_response_promise();
      (*step)();
      return self->state.done;
    }};
  });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  self->request(client, caf::infinite, go_atom::value, n)
      .receive([](bool) {}, [](caf::error&) { std::fprintf(stderr, "caf via server failed\n"); });
  auto s = seconds_since(t0);
  self->send_exit(client, caf::exit_reason::user_shutdown);
  self->send_exit(server, caf::exit_reason::user_shutdown);
  return s;
}

} // namespace

void dynamic_start_stop(long n) {
  // The ratio compares the same architecture (a client asking a supervisor, awaiting each
  // answer); the bare spawn + monitor + exit loop of one actor is printed beside it.
  // `--side` runs one side's two figures (the other side's print as infinitely slow).
  bool troupe_side = opts.side != "caf", caf_side = opts.side != "troupe";
  constexpr double never = std::numeric_limits<double>::infinity();
  auto ts = troupe_side ? troupe_dynamic(n) : never;
  auto cs = caf_side ? caf_dynamic_via_server(n) : never;
  auto ds = caf_side ? caf_dynamic(n) : never;
  auto ps = troupe_side ? troupe_dynamic(n - n % 8, 8) : never;
  double t = n / ts, c = n / cs, d = n / ds, p = (n - n % 8) / ps;
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; }; // 0: a side skipped
  if (opts.json)
    std::printf("{\"scenario\": \"dynamic_start_stop\", \"n\": %ld, \"troupe_per_s\": %.0f, "
                "\"caf_per_s\": %.0f, \"ratio\": %.3f, \"caf_direct_per_s\": %.0f, "
                "\"ratio_direct\": %.3f, \"troupe_8_clients_per_s\": %.0f, "
                "\"ratio_8_clients_direct\": %.3f, \"threads\": %zu}\n",
                n, t, c, ratio(t, c), d, ratio(t, d), p, ratio(p, d), opts.threads);
  else
    std::printf("%-18s n=%-8ld troupe %12.0f/s   caf %12.0f/s   ratio %.3f   (caf direct "
                "%.0f/s, ratio %.3f; 8 clients %.0f/s, ratio to direct %.3f)\n",
                "dynamic_start_stop", n, t, c, ratio(t, c), d, ratio(t, d), p, ratio(p, d));
  std::fflush(stdout);
}

// -- supervisor_restart: a child that fails at once, restarted N times -----------------------

caf::behavior crash_at_once(caf::event_based_actor* self) {
  self->quit(caf::sec::runtime_error);
  return {};
}

caf::behavior stay(caf::event_based_actor*) {
  return {[](int) {}};
}

double troupe_supervisor_restart(long n) {
  auto rt = make_runtime();
  struct done_flag {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
  };
  auto flag = std::make_shared<done_flag>();
  auto starts = std::make_shared<long>(0);
  troupe::supervisor_spec spec;
  spec.name = "bench";
  spec.intensity = 1'000'000'000;
  spec.period_ms = 1000;
  troupe::child_spec c;
  c.name = "crasher";
  c.start = [n, flag, starts](caf::actor_system& sys) -> troupe::start_result {
    if (++*starts > n) { // the last start: stays up and says so
      {
        std::lock_guard<std::mutex> g{flag->m};
        flag->done = true;
      }
      flag->cv.notify_all();
      return std::optional<caf::actor>{sys.spawn(stay)};
    }
    return std::optional<caf::actor>{sys.spawn(crash_at_once)};
  };
  spec.children = {c};
  auto t0 = clk::now();
  auto sup = rt.supervise(spec);
  if (!sup) {
    std::fprintf(stderr, "supervise: %s\n", troupe::render(sup.error()).c_str());
    return 1;
  }
  {
    std::unique_lock<std::mutex> lock{flag->m};
    flag->cv.wait(lock, [&] { return flag->done; });
  }
  auto s = seconds_since(t0);
  print_sched_counters(rt.system(), "supervisor_restart");
  (void)rt.supervisor_stop(*sup, std::chrono::seconds(5));
  return s;
}

double caf_supervisor_restart(long n) {
  caf_env env;
  auto driver = env.sys->spawn([](caf::stateful_actor<countdown_state>* self) -> caf::behavior {
    self->set_down_handler([self](caf::down_msg&) {
      if (--self->state.left == 0) {
        self->state.done.deliver(true);
        return;
      }
      self->spawn<caf::monitored>(crash_at_once);
    });
    return {[self](go_atom, long count) {
      self->state.left = count;
      self->state.done = self->make_response_promise();
      self->spawn<caf::monitored>(crash_at_once);
      return self->state.done;
    }};
  });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  self->request(driver, caf::infinite, go_atom::value, n)
      .receive([](bool) {}, [](caf::error&) { std::fprintf(stderr, "caf respawn failed\n"); });
  auto s = seconds_since(t0);
  self->send_exit(driver, caf::exit_reason::user_shutdown);
  return s;
}

} // namespace troupe_bench
