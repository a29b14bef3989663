#pragma once

#include <limits>

// Internal: include <troupe/actors/context.hpp>, which includes this header.

#include <condition_variable>
#include <atomic>
#include <coroutine>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/actor_control_block.hpp>
#include <caf/actor_storage.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/response_promise.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/actors/detail/actor_slab.hpp"
#include "troupe/actors/detail/queue_slot.hpp"
#include "troupe/actors/detail/recycler.hpp"
#include "troupe/actors/detail/runner.hpp"
#include "troupe/actors/detail/spin_lock.hpp"
#include "troupe/actors/detail/task_env.hpp"
#include "troupe/actors/spawn_options.hpp"
#include "troupe/actors/task_handle.hpp"
#include "troupe/messages/atoms.hpp"
#include "troupe/messages/messaging.hpp"
#include "troupe/messages/outcome.hpp"

namespace troupe::detail {

/// Identity of a task as given at spawn. The parent and root ids are prefixes of `id`
/// ("1.4.2": parent "1.4", root "1"); an empty `group` means the task's own id, an empty
/// `name` means "task".
struct task_info {
  std::string id;
  std::string group;
  std::string name;
};

struct root_slot;

/// A child this task owns.
/// A scope child's await state, shared by the scope and the child: whichever comes first,
/// the scope's await (`await_taken`) or the child's failure (`await_failed`), decides
/// whether that failure is the await's value or the scope's failure.
enum : uint8_t { await_open = 0, await_taken = 1, await_failed = 2 };

struct job_ticket;

struct child_entry {
  /// Its task actor; empty for a job still queued on its lane (see `ticket`).
  caf::actor actor;
  /// Where the child leaves its outcome (children of `cx.spawn` and jobs; else null): a
  /// child whose cell is ready has ended, so the parent's end does not join it again.
  std::shared_ptr<result_cell> cell;
  /// The body began awaiting it: its failure is the await's business, not the scope's.
  bool awaited = false;
  /// A scope's child: see await_open.
  std::shared_ptr<std::atomic<uint8_t>> await_state;
  /// A job submitted as a ticket: its task exists only once its lane admitted it.
  std::shared_ptr<job_ticket> ticket;
};

/// Receives the outcomes of branches (children spawned by a combinator of this task).
class collector_base {
 public:
  virtual void on_report(size_t index, outcome_box&& box) = 0;

 protected:
  ~collector_base() = default;
};

/// How a child relates to its parent beyond ownership (set by combinators and scopes).
struct spawn_extras {
  /// Report the outcome to the parent's collector `collector` as branch `index`.
  bool branch = false;
  uint64_t collector = 0;
  size_t index = 0;
  /// The child is a scope: its own children's failures fail it.
  bool fail_fast = false;
  /// When the (scope) body returns, wait for the children instead of cancelling them.
  bool join_on_return = false;
  /// A deadline for the child (the tighter of this and the parent's applies).
  std::optional<clock::time_point> deadline;
  /// The fail-fast group of a combinator's branches or a scope's children: the first of
  /// them to fail raises it, and the others see it at their next `co_await`, `yield_now`
  /// or `is_cancelled()` as a cancel, without waiting for the parent's message.
  std::shared_ptr<std::atomic<bool>> siblings_failed;
  /// A scope's child: its await state (see await_open).
  std::shared_ptr<std::atomic<uint8_t>> await_state;
  /// The own child of a structured call (a scope's body, a deadline's): the call awaits it
  /// from its spawn on, so in a scope's nursery its failure is the call's value, never the
  /// scope's failure. (Marked awaited only once the call suspended, a child started at
  /// once on another thread could fail first and fail the enclosing scope.)
  bool awaited_from_spawn = false;
  /// A supervised child (`task_child`): the actor exits with the body's outcome as its
  /// exit reason (a failure, or normal), and a `user_shutdown` exit request is a graceful
  /// cancel (the supervisor kills it after its shutdown time).
  bool supervised = false;
  /// Spawned idle (CAF's lazy_init): the body starts when the parent's body suspends (see
  /// start_pending_children), so a cancel sent right after the spawn comes first. Otherwise
  /// the body starts at the task's first activation.
  bool deferred_start = false;
  /// A child with a handle: when it ends before anyone awaits it, it leaves its outcome
  /// here and exits (see result_cell).
  std::shared_ptr<result_cell> cell;
  /// A job's task (with deferred_start), whose place on its lane the spawner reserved
  /// (`sy_reserve` with start): the body starts when both the lane's grant (carrying the
  /// permit) and the spawner's go have come, so no acquire is needed.
  bool lane_starts = false;
  /// That lane's actor: a job task that ends before its attempt ran withdraws from it, so
  /// the lane counts it as withdrawn, not admitted (a grant on its way comes back). Every
  /// lane reference a task or ticket keeps points at the actor in its runtime's lane
  /// catalog (frozen at boot, outliving every task, as the task environment does), not a
  /// copy: a copy is a locked step on the lane's reference count, one line that every job
  /// on every worker changed twice (2% of a two-worker `job_submit`).
  const caf::actor* lane = nullptr;
  /// A job spawned from its ticket: the permit its lane granted (the first admission), and
  /// the key its parent knows it by (its end notices carry that key, not the actor id).
  uint64_t lane_grant = 0;
  uint64_t child_key = 0;
  /// Counted live in the wait census already (a ticket's count, handed to its task).
  bool live_counted = false;
  /// That ticket: its reference to this task is dropped when the task ends, so an ended
  /// job's actor is freed while handles to it live on (weak: no cycle).
  std::weak_ptr<job_ticket> ticket;
};

/// A job queued on its lane before its task exists: submitted from a task (no deadline),
/// it is a record in its lane's queue, not an idle actor. The task is spawned, holding the
/// lane's permit, once both the lane has admitted the ticket and the spawner's body has
/// suspended (so a cancel the spawner sent first wins: as for `cx.spawn` children); whoever
/// comes second spawns it. A cancel before that withdraws the ticket: no task ever exists,
/// the handle's cell answers `cancelled`, and a grant it held goes back unused.
struct job_ticket : std::enable_shared_from_this<job_ticket> {
  // First, next to the control block (56 bytes with it: one or two cache lines): what the
  // lane touches when the ticket arrives (its flags, the state it reads) and the lock. A
  // burst's tickets are cold by then (100k queued at once were written long before), so
  // each line touched is a miss.
  enum state_t : uint8_t { queued, admitted, running, withdrawn };
  spin_lock mtx;
  /// Written under mtx; the lane reads it without (a ticket withdrawn after that read is
  /// found so at its admission, under the lock).
  std::atomic<state_t> state{queued};
  bool go = false; // the spawner's body has suspended since the submission (under mtx)
  // Touched by the lane actor only.
  bool arrived = false;     // its `sy_ticket` batch came (a gone may come before it)
  bool gone_noted = false;  // its `sy_ticket_gone` came while it was still queued
  bool popped_gone = false; // out of the lane's queue: its turn came, or it never queued
  /// A scope's child: its end is reported to `parent` (set at submission).
  bool notify = false;
  uint64_t permit = 0;      // admitted: the grant, until the task takes it (under mtx)
  caf::actor actor;         // running: the task (under mtx)

