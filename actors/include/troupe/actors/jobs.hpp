#pragma once

// Jobs on declared lanes: finite work whose caller awaits one typed outcome.
//
// A job is a value: its fields are its inputs, and it has
//
//     task<caf::expected<Outcome>> attempt(troupe::attempt_scope& s);
//
// optionally a `static constexpr std::string_view lane` (else the default lane), a
// `static job_policy policy()` (else one attempt) and a `static constexpr std::string_view
// job_name` (its task's name; else "job"). Each attempt is admitted by its lane (an
// actor: FIFO, serial / concurrent(n) / unbounded) and runs as part of the job's task;
// retries are sequential, so the job value is borrowed mutably by one attempt at a time (a
// cursor or an endpoint list may adapt between attempts without locks).

#include <any>
#include <coroutine>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "troupe/actors/context.hpp"
#include "troupe/actors/sync.hpp"
#include "troupe/messages/lanes.hpp"

namespace troupe {

class attempt_scope;

namespace detail {

/// Returns the label of lane `name` without a cause: one per lane name for the process,
/// made at the first call and never freed (a handle may outlive its runtime), so that the
/// states of jobs without a cause share it.
const job_label& lane_label(std::string_view name);

/// Labels a job's fresh handle state (not shared yet) with a label of its own.
inline void set_label(handle_state& st, std::string lane, std::optional<std::string> cause) {
  st.label = new job_label{std::move(lane), std::move(cause)};
  st.owns_label = true;
}

/// Labels a job's fresh handle state: with `lane`'s own label when there is no cause.
inline void set_label(handle_state& st, const job_label& lane, const std::optional<std::string>& cause) {
  if (cause)
    set_label(st, lane.lane, cause);
  else
    st.label = &lane;
}

/// The lanes of one runtime, frozen at boot: each a gate actor of the lane's width.
class lane_catalog {
 public:
  struct entry {
    lane_decl decl;
    caf::actor actor;
    /// The lane's label without a cause (lane_label).
    const job_label* label = nullptr;
  };
  explicit lane_catalog(std::vector<entry> xs) : entries_(std::move(xs)) {}
  /// Returns the lane named `name`, or null.
  [[nodiscard]] const entry* find(std::string_view name) const noexcept {
    for (auto& e : entries_)
      if (e.decl.name == name) return &e;
    return nullptr;
  }
  /// Returns the default lane.
  [[nodiscard]] const entry& default_lane() const noexcept {
    for (auto& e : entries_)
      if (e.decl.is_default) return e;
    return entries_.front();
  }
  [[nodiscard]] const std::vector<entry>& entries() const noexcept { return entries_; }

 private:
  std::vector<entry> entries_;
};

/// Validates `lanes` (adding `default` when empty) and spawns one lane actor per entry.
caf::expected<std::shared_ptr<const lane_catalog>>
open_lanes(caf::actor_system& sys, troupe::clock* clock, std::vector<lane_decl> lanes);

template <class T>
struct expected_value;
template <class T>
struct expected_value<task<caf::expected<T>>> {
  using type = T;
};

template <class J>
concept has_lane = requires { std::string_view{J::lane}; } &&
                   !std::is_member_pointer_v<decltype(&J::lane)>;
template <class J>
concept has_policy = requires { { J::policy() } -> std::convertible_to<job_policy>; };
template <class J>
concept has_job_name = requires { std::string_view{J::job_name}; } &&
                       !std::is_member_pointer_v<decltype(&J::job_name)>;

} // namespace detail

/// A job: a value with `attempt(attempt_scope&) -> task<caf::expected<Outcome>>`.
template <class J>
concept job = std::is_move_constructible_v<J> && requires(J& j, attempt_scope& s) {
  typename detail::expected_value<decltype(j.attempt(s))>::type;
};

/// The outcome type of job `J`.
template <class J>
using job_outcome_t = typename detail::expected_value<
    decltype(std::declval<J&>().attempt(std::declval<attempt_scope&>()))>::type;

/// One submission of a job: its lane, its policy and its cause, each defaulting to what the
/// job declares. `submission{my_job}.under(p).caused_by("order-7")`.
template <job J>
struct submission {
  J job;
  std::optional<std::string> lane;
  std::optional<job_policy> policy;
  std::optional<std::string> cause;

