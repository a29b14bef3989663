// Cluster scenarios: two processes on loopback. troupe-bench starts itself again as the
// server process (`--serve-cluster`), which runs a raw-CAF actor system publishing an echo
// actor and a troupe node registering the same echo as the cluster name "echo".
//
// remote_request: n sequential request/response round trips to the remote echo: troupe
// (whereis, then `cx.request` from a task) against raw CAF (`remote_actor`, then a chain
// of `request(...).then(...)` from an event-based actor), in the same run.
// remote_pool_dispatch: n trivial jobs (`submit_remote` of a registered body that returns its
// argument) through a pool of 16 workers whose jobs run on the other node, against raw CAF:
// 16 concurrent request chains to a remote actor, n requests in all (tasks/s, and the ratio).
// failure_detection: a node is killed with SIGKILL; the time until the survivor reports
// member_down, over several rounds (target: within the failure timeout + one heartbeat).

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <caf/io/all.hpp>

#include "bench_support.hpp"

namespace troupe_bench {

namespace {

using namespace std::chrono_literals;

/// The echo both sides talk to: one string in, the same string out.
caf::behavior echo(caf::event_based_actor*) {
  return {[](const std::string& s) { return s; }};
}

/// A server process: troupe-bench started again with `args`; reads its first line.
struct server_process {
  pid_t pid = -1;
  FILE* out = nullptr;
  int in_fd = -1;
  std::string first_line;

  explicit server_process(std::vector<std::string> args) {
    int to_child[2], from_child[2];
    if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) std::exit(3);
    pid = ::fork();
    if (pid == 0) {
      ::dup2(to_child[0], STDIN_FILENO);
      ::dup2(from_child[1], STDOUT_FILENO);
      for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]})
        ::close(fd);
      std::vector<char*> argv;
      static std::string self = "/proc/self/exe";
      argv.push_back(self.data());
      for (auto& a : args)
        argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      ::_exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    in_fd = to_child[1];
    out = ::fdopen(from_child[0], "r");
    char buf[256];
    if (std::fgets(buf, sizeof(buf), out) == nullptr) {
      std::fprintf(stderr, "cluster bench: the server process did not start\n");
      std::exit(3);
    }
    first_line = buf;
  }
  void kill_now() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  ~server_process() {
    if (in_fd >= 0) ::close(in_fd); // EOF on its stdin: the server stops
    if (pid > 0) ::waitpid(pid, nullptr, 0);
    if (out != nullptr) std::fclose(out);
  }
};

troupe::cluster_config node_config(std::string name) {
  troupe::cluster_config c;
  c.node = std::move(name);
  c.insecure = true;
  c.heartbeat = 100ms;
  c.failure_timeout = 1000ms;
  return c;
}

troupe::runtime make_node(troupe::cluster_config c) {
  auto rt = troupe::runtime::builder{}
                .threads(opts.threads)
                .scheduler(opts.policy)
                .max_throughput(opts.max_throughput)
                .cluster(std::move(c))
                .body("bench.noop", [](context&, int64_t x) -> task<int64_t> { co_return x; })
                .build();
  if (!rt) {
    std::fprintf(stderr, "cluster bench: %s\n", troupe::render(rt.error()).c_str());
    std::exit(2);
  }
  return std::move(*rt);
}

struct remote_chain_state {
  long left = 0;
  caf::actor target;
  caf::response_promise done;
};

void remote_chain_next(caf::stateful_actor<remote_chain_state>* self) {
  if (self->state.left-- == 0) {
    self->state.done.deliver(true);
    return;
  }
  self->request(self->state.target, caf::infinite, std::string{"x"})
      .then([self](const std::string&) { remote_chain_next(self); },
            [self](caf::error& e) { self->state.done.deliver(std::move(e)); });
}

