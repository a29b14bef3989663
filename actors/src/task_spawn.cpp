// The task actor: spawning roots, children, branches and supervised tasks (lazily started:
// a child starts when its parent suspends, so a cancel sent right after the spawn wins).

#include "troupe/actors/context.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>

#include "troupe/actors/detail/test_hooks.hpp"
#include "troupe/messages/messaging.hpp"

namespace troupe::detail {

namespace {

std::atomic<nursery_spawned_hook> nursery_spawned{nullptr};

/// A scope child's await state (see await_open), starting at `init`: in its cell when it
/// has one (sharing the cell's count: no allocation), else a block of its own.
std::shared_ptr<std::atomic<uint8_t>> make_await_state(const std::shared_ptr<result_cell>& cell,
                                                       uint8_t init) {
  if (!cell) return recycler::make_shared<std::atomic<uint8_t>>(init);
  cell->scope_await.store(init, std::memory_order_relaxed);
  return {cell, &cell->scope_await};
}

} // namespace

void set_nursery_spawned_hook(nursery_spawned_hook hook) noexcept {
  nursery_spawned.store(hook, std::memory_order_release);
}

using namespace troupe::atoms;

caf::actor task_actor::spawn_special(std::unique_ptr<runner_base> r, spawn_options opts,
                                     spawn_extras extras, std::string* id_out) {
  flush_posts(); // the child may read what this task has sent
  task_info ci;
  ci.id = id_;
  ci.id += '.';
  ci.id += std::to_string(++child_count_);
  ci.group = std::move(opts.group);
  ci.name = std::move(opts.name);
  if (id_out != nullptr) *id_out = ci.id;
  // Deadlines nest: the tighter one applies (not to a detached child: the runtime owns it,
  // and nothing of this task's ends it).
  auto mine = opts.detached ? std::nullopt : deadline();
  if (mine && (!extras.deadline || *mine < *extras.deadline)) extras.deadline = mine;
  bool notify = !opts.detached && cold_ && cold_->fail_fast;
  // A scope's children are one fail-fast group (a combinator's branches have their own).
  std::shared_ptr<std::atomic<uint8_t>> await_state;
  if (notify && !extras.branch) {
    if (!cold_->children_group) cold_->children_group = std::make_shared<std::atomic<bool>>(false);
    extras.siblings_failed = cold_->children_group;
    await_state = make_await_state(
        extras.cell, extras.awaited_from_spawn ? uint8_t{await_taken} : uint8_t{await_open});
    extras.await_state = await_state;
  }
  auto parent =
      extras.branch || notify ? caf::actor_cast<caf::actor_addr>(this) : caf::actor_addr{};
  // A child the body spawned with `cx.spawn` starts when the body suspends, so that a cancel
  // the body sends before then comes first (one message more). A combinator's branches,
  // scopes and deadlines start at once: their owner cancels them only through its own
  // protocol, after they have started.
  bool deferred = extras.deferred_start;
  bool in_nursery = await_state != nullptr;
  bool lane_started = deferred && extras.lane_starts;
  auto cell = opts.detached ? nullptr : extras.cell;
  auto a = deferred ? home_system().spawn<task_actor, caf::lazy_init>(
                          std::move(r), env_, std::move(ci), locals(), std::shared_ptr<root_slot>{},
                          std::move(parent), std::move(extras), notify)
                    : home_system().spawn<task_actor>(std::move(r), env_, std::move(ci), locals(),
                                                      std::shared_ptr<root_slot>{},
                                                      std::move(parent), std::move(extras), notify);
  if (opts.detached) {
    if (env_->owner != nullptr) env_->owner->adopt(a);
  } else {
    auto& c = cold();
    if (cancel_requested_) {
      auto left = c.force_due == clock::time_point::max()
                      ? clock::duration{cancel_mode::unbounded}
                      : c.force_due - env_->clock->now();
      send_cancel(a, cancel_mode::graceful(static_cast<int64_t>(left.count())));
    }
    c.children.emplace(a.id(), child_entry{a, std::move(cell), false, std::move(await_state), nullptr});
  }
  if (deferred) pending_starts_.push_back({a, lane_started});
  if (in_nursery && !deferred)
    if (auto* hook = nursery_spawned.load(std::memory_order_acquire)) hook(a);
  return a;
}

std::shared_ptr<handle_state> task_actor::spawn_child(std::unique_ptr<runner_base> r,
                                                      spawn_options opts) {
  std::string id;
  // A handle the body may cancel before it awaits anything: started when the body suspends.
  spawn_extras extras;
  extras.deferred_start = current() == this;
  auto cell = recycler::make_shared<result_cell>();
  extras.cell = cell;
  auto a = spawn_special(std::move(r), std::move(opts), std::move(extras), &id);
  auto st = recycler::make_shared<handle_state>(std::move(a), std::move(id), env_);
  st->cell = std::move(cell);
  return st;
}

std::shared_ptr<handle_state> task_actor::spawn_root(caf::actor_system& sys, task_env* env,
                                                     std::unique_ptr<runner_base> r,
                                                     spawn_options opts,
                                                     std::shared_ptr<root_slot> slot) {
  bool slot_given = static_cast<bool>(slot);
  task_info ri;
  ri.id = std::to_string(++env->next_root);
  ri.group = std::move(opts.group);
  ri.name = std::move(opts.name);
  auto id = ri.id;
  // Virtual time: a root spawned on its own (`rt.spawn`, no result slot) starts when the
  // scheduler next runs out of work, so that `rt.spawn` then `rt.cancel` cancels it first;
  // a root that `rt.run` drives, and any root on real time, starts at once.
  bool deferred = env->clock->is_virtual() && !slot_given;
  spawn_extras extras;
  extras.deferred_start = deferred;
  auto a = deferred ? sys.spawn<task_actor, caf::lazy_init>(std::move(r), env, std::move(ri),
                                                           task_locals{}, std::move(slot),
                                                           caf::actor_addr{}, extras, false)
                    : sys.spawn<task_actor>(std::move(r), env, std::move(ri), task_locals{},
                                            std::move(slot), caf::actor_addr{}, extras, false);
  if (env->owner != nullptr) env->owner->adopt(a);
  if (deferred) {
    std::lock_guard<std::mutex> guard{env->deferred_mtx};
    env->deferred_starts.push_back(a);
  }
  return recycler::make_shared<handle_state>(std::move(a), std::move(id), env);
}

std::shared_ptr<handle_state> task_actor::spawn_root_job(caf::actor_system& sys, task_env* env,
                                                         std::unique_ptr<runner_base> r,
                                                         spawn_options opts, const caf::actor& lane) {
  task_info ri;
  ri.id = std::to_string(++env->next_root);
  ri.group = std::move(opts.group);
  ri.name = std::move(opts.name);
  auto id = ri.id;
  spawn_extras extras;
  extras.deferred_start = true;
  extras.lane_starts = true;
  extras.lane = &lane;
  auto cell = recycler::make_shared<result_cell>();
  extras.cell = cell;
  auto a = sys.spawn<task_actor, caf::lazy_init>(std::move(r), env, std::move(ri), task_locals{},
                                                 std::shared_ptr<root_slot>{}, caf::actor_addr{},
                                                 std::move(extras), false);
  if (env->owner != nullptr) env->owner->adopt(a);
  auto st = recycler::make_shared<handle_state>(std::move(a), std::move(id), env);
  st->cell = std::move(cell);
  return st;
}

caf::actor task_actor::spawn_supervised(caf::actor_system& sys, task_env* env,
                                        std::unique_ptr<runner_base> r, std::string name) {
  task_info ri;
  ri.id = std::to_string(++env->next_root);
  ri.name = std::move(name);
  spawn_extras extras;
  extras.supervised = true;
  auto child_name = ri.name;
  auto a = sys.spawn<task_actor>(std::move(r), env, std::move(ri), task_locals{},
                                 std::shared_ptr<root_slot>{}, caf::actor_addr{},
                                 std::move(extras), false);
  // Simulation: a supervised child may exit "environmentally" (not by its body) a little
  // after it starts; its supervisor sees a failure with `injected_fault`.
  if (fault_fires(*env, "service.exit", child_name)) {
    auto delay = std::chrono::milliseconds{1 + static_cast<int64_t>(a.id() % 50)};
    auto reason = make_error(errc::injected_fault, "service.exit",
                             "simulated environmental exit of " + child_name);
    env->clock->schedule(env->clock->now() + delay, a,
                         caf::make_message(caf::exit_msg{a.address(), std::move(reason)}));
  }
  return a;
}

} // namespace troupe::detail

