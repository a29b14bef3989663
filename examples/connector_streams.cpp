// connector_streams: a one_for_one tree of stream readers. Two fail transiently and back off
// (100, 200, 400 ms...); one keeps failing, spends its budget and trips its circuit: it waits
// circuit_open, gets a half-open try, fails, and the circuit opens again. Virtual time: an
// exact timeline, instantly.
#include <cstdio>
#include <memory>
#include <string>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;

namespace {

using tick_atom = caf::atom_constant<caf::atom("tick")>;

/// A reader that fails after `life_ms` of virtual time (0: never).
caf::behavior reader(caf::event_based_actor* self, troupe::clock* clk, int64_t life_ms) {
  if (life_ms > 0)
    clk->schedule(clk->now() + std::chrono::milliseconds(life_ms),
                  caf::actor_cast<caf::actor>(self), caf::make_message(tick_atom::value));
  return {[self](tick_atom) { self->quit(caf::sec::runtime_error); }};
}

troupe::child_spec reader_spec(troupe::clock& clk, std::string name, int64_t life_ms) {
  troupe::child_spec c;
  c.name = std::move(name);
  auto* k = &clk;
  c.start = [k, life_ms](caf::actor_system& sys) -> troupe::start_result {
    return std::optional<caf::actor>{sys.spawn(reader, k, life_ms)};
  };
  c.backoff_ms = 100;
  c.factor = 2.0;
  c.max_backoff_ms = 800;
  c.jitter_ms = 20;
  return c;
}

caf::behavior printer(caf::event_based_actor*) {
  return {[](const troupe::supervisor_event& e) {
    std::printf("  %6lld ms  %-13s %-9s %s\n", static_cast<long long>(e.at_ms), e.kind.c_str(),
                e.child.c_str(), e.reason.c_str());
  }};
}

} // namespace

int main() {
  auto rt = troupe::runtime::builder{}.virtual_time().build();
  if (!rt) return 1;
  auto& clk = rt->clock();
  troupe::supervisor_spec spec;
  spec.name = "connectors";
  spec.intensity = 100;
  spec.period_ms = 60'000;
  auto kafka = reader_spec(clk, "kafka", 0); // steady
  auto s3 = reader_spec(clk, "s3", 700);     // fails every 700 ms of uptime
  auto mqtt = reader_spec(clk, "mqtt", 50);  // hopeless: fails 50 ms after each start
  mqtt.max_restarts = 3;
  mqtt.window_ms = 10'000;
  mqtt.circuit_open_ms = 2000;
  spec.children = {kafka, s3, mqtt};
  auto sup = rt->supervise(spec);
  if (!sup) {
    std::printf("%s\n", troupe::render(sup.error()).c_str());
    return 1;
  }
  auto p = rt->system().spawn(printer);
  (void)rt->run([&](troupe::context& cx) -> troupe::task<int> {
    (void)co_await cx.request<bool>(sup->actor, troupe::atoms::sup_subscribe_atom::value, p);
    co_return 0;
  });
  std::printf(
      "connectors: kafka steady, s3 flaky, mqtt hopeless (budget 3 in 10 s, circuit 2 s)\n");
  rt->advance(6s);
  auto st = rt->supervisor_state_of(*sup);
  std::printf("\nafter 6 s:\n");
  for (auto& c : st->children)
    std::printf("  %-6s %-13s restarts=%llu %s\n", c.name.c_str(), troupe::to_string(c.status),
                static_cast<unsigned long long>(c.restarts), c.wait_reason.c_str());
  (void)rt->supervisor_stop(*sup, 1s);
  caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  rt->stop();
  return 0;
}
