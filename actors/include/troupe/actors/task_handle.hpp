#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include <caf/actor.hpp>

#include "troupe/actors/detail/access.hpp"
#include "troupe/messages/outcome.hpp"

namespace troupe {

namespace detail {

/// What a job's handle names besides its task: its lane and its cause.
struct job_label {
  std::string lane;
  std::optional<std::string> cause;
};

/// Where a child task (of a task, or a job) leaves its outcome, shared by the handle and
/// the child: an await of the handle never sends a message. The await registers itself
/// (`wait`); the child, when it ends, writes `box`, turns the state `ready` and, if an await
/// was registered, wakes it with one `(await_done, seq)` message; then its actor exits. An
/// await that comes after the end takes the outcome at once. Taken once, by the await that
/// holds the handle's `awaited` flag; an abandoned await withdraws (`unwait`) and leaves the
/// outcome for the next one.
struct result_cell {
  static constexpr uint8_t empty = 0;
  static constexpr uint8_t waiting = 1;
  static constexpr uint8_t ready = 2;
  std::atomic<uint8_t> state{empty};
  bool taken = false; // by the awaiter only
  /// A scope's child with a handle: its await state (task_actor.hpp, await_open), here in
  /// what was padding rather than in an allocation of its own.
  std::atomic<uint8_t> scope_await{0};
  outcome_box box;    // written by the child before `ready`
  /// The registered await: written only while the state is `empty`, before it turns
  /// `waiting`; read by the child only after its exchange found `waiting`.
  caf::actor_addr waiter;
  uint64_t waiter_seq = 0;

  /// Returns whether the outcome is here and not taken yet (the reader holds `awaited`).
  [[nodiscard]] bool available() const noexcept {
    return !taken && state.load(std::memory_order_acquire) == ready;
  }
  /// Returns whether the child has ended (its outcome is here, or was taken).
  [[nodiscard]] bool ended() const noexcept {
    return state.load(std::memory_order_acquire) == ready;
  }
  /// Takes the published outcome (call only when `available()`).
  outcome_box take() noexcept {
    taken = true;
    return std::move(box);
  }
  /// Registers the await `seq` of `who`; returns false when the outcome came first.
  bool wait(caf::actor_addr who, uint64_t seq) noexcept {
    waiter = std::move(who);
    waiter_seq = seq;
    uint8_t e = empty;
    return state.compare_exchange_strong(e, waiting, std::memory_order_acq_rel);
  }
  /// Withdraws a registration (the await was abandoned); the outcome, if it came
  /// meanwhile, stays for the next await.
  void unwait() noexcept {
    uint8_t w = waiting;
    state.compare_exchange_strong(w, empty, std::memory_order_acq_rel);
  }
  /// The child's end: publishes `x`; returns whether an await is registered (to wake).
  bool publish(outcome_box x) noexcept {
    box = std::move(x);
    return state.exchange(ready, std::memory_order_acq_rel) == waiting;
  }
};

/// Shared by all copies of one handle.
struct job_ticket;

struct handle_state {
  handle_state(caf::actor a, std::string i, const void* rt)
      : actor(std::move(a)), id(std::move(i)), runtime(rt) {}
  handle_state(const handle_state&) = delete;
  handle_state& operator=(const handle_state&) = delete;
  ~handle_state() {
    if (owns_label) delete label;
  }
  /// The task actor; empty for a job submitted as a ticket (see `ticket`).
  caf::actor actor;
  std::string id;
  const void* runtime;
  /// Set by the first await: the result is handed out once.
  std::atomic<bool> awaited{false};
  /// `label` belongs to this state (a job with a cause, see job_label).
  bool owns_label = false;
  /// A job's lane and cause (null for other tasks): its lane's label, the process's and
  /// never freed, or, with a cause, a label of its own. Here, not in the job's handle: a
  /// caller may keep 100k handles, and the state's block has room for one more pointer.
  const job_label* label = nullptr;
  /// A result that arrived after its await was abandoned (the awaiting task was asked to
  /// stop): the next await takes it. Written before `awaited` is cleared.
  std::unique_ptr<outcome_box> orphan;
  /// Set while the reply of an abandoned await is still on its way to `pending_owner`.
  const void* pending_owner = nullptr;
  /// The park sequence number of an await that waits for that reply.
  uint64_t pending_waiter = 0;
  /// The child's published outcome (children of tasks and jobs; null for other tasks).
  std::shared_ptr<result_cell> cell;
  /// A job submitted from a task: its ticket (its task exists once its lane admits it), and
  /// the key its owner tracks it by.
  std::shared_ptr<job_ticket> ticket;
  uint64_t ticket_key = 0;
  /// The key the owning task tracks this child by.
  [[nodiscard]] uint64_t key() const noexcept { return ticket_key != 0 ? ticket_key : actor.id(); }
};

} // namespace detail

/// Refers to a spawned task whose result is a `T`. Copies share one identity: the result
/// is handed to the first await of any copy; later awaits answer `already_awaited`.
/// A default-constructed handle is empty (`valid()` is false; awaiting it answers
/// `invalid_handle`).
template <class T>
class task_handle {
 public:
  using value_type = T;

  task_handle() noexcept = default;
  explicit task_handle(std::shared_ptr<detail::handle_state> st) noexcept : st_(std::move(st)) {}

  /// Returns whether this handle refers to a task.
  [[nodiscard]] bool valid() const noexcept { return st_ != nullptr; }
  explicit operator bool() const noexcept { return valid(); }

  /// Returns the task's id ("1.4.2": root 1, its 4th child, that one's 2nd child).
  [[nodiscard]] const std::string& id() const noexcept {
    static const std::string none;
    return st_ ? st_->id : none;
  }

  /// Returns the task actor (for monitoring or linking from plain CAF code). Empty for a
  /// job submitted from a task: its task is spawned only when its lane admits it (a queued
  /// job is a record, not an actor); await or cancel it through the handle.
  [[nodiscard]] const caf::actor& actor() const noexcept {
    static const caf::actor none;
    return st_ ? st_->actor : none;
  }

  /// Returns the shared state (for troupe's own awaiters).

 private:
  friend struct detail::access;
  std::shared_ptr<detail::handle_state> st_;
};

} // namespace troupe
