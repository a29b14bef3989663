#include "troupe/actors/context.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>

namespace troupe::detail {

using namespace troupe::atoms;

void root_slot::fill(outcome_box x) {
  {
    std::lock_guard<std::mutex> guard{mtx};
    if (done)
      return;
    out = std::move(x);
    done = true;
  }
  cv.notify_all();
}

task_actor::task_actor(caf::actor_config& cfg, std::unique_ptr<runner_base> r, task_env* env,
                       task_info info, task_locals locals, std::shared_ptr<root_slot> slot)
  : caf::event_based_actor(cfg),
    runner_(std::move(r)),
    env_(env),
    info_(std::move(info)),
    locals_(std::move(locals)),
    slot_(std::move(slot)),
    cx_(this) {}

task_actor::~task_actor() = default;

caf::behavior task_actor::make_behavior() {
  // Install the behavior first: the body may finish (and quit) during start().
  become(caf::behavior{
    [this](await_atom) -> caf::response_promise {
      auto rp = make_response_promise();
      if (phase_ == phase::done) {
        deliver_result(rp);
        quit();
      } else {
        awaiters_.push_back(rp);
      }
      return rp;
    },
    [this](cancel_atom) -> caf::response_promise {
      auto rp = make_response_promise();
      if (phase_ == phase::done) {
        rp.deliver(false);
      } else {
        cancellers_.push_back(rp);
        if (phase_ == phase::running)
          stop_body();
      }
      return rp;
    },
    [this](cancel_atom, int64_t grace_ns) -> bool {
      if (phase_ != phase::running)
        return false;
      request_graceful(grace_ns);
      return true;
    },
    [this](cancel_atom, join_atom) -> caf::response_promise {
      auto rp = make_response_promise();
      release_on_done_ = true;
      if (phase_ == phase::done) {
        rp.deliver(false);
        quit();
      } else {
        cancellers_.push_back(rp);
        if (phase_ == phase::running)
          stop_body();
      }
      return rp;
    },
    [this](timer_atom, uint64_t seq) {
      if (is_parked(seq)) {
        parked_timer_ = 0;
        resume_parked();
      }
    },
    [this](force_atom, uint64_t gen) {
      if (gen == force_gen_ && phase_ == phase::running) {
        force_timer_ = 0;
        stop_body();
      }
    },
    [this](blocking_atom, uint64_t seq, outcome_box& box) {
      if (is_parked(seq)) {
        parked_->on_box(std::move(box));
        resume_parked();
      }
    },
  });
  start();
  return {};
}

void task_actor::start() {
  if (auto err = runner_->create(cx_)) {
    finish({nullptr, std::move(err)});
    return;
  }
  runner_->handle().resume();
  after_resume();
}

void task_actor::after_resume() {
  if (phase_ == phase::running && runner_->handle().done())
    finish(runner_->take_outcome());
}

void task_actor::resume_parked() {
  auto a = std::exchange(parked_, nullptr);
  if (parked_timer_ != 0)
    env_->clock->cancel(std::exchange(parked_timer_, 0));
  a->waiting_.resume();
  after_resume();
}

void task_actor::stop_body() {
  stopped_by_cancel_ = true;
  finish({nullptr, make_error(errc::cancelled, "", "task " + info_.id + " was cancelled")});
}

void task_actor::request_graceful(int64_t grace_ns) {
  if (grace_ns < 0)
    grace_ns = 0;
  if (!cancel_requested_)
    cancel_signal_ = true;
  cancel_requested_ = true;
  auto due = env_->clock->now() + std::chrono::nanoseconds{grace_ns};
  if (force_timer_ == 0 || due < force_due_) {
    if (force_timer_ != 0)
      env_->clock->cancel(force_timer_);
    force_due_ = due;
    force_timer_ = env_->clock->schedule(due, caf::actor_cast<caf::actor>(this),
                                         caf::make_message(force_atom::value, ++force_gen_));
  }
  // Children get the same deadline; they are joined (forced) when this body ends anyway.
  for (auto& kvp : children_)
    caf::anon_send(kvp.second, cancel_atom::value, grace_ns);
  if (parked_ != nullptr && cancel_signal_) {
    cancel_signal_ = false;
    parked_->cancelled_ = true;
    resume_parked();
  }
}

void task_actor::finish(outcome_box out) {
  phase_ = phase::finishing;
  outcome_ = std::move(out);
  parked_ = nullptr;
  if (parked_timer_ != 0)
    env_->clock->cancel(std::exchange(parked_timer_, 0));
  if (force_timer_ != 0)
    env_->clock->cancel(std::exchange(force_timer_, 0));
  // Destroying the frame runs the RAII cleanup of a cancelled body and releases every
  // handle it held.
  runner_->destroy();
  if (children_.empty()) {
    complete();
    return;
  }
  // Structured: children this body did not await are stopped and joined before the
  // outcome is reported.
  auto children = std::move(children_);
  children_.clear();
  joining_ = children.size();
  for (auto& kvp : children) {
    std::move(request(kvp.second, caf::infinite, cancel_atom::value, join_atom::value))
      .then(
        [this](bool) {
          if (--joining_ == 0)
            complete();
        },
        [this](caf::error&) {
          if (--joining_ == 0)
            complete();
        });
  }
}

void task_actor::deliver_result(caf::response_promise& rp) {
  if (consumed_) {
    rp.deliver(make_error(errc::already_awaited, "handle",
                          "task " + info_.id + " was awaited before; a result is handed out once"));
    return;
  }
  consumed_ = true;
  if (outcome_.err)
    rp.deliver(outcome_.err);
  else
    rp.deliver(std::move(outcome_));
}

void task_actor::complete() {
  phase_ = phase::done;
  if (slot_) {
    consumed_ = true;
    slot_->fill(std::move(outcome_));
  }
  for (auto& rp : awaiters_)
    deliver_result(rp);
  awaiters_.clear();
  for (auto& rp : cancellers_)
    rp.deliver(stopped_by_cancel_);
  cancellers_.clear();
  if (consumed_ || release_on_done_)
    quit();
}

void task_actor::on_exit() {
  // Any termination path (also a kill from plain CAF code or the runtime's last resort):
  // nobody waiting on this task may hang.
  if (phase_ != phase::done) {
    parked_ = nullptr;
    if (parked_timer_ != 0)
      env_->clock->cancel(std::exchange(parked_timer_, 0));
    if (force_timer_ != 0)
      env_->clock->cancel(std::exchange(force_timer_, 0));
    runner_->destroy();
    auto err = make_error(errc::cancelled, "", "task " + info_.id + " was terminated");
    if (slot_)
      slot_->fill({nullptr, err});
    for (auto& rp : awaiters_)
      rp.deliver(err);
    for (auto& rp : cancellers_)
      rp.deliver(true);
    for (auto& kvp : children_)
      caf::anon_send(kvp.second, cancel_atom::value, join_atom::value);
  }
  awaiters_.clear();
  cancellers_.clear();
  children_.clear();
  locals_.reset();
}

std::shared_ptr<handle_state> task_actor::spawn_child(std::unique_ptr<runner_base> r,
                                                      spawn_options opts) {
  task_info ci;
  ci.id = info_.id;
  ci.id += '.';
  ci.id += std::to_string(++child_count_);
  ci.parent_id = info_.id;
  ci.root_id = info_.root_id;
  ci.group_id = opts.group.empty() ? ci.id : std::move(opts.group);
  ci.name = opts.name.empty() ? std::string{"task"} : std::move(opts.name);
  auto id = ci.id;
  auto a = home_system().spawn<task_actor>(std::move(r), env_, std::move(ci), locals_,
                                           std::shared_ptr<root_slot>{});
  auto st = std::make_shared<handle_state>(a, std::move(id), env_);
  if (opts.detached) {
    if (env_->adopt)
      env_->adopt(a);
  } else {
    if (cancel_requested_) {
      auto left = force_due_ - env_->clock->now();
      caf::anon_send(a, cancel_atom::value,
                     static_cast<int64_t>(std::max(left.count(), int64_t{0})));
    }
    children_.emplace(a.id(), std::move(a));
  }
  return st;
}

std::shared_ptr<handle_state> task_actor::spawn_root(caf::actor_system& sys, task_env* env,
                                                     std::unique_ptr<runner_base> r,
                                                     spawn_options opts,
                                                     std::shared_ptr<root_slot> slot) {
  task_info ri;
  ri.id = std::to_string(++env->next_root);
  ri.root_id = ri.id;
  ri.group_id = opts.group.empty() ? ri.id : std::move(opts.group);
  ri.name = opts.name.empty() ? std::string{"task"} : std::move(opts.name);
  auto id = ri.id;
  auto a = sys.spawn<task_actor>(std::move(r), env, std::move(ri), task_locals{}, std::move(slot));
  if (env->adopt)
    env->adopt(a);
  return std::make_shared<handle_state>(std::move(a), std::move(id), env);
}

} // namespace troupe::detail
