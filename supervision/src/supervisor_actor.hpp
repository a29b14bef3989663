#pragma once

// Internal: the supervisor actor, split by concern over supervisor_actor.cpp (behaviour,
// bookkeeping, events and state), supervisor_admin.cpp (start, terminate, restart and
// delete children), supervisor_restarts.cpp (children's ends, the restart rules, timers,
// group restarts) and supervisor_shutdown.cpp (escalation and the stop sequence).

#include "troupe/supervision/supervisor.hpp"

#include <algorithm>
#include <deque>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/response_promise.hpp>
#include "troupe/messages/errc.hpp"
#include "troupe/supervision/restart_budget.hpp"
#include "child_table.hpp"

namespace troupe::detail {

using namespace troupe::atoms;

using namespace troupe::atoms;

/// A duration of 100 years or more never ends (and fits any clock arithmetic).
constexpr int64_t never_ms = int64_t{100} * 366 * 24 * 3600 * 1000;

constexpr int64_t default_worker_shutdown_ms = 5000;

/// Returns whether a child's exit reason is a failure: normal and shutdown exits (OTP's
/// `normal`, `shutdown` and `{shutdown, _}`: user_shutdown, with or without context) are
/// clean ends for every restart mode.
inline bool is_failure(const caf::error& reason) {
  if (!reason) return false;
  return !(reason.category() == caf::atom("exit") &&
           (reason.code() == static_cast<uint8_t>(caf::exit_reason::user_shutdown) ||
            reason.code() == static_cast<uint8_t>(caf::exit_reason::normal)));
}

inline int64_t shutdown_of(const child_spec& c, child_kind kind) {
  if (c.shutdown_ms) return *c.shutdown_ms;
  return kind == child_kind::supervisor ? infinity : default_worker_shutdown_ms;
}

inline child_kind kind_of(const child_spec& c) {
  if (c.kind) return *c.kind;
  return c.start.target<subtree_start>() != nullptr ? child_kind::supervisor : child_kind::worker;
}

/// A supervisor's event log: its most recent `cap` events in a ring whose slots are
/// written in place. An event that replaces an old one reuses that one's strings, so a
/// child failing and restarting over and over allocates nothing for its events.
class event_ring {
public:
  explicit event_ring(size_t cap) : cap_(cap) {}

  [[nodiscard]] size_t size() const noexcept { return slots_.size(); }
  [[nodiscard]] bool empty() const noexcept { return slots_.empty(); }

  /// The i-th event, oldest first.
  [[nodiscard]] const supervisor_event& operator[](size_t i) const {
    return slots_[(head_ + i) % slots_.size()];
  }
  [[nodiscard]] const supervisor_event& back() const { return (*this)[size() - 1]; }

  /// The slot for the next event: a fresh one until the ring is full, then the oldest.
  supervisor_event& next_slot() {
    if (slots_.size() < cap_) return slots_.emplace_back();
    auto& s = slots_[head_];
    head_ = (head_ + 1) % cap_;
    return s;
  }

  /// The events numbered above `seq`, oldest first (numbers grow along the ring).
  [[nodiscard]] std::vector<supervisor_event> after(uint64_t seq) const {
    size_t lo = 0, hi = size();
    while (lo < hi) {
      auto mid = lo + (hi - lo) / 2;
      if ((*this)[mid].seq <= seq)
        lo = mid + 1;
      else
        hi = mid;
    }
    std::vector<supervisor_event> out;
    out.reserve(size() - lo);
    for (auto i = lo; i < size(); ++i)
      out.push_back((*this)[i]);
    return out;
  }

private:
  size_t cap_;
  size_t head_ = 0; // the oldest slot once the ring is full
  std::vector<supervisor_event> slots_;
};

struct child_rec {
  std::shared_ptr<const child_spec> spec; // a template child shares its supervisor's
  std::string name;
  caf::message args; // a template child's start arguments
  caf::actor actor;
  child_budget budget; // its own budget: restarts within spec->window_ms, half-open try
  std::string last_error;
  std::string wait_reason;
  std::vector<caf::response_promise> on_stopped; // terminate_child callers
  int64_t next_restart_ms = -1;
  uint64_t restarts = 0;
  uint64_t gen = 0;      // invalidates stale restart timers
  uint64_t kill_gen = 0; // the kill deadline of the current termination
  bool kill_armed = false; // that deadline is in the supervisor's kill queue, not passed
  troupe::clock::timer_id restart_timer = 0; // its last restart timer (backoff, open circuit)
  uint64_t uid = 0;      // position (start order) and the name of the child in timers
  child_status status = child_status::stopped;
  child_kind kind = child_kind::worker;
  bool terminating = false;
  bool pending = false;       // restart when the group's terminations are done
  bool group_stop = false;    // a group restart stops it when the children after it stopped
  bool retry_pending = false; // a failed restart's retry message is on its way
  bool held = false;          // stopped by terminate_child: no restart until restart_child
  bool templated = false;     // a dynamic supervisor's child
  bool subtree = false;       // started by supervisor_child: relays its events to us
  table_links<child_rec> links; // its neighbours in start order (child_table)

