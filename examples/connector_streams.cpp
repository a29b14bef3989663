// connector_streams: a channel pipeline under a supervisor tree. Readers put records on the
// channel "raw", three parsers (a subtree of their own) turn them into the channel
// "parsed", a writer counts what arrives. Every child is a task body.
//
//   connectors (one_for_one)
//   ├── kafka     steady reader
//   ├── s3        flaky reader: fails every 700 ms of uptime, backs off 100, 200, 400 ms...
//   ├── mqtt      hopeless reader: fails 50 ms after each start, spends its budget (3 in
//   │             10 s) and trips its circuit: 2 s open, one half-open try, open again
//   ├── parsers (one_for_one)   parser-1..3: a "poison" record crashes the parser that
//   │                           takes it; it is restarted, the others go on
//   └── writer    counts the parsed records
//
// Virtual time: an exact timeline, instantly. Nested events reach the top path-qualified
// ("parsers/parser-2").
#include <cstdio>
#include <string>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;
using troupe::context;
using troupe::task;

namespace {

/// A reader: a record every 100 ms; fails after `life` of uptime (0: never); kafka's
/// fifth record is poison.
troupe::child_spec reader(std::string name, std::chrono::milliseconds life) {
  troupe::child_spec c;
  c.name = name;
  c.start = troupe::task_child([name, life](context& cx) -> task<void> {
    auto raw = co_await troupe::open_channel<std::string>(cx, "raw", 64);
    if (!raw) throw troupe::task_error{raw.error()};
    auto born = cx.now();
    for (int n = 1;; ++n) {
      co_await cx.sleep(std::min<troupe::clock::duration>(100ms, life > 0ms ? life : 100ms));
      if (life > 0ms && cx.now() - born >= life)
        throw std::runtime_error(name + ": connection reset");
      auto rec = name == "kafka" && n == 5 ? std::string{"poison"} : name + ":" + std::to_string(n);
      if (auto sent = co_await raw->send(cx, rec); !sent) co_return; // closed: done
    }
  });
  c.backoff_ms = 100;
  c.factor = 2.0;
  c.max_backoff_ms = 800;
  c.jitter_ms = 20;
  return c;
}

troupe::child_spec parser(std::string name) {
  troupe::child_spec c;
  c.name = name;
  c.start = troupe::task_child([name](context& cx) -> task<void> {
    auto raw = co_await troupe::open_channel<std::string>(cx, "raw", 64);
    auto parsed = co_await troupe::open_channel<std::string>(cx, "parsed", 64);
    if (!raw || !parsed) throw troupe::task_error{raw ? parsed.error() : raw.error()};
    while (auto rec = co_await raw->next(cx)) {
      if (*rec == "poison") throw std::runtime_error(name + ": unparseable record");
      if (!co_await parsed->send(cx, "parsed(" + *rec + ")")) co_return;
    }
  });
  return c;
}

} // namespace

int main() {
  auto rt = troupe::runtime::builder{}.virtual_time().build();
  if (!rt) return 1;
  troupe::supervisor_spec parsers;
  parsers.name = "parsers";
  parsers.intensity = 5;
  parsers.children = {parser("parser-1"), parser("parser-2"), parser("parser-3")};

  auto written = std::make_shared<long>(0);
  troupe::child_spec writer;
  writer.name = "writer";
  writer.start = troupe::task_child([written](context& cx) -> task<void> {
    auto parsed = co_await troupe::open_channel<std::string>(cx, "parsed", 64);
    if (!parsed) throw troupe::task_error{parsed.error()};
    while (auto rec = co_await parsed->next(cx))
      ++*written;
  });

  troupe::supervisor_spec spec;
  spec.name = "connectors";
  spec.intensity = 100;
  spec.period_ms = 60'000;
  auto mqtt = reader("mqtt", 50ms);
  mqtt.max_restarts = 3;
  mqtt.window_ms = 10'000;
  mqtt.circuit_open_ms = 2000;
  spec.children = {reader("kafka", 0ms), reader("s3", 700ms), mqtt,
                   troupe::supervisor_child_spec("parsers", rt->clock(), parsers), writer};
  auto sup = rt->supervise(spec);
  if (!sup) {
    std::printf("%s\n", troupe::render(sup.error()).c_str());
    return 1;
  }
  std::printf("connectors: kafka steady, s3 flaky, mqtt hopeless (budget 3 in 10 s, circuit "
              "2 s), three parsers, one writer\n");
  rt->advance(6s);
  auto events = rt->supervisor_events(*sup);
  if (!events) return 1;
  for (auto& e : *events)
    if (e.kind != troupe::supervisor_event_kind::started &&
        e.kind != troupe::supervisor_event_kind::waiting)
      std::printf("  %6lld ms  %-13s %-16s %s\n", static_cast<long long>(e.at_ms), troupe::to_string(e.kind),
                  e.child.c_str(), e.reason.c_str());
  auto st = rt->supervisor_state_of(*sup);
  if (!st) return 1;
  std::printf("\nafter 6 s:\n");
  for (auto& c : st->children)
    std::printf("  %-8s %-13s restarts=%llu %s\n", c.name.c_str(), troupe::to_string(c.status),
                static_cast<unsigned long long>(c.restarts), c.wait_reason.c_str());
  std::printf("writer wrote %ld records\n", *written);
  (void)rt->supervisor_stop(*sup, 1s);
  rt->stop();
  return 0;
}
