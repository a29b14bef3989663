#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/expected.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/actors/jobs.hpp"
#include "troupe/actors/remote.hpp"
#include "troupe/runtime/clocks.hpp"
#include "troupe/runtime/cluster.hpp"
#include "troupe/runtime/config.hpp"
#include "troupe/runtime/stop.hpp"
#include "troupe/runtime/supervision.hpp"
#include "troupe/supervision/supervisor.hpp"

namespace troupe {

/// Owns one CAF actor system, the clock, the blocking executor, and every task started
/// from outside an actor. Build it with `runtime::builder`; stop it with `stop()` (the
/// destructor does it too).
///
/// ```
/// auto rt = troupe::runtime::builder{}.threads(2).build();   // expected<runtime>
/// auto n = rt->run([](troupe::context& cx) -> troupe::task<int> { co_return 42; });
/// ```
class runtime {
 public:
  class builder;

  runtime(runtime&&) noexcept;
  runtime& operator=(runtime&&) noexcept;
  ~runtime();

  /// Runs `body` as a root task and blocks the calling thread until it ends; returns its
  /// value or error. Call it from outside any actor (main, a test). With virtual time,
  /// the calling thread drives the scheduler and jumps the clock to the next timer
  /// whenever nothing is runnable; if nothing is runnable and no timer is pending while
  /// the body still waits, the body is cancelled and the result is `stalled`.
  template <class F>
  auto run(F&& body, spawn_options opts = {}) {
    auto r = detail::make_runner(std::forward<F>(body));
    using T = typename std::decay_t<decltype(*r)>::value_type;
    auto out = run_root(std::move(r), std::move(opts));
    if (!out) return caf::expected<T>{std::move(out.error())};
    return detail::unbox<T>(std::move(*out));
  }

  /// Starts `body` as a root task owned by the runtime and returns its handle at once.
  template <class F>
  auto spawn(F&& body, spawn_options opts = {}) {
    auto r = detail::make_runner(std::forward<F>(body));
    using T = typename std::decay_t<decltype(*r)>::value_type;
    auto st = spawn_root(std::move(r), std::move(opts));
    if (!st) return caf::expected<task_handle<T>>{std::move(st.error())};
    return caf::expected<task_handle<T>>{task_handle<T>{std::move(*st)}};
  }

  /// Blocks until the task of `h` ends; returns its value or error (see `context::await`).
  template <class T>
  [[nodiscard]] caf::expected<T> await(const task_handle<T>& h) {
    auto r = run([h](context& cx) -> task<caf::expected<T>> { co_return co_await cx.await(h); },
                 {.name = "runtime.await"});
    if (!r) return std::move(r.error());
    return std::move(*r);
  }

  /// Forces the task of `h` to stop (see `context::cancel`); blocks until it has.
  template <class T>
  [[nodiscard]] caf::expected<bool> cancel(const task_handle<T>& h) {
    auto r = run([h](context& cx) -> task<caf::expected<bool>> { co_return co_await cx.cancel(h); },
                 {.name = "runtime.cancel"});
    if (!r) return std::move(r.error());
    return std::move(*r);
  }

  /// Asks the task of `h` to stop, forcing it after `grace` (see `context::cancel_graceful`).
  template <class T>
  [[nodiscard]] caf::expected<bool> cancel_graceful(const task_handle<T>& h, clock::duration grace) {
    auto r = run(
        [h, grace](context& cx) -> task<caf::expected<bool>> {
          co_return co_await cx.cancel_graceful(h, grace);
        },
        {.name = "runtime.cancel"});
    if (!r) return std::move(r.error());
    return std::move(*r);
  }

  // -- jobs and lanes -------------------------------------------------------------------------

