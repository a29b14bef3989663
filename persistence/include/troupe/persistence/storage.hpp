#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "troupe/messages/clock.hpp"
#include "troupe/messages/durable.hpp"
#include "troupe/messages/storage.hpp"

namespace troupe {

/// How the storage actor opens its database.
struct storage_config {
  /// The SQLite file; its directory is created when missing.
  std::string path = ".troupe/state.sqlite";
  /// How long a write waits for a lock another process holds before `storage_busy`.
  std::chrono::milliseconds busy_timeout{5000};
  /// `synchronous=FULL` (survives power loss) instead of `NORMAL` (survives a killed process;
  /// WAL keeps every acknowledged commit).
  bool fsync_every_commit = false;
  /// The most writes one transaction takes.
  size_t max_batch = 8192;
  /// Clock for `at_ms` (a virtual clock in tests; null: wall time, milliseconds since 1970).
  troupe::clock* clock = nullptr;
  /// Run on a thread of its own (real time) or on the scheduler (virtual time, tests).
  bool detached = true;
  /// Simulation only: asked before each group commit; true fails the whole group (nothing
  /// of it is written; every writer of it gets `storage_failed`). Empty: never.
  std::function<bool()> write_fault;
};

/// The schema version this build writes.
constexpr int64_t storage_schema_version = 3;

/// Opens (creating, migrating forward) the database and spawns the actor that owns it.
/// Errors: `storage_unavailable` (path, permissions, not a database), `schema_too_new`,
/// `storage_failed`.
/// When `signing_key` is given, it receives the key that signs channel receipts (created
/// in the database on first use).
[[nodiscard]] caf::expected<caf::actor> spawn_storage(caf::actor_system& sys, storage_config cfg,
                                        std::string* signing_key = nullptr);

/// Another node's storage actor, as `spawn_storage_link` reaches it.
struct storage_link_config {
  /// The storage actor on its node (a proxy).
  caf::actor remote;
  /// The cluster name it is shared under and its node (for errors and the member events).
  std::string name;
  std::string node;
  /// This node's cluster directory: a `member_down` or `member_left` of `node` ends the
  /// link (a node that is silent, not only one whose connection broke). May be empty.
  caf::actor directory;
  /// Set once the link is gone, so its owner looks the storage up again. May be empty.
  std::shared_ptr<std::atomic<bool>> gone;
};

/// Spawns a local stand-in for another node's storage actor: it answers the storage protocol
/// (`storage_actor_type`) by passing each request on and relaying the answer. When the owner
/// goes away (its node killed, partitioned or leaving, its connection broken, the actor
/// ended), every request in flight and every later one answers `storage_unavailable` (field
/// `storage`), and each subscriber it passed on gets `(st_ended, topic, error)`: no call
/// waits for an answer that cannot come. Errors of the owner (`invalid_topic`,
/// `storage_failed`, ...) pass unchanged.
[[nodiscard]] caf::actor spawn_storage_link(caf::actor_system& sys, storage_link_config cfg);

} // namespace troupe