  [[nodiscard]] bool temporary() const noexcept { return spec->restart == restart_mode::never; }
  [[nodiscard]] bool due_to_restart() const noexcept {
    return pending || retry_pending || status == child_status::waiting ||
           status == child_status::circuit_open;
  }
};

/// A supervisor's children by uid, in start order (ordered_table: O(1) lookups).
using child_table = ordered_table<child_rec>;

/// While alive, a subtree started on this thread that fails to start leaves its stopping
/// supervisor in `*sink` (supervisor.cpp).
class subtree_sink_scope {
 public:
  explicit subtree_sink_scope(caf::actor* sink) noexcept;
  ~subtree_sink_scope();
  subtree_sink_scope(const subtree_sink_scope&) = delete;
  subtree_sink_scope& operator=(const subtree_sink_scope&) = delete;

 private:
  caf::actor* previous_;
};

class supervisor_actor final : public caf::event_based_actor {
 public:
  supervisor_actor(caf::actor_config& cfg, caf::actor_system* sys, troupe::clock* clk,
                   supervisor_spec spec, std::shared_ptr<supervisor_final> final,
                   caf::error* start_error)
      : caf::event_based_actor(cfg), sys_(sys), clk_(clk), final_(std::move(final)),
        name_(std::move(spec.name)), strategy_(spec.strategy), auto_shutdown_(spec.auto_shutdown),
        keep_ended_(spec.keep_ended_temporaries), budget_(spec.intensity, spec.period_ms) {
    if (spec.child_template) {
      auto& t = *spec.child_template;
      auto c = std::make_shared<child_spec>(spec_of(t));
      c->kind = c->kind.value_or(child_kind::worker);
      c->shutdown_ms = shutdown_of(*c, *c->kind);
      template_spec_ = std::move(c);
      template_start_ = std::move(t.start);
    }
    // One spec block per child (not one block for all of them, aliased: ~150 B less per
    // child, but a forgotten temporary's start function, and what it captured, would live
    // as long as the supervisor).
    kids_.reserve(spec.children.size());
    by_name_.reserve(spec.children.size());
    for (auto& c : spec.children)
      add_rec(std::make_shared<const child_spec>(std::move(c)));
    // OTP's start_link: the children start in order before the spawn returns, so that a
    // subtree that cannot start fails its parent's start instead of a restart loop.
    std::vector<uint64_t> ignored_temporaries;
    subtree_sink_scope sink{&failed_subtree_};
    for (auto& [uid, k] : kids_) {
      auto err = start_child(k);
      if (!err) {
        if (!k.actor && k.temporary()) ignored_temporaries.push_back(uid); // OTP: not kept
        continue;
      }
      k.status = child_status::failed;
      event(supervisor_event_kind::failed, k.name, k.last_error);
      failed_start_ = start_failure(k, err);
      if (start_error != nullptr) *start_error = failed_start_;
      break;
    }
    for (auto uid : ignored_temporaries)
      forget(kids_.at(uid));
  }

  const char* name() const override { return "troupe.supervisor"; }

  void on_exit() override;

  caf::behavior make_behavior() override;

 private:
  struct subscriber {
    caf::actor who;
    std::string prefix; // a parent supervisor: our events under its child name
  };

  // -- bookkeeping ---------------------------------------------------------------------------

  /// Adds a subscriber (with the log so far when `replay`: nothing missed, nothing twice);
  /// it is dropped when it ends.
  void subscribe(caf::actor who, bool replay, std::string prefix);

  /// The clock's time. Within one message (`time_scope`) it is read once, unless a start
  /// function ran since (`time_moved`): a restart reads two clocks for three events and a
  /// budget check, each a system call's worth of time on its hot path.
  int64_t now_ms() const {
    if (in_turn_ && turn_now_ >= 0) return turn_now_;
    auto t = clk_->now_ms();
    if (in_turn_) turn_now_ = t;
    return t;
  }

