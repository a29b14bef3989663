// The runtime's stop choreography: one fixed order, each step bounded, overruns named in
// `notices()`.

#include <chrono>
#include <string>

#include <caf/event_based_actor.hpp>

#include "runtime_impl.hpp"
#include "troupe/messages/interfaces.hpp"

namespace troupe {

namespace detail {

/// interrupts.cpp: while positive, a signal ends the process at once.
void signals_stopping(int delta) noexcept;

namespace {

/// Completions of one stop step: each actor's end or each reply marks one slot.
struct step_wait {
  explicit step_wait(size_t n) : done(n, false), left(n) {}
  std::mutex m;
  std::condition_variable cv;
  std::vector<bool> done;
  size_t left;
  void mark(size_t i) {
    {
      std::lock_guard<std::mutex> guard{m};
      if (done[i]) return;
      done[i] = true;
      --left;
    }
    cv.notify_all();
  }
  bool finished() {
    std::lock_guard<std::mutex> guard{m};
    return left == 0;
  }
  bool is_done(size_t i) {
    std::lock_guard<std::mutex> guard{m};
    return done[i];
  }
};

/// Marks slot `i` when `a` ends (at once when it already has).
void mark_on_exit(const caf::actor& a, const std::shared_ptr<step_wait>& w, size_t i) {
  if (!a) {
    w->mark(i);
    return;
  }
  a->attach_functor([w, i] { w->mark(i); });
}

/// Sends `xs` to `target` as a request from a helper actor; marks slot `i` on any answer.
template <class R, class... Ts>
void mark_on_reply(caf::actor_system& sys, const caf::actor& target,
                   const std::shared_ptr<step_wait>& w, size_t i, Ts... xs) {
  if (!target) {
    w->mark(i);
    return;
  }
  sys.spawn([=](caf::event_based_actor* self) {
    self->request(target, caf::infinite, xs...)
        .then([=](R&) { w->mark(i); }, [=](caf::error&) { w->mark(i); });
  });
}

/// The runtime whose stop choreography runs on this thread: a stop participant, or a task's
/// cleanup run by the stop's own drive (virtual time), that calls `stop()` returns at once.
thread_local const void* stopping_here = nullptr;

struct stopping_scope {
  const void* prev;
  explicit stopping_scope(const void* rt) noexcept : prev(std::exchange(stopping_here, rt)) {}
  ~stopping_scope() { stopping_here = prev; }
};

std::string ms_text(clock::duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

} // namespace

/// Keeps an actor system that could not be closed reachable until the process ends (its
/// destructor would wait forever for the actors still alive in it).
void abandon_system(std::unique_ptr<caf::actor_system> sys) noexcept {
  static auto* graveyard = new std::vector<std::unique_ptr<caf::actor_system>>;
  static std::mutex mtx;
  std::lock_guard<std::mutex> guard{mtx};
  graveyard->push_back(std::move(sys));
}

} // namespace detail

bool runtime::impl::wait_for(const std::function<bool()>& done, std::mutex& m,
                             std::condition_variable& wake, clock::duration bound) {
  if (sched == nullptr) {
    std::unique_lock<std::mutex> lock{m};
    auto deadline = detail::saturating_add(std::chrono::steady_clock::now(), bound);
    return wake.wait_until(lock, deadline, done); // `done` reads under `m`
  }
  auto deadline = detail::saturating_add(virt->now(), bound);
  for (;;) {
    drain();
    if (done()) return true;
    auto next = virt->next_due();
    if (!next || *next > deadline) return false;
    virt->advance_to_next();
  }
}

void runtime::stop() noexcept {
  if (!impl_) return;
  // Inside this runtime's stop (a participant, a cleanup the stop drives): it is under way.
  if (detail::stopping_here == impl_.get()) return;
  // From a task of this runtime: waiting here would wait for the caller itself (step 3
  // joins the root tasks; a worker thread would be blocked for the whole stop). The stop
  // starts as `request_stop` does and the caller is cancelled by it like any other task.
  // A task of another runtime stops this one in place, as any thread does.
  if (auto* cur = detail::task_actor::current(); cur != nullptr && &cur->env() == &impl_->env) {
    impl_->request_stop();
    return;
  }
  detail::release_caf_logger_here(); // this thread may close the system: it must not hold it
  impl_->stop_all();
}

void runtime::impl::request_stop() {
  if (stopped.load()) return;
  if (sched != nullptr) {
    // Virtual time: one thread drives the deterministic scheduler; the stop runs on it,
    // at the next drive from outside (run, drain, advance, run_for, wait_stopped).
    stop_requested = true;
    return;
  }
  std::lock_guard<std::mutex> guard{stop_mtx};
  if (stopper.joinable()) return;
  stopper = std::thread{[this] {
    detail::helper_thread_of = this;
    stop_all();
  }};
}

void runtime::impl::run_requested_stop() noexcept {
  if (stop_requested.load() && !stopped.load() && detail::stopping_here == nullptr &&
      detail::task_actor::current() == nullptr)
    stop_all();
}

void runtime::impl::stop_all() noexcept {
  auto& s = *this;
  if (s.defer_stop()) return; // build() is starting the node: it stops the runtime after
  bool lifecycle_unlock_and_wait = false;
  {
    std::lock_guard<std::mutex> guard{s.lifecycle_mtx};
    if (s.stopped.exchange(true)) {
      // A second caller (the destructor after a signal's stop): wait for the first, then
      // close the system here if the first ran on a helper thread.
      bool helper = detail::helper_thread_of == this;
      if (helper) return;
      lifecycle_unlock_and_wait = true;
    }
  }
  if (lifecycle_unlock_and_wait) {
    {
      std::unique_lock<std::mutex> lock{s.stop_mtx};
      s.stop_cv.wait(lock, [&s] { return s.stop_finished; });
    }
    // Several callers may wait at once: one at a time joins the helpers and closes.
    std::lock_guard<std::mutex> finishing{s.finish_mtx};
    s.join_helpers();
    s.close_system();
    return;
  }
  detail::stopping_scope here{this};
  bool signalled = s.listening_now();
  if (signalled) detail::signals_stopping(+1);
  auto bound = detail::bound_of(s.cfg.stop_timeout);
  auto& sys = *s.sys;
  using detail::step_wait;

  // 1. Cancel queued jobs: every lane refuses and answers its queue `cancelled`.
  std::vector<caf::actor> lanes;
  if (s.env.lanes)
    for (auto& e : s.env.lanes->entries())
      lanes.push_back(e.actor);
  for (auto& l : lanes)
    caf::anon_send(l, atoms::sy_close_atom::value);
  s.log_step("1 cancel queued jobs: " + std::to_string(lanes.size()) + " lanes closed");

  // 2. Let running attempts finish within their deadlines.
  {
    auto w = std::make_shared<step_wait>(lanes.size());
    for (size_t i = 0; i < lanes.size(); ++i)
      detail::mark_on_reply<bool>(sys, lanes[i], w, i, atoms::sy_drained_atom::value);
    bool ok = s.wait_for([&] { return w->left == 0; }, w->m, w->cv, bound);
    if (!ok)
      for (size_t i = 0; i < lanes.size(); ++i)
        if (!w->is_done(i))
          s.note("stop.lanes", s.env.lanes->entries()[i].decl.name,
                 "attempts still running after " + detail::ms_text(bound) +
                     "; they are killed at join");
    s.log_step(std::string{"2 running attempts: "} + (ok ? "finished" : "overran"));
  }

  // 3. Signal and join services: supervisors (children stop in reverse order) and the
  // runtime's root tasks.
  std::vector<caf::actor> live;
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> guard{s.roots_mtx};
    for (auto& [w, name] : s.supervisors)
      if (auto a = caf::actor_cast<caf::actor>(w.lock())) {
        live.push_back(std::move(a));
        names.push_back("supervisor " + name);
      }
    s.supervisors.clear();
    for (auto& w : s.roots)
      if (auto a = caf::actor_cast<caf::actor>(w.lock())) {
        live.push_back(std::move(a));
        names.push_back("task");
      }
    s.roots.clear();
  }
  {
    auto w = std::make_shared<step_wait>(live.size());
    for (size_t i = 0; i < live.size(); ++i) {
      mark_on_exit(live[i], w, i);
      if (names[i] == "task")
        caf::anon_send(live[i], atoms::cancel_atom::value, cancel_mode::join());
      else
        caf::anon_send_exit(live[i], caf::exit_reason::user_shutdown);
    }
    bool ok = s.wait_for([&] { return w->left == 0; }, w->m, w->cv, bound);
    size_t tasks_left = 0;
    if (!ok)
      for (size_t i = 0; i < live.size(); ++i)
        if (!w->is_done(i)) {
          if (names[i] == "task")
            ++tasks_left;
          else
            s.note("stop.services", names[i],
                   "still stopping after " + detail::ms_text(bound) + "; killed at join");
        }
    if (tasks_left > 0)
      s.note("stop.services", "tasks",
             std::to_string(tasks_left) + " root tasks did not end within " +
                 detail::ms_text(bound) + "; killed at join");
    s.log_step("3 services: " + std::to_string(live.size()) + " signalled, " +
               (ok ? "all joined" : "some overran"));
  }

