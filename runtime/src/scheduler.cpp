// troupe's scheduler for CAF 0.17: the policy `local_first`, run by troupe's own coordinator
// and workers (`troupe_coordinator`, `troupe_worker`) with a lean clock (all below).
//
// Why not CAF's own: `sharing` is one locked list for every worker, so an actor messaging the
// next one hands it to whichever thread wakes first (a futex wake-up and a cache miss per
// hop: 33-48% below one thread on chains). `stealing` keeps the woken actor on its worker,
// but its queue (detail::double_ended_queue) finds the predecessor of the tail by walking the
// whole list while holding both locks, so every steal is O(queue length) and blocks the
// owner: one actor waking 100k others makes the queue 100k long and each steal walks it
// (spawning 100k children ran at 1-2% of `sharing`).
//
// The shape here:
// - each worker has a "next to run" slot: an actor woken by the job a worker is running goes
//   there and runs right after it on the same thread (chains stay on one warm core); the slot
//   a new one displaces goes to the worker's queue, where other workers may steal it; an idle
//   worker watches filled slots and takes one whose owner stays on one job for 100 us (a
//   blocking call or a long loop there would otherwise hold the woken actor back);
// - each worker's queue is a locked deque; thieves take half of it in one visit (O(1) per
//   job), the owner works from the front; a steal from a short queue is on trial first (16
//   jobs, timed on the thief: a few just-spawned cheap actors, such as a dispatcher's
//   window, are not worth moving; a backlog of them is, see cheap_job and burst_backlog);
// - a scope's end-notice wake-up goes to the slot of the worker the scope last ran on
//   (send_home), not to the slot of the worker that ran the ending child;
// - work from threads that are not workers (timers, I/O, `main`) goes to a shared injection
//   queue, taken in batches; every 61st pick looks there first so it is never starved, and a
//   slot runs at most 32 times in a row while the queue has work;
// - a worker without work spins for ~20 us, then parks on its own condition variable (watching
//   for 100 us at a time while other slots are filled, long otherwise); whoever adds work wakes
//   one parked worker, except for work in the injection queue while a worker searches
//   (spins, or was just woken: it will find the work; the last searcher to find work wakes
//   another if more is queued there) (a Dekker handshake on `idle`, `searching` and the
//   queue sizes, all
//   sequentially consistent, so no wake-up is lost; a 100 ms timeout backs it up and counts a
//   "rescue" if it ever finds work, which the tests require to stay 0).
#include "troupe/runtime/scheduler.hpp"

#include "troupe/actors/detail/actor_slab.hpp"
#include "troupe/actors/detail/idle_hint.hpp"
#include "troupe/actors/detail/recycler.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/policy/unprofiled.hpp>
#include <caf/resumable.hpp>
#include <caf/scheduled_actor.hpp>
#include <caf/execution_unit.hpp>
#include <caf/logger.hpp>
#include <caf/ref_counted.hpp>
#include <caf/scheduler/abstract_coordinator.hpp>
#include <caf/detail/set_thread_name.hpp>
#include <caf/detail/thread_safe_actor_clock.hpp>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TROUPE_CPU_RELAX() _mm_pause()
#else
#define TROUPE_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace troupe {

namespace {

using job_ptr = caf::resumable*;
using std::memory_order_relaxed;
using std::memory_order_seq_cst;
using std::memory_order_acq_rel;

/// A counter written by one thread and read by any.
struct counter {
  std::atomic<uint64_t> n{0};
  void bump(uint64_t k = 1) noexcept { n.store(n.load(memory_order_relaxed) + k, memory_order_relaxed); }
  uint64_t get() const noexcept { return n.load(memory_order_relaxed); }
};

constexpr unsigned inject_every = 61;    // every 61st pick looks at the injection queue first
constexpr unsigned max_slot_streak = 32; // slot runs in a row while the queue has work
constexpr size_t max_inject_batch = 64;  // jobs moved from the injection queue per visit
constexpr auto spin_time = std::chrono::microseconds(20);
constexpr std::chrono::microseconds park_timeout = std::chrono::milliseconds(100);
// A sleeping worker that sees another worker's slot filled checks it again after this long;
// a slot whose owner has not moved on to another job in that time is taken.
constexpr auto watch_period = std::chrono::microseconds(100);
constexpr unsigned quiet_watches = 2; // watches without a filled slot before a long sleep
// Stealing on trial. A steal is probed: the thief times each job it took, with the jobs
// that job woke on its worker, until its queue is empty again. When most were actors on
// their first run (just spawned by the victim: their memory is in the victim's cache, and
// their end comes back to it, to a parent that drops them) and took less than `cheap_job`
// there, moving them did not pay: the thief's next steal waits a back-off, from
// `min_backoff` doubling to `max_backoff`. A steal takes at most `probe_batch` jobs until
// `trust_after` probes in a row found other work; from then on half of the victim's queue,
// with no back-off. (Cheap messages to actors that ran before, such as a burst of sends to
// idle actors, are worth moving: run on two cores they finish in about half the time.)
// A steal from a queue of `burst_backlog` jobs or more never backs off: a backlog of fresh
// actors (a task's 100k children, launched together when its body suspends) split between
// two workers ran spawn_await 1.5x faster than left to one. What the
// back-off is for is the short queue: a dispatcher keeping a window of cheap children in
// flight is a chain, fastest on one core (parallel_each: 1.6x). A scope whose children
// only end (scope_fanout) pays for the rule: its warm rounds run a fifth to a third
// slower than with the back-off (docs/scheduler.md, "A backlog is not on trial").
constexpr auto cheap_job = std::chrono::microseconds(5);
constexpr size_t burst_backlog = 256;
constexpr auto min_backoff = std::chrono::microseconds(50);
constexpr auto max_backoff = std::chrono::microseconds(2000);
constexpr size_t probe_batch = 16;
constexpr unsigned trust_after = 2; // dear probes in a row before a steal takes half

class local_first : public caf::policy::unprofiled {
public:
  enum park_mode : int { awake, watching, sleeping };