  // Set at submission; the body, the locals and a scope child's two shared states move
  // into the task at its spawn, the rest stays as it was (read without the lock). Not a
  // whole `spawn_extras` (160 bytes, almost all of it unused here): 100k queued jobs are
  // 100k tickets, and every byte of them is memory first touched at submission.
  std::unique_ptr<runner_base> runner;
  task_env* env = nullptr; // and its actor system, where the task is spawned
  task_info info;
  task_locals locals;
  caf::actor_addr parent;
  /// A scope's child: the scope's fail-fast group and the child's await state.
  std::shared_ptr<std::atomic<bool>> siblings_failed;
  std::shared_ptr<std::atomic<uint8_t>> await_state;
  /// Its key in the spawner's nursery and in its end notices (never an actor id).
  uint64_t key = 0;
  /// Its lane's actor in the runtime's lane catalog (see spawn_extras::lane; no cycle: the
  /// lane's queue holds the ticket).
  const caf::actor* lane = nullptr;
  std::shared_ptr<result_cell> cell;

  /// Returns a fresh key (above every actor id).
  static uint64_t next_key() noexcept;
};

// 240 bytes: with the recycler's control block, one block of its 256-byte class (one more
// byte and a ticket takes a 320-byte block: 100k queued jobs are 100k tickets, and each
// byte of them is memory first touched at the submission).
static_assert(sizeof(job_ticket) <= 240);

/// The spawner's go (its body suspended): spawns the ticket's task if it was admitted.
void ticket_go(const std::shared_ptr<job_ticket>& t);
/// The lane's admission with `permit`: spawns the task if the spawner's go came; false
/// when the ticket was withdrawn (the lane takes the permit back unused).
bool ticket_admit(const std::shared_ptr<job_ticket>& t, uint64_t permit);
/// Stops a ticket: withdraws it when its task does not exist yet (true; its cell answers
/// `err`, its parent gets the end notice, the lane hears of it unless `from_lane`), or
/// puts its task in `a` (false). Already withdrawn: false, `a` empty.
bool ticket_stop(const std::shared_ptr<job_ticket>& t, caf::actor& a, caf::error err,
                 bool from_lane = false);

/// This task's link to a channel or mailbox it used: credits (sends paid in advance, each
/// a one-way message) and values it took in a batch but has not consumed yet.
struct queue_link {
  /// A value taken from the queue, with the sequence number it has there.
  struct held {
    uint64_t seq;
    caf::message m;
  };
  caf::actor queue;
  /// The queue's hand-over slot (a channel or mailbox of this process), or null.
  queue_slot* slot = nullptr;
  /// The park sequence number at this task's last direct hand-over to the queue: one per
  /// activation; further sends of the same run go out together as posts.
  uint64_t last_direct = UINT64_MAX;
  /// `q_send` requests to the queue not answered yet (an abandoned send may still be
  /// accepted): while any is out, a send takes the queue's path, behind it.
  uint32_t sends_out = 0;
  int64_t credits = 0;
  /// A pool link: the next id of the range its credits were granted with.
  uint64_t next_id = 0;
  /// Values taken but not consumed yet, in sequence order.
  std::deque<held> buffered;
  /// Inserts one value in sequence order.
  void hold(uint64_t seq, caf::message m) {
    if (buffered.empty() || buffered.back().seq < seq) {
      buffered.push_back(held{seq, std::move(m)});
    } else {
      auto pos = std::lower_bound(buffered.begin(), buffered.end(), seq,
                                  [](const held& h, uint64_t s) { return h.seq < s; });
      buffered.insert(pos, held{seq, std::move(m)});
    }
  }
  /// Inserts values in sequence order.
  void hold(value_batch& b) {
    for (size_t i = 0; i < b.size(); ++i)
      hold(b.seq_at(i), std::move(b.values[i]));
  }
  /// Moves the held values into a batch.
  value_batch release() {
    value_batch b;
    for (auto& h : buffered)
      b.add(h.seq, std::move(h.m));
    buffered.clear();
    return b;
  }
  /// This task has received from the queue: it may hold a standing grant there.
  bool receiving = false;
  /// The queue asked what this task holds (`q_held`) and was told some: once they are
  /// consumed, the next receive asks again (a `q_recv` tells the queue they are gone)
  /// instead of parking on the standing grant.
  bool report_empty = false;
  /// Values of this queue taken by receives and selects, in all (the queue counts values
  /// handed over and not consumed against its capacity).
  uint64_t consumed = 0;
  /// Values the queue may still hand over under the live receive grant (its `q_recv` seq,
  /// type filter and boundedness): while positive, a receive parks without asking again.
  /// A grant lives while the task receives from this queue; parking on anything else ends
  /// it and gives the held values back (a task never sits on values it is not asking for).
  int64_t grant = 0;
  uint64_t grant_seq = 0;
  size_t grant_type = 0;
  bool grant_bounded = false;
};

/// What only some tasks need (a name, a group, children, cancellation bookkeeping):
/// allocated on first use so that a plain parked task stays small.
struct task_cold {
  // Made on first use by most tasks, freed wherever the task ends: through the recycler.
  static void* operator new(std::size_t n) { return recycler::allocate(n); }
  static void operator delete(void* p, std::size_t n) noexcept { recycler::deallocate(p, n); }