  /// Submits a job (or a `submission`) owned by the runtime; returns its handle at once, or
  /// `unknown_lane` / `undeclarable_pacing` / `runtime_stopped`. Await it with `await`,
  /// cancel it with `cancel` (queued: it never runs; running: dropped at its next await).
  template <class J>
  auto submit(J job) {
    using JJ = typename detail::submission_job<J>::type;
    using O = job_outcome_t<JJ>;
    using result = caf::expected<job_handle<O>>;
    if (!impl_) return result{make_error(errc::runtime_stopped, "runtime", "the runtime was moved from")};
    auto st = detail::prepare_job(env(), detail::as_submission(std::move(job)));
    if (!st) return result{std::move(st.error())};
    auto& lane = *(*st)->lane->label;
    auto cause = (*st)->cause; // the job keeps its own (its attempts read it)
    auto name = std::string{detail::job_name_of<JJ>()};
    auto h = spawn_job_root(detail::make_runner([s = *st](context& c) -> task<O> {
                              return detail::drive_job<JJ>(c, s);
                            }),
                            std::move(name), *(*st)->lane);
    if (!h) return result{std::move(h.error())};
    detail::set_label(**h, lane, cause);
    return result{job_handle<O>{task_handle<O>{std::move(*h)}}};
  }

  /// Returns the metrics of lane `name` (`unknown_lane` when undeclared).
  [[nodiscard]] caf::expected<lane_metrics> lane_metrics_of(std::string name);
  /// Returns the metrics of every lane, in declaration order.
  [[nodiscard]] caf::expected<std::vector<lane_metrics>> lane_metrics_of();
  /// Returns the lane catalog declared at boot (with `default` added when none was).
  [[nodiscard]] std::vector<lane_decl> lanes() const;

  // -- supervision --------------------------------------------------------------------------

  /// Validates `spec`, starts its supervisor on this runtime's clock and returns it once its
  /// children have started; a start failure answers `start_failed` naming the child.
  [[nodiscard]] caf::expected<supervisor_ref> supervise(supervisor_spec spec);
  /// Returns the supervisor's state: its status and each child's (the final state once it
  /// has ended).
  [[nodiscard]] caf::expected<supervisor_state> supervisor_state_of(const supervisor_ref& sup);
  /// Returns the supervisor's events so far (started, failed, restarted, ...).
  [[nodiscard]] caf::expected<std::vector<supervisor_event>> supervisor_events(const supervisor_ref& sup);
  /// Blocks until the supervisor's terminal transition (stopped or failed), no polling.
  [[nodiscard]] caf::expected<supervisor_state> supervisor_wait(const supervisor_ref& sup);
  /// Stops the supervisor: its children stop in reverse order, each per its shutdown
  /// policy; after `timeout` what is left is killed. Answers the final state.
  [[nodiscard]] caf::expected<supervisor_state> supervisor_stop(const supervisor_ref& sup,
                                                  std::chrono::milliseconds timeout);
  /// Starts a new child under `sup` (validated like a spec entry; names stay unique).
  [[nodiscard]] caf::expected<child_state> start_child(const supervisor_ref& sup, child_spec child);
  /// Starts a child of a dynamic supervisor's template with `args`; the answer's `name` is
  /// the child's generated id.
  [[nodiscard]] caf::expected<child_state> start_child(const supervisor_ref& sup, caf::message args);
  /// Returns the supervisor's counters (the final ones once it has ended).
  [[nodiscard]] caf::expected<supervisor_metrics> supervisor_metrics_of(const supervisor_ref& sup);
  /// Stops child `name` per its shutdown policy and keeps it stopped (no restart) until
  /// `restart_child`; answers false when it was not running.
  [[nodiscard]] caf::expected<bool> terminate_child(const supervisor_ref& sup, std::string name);
  /// Starts a stopped child again.
  [[nodiscard]] caf::expected<child_state> restart_child(const supervisor_ref& sup, std::string name);
  /// Forgets a child that is not running.
  [[nodiscard]] caf::expected<bool> delete_child(const supervisor_ref& sup, std::string name);
  /// Returns every child with its status.
  [[nodiscard]] caf::expected<std::vector<child_state>> which_children(const supervisor_ref& sup);
  /// Returns OTP's counts: specs, active, supervisors, workers (final once it has ended).
  [[nodiscard]] caf::expected<child_counts> count_children(const supervisor_ref& sup);
  /// Returns the state of a supervisor known only by its actor (a nested one).
  [[nodiscard]] caf::expected<supervisor_state> supervisor_state_of(const caf::actor& sup);

