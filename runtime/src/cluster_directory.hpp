#pragma once

// Internal: the directory actor of a cluster node (membership, failure detection, cluster
// names). runtime.cpp spawns and publishes it; the facade (cluster.cpp) talks to it through
// its typed protocol in messages/cluster.hpp.

#include <cstdint>
#include <functional>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <caf/io/middleman_actor.hpp>

#include "troupe/messages/clock.hpp"
#include "troupe/messages/cluster.hpp"
#include "troupe/runtime/config.hpp"

namespace troupe::detail {

/// What a directory needs: its settings, the runtime clock, and the middleman actor that
/// opens connections (the plain one, or the TLS manager's).
struct directory_settings {
  cluster_config cfg;
  troupe::clock* clk = nullptr;
  caf::io::middleman_actor mm;
};

/// A started cluster node: its directory and the port it listens on.
struct cluster_node {
  directory_actor directory;
  uint16_t port = 0;
};

/// Told of every TLS connection this process refuses (its handshake failed: an unknown CA,
/// a rogue certificate, a plain client, garbage): the local port it came in on, the peer's
/// address, and OpenSSL's reason.
using tls_refusal_sink =
    std::function<void(uint16_t local_port, const std::string& peer, const std::string& reason)>;

/// Adds a sink; returns the token that removes it.
uint64_t add_tls_refusal_sink(tls_refusal_sink f);

/// Removes a sink; once it returns, the sink is not running and will not run again.
void remove_tls_refusal_sink(uint64_t token);

/// Spawns the directory, publishes it on the listen address (TLS when configured), registers
/// it in CAF's registry under `cluster_directory_key()`, calls `before_join` (if any: what
/// it registers travels in the node's first join requests, so a member that sees this node
/// up knows those names already), and starts joining the seeds. `runtime_start_failed`
/// (field `cluster.listen`) when the address cannot be bound; `before_join`'s error.
caf::expected<cluster_node>
start_cluster_node(caf::actor_system& sys, const cluster_config& cfg, troupe::clock* clk,
                   std::function<caf::error(const directory_actor&, uint16_t port)> before_join = nullptr);

} // namespace troupe::detail
