// troupe-node: runs one cluster node from a JSON configuration (the runtime's keys, with a
// `cluster` object), for operations and for multi-node tests.
//
//   troupe-node --config node.json
//   troupe-node --json '{"cluster": {"node": "b", "seeds": ["127.0.0.1:4000"], "insecure": true}}'
//
// It prints `troupe-node <name> listening on <host>:<port>` once it listens, then one line
// per membership change (`event <seq> <kind> <node> <detail>`), and stops on SIGTERM or
// SIGINT with the stop choreography (the members see it leave). Its diagnostic actor is
// registered under the cluster name `node/<name>` and answers text commands:
//   "ping"                      -> "pong <name>"
//   "members"                   -> the members up, this node included, comma-separated
//   "await <node> <status> <ms>" -> "ok", or the error (status: up, down, left; ms -1:
//                                  no timeout); printed as `diag: <command>` when received
//   "whereis <name>"            -> the node of the actor registered under it, or the error
//   "register <name>"           -> registers the diagnostic actor under <name>: "true",
//                                  "false" or the error
//   "echo <text>"               -> "<text>"
// Its demo bodies, for `spawn_on`, `remote_child` and `submit_remote` from other nodes:
//   demo.square(int64 x) -> int64 x*x
//   demo.whoami() -> string: the node's name
//   demo.work(int64 ms) -> string: the node's name, after `ms` milliseconds of its clock
//   demo.service() -> void: prints `demo.service running on <node>`, then runs until it is
//                   cancelled, and prints `demo.service stopped on <node>`
//   demo.fail(string why) -> int64: fails with task_failed (field `demo.fail`, detail `why`)
// The exit status is 0 after a clean stop, 2 for a bad configuration, 1 otherwise.

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include <caf/all.hpp>

#include <troupe/troupe.hpp>

namespace {

using namespace troupe::atoms;

void usage() {
  std::cerr << "usage: troupe-node (--config FILE | --json TEXT)\n";
}

std::string join_up(const std::vector<troupe::member_state>& ms) {
  std::vector<std::string> names;
  for (auto& m : ms)
    if (m.status == troupe::member_status::up) names.push_back(m.info.name);
  std::sort(names.begin(), names.end());
  std::string out;
  for (auto& n : names)
    out += (out.empty() ? "" : ",") + n;
  return out;
}

/// The node's diagnostic actor: text commands, answered by asking the node's directory.
caf::behavior diagnostics(caf::event_based_actor* self, std::string node,
                          troupe::directory_actor dir) {
  auto render = [](const caf::error& e) { return troupe::render(e); };
  return {
      [=](const std::string& line) -> caf::result<std::string> {
        std::istringstream in{line};
        std::string cmd;
        in >> cmd;
        if (cmd == "ping") return "pong " + node;
        if (cmd == "echo") return line.size() > 5 ? line.substr(5) : std::string{};
        auto rp = self->make_response_promise<std::string>();
        if (cmd == "members") {
          self->request(dir, caf::infinite, cl_state_atom::value)
              .then([rp](const std::vector<troupe::member_state>& ms) mutable { rp.deliver(join_up(ms)); },
                    [rp, render](const caf::error& e) mutable { rp.deliver(render(e)); });
        } else if (cmd == "await") {
          std::printf("diag: %s\n", line.c_str()); // a parked command is visible
          std::fflush(stdout);
          std::string who, status;
          int64_t ms = -1;
          in >> who >> status >> ms;
          auto st = status == "down"   ? troupe::member_status::down
                    : status == "left" ? troupe::member_status::left
                                       : troupe::member_status::up;
          self->request(dir, caf::infinite, cl_await_atom::value, who, st, ms)
              .then([rp](const troupe::member_state&) mutable { rp.deliver(std::string{"ok"}); },
                    [rp, render](const caf::error& e) mutable { rp.deliver(render(e)); });
        } else if (cmd == "whereis") {
          std::string name;
          in >> name;
          self->request(dir, caf::infinite, cl_names_atom::value)
              .then(
                  [rp, name](const std::vector<troupe::global_name>& ns) mutable {
                    std::string node = "unknown_name";
                    for (auto& n : ns)
                      if (n.name == name) node = n.node;
                    rp.deliver(node);
                  },
                  [rp, render](const caf::error& e) mutable { rp.deliver(render(e)); });
        } else if (cmd == "register") {
          std::string name;
          in >> name;
          self->request(dir, caf::infinite, cl_register_atom::value, name,
                        caf::actor_cast<caf::actor>(self))
              .then([rp](bool ok) mutable { rp.deliver(std::string{ok ? "true" : "false"}); },
                    [rp, render](const caf::error& e) mutable { rp.deliver(render(e)); });
        } else {
          rp.deliver("unknown command: " + cmd);
        }
        return rp;
      },
  };
}

/// Says when it is destroyed (the service's task ended: cancelled, or its runtime stopped).
struct stop_notice {
  std::string node;
  ~stop_notice() {
    std::printf("demo.service stopped on %s\n", node.c_str());
    std::fflush(stdout);
  }
};

/// Registers the demo bodies of a node named `node`.
void add_demo_bodies(troupe::runtime::builder& b, std::string node) {
  using troupe::context;
  using troupe::task;
  b.body("demo.square", [](context&, int64_t x) -> task<int64_t> { co_return x * x; });
  b.body("demo.whoami", [node](context&) -> task<std::string> { co_return node; });
  b.body("demo.work", [node](context& cx, int64_t ms) -> task<std::string> {
    if (ms > 0) co_await cx.sleep(std::chrono::milliseconds{ms});
    co_return node;
  });
  b.body("demo.service", [node](context& cx) -> task<void> {
    stop_notice notice{node};
    std::printf("demo.service running on %s\n", node.c_str());
    std::fflush(stdout);
    for (;;)
      co_await cx.sleep(std::chrono::hours{1});
  });
  b.body("demo.fail", [](context&, std::string why) -> task<caf::expected<int64_t>> {
    co_return troupe::make_error(troupe::errc::task_failed, "demo.fail", why);
  });
}

/// Prints the node's membership changes as they happen, until the runtime stops.
troupe::task<int> print_events(troupe::context& cx) {
  uint64_t after = 0;
  for (;;) {
    auto evs = co_await troupe::cluster_next_events(cx, after);
    if (!evs || evs->empty()) co_return 0;
    for (auto& e : *evs) {
      std::printf("event %llu %s %s %s\n", static_cast<unsigned long long>(e.seq),
                  troupe::to_string(e.kind), e.node.c_str(), e.detail.c_str());
      after = e.seq;
    }
    std::fflush(stdout);
  }
}

/// Ends `a` (a stop participant's body; the actor by value: it outlives the caller's frame).
troupe::task<void> stop_actor(troupe::context&, caf::actor a) {
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  co_return;
}

} // namespace