  explicit submission(J j) : job(std::move(j)) {}
  /// Runs this submission on `name` instead of the job's declared lane.
  submission on(std::string name) && {
    lane = std::move(name);
    return std::move(*this);
  }
  /// Replaces the whole policy for this submission (validated at submit).
  submission under(job_policy p) && {
    policy = p;
    return std::move(*this);
  }
  /// Names the cause of this job (re-roots the cause its children inherit).
  submission caused_by(std::string id) && {
    cause = std::move(id);
    return std::move(*this);
  }
};

template <class J>
submission(J) -> submission<J>;

namespace detail {

template <class T>
struct is_submission : std::false_type {};
template <class J>
struct is_submission<submission<J>> : std::true_type {};

template <class J>
struct submission_job {
  using type = J;
};
template <class J>
struct submission_job<submission<J>> {
  using type = J;
};

template <class J>
submission<typename submission_job<J>::type> as_submission(J j) {
  if constexpr (is_submission<J>::value)
    return j;
  else
    return submission<J>{std::move(j)};
}

} // namespace detail

/// Refers to a submitted job whose outcome is an `O`: a task handle (await it, cancel it
/// with the task calls), plus the job's lane and cause. Awaiting yields the outcome, or
/// the job's own last error (unwrapped), `timed_out` (the last attempt ran past its
/// timeout), `cancelled`, or the submission's refusal (`self_lane`, `unknown_lane`,
/// `undeclarable_pacing` from `attempt_scope::submit`).
template <class O>
class job_handle : public task_handle<O> {
 public:
  job_handle() = default;
  /// Internal: `h`'s state is labelled already (detail::set_label). A job handle is a task
  /// handle and nothing more (16 bytes): its lane and cause live in the shared state.
  explicit job_handle(task_handle<O> h) noexcept : task_handle<O>(std::move(h)) {}
  /// Returns the lane the job runs on.
  [[nodiscard]] const std::string& lane() const noexcept {
    static const std::string none;
    auto* l = label();
    return l != nullptr ? l->lane : none;
  }
  /// Returns the job's cause, if it has one.
  [[nodiscard]] const std::optional<std::string>& cause() const noexcept {
    static const std::optional<std::string> none;
    auto* l = label();
    return l != nullptr ? l->cause : none;
  }

 private:
  [[nodiscard]] const detail::job_label* label() const noexcept {
    auto& st = detail::access::state(*this);
    return st ? st->label : nullptr;
  }
};

namespace detail {

/// What one job's task holds: the job value (borrowed by one attempt at a time) and the
/// resolved submission.
template <class J>
struct job_state {
  J job;
  const lane_catalog::entry* lane = nullptr;
  job_policy policy;
  std::optional<std::string> cause;
};

/// The name of job `J`'s task: `J::job_name`, else "job".
template <class J>
constexpr std::string_view job_name_of() noexcept {
  if constexpr (has_job_name<J>)
    return J::job_name;
  else
    return "job";
}

/// Resolves the lane and checks the policy of a submission.
template <class J>
caf::expected<std::shared_ptr<job_state<J>>> prepare_job(task_env& env, submission<J> s) {
  if (!env.lanes)
    return make_error(errc::unknown_lane, "lane", "this runtime has no lane catalog");
  const lane_catalog::entry* lane = nullptr;
  std::optional<std::string> name = std::move(s.lane);
  if constexpr (has_lane<J>)
    if (!name) name = std::string{J::lane};
  if (name) {
    lane = env.lanes->find(*name);
    if (lane == nullptr)
      return make_error(errc::unknown_lane, "lane",
                        "no lane \"" + *name + "\" is declared (lanes are frozen at boot)");
  } else {
    lane = &env.lanes->default_lane();
  }
  job_policy p;
  if constexpr (has_policy<J>) p = J::policy();
  if (s.policy) p = *s.policy;
  if (auto err = validate(p)) return err;
  return recycler::make_shared<job_state<J>>(job_state<J>{std::move(s.job), lane, p, std::move(s.cause)});
}

/// A body that fails with `err` (the handle of a refused submission answers it).
template <class O>
task<O> fail_with(caf::error err) {
  co_await std::suspend_never{}; // a coroutine: the throw below becomes the task's failure
  throw task_error{std::move(err)};
}

template <class J>
task<job_outcome_t<J>> drive_job(context& cx, std::shared_ptr<job_state<J>> st);

} // namespace detail

/// What an attempt sees: its job's identity and cause, the runtime clock, the resources
/// declared at boot, and child jobs it owns. Any exit of the attempt (return, error,
/// deadline, outside cancel) cancels and drains every child before the attempt ends; the
/// next attempt is admitted only after that.
class attempt_scope {
 public:
  attempt_scope(context& cx, std::string job_id, uint32_t index, const detail::lane_catalog::entry& lane,
                std::optional<std::string> cause) noexcept
      : cx_(cx), job_id_(std::move(job_id)), index_(index), lane_(lane), cause_(std::move(cause)) {}
  attempt_scope(const attempt_scope&) = delete;
  attempt_scope& operator=(const attempt_scope&) = delete;

