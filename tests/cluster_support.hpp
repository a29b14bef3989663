#pragma once

// Helpers of the cluster tests (cluster_test.cpp, remote_test.cpp): a node's configuration
// on loopback, its address, and a troupe-node in a child process.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <troupe/troupe.hpp>

#include "child_process.hpp"

namespace troupe_test {

/// A plain-TCP node on loopback with fast heartbeats (50 ms) and a 1 s failure timeout.
inline troupe::cluster_config node_config(std::string name,
                                          std::vector<troupe::node_address> seeds = {}) {
  using namespace std::chrono_literals;
  troupe::cluster_config c;
  c.node = std::move(name);
  c.seeds = std::move(seeds);
  c.heartbeat = 50ms;
  c.failure_timeout = 1000ms;
  c.insecure = true;
  return c;
}

inline troupe::node_address address_of(troupe::runtime& rt) {
  return {"127.0.0.1", rt.cluster_port()};
}

#ifdef TROUPE_NODE
/// Starts troupe-node `name` joining the seed at `seed`; returns once it listens.
inline std::unique_ptr<child_process> start_node(const std::string& name, uint16_t seed) {
  using namespace std::chrono_literals;
  auto json = R"({"threads": 2, "stop_timeout_ms": 2000, "cluster": {"node": ")" + name +
              R"(", "seeds": ["127.0.0.1:)" + std::to_string(seed) +
              R"("], "heartbeat_ms": 50, "failure_timeout_ms": 1000, "insecure": true}})";
  auto p = std::make_unique<child_process>(std::vector<std::string>{TROUPE_NODE, "--json", json});
  auto listening = p->read_line_after("troupe-node " + name + " listening on ", 10s);
  INFO(p->output());
  REQUIRE_FALSE(listening.empty());
  return p;
}
#endif

} // namespace troupe_test
