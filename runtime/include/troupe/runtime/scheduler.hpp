#pragma once

// troupe's own scheduler for CAF 0.17: per-worker queues, a "next to run" slot for the actor
// a worker has just woken, a shared injection queue for work from other threads, stealing
// half of a victim's queue, and workers that sleep when idle. `scheduler_policy::troupe`
// (the default) selects it; `load_troupe_scheduler` installs it in a raw CAF configuration
// (the benchmarks use it to run plain CAF programs under it). See docs/scheduler.md.

#include <cstdint>

namespace caf {
class actor_system;
class actor_system_config;
} // namespace caf

namespace troupe {

/// Makes an actor system built from `cfg` run on troupe's scheduler (CAF's `scheduler.policy`
/// is then ignored; `scheduler.max-threads` and `scheduler.max-throughput` still apply).
void load_troupe_scheduler(caf::actor_system_config& cfg);

/// What troupe's scheduler has done since the system started (all zero under another policy).
struct scheduler_counters {
  uint64_t slot_runs = 0;   ///< jobs run from a worker's "next to run" slot
  uint64_t local_runs = 0;  ///< jobs taken from the worker's own queue
  uint64_t inject_runs = 0; ///< jobs taken from the shared injection queue
  uint64_t steals = 0;      ///< successful steals (half of a victim's queue, or a probe's
                            ///< batch: see probes)
  uint64_t stolen = 0;      ///< jobs moved by those steals
  uint64_t slot_steals = 0; ///< slots taken from a worker stuck on one job for a watch period
  uint64_t parks = 0;       ///< times a worker went to sleep
  uint64_t probes = 0;      ///< steals whose jobs were timed on the thief (every steal)
  uint64_t cheap_probes = 0; ///< of those, the ones whose jobs were too cheap to move: the
                             ///< thief's next steal waited a back-off
  uint64_t wakes = 0;       ///< times a sleeping worker was woken for new work
  uint64_t rescued = 0;     ///< long sleeps ended by the safety timeout that then found
                            ///< queued work nobody woke them for (a lost wake-up, or work
                            ///< queued behind a job that ran for 100 ms without waking
                            ///< anyone; the tests require 0)
  uint64_t ends_without_timer = 0; ///< actors that ended without ever setting a timeout:
                                   ///< their end cost the clock thread nothing
  uint64_t ends_with_timer = 0;    ///< actors that ended after setting one: their
                                   ///< timeouts were cancelled by the clock thread, as in CAF
};

/// Reads the counters of `sys`'s scheduler into `out`. Returns false (and leaves `out` alone)
/// when `sys` does not run on troupe's scheduler.
bool read_scheduler_counters(caf::actor_system& sys, scheduler_counters& out);

} // namespace troupe