  // 4. Signal and await the stop participants, each within its grace.
  std::vector<runtime::impl::participant> parts;
  {
    std::lock_guard<std::mutex> guard{s.lifecycle_mtx};
    parts.swap(s.participants);
  }
  s.adopting_participants = true;
  for (auto& p : parts) {
    auto body = p.body;
    auto r = detail::make_runner([body](context& cx) -> task<void> { return body(cx); });
    // A result slot, as `run` uses: the participant is done when its outcome is delivered.
    auto slot = std::make_shared<detail::root_slot>();
    auto st = [&] {
      std::lock_guard<std::mutex> guard{s.lifecycle_mtx};
      return detail::task_actor::spawn_root(sys, &s.env, std::move(r), {.name = "stop:" + p.name},
                                            slot);
    }();
    if (!st) {
      s.note("stop.participant", p.name, "could not start");
      continue;
    }
    auto a = st->actor;
    bool ok = s.wait_for([&] { return slot->done; }, slot->mtx, slot->cv, p.grace);
    if (!ok) {
      s.note("stop.participant", p.name,
             "did not finish within its grace of " + detail::ms_text(p.grace) + " (task " +
                 st->id + " still running); cancelled");
      caf::anon_send(a, atoms::cancel_atom::value, cancel_mode::force());
      live.push_back(a);
    }
    s.log_step("4 participant " + p.name + ": " + (ok ? "finished" : "overran its grace"));
  }
  s.adopting_participants = false;