  task_locals locals;
  std::shared_ptr<root_slot> slot;
  std::string group;
  std::string name;
  /// Nodes from troupe's recycler: a task that submits jobs or spawns children makes and
  /// drops one per child, often on another thread than the one that made it.
  std::unordered_map<caf::actor_id, child_entry, std::hash<caf::actor_id>,
                     std::equal_to<caf::actor_id>,
                     recycler::allocator<std::pair<const caf::actor_id, child_entry>>>
      children;
  std::unordered_map<uint64_t, collector_base*> collectors;
  uint64_t next_collector = 0;
  bool fail_fast = false;
  bool join_on_return = false;
  /// A scope: the fail-fast group its children share (made at the first child).
  std::shared_ptr<std::atomic<bool>> children_group;
  /// How the children are joined at the end: join, or wait (draining: a joining scope
  /// counts its children's end notices).
  cancel_mode join_mode = cancel_mode::join();
  std::optional<clock::time_point> deadline;
  std::vector<caf::response_promise> awaiters;
  std::vector<caf::response_promise> cancellers;
  /// Children still to be joined when the body has ended.
  std::vector<caf::actor> to_join;
  /// Joined with a grace (join_mode is `join(ns)`): every child being joined, so a forced
  /// cancel meanwhile reaches those in flight too.
  std::vector<caf::actor> grace_joins;
  clock::timer_id force_timer = 0;
  clock::time_point force_due{};
  uint64_t force_gen = 0;
  uint64_t group_count = 0;
  size_t joining = 0;
  /// Channels and mailboxes this task sent to or received from (by queue actor id).
  std::unordered_map<caf::actor_id, queue_link> links;
  /// The two links used last (a task ping-ponging sends on one queue and receives on
  /// another): found without hashing. Map nodes do not move; `links` is only cleared.
  caf::actor_id recent_ids[2] = {0, 0};
  queue_link* recent[2] = {nullptr, nullptr};
  /// Job tickets submitted during the body's run and not sent to their lane yet, all for
  /// `ticket_lane`, in submission order (see task_actor::flush_tickets).
  std::vector<std::shared_ptr<job_ticket>> tickets;
  caf::actor ticket_lane;
  /// Credited sends not sent yet, all for `post_queue` (see task_actor::post).
  std::vector<caf::message> posts;
  caf::actor post_queue;
  /// `post_queue`'s hand-over slot: counts the post messages on their way to it.
  queue_slot* post_slot = nullptr;
  /// The pending request to an actor on another node: its node going down (the actor's
  /// proxy ends) fails the await with `node_down`, which no answer would ever do.
  caf::actor_addr remote_dest;
  uint64_t remote_seq = 0;
  std::function<void(caf::error)> remote_fail;
  /// Ends of other work this task's end waits for (`task_actor::hold_end`), and whether
  /// the task is done but for them.
  uint32_t end_holds = 0;
  bool end_deferred = false;
  /// A lane-started job: its lane (see spawn_extras::lane), until it withdraws or starts.
  const caf::actor* lane = nullptr;
  /// A job spawned from its ticket (see spawn_extras::ticket), until it ends.
  std::weak_ptr<job_ticket> ticket;
  /// The lane's grant the task holds to its end, and that lane (see hold_lane_grant). Here,
  /// not in the actor: the actor's hot fields keep their places (with 8 more bytes there,
  /// sequential_await ran 0.92x and channel_pingpong 0.93-0.97x of the binary before, paired;
  /// with them here, 1.10x both, in a noisier window).
  uint64_t held_grant = 0;
  const caf::actor* held_lane = nullptr;
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
  /// What the await waits on, for the deadlock census.
  enum class wait_kind : uint8_t { other, channel, tasks };
  wait_kind wait_kind_ = wait_kind::other;
  /// Receives the result of a blocking job (only blocking awaiters use it).
  virtual void on_box(outcome_box&&) {}
  /// The awaited child left its outcome in the handle's cell (`await_done`).
  virtual void on_task_done() {}
  /// Called when the task gives up this await before its answer came (a cancel, the body
  /// being destroyed): tell whoever holds the wait to drop it.
  virtual void on_abandon(task_actor*) noexcept {}
  /// Returns whether this await takes values the queue `id` hands over under an earlier
  /// grant (a standing receive grant answers with the seq of the await that made it).
  virtual bool takes_from(caf::actor_id) const { return false; }
  /// Values a queue handed to this await (`q_values`); only receive awaiters use them.
  virtual void on_values(const caf::actor&, value_batch&) {}
  /// One value a queue handed to this await (`q_value`).
  virtual void on_value(const caf::actor& q, uint64_t seq, caf::message& m) {
    value_batch b;
    b.add(seq, std::move(m));
    on_values(q, b);
  }
  /// One value a queue's sender handed to this await straight from its typed send: element
  /// `pos` of the `q_value` message `x` (a `boxed<T>`). Takes it in place and returns true;
  /// false leaves it there (it then comes as `on_value`, in a message of its own).
  virtual bool on_value_in_place(const caf::actor&, caf::type_erased_tuple&, size_t) {
    return false;
  }
  /// A queue's failure answer to this await (`q_fail`).
  virtual void on_fail(caf::error&) {}
  /// A select case's answer (`q_ready`); only select awaiters use it.
  virtual void on_ready(uint64_t, uint8_t) {}
  /// The await's timer fired; returns whether to resume now (a select taking its value
  /// finishes the take first, so that value is neither lost nor reordered).
  virtual bool on_timeout() { return true; }
  /// A response to a request this await sent with its own request id (see
  /// request_awaiter): takes it and returns true; false when it is not its own.
  virtual bool on_response(caf::mailbox_element&) { return false; }