  struct coordinator_data {
    explicit coordinator_data(caf::scheduler::abstract_coordinator*) {}
    alignas(64) std::mutex lock;
    std::deque<job_ptr> inject;            // guarded by lock
    std::atomic<size_t> inject_size{0};    // inject.size(), readable without the lock
    alignas(64) std::atomic<int64_t> idle{0}; // parked workers no waker has claimed yet
    std::atomic<int64_t> long_idle{0};        // of those, the ones in a long sleep
    std::atomic<int64_t> searching{0};        // workers spinning for work (not parked)
    std::atomic<int64_t> shy{0};              // of the idle, those in a steal back-off
    std::atomic<size_t> next_wake{0};      // where a waker starts looking
    std::atomic<uint64_t> wakes{0};
    std::atomic<uint64_t> rescued{0};
  };

  struct worker_data {
    explicit worker_data(caf::scheduler::abstract_coordinator*) {}
    worker_data(const worker_data&) {} // every worker starts empty
    alignas(64) std::mutex lock;
    std::deque<job_ptr> local;          // guarded by lock
    std::atomic<size_t> local_size{0};  // local.size(), readable without the lock
    // The slot: filled by the owner's running job only; taken by the owner, or by a sleeping
    // worker once the owner has stayed on one job for a watch period.
    alignas(64) std::atomic<job_ptr> next{nullptr};
    std::atomic<uint64_t> tick{0}; // picks so far (written by the owner; others compare it)
    // Owner thread only.
    unsigned streak = 0;
    size_t victim = 0;
    std::vector<job_ptr> scratch;
    std::vector<std::pair<uint64_t, job_ptr>> seen; // the others' (tick, slot) before a watch
    // Stealing on trial (see cheap_job).
    bool probing = false;  // a steal's jobs (and what they woke here) are being timed
    unsigned dear = 0;     // probes in a row that found work worth moving (trust_after: half)
    uint32_t probe_jobs = 0;  // stolen jobs run since the steal
    uint32_t probe_cheap = 0; // of those, fresh actors that took less than cheap_job
    bool probe_fresh = false; // the stolen job running now is an actor's first run
    bool probe_backlog = false; // the victim's queue held a burst_backlog when we stole
    std::chrono::steady_clock::time_point probe_last, steal_after;
    std::chrono::nanoseconds backoff{0};
    // Parking.
    alignas(64) std::mutex park_lock;
    std::condition_variable park_cv;
    int mode = awake;   // guarded by park_lock
    bool woken = false; // guarded by park_lock: a waker claimed this worker
    bool handoff = false; // guarded by park_lock: ... and counted it as searching
    bool shy = false;     // guarded by park_lock: parked in a steal back-off (no queue wakes)
    std::atomic<bool> resting{false}; // parked (a hint for send_home; park_lock decides)
    std::atomic<bool> stopped{false}; // before_shutdown ran (send_home leaves it alone)
    // Figures.
    counter slot_runs, local_runs, inject_runs, steals, stolen, slot_steals, parks, probes,
        cheap_probes;
    // Actors that ended on this worker without ever setting a timeout (lean_clock).
    counter ends_without_timer;
  };

  // The worker whose thread this is, and its coordinator (a process may run several systems).
  static thread_local void* tl_worker;
  static thread_local const void* tl_coordinator;
  // The worker's count of actor ends without a timeout (lean_clock::cancel_timeouts): one
  // written by its thread alone, not a counter both workers add to at every actor's end.
  static thread_local counter* tl_ends_without_timer;

  template <class Coordinator>
  static auto* self_worker(Coordinator* c) {
    using worker_type = typename Coordinator::worker_type;
    return tl_coordinator == c ? static_cast<worker_type*>(tl_worker) : nullptr;
  }

  // --- adding work ---------------------------------------------------------------------------

  /// From any thread: a worker's own thread treats it as woken by its job (the slot), any
  /// other thread puts it in the injection queue.
  template <class Coordinator>
  void central_enqueue(Coordinator* c, job_ptr job) {
    if (auto* w = self_worker(c)) { // sent without a context from a worker's own thread
      internal_enqueue(w, job);
      return;
    }
    auto& cd = d(c);
    {
      std::lock_guard<std::mutex> g{cd.lock};
      cd.inject.push_back(job);
      cd.inject_size.store(cd.inject.size(), memory_order_seq_cst);
    }
    wake_one(c, wake_for::inject); // not while a worker searches: it finds the job
  }

  /// From any thread, for this worker (CAF's shutdown uses it): its queue, and wake it.
  template <class Worker>
  void external_enqueue(Worker* w, job_ptr job) {
    push_local(w, job);
    if (!wake(w, wake_for::direct)) wake_one(w->parent());
  }

  /// From the job this worker runs (an actor it woke): the slot; the one it displaces goes to
  /// the queue, where an idle worker may take it.
  template <class Worker>
  void internal_enqueue(Worker* w, job_ptr job) {
    if (tl_worker != w) { // another thread's: a job sent home (see send_home)
      send_home(w, job);
      return;
    }
    auto& wd = d(w);
    auto displaced = wd.next.exchange(job, memory_order_seq_cst);
    if (displaced != nullptr) {
      push_local(w, displaced);
      wake_one(w->parent());
    } else if (d(w->parent()).long_idle.load(memory_order_seq_cst) > 0) {
      // A worker in a long sleep would not see the slot if this job ran on for long: it
      // switches to watching (Dekker on `next` and `long_idle`, as for the queues).
      wake_one(w->parent(), wake_for::slot);
    }
  }