/// Raw CAF: `width` concurrent request chains to the remote echo at `port`, `n` requests in
/// all; returns the seconds they took.
double caf_remote_chains(long n, uint16_t port, long width) {
  caf::actor_system_config cfg;
  same_scheduler(cfg);
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  auto target = sys.middleman().remote_actor("127.0.0.1", port);
  if (!target) {
    std::fprintf(stderr, "remote_actor: %s\n", sys.render(target.error()).c_str());
    std::exit(3);
  }
  std::vector<caf::actor> drivers;
  for (long w = 0; w < width; ++w)
    drivers.push_back(sys.spawn([](caf::stateful_actor<remote_chain_state>* self) -> caf::behavior {
      return {[self](long k, caf::actor a) {
        self->state.left = k;
        self->state.target = std::move(a);
        self->state.done = self->make_response_promise();
        remote_chain_next(self);
        return self->state.done;
      }};
    }));
  caf::scoped_actor self{sys};
  auto t0 = clk::now();
  for (auto& d : drivers)
    self->send(d, n / width, *target);
  for (long w = 0; w < width; ++w)
    self->receive([](bool) {}, [&](caf::error& e) {
      std::fprintf(stderr, "caf remote chains: %s\n", sys.render(e).c_str());
    });
  auto s = seconds_since(t0);
  for (auto& d : drivers)
    self->send_exit(d, caf::exit_reason::user_shutdown);
  return s;
}

/// A client node joined to the server node at `port` (exits when it does not come up).
troupe::runtime client_node(const char* scenario, uint16_t port) {
  auto c = node_config("bench-client");
  c.seeds = {{"127.0.0.1", port}};
  auto rt = make_node(c);
  if (!rt.await_member("bench-server", troupe::member_status::up, 10s)) {
    std::fprintf(stderr, "%s: the server node did not come up\n", scenario);
    std::exit(3);
  }
  return rt;
}