 protected:
  ~awaiter_base() = default;
};

/// The actor that drives one task body. Protocol (atoms in messages/atoms.hpp):
/// - `(await)` -> `outcome_box` | error: the result, handed out once;
/// - `(cancel, cancel_mode)` -> bool (messages/cancel.hpp): `force`: forced stop (true when
///   this stopped it), answered once the body and its children are gone; `graceful`: a
///   graceful stop, forced after the grace period; `join`: the owner no longer wants the
///   task: stop it if running, discard its result, answer once it and its children are
///   gone (`join(ns)`: asked as a graceful stop of `ns` first, forced after it; a force or
///   a plain join meanwhile forces it and its children); `wait`: answer once it has ended
///   by itself, then release it as `join` does;
/// - `(timer, seq)`, `(force, gen)`, `(blocking, seq, outcome_box)`: internal (await
///   wake-ups, the end of a graceful cancel's grace, blocking jobs' results).
class task_actor final : public caf::event_based_actor {
 public:
  task_actor(caf::actor_config& cfg, std::unique_ptr<runner_base> r, task_env* env, task_info info,
             task_locals locals, std::shared_ptr<root_slot> slot, caf::actor_addr parent,
             spawn_extras extras, bool notify_parent);
  ~task_actor() override;

  caf::behavior make_behavior() override;
  /// CAF's resume, made to honour `yield_now` on real threads: a yield ends the activation
  /// and the task goes to the back of its worker's queue (see yield_awaiter).
  resume_result resume(caf::execution_unit* ctx, size_t max_throughput) override;
  /// CAF's launch without its logger step: CAF 0.17 as Debian builds it swaps the thread's
  /// logged actor id at every launch (twice, each under a process-wide spin lock, with a hash
  /// of the thread id), with nothing logged. In `job_submit` that lock was 4% of the CPU time.
  void launch(caf::execution_unit* eu, bool lazy, bool hide) override;
  const char* name() const override { return "troupe.task"; }
  void on_exit() override;

  // -- used by context and awaiters (always from this actor's own thread) -----------------

  /// Parks `a` as the pending await; returns the sequence number that matches its reply.
  uint64_t park(awaiter_base* a) noexcept {
    flush_posts(); // values sent so far go out before anything this await sends
    if (cold_ && !cold_->links.empty()) end_idle_grants(a);
    parked_ = a;
    count_wait(a->wait_kind_, 1);
    return ++park_seq_;
  }
  /// Returns whether `seq` is the pending await.
  [[nodiscard]] bool is_parked(uint64_t seq) const noexcept {
    return parked_ != nullptr && park_seq_ == seq;
  }
  /// Resumes the pending await, then checks whether the body finished.
  void resume_parked();
  /// The pending await is a `yield_now`: the activation ends after this message.
  void note_yield() noexcept { yield_pending_ = true; }
  /// Records the timer that will resume the pending await (cancelled if the await ends).
  void parked_timer(clock::timer_id id) noexcept { parked_timer_ = id; }

  /// Watches `dest`, an actor on another node, while the await `seq` waits for its answer:
  /// if it ends first (its node went down, the connection broke), `fail` gets `node_down`.
  void watch_remote(const caf::actor_addr& dest, uint64_t seq, std::function<void(caf::error)> fail);
  /// Ends the watch of the await `seq` (its answer came).
  void unwatch_remote(uint64_t seq) noexcept {
    if (cold_ && cold_->remote_seq == seq && cold_->remote_dest) end_remote_watch();
  }
  void end_remote_watch() noexcept;

  [[nodiscard]] bool cancel_requested() noexcept {
    // The flag only answers: the cancel message that follows still does what it does (a
    // graceful one makes the next await throw, even when this poll saw it first).
    if (cancel_requested_ || cancel_flag_.load(std::memory_order_acquire)) return true;
    return sibling_failed_now();
  }
  /// A sibling of this task's fail-fast group failed: from now on this task is being
  /// cancelled (its parent's cancel follows). True once, when first seen.
  /// This task failed (not a cancel): stop its fail-fast siblings, unless a scope's body
  /// is awaiting it already. Idempotent.
  void raise_group() noexcept;
  /// Marks the task actor `a` as asked to stop (any `mode` but `wait`) before the
  /// cancel message reaches it, so that a body polling `is_cancelled()` in a loop that never
  /// suspends sees it at once; then sends `(cancel_atom, mode)`. Not a task actor: only
  /// the message.
  static void send_cancel(const caf::actor& a, cancel_mode mode) noexcept;
  static void flag_cancel(const caf::actor& a, cancel_mode mode) noexcept;
  /// A sibling of this task's fail-fast group has failed (seen or not).
  [[nodiscard]] bool sibling_failed() const noexcept {
    return siblings_failed_ && siblings_failed_->load(std::memory_order_acquire);
  }
  [[nodiscard]] bool sibling_failed_now() noexcept {
    if (!siblings_failed_ || cancel_requested_ ||
        !siblings_failed_->load(std::memory_order_acquire))
      return false;
    cancel_requested_ = true;
    return true;
  }
  /// Returns true once after a graceful cancel: the await that observes it throws
  /// `task_cancelled`; later awaits work again so that cleanup can await.
  /// Not while a structured call is open (see structured_call): the call's children got the
  /// cancel, and the call ends once they have; the signal waits for the call's end.
  /// (Nor a sibling's failure: the parent's forced cancel follows, and the frame stays until
  /// the call's children have ended.)
  [[nodiscard]] bool take_cancel_signal() noexcept {
    if (structured_depth_ > 0) return false;
    if (std::exchange(cancel_signal_, false)) return true;
    return sibling_failed_now();
  }
  /// A graceful cancel came and no await has observed it yet (inside a structured call: it
  /// waits for the call's end, and the call starts no new child meanwhile).
  [[nodiscard]] bool cancel_signal_pending() const noexcept { return cancel_signal_; }
  /// How this task stops its children now: forced (`join` when `joining`), or, under a
  /// bounded graceful cancel not forced yet, gracefully with what is left of its grace.
  [[nodiscard]] cancel_mode children_stop_mode(bool joining) const noexcept;
  /// A structured call opens (its children are the call's: none outlives it) and closes.
  void open_structured() noexcept { ++structured_depth_; }
  void close_structured() noexcept { --structured_depth_; }
  /// After a graceful cancel: the grace left before it is forced, in nanoseconds
  /// (`cancel_mode::unbounded` when none forces it); else nothing (not cancelled, or
  /// forced).
  [[nodiscard]] std::optional<int64_t> grace_left() const noexcept;
  [[nodiscard]] task_env& env() const noexcept { return *env_; }
  [[nodiscard]] const std::string& task_id() const noexcept { return id_; }
  [[nodiscard]] std::string_view parent_id() const noexcept;
  [[nodiscard]] std::string_view root_id() const noexcept;
  [[nodiscard]] std::string group_id() const;
  [[nodiscard]] std::string_view task_name() const noexcept;
  [[nodiscard]] troupe::context& ctx() noexcept { return cx_; }
  /// Returns the task-local values (null when there are none).
  [[nodiscard]] const task_locals& locals() const noexcept {
    static const task_locals none;
    return cold_ ? cold_->locals : none;
  }
  /// Replaces the task-local values.
  void locals(task_locals x) { cold().locals = std::move(x); }
  [[nodiscard]] std::string new_group_id() {
    return id_ + "/g" + std::to_string(++cold().group_count);
  }