  /// Returns the task context the attempt runs in (spawn, sleep, request, combinators).
  [[nodiscard]] context& cx() const noexcept { return cx_; }
  /// Returns the job's id (its task id).
  [[nodiscard]] const std::string& job_id() const noexcept { return job_id_; }
  /// Returns which attempt this is: 0 for the first.
  [[nodiscard]] uint32_t attempt() const noexcept { return index_; }
  /// Returns the lane the attempt runs on.
  [[nodiscard]] const std::string& lane() const noexcept { return lane_.decl.name; }
  /// Returns the job's cause (what its children inherit), if any.
  [[nodiscard]] const std::optional<std::string>& cause() const noexcept { return cause_; }
  /// Returns the runtime clock's time.
  [[nodiscard]] clock::time_point now() const noexcept { return cx_.now(); }
  /// Returns whether the job was asked to stop.
  [[nodiscard]] bool is_cancelled() const noexcept { return cx_.is_cancelled(); }

  /// Borrows the resources value declared at boot (read-only): `not_found` when none was
  /// declared, `wrong_type` when it is not an `R`.
  template <class R>
  [[nodiscard]] caf::expected<const R*> resources() const {
    auto& env = detail::access::impl(cx_)->env();
    if (!env.resources || !env.resources->has_value())
      return make_error(errc::not_found, "resources", "no resources were declared at boot");
    if (auto* p = std::any_cast<R>(env.resources.get())) return p;
    return make_error(errc::wrong_type, "resources",
                      std::string{"the resources are a "} + env.resources->type().name() +
                          ", not a " + typeid(R).name());
  }

  /// Submits a child job owned by this attempt. Its cause is the one named, else this
  /// job's cause, else this job's id. A child on this attempt's own serial lane is refused
  /// at once (`self_lane`); on another serial lane it queues; on the same concurrent lane it
  /// is admitted or queues; on the default lane it starts at once. A refused submission's
  /// handle answers the error when awaited; nobody awaiting it fails the attempt at close.
  template <class J>
  [[nodiscard]] auto submit(J child) {
    if constexpr (detail::is_submission<J>::value)
      return submit_impl(std::move(child));
    else
      return submit_impl(submission<J>{std::move(child)});
  }

  /// Internal: cancels and drains every child; returns the error of a refused submission
  /// nobody awaited (the attempt fails with it), if any.
  task<caf::error> close();
  /// Internal: nothing was submitted (most attempts): closing has nothing to cancel, drain
  /// or report, so the attempt skips it (no coroutine of its own).
  [[nodiscard]] bool idle() const noexcept { return children_.empty() && refused_.empty(); }

 private:
  template <class J>
  job_handle<job_outcome_t<J>> submit_impl(submission<J> s);

