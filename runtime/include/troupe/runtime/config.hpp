#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include <caf/expected.hpp>

namespace troupe {

/// The scheduling policy: `troupe` (troupe's own: per-thread queues, a "next to run" slot
/// for the actor just messaged, a shared injection queue, stealing half a queue; see
/// docs/scheduler.md), or one of CAF's: `sharing` (one shared queue) or `stealing`
/// (per-thread queues with work stealing).
enum class scheduler_policy : uint8_t { sharing, stealing, troupe };

/// Returns "sharing", "stealing" or "troupe".
std::string_view to_string(scheduler_policy x) noexcept;

/// Returns the default number of scheduler threads: the machine's cores (at least 1).
size_t default_threads() noexcept;

/// A `host:port` address (a listen address, a seed).
struct node_address {
  std::string host;
  uint16_t port = 0;
  friend bool operator==(const node_address&, const node_address&) = default;
};

/// Returns `host:port` parsed (`config_out_of_range` naming `field` when malformed: no
/// colon, an empty host, a port that is not a number in 0..65535).
[[nodiscard]] caf::expected<node_address> parse_node_address(std::string_view text,
                                                           const std::string& field);

/// A runtime's place in a cluster (JSON object `cluster`). With no `node` the runtime is
/// not a cluster node and loads no network layer.
struct cluster_config {
  /// The node's name, unique in the cluster (JSON `node`): letters, digits, `-`, `_`, `.`.
  std::string node;
  /// Where the node's directory listens (JSON `listen`, `"host:port"`; port 0: any).
  node_address listen{"127.0.0.1", 0};
  /// The address other nodes are told to connect to (JSON `advertise`); empty host: the
  /// listen host; port 0: the bound port. For a node behind a proxy or a NAT.
  node_address advertise{};
  /// Nodes to join through (JSON `seeds`, `["host:port", ...]`); none: the node starts a
  /// cluster of its own, which others join.
  std::vector<node_address> seeds;
  /// How often the node tells each member it lives (JSON `heartbeat_ms`, 10..60000).
  std::chrono::milliseconds heartbeat{500};
  /// A member not heard from for this long is down (JSON `failure_timeout_ms`, more than
  /// `heartbeat_ms`, up to 600000). A member whose connection breaks is down at once.
  std::chrono::milliseconds failure_timeout{3000};
  /// Plain TCP without TLS (JSON `insecure`): allowed only when set, and logged as a
  /// warning (`notices()`).
  bool insecure = false;
  /// Mutual TLS (JSON `tls`: `certificate`, `key`, `cafile`, PEM file paths): every node
  /// presents a certificate signed by the cluster CA and refuses one that does not.
  std::string tls_certificate;
  std::string tls_key;
  std::string tls_cafile;
  /// Shares this node's storage (the runtime's database) with the cluster under this name
  /// (JSON `share_storage`): the storage opens at boot and is registered as the cluster
  /// name `troupe.storage/<name>`. Letters, digits, `-`, `_`, `.`.
  std::string share_storage;
  /// Uses the storage another node shares under this name (JSON `remote_storage`) as this
  /// runtime's storage: the event log, durable channels, durable pools and the rate limiter
  /// write there, through its node. Its node's death is `storage_unavailable`, never a hang.
  /// Not with `share_storage`. `storage_at(path)` stays a local file.
  std::string remote_storage;

  /// Returns whether TLS is configured (all three files named).
  [[nodiscard]] bool tls() const noexcept {
    return !tls_certificate.empty() && !tls_key.empty() && !tls_cafile.empty();
  }
};

/// The runtime's settings. Defaults were chosen by measurement (README, "Scheduler").
struct runtime_config {
  /// Scheduler threads (JSON `threads`, 1..256); default: one per core.
  size_t threads = default_threads();
  /// Scheduling policy (JSON `scheduler`: "troupe" | "sharing" | "stealing").
  scheduler_policy policy = scheduler_policy::troupe;
  /// Messages an actor handles before it yields its thread to others; 0 = unlimited
  /// (JSON `max_throughput`). Unlimited lets one busy actor (a task looping on
  /// `yield_now`, a flooded mailbox) starve the others on its thread.
  size_t max_throughput = 100;
  /// Threads of the spawn_blocking executor (JSON `blocking_threads`, 1..1024).
  size_t blocking_threads = 4;
  /// Virtual time: a deterministic single-threaded scheduler and a virtual clock that moves
  /// only when advanced (JSON `virtual_time`). For tests and simulations.
  bool virtual_time = false;
  /// The embedded database of the persistence layer (JSON `storage`).
  std::string storage = ".troupe/state.sqlite";
  /// How long `stop()` waits for tasks to end before killing them (JSON `stop_timeout_ms`).
  std::chrono::milliseconds stop_timeout{5000};
  /// How long every live task must stay stuck on channel operations before the deadlock
  /// detector fails those waits with `deadlock` (JSON `deadlock_check_ms`); 0 turns the
  /// detector off.
  std::chrono::milliseconds deadlock_check{100};
  /// Storage: `synchronous=FULL` so that commits survive power loss, not only a killed
  /// process (JSON `storage_fsync`).
  bool storage_fsync = false;
  /// Storage: how long a write waits for a lock another process holds before
  /// `storage_busy` (JSON `storage_busy_timeout_ms`, 0..3600000).
  std::chrono::milliseconds storage_busy_timeout{5000};
  /// Storage: the most writes one transaction takes (JSON `storage_max_batch`, 1..1000000).
  size_t storage_max_batch = 8192;
  /// Durable channels: the events a session channel keeps in memory; beyond, the oldest go
  /// (with their idempotency ids). JSON `session_channel_capacity`, 1..10000000.
  size_t session_channel_capacity = 10000;
  /// Cluster membership (JSON `cluster`); see `cluster_config`.
  cluster_config cluster;

  /// Returns `base` updated with the keys of the JSON object `text`; any unknown key, wrong
  /// type or out-of-range value is an error naming the field (TROUPE-CFG-*).
  static caf::expected<runtime_config> from_json(std::string_view text, runtime_config base);
  /// Returns every key the JSON configuration takes (the error of any other names them).
  [[nodiscard]] static std::span<const std::string_view> keys() noexcept;
  /// Returns the defaults updated from the JSON object `text`.
  static caf::expected<runtime_config> from_json(std::string_view text);

  /// Returns `base` updated from the JSON file at `path`.
  static caf::expected<runtime_config> from_file(const std::string& path, runtime_config base);
  /// Returns the defaults updated from the JSON file at `path`.
  static caf::expected<runtime_config> from_file(const std::string& path);

  /// Returns an error when a value is out of range (used after builder overrides too).
  [[nodiscard]] caf::error validate() const;
};

} // namespace troupe