  /// Spawns a child task and tracks it (unless detached); returns its handle state.
  std::shared_ptr<handle_state> spawn_child(std::unique_ptr<runner_base> r, spawn_options opts);
  /// Spawns an idle root whose lane starts it (a job from outside any task, see
  /// spawn_extras::lane_starts); the caller sends the reservation, then `start_atom`.
  /// `lane` must be the actor of an entry of `env`'s lane catalog: its address is kept (see
  /// spawn_extras::lane), so a temporary is refused and a copy would dangle.
  static std::shared_ptr<handle_state> spawn_root_job(caf::actor_system& sys, task_env* env,
                                                      std::unique_ptr<runner_base> r,
                                                      spawn_options opts, const caf::actor& lane);
  static std::shared_ptr<handle_state> spawn_root_job(caf::actor_system&, task_env*,
                                                      std::unique_ptr<runner_base>, spawn_options,
                                                      caf::actor&&) = delete;
  /// A deferred child's `key_spawner` alone: its spawner started it with no message (see
  /// start_pending_children). A lane-started job's keys: the spawner turns `key_spawner`
  /// when its body suspends (from its own thread), the task turns `key_lane` on its lane's
  /// grant. The spawner turning
  /// the second sends the task a plain `start_atom` (it goes behind any cancel the spawner
  /// sent before). The grant turning the second starts the task at once, unless a cancel
  /// was flagged (`cancel_flag_` is set before the cancel leaves, so before the key turned):
  /// then the task sends itself the start, behind that cancel. A queued job so starts with
  /// no message beyond its grant.
  static constexpr uint8_t key_spawner = 1;
  static constexpr uint8_t key_lane = 2;
  std::atomic<uint8_t> start_keys_{0};
  /// The spawner's key of the job task `a` (see start_keys_).
  static void turn_spawner_key(const caf::actor& a);
  /// Takes the permit the lane's start carried (a job's first admission), or 0.
  uint64_t take_lane_grant() noexcept { return std::exchange(lane_grant_, 0); }
  /// Keeps lane `lane`'s grant `id` (a job's first admission, see drive_job) until the task
  /// ends, however it ends: given back after the outcome is out (complete), so whoever
  /// awaits the job is woken before the lane's next job is spawned, and on this thread when
  /// the lane allows it (release_lane_grant: no message, no turn of the lane). `lane` must
  /// be the actor of a lane catalog entry (its address is kept, see spawn_extras::lane).
  void hold_lane_grant(uint64_t id, const caf::actor& lane);
  void hold_lane_grant(uint64_t, caf::actor&&) = delete;
  /// Gives back the grant hold_lane_grant kept, now (a retry's backoff, the task's end).
  void release_held_grant() noexcept;
  /// Stops tracking a child that has ended and whose outcome was taken (or reported);
  /// counts it down while a joining scope drains. A scope's child that failed first (see
  /// failed_first) stays until its end notice, which fails the scope.
  void forget_child(caf::actor_id id);
  /// A scope's child that failed before its await began (or with none): it raised its
  /// group, and its end notice fails the scope.
  static bool failed_first(const child_entry& e) noexcept;
  /// Some child in the nursery failed first and its end notice has not come yet.
  bool failed_child_pending() const noexcept;
  /// Marks a child whose result the body began to await.
  void mark_awaited(caf::actor_id id) {
    if (cold_)
      if (auto i = cold_->children.find(id); i != cold_->children.end()) {
        i->second.awaited = true;
        if (auto& st = i->second.await_state) {
          uint8_t open = await_open; // lost to a failure first: the scope fails with it
          st->compare_exchange_strong(open, await_taken, std::memory_order_acq_rel);
        }
      }
  }
  /// An await abandoned before the child ended: the child is unawaited again (its end
  /// notice is handled as an unawaited child's).
  void unmark_awaited(caf::actor_id id) {
    if (cold_)
      if (auto i = cold_->children.find(id); i != cold_->children.end()) {
        i->second.awaited = false;
        if (auto& st = i->second.await_state) {
          uint8_t taken = await_taken;
          st->compare_exchange_strong(taken, await_open, std::memory_order_acq_rel);
        }
      }
  }
  /// An await took the child's outcome from its handle's cell: the child leaves the
  /// nursery, unless it failed before the await began (a scope's child that raised its
  /// group): then its end notice, still to come, fails the scope as before.
  void took_child(caf::actor_id id) {
    if (!cold_) return;
    auto i = cold_->children.find(id);
    if (i == cold_->children.end()) return;
    i->second.awaited = true;
    if (auto& st = i->second.await_state) {
      uint8_t open = await_open;
      if (!st->compare_exchange_strong(open, await_taken, std::memory_order_acq_rel) &&
          open == await_failed)
        return;
    }
    forget_child(id);
  }
  /// Key 0 of a report: not a branch outcome but a scope child's end (with its error).
  static constexpr uint64_t child_done_notice = 0;
  /// A scope child's end notice, on the scope's list of ended children (see post_child_done).
  struct done_node {
    done_node* next;
    caf::actor_id child;
    bool raised;
    caf::error err;
  };
  /// Called by a scope child as it ends, on its own thread (the caller holds a strong
  /// reference to this scope): puts its end notice on this scope's list of ended children.
  /// Returns true when the list was empty: the caller then sends `done_atom`, and the scope
  /// takes the whole list when that message comes (drain_child_done). One message per
  /// burst of ends instead of one per child; the notices keep the order in which the
  /// children pushed them.
  bool post_child_done(caf::actor_id child, bool raised, caf::error err);
  /// Sends `done_atom` to `scope` (a child whose post found the list empty). Under troupe's
  /// scheduler the wake-up is scheduled on the worker the scope last ran on, not on this
  /// child's: a scope with many children (its children table, their cells and actors) is
  /// not pulled over to whichever worker ran the child that ended first (see
  /// docs/scheduler.md, "A hub stays home").
  void wake_scope(task_actor* scope, const caf::actor& p);
  /// Records the worker this scope runs on, for its children's wake-ups (wake_scope): when
  /// it starts children and when it takes their end notices.
  void note_home() noexcept {
    auto* eu = context();
    if (eu != nullptr && home_.load(std::memory_order_relaxed) != eu)
      home_.store(eu, std::memory_order_relaxed);
  }
  /// Submits a job's task as a ticket on `lane` (a job without a deadline, owned by this
  /// task): tracked as a child under the ticket's key; returns the ticket. `lane` must be
  /// the actor of a lane catalog entry (its address is kept, see spawn_extras::lane).
  std::shared_ptr<job_ticket> spawn_ticket(std::unique_ptr<runner_base> r, spawn_options opts,
                                           const caf::actor& lane, std::shared_ptr<result_cell> cell,
                                           std::string* id_out);
  std::shared_ptr<job_ticket> spawn_ticket(std::unique_ptr<runner_base>, spawn_options, caf::actor&&,
                                           std::shared_ptr<result_cell>, std::string*) = delete;
  /// Spawns a child with extras (branches, scopes, deadlines); returns its actor.
  caf::actor spawn_special(std::unique_ptr<runner_base> r, spawn_options opts, spawn_extras extras,
                           std::string* id_out = nullptr);
  /// Registers a collector of branch reports; returns its key.
  uint64_t add_collector(collector_base* c) { // keys start at 1 (0: end notices)
    auto& x = cold();
    auto key = ++x.next_collector;
    x.collectors.emplace(key, c);
    return key;
  }
  void remove_collector(uint64_t key) noexcept {
    if (cold_) cold_->collectors.erase(key);
  }
  /// Returns the deadline of this task, if it runs under one.
  [[nodiscard]] std::optional<clock::time_point> deadline() const noexcept {
    return cold_ ? cold_->deadline : std::nullopt;
  }
  /// Sets the deadline this task runs under (a pool worker takes each job's); children
  /// spawned afterwards get it. The caller enforces it.
  void deadline(std::optional<clock::time_point> d) {
    if (d || cold_) cold().deadline = d;
  }
  /// Returns the pending await (valid while `is_parked`).
  [[nodiscard]] awaiter_base* parked() const noexcept { return parked_; }
  /// Returns the pending await's sequence number.
  [[nodiscard]] uint64_t parked_seq() const noexcept { return park_seq_; }

