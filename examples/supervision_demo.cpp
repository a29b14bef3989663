// The main job: a supervision tree under fire, with a live timeline of what the supervisors
// do and the final state. Real time, about two seconds. Every child is a task body
// (`troupe::task_child`): no raw CAF behavior is needed to have something to supervise.
//
//   app (one_for_one)
//   ├── http                     steady
//   ├── ingest (rest_for_one)    reader -> parser -> sink: the parser crashes, so the
//   │                            parser and the sink restart, the reader does not
//   ├── mailer                   crashes three times: exponential backoff 100, 200, 400 ms
//   └── cache                    budget of 2 restarts per 10 s: the third crash suppresses it
//
// `troupe-demo --serve` runs the same tree as a service until SIGINT / SIGTERM / SIGHUP:
// the signal starts the stop choreography (queued jobs, running attempts, the tree in reverse
// order, the stop participants, durability, join) and the process exits 0 within its grace;
// a second signal while stopping ends it at once. `--slow-stop` adds a participant that
// takes 30 s, to try that second signal.
#include <chrono>
#include <cstdio>
#include <string>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;
using troupe::context;
using troupe::task;

namespace {

/// Serve mode: each service says when it stops (the tree stops in reverse start order).
bool g_serve = false;

/// A resident service: it serves the commands sent to its channel `cmd.<name>`; "crash"
/// makes it fail (a thrown exception is the child's failure). A wait with a timeout is
/// never taken for a deadlock, and the supervisor's shutdown cancels the wait gracefully.
troupe::child_spec svc(std::string name) {
  troupe::child_spec c;
  c.name = name;
  c.start = troupe::task_child([name](context& cx) -> task<void> {
    struct say_stopped {
      std::string name;
      ~say_stopped() {
        if (g_serve) {
          std::printf("  service %s stopped\n", name.c_str());
          std::fflush(stdout);
        }
      }
    } said{name};
    auto cmds = co_await troupe::open_channel<std::string>(cx, "cmd." + name, 8);
    if (!cmds) throw troupe::task_error{cmds.error()}; // checked: never `*` an error
    for (;;) {
      auto r = co_await troupe::select(cx, std::vector{*cmds}, {.timeout = 1s});
      if (!r) throw troupe::task_error{r.error()};
      if (r->has_value() && *r->item == "crash")
        throw std::runtime_error(name + " crashed on command");
    }
  });
  return c;
}

/// Sends "crash" to the service `name`.
task<void> crash(context& cx, int64_t t0, const std::string& name) {
  std::printf("  %+7.3fs  chaos   crashes the %s\n", double(cx.clock().wall_ms() - t0) / 1000,
              name.c_str());
  auto ch = co_await troupe::open_channel<std::string>(cx, "cmd." + name, 8);
  if (ch) (void)co_await ch->send(cx, std::string{"crash"});
}

} // namespace

/// Serve mode: the tree runs until a signal; the stop choreography ends the process.
int serve(troupe::runtime& rt, const troupe::supervisor_spec& app, bool slow_stop) {
  g_serve = true;
  auto sup = rt.supervise(app);
  if (!sup) {
    std::fprintf(stderr, "supervise: %s\n", troupe::render(sup.error()).c_str());
    return 1;
  }
  auto report = rt.on_stop("report", [](context&) -> task<void> {
    std::printf("  participant report: flushed\n");
    std::fflush(stdout);
    co_return;
  }, 2s);
  if (report) std::fprintf(stderr, "on_stop: %s\n", troupe::render(report).c_str());
  if (slow_stop)
    (void)rt.on_stop("slow", [](context& cx) -> task<void> {
      std::printf("  participant slow: takes 30 s\n");
      std::fflush(stdout);
      co_await cx.sleep(30s);
    }, 60s);
  std::printf("serving; send SIGINT, SIGTERM or SIGHUP to stop\nready\n");
  std::fflush(stdout);
  rt.wait_stopped(); // the signal's stop has joined everything
  rt.stop();         // closes the actor system on this (the owner's) thread
  std::printf("stop choreography:\n");
  for (auto& step : rt.stop_log())
    std::printf("  %s\n", step.c_str());
  for (auto& n : rt.notices())
    std::printf("  notice %s %s: %s\n", n.kind.c_str(), n.subject.c_str(), n.detail.c_str());
  std::printf("interrupted: %s\nruntime stopped cleanly\n", rt.interrupted() ? "yes" : "no");
  return 0;
}