  /// A job woken on another worker's thread with `w`'s unit (CAF's `exec_later` on a unit
  /// not the caller's): a scope's end-notice wake-up sent to the worker the scope last ran
  /// on (task_actor::wake_scope). While that worker runs, the job goes to its slot: it runs
  /// there right after the current job, where the scope's data is, as if that worker had
  /// woken it (the slot's previous job goes to that worker's queue). A worker that rests
  /// (parked: waking it would cost a system call and the wait) or has stopped gets nothing:
  /// the job runs here, as one woken by the running job. From a thread that is not a
  /// worker: its queue, and it is woken.
  template <class Worker>
  void send_home(Worker* w, job_ptr job) {
    auto* here = self_worker(w->parent());
    if (here == nullptr) {
      external_enqueue(w, job);
      return;
    }
    auto& wd = d(w);
    if (wd.resting.load(memory_order_relaxed) || wd.stopped.load(memory_order_relaxed)) {
      internal_enqueue(here, job);
      return;
    }
    auto displaced = wd.next.exchange(job, memory_order_seq_cst);
    // Dekker with before_shutdown (it stores `stopped`, then empties the slot): either it
    // takes the job along, or we see `stopped` and take the job back (unless it did).
    if (wd.stopped.load(memory_order_seq_cst)) {
      auto mine = job;
      if (wd.next.compare_exchange_strong(mine, nullptr, memory_order_acq_rel))
        internal_enqueue(here, job);
      if (displaced != nullptr) internal_enqueue(here, displaced);
      return;
    }
    if (displaced != nullptr && !push_local_unless_stopped(w, displaced))
      internal_enqueue(here, displaced);
    // It may be parking: park looks at its own slot after counting itself idle (under
    // park_lock, which wake takes too), so either it sees the job or wake sees it parked.
    wake(w, wake_for::direct);
  }

  /// The job used up its quantum: to the back of the queue, behind the work that waits.
  template <class Worker>
  void resume_job_later(Worker* w, job_ptr job) {
    push_local(w, job);
    if (d(w).local_size.load(memory_order_relaxed) > 1 ||
        d(w).next.load(memory_order_relaxed) != nullptr)
      wake_one(w->parent());
  }

  // --- taking work ---------------------------------------------------------------------------

  template <class Worker>
  job_ptr dequeue(Worker* w) {
    auto& wd = d(w);
    auto* c = w->parent();
    if (tl_worker != w) {
      tl_worker = w;
      tl_coordinator = c;
      tl_ends_without_timer = &wd.ends_without_timer;
    }
    auto tick = wd.tick.load(memory_order_relaxed) + 1;
    wd.tick.store(tick, memory_order_relaxed);
    if (tick % inject_every == 0)
      if (auto job = take_inject(w)) return job;
    if (wd.next.load(memory_order_relaxed) != nullptr) {
      if (wd.streak < max_slot_streak || wd.local_size.load(memory_order_relaxed) == 0) {
        if (auto job = wd.next.exchange(nullptr, memory_order_acq_rel)) {
          ++wd.streak;
          wd.slot_runs.bump();
          return job;
        }
      } else if (auto job = wd.next.exchange(nullptr, memory_order_acq_rel)) {
        push_local(w, job); // let the queue in; the slot goes last
      }
    }
    wd.streak = 0;
    if (auto job = find_work(w)) return job;
    // Nothing anywhere: spin a little (work often follows work), then sleep.
    // While it spins it counts as searching: work added meanwhile wakes no parked worker
    // (this one will find it), so a thread that is not a worker (main, a timer) feeding work
    // one job at a time does not pay a futex wake-up per job. The last searcher to find work
    // wakes another if more is queued (Go's rule), so no job waits behind the one it runs.
    auto& cd = d(w->parent());
    cd.searching.fetch_add(1, memory_order_seq_cst);
    auto until = std::chrono::steady_clock::now() + spin_time;
    do {
      for (int i = 0; i < 16; ++i) TROUPE_CPU_RELAX();
      if (auto job = find_work(w)) {
        stop_searching(w);
        return job;
      }
    } while (std::chrono::steady_clock::now() < until);
    cd.searching.fetch_sub(1, memory_order_seq_cst); // park() has its own handshake
    return park(w);
  }

  /// A searching worker found work: if it was the last searcher and more work waits in the
  /// injection queue (the only work whose wake-up a search suppresses), a parked worker
  /// takes over the search (and, woken so, does the same when it finds work: a chain, as
  /// in Go). Dekker with central_enqueue: it stores the queue's size, then loads
  /// `searching`; this stores `searching`, then loads the size (seq_cst): either the
  /// producer sees no searcher and wakes one, or this sees its work.
  template <class Worker>
  static void stop_searching(Worker* w) {
    auto& cd = d(w->parent());
    if (cd.searching.fetch_sub(1, memory_order_seq_cst) != 1) return;
    if (cd.inject_size.load(memory_order_seq_cst) > 0) wake_one(w->parent(), wake_for::inject);
  }

  template <class Worker>
  void before_shutdown(Worker* w) {
    // Whatever this worker still holds goes where the others (or the final cleanup) find it.
    auto& wd = d(w);
    auto& cd = d(w->parent());
    std::deque<job_ptr> mine;
    {
      std::lock_guard<std::mutex> g{wd.lock};
      wd.stopped.store(true, memory_order_seq_cst); // before the slot is emptied: send_home
      mine.swap(wd.local);
      wd.local_size.store(0, memory_order_seq_cst);
    }
    if (auto job = wd.next.exchange(nullptr, memory_order_acq_rel)) mine.push_front(job);
    if (!mine.empty()) {
      {
        std::lock_guard<std::mutex> g{cd.lock};
        cd.inject.insert(cd.inject.end(), mine.begin(), mine.end());
        cd.inject_size.store(cd.inject.size(), memory_order_seq_cst);
      }
      wake_one(w->parent());
    }
    tl_worker = nullptr;
    tl_coordinator = nullptr;
    tl_ends_without_timer = nullptr;
  }

