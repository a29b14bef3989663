// The main job: a supervision tree under fire, with a live timeline of what the supervisors
// do and the final state. Real time, about two seconds.
//
//   app (one_for_one)
//   ├── http                     steady
//   ├── ingest (rest_for_one)    reader -> parser -> sink: the parser crashes, so the
//   │                            parser and the sink restart, the reader does not
//   ├── mailer                   crashes three times: exponential backoff 100, 200, 400 ms
//   └── cache                    budget of 2 restarts per 10 s: the third crash suppresses it
#include <chrono>
#include <cstdio>
#include <string>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;

namespace {

using crash_atom = caf::atom_constant<caf::atom("crash")>;

caf::behavior service(caf::event_based_actor* self) {
  return {[self](crash_atom) { self->quit(caf::sec::runtime_error); }};
}

troupe::child_spec svc(std::string name) {
  troupe::child_spec c;
  c.name = std::move(name);
  c.start = [](caf::actor_system& sys) -> troupe::start_result {
    return std::optional<caf::actor>{sys.spawn(service)};
  };
  return c;
}

/// Prints every event of a supervisor as it happens.
caf::behavior timeline(caf::event_based_actor*, std::string sup, int64_t t0) {
  return {[sup, t0](const troupe::supervisor_event& e) {
    std::printf("  %+7.3fs  %-7s %-10s %-8s %s\n", double(e.at_ms - t0) / 1000.0, sup.c_str(),
                e.kind.c_str(), e.child.c_str(), e.reason.c_str());
    std::fflush(stdout);
  }};
}

} // namespace

int main() {
  auto rt = troupe::runtime::builder{}.build();
  if (!rt) {
    std::fprintf(stderr, "cannot start: %s\n", troupe::render(rt.error()).c_str());
    return 1;
  }
  auto t0 = rt->clock().now_ms();

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
  troupe::child_spec ingest_child;
  ingest_child.name = "ingest";
  ingest_child.start = troupe::supervisor_child(rt->clock(), ingest);
  app.children = {svc("http"), ingest_child, mailer, cache};

  std::printf("troupe supervision demo: a tree of two supervisors, %zu threads\n\n",
              rt->config().threads);
  auto sup = rt->supervise(app);
  if (!sup) {
    std::fprintf(stderr, "supervise: %s\n", troupe::render(sup.error()).c_str());
    return 1;
  }
  // The live timeline: both supervisors push their events to a printer.
  auto app_printer = rt->system().spawn(timeline, std::string{"app"}, t0);
  auto ingest_printer = rt->system().spawn(timeline, std::string{"ingest"}, t0);
  auto chaos = rt->run([&](troupe::context& cx) -> troupe::task<int> {
    using troupe::atoms::sup_state_atom;
    using troupe::atoms::sup_subscribe_atom;
    (void)co_await cx.request<bool>(sup->actor, sup_subscribe_atom::value, app_printer);
    auto st = co_await cx.request<troupe::supervisor_state>(sup->actor, sup_state_atom::value);
    if (!st) co_return 1;
    auto ingest_sup = st->children[1].actor;
    (void)co_await cx.request<bool>(ingest_sup, sup_subscribe_atom::value, ingest_printer);
    auto child = [&](const caf::actor& s, size_t i) -> troupe::task<caf::actor> {
      auto x = co_await cx.request<troupe::supervisor_state>(s, sup_state_atom::value);
      co_return x ? x->children[i].actor : caf::actor{};
    };
    std::printf("  %+7.3fs  chaos   crashes the parser\n", double(cx.clock().now_ms() - t0) / 1000);
    caf::anon_send(co_await child(ingest_sup, 1), crash_atom::value);
    co_await cx.sleep(100ms);
    for (int i = 0; i < 3; ++i) {
      std::printf("  %+7.3fs  chaos   crashes the mailer\n",
                  double(cx.clock().now_ms() - t0) / 1000);
      caf::anon_send(co_await child(sup->actor, 2), crash_atom::value);
      co_await cx.sleep(std::chrono::milliseconds(150 << i)); // past its backoff
    }
    for (int i = 0; i < 3; ++i) {
      std::printf("  %+7.3fs  chaos   crashes the cache\n",
                  double(cx.clock().now_ms() - t0) / 1000);
      caf::anon_send(co_await child(sup->actor, 3), crash_atom::value);
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
  auto before = rt->supervisor_events(*sup);
  std::printf("\nfinal state of %s: %s\n", fin->name.c_str(), troupe::to_string(fin->status));
  std::printf("  %-8s %-11s %-9s %s\n", "child", "status", "restarts", "last error");
  for (auto& c : fin->children)
    std::printf("  %-8s %-11s %-9llu %s\n", c.name.c_str(), troupe::to_string(c.status),
                static_cast<unsigned long long>(c.restarts), c.last_error.c_str());
  std::printf("%zu events recorded\n", before ? before->size() : 0);
  caf::anon_send_exit(app_printer, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(ingest_printer, caf::exit_reason::user_shutdown);
  rt->stop();
  std::printf("runtime stopped cleanly\n");
  return 0;
}