  /// Wall-clock time for events: `now_ms` plus the offset between the two clocks, taken
  /// again once a second of `now_ms` has passed (so a restart reads one clock, not two; an
  /// adjustment of the system clock shows within a second; on a virtual clock the offset
  /// is 0). Event times of one supervisor never go back within a second.
  int64_t wall_ms() const {
    auto now = now_ms();
    if (wall_synced_at_ < 0 || now - wall_synced_at_ >= 1000 || now < wall_synced_at_) {
      wall_offset_ = clk_->wall_ms() - now;
      wall_synced_at_ = now;
    }
    return now + wall_offset_;
  }

  /// Marks the handling of one message: the clocks are read at most once inside it.
  struct time_scope {
    explicit time_scope(const supervisor_actor* s) : self(s) {
      s->in_turn_ = true;
      s->time_moved();
    }
    ~time_scope() { self->in_turn_ = false; }
    time_scope(const time_scope&) = delete;
    time_scope& operator=(const time_scope&) = delete;
    const supervisor_actor* self;
  };

  /// User code ran (a start function): the next read takes a fresh time.
  void time_moved() const { turn_now_ = -1; }

  /// `render(reason)`, remembering the last one: a child that fails over and over fails with
  /// the same reason, and rendering a CAF error goes through the system's renderers.
  const std::string& rendered(const caf::error& reason);

  child_rec& add_rec(std::shared_ptr<const child_spec> spec, std::string name = {});

  void set_pending(child_rec& k, bool on);
  void set_group_stop(child_rec& k, bool on) noexcept {
    if (k.group_stop == on) return;
    k.group_stop = on;
    if (on)
      ++group_stops_;
    else
      --group_stops_;
  }
  /// A group restart stops its children one at a time, the last started first (OTP): stops
  /// the next one still running; false when none is left.
  bool stop_next_in_group();

  /// Removes a child that is not running from every index.
  void forget(child_rec& k);

  /// A temporary child ended: forgotten (OTP), or kept listed under the cap.
  void ended_temporary(child_rec& k);

  child_rec* find(const std::string& name);

  child_rec* find(uint64_t uid);

  void set_actor(child_rec& k, caf::actor a);

  void clear_actor(child_rec& k);

  /// Monitors a child; a subtree also sends us its events (its log so far, then live)
  /// under its name.
  void watch(child_rec& k);

  troupe::clock::timer_id schedule(int64_t delay_ms, sup_tick kind, uint64_t child,
                                   uint64_t gen);

  static supervisor_event qualified(const supervisor_event& e, const std::string& prefix);

  /// The log keeps the most recent events only (a supervisor may restart millions of times).
  static constexpr size_t max_events = 1024;

  void event(supervisor_event_kind kind, const std::string& child, std::string_view reason);

  std::vector<supervisor_event> events_after(uint64_t after) const;

  void publish(supervisor_event e);

  /// The newest event is in the log: to the waiters and subscribers.
  void published();

  child_state child_of(const child_rec& k) const;

  supervisor_state state() const;

  child_counts counts() const;

  supervisor_metrics metrics() const;

  /// Starts `k`; an error (with last_error set) when its start function failed.
  caf::error start_child(child_rec& k);

  /// Returns the `start_failed` error for child `k`'s start error `err`: the field is the
  /// path of the child that failed (through nested supervisors), the cause the start
  /// function's own error.
  caf::error start_failure(const child_rec& k, const caf::error& err);

  // -- administration ------------------------------------------------------------------------

  caf::result<child_state> add_static(child_spec c);

  caf::result<child_state> add_templated(caf::message args);

  caf::result<child_state> started_or_error(child_rec& k);
  /// start_child for an administration call: a subtree that cannot start leaves its
  /// stopping supervisor in `failed_subtree`.
  caf::error start_admin(child_rec& k, caf::actor& failed_subtree);
  /// `out` now, or (a subtree that could not start) once that subtree has stopped.
  caf::result<child_state> answer_when_stopped(caf::actor failed_subtree, caf::error out);
  /// Sends us `sup_tick::subtree_stopped` with `gen` once `subtree` has ended (at once if
  /// it has): 0 for our own failed start, else a held answer's id.
  void tick_when_ended(const caf::actor& subtree, uint64_t gen);

  caf::result<bool> terminate_child(const std::string& name);