int main(int argc, char** argv) {
  bool serve_mode = false;
  bool slow_stop = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--serve") {
      serve_mode = true;
    } else if (a == "--slow-stop") {
      slow_stop = true;
    } else {
      std::fprintf(stderr, "usage: %s [--serve [--slow-stop]]\n", argv[0]);
      return 2;
    }
  }
  auto rt = troupe::runtime::builder{}.signals(serve_mode).build();
  if (!rt) {
    std::fprintf(stderr, "cannot start: %s\n", troupe::render(rt.error()).c_str());
    return 1;
  }
  auto t0 = rt->clock().wall_ms(); // the clock supervisor events are stamped with

  troupe::supervisor_spec ingest;
  ingest.name = "ingest";
  ingest.strategy = troupe::strategy::rest_for_one;
  ingest.intensity = 3;
  ingest.children = {svc("reader"), svc("parser"), svc("sink")};

  troupe::supervisor_spec app;
  app.name = "app";
  app.intensity = 10;
  app.period_ms = 10'000;
  auto mailer = svc("mailer");
  mailer.backoff_ms = 100;
  mailer.factor = 2.0;
  mailer.max_backoff_ms = 1000;
  auto cache = svc("cache");
  cache.max_restarts = 2;
  cache.window_ms = 10'000;
  app.children = {svc("http"), troupe::supervisor_child_spec("ingest", rt->clock(), ingest),
                  mailer, cache};

  if (serve_mode) return serve(*rt, app, slow_stop);
  std::printf("troupe supervision demo: a tree of two supervisors, %zu threads\n\n",
              rt->config().threads);
  auto sup = rt->supervise(app);
  if (!sup) {
    std::fprintf(stderr, "supervise: %s\n", troupe::render(sup.error()).c_str());
    return 1;
  }
  // The live timeline: a task subscribed to the top supervisor; the nested one's events
  // arrive path-qualified ("ingest/parser"). It ends when the supervisor does.
  auto timeline = rt->spawn([s = *sup, t0](context& cx) -> task<void> {
    uint64_t cursor = 0;
    for (;;) {
      auto evs = co_await troupe::supervisor_next_events(cx, s, cursor);
      if (!evs || evs->empty()) co_return;
      for (auto& e : *evs)
        std::printf("  %+7.3fs  %-12s %-14s %s\n", double(e.at_ms - t0) / 1000.0, troupe::to_string(e.kind),
                    e.child.empty() ? "(app)" : e.child.c_str(), e.reason.c_str());
      std::fflush(stdout);
      cursor = evs->back().seq;
    }
  });
  auto chaos = rt->run([t0](context& cx) -> task<int> {
    co_await cx.sleep(50ms);
    co_await crash(cx, t0, "parser");
    co_await cx.sleep(100ms);
    for (int i = 0; i < 3; ++i) {
      co_await crash(cx, t0, "mailer");
      co_await cx.sleep(std::chrono::milliseconds(150 << i)); // past its backoff
    }
    for (int i = 0; i < 3; ++i) {
      co_await crash(cx, t0, "cache");
      co_await cx.sleep(50ms);
    }
    co_return 0;
  });
  if (!chaos || *chaos != 0) std::printf("chaos failed\n");
  std::printf("\nstopping the tree (children stop in reverse order):\n");
  auto fin = rt->supervisor_stop(*sup, 5s);
  if (!fin) {
    std::printf("stop failed: %s\n", troupe::render(fin.error()).c_str());
    return 1;
  }
  if (timeline) (void)rt->await(*timeline); // it has printed the last events
  auto events = rt->supervisor_events(*sup);
  std::printf("\nfinal state of %s: %s\n", fin->name.c_str(), troupe::to_string(fin->status));
  std::printf("  %-8s %-11s %-9s %s\n", "child", "status", "restarts", "last error");
  for (auto& c : fin->children)
    std::printf("  %-8s %-11s %-9llu %s\n", c.name.c_str(), troupe::to_string(c.status),
                static_cast<unsigned long long>(c.restarts), c.last_error.c_str());
  std::printf("%zu events recorded\n", events ? events->size() : 0);
  rt->stop();
  std::printf("runtime stopped cleanly\n");
  return 0;
}