  /// Returns this task's link to `queue`, creating it.
  queue_link& link(const caf::actor& queue) {
    auto& c = cold();
    auto id = queue.id();
    if (auto* l = recent_link(c, id)) return *l;
    auto& l = c.links[id];
    if (!l.queue) {
      l.queue = queue;
      l.slot = find_queue_slot(queue);
    }
    remember_link(c, id, &l);
    return l;
  }
  /// Returns this task's link to the queue of id `id`, or null.
  queue_link* find_link(caf::actor_id id) noexcept {
    if (!cold_) return nullptr;
    if (auto* l = recent_link(*cold_, id)) return l;
    auto i = cold_->links.find(id);
    if (i == cold_->links.end()) return nullptr;
    remember_link(*cold_, id, &i->second);
    return &i->second;
  }
  static queue_link* recent_link(task_cold& c, caf::actor_id id) noexcept {
    if (c.recent_ids[0] == id && c.recent[0] != nullptr) return c.recent[0];
    if (c.recent_ids[1] == id && c.recent[1] != nullptr) {
      std::swap(c.recent_ids[0], c.recent_ids[1]);
      std::swap(c.recent[0], c.recent[1]);
      return c.recent[0];
    }
    return nullptr;
  }
  static void remember_link(task_cold& c, caf::actor_id id, queue_link* l) noexcept {
    c.recent_ids[1] = c.recent_ids[0];
    c.recent[1] = c.recent[0];
    c.recent_ids[0] = id;
    c.recent[0] = l;
  }
  /// Keeps values of the live grant `seq` that arrived while the body was busy; gives any
  /// other values back to the queue.
  void stash(const caf::actor& queue, uint64_t seq, value_batch& vs);
  /// Ends the receive grants that `next` (the await about to park) does not use and gives
  /// their held values back.
  void end_idle_grants(awaiter_base* next) noexcept;
  /// Keeps this actor alive until a matching `unhold()` (a select's take in flight).
  void hold() noexcept { ++pending_releases_; }
  void unhold() {
    if (--pending_releases_ == 0 && quit_deferred_) quit(exit_reason_);
  }
  /// Returns the task whose body runs on this thread now, or null.
  static task_actor* current() noexcept;

  /// Holds this task's end (its outcome reported, its cancellers answered, its parent told)
  /// until a matching `release_end()`: work it started elsewhere (a remote run it stopped
  /// awaiting) is being cancelled, and structured concurrency makes that work's end part of
  /// this task's. Returns false when the task cannot wait (it is exiting, or done): the
  /// caller then cancels without waiting.
  bool hold_end();
  /// Ends a `hold_end()`; the last one completes a task that is done but for its holds.
  void release_end();