  /// Cancels the pending group restart that child `uid` belongs to (rest_for_one: the
  /// children after it; one_for_all: all of them): they stay stopped.
  void cancel_group(uint64_t uid);

  caf::result<child_state> restart_child(const std::string& name);

  caf::result<bool> delete_child(const std::string& name);

  // -- exits ---------------------------------------------------------------------------------

  void on_exit_msg(caf::exit_msg& em);

  void on_down(uint64_t uid, caf::actor_id id, const caf::error& reason);

  /// Child `k` ended by itself (or failed to restart): apply the restart rules.
  void on_child_down(child_rec& k, bool failure);

  /// Stops the children `k`'s failure takes along (in reverse order) and restarts them
  /// with it once they have stopped. Temporary children are stopped, never restarted.
  void group_restart(child_rec& k, int64_t delay);

  /// A significant child ended by itself: auto_shutdown may stop this supervisor.
  void significant_ended(const std::string& name);

  void restart_after(child_rec& k, int64_t delay);

  /// Restarts `k`; false when its start failed (its retry is on its way).
  bool restart_now(child_rec& k);

  void terminate(child_rec& o);

  void kill(child_rec& k, const std::string& why);

  /// Puts `k`'s kill deadline (`delay_ms` from now, its current kill_gen) in the kill queue,
  /// arming the clock when it is the earliest.
  void arm_kill(child_rec& k, int64_t delay_ms);

  /// `k` stopped (or is forgotten) before its kill deadline: the queue's entry goes stale.
  void kill_settled(child_rec& k) noexcept;

  /// The clock timer of the kill queue fired: kills the children whose deadline passed and
  /// arms the clock for the next deadline.
  void sweep_kills(uint64_t timer_gen);

  void on_tick(sup_tick kind, uint64_t child, uint64_t gen);

  /// Continues after a termination: the group restart, or the shutdown sequence.
  void proceed();

  /// Restarts the pending children in order. A child that fails to start stops the
  /// round: the children after it wait until it runs again (its retry restarts the group).
  void restart_group();

  // -- shutdown ------------------------------------------------------------------------------

  void escalate(caf::error err);

  void shutdown(supervisor_status final_status, caf::error err, std::string why);

  /// Stops the children: one by one in reverse order (the last running child first), or
  /// a dynamic supervisor's all at once (OTP), bounded by the template's shutdown.
  void shutdown_next();

  /// Cancels every timer this supervisor has scheduled (its end: each would hold it alive).
  void cancel_timers() noexcept;

  /// Makes a restart of `k` that waits (a backoff, an open circuit) or a retry on its way
  /// stale, and cancels its timer: a superseded timer would stay pending until it fired.
  void supersede_restart(child_rec& k) noexcept {
    ++k.gen;
    if (k.restart_timer != 0) clk_->cancel(std::exchange(k.restart_timer, 0));
  }
  /// A group restart's round stops at a child that does not run (its restart failed and
  /// its circuit opened, or its restarts were suppressed): the children after it wait.
  /// Once it runs again (the half-open try, `restart_child`), they start.
  void continue_group() {
    if (pending_count_ > 0 && terminating_ == 0 && group_stops_ == 0 && !group_backoff_ &&
        !group_blocked() && !stopping_)
      restart_group();
  }
  /// The round stopped at `group_blocker_` (its restart failed) and that child does not run
  /// yet: the children after it wait. Forgets a blocker that runs again or is gone.
  bool group_blocked() {
    if (group_blocker_ == 0) return false;
    auto* b = find(group_blocker_);
    if (b == nullptr || b->actor) {
      group_blocker_ = 0;
      return false;
    }
    return true;
  }
  /// Schedules `k`'s restart timer (`sup_tick::restart`) in `delay_ms`, superseding any.
  void schedule_restart(child_rec& k, int64_t delay_ms) {
    supersede_restart(k);
    k.restart_timer = schedule(delay_ms, sup_tick::restart, k.uid, k.gen);
  }

  /// Prefetches what stopping the child before `it` will touch.
  void prefetch_before(child_table::iterator it) noexcept;

  void finish();
  /// Records the final state (read calls answer it once we have ended) and answers the
  /// waiters: supervisor_wait with it, event waiters with no more events.
  void record_final();

