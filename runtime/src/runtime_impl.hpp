#pragma once

// Internal: the state of one runtime, shared by the files that implement it (boot in
// runtime.cpp, the stop choreography in stop.cpp, signals in interrupts.cpp).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <caf/actor_system_config.hpp>
#include <caf/logger.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/send.hpp>

#include "troupe/actors/detail/primitives.hpp"
#include "troupe/runtime/runtime.hpp"
#include "troupe/runtime/stop.hpp"
#include "cluster_directory.hpp"
#include "services.hpp"

namespace troupe {

namespace detail {

/// CAF's spawn makes the spawning thread hold the system's logger (a thread-local), and the
/// system's destructor waits until no thread holds it: a runtime whose builder (or a thread
/// that ran a task) still held it could be closed only on that thread, and `stop()` from
/// any other one (a second caller after `request_stop`, a runtime moved to another thread)
/// waited for ever. Threads that call into troupe let it go again; nothing logs (CAF's log
/// level is quiet; with logging compiled in, nothing changes).
inline void release_caf_logger_here() noexcept {
#if CAF_LOG_LEVEL == CAF_LOG_LEVEL_QUIET
  if (caf::logger::current_logger() != nullptr) caf::logger::set_current_actor_system(nullptr);
#endif
}

/// The runtime whose helper thread (its `request_stop` thread or its interrupt thread) this
/// is, set by the thread itself as it starts: the thread's own `std::thread` object is
/// assigned by its creator after the thread may already run, so comparing ids with it from
/// the thread is a data race (ThreadSanitizer found one).
inline thread_local const void* helper_thread_of = nullptr;

/// `t + d`, or the clock's end when that would overflow (a grace or timeout of years means
/// "no bound", not a deadline wrapped into the past).
template <class TimePoint>
TimePoint saturating_add(TimePoint t, clock::duration d) noexcept {
  if (d.count() <= 0) return t;
  if (d > TimePoint::max() - t) return TimePoint::max();
  return t + std::chrono::duration_cast<typename TimePoint::duration>(d);
}

/// A bound in milliseconds in the clock's unit, saturated (`milliseconds::max()` does not
/// fit in nanoseconds).
inline clock::duration bound_of(std::chrono::milliseconds d) noexcept {
  if (d > std::chrono::duration_cast<std::chrono::milliseconds>(clock::duration::max()))
    return clock::duration::max();
  return std::chrono::duration_cast<clock::duration>(d);
}

} // namespace detail

namespace detail {

/// spawn_blocking on real time: a fixed pool of plain threads.
class thread_pool_executor final : public blocking_executor {
 public:
  explicit thread_pool_executor(size_t n) {
    for (size_t i = 0; i < n; ++i)
      threads_.emplace_back([this] { work(); });
  }
  ~thread_pool_executor() override { stop(); }

  void submit(std::function<void()> job) override {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      if (stopping_) return; // dropped: its task is being stopped with the runtime
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  /// Finishes the running jobs, drops the queued ones, joins the threads.
  void stop() noexcept {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      stopping_ = true;
      jobs_.clear();
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock{mtx_};
    for (;;) {
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      job = nullptr;
      lock.lock();
    }
  }

  std::mutex mtx_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

/// spawn_blocking on virtual time: jobs run on the thread that drives the runtime, in
/// submission order, so a simulation stays deterministic.
class manual_executor final : public blocking_executor {
 public:
  void submit(std::function<void()> job) override {
    std::lock_guard<std::mutex> guard{mtx_};
    jobs_.push_back(std::move(job));
  }
  bool run_one() {
    std::function<void()> job;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      if (jobs_.empty()) return false;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
    return true;
  }
  void clear() {
    std::lock_guard<std::mutex> guard{mtx_};
    jobs_.clear();
  }

 private:
  std::mutex mtx_;
  std::deque<std::function<void()>> jobs_;
};

} // namespace detail

struct runtime::impl final : detail::root_owner {
  runtime_config cfg;
  detail::env_system_config sys_cfg;
  std::unique_ptr<real_clock> real;
  std::unique_ptr<virtual_clock> virt;
  std::unique_ptr<detail::thread_pool_executor> pool;
  std::unique_ptr<detail::manual_executor> manual;
  detail::task_env env;
  std::mutex roots_mtx;
  std::vector<caf::weak_actor_ptr> roots;
  /// Supervisors started by `supervise` (with their names): stop() asks them to exit.
  std::vector<std::pair<caf::weak_actor_ptr, std::string>> supervisors;
  /// Stop participants (`on_stop`), in registration order. Guarded by lifecycle_mtx.
  struct participant {
    std::string name;
    stop_body body;
    clock::duration grace;
  };
  std::vector<participant> participants;
  /// Set during step 4 of stop(): participants' tasks are adopted, not cancelled.
  std::atomic<bool> adopting_participants{false};
  /// What stop() and the interrupt handlers want an operator to know; the stop's steps.
  mutable std::mutex notes_mtx;
  std::vector<runtime_notice> notices;
  std::vector<std::string> stop_log;
  /// Set once stop() has finished (a second caller waits for it).
  std::mutex stop_mtx;
  std::condition_variable stop_cv;
  bool stop_finished = false;
  /// The thread of `request_stop` (joined by the destructor's stop).
  std::thread stopper;
  /// Interrupt handlers, LIFO; the signals this runtime listens to; its interrupt thread.
  struct interrupt_entry {
    uint64_t id;
    interrupt_handler handler;
    interrupt_options opts;
  };
  std::mutex interrupt_mtx;
  std::vector<interrupt_entry> handlers;
  uint64_t next_handler = 0;
  std::atomic<bool> was_interrupted{false};
  std::deque<int> pending_signals;
  std::condition_variable interrupt_cv;
  bool interrupt_exit = false;
  bool listening = false;
  std::thread interrupt_thread;