  /// Queues a credited send for `queue`: values sent without suspending go out together, in
  /// one message, when the task suspends, spawns, sends to another queue, ends, or has
  /// `post_batch` of them.
  void post(const caf::actor& queue, caf::message value, queue_slot* slot = nullptr) {
    auto& c = cold();
    if (!c.posts.empty() && c.post_queue != queue) flush_posts();
    if (c.posts.empty()) {
      c.post_queue = queue;
      c.post_slot = slot;
    }
    c.posts.push_back(std::move(value));
    if (c.posts.size() >= post_batch) flush_posts();
  }
  /// Sends what this task queued to send: its job tickets (to their lane), then its posts.
  /// Called before anything else leaves the task (a suspension, a spawn, a send to another
  /// queue, a request), so whatever that causes comes after them.
  void flush_posts() noexcept {
    if (!cold_) return;
    if (!cold_->tickets.empty()) flush_tickets();
    flush_posts_only();
  }
  /// Sends the queued job tickets to their lane in one `sy_ticket` message.
  void flush_tickets() noexcept;
  /// Sends the queued posts.
  void flush_posts_only() noexcept {
    if (!cold_ || cold_->posts.empty()) return;
    auto& c = *cold_;
    if (c.post_slot != nullptr) c.post_slot->posts_in_flight.fetch_add(1, std::memory_order_acq_rel);
    if (c.posts.size() == 1) { // as it was built: (q_post, boxed value)
      send(c.post_queue, std::move(c.posts.front()));
      c.posts.clear(); // keeps the capacity
    } else {
      send(c.post_queue, atoms::q_posts_atom::value, std::move(c.posts));
      c.posts = std::vector<caf::message>{};
    }
  }
  /// Returns whether posts for `queue` wait to be sent.
  [[nodiscard]] bool posting_to(const caf::actor& queue) const noexcept {
    return cold_ && !cold_->posts.empty() && cold_->post_queue == queue;
  }
  /// Returns whether the body still runs (values taken now can still be consumed).
  [[nodiscard]] bool body_running() const noexcept { return phase_ == phase::running; }

  /// Spawns a root task (no task owner) in `sys`.
  static std::shared_ptr<handle_state> spawn_root(caf::actor_system& sys, task_env* env,
                                                  std::unique_ptr<runner_base> r,
                                                  spawn_options opts,
                                                  std::shared_ptr<root_slot> slot);

  /// Spawns a supervised task (see `spawn_extras::supervised`) in `sys`; no task owns it.
  static caf::actor spawn_supervised(caf::actor_system& sys, task_env* env,
                                     std::unique_ptr<runner_base> r, std::string name);

 private:
  enum class phase : uint8_t { running, finishing, done };

  void start();
  void after_resume();
  /// Starts the children spawned during the body's last run: an idle one with no message
  /// (scheduled, its spawner key turned), one with messages waiting by `start_atom` behind
  /// them; a lane-started job by turning its spawner key.
  void start_pending_children();
  /// Undoes the census count of a job task waiting for its lane's start.
  void uncount_lane_wait() noexcept;
  /// A lane-started job ending before its body ran: tells its lane (`sy_withdraw` with
  /// seq 0), which takes back the reservation or the grant as a withdrawal. Once.
  void withdraw_from_lane() noexcept;
  void stop_body();
  void finish(outcome_box out);
  void complete();
  void deliver_result(caf::response_promise& rp);
  void request_graceful(int64_t grace_ns);
  void join_next();
  void on_child_done(caf::actor_id child, caf::error err, bool raised);
  /// Handles the protocol beyond `await`; returns false for a message it does not know.
  bool dispatch(caf::message_view& mv);
  void on_cancel(cancel_mode mode);
  void on_timer(uint64_t seq);
  /// The grace period of cancel deadline `gen` is over: forces the stop (when still the
  /// latest deadline and the body runs).
  void on_force_due(uint64_t gen);
  void on_report(uint64_t key, uint64_t index, caf::actor_id child, outcome_box box);
  /// Takes the list of ended children and handles their notices, the oldest first.
  void drain_child_done();
  /// Frees a notice taken from the list.
  static void free_done(done_node* n) noexcept;
  /// Counts a wait of kind `k` in or out of the runtime's wait census.
  void count_wait(awaiter_base::wait_kind k, int64_t delta) noexcept;
  /// Takes the pending await out (counting it out of the census); returns it or null.
  awaiter_base* unpark() noexcept;
  /// Gives the unused credits and unconsumed values back to every queue (the body ended).
  void release_links() noexcept;
  /// Quits, or once the queues have confirmed the release of this task's grants.
  void maybe_quit();
  /// The most joins in flight at once.
  static constexpr size_t join_window = 64;
  task_cold& cold() {
    if (!cold_) cold_ = std::make_unique<task_cold>();
    return *cold_;
  }
  [[nodiscard]] bool has_children() const noexcept { return cold_ && !cold_->children.empty(); }

  std::unique_ptr<runner_base> runner_;
  task_env* env_;
  std::string id_;
  std::unique_ptr<task_cold> cold_;
  /// Where reports and failure notices go (set for branches and children of scopes).
  caf::actor_addr parent_;
  uint32_t collector_ = 0;
  uint32_t index_ = 0;
  troupe::context cx_;