int main(int argc, char** argv) {
  troupe::runtime::builder b;
  bool configured = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if ((arg == "--config" || arg == "--json") && i + 1 < argc) {
      if (arg == "--config")
        b.config_file(argv[++i]);
      else
        b.config_json(argv[++i]);
      configured = true;
    } else {
      usage();
      return 2;
    }
  }
  if (!configured) {
    usage();
    return 2;
  }
  b.signals(true);
  auto cfg = b.resolve();
  if (!cfg) {
    std::cerr << "troupe-node: " << troupe::render(cfg.error()) << std::endl;
    return 2;
  }
  add_demo_bodies(b, cfg->cluster.node);
  // The diagnostic actor is registered before the node joins anyone: its name travels in
  // the join, so a member that sees this node up can ask `node/<name>` at once.
  caf::actor diag;
  bool diag_failed = false; // exit status 1, as a failed start (2 is a bad configuration)
  b.before_join([&diag, &diag_failed](troupe::runtime& rt) -> caf::error {
    auto dir = caf::actor_cast<troupe::directory_actor>(
        rt.system().registry().get(troupe::cluster_directory_key()));
    diag = rt.system().spawn(diagnostics, rt.node_name(), dir);
    // A plain actor: the runtime's stop ends it through a participant, also when the build
    // fails after this hook (a signal while the node starts).
    auto stop = rt.on_stop("troupe-node.diag",
                           [a = diag](troupe::context& cx) { return stop_actor(cx, a); });
    if (stop) {
      caf::anon_send_exit(diag, caf::exit_reason::user_shutdown);
      diag_failed = true;
      return stop;
    }
    auto r = rt.register_global("node/" + rt.node_name(), diag);
    if (r) return {};
    caf::anon_send_exit(diag, caf::exit_reason::user_shutdown); // the build fails: nothing waits for it
    diag_failed = true;
    return std::move(r.error());
  });
  auto rt = b.build();
  if (!rt) {
    std::cerr << "troupe-node: " << troupe::render(rt.error()) << std::endl;
    return diag_failed || troupe::is(rt.error(), troupe::errc::runtime_stopped) ? 1 : 2;
  }
  if (rt->node_name().empty()) {
    std::cerr << "troupe-node: the configuration names no cluster.node" << std::endl;
    return 2;
  }
  for (auto& n : rt->notices())
    std::cerr << "troupe-node: warning: " << n.subject << ": " << n.detail << std::endl;
  auto& name = rt->node_name();
  auto printer = rt->spawn(print_events, {.name = "troupe-node.events"});
  std::printf("troupe-node %s listening on %s:%u\n", name.c_str(),
              rt->config().cluster.listen.host.c_str(), static_cast<unsigned>(rt->cluster_port()));
  std::fflush(stdout);
  rt->wait_stopped();
  caf::anon_send_exit(diag, caf::exit_reason::user_shutdown);
  rt->stop();
  std::printf("troupe-node %s stopped\n", name.c_str());
  std::fflush(stdout);
  return 0;
}