  template <class Worker, class F>
  void foreach_resumable(Worker* w, F f) {
    auto& wd = d(w);
    if (auto job = wd.next.exchange(nullptr, memory_order_acq_rel)) f(job);
    std::deque<job_ptr> mine;
    {
      std::lock_guard<std::mutex> g{wd.lock};
      mine.swap(wd.local);
      wd.local_size.store(0, memory_order_seq_cst);
    }
    for (auto job : mine) f(job);
  }

  template <class Coordinator, class F>
  void foreach_central_resumable(Coordinator* c, F f) {
    auto& cd = d(c);
    std::deque<job_ptr> all;
    {
      std::lock_guard<std::mutex> g{cd.lock};
      all.swap(cd.inject);
      cd.inject_size.store(0, memory_order_seq_cst);
    }
    for (auto job : all) f(job);
  }

private:
  template <class Worker>
  static void push_local(Worker* w, job_ptr job) {
    auto& wd = d(w);
    std::lock_guard<std::mutex> g{wd.lock};
    wd.local.push_back(job);
    wd.local_size.store(wd.local.size(), memory_order_seq_cst);
  }

  /// push_local, unless the worker has stopped (then false).
  template <class Worker>
  static bool push_local_unless_stopped(Worker* w, job_ptr job) {
    auto& wd = d(w);
    std::lock_guard<std::mutex> g{wd.lock};
    if (wd.stopped.load(memory_order_relaxed)) return false;
    wd.local.push_back(job);
    wd.local_size.store(wd.local.size(), memory_order_seq_cst);
    return true;
  }

  template <class Worker>
  static job_ptr pop_local(Worker* w) {
    auto& wd = d(w);
    if (wd.local_size.load(memory_order_seq_cst) == 0) return nullptr;
    std::lock_guard<std::mutex> g{wd.lock};
    if (wd.local.empty()) return nullptr;
    auto job = wd.local.front();
    wd.local.pop_front();
    wd.local_size.store(wd.local.size(), memory_order_seq_cst);
    return job;
  }

  /// A batch from the injection queue: the first to run, the rest into this worker's queue.
  template <class Worker>
  static job_ptr take_inject(Worker* w) {
    auto* c = w->parent();
    auto& cd = d(c);
    if (cd.inject_size.load(memory_order_seq_cst) == 0) return nullptr;
    auto& wd = d(w);
    wd.scratch.clear();
    {
      std::lock_guard<std::mutex> g{cd.lock};
      auto n = std::min({cd.inject.size(), cd.inject.size() / c->num_workers() + 1,
                         max_inject_batch});
      for (size_t i = 0; i < n; ++i) {
        wd.scratch.push_back(cd.inject.front());
        cd.inject.pop_front();
      }
      cd.inject_size.store(cd.inject.size(), memory_order_seq_cst);
    }
    if (wd.scratch.empty()) return nullptr;
    wd.inject_runs.bump();
    if (wd.scratch.size() > 1) {
      {
        std::lock_guard<std::mutex> g{wd.lock};
        wd.local.insert(wd.local.end(), wd.scratch.begin() + 1, wd.scratch.end());
        wd.local_size.store(wd.local.size(), memory_order_seq_cst);
      }
      wake_one(c);
    }
    return wd.scratch.front();
  }

  /// Half of another worker's queue (its oldest jobs): the first to run, the rest into ours.
  template <class Worker>
  static job_ptr steal(Worker* w) {
    auto* c = w->parent();
    auto n = c->num_workers();
    if (n < 2) return nullptr;
    auto& wd = d(w);
    if (wd.backoff.count() > 0 && std::chrono::steady_clock::now() < wd.steal_after)
      return nullptr;
    auto start = ++wd.victim % (n - 1); // the others, in turn
    for (size_t k = 0; k + 1 < n; ++k) {
      auto* victim = c->worker_by_id((w->id() + 1 + (start + k) % (n - 1)) % n);
      auto& vd = d(victim);
      if (vd.local_size.load(memory_order_seq_cst) == 0) continue;
      wd.scratch.clear();
      {
        std::lock_guard<std::mutex> g{vd.lock};
        wd.probe_backlog = vd.local.size() >= burst_backlog;
        auto take = (vd.local.size() + 1) / 2;
        if (wd.dear < trust_after) take = std::min(take, probe_batch);
        for (size_t i = 0; i < take; ++i) {
          wd.scratch.push_back(vd.local.front());
          vd.local.pop_front();
        }
        vd.local_size.store(vd.local.size(), memory_order_seq_cst);
      }
      if (wd.scratch.empty()) continue;
      wd.steals.bump();
      wd.stolen.bump(wd.scratch.size());
      wd.probing = true;
      wd.probe_jobs = 0;
      wd.probe_cheap = 0;
      wd.probe_fresh = first_run(wd.scratch.front());
      wd.probe_last = std::chrono::steady_clock::now();
      if (wd.scratch.size() > 1) {
        {
          std::lock_guard<std::mutex> g{wd.lock};
          wd.local.insert(wd.local.end(), wd.scratch.begin() + 1, wd.scratch.end());
          wd.local_size.store(wd.local.size(), memory_order_seq_cst);
        }
        wake_one(c); // more than this worker will run next: a third may help
      }
      return wd.scratch.front();
    }
    return nullptr;
  }

  template <class Worker>
  static job_ptr find_work(Worker* w) {
    auto& wd = d(w);
    if (auto job = pop_local(w)) {
      wd.local_runs.bump();
      if (wd.probing) { // the previous one, and what it woke here, ran
        time_probed_job(wd);
        wd.probe_fresh = first_run(job);
      }
      return job;
    }
    if (wd.probing) { // queue and slot empty: the probed steal's jobs have run
      time_probed_job(wd);
      end_probe(w);
    }
    if (auto job = take_inject(w)) return job;
    return steal(w);
  }