  context& cx_;
  std::string job_id_;
  uint32_t index_;
  const detail::lane_catalog::entry& lane_;
  std::optional<std::string> cause_;
  std::vector<std::shared_ptr<detail::handle_state>> children_;
  std::vector<std::pair<std::shared_ptr<detail::handle_state>, caf::error>> refused_;
};

namespace detail {

/// Asks the job's lane to queue a wait for `job` now, in submission order: claimed by the
/// job's first acquire, or (`start`) sent to the job's task as its start with the permit.
inline void reserve_lane(const lane_catalog::entry& lane, const caf::actor& job, bool start) {
  caf::anon_send(lane.actor, atoms::sy_reserve_atom::value,
                 caf::actor_cast<caf::actor_addr>(job), start);
}

/// Submits a job from `cx`'s task. Without a deadline and not detached: as a ticket (a
/// record on its lane; its task is spawned at admission, see job_ticket). Otherwise:
/// spawns the task of the job, idle, and reserves its place on the lane now,
/// so the lane admits jobs in submission order (also across tasks the submitter causes to
/// submit later) whatever threads their tasks run on. The task starts when its spawner's
/// body next suspends (as `cx.spawn` children do, so a cancel sent before comes first) and,
/// without a deadline, once the lane's grant has come too: the grant carries the first
/// permit, so admission needs no acquire. Under a deadline (which must bound the wait), the
/// task starts when the spawner suspends and claims the reservation with an acquire.
template <class J>
task_handle<job_outcome_t<J>> spawn_job_task(context& cx, std::shared_ptr<job_state<J>> st,
                                             bool detached) {
  using O = job_outcome_t<J>;
  auto* self = access::impl(cx);
  auto name = std::string{job_name_of<J>()};
  auto* lane = st->lane;
  std::string id;
  // The job state moves into the body (a copy is a locked increment, and a decrement later).
  if (!detached && !self->deadline()) {
    // A ticket: a record in the lane's queue, its task spawned at admission.
    auto cell = recycler::make_shared<result_cell>();
    auto t = self->spawn_ticket(
        make_runner([st = std::move(st)](context& c) -> task<O> { return drive_job<J>(c, st); }),
        {.name = std::move(name)}, lane->actor, cell, &id);
    auto hs = recycler::make_shared<handle_state>(caf::actor{}, std::move(id), &self->env());
    hs->cell = std::move(cell);
    hs->ticket_key = t->key;
    hs->ticket = std::move(t);
    return task_handle<O>{std::move(hs)};
  }
  spawn_extras extras;
  extras.deferred_start = true;
  bool lane_starts = !self->deadline().has_value();
  extras.lane_starts = lane_starts;
  if (lane_starts) extras.lane = &lane->actor;
  auto cell = recycler::make_shared<result_cell>();
  extras.cell = cell;
  auto a = self->spawn_special(
      make_runner([st = std::move(st)](context& c) -> task<O> { return drive_job<J>(c, st); }),
      {.name = std::move(name), .detached = detached}, extras, &id);
  reserve_lane(*lane, a, lane_starts);
  auto hs = recycler::make_shared<handle_state>(std::move(a), std::move(id), &self->env());
  hs->cell = std::move(cell);
  return task_handle<O>{std::move(hs)};
}

/// Spawns the job's task from `cx` (owned by it unless `detached`).
template <class J>
caf::expected<job_handle<job_outcome_t<J>>> spawn_job(context& cx, submission<J> s, bool detached,
                                                     std::optional<std::string> inherited) {
  using O = job_outcome_t<J>;
  auto& env = access::impl(cx)->env();
  if (!s.cause) s.cause = std::move(inherited);
  auto st = prepare_job(env, std::move(s));
  if (!st) return std::move(st.error());
  auto& lane = *(*st)->lane->label;
  auto cause = (*st)->cause; // the job keeps its own (its attempts read it)
  auto h = spawn_job_task<J>(cx, std::move(*st), detached);
  set_label(*access::state(h), lane, cause);
  return job_handle<O>{std::move(h)};
}

} // namespace detail

/// Submits a job (or a `submission`) owned by the calling task: when the task ends, a job
/// it did not await is cancelled. Yields the handle, or `unknown_lane` /
/// `undeclarable_pacing` at once. A job submitted so carries no cause unless named.
template <class J>
[[nodiscard]] auto submit(context& cx, J job) {
  using JJ = typename detail::submission_job<J>::type;
  return detail::spawn_job<JJ>(cx, detail::as_submission(std::move(job)), false, std::nullopt);
}

/// Submits a job owned by the runtime (not by the calling task or attempt); it carries no
/// cause unless named.
template <class J>
[[nodiscard]] auto submit_detached(context& cx, J job) {
  using JJ = typename detail::submission_job<J>::type;
  return detail::spawn_job<JJ>(cx, detail::as_submission(std::move(job)), true, std::nullopt);
}

/// Yields the metrics of lane `name` (`unknown_lane` when undeclared).
[[nodiscard]] task<caf::expected<lane_metrics>> lane_metrics_of(context& cx, std::string name);

/// Yields the metrics of every lane, in declaration order.
[[nodiscard]] task<caf::expected<std::vector<lane_metrics>>> lane_metrics_of(context& cx);

// -- implementation ------------------------------------------------------------------------

template <class J>
job_handle<job_outcome_t<J>> attempt_scope::submit_impl(submission<J> s) {
  using O = job_outcome_t<J>;
  auto& env = detail::access::impl(cx_)->env();
  if (!s.cause) s.cause = cause_ ? *cause_ : job_id_;
  // A refused child's handle still names the lane it asked for and the cause it carries
  // (read here: prepare_job takes the submission).
  std::string asked_lane = s.lane ? *s.lane : std::string{};
  if constexpr (detail::has_lane<J>)
    if (asked_lane.empty()) asked_lane = std::string{J::lane};
  if (asked_lane.empty() && env.lanes) asked_lane = env.lanes->default_lane().decl.name;
  auto asked_cause = s.cause;
  auto refuse = [&](caf::error err) {
    auto h = cx_.spawn([err](context&) -> task<O> { return detail::fail_with<O>(err); },
                       {.name = "job.refused"});
    refused_.emplace_back(detail::access::state(h), std::move(err));
    detail::set_label(*detail::access::state(h), std::move(asked_lane), std::move(asked_cause));
    return job_handle<O>{std::move(h)};
  };
  auto st = detail::prepare_job(env, std::move(s));
  if (!st) return refuse(std::move(st.error()));
  auto* lane = (*st)->lane;
  if (lane->decl.kind == lane_kind::serial && lane->decl.name == lane_.decl.name)
    return refuse(make_error(errc::self_lane, "lane",
                             "a child of job " + job_id_ + " on its own serial lane \"" +
                                 lane->decl.name + "\" could only run after its parent"));
  auto cause = (*st)->cause; // the job keeps its own (its attempts read it)
  auto h = detail::spawn_job_task<J>(cx_, std::move(*st), false);
  detail::set_label(*detail::access::state(h), *lane->label, cause);
  children_.push_back(detail::access::state(h));
  return job_handle<O>{std::move(h)};
}

namespace detail {

/// Runs one attempt of the job in `cx` and closes its scope.
template <class J>
task<caf::expected<job_outcome_t<J>>> run_attempt(context& cx, std::shared_ptr<job_state<J>> st,
                                                  std::string job_id, uint32_t index) {
  using O = job_outcome_t<J>;
  attempt_scope scope{cx, std::move(job_id), index, *st->lane, st->cause};
  // Set on every path that goes on (no placeholder error built per attempt).
  std::optional<caf::expected<O>> r;
  bool cancelled = false;
  try {
    r.emplace(co_await st->job.attempt(scope));
  } catch (const task_cancelled&) {
    cancelled = true;
  } catch (...) {
    r.emplace(error_from_current_exception("attempt"));
  }
  // Every exit closes the scope: its children are cancelled and drained first.
  caf::error refused;
  if (!scope.idle()) refused = co_await scope.close();
  if (cancelled) throw task_cancelled{};
  if (refused && *r) *r = std::move(refused);
  co_return std::move(*r);
}

/// The job's task: admission, attempts, backoff, the outcome.
template <class J>
task<job_outcome_t<J>> drive_job(context& cx, std::shared_ptr<job_state<J>> st) {
  using O = job_outcome_t<J>;
  auto& env = access::impl(cx)->env();
  const auto& id = cx.task_id(); // traces are built only under a simulation
  auto& lane = st->lane->decl;
  // Made at the first acquire: a job whose lane's grant came with its start (most) never
  // needs it, and making it copies the lane's actor handle (a locked step on a line every
  // job on every worker changes).
  std::optional<sync_ref> gate;
  if (env.sim != nullptr) trace_event(env, "job.submitted", id,
              "lane=" + lane.name + (st->cause ? " cause=" + *st->cause : std::string{}));
  for (uint32_t i = 0;; ++i) {
    // The first admission may have come with the start (the lane started this task): the
    // task keeps that grant to its end, or to this attempt's failure (see hold_lane_grant).
    caf::expected<permit> p{permit{}};
    bool held = false;
    if (auto pre = i == 0 ? access::impl(cx)->take_lane_grant() : 0; pre != 0) {
      access::impl(cx)->hold_lane_grant(pre, st->lane->actor);
      held = true;
    } else {
      if (!gate) gate.emplace(st->lane->actor, sync_kind::gate, lane.name, lane.width);
      p = co_await gate->acquire(cx);
    }
    if (!p) {
      if (env.sim != nullptr) trace_event(env, "job.refused", id, render(p.error()));
      throw task_error{std::move(p.error())};
    }
    if (env.sim != nullptr) trace_event(env, "job.attempt", id, std::to_string(i));
    std::optional<caf::expected<O>> r; // set on every path below
    if (fault_fires(env, "job.attempt", id)) {
      r.emplace(make_error(errc::injected_fault, "job.attempt",
                           "simulated failure of attempt " + std::to_string(i) + " of job " + id));
    } else if (st->policy.timeout == job_policy::infinite_timeout) {
      r.emplace(co_await run_attempt<J>(cx, st, id, i));
    } else {
      auto d = co_await cx.deadline(st->policy.timeout,
                                    [st, id, i](context& acx) -> task<caf::expected<O>> {
                                      return run_attempt<J>(acx, st, id, i);
                                    });
      if (d)
        r.emplace(std::move(*d));
      else if (is(d.error(), errc::deadline_exceeded))
        r.emplace(make_error(errc::timed_out, "timeout",
                             "attempt " + std::to_string(i) + " of job " + id +
                                 " ran past its timeout of " +
                                 std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                    st->policy.timeout)
                                                    .count()) +
                                 " ms"));
      else
        r.emplace(std::move(d.error()));
    }
    if (!held)
      p->release();
    else if (!cx.is_cancelled() && !*r && i < st->policy.retries)
      access::impl(cx)->release_held_grant(); // the backoff holds no permit
    // A graceful cancel the attempt absorbed (it caught the cancellation to clean up): the
    // job answers cancelled, with no backoff and no further attempt -- as an attempt under
    // a timeout does (its deadline call ends with the cancel), whatever it returned.
    if (cx.is_cancelled()) throw task_cancelled{};
    if (*r) {
      if (env.sim != nullptr) trace_event(env, "job.succeeded", id, std::to_string(i));
      if constexpr (std::is_void_v<O>)
        co_return;
      else
        co_return std::move(**r);
    }
    auto err = std::move(r->error());
    if (env.sim != nullptr) trace_event(env, "job.attempt_failed", id, std::to_string(i) + " " + render(err));
    if (i >= st->policy.retries) {
      if (env.sim != nullptr) trace_event(env, "job.failed", id, render(err));
      throw task_error{std::move(err)};
    }
    auto delay = backoff_delay(st->policy, i);
    if (env.sim != nullptr) trace_event(env, "job.backoff", id,
                std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(delay).count()) +
                    "us");
    co_await cx.sleep(delay);
  }
}

} // namespace detail

} // namespace troupe