  // 5. Drain and flush durability: first the hub's trigger windows (their matches write
  // audit rows), then the storage's group commit (a round trip behind every write already
  // sent, the hub's included), each within `stop_timeout`.
  {
    auto hub = s.services->find(runtime_service::channel_hub, "", false);
    auto storage = s.services->find(runtime_service::storage, "", false);
    // Sends `msg` to `target` and waits for its answer, each up to `stop_timeout` (a hub
    // that overran does not take the storage's group commit away).
    auto flush = [&](auto reply, const caf::actor& target, auto msg, const char* who) {
      auto w = std::make_shared<step_wait>(1);
      detail::mark_on_reply<decltype(reply)>(sys, target, w, 0, msg);
      bool ok = s.wait_for([&] { return w->left == 0; }, w->m, w->cv, bound);
      if (!ok)
        s.note("stop.durability", who,
               "did not answer its flush within " + detail::ms_text(bound));
      return ok;
    };
    bool hub_ok = flush(uint64_t{0}, hub && *hub ? *hub : caf::actor{},
                        atoms::ch_flush_atom::value, "channel hub");
    bool storage_ok = flush(storage_metrics{}, storage && *storage ? *storage : caf::actor{},
                            atoms::st_metrics_atom::value, "storage");
    bool ok = hub_ok && storage_ok;
    s.log_step(std::string{"5 durability: "} + (ok ? "flushed" : "overran"));
  }

  // 6. Join: what is left is killed (its on_exit still tells its waiters); then the
  // registry, the lanes, the detector, the storage, the clock and the executor stop.
  {
    std::lock_guard<std::mutex> guard{s.roots_mtx};
    for (auto& w : s.roots)
      if (auto a = caf::actor_cast<caf::actor>(w.lock())) live.push_back(std::move(a));
    s.roots.clear();
  }
  for (auto& a : live)
    caf::anon_send_exit(a, caf::exit_reason::kill);
  live.clear();
  if (s.spawner) caf::anon_send_exit(s.spawner, caf::exit_reason::kill);
  if (s.tls_sink != 0) {
    detail::remove_tls_refusal_sink(s.tls_sink);
    s.tls_sink = 0;
  }
  if (s.directory) {
    s.sys->registry().erase(cluster_directory_key());
    caf::anon_send_exit(s.directory, caf::exit_reason::kill);
  }
  s.stop_services();
  if (s.sched != nullptr) {
    s.drain();
    s.virt->clear();
    s.manual->clear();
    s.drain();
  } else {
    s.real->stop();
    s.pool->stop();
  }
  s.log_step("6 join");