  /// Returns the storage actor of the runtime's database (`storage` in the config), opening
  /// it on first use: `storage_unavailable`, `schema_too_new`, `storage_failed`.
  [[nodiscard]] caf::expected<caf::actor> storage();

  /// Returns this runtime's session id: the scope id `session:` channels resolve to
  /// (random, 16 hex digits, new for every runtime).
  [[nodiscard]] const std::string& session_id() const noexcept;

  // -- cluster (a runtime whose config names `cluster.node`; else `cluster_unavailable`) -----
  /// Returns this node's name (empty when the runtime is not a cluster node).
  [[nodiscard]] const std::string& node_name() const noexcept;
  /// Returns the port the node's directory listens on (0 when not a cluster node).
  [[nodiscard]] uint16_t cluster_port() const noexcept;
  /// Returns every member as this node sees it, this node first.
  [[nodiscard]] caf::expected<std::vector<member_state>> cluster_state();
  /// Blocks until the node has cluster events with `seq > after`, and returns them.
  [[nodiscard]] caf::expected<std::vector<cluster_event>> cluster_next_events(uint64_t after);
  /// Blocks until member `node` has `status` (see `troupe::await_member`).
  [[nodiscard]] caf::expected<member_state>
  await_member(std::string node, member_status status,
               std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  /// Subscribes `who` to this node's cluster events, pushed as they happen (see
  /// `troupe::subscribe_cluster`).
  [[nodiscard]] caf::expected<bool> subscribe_cluster(caf::actor who, bool replay = false);
  /// Ends `who`'s subscription.
  [[nodiscard]] caf::expected<bool> unsubscribe_cluster(caf::actor_addr who);
  /// Joins the node at `host:port` (see `troupe::join_cluster`).
  [[nodiscard]] caf::expected<bool> join_cluster(std::string host, uint16_t port);
  /// Leaves the cluster gracefully (the stop choreography does it by itself).
  [[nodiscard]] caf::expected<bool> leave_cluster();
  /// Registers `actor` under the cluster-wide `name` (see `troupe::register_global`).
  [[nodiscard]] caf::expected<bool> register_global(std::string name, caf::actor actor);
  /// Removes this node's registration of `name`.
  [[nodiscard]] caf::expected<bool> unregister_global(std::string name);
  /// Returns the actor registered under `name` anywhere in the cluster (`unknown_name`).
  [[nodiscard]] caf::expected<caf::actor> whereis(std::string name);
  /// Returns the runtime clock.
  [[nodiscard]] troupe::clock& clock() noexcept;

  /// Returns the virtual clock, or null when the runtime runs on real time.
  [[nodiscard]] virtual_clock* virtual_time() noexcept;

  /// Virtual time only: runs every runnable actor and queued blocking job until idle;
  /// returns the number of events run (0 on real time, and once `stop()` has closed the
  /// runtime). A stop requested from inside the runtime runs here.
  size_t drain();

  /// Virtual time only: advances the clock by `d`, firing what falls due in order and
  /// draining after each; returns the number of timers fired (0 once `stop()` has closed
  /// the runtime). A stop requested from inside the runtime runs here.
  size_t advance(clock::duration d);

  /// Returns the CAF actor system (for spawning plain CAF actors next to tasks). Valid
  /// until `stop()` closes it (step 7): do not call it after `stop()`.
  [[nodiscard]] caf::actor_system& system() noexcept;

  /// Returns the effective configuration.
  [[nodiscard]] const runtime_config& config() const noexcept;

  // -- stop and signals -----------------------------------------------------------------------

  /// Stops the runtime in one fixed order, each step bounded (docs/runtime.md):
  ///   1. cancel queued jobs (every lane refuses and answers its queue `cancelled`);
  ///   2. let running attempts finish within their deadlines (up to `stop_timeout`);
  ///   3. signal and join services: supervisors (children in reverse start order) and
  ///      the runtime's root tasks (up to `stop_timeout`);
  ///   4. signal and await the stop participants (`on_stop`), each within its grace;
  ///   5. drain and flush durability: the channel hub's windows, the storage's group commit;
  ///   6. join: what is left is killed; the registry, the lanes, the clock, the executor stop;
  ///   7. close the actor system.
  /// A step that overruns is named in `notices()` with what still holds it, and stop goes
  /// on. Idempotent; a second caller waits for the first to finish (several at once are
  /// safe). Called from a task's body of this runtime it does not wait, as waiting there
  /// would wait for the caller itself: it starts the stop as `request_stop()` does (the
  /// calling task is then cancelled with the others); from a stop participant, or anything
  /// the stop itself runs, it returns at once (the stop is under way). A `spawn_blocking`
  /// body or a plain CAF actor of this runtime calls `request_stop()` instead. A grace or
  /// `stop_timeout` too long for the clock means no bound, not an overflowed one.
  void stop() noexcept;

  /// Starts `stop()` and returns at once: on another thread (real time), or on the thread
  /// that drives virtual time, at its next `run`, `drain`, `advance`, `run_for` or
  /// `wait_stopped`.
  void request_stop();

  /// Blocks until the runtime has stopped (by `stop`, `request_stop` or a signal). A stop
  /// that ran on the signal or `request_stop` thread leaves step 7 (closing the actor system)
  /// to the next `stop()` or the destructor: CAF's actor system must be closed on a thread
  /// that used it, such as the one that built the runtime.
  void wait_stopped();

  /// Registers a stop participant: step 4 of `stop()` runs `body` as a task and awaits it
  /// for `grace`; past it, it is cancelled and named in `notices()`. Answers
  /// `invalid_argument` for an empty name, a duplicate, an empty body or a negative grace,
  /// `runtime_stopped` once stopping.
  caf::error on_stop(std::string name, stop_body body,
                     clock::duration grace = std::chrono::seconds{5});

  /// Returns what the runtime wants an operator to know (overrun stop steps, handlers).
  [[nodiscard]] std::vector<runtime_notice> notices() const;

  /// Returns the steps the last stop took, in order, each with what it did.
  [[nodiscard]] std::vector<std::string> stop_log() const;

  /// Registers an interrupt handler (installing the OS signal handling of SIGINT, SIGTERM
  /// and SIGHUP if not yet): on a signal, the handlers registered for it run in LIFO order on
  /// a task (never inside the signal handler); the stop choreography follows unless one of
  /// them answered `resume`. With no handler, a signal starts the stop choreography. A second
  /// signal while stopping ends the process at once (exit status 128 + the signal).
  /// Returns the registration's id (for `remove_interrupt`).
  uint64_t on_interrupt(interrupt_handler handler, interrupt_options opts = {});

  /// Unregisters a handler; returns whether it was registered.
  bool remove_interrupt(uint64_t id);

  /// Runs `body` like `run`, with `handler` registered only while it runs.
  template <class F>
  auto with_interrupt(interrupt_handler handler, F&& body, interrupt_options opts = {}) {
    auto id = on_interrupt(std::move(handler), opts);
    auto r = run(std::forward<F>(body));
    remove_interrupt(id);
    return r;
  }

  /// Returns whether a signal (or `interrupt`) has reached this runtime; stays true.
  [[nodiscard]] bool interrupted() const noexcept;

  /// Delivers signal `signo` as if the OS had sent it (handlers, then maybe the stop), on
  /// the calling thread; returns whether the stop choreography ran (false on a runtime
  /// already stopped or stopping). For tests and for embedding troupe in a host that owns
  /// the signals.
  bool interrupt(int signo);

  /// Returns whether `stop()` has run.
  [[nodiscard]] bool stopped() const noexcept;

 private:
  struct impl;
  explicit runtime(std::unique_ptr<impl> p) noexcept;

  [[nodiscard]] caf::expected<outcome_box> run_root(std::unique_ptr<detail::runner_base> r, spawn_options opts);
  caf::expected<std::shared_ptr<detail::handle_state>>
  spawn_root(std::unique_ptr<detail::runner_base> r, spawn_options opts,
             std::shared_ptr<detail::root_slot> slot = nullptr);

  [[nodiscard]] detail::task_env& env() noexcept;

  /// Spawns a job's root task idle, reserves its place on `lane`, then starts it.
  caf::expected<std::shared_ptr<detail::handle_state>>
  spawn_job_root(std::unique_ptr<detail::runner_base> r, std::string name,
                 const detail::lane_catalog::entry& lane);

  friend class simulation;
  std::unique_ptr<impl> impl_;
};

/// Collects settings and builds a runtime; `build()` never throws.
class runtime::builder {
 public:
  /// Scheduler threads (1..256).
  builder& threads(size_t n) {
    threads_ = n;
    return *this;
  }
  /// The scheduling policy.
  builder& scheduler(scheduler_policy p) {
    policy_ = p;
    return *this;
  }
  /// Messages per actor per scheduling round; 0 = unlimited.
  builder& max_throughput(size_t n) {
    max_throughput_ = n;
    return *this;
  }
  /// Threads of the spawn_blocking executor.
  builder& blocking_threads(size_t n) {
    blocking_threads_ = n;
    return *this;
  }
  /// Virtual time: deterministic scheduler and a virtual clock (tests, simulations).
  builder& virtual_time(bool on = true) {
    virtual_time_ = on;
    return *this;
  }
  /// The embedded database path for the persistence layer.
  builder& storage(std::string path) {
    storage_ = std::move(path);
    return *this;
  }
  /// How long `stop()` waits for tasks before killing them.
  builder& stop_timeout(std::chrono::milliseconds d) {
    stop_timeout_ = d;
    return *this;
  }
  /// Installs OS signal handling (SIGINT, SIGTERM, SIGHUP) at build: a signal starts the
  /// stop choreography (or runs the `on_interrupt` handlers). Real time only.
  builder& signals(bool on = true) {
    signals_ = on;
    return *this;
  }
  /// How long a stuck census must last before waits fail with `deadlock`; 0: never.
  builder& deadlock_check(std::chrono::milliseconds d) {
    deadlock_check_ = d;
    return *this;
  }
  /// Declares a lane (the catalog is frozen once built): `lane_decl::serial("db")`,
  /// `lane_decl::concurrent("export", 4)`, `lane_decl::unbounded("fanout")`, and exactly one
  /// `lane_decl::default_lane(name)`. With no lane declared the catalog is `default` alone.
  builder& lane(lane_decl l) {
    lanes_.push_back(std::move(l));
    return *this;
  }
  /// Declares the whole lane catalog at once.
  builder& lanes(std::vector<lane_decl> ls) {
    lanes_ = std::move(ls);
    return *this;
  }
  /// Declares the one resources value attempts borrow read-only (`scope.resources<R>()`).
  template <class R>
  builder& resources(R value) {
    resources_ = std::make_shared<const std::any>(std::move(value));
    return *this;
  }
  /// Registers a payload type of the application for messages between nodes, under `name`
  /// (the same name on every node), as CAF's `add_message_type<T>(name)`: a request to an
  /// actor on another node whose arguments or reply hold a `T` needs it. `T` needs an
  /// `inspect()` overload. troupe's own payloads are registered already.
  template <class T>
  builder& message_type(std::string name) {
    type_adders_.push_back(
        [name](caf::actor_system_config& cfg) { cfg.add_message_type<T>(name); });
    return *this;
  }
  /// Registers a task body other nodes may run by name (`spawn_on`, `remote_child`,
  /// `submit_remote`): `f` is `task<R>(context&, A...)` (no `auto` parameters); its
  /// arguments and result cross nodes, so each is a CAF built-in type or registered with
  /// `message_type` (on every node). Register the same bodies on every node that should run
  /// them. A later registration under the same name replaces the earlier one; an empty
  /// name makes `build()` fail (`invalid_argument`, field `bodies`).
  template <class F>
  builder& body(std::string name, F f) {
    if (!bodies_) bodies_ = std::make_shared<detail::body_registry>();
    else if (bodies_.use_count() > 1) // a copied builder: copy on write
      bodies_ = std::make_shared<detail::body_registry>(*bodies_);
    auto fn = detail::make_remote_body(std::move(f), name);
    bodies_->add(std::move(name), std::move(fn));
    return *this;
  }
  /// Makes the runtime a cluster node (see `cluster_config`); overrides the JSON `cluster`.
  builder& cluster(cluster_config c) {
    cluster_ = std::move(c);
    return *this;
  }
  /// Runs `fn` on a cluster node once its directory exists and before it joins anyone (its
  /// seeds), on the thread calling `build()`, the runtime usable and a node (`node_name()`,
  /// `cluster_port()`, `whereis`): what `fn` registers with `register_global` travels in the
  /// node's join, so a member that sees this node `up` finds those names at once (as it finds
  /// the node's spawner); one registered after `build()` may reach it after `member_up`.
  /// The node has joined nobody yet (`join_cluster` is refused), and its names should be its
  /// own: a registration made here is one "made apart" (cluster.md, Cluster names).
  /// An error returned by `fn` fails `build()` with that error, an exception with
  /// `runtime_start_failed` (field `before_join`); the node then joins nobody and the runtime
  /// stops (a plain CAF actor `fn` spawned is not the runtime's: tie it to `on_stop`). A stop
  /// asked for while hooks run (`stop()` in `fn`, a signal) waits for them to return, then
  /// `build()` fails with `runtime_stopped`. Hooks run in the order given; ignored without
  /// `cluster.node`.
  builder& before_join(std::function<caf::error(runtime&)> fn) {
    before_join_.push_back(std::move(fn));
    return *this;
  }
  /// Reads settings from a JSON file first; explicit builder calls override it.
  builder& config_file(std::string path) {
    config_file_ = std::move(path);
    return *this;
  }
  /// Reads settings from JSON text first; explicit builder calls override it.
  builder& config_json(std::string text) {
    config_json_ = std::move(text);
    return *this;
  }

  /// Returns a started runtime, or a typed error naming the offending field.
  [[nodiscard]] caf::expected<runtime> build() const;

  /// Returns the configuration `build()` would use, or its error.
  [[nodiscard]] caf::expected<runtime_config> resolve() const;

 private:
  std::optional<size_t> threads_;
  std::optional<scheduler_policy> policy_;
  std::optional<size_t> max_throughput_;
  std::optional<size_t> blocking_threads_;
  std::optional<bool> virtual_time_;
  std::optional<std::string> storage_;
  std::optional<std::chrono::milliseconds> stop_timeout_;
  std::optional<std::chrono::milliseconds> deadlock_check_;
  std::optional<cluster_config> cluster_;
  std::vector<std::function<void(caf::actor_system_config&)>> type_adders_;
  std::optional<std::string> config_file_;
  std::optional<std::string> config_json_;
  std::vector<lane_decl> lanes_;
  std::shared_ptr<const std::any> resources_;
  std::shared_ptr<detail::body_registry> bodies_;
  std::vector<std::function<caf::error(runtime&)>> before_join_;
  bool signals_ = false;
};

} // namespace troupe