  /// Ends a probed steal (see cheap_job): cheap jobs from a short queue start or lengthen
  /// the back-off; dearer ones, or any taken from a backlog (burst_backlog), end it and
  /// count towards letting the next steal take half.
  template <class Worker>
  static void end_probe(Worker* w) {
    auto& wd = d(w);
    if (!wd.probing) return;
    wd.probing = false;
    auto now = wd.probe_last;
    wd.probes.bump();
    if (!wd.probe_backlog && wd.probe_cheap * 2 >= wd.probe_jobs) {
      wd.cheap_probes.bump();
      wd.dear = 0;
      wd.backoff = std::clamp<std::chrono::nanoseconds>(wd.backoff * 2, min_backoff, max_backoff);
      wd.steal_after = now + wd.backoff;
    } else {
      wd.dear = std::min(wd.dear + 1, trust_after);
      wd.backoff = std::chrono::nanoseconds{0};
    }
  }

  /// Times the stolen job that just ran, with the jobs it woke on this worker (its slot's
  /// chain): the time since the previous one was taken from the queue.
  static void time_probed_job(worker_data& wd) {
    auto now = std::chrono::steady_clock::now();
    if (wd.probe_fresh && now - wd.probe_last < cheap_job) ++wd.probe_cheap;
    ++wd.probe_jobs;
    wd.probe_last = now;
  }

  /// Whether `job` is an actor that has not run yet (CAF initializes an event-based actor
  /// at its first activation). The job is queued, so nobody writes its flags meanwhile.
  static bool first_run(job_ptr job) {
    return job->subtype() == caf::resumable::scheduled_actor &&
           !static_cast<caf::scheduled_actor*>(job)->getf(caf::abstract_actor::is_initialized_flag);
  }

  /// Whether a steal back-off is running (the worker takes no queue work from others).
  template <class Worker>
  static bool backing_off(Worker* w) {
    auto& wd = d(w);
    return wd.backoff.count() > 0 && std::chrono::steady_clock::now() < wd.steal_after;
  }

  /// Records the other workers' (tick, slot); true if any slot is filled.
  template <class Worker>
  static bool look_at_slots(Worker* w) {
    auto* c = w->parent();
    auto& wd = d(w);
    auto n = c->num_workers();
    wd.seen.resize(n);
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      auto& vd = d(c->worker_by_id(i));
      if (i == w->id()) {
        wd.seen[i] = {0, nullptr};
        continue;
      }
      auto tick = vd.tick.load(memory_order_relaxed);
      auto job = vd.next.load(memory_order_seq_cst);
      wd.seen[i] = {tick, job};
      any = any || job != nullptr;
    }
    return any;
  }

  /// A slot whose owner is still on the job it ran when we looked (a watch period ago): the
  /// owner is not coming back to it soon, so we run it.
  template <class Worker>
  static job_ptr take_stale_slot(Worker* w) {
    auto* c = w->parent();
    auto& wd = d(w);
    for (size_t i = 0; i < wd.seen.size(); ++i) {
      auto [tick, job] = wd.seen[i];
      if (job == nullptr) continue;
      auto& vd = d(c->worker_by_id(i));
      if (vd.tick.load(memory_order_relaxed) != tick) continue;
      if (vd.next.compare_exchange_strong(job, nullptr, memory_order_acq_rel)) {
        wd.slot_steals.bump();
        return job;
      }
    }
    return nullptr;
  }

  template <class Worker>
  static job_ptr park(Worker* w) {
    auto& wd = d(w);
    auto& cd = d(w->parent());
    unsigned quiet = 0;
    for (;;) {
      // Watch while another worker's slot is filled (or was, lately); sleep long otherwise.
      bool filled = look_at_slots(w);
      // In a steal back-off it watches until the back-off ends, and work in the others'
      // queues does not wake it (their owners are awake: they run it).
      bool shy = backing_off(w);
      int mode = filled || shy || quiet < quiet_watches ? watching : sleeping;
      {
        std::lock_guard<std::mutex> g{wd.park_lock};
        wd.mode = mode;
        wd.woken = false;
        wd.shy = shy;
      }
      wd.resting.store(true, memory_order_relaxed);
      troupe::detail::parked_workers().fetch_add(1, memory_order_relaxed);
      cd.idle.fetch_add(1, memory_order_seq_cst);
      if (shy) cd.shy.fetch_add(1, memory_order_seq_cst);
      if (mode == sleeping) cd.long_idle.fetch_add(1, memory_order_seq_cst);
      // Dekker: a producer stores a queue size (or fills a slot), then loads `idle` (or
      // `long_idle`); we store those, then load the sizes (and the slots), all seq_cst:
      // either it sees us and wakes us, or we see its work. Our own slot first: a job sent
      // home by another worker (send_home) lands there.
      auto job = wd.next.exchange(nullptr, memory_order_acq_rel);
      if (job == nullptr) job = find_work(w);
      bool recheck = job == nullptr && mode == sleeping && look_at_slots(w);
      bool timed_out = false;
      bool claimed;
      bool handoff;
      {
        std::unique_lock<std::mutex> g{wd.park_lock};
        if (job == nullptr && !recheck) {
          wd.parks.bump();
          std::chrono::nanoseconds wait = mode == watching ? watch_period : park_timeout;
          if (shy)
            wait = std::clamp<std::chrono::nanoseconds>(
                wd.steal_after - std::chrono::steady_clock::now(), std::chrono::microseconds(1),
                wait);
          timed_out = !wd.park_cv.wait_for(g, wait, [&] { return wd.woken; });
        }
        claimed = wd.woken;
        handoff = wd.handoff;
        wd.mode = awake;
        wd.woken = false;
        wd.handoff = false;
        wd.shy = false;
      }
      wd.resting.store(false, memory_order_relaxed);
      troupe::detail::parked_workers().fetch_sub(1, memory_order_relaxed);
      if (!claimed) {
        cd.idle.fetch_sub(1, memory_order_seq_cst);
        if (shy) cd.shy.fetch_sub(1, memory_order_seq_cst);
        if (mode == sleeping) cd.long_idle.fetch_sub(1, memory_order_seq_cst);
      }
      // Woken as a searcher (see wake): it ends its search as a spinning worker does.
      if (job != nullptr) {
        if (handoff) stop_searching(w);
        return job;
      }
      if ((job = find_work(w)) != nullptr) {
        if (handoff) stop_searching(w);
        if (timed_out && mode == sleeping) cd.rescued.fetch_add(1, memory_order_relaxed);
        return job;
      }
      // A stale slot: it ends the search through stop_searching, which looks at the
      // injection queue again (work pushed there meanwhile woke nobody: we were searching).
      if (mode == watching && (job = take_stale_slot(w)) != nullptr) {
        if (handoff) stop_searching(w);
        return job;
      }
      // Nothing after all: no longer searching, then the handshake of the next round. A
      // long sleep that timed out lets the recycler and the actor slab give back what a
      // burst left unused.
      if (handoff) cd.searching.fetch_sub(1, memory_order_seq_cst);
      if (timed_out && mode == sleeping) {
        troupe::detail::recycler::reap_idle();
        troupe::detail::actor_slab::flush_thread_cache(); // its kept blocks may pin chunks
        troupe::detail::actor_slab::reap_idle();
      }
      quiet = filled ? 0 : quiet + 1;
    }
  }

