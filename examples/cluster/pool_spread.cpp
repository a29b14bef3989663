// A cluster pool spreading work over two troupe-node processes, one of which is killed
// while its jobs run (three_nodes.sh drives it).
//
//   cluster_pool_spread SEED_PORT
//
// It joins the cluster as node "driver", opens a pool of 4 workers whose jobs run on b and c
// (`pool_spec::remote`, at most once), submits 8 jobs of troupe-node's `demo.work(1500)`
// (which answers the name of the node it ran on), prints `submitted`, and waits. The script
// kills c then. Each job's outcome is printed: the ones running on c fail with node_down,
// the ones still queued run on b; nothing hangs and nothing runs twice.

#include <cstdio>
#include <string>
#include <vector>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;
using troupe::context;
using troupe::task;

task<int> spread(context& cx) {
  troupe::pool_spec spec;
  spec.name = "spread";
  spec.max_concurrent = 4;
  spec.remote.nodes = {"b", "c"};
  spec.remote.retry_on_node_down = false; // at most once: a job on a dead node fails
  auto p = co_await troupe::open_pool(cx, spec);
  if (!p) {
    std::printf("open_pool: %s\n", troupe::render(p.error()).c_str());
    co_return 1;
  }
  std::vector<troupe::pool_task<std::string>> jobs;
  for (int i = 0; i < 8; ++i) {
    auto h = co_await troupe::submit_remote<std::string>(cx, *p, "demo.work", int64_t{1500});
    if (!h) {
      std::printf("submit: %s\n", troupe::render(h.error()).c_str());
      co_return 1;
    }
    jobs.push_back(*h);
  }
  std::printf("submitted %zu jobs\n", jobs.size());
  std::fflush(stdout);
  auto outs = co_await troupe::wait_for_all(cx, jobs);
  if (!outs) co_return 1;
  int failed = 0;
  for (auto& o : *outs) {
    auto v = o.result();
    if (v) {
      std::printf("job %llu ran on %s\n", static_cast<unsigned long long>(o.snapshot.id), v->c_str());
    } else {
      ++failed;
      std::printf("job %llu failed: %s\n", static_cast<unsigned long long>(o.snapshot.id),
                  troupe::render(v.error()).c_str());
    }
  }
  auto snap = co_await troupe::snapshot_of(cx, *p);
  if (snap)
    std::printf("pool: %lld completed, %lld failed, %lld total\n",
                static_cast<long long>(snap->completed), static_cast<long long>(snap->failed),
                static_cast<long long>(snap->total));
  co_return failed;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: cluster_pool_spread SEED_PORT\n");
    return 2;
  }
  troupe::cluster_config c;
  c.node = "driver";
  c.seeds = {{"127.0.0.1", static_cast<uint16_t>(std::stoi(argv[1]))}};
  c.heartbeat = 100ms;
  c.failure_timeout = 1000ms;
  c.insecure = true; // loopback only
  auto rt = troupe::runtime::builder{}.threads(2).cluster(c).build();
  if (!rt) {
    std::fprintf(stderr, "%s\n", troupe::render(rt.error()).c_str());
    return 2;
  }
  for (auto n : {"b", "c"})
    if (!rt->await_member(n, troupe::member_status::up, 10s)) {
      std::fprintf(stderr, "member %s did not come up\n", n);
      return 1;
    }
  auto r = rt->run(spread);
  // What this node saw of the cluster, in order.
  if (auto evs = rt->cluster_next_events(0))
    for (auto& e : *evs)
      std::printf("driver saw: %s %s %s\n", troupe::to_string(e.kind), e.node.c_str(), e.detail.c_str());
  rt->stop();
  return r ? 0 : 1;
}
