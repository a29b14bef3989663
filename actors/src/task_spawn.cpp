// The task actor: spawning roots, children, branches and supervised tasks (lazily started:
// a child starts when its parent suspends, so a cancel sent right after the spawn wins).

#include "troupe/actors/context.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>

#include "troupe/messages/messaging.hpp"

namespace troupe::detail {

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
  // Deadlines nest: the tighter one applies.
  auto mine = deadline();
  if (mine && (!extras.deadline || *mine < *extras.deadline)) extras.deadline = mine;
  bool notify = !opts.detached && cold_ && cold_->fail_fast;
  // A scope's children are one fail-fast group (a combinator's branches have their own).
  std::shared_ptr<std::atomic<uint8_t>> await_state;
  if (notify && !extras.branch) {
    if (!cold_->children_group) cold_->children_group = std::make_shared<std::atomic<bool>>(false);
    extras.siblings_failed = cold_->children_group;
    await_state = std::make_shared<std::atomic<uint8_t>>(await_open);
    extras.await_state = await_state;
  }
  auto parent =
      extras.branch || notify ? caf::actor_cast<caf::actor_addr>(this) : caf::actor_addr{};
  // A child the body spawned with `cx.spawn` starts when the body suspends, so that a cancel
  // the body sends before then comes first (one message more). A combinator's branches,
  // scopes and deadlines start at once: their owner cancels them only through its own
  // protocol, after they have started.
  bool deferred = extras.deferred_start;
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
    c.children.emplace(a.id(), child_entry{a, std::move(cell), false, std::move(await_state)});
  }
  if (deferred) pending_starts_.push_back({a, lane_started});
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
                                                         spawn_options opts, caf::actor lane) {
  task_info ri;
  ri.id = std::to_string(++env->next_root);
  ri.group = std::move(opts.group);
  ri.name = std::move(opts.name);
  auto id = ri.id;
  spawn_extras extras;
  extras.deferred_start = true;
  extras.lane_starts = true;
  extras.lane = std::move(lane);
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