  // 7. Close. CAF keeps the system's logger alive from a thread-local of each thread that
  // used the system (the one that built it, at least), and the system's destructor waits for
  // the logger: a stop running on the signal or `request_stop` thread leaves the close to the
  // next `stop()` or the destructor, on the owner's thread.
  bool helper_thread = detail::helper_thread_of == this;
  if (!helper_thread) {
    // The helpers first: a thread that spawned into the system (the interrupt thread runs
    // handlers) holds CAF's logger until it ends, and the close waits for that.
    std::lock_guard<std::mutex> finishing{s.finish_mtx};
    s.join_helpers();
    s.close_system();
  }
  if (signalled) detail::signals_stopping(-1);
  {
    std::lock_guard<std::mutex> guard{s.stop_mtx};
    s.stop_finished = true;
  }
  s.stop_cv.notify_all();
}

void runtime::impl::close_system() noexcept {
  if (!sys) return;
  {
    // An open from another thread that passed its check before the stop spawns into the
    // system: it ends first (its storage actor is stopped by the open's own check).
    std::unique_lock<std::mutex> guard{lifecycle_mtx};
    opens_done.wait(guard, [this] { return opens_in_flight == 0; });
  }
  // CAF's destructor waits, without a bound, for every actor of the system. troupe's own
  // have all been told to end; a plain actor spawned through `rt.system()` may never. Wait
  // for them up to `stop_timeout`, then give up: the system is left running for them (never
  // destroyed, so nothing they touch goes away) and the notice says how many are alive.
  auto alive = [this] { return sys->registry().running(); };
  auto bound = detail::bound_of(cfg.stop_timeout);
  if (sched != nullptr) {
    drain();
  } else {
    // The registry offers no bounded wait: poll, at most for the bound.
    auto deadline = detail::saturating_add(std::chrono::steady_clock::now(), bound);
    while (alive() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds{2});
  }
  if (auto n = alive(); n > 0) {
    note("stop.close", "actors",
         std::to_string(n) + " actors not owned by troupe (spawned through rt.system()) still "
                             "alive after " + detail::ms_text(bound) +
             "; the actor system is left running for them");
    detail::abandon_system(std::move(sys));
    log_step("7 closed (the actor system left running)");
    return;
  }
  sys.reset();
  log_step("7 closed");
}

void runtime::impl::join_helpers() noexcept {
  {
    std::lock_guard<std::mutex> g{interrupt_mtx};
    interrupt_exit = true;
  }
  interrupt_cv.notify_all();
  if (interrupt_thread.joinable() && interrupt_thread.get_id() != std::this_thread::get_id())
    interrupt_thread.join();
  if (stopper.joinable() && stopper.get_id() != std::this_thread::get_id()) stopper.join();
}

void runtime::request_stop() {
  if (impl_) impl_->request_stop();
}

void runtime::wait_stopped() {
  if (!impl_) return;
  detail::release_caf_logger_here(); // a stop on another thread may close the system
  impl_->run_requested_stop(); // virtual time: a requested stop runs on the driving thread
  std::unique_lock<std::mutex> lock{impl_->stop_mtx};
  impl_->stop_cv.wait(lock, [this] { return impl_->stop_finished; });
}

caf::error runtime::on_stop(std::string name, stop_body body, clock::duration grace) {
  if (!impl_) return make_error(errc::runtime_stopped, "runtime", "the runtime was moved from");
  if (name.empty()) return make_error(errc::invalid_argument, "name", "a participant needs a name");
  if (!body) return make_error(errc::invalid_argument, "body", "the participant's body is empty");
  if (grace.count() < 0)
    return make_error(errc::invalid_argument, "grace", "a grace period cannot be negative");
  std::lock_guard<std::mutex> guard{impl_->lifecycle_mtx};
  if (impl_->stopped.load())
    return make_error(errc::runtime_stopped, "runtime", "the runtime is stopping");
  for (auto& p : impl_->participants)
    if (p.name == name)
      return make_error(errc::invalid_argument, "name",
                        "a stop participant \"" + name + "\" is already registered");
  impl_->participants.push_back({std::move(name), std::move(body), grace});
  return {};
}

std::vector<runtime_notice> runtime::notices() const {
  if (!impl_) return {};
  std::lock_guard<std::mutex> guard{impl_->notes_mtx};
  return impl_->notices;
}

std::vector<std::string> runtime::stop_log() const {
  if (!impl_) return {};
  std::lock_guard<std::mutex> guard{impl_->notes_mtx};
  return impl_->stop_log;
}

} // namespace troupe