double troupe_remote_request(long n, uint16_t port) {
  auto rt = client_node("remote_request", port);
  auto t0 = clk::now();
  auto r = rt.run([n](context& cx) -> task<long> {
    auto echo = co_await troupe::whereis(cx, "echo");
    if (!echo) co_return -1;
    long ok = 0;
    for (long i = 0; i < n; ++i)
      if (co_await cx.request<std::string>(*echo, std::string{"x"})) ++ok;
    co_return ok;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "remote_request: wrong result\n");
  return s;
}

constexpr long pool_width = 16;

double troupe_remote_pool(long n, uint16_t port) {
  auto rt = client_node("remote_pool_dispatch", port);
  auto t0 = clk::now();
  auto r = rt.run([n](context& cx) -> task<int64_t> {
    troupe::pool_spec spec;
    spec.name = "remote-bench";
    spec.max_concurrent = pool_width;
    spec.remote.nodes = {"bench-server"};
    auto p = co_await troupe::open_pool(cx, spec);
    if (!p) co_return -1;
    for (long i = 0; i < n; ++i)
      if (!co_await troupe::submit_remote<int64_t>(cx, *p, "bench.noop", int64_t{i})) co_return -2;
    auto idle = co_await troupe::wait_idle(cx, *p);
    if (!idle) co_return -3;
    co_return idle->completed;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n)
    std::fprintf(stderr, "remote_pool_dispatch: %lld of %ld completed\n",
                 static_cast<long long>(r ? *r : -9), n);
  return s;
}

/// The raw-CAF and the troupe port a `--serve-cluster` process printed.
std::pair<unsigned, unsigned> server_ports(const server_process& srv, const char* scenario) {
  unsigned raw_port = 0, troupe_port = 0;
  if (std::sscanf(srv.first_line.c_str(), "ports %u %u", &raw_port, &troupe_port) != 2) {
    std::fprintf(stderr, "%s: bad server line: %s", scenario, srv.first_line.c_str());
    std::exit(3);
  }
  return {raw_port, troupe_port};
}

} // namespace

int serve_cluster() {
  // raw CAF
  caf::actor_system_config cfg;
  same_scheduler(cfg);
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  auto raw = sys.spawn(echo);
  auto raw_port = sys.middleman().publish(raw, 0, "127.0.0.1");
  // troupe
  auto rt = make_node(node_config("bench-server"));
  auto t_echo = rt.system().spawn(echo);
  if (!raw_port || !rt.register_global("echo", t_echo)) return 3;
  std::printf("ports %u %u\n", static_cast<unsigned>(*raw_port),
              static_cast<unsigned>(rt.cluster_port()));
  std::fflush(stdout);
  char buf[64];
  while (::read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
  }
  caf::anon_send_exit(t_echo, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(raw, caf::exit_reason::user_shutdown);
  rt.stop();
  return 0;
}

void remote_request(long n) {
  server_process srv{{"--serve-cluster"}};
  auto [raw_port, troupe_port] = server_ports(srv, "remote_request");
  // Alternating order: each side once first (the same run), the better of its two.
  auto cs1 = caf_remote_chains(n / 2, static_cast<uint16_t>(raw_port), 1);
  auto ts1 = troupe_remote_request(n / 2, static_cast<uint16_t>(troupe_port));
  auto ts2 = troupe_remote_request(n / 2, static_cast<uint16_t>(troupe_port));
  auto cs2 = caf_remote_chains(n / 2, static_cast<uint16_t>(raw_port), 1);
  auto ts = 2 * std::min(ts1, ts2);
  auto cs = 2 * std::min(cs1, cs2);
  report("remote_request", n, ts, cs);
}

void remote_pool_dispatch(long n) {
  server_process srv{{"--serve-cluster"}};
  auto [raw_port, troupe_port] = server_ports(srv, "remote_pool_dispatch");
  n = n / pool_width * pool_width;
  auto cs = caf_remote_chains(n, static_cast<uint16_t>(raw_port), pool_width);
  auto ts = troupe_remote_pool(n, static_cast<uint16_t>(troupe_port));
  report("remote_pool_dispatch", n, ts, cs);
}

void failure_detection(long rounds) {
  auto c = node_config("bench-survivor");
  auto rt = make_node(c);
  std::vector<double> ms;
  for (long i = 0; i < rounds; ++i) {
    server_process victim{{"--serve-node", "bench-victim", std::to_string(rt.cluster_port())}};
    if (!rt.await_member("bench-victim", troupe::member_status::up, 10s)) {
      std::fprintf(stderr, "failure_detection: the victim did not come up\n");
      std::exit(3);
    }
    auto t0 = clk::now();
    victim.kill_now();
    auto down = rt.await_member("bench-victim", troupe::member_status::down, 10s);
    ms.push_back(seconds_since(t0) * 1000.0);
    if (!down) std::fprintf(stderr, "failure_detection: no member_down\n");
  }
  std::sort(ms.begin(), ms.end());
  auto median = ms[ms.size() / 2];
  auto worst = ms.back();
  auto bound = static_cast<double>((c.failure_timeout + c.heartbeat).count());
  if (opts.json)
    std::printf("{\"scenario\": \"failure_detection\", \"rounds\": %ld, \"median_ms\": %.2f, "
                "\"max_ms\": %.2f, \"bound_ms\": %.0f}\n",
                rounds, median, worst, bound);
  else
    std::printf("%-18s rounds=%-5ld kill -9 -> member_down: median %.2f ms, max %.2f ms "
                "(bound: timeout + heartbeat = %.0f ms)\n",
                "failure_detection", rounds, median, worst, bound);
  std::fflush(stdout);
}

int serve_node(const std::string& name, uint16_t seed) {
  auto c = node_config(name);
  c.seeds = {{"127.0.0.1", seed}};
  auto rt = make_node(c);
  std::printf("up\n");
  std::fflush(stdout);
  char buf[64];
  while (::read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
  }
  rt.stop();
  return 0;
}

} // namespace troupe_bench