  /// Why a worker is woken: work in the injection queue (not while a worker searches: it
  /// will find it), work in a worker's queue (not a worker in a steal back-off), a filled
  /// slot (only a worker in a long sleep: a watching one looks at slots anyway), or work put
  /// in this worker's own queue by another thread.
  enum class wake_for { inject, queue, slot, direct };

  /// Wakes `w` if it sleeps and nobody claimed it yet. Woken for work in the injection
  /// queue, it counts as searching from now on, so that work added there before it runs
  /// wakes nobody else (it will find it) and its own find ends the search (stop_searching,
  /// which looks at the injection queue again) like a spinner's. Woken for a worker's queue
  /// or a slot, it does not: stop_searching looks only at the injection queue, so a worker
  /// woken for a queue's job and counted as searching could take an injected job instead,
  /// and the queue's job would wait for no one (two jobs, one wake-up).
  template <class Worker>
  static bool wake(Worker* w, wake_for why = wake_for::queue) {
    auto& wd = d(w);
    auto& cd = d(w->parent());
    {
      std::lock_guard<std::mutex> g{wd.park_lock};
      if (wd.mode == awake || wd.woken || (why == wake_for::slot && wd.mode != sleeping) ||
          (why == wake_for::queue && wd.shy))
        return false;
      wd.woken = true;
      cd.idle.fetch_sub(1, memory_order_seq_cst);
      if (wd.shy) cd.shy.fetch_sub(1, memory_order_seq_cst);
      if (wd.mode == sleeping) cd.long_idle.fetch_sub(1, memory_order_seq_cst);
      if (why == wake_for::inject) {
        wd.handoff = true;
        cd.searching.fetch_add(1, memory_order_seq_cst);
      }
    }
    cd.wakes.fetch_add(1, memory_order_relaxed);
    wd.park_cv.notify_one();
    return true;
  }

  /// Wakes one parked worker, if any (called after adding work; see wake_for).
  template <class Coordinator>
  static void wake_one(Coordinator* c, wake_for why = wake_for::queue) {
    auto& cd = d(c);
    // Work in the injection queue while a worker searches: it finds it (stop_searching).
    // Not for a worker's queue: only the last searcher checks, and only the injection queue.
    if (why == wake_for::inject && cd.searching.load(memory_order_seq_cst) > 0) return;
    auto idle = (why == wake_for::slot ? cd.long_idle : cd.idle).load(memory_order_seq_cst);
    if (why == wake_for::queue) idle -= cd.shy.load(memory_order_seq_cst);
    if (idle <= 0) return;
    auto n = c->num_workers();
    auto start = cd.next_wake.fetch_add(1, memory_order_relaxed);
    for (size_t k = 0; k < n; ++k)
      if (wake(c->worker_by_id((start + k) % n), why)) return;
  }
};

thread_local void* local_first::tl_worker = nullptr;
thread_local const void* local_first::tl_coordinator = nullptr;
thread_local counter* local_first::tl_ends_without_timer = nullptr;

/// CAF's clock, minus a message per actor death. CAF ends every actor by asking the clock to
/// cancel its timeouts (`local_actor::cleanup`), and its thread-safe clock does that by queueing
/// an event for the clock thread and waking it: a condition-variable broadcast, a futex
/// system call and a context switch per actor that ends, timeouts or not (27% of the CPU of
/// `supervisor_restart`, the clock thread's wake-ups another 14%). This clock remembers which
/// actors ever set a timeout (the only entries a cancellation can find: CAF keys behaviour,
/// request and multi timeouts by actor; delayed messages are not cancelled per actor) and
/// forwards the cancellation for those only. Actor ids are never reused, so an id stays in
/// the set until its actor's end. The set and its count are read by the actor's own
/// execution only (set a timeout, then end), which the scheduler orders, so the count read
/// without the lock sees every earlier timeout of the same actor.
class lean_clock : public caf::detail::thread_safe_actor_clock {
public:
  using super = caf::detail::thread_safe_actor_clock;

  void set_ordinary_timeout(time_point t, caf::abstract_actor* self, caf::atom_value type,
                            uint64_t id) override {
    arm(self);
    super::set_ordinary_timeout(t, self, type, id);
  }

  void set_request_timeout(time_point t, caf::abstract_actor* self,
                           caf::message_id id) override {
    arm(self);
    super::set_request_timeout(t, self, id);
  }