  phase phase_ = phase::running;
  bool cancel_requested_ = false;
  /// Set by whoever sends this task a cancel, before the message (see send_cancel).
  std::atomic<bool> cancel_flag_{false};
  /// Its fail-fast group (spawn_extras::siblings_failed); null for most tasks.
  std::shared_ptr<std::atomic<bool>> siblings_failed_;
  /// A scope's child: its await state (spawn_extras::await_state).
  std::shared_ptr<std::atomic<uint8_t>> await_state_;
  /// Its failure raised its fail-fast group (the scope learns it with the end notice).
  bool raised_group_ = false;
  bool cancel_signal_ = false;
  /// Structured calls (scope, deadline, a combinator, a retry's attempt) this body waits in
  /// (see structured_call): while one is open, a graceful cancel does not end its awaits.
  uint8_t structured_depth_ = 0;
  bool stopped_by_cancel_ = false;
  bool consumed_ = false;
  bool release_on_done_ = false;
  bool branch_ = false;
  bool notify_parent_ = false;
  bool live_counted_ = false;
  bool quit_deferred_ = false;
  bool supervised_ = false;
  bool started_ = false; // the body has been created (see start_pending_children)
  bool exiting_ = false;  // on_exit runs: nothing can be waited for any more
  /// Children spawned while the body runs, started when it suspends (see
  /// start_pending_children).
  struct pending_start {
    caf::actor task;
    bool lane_started;
  };
  std::vector<pending_start> pending_starts_;
  /// Tickets submitted during the body's last run: their go is given when it suspends (and
  /// they are sent to their lane then, if not before: see flush_tickets).
  std::vector<std::shared_ptr<job_ticket>> pending_tickets_;
  /// The key its parent knows it by (a job spawned from a ticket), else 0: the actor id.
  uint64_t child_key_ = 0;
  [[nodiscard]] uint64_t report_key() const noexcept {
    return child_key_ != 0 ? child_key_ : caf::abstract_actor::id();
  }
  /// Stops a child as `mode` asks (a ticket not admitted yet is withdrawn instead).
  void cancel_child(child_entry& e, cancel_mode mode);
  /// A job spawned from its ticket has ended: the ticket lets go of this actor.
  void leave_ticket() noexcept;
  /// A job spawned from its ticket ends before its body took the lane's permit: gives it
  /// back unused.
  void give_back_grant() noexcept;
  /// The reason this actor exits with (a supervised task's outcome).
  caf::error exit_reason_;
  static constexpr size_t post_batch = 128;
  uint16_t pending_releases_ = 0; // (16 bits: keeps the hot members in one line)
  uint32_t child_count_ = 0;
  awaiter_base* parked_ = nullptr;
  uint64_t park_seq_ = 0;
  /// A yield asked the running activation to end (see resume()).
  bool yield_pending_ = false;
  /// Started by its lane (spawn_extras::lane_starts) and its spawner together: the body starts
  /// once both keys have turned. Until the lane's grant, a wait the census counts.
  bool lane_start_ = false;
  bool lane_wait_counted_ = false;
  /// The permit its lane's start carried, until the job's first admission takes it.
  uint64_t lane_grant_ = 0;
  clock::timer_id parked_timer_ = 0;
  /// The end notices of this scope's children not taken yet, the newest first (pushed by the
  /// children, see post_child_done; taken whole by drain_child_done). On a cache line of its
  /// own, the actor's last, away from the hot members: the children's pushes, from other
  /// workers, would otherwise take from the scope's thread the line those sit on at every
  /// push.
  alignas(64) std::atomic<done_node*> done_head_{nullptr};
  /// The worker this scope last ran on when it started children or took their end notices
  /// (note_home; read by the children's end-notice wake-ups: see wake_scope).
  std::atomic<caf::execution_unit*> home_{nullptr};
  // On that last line too, in what would be its padding: written once at the start (the
  // cell) and once at the end (the outcome), so they cost the pushes nothing. Placed
  // before it, they made the actor a cache line longer (1,408 bytes instead of 1,344: the
  // slab's block 1,472 instead of 1,408, for every task).
  outcome_box outcome_;
  /// Where the outcome goes when the task ends unawaited (see spawn_extras::cell), or null.
  std::shared_ptr<result_cell> cell_;
};

} // namespace troupe::detail

// The storage of a task actor comes from the actor slab (actor_slab.hpp). CAF makes every
// actor with `new actor_storage<T>` and frees it with `delete` when its last reference goes.
// This explicit specialisation for the task actor keeps the layout CAF relies on (the control
// block at offset 0, the actor one cache line in: CAF finds one from the other by that
// offset) and adds class-level `operator new` / `operator delete` routed to the slab. It sits
// next to the class so that every translation unit that can spawn a task actor sees it.

namespace caf {

template <>
class actor_storage<troupe::detail::task_actor> {
 public:
  using value_type = troupe::detail::task_actor;

  template <class... Us>
  actor_storage(actor_id x, node_id y, actor_system* sys, Us&&... zs)
      : ctrl(x, y, sys, data_dtor, block_dtor) {
    new (&data) value_type(std::forward<Us>(zs)...);
  }
  ~actor_storage() {} // NOLINT: the actor is destroyed by data_dtor, before the block
  actor_storage(const actor_storage&) = delete;
  actor_storage& operator=(const actor_storage&) = delete;

  static void* operator new(std::size_t n) { return troupe::detail::actor_slab::allocate(n); }
  static void operator delete(void* p, std::size_t n) noexcept {
    troupe::detail::actor_slab::deallocate(p, n);
  }

  actor_control_block ctrl;
  char pad[CAF_CACHE_LINE_SIZE - sizeof(actor_control_block)];
  union {
    value_type data;
  };

 private:
  static void data_dtor(abstract_actor* ptr) {
    ptr->on_destroy();
    static_cast<value_type*>(ptr)->~value_type();
  }
  static void block_dtor(actor_control_block* ptr) {
    delete reinterpret_cast<actor_storage*>(ptr);
  }
};

} // namespace caf

namespace troupe::detail {

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
static_assert(offsetof(caf::actor_storage<task_actor>, ctrl) == 0,
              "CAF finds the storage at its control block");
static_assert(offsetof(caf::actor_storage<task_actor>, data) == CAF_CACHE_LINE_SIZE,
              "CAF finds the actor one cache line after its control block");
static_assert(alignof(caf::actor_storage<task_actor>) <= 64, "the slab's blocks are 64-aligned");
static_assert(sizeof(caf::actor_storage<task_actor>) <= actor_slab::chunk_bytes / 64,
              "a chunk holds many task actors");
#pragma GCC diagnostic pop

} // namespace troupe::detail
