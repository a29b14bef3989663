// A flaky export job under simulation, then a seed sweep that finds an ordering bug.
//
// Part 1 runs one export job on a simulated runtime: its endpoints are slow or failing, the
// simulation injects attempt failures by seed, and the job retries with its policy. The
// whole thing runs on virtual time (seconds of backoff pass at once) and prints the exact
// attempt timeline -- the same for every run with the same seed.
//
// Part 2 hides a lost update in two jobs that count exports with a read-then-write on a
// shared counter. Whether they interleave depends on the scheduler's choices: a sweep over
// 100 seeds finds the seeds where the count comes out wrong, prints the first, and replays
// it to show the bug again, with the same trace.
#include <cstdio>
#include <string>
#include <vector>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;
using troupe::attempt_scope;
using troupe::task;

namespace {

troupe::runtime::builder app() {
  return troupe::runtime::builder{}.lanes(
      {troupe::lane_decl::default_lane(), troupe::lane_decl::concurrent("export", 2)});
}

/// Exports one batch to the first endpoint that answers; moves on to the next endpoint after
/// each failure (the job value is borrowed by one attempt at a time).
struct export_job {
  static constexpr std::string_view lane = "export";
  static constexpr std::string_view job_name = "export";
  static troupe::job_policy policy() { return {.retries = 6, .timeout = 2s}; }
  std::string batch;
  std::vector<std::string> endpoints{"eu-1", "eu-2", "us-1"};
  size_t cursor = 0;

  task<caf::expected<std::string>> attempt(attempt_scope& s) {
    auto ep = endpoints[cursor % endpoints.size()];
    ++cursor; // a failure moves on; a success does not care
    if (ep == "eu-1") { // hangs: the attempt's timeout cuts it
      co_await s.cx().sleep(1h);
      co_return ep;
    }
    if (ep == "eu-2") { // answers 503 after 300 ms
      co_await s.cx().sleep(300ms);
      co_return troupe::make_error(troupe::errc::not_found, "endpoint", ep + " answered 503");
    }
    co_await s.cx().sleep(400ms); // us-1 works
    co_return batch + " exported to " + ep;
  }
};


void timeline(uint64_t seed) {
  troupe::simulation sim{seed, app()};
  sim.faults({.job_attempt = 0.25});
  auto h = sim->submit(export_job{"batch-7"});
  if (!h) {
    std::printf("submit: %s\n", troupe::render(h.error()).c_str());
    return;
  }
  sim.run_for(1min);
  auto r = sim->await(*h);
  std::printf("part 1: the attempt timeline of export job %s (seed %llu)\n", h->id().c_str(),
              static_cast<unsigned long long>(seed));
  for (auto& e : sim.events())
    if (e.kind.rfind("job.", 0) == 0 || e.kind == "fault")
      std::printf("  %+10.3f ms  %-18s %s\n", double(e.at_us) / 1000.0, e.kind.c_str(),
                  e.detail.c_str());
  std::printf("outcome: %s\n\n", r ? r->c_str() : troupe::render(r.error()).c_str());
}

troupe::simulation* g_sim = nullptr; // the simulation part 2 is running (for its marks)

/// Counts one export with a read-then-write: the ordering bug.
struct tally_job {
  static constexpr std::string_view lane = "export";
  static constexpr std::string_view job_name = "tally";
  std::string who;
  task<caf::expected<int64_t>> attempt(attempt_scope& s) {
    auto c = co_await troupe::open_atomic(s.cx(), {.name = "exports"});
    if (!c) co_return std::move(c.error());
    auto v = co_await c->get(s.cx());
    if (!v) co_return std::move(v.error());
    g_sim->mark(who, "read " + std::to_string(*v));
    co_await s.cx().yield_now(); // the window another job may run in
    auto w = co_await c->set(s.cx(), *v + 1);
    if (!w) co_return std::move(w.error());
    g_sim->mark(who, "wrote " + std::to_string(*v + 1));
    co_return *w;
  }
};

struct sweep_result {
  int64_t count = 0;
  std::vector<troupe::trace_entry> trace;
};

sweep_result run_tally(uint64_t seed) {
  troupe::simulation sim{seed, app()};
  g_sim = &sim;
  auto a = sim->submit(tally_job{"tally-a"});
  auto b = sim->submit(tally_job{"tally-b"});
  sim.run_for(1s);
  sweep_result out;
  if (a && b) {
    (void)sim->await(*a);
    (void)sim->await(*b);
    auto n = sim->run([](troupe::context& cx) -> task<caf::expected<int64_t>> {
      auto c = co_await troupe::open_atomic(cx, {.name = "exports"});
      if (!c) co_return std::move(c.error());
      co_return co_await c->get(cx);
    });
    if (n && *n) out.count = **n;
  }
  out.trace = sim.trace();
  g_sim = nullptr;
  return out;
}

} // namespace

int main() {
  timeline(42);
  std::printf("part 2: two tally jobs, 100 seeds\n");
  std::vector<uint64_t> bad;
  for (uint64_t seed = 0; seed < 100; ++seed)
    if (run_tally(seed).count != 2) bad.push_back(seed);
  std::printf("lost update in %zu of 100 seeds\n", bad.size());
  if (bad.empty()) {
    std::printf("no seed reproduces the bug\n");
    return 0;
  }
  auto seed = bad.front();
  auto first = run_tally(seed);
  auto again = run_tally(seed);
  std::printf("seed %llu reproduces it: count %lld instead of 2\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(first.count));
  for (auto& e : first.trace)
    if (e.kind == "mark")
      std::printf("  %+8.3f ms  %s %s\n", double(e.at_us) / 1000.0, e.subject.c_str(),
                  e.detail.c_str());
  std::printf("replayed with seed %llu: count %lld, trace identical: %s (%zu events)\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(again.count),
              first.trace == again.trace ? "yes" : "no", first.trace.size());
  return 0;
}