  /// The stop choreography (runtime::stop).
  void stop_all() noexcept;
  /// Starts the stop without waiting for it: on the `stopper` thread (real time), or on
  /// the thread driving the virtual scheduler at its next drive from outside.
  void request_stop();
  /// Virtual time: runs a requested stop, unless this thread is inside a task or a stop.
  void run_requested_stop() noexcept;
  /// Virtual time: a stop was requested from inside the runtime (see request_stop).
  std::atomic<bool> stop_requested{false};
  /// Serialises joining the helper threads and closing the system among stop()'s callers.
  std::mutex finish_mtx;
  /// Step 7: destroys the actor system (on the owner's thread; see stop.cpp).
  void close_system() noexcept;
  /// Ends and joins the interrupt and request_stop threads.
  void join_helpers() noexcept;
  /// Runs the interrupt handlers for `signo` (LIFO), then the stop unless one resumed;
  /// returns whether the stop ran.
  bool handle_interrupt(int signo);
  /// Starts listening to OS signals (idempotent).
  void listen();
  [[nodiscard]] bool listening_now() {
    std::lock_guard<std::mutex> g{interrupt_mtx};
    return listening;
  }

  void note(std::string kind, std::string subject, std::string detail) {
    std::lock_guard<std::mutex> guard{notes_mtx};
    notices.push_back({std::move(kind), std::move(subject), std::move(detail)});
  }
  void log_step(std::string x) {
    std::lock_guard<std::mutex> guard{notes_mtx};
    stop_log.push_back(std::move(x));
  }
  /// Serialises spawning roots against stop(): no root slips past the stop.
  std::mutex lifecycle_mtx;
  /// Set while build() starts the cluster node (its before_join hooks run then): a stop
  /// asked for meanwhile (a hook calling stop(), a signal) is only recorded, and build()
  /// fails with runtime_stopped and stops the runtime itself once the node's start returned
  /// (stopping then would destroy the actor system under the start).
  std::mutex build_mtx;
  bool building = false;
  bool stop_while_building = false;
  /// Returns true (and records the stop) while build() starts the node.
  bool defer_stop() {
    std::lock_guard<std::mutex> guard{build_mtx};
    if (building) stop_while_building = true;
    return building;
  }
  /// Returns whether a stop was asked for since the window opened.
  bool stop_asked_while_building() {
    std::lock_guard<std::mutex> guard{build_mtx};
    return stop_while_building;
  }
  /// Ends that window; returns whether a stop was asked for during it.
  bool end_building() {
    std::lock_guard<std::mutex> guard{build_mtx};
    building = false;
    return stop_while_building;
  }
  /// Opens from `runtime::storage()` (on the caller's thread) still running: stop() waits
  /// for them before it destroys the actor system they spawn into. Guarded by lifecycle_mtx.
  size_t opens_in_flight = 0;
  std::condition_variable opens_done;
  size_t prune_at = 64;
  std::atomic<bool> stopped{false};
  caf::scheduler::test_coordinator* sched = nullptr;
  /// Opens the storage and the hub on demand, answers the directory, forwards supervisor
  /// events. Before `sys`: destroyed after it, so an actor ending during the system's
  /// shutdown still finds what it uses.
  std::unique_ptr<detail::service_provider> services;
  /// The cluster node's directory and port (empty, 0: not a cluster node).
  directory_actor directory;
  /// The node's spawner (runs registered bodies for other nodes); empty when not a node.
  spawner_actor spawner;
  /// The sink that logs TLS connections this node refuses (0: none).
  uint64_t tls_sink = 0;
  uint16_t cluster_port = 0;
  // Declared last: destroyed first, while everything its actors use still exists.
  std::unique_ptr<caf::actor_system> sys;


