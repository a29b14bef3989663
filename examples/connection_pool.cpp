// connection_pool: a dynamic supervisor (OTP's simple_one_for_one) of connection workers.
// Four idle connections form the baseline; a burst of 40 clients each gets a connection
// (start_child with the client's arguments); every seventh connection crashes once and is
// restarted with the same arguments (transient), then finishes; finished connections
// vanish, and the counts come back to the baseline. Virtual time: exact and instant.
#include <cstdio>
#include <memory>
#include <set>
#include <string>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;
using troupe::context;
using troupe::task;

int main() {
  auto rt = troupe::runtime::builder{}.virtual_time().build();
  if (!rt) return 1;
  auto crashed = std::make_shared<std::set<int>>(); // who crashed already (one thread here)
  auto served = std::make_shared<int>(0);

  troupe::child_template conn;
  conn.name = "conn";
  conn.restart = troupe::restart_mode::on_failure; // a crash restarts it, a finish ends it
  conn.shutdown_ms = 500;
  // args: (int client, int work_ms); client 0 is an idle baseline connection.
  conn.start = troupe::task_child_template(
      [crashed, served](context& cx, const caf::message& args) -> task<void> {
        auto client = args.get_as<int>(0);
        auto work = std::chrono::milliseconds(args.get_as<int>(1));
        if (client == 0) {
          for (;;)
            co_await cx.sleep(1h); // an idle pooled connection
        }
        co_await cx.sleep(work / 2);
        if (client % 7 == 0 && crashed->insert(client).second)
          throw std::runtime_error("client " + std::to_string(client) + ": protocol error");
        co_await cx.sleep(work / 2);
        ++*served;
      });

  troupe::supervisor_spec spec;
  spec.name = "pool";
  spec.intensity = 20; // restarts within the period before the pool gives up
  spec.period_ms = 1000;
  spec.child_template = conn;
  auto pool = rt->supervise(spec);
  if (!pool) {
    std::printf("%s\n", troupe::render(pool.error()).c_str());
    return 1;
  }
  for (int i = 0; i < 4; ++i)
    if (!rt->start_child(*pool, caf::make_message(0, 0))) return 1;
  auto counts = [&](const char* when) {
    auto n = rt->count_children(*pool);
    if (n)
      std::printf("%-22s specs=%llu active=%llu workers=%llu\n", when,
                  static_cast<unsigned long long>(n->specs),
                  static_cast<unsigned long long>(n->active),
                  static_cast<unsigned long long>(n->workers));
    return n ? n->workers : 0; // a dynamic supervisor's specs is 1: its template (OTP)
  };
  auto baseline = counts("baseline:");

  // The burst: 40 clients at once, from a task (each start answers the generated id).
  auto ids = rt->run([p = *pool](context& cx) -> task<std::vector<std::string>> {
    std::vector<std::string> out;
    for (int client = 1; client <= 40; ++client) {
      auto c = co_await troupe::start_child(cx, p, caf::make_message(client, 100 + client * 5));
      if (c) out.push_back(c->name); // checked: an error is a value, never dereferenced
    }
    co_return out;
  });
  if (!ids || ids->empty()) return 1; // front()/back() of an empty vector is UB
  std::printf("burst: %zu connections started (%s ... %s)\n", ids->size(), ids->front().c_str(),
              ids->back().c_str());
  auto peak = counts("under load:");
  rt->advance(150ms);
  counts("after 150 ms:");
  rt->advance(1s);
  auto after = counts("after the burst:");
  auto m = rt->supervisor_metrics_of(*pool);
  auto st = rt->supervisor_state_of(*pool);
  std::printf("served %d clients; %llu crashes, %llu restarts; pool %s\n", *served,
              static_cast<unsigned long long>(m ? m->failures : 0),
              static_cast<unsigned long long>(m ? m->restarts : 0),
              st ? troupe::to_string(st->status) : "?");
  std::printf("counts back to baseline: %s (peak %llu)\n", after == baseline ? "yes" : "NO",
              static_cast<unsigned long long>(peak));
  auto fin = rt->supervisor_stop(*pool, 5s); // the baseline stops concurrently
  std::printf("stopped: %s\n", fin ? troupe::to_string(fin->status) : "?");
  rt->stop();
  return after == baseline ? 0 : 1;
}