  caf::actor_system* sys_;
  troupe::clock* clk_;
  std::shared_ptr<supervisor_final> final_;
  std::string name_;
  troupe::strategy strategy_;
  troupe::auto_shutdown auto_shutdown_;
  size_t keep_ended_;
  std::shared_ptr<const child_spec> template_spec_;
  template_start_fn template_start_;
  supervisor_metrics metrics_;
  /// The children in start order, by uid (a child's end names its uid), and an index by
  /// name: both O(1), whatever the number of children.
  child_table kids_;
  std::unordered_map<std::string_view, child_rec*> by_name_; // views of the records' names
  std::deque<uint64_t> ended_; // ended temporaries kept listed (keep_ended_temporaries)
  size_t active_ = 0;
  size_t pending_count_ = 0;       // children with `pending` set (a group restart waits)
  size_t group_stops_ = 0;         // children with `group_stop` set
  uint64_t group_stop_cursor_ = 0; // the child the round stopped last (0: from the end)
  size_t significant_running_ = 0; // significant children with an actor
  size_t supervisor_specs_ = 0;
  supervisor_status status_ = supervisor_status::starting;
  supervisor_status final_status_ = supervisor_status::stopped;
  std::string reason_;
  caf::error exit_reason_;
  caf::error parent_reason_;
  caf::error failed_start_;
  /// A subtree child whose start failed: its supervisor, still stopping what it started.
  /// This one ends after it (OTP: start_link answers once the subtree has stopped).
  caf::actor failed_subtree_;
  /// start_child / restart_child answers held until the subtree that could not start has
  /// stopped (ids from 1).
  std::unordered_map<uint64_t, std::pair<caf::response_promise, caf::error>> held_answers_;
  uint64_t held_answer_seq_ = 0;
  caf::actor self_ref_;
  /// The two restart budgets (the children's own state lives in their records).
  restart_budget budget_;
  event_ring events_{max_events};
  std::vector<subscriber> subscribers_;
  std::vector<caf::response_promise> waiters_;
  std::vector<std::pair<uint64_t, caf::response_promise>> event_waiters_;
  uint64_t event_seq_ = 0;
  mutable bool in_turn_ = false;
  mutable int64_t turn_now_ = -1;
  /// wall_ms: the offset from now_ms and the now_ms it was taken at (-1: not yet).
  mutable int64_t wall_offset_ = 0;
  mutable int64_t wall_synced_at_ = -1;
  caf::error last_reason_;      // the last reason `rendered` rendered (one without context)
  std::string last_rendered_;
  bool stopping_ = false;
  bool starting_failed_ = false;
  bool concurrent_stop_sent_ = false;
  bool finished_ = false;
  troupe::clock::timer_id stop_timer_ = 0;     // stop(timeout)'s kill of what is left
  /// A group restart waits for its backoff (also an infinite one, which has no timer).
  bool group_backoff_ = false;
  /// The child a group restart's round stopped at (its restart failed), until it runs.
  uint64_t group_blocker_ = 0;
  troupe::clock::timer_id group_timer_ = 0;    // the last group restart's backoff
  troupe::clock::timer_id kill_all_timer_ = 0; // a dynamic supervisor's stop bound
  size_t terminating_ = 0;
  int64_t group_delay_ = 0;
  uint64_t group_gen_ = 0;
  uint64_t next_uid_ = 0;
  uint64_t next_id_ = 0;
  uint64_t stop_gen_ = 0;
  /// Kill deadlines of children asked to stop, earliest first (a min-heap by due, then
  /// arrival): one clock timer for the earliest, not a timer scheduled and cancelled per
  /// termination (that was ~10% of a dynamic supervisor's turn in dynamic_start_stop). An
  /// entry whose child stopped in time stays until it reaches the top or the queue is
  /// compacted (at most twice the live entries, plus 64).
  struct kill_deadline {
    troupe::clock::time_point due;
    uint64_t seq;
    uint64_t uid;
    uint64_t gen;
    bool operator>(const kill_deadline& o) const noexcept {
      return due != o.due ? due > o.due : seq > o.seq;
    }
  };
  [[nodiscard]] bool kill_stale(const kill_deadline& e) const;
  std::vector<kill_deadline> kill_heap_;
  uint64_t kill_seq_ = 0;
  size_t kills_live_ = 0;
  troupe::clock::timer_id kill_timer_ = 0; // the clock timer for the earliest (0: none)
  troupe::clock::time_point kill_timer_due_{};
  uint64_t kill_timer_gen_ = 0; // a replaced timer's tick is ignored
  /// The shutdown cursor before the first child is stopped: above every uid.
  static constexpr uint64_t no_cursor = std::numeric_limits<uint64_t>::max();
  uint64_t shutdown_cursor_ = no_cursor;
};

} // namespace troupe::detail