  void set_multi_timeout(time_point t, caf::abstract_actor* self, caf::atom_value type,
                         uint64_t id) override {
    arm(self);
    super::set_multi_timeout(t, self, type, id);
  }

  void cancel_timeouts(caf::abstract_actor* self) override {
    if (armed_count_.load(std::memory_order_acquire) == 0) {
      count_skip();
      return;
    }
    {
      std::lock_guard<std::mutex> g{mtx_};
      if (armed_.erase(self->id()) == 0) {
        count_skip();
        return;
      }
      armed_count_.store(armed_.size(), std::memory_order_release);
    }
    forwarded_.fetch_add(1, memory_order_relaxed);
    super::cancel_timeouts(self);
  }

  /// The coordinator whose workers count their skips themselves (see count_skip).
  void set_owner(const void* coordinator) noexcept { owner_ = coordinator; }
  /// Skips counted off the workers (the workers' own counts are added by the reader).
  uint64_t skipped() const noexcept { return skipped_.load(memory_order_relaxed); }
  uint64_t forwarded() const noexcept { return forwarded_.load(memory_order_relaxed); }

private:
  /// A cancellation with nothing to cancel: counted by the worker it runs on (a counter of
  /// its own), else (another thread, another system's worker) in the shared count.
  void count_skip() noexcept {
    if (owner_ != nullptr && local_first::tl_coordinator == owner_ &&
        local_first::tl_ends_without_timer != nullptr)
      local_first::tl_ends_without_timer->bump();
    else
      skipped_.fetch_add(1, memory_order_relaxed);
  }

  void arm(caf::abstract_actor* self) {
    if (self == nullptr) return;
    std::lock_guard<std::mutex> g{mtx_};
    armed_.insert(self->id());
    armed_count_.store(armed_.size(), std::memory_order_release);
  }

  std::mutex mtx_;
  std::unordered_set<caf::actor_id> armed_; // guarded by mtx_
  std::atomic<size_t> armed_count_{0};      // armed_.size()
  std::atomic<uint64_t> skipped_{0};
  std::atomic<uint64_t> forwarded_{0};
  const void* owner_ = nullptr;
};

class troupe_coordinator;

/// A thread of `sys` (a worker or the clock), announced to the system as CAF's own are.
///
/// With CAF built quiet (`CAF_LOG_LEVEL` 0, as Debian's is) the thread does not install
/// the system's logger as its current one. Nothing logs then, but libcaf_core's actor code
/// still keeps the logger's per-thread actor id whenever a current logger is installed:
/// `scheduled_actor::resume`, `launch` and an actor's destruction each write it (a map
/// behind a shared spinlock), 10-16% of the CPU of a spawn- or restart-bound program here.
/// CAF's spawn installs the logger on the spawning thread: a worker takes it off again
/// after each job (troupe_worker::run). A CAF built with logging gets the logger installed,
/// as on CAF's own threads.
template <class F>
std::thread system_thread(caf::actor_system& sys, const char* name, F body) {
  return std::thread{[&sys, name, body] {
#if CAF_LOG_LEVEL != CAF_LOG_LEVEL_QUIET
    CAF_SET_LOGGER_SYS(&sys);
#else
    (void)sys;
#endif
    caf::detail::set_thread_name(name);
    sys.thread_started();
    body();
    sys.thread_terminates();
  }};
}

/// A worker thread. CAF's `scheduler::worker` runs the same loop, plus two things per job
/// that cost a tenth of the CPU of a message-bound program and serve only CAF's logger
/// (which Debian's CAF is built without: `CAF_LOG_LEVEL` quiet): a `dynamic_cast` from the
/// job to `abstract_actor` (a cross-cast, resolved by comparing type names) and the
/// logger's per-thread actor id, a map behind a shared spinlock, written twice. Log lines
/// written from inside an actor therefore carry no actor id under this scheduler.
class troupe_worker final : public caf::execution_unit {
public:
  using job_ptr = caf::resumable*;
  using policy_data = local_first::worker_data;

  troupe_worker(size_t id, troupe_coordinator* parent, const policy_data& init,
                size_t throughput);

  troupe_worker(const troupe_worker&) = delete;
  troupe_worker& operator=(const troupe_worker&) = delete;

  void start();

  /// From any thread (CAF's shutdown uses it).
  void external_enqueue(job_ptr job) {
    policy_.external_enqueue(this, job);
  }

  /// From the job this worker runs.
  void exec_later(job_ptr job) override {
    policy_.internal_enqueue(this, job);
  }

  troupe_coordinator* parent() noexcept {
    return parent_;
  }

  size_t id() const noexcept {
    return id_;
  }

  std::thread& get_thread() noexcept {
    return thread_;
  }

  policy_data& data() noexcept {
    return data_;
  }

private:
  void run();

  size_t max_throughput_;
  size_t id_;
  troupe_coordinator* parent_;
  policy_data data_;
  local_first policy_;
  std::thread thread_;
};

/// The scheduler module: troupe's policy on troupe's workers, with the lean clock above. It
/// follows CAF's `scheduler::coordinator` (the same shutdown order; at start the clock thread
/// comes first, where CAF starts it after the workers), with its own worker type and clock.
class troupe_coordinator final : public caf::scheduler::abstract_coordinator {
public:
  using worker_type = troupe_worker;
  using policy_data = local_first::coordinator_data;

  explicit troupe_coordinator(caf::actor_system& sys) : abstract_coordinator(sys), data_(this) {
    clock_.set_owner(this);
  }

  static caf::actor_system::module* make(caf::actor_system& sys, caf::detail::type_list<>) {
    return new troupe_coordinator(sys);
  }

  troupe_worker* worker_by_id(size_t x) {
    return workers_[x].get();
  }

  policy_data& data() noexcept {
    return data_;
  }

