#pragma once

// Internal: include <troupe/actors/context.hpp>, which includes this header.

#include <condition_variable>
#include <coroutine>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/event_based_actor.hpp>
#include <caf/response_promise.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/actors/detail/runner.hpp"
#include "troupe/actors/task_env.hpp"
#include "troupe/actors/task_handle.hpp"
#include "troupe/messages/outcome.hpp"

namespace troupe::detail {

/// Identity of a task.
struct task_info {
  std::string id;
  std::string parent_id;
  std::string root_id;
  std::string group_id;
  std::string name;
};

/// Where a root task started from outside any actor (`runtime::run`) leaves its outcome.
struct root_slot {
  std::mutex mtx;
  std::condition_variable cv;
  bool done = false;
  outcome_box out;
  /// Delivers `x` once and wakes the waiting thread.
  void fill(outcome_box x);
};

/// A suspended `co_await` of a task body, parked on its task actor.
class awaiter_base {
public:
  /// The coroutine to resume.
  std::coroutine_handle<> waiting_;
  /// Set when the task was asked to stop; `await_resume` then throws `task_cancelled`.
  bool cancelled_ = false;
  /// Receives the result of a blocking job (only blocking awaiters use it).
  virtual void on_box(outcome_box&&) {}

protected:
  ~awaiter_base() = default;
};

/// The actor that drives one task body. Protocol (atoms in messages/atoms.hpp):
/// - `(await)` -> `outcome_box` | error: the result, handed out once;
/// - `(cancel)` -> bool: forced stop (true when this stopped it);
/// - `(cancel, grace_ns)` -> bool: graceful stop, forced after the grace period;
/// - `(cancel, join)` -> bool: the owner no longer wants the task: stop it if running,
///   discard its result, and answer once it and its children are gone;
/// - `(timer, seq)`, `(force, gen)`, `(blocking, seq, outcome_box)`: internal.
class task_actor final : public caf::event_based_actor {
public:
  task_actor(caf::actor_config& cfg, std::unique_ptr<runner_base> r, task_env* env,
             task_info info, task_locals locals, std::shared_ptr<root_slot> slot);
  ~task_actor() override;

  caf::behavior make_behavior() override;
  const char* name() const override { return "troupe.task"; }
  void on_exit() override;

  // -- used by context and awaiters (always from this actor's own thread) -----------------

  /// Parks `a` as the pending await; returns the sequence number that matches its reply.
  uint64_t park(awaiter_base* a) noexcept {
    parked_ = a;
    return ++park_seq_;
  }
  /// Returns whether `seq` is the pending await.
  [[nodiscard]] bool is_parked(uint64_t seq) const noexcept {
    return parked_ != nullptr && park_seq_ == seq;
  }
  /// Resumes the pending await, then checks whether the body finished.
  void resume_parked();
  /// Records the timer that will resume the pending await (cancelled if the await ends).
  void parked_timer(clock::timer_id id) noexcept { parked_timer_ = id; }

  [[nodiscard]] bool cancel_requested() const noexcept { return cancel_requested_; }
  /// Returns true once after a graceful cancel: the await that observes it throws
  /// `task_cancelled`; later awaits work again so that cleanup can await.
  [[nodiscard]] bool take_cancel_signal() noexcept { return std::exchange(cancel_signal_, false); }
  [[nodiscard]] task_env& env() const noexcept { return *env_; }
  [[nodiscard]] const task_info& info() const noexcept { return info_; }
  [[nodiscard]] troupe::context& ctx() noexcept { return cx_; }
  [[nodiscard]] task_locals& locals() noexcept { return locals_; }
  [[nodiscard]] std::string new_group_id() {
    return info_.id + "/g" + std::to_string(++group_count_);
  }

  /// Spawns a child task and tracks it (unless detached); returns its handle state.
  std::shared_ptr<handle_state> spawn_child(std::unique_ptr<runner_base> r, spawn_options opts);
  /// Stops tracking a child whose result this task took.
  void forget_child(caf::actor_id id) { children_.erase(id); }

  /// Spawns a root task (no task owner) in `sys`.
  static std::shared_ptr<handle_state> spawn_root(caf::actor_system& sys, task_env* env,
                                                  std::unique_ptr<runner_base> r,
                                                  spawn_options opts,
                                                  std::shared_ptr<root_slot> slot);

private:
  enum class phase : uint8_t { running, finishing, done };

  void start();
  void after_resume();
  void stop_body();
  void finish(outcome_box out);
  void complete();
  void deliver_result(caf::response_promise& rp);
  void request_graceful(int64_t grace_ns);

  std::unique_ptr<runner_base> runner_;
  task_env* env_;
  task_info info_;
  task_locals locals_;
  std::shared_ptr<root_slot> slot_;
  troupe::context cx_;

  phase phase_ = phase::running;
  bool cancel_requested_ = false;
  bool cancel_signal_ = false;
  bool stopped_by_cancel_ = false;
  bool consumed_ = false;
  bool release_on_done_ = false;
  awaiter_base* parked_ = nullptr;
  uint64_t park_seq_ = 0;
  clock::timer_id parked_timer_ = 0;
  clock::timer_id force_timer_ = 0;
  clock::time_point force_due_{};
  uint64_t force_gen_ = 0;
  uint64_t child_count_ = 0;
  uint64_t group_count_ = 0;
  size_t joining_ = 0;
  outcome_box outcome_;
  std::unordered_map<caf::actor_id, caf::actor> children_;
  std::vector<caf::response_promise> awaiters_;
  std::vector<caf::response_promise> cancellers_;
};

} // namespace troupe::detail