  /// Records a supervisor for stop(). Requires lifecycle_mtx.
  void record_supervisor(const caf::actor& sup, std::string name) {
    std::lock_guard<std::mutex> guard{roots_mtx};
    auto& v = supervisors;
    v.erase(std::remove_if(v.begin(), v.end(), [](const auto& w) { return !w.first.lock(); }),
            v.end());
    v.emplace_back(caf::actor_cast<caf::weak_actor_ptr>(sup), std::move(name));
  }

  /// A supervisor started from a task: owned by the runtime like one from `supervise`.
  void adopt_supervisor(const caf::actor& sup, const std::string& name) override {
    {
      std::lock_guard<std::mutex> lifecycle{lifecycle_mtx};
      if (stopped.load()) {
        caf::anon_send_exit(sup, caf::exit_reason::user_shutdown);
        return;
      }
      record_supervisor(sup, name);
    }
    services->watch_lifecycle(sup, name);
  }


  /// Stops the registry (and with it every primitive only it holds) and the detector. The
  /// handles stay: a task still ending may read them.
  void stop_services() noexcept {
    if (services) services->stop();
    if (env.lanes)
      for (auto& e : env.lanes->entries())
        caf::anon_send_exit(e.actor, caf::exit_reason::user_shutdown);
    if (env.registry) caf::anon_send_exit(env.registry, caf::exit_reason::user_shutdown);
    if (env.census.detector)
      caf::anon_send_exit(env.census.detector, caf::exit_reason::user_shutdown);
  }

  troupe::clock& clk() noexcept {
    return real ? static_cast<troupe::clock&>(*real) : static_cast<troupe::clock&>(*virt);
  }

  void adopt(const caf::actor& a) override {
    if (stopped.load() && !adopting_participants.load()) { // adopted while stopping (a detached child): stop it at once
      caf::anon_send(a, atoms::cancel_atom::value, cancel_mode::join());
      return;
    }
    std::lock_guard<std::mutex> guard{roots_mtx};
    if (roots.size() >= prune_at) {
      std::erase_if(roots, [](const caf::weak_actor_ptr& w) { return w.lock() == nullptr; });
      prune_at = std::max<size_t>(64, roots.size() * 2);
    }
    roots.push_back(caf::actor_cast<caf::weak_actor_ptr>(a));
  }

  /// Waits until `done()` or `bound` has passed on the runtime clock: on real time a
  /// condition variable (notified through `wake`; `done` is called with `m` held), on
  /// virtual time by driving the scheduler and moving the clock to the next timer while it
  /// stays within the bound.
  bool wait_for(const std::function<bool()>& done, std::mutex& m, std::condition_variable& wake,
                clock::duration bound);

  /// Simulation: picks which runnable actor runs next (an index below the count), and
  /// hears each step. Empty: FIFO.
  std::function<size_t(size_t)> pick;
  std::function<void(caf::resumable*)> on_step;

  /// Runs the deterministic scheduler until no actor is runnable, one message per turn:
  /// round-robin (CAF's test scheduler puts an actor that still has messages back at the
  /// front, so a task yielding in a loop would starve every other actor), or seeded picks.
  size_t run_jobs() {
    size_t n = 0;
    auto& q = sched->jobs;
    while (!q.empty()) {
      if (pick) {
        auto i = pick(q.size());
        if (i > 0 && i < q.size()) std::swap(q[0], q[i]);
      }
      auto* job = q.front();
      if (on_step) on_step(job);
      sched->run_once();
      // Still runnable (CAF pushed it back to the front): its next turn comes after the
      // others' (with picks, the generator decides anyway).
      if (!pick && q.size() > 1 && q.front() == job) {
        q.pop_front();
        q.push_back(job);
      }
      ++n;
    }
    return n;
  }

  size_t drain() {
    if (sched == nullptr || !sys) return 0; // real time, or the system is closed
    size_t n = 0;
    for (;;) {
      n += run_jobs();
      if (manual && manual->run_one()) {
        ++n;
        continue;
      }
      if (!sched->has_job()) {
        // Roots spawned from outside start now (see task_env::deferred_starts).
        std::vector<caf::actor> roots;
        {
          std::lock_guard<std::mutex> guard{env.deferred_mtx};
          roots.swap(env.deferred_starts);
        }
        if (roots.empty()) return n;
        for (auto& a : roots)
          caf::anon_send(a, atoms::start_atom::value);
      }
    }
  }
};


} // namespace troupe