  lean_clock& clock() noexcept override {
    return clock_;
  }

protected:
  void start() override {
    // The clock first: actors may set timeouts as soon as they run, and a full event queue
    // blocks whoever pushes until the clock thread drains it.
    timer_ = system_thread(system(), "troupe.clock", [this] { clock_.run_dispatch_loop(); });
    typename troupe_worker::policy_data init{this};
    auto n = num_workers();
    workers_.reserve(n);
    for (size_t i = 0; i < n; ++i)
      workers_.emplace_back(std::make_unique<troupe_worker>(i, this, init, max_throughput_));
    for (auto& w : workers_)
      w->start();
    abstract_coordinator::start(); // the utility actors (the printer)
  }

  void stop() override;

  void enqueue(caf::resumable* ptr) override {
    policy_.central_enqueue(this, ptr);
  }

private:
  lean_clock clock_;
  std::vector<std::unique_ptr<troupe_worker>> workers_;
  policy_data data_;
  local_first policy_;
  std::thread timer_;
};

troupe_worker::troupe_worker(size_t id, troupe_coordinator* parent, const policy_data& init,
                             size_t throughput)
    : caf::execution_unit(&parent->system()),
      max_throughput_(throughput),
      id_(id),
      parent_(parent),
      data_(init) {}

void troupe_worker::start() {
  thread_ = system_thread(system(), "caf.multiplexer", [this] { run(); });
}

void troupe_worker::run() {
  troupe::detail::actor_slab::use_thread_cache();
  for (;;) {
    auto job = policy_.dequeue(this);
    policy_.before_resume(this, job);
    auto res = job->resume(this, max_throughput_);
#if CAF_LOG_LEVEL == CAF_LOG_LEVEL_QUIET
    // CAF's spawn installs the system's logger on the spawning thread (`spawn_impl`). With
    // nothing to log it goes again here, before the job's release (which may destroy an
    // actor), so the next jobs' resume and destruction skip the logger's actor-id map.
    if (caf::logger::current_logger() != nullptr) caf::logger::set_current_actor_system(nullptr);
#endif
    policy_.after_resume(this, job);
    switch (res) {
      case caf::resumable::resume_later:
        policy_.resume_job_later(this, job); // it stays referenced: it is still queued
        break;
      case caf::resumable::done:
        policy_.after_completion(this, job);
        intrusive_ptr_release(job);
        break;
      case caf::resumable::awaiting_message:
        intrusive_ptr_release(job); // the next message enqueues it again
        break;
      case caf::resumable::shutdown_execution_unit:
        policy_.after_completion(this, job);
        policy_.before_shutdown(this);
        return;
    }
  }
}

/// Run by one worker during shutdown: tells the coordinator which one, and ends that worker.
class shutdown_job final : public caf::resumable, public caf::ref_counted {
public:
  caf::resumable::resume_result resume(caf::execution_unit* unit, size_t) override {
    std::lock_guard<std::mutex> g{mtx};
    last = unit;
    cv.notify_all();
    return caf::resumable::shutdown_execution_unit;
  }

  void intrusive_ptr_add_ref_impl() override {
    ref();
  }

  void intrusive_ptr_release_impl() override {
    deref();
  }

  std::mutex mtx;
  std::condition_variable cv;
  caf::execution_unit* last = nullptr; // guarded by mtx
};

void troupe_coordinator::stop() {
  // End the workers one by one: a job given to one worker may be run by another (stealing),
  // so each round waits for whichever worker ran it and takes that one off the list.
  shutdown_job sj;
  std::vector<troupe_worker*> alive;
  for (auto& w : workers_) {
    alive.push_back(w.get());
    sj.ref(); // as CAF does: the job lives on this stack, no release may delete it
  }
  while (!alive.empty()) {
    alive.front()->external_enqueue(&sj);
    caf::execution_unit* done = nullptr;
    {
      std::unique_lock<std::mutex> g{sj.mtx};
      sj.cv.wait(g, [&] { return sj.last != nullptr; });
      done = std::exchange(sj.last, nullptr);
    }
    alive.erase(std::remove(alive.begin(), alive.end(), static_cast<troupe_worker*>(done)),
                alive.end());
  }
  stop_actors();
  for (auto& w : workers_)
    w->get_thread().join();
  // Jobs still queued are cleaned up and released (each holds a reference).
  auto f = &abstract_coordinator::cleanup_and_release;
  for (auto& w : workers_)
    policy_.foreach_resumable(w.get(), f);
  policy_.foreach_central_resumable(this, f);
  clock_.cancel_dispatch_loop(); // after every actor's cleanup: they use the clock
  timer_.join();
}

} // namespace

void load_troupe_scheduler(caf::actor_system_config& cfg) {
  cfg.load<troupe_coordinator>();
}

bool read_scheduler_counters(caf::actor_system& sys, scheduler_counters& out) {
  auto* c = dynamic_cast<troupe_coordinator*>(&sys.scheduler());
  if (c == nullptr) return false;
  out = scheduler_counters{};
  for (size_t i = 0; i < c->num_workers(); ++i) {
    auto& wd = c->worker_by_id(i)->data();
    out.slot_runs += wd.slot_runs.get();
    out.local_runs += wd.local_runs.get();
    out.inject_runs += wd.inject_runs.get();
    out.steals += wd.steals.get();
    out.stolen += wd.stolen.get();
    out.slot_steals += wd.slot_steals.get();
    out.parks += wd.parks.get();
    out.probes += wd.probes.get();
    out.cheap_probes += wd.cheap_probes.get();
    out.ends_without_timer += wd.ends_without_timer.get();
  }
  out.wakes = c->data().wakes.load(memory_order_relaxed);
  out.rescued = c->data().rescued.load(memory_order_relaxed);
  out.ends_without_timer += c->clock().skipped();
  out.ends_with_timer = c->clock().forwarded();
  return true;
}

} // namespace troupe