namespace troupe::detail {

uint64_t job_ticket::next_key() noexcept {
  // Actor ids count up from 1 and never reach 2^62: the keys cannot meet them.
  static std::atomic<uint64_t> next{uint64_t{1} << 62};
  return next.fetch_add(1, std::memory_order_relaxed);
}

namespace {

/// Spawns the ticket's task holding `permit` (called with the ticket's lock held: the task
/// is only scheduled, never run, by the spawn).
caf::actor spawn_from_ticket(job_ticket& t, uint64_t permit) {
  spawn_extras extras;
  // Moved, not copied: a running ticket's cell is never read again (only a withdrawn one
  // answers through it, see ticket_stop), and the copy was a locked increment of a line
  // written at the submission, cold by the admission in a burst (half of this function's
  // time in `job_submit`), and a locked decrement when the ticket went.
  extras.cell = std::move(t.cell);
  extras.siblings_failed = std::move(t.siblings_failed);
  extras.await_state = std::move(t.await_state);
  extras.lane_grant = permit;
  extras.child_key = t.key;
  extras.lane = t.lane;
  extras.ticket = t.shared_from_this();
  // The ticket counted a live task waiting for its lane: the task takes over the live
  // count, and the wait ends (one atomic step per job, not three).
  extras.live_counted = true;
  auto a = t.env->sys->spawn<task_actor>(std::move(t.runner), t.env, t.info, std::move(t.locals),
                                    std::shared_ptr<root_slot>{}, t.parent, std::move(extras),
                                    t.notify);
  t.env->census.change(wait_census::channel, -1);
  t.state.store(job_ticket::running, std::memory_order_release);
  t.actor = a;
  return a;
}

} // namespace

void ticket_go(const std::shared_ptr<job_ticket>& t) {
  std::lock_guard<spin_lock> guard{t->mtx};
  t->go = true;
  if (t->state.load(std::memory_order_relaxed) == job_ticket::admitted)
    spawn_from_ticket(*t, std::exchange(t->permit, 0));
}

bool ticket_admit(const std::shared_ptr<job_ticket>& t, uint64_t permit) {
  std::lock_guard<spin_lock> guard{t->mtx};
  if (t->state.load(std::memory_order_relaxed) != job_ticket::queued) return false; // withdrawn
  if (t->go) {
    spawn_from_ticket(*t, permit);
  } else {
    t->state.store(job_ticket::admitted, std::memory_order_relaxed);
    t->permit = permit;
  }
  return true;
}

bool ticket_stop(const std::shared_ptr<job_ticket>& t, caf::actor& a, caf::error err,
                 bool from_lane) {
  uint64_t permit = 0;
  {
    std::lock_guard<spin_lock> guard{t->mtx};
    switch (t->state.load(std::memory_order_relaxed)) {
      case job_ticket::running:
        a = t->actor;
        return false;
      case job_ticket::withdrawn:
        return false;
      case job_ticket::admitted:
        permit = std::exchange(t->permit, 0);
        [[fallthrough]];
      case job_ticket::queued:
        t->state.store(job_ticket::withdrawn, std::memory_order_release);
        break;
    }
  }
  // No task will ever exist: what it would have done at its end happens here.
  t->env->census.change(wait_census::channel, -1);
  t->env->census.change(wait_census::live, -1);
  if (!from_lane)
    if (t->lane != nullptr)
      caf::anon_send(*t->lane, atoms::sy_ticket_gone_atom::value, job_ticket_ref{t}, permit);
  auto notice_err = err;
  if (t->cell && t->cell->publish(outcome_box{nullptr, std::move(err)}))
    if (auto w = caf::actor_cast<caf::actor>(t->cell->waiter))
      caf::anon_send(w, atoms::await_done_atom::value, t->cell->waiter_seq);
  if (t->notify)
    if (auto p = caf::actor_cast<caf::actor>(t->parent))
      caf::anon_send(p, atoms::report_atom::value, task_actor::child_done_notice, uint64_t{0},
                     caf::actor_id{t->key}, outcome_box{nullptr, std::move(notice_err)});
  // The body (and what it captured) goes now, not when the last handle does.
  t->runner.reset();
  t->locals = nullptr;
  return true;
}

/// Tickets a body holds at most before they go to their lane in one message (spawn_ticket).
constexpr size_t ticket_flush_every = 256;

std::shared_ptr<job_ticket> task_actor::spawn_ticket(std::unique_ptr<runner_base> r,
                                                     spawn_options opts, const caf::actor& lane,
                                                     std::shared_ptr<result_cell> cell,
                                                     std::string* id_out) {
  // The job may read what this task has sent: posts go out now, behind the tickets still
  // held (a value sent after an earlier submit must not wake a task whose own submission
  // overtakes that one). With no posts the tickets stay held, to go out together.
  if (cold_ && !cold_->posts.empty()) flush_posts();
  auto t = recycler::make_shared<job_ticket>();
  t->runner = std::move(r);
  t->env = env_;
  t->info.id = id_;
  t->info.id += '.';
  t->info.id += std::to_string(++child_count_);
  t->info.group = std::move(opts.group);
  t->info.name = std::move(opts.name);
  if (id_out != nullptr) *id_out = t->info.id;
  t->locals = locals();
  t->key = job_ticket::next_key();
  t->lane = &lane;
  t->cell = std::move(cell);
  // A scope's children are one fail-fast group and tell the scope of their end.
  bool notify = cold_ && cold_->fail_fast;
  std::shared_ptr<std::atomic<uint8_t>> await_state;
  if (notify) {
    if (!cold_->children_group) cold_->children_group = std::make_shared<std::atomic<bool>>(false);
    t->siblings_failed = cold_->children_group;
    await_state = make_await_state(t->cell, await_open);
    t->await_state = await_state;
    t->parent = caf::actor_cast<caf::actor_addr>(this);
  }
  t->notify = notify;
  // Counted as a live task waiting for its lane, as an idle job task was.
  env_->census.change(wait_census::live, 1);
  env_->census.change(wait_census::channel, 1);
  auto& c = cold();
  c.children.emplace(t->key, child_entry{caf::actor{}, t->cell, false, std::move(await_state), t});
  // Sent to the lane with the other tickets of this run of the body, when it suspends or
  // before anything else leaves this task (one message, not one per job).
  if (!c.tickets.empty() && c.ticket_lane != lane) flush_tickets();
  if (c.tickets.empty()) c.ticket_lane = lane;
  c.tickets.push_back(t);
  if (cancel_requested_) { // this task is being cancelled: the job never runs
    caf::actor running;
    if (ticket_stop(t, running, make_error(errc::cancelled, "", "job " + t->info.id + " was cancelled")))
      c.children.erase(t->key);
    flush_tickets();
  } else if (current() == this) {
    pending_tickets_.push_back(t); // the go when the body suspends
    // A long run of submissions sends its tickets on every `ticket_flush_every`: the lane
    // (on another worker, while this body still runs) queues them and admits the first, so
    // the body's suspension finds them queued, and their tasks start with its go. A ticket
    // on its lane early starts no earlier: its task waits for the go all the same.
    if (c.tickets.size() >= ticket_flush_every) flush_tickets();
  } else {
    ticket_go(t); // submitted outside the body's run (a destructor at its end): no wait
    flush_tickets();
  }
  return t;
}

void task_actor::flush_tickets() noexcept {
  auto& c = cold();
  if (c.tickets.empty()) return;
  auto lane = std::move(c.ticket_lane);
  job_ticket_batch batch;
  batch.tickets.swap(c.tickets);
  c.ticket_lane = nullptr;
  caf::anon_send(lane, atoms::sy_ticket_atom::value, std::move(batch));
}

} // namespace troupe::detail
