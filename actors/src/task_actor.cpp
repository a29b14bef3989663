#include "troupe/actors/context.hpp"

#include <algorithm>
#include <cxxabi.h>

#include <caf/actor_system.hpp>
#include <caf/send.hpp>

#include "primitive_actors.hpp"
#include "troupe/actors/detail/test_hooks.hpp"
#include "troupe/messages/interfaces.hpp"
#include "troupe/messages/messaging.hpp"

namespace troupe {

namespace {

/// This thread's census batch and the slot it last used. Read at every activation and
/// every census change: the initial-exec model makes it one `%fs`-relative access instead
/// of a call to `__tls_get_addr` (the library is built position-independent, so the
/// compiler cannot assume an executable; a library loaded at start, or dlopen'ed within
/// glibc's spare static TLS, gets it too).
struct census_tls {
  detail::census_batch batch;
  uint64_t cached_uid = 0;
  detail::wait_census::slot* cached = nullptr;
};
thread_local census_tls tl_census __attribute__((tls_model("initial-exec")));

/// A number for this thread, unique in the process (slots remember their owner by it).
uint64_t thread_number() noexcept {
  static std::atomic<uint64_t> next{0};
  thread_local uint64_t n = ++next;
  return n;
}

std::atomic<uint64_t> next_census_uid{0};

} // namespace

detail::wait_census::wait_census() noexcept : uid(++next_census_uid) {}

void detail::wait_census::change(field f, int64_t delta) noexcept {
  auto d = static_cast<uint64_t>(delta) << (f == channel ? 0 : 32); // -1 << k subtracts
  auto& b = tl_census.batch;
  if (b.census == this) {
    if (!b.any) {
      b.any = true;
      b.slot->busy.store(true, std::memory_order_relaxed);
    }
    if (f == live)
      b.live += delta;
    else
      b.waits += d;
    return;
  }
  if (f == live)
    apply(delta, 0);
  else
    apply(0, d);
}

void detail::wait_census::apply(int64_t dlive, uint64_t dwaits) noexcept {
  uint64_t w;
  int64_t live;
  if (dlive != 0 && dwaits != 0) {
    // Both change: the count is read again after the second add, so that the call whose
    // add comes last of all sees both counts as they end up (another thread may change the
    // live count between the two adds), as with one add and one read.
    live_count.fetch_add(dlive, std::memory_order_seq_cst);
    w = waits.fetch_add(dwaits, std::memory_order_seq_cst) + dwaits;
    live = live_count.load(std::memory_order_seq_cst);
  } else if (dlive != 0) {
    live = live_count.fetch_add(dlive, std::memory_order_seq_cst) + dlive;
    w = waits.load(std::memory_order_seq_cst);
  } else {
    w = waits.fetch_add(dwaits, std::memory_order_seq_cst) + dwaits;
    live = live_count.load(std::memory_order_seq_cst);
  }
  // Mostly a read: the line is written only when the detector has cleared the flag.
  if (!moved.load(std::memory_order_relaxed)) moved.store(true, std::memory_order_relaxed);
  // A chain of tasks passing values looks stuck for an instant at every hop (both parked,
  // the value in a mailbox), and batches applied out of order can make the counts look
  // anything for an instant: read the flag before writing it, so a pending check costs no
  // write to a line every task shares. Sequentially consistent, like the count's change and
  // the detector's clearing of the flag and reading of the counts: either the detector sees
  // this change or this read sees the flag cleared (on x86 the same instructions as
  // relaxed; on weaker CPUs a relaxed read could miss both and a deadlock go unreported).
  if (detector && stuck(w, live) && !check_pending.load(std::memory_order_seq_cst) &&
      !check_pending.exchange(true))
    caf::anon_send(detector, atoms::deadlock_atom::value, uint64_t{0});
}

detail::wait_census::slot* detail::wait_census::slot_of_this_thread() noexcept {
  // Cached per thread for the census it last served (a worker serves one runtime).
  auto& t = tl_census;
  if (t.cached_uid == uid) return t.cached;
  auto me = thread_number();
  slot* found = nullptr;
  auto used = std::min(slots_used_.load(std::memory_order_acquire), max_slots);
  for (size_t i = 0; i < used && found == nullptr; ++i)
    if (slots_[i].owner.load(std::memory_order_relaxed) == me) found = &slots_[i];
  if (found == nullptr) {
    auto i = slots_used_.fetch_add(1, std::memory_order_acq_rel);
    if (i < max_slots) {
      found = &slots_[i];
      found->owner.store(me, std::memory_order_relaxed); // only this thread looks for `me`
    }
  }
  t.cached_uid = uid;
  t.cached = found;
  return found;
}

std::pair<uint64_t, bool> detail::wait_census::activity() const noexcept {
  uint64_t n = 0;
  bool busy = false;
  auto used = std::min(slots_used_.load(std::memory_order_acquire), max_slots);
  for (size_t i = 0; i < used; ++i) {
    n += slots_[i].activations.load(std::memory_order_acquire);
    busy = busy || slots_[i].busy.load(std::memory_order_acquire);
  }
  return {n, busy};
}

detail::census_scope::census_scope(wait_census& c) noexcept : prev_(tl_census.batch) {
  auto& b = tl_census.batch;
  b = census_batch{};
  if (auto* sl = c.slot_of_this_thread()) {
    b.census = &c;
    b.slot = sl;
  }
}

detail::census_scope::~census_scope() {
  auto& b = tl_census.batch;
  auto mine = b;
  b = prev_;
  if (!mine.any) return;
  if (mine.live != 0 || mine.waits != 0) mine.census->apply(mine.live, mine.waits);
  auto* sl = mine.slot;
  sl->activations.store(sl->activations.load(std::memory_order_relaxed) + 1,
                        std::memory_order_release);
  // (An activation run inside another of the same census on this thread leaves the outer
  // one's busy mark as it was.)
  if (!(b.slot == sl && b.any)) sl->busy.store(false, std::memory_order_release);
}

} // namespace troupe

namespace troupe::detail {

using namespace troupe::atoms;

void task_actor::count_wait(awaiter_base::wait_kind k, int64_t delta) noexcept {
  switch (k) {
    case awaiter_base::wait_kind::other:
      return;
    case awaiter_base::wait_kind::channel:
      env_->census.change(wait_census::channel, delta);
      return;
    case awaiter_base::wait_kind::tasks:
      env_->census.change(wait_census::tasks, delta);
      return;
  }
}

awaiter_base* task_actor::unpark() noexcept {
  auto a = std::exchange(parked_, nullptr);
  if (a != nullptr) count_wait(a->wait_kind_, -1);
  return a;
}

void task_actor::stash(const caf::actor& queue, uint64_t seq, value_batch& vs) {
  if (vs.empty() || !queue) return;
  auto l = find_link(queue.id());
  if (phase_ == phase::running && l != nullptr && seq == l->grant_seq && seq != 0) {
    l->hold(vs); // the live grant's values: the next receive takes them
    return;
  }
  // Values of a grant that ended: back to their places in the queue.
  send(queue, q_return_atom::value, int64_t{0}, std::move(vs), false,
       l != nullptr ? l->consumed : uint64_t{0});
}

void task_actor::end_idle_grants(awaiter_base* next) noexcept {
  for (auto& kvp : cold_->links) {
    auto& l = kvp.second;
    if ((l.grant == 0 && l.buffered.empty()) || next->takes_from(kvp.first)) continue;
    l.grant = 0;
    l.grant_seq = 0; // what still arrives for it goes back
    send(l.queue, q_return_atom::value, int64_t{0}, l.release(), true, l.consumed);
  }
}

namespace {

/// Destroys a task's body: the frame first (its locals may refer to the body's captures),
/// then the body itself. What it captured is released when the task is complete (its
/// children joined: they may refer to the captures), not when the last handle goes (a
/// caller keeping the handle of a finished or cancelled-before-run task no longer keeps its
/// captures alive).
void drop_body(std::unique_ptr<runner_base>& r) noexcept {
  if (!r) return;
  r->destroy();
  r.reset();
}

thread_local task_actor* current_task = nullptr;

/// Marks the task whose body runs on this thread (permits flush its posts on release).
struct running_body {
  task_actor* prev;
  explicit running_body(task_actor* self) noexcept : prev(std::exchange(current_task, self)) {}
  ~running_body() { current_task = prev; }
};

} // namespace

task_actor* task_actor::current() noexcept {
  return current_task;
}

void body_threw() noexcept {
  auto* self = task_actor::current();
  if (self == nullptr) return;
  // The exception's type without rethrowing it (a second search would cost what this
  // saves): a cancellation is not a failure.
  auto* type = abi::__cxa_current_exception_type();
  if (type != nullptr && *type == typeid(task_cancelled)) return;
  // A task_error carrying a cancellation (a body passing on an awaited child's cancel) is
  // not one either, as when it is returned (finish): rethrown only for this type.
  if (type != nullptr && *type == typeid(task_error)) {
    try {
      throw;
    } catch (const task_error& e) {
      if (is_cancellation(e.error())) return;
    } catch (...) {
    }
  }
  self->raise_group();
}

void task_actor::release_links() noexcept {
  if (!cold_) return;
  for (auto& kvp : cold_->links) {
    auto& l = kvp.second;
    auto rest = l.release();
    if (l.receiving && phase_ != phase::done && !getf(is_terminated_flag)) {
      // The queue may still hand values over (a standing grant): this actor stays until
      // the queue confirms, and sends back whatever arrives meanwhile.
      ++pending_releases_;
      auto done = [this] {
        if (--pending_releases_ == 0 && quit_deferred_) quit(exit_reason_);
      };
      request(l.queue, caf::infinite, q_return_atom::value, l.credits, std::move(rest), true,
              l.consumed)
          .then([done](bool) { done(); }, [done](caf::error&) { done(); });
    } else if (l.credits > 0 || !rest.empty() || l.consumed > 0) {
      // Also a link that only consumed (a select's win): the queue counts that value as
      // held by this task until it hears it was consumed, and a closed queue waits for
      // held values before it answers closed.
      send(l.queue, q_return_atom::value, l.credits, std::move(rest), true, l.consumed);
    }
  }
  cold_->links.clear();
  cold_->recent[0] = cold_->recent[1] = nullptr;
  cold_->recent_ids[0] = cold_->recent_ids[1] = 0;
}

void task_actor::maybe_quit() {
  if (pending_releases_ > 0)
    quit_deferred_ = true;
  else
    quit(exit_reason_);
}

void root_slot::fill(outcome_box x) {
  {
    std::lock_guard<std::mutex> guard{mtx};
    if (done) return;
    out = std::move(x);
    done = true;
  }
  cv.notify_all();
}

task_actor::task_actor(caf::actor_config& cfg, std::unique_ptr<runner_base> r, task_env* env,
                       task_info info, task_locals locals, std::shared_ptr<root_slot> slot,
                       caf::actor_addr parent, spawn_extras extras, bool notify_parent)
    : caf::event_based_actor(cfg), runner_(std::move(r)), env_(env), id_(std::move(info.id)),
      parent_(std::move(parent)), collector_(static_cast<uint32_t>(extras.collector)),
      index_(static_cast<uint32_t>(extras.index)), cx_(this), branch_(extras.branch),
      notify_parent_(notify_parent), supervised_(extras.supervised),
      started_(!extras.deferred_start), cell_(std::move(extras.cell)) {
  // Live from the spawn on: a child about to start may still send (a job spawned from its
  // ticket takes over the ticket's count).
  live_counted_ = true;
  if (!extras.live_counted) env_->census.change(wait_census::live, 1);
  if (!info.group.empty() || !info.name.empty() || locals || slot || extras.fail_fast ||
      extras.deadline) {
    auto& c = cold();
    c.group = std::move(info.group);
    c.name = std::move(info.name);
    c.locals = std::move(locals);
    c.slot = std::move(slot);
    c.fail_fast = extras.fail_fast;
    c.join_on_return = extras.join_on_return;
    c.deadline = extras.deadline;
  }
  siblings_failed_ = std::move(extras.siblings_failed);
  await_state_ = std::move(extras.await_state);
  if (extras.lane_starts && extras.deferred_start) {
    // Queued on its lane until the lane starts it: an untimed wait, as its acquire was.
    lane_start_ = lane_wait_counted_ = true;
    env_->census.change(wait_census::channel, 1);
    if (extras.lane != nullptr) cold().lane = extras.lane;
  } else if (extras.lane_grant != 0) {
    // Spawned from its ticket, holding its lane's permit: given back here if it never runs.
    lane_grant_ = extras.lane_grant;
    if (extras.lane != nullptr) cold().lane = extras.lane;
  }
  if (!extras.ticket.expired()) cold().ticket = std::move(extras.ticket);
  child_key_ = extras.child_key;
}

void task_actor::give_back_grant() noexcept {
  // A job spawned from its ticket that ends before its body took the lane's permit (a cancel
  // came first, or the body failed to start): the permit goes back to the lane unused.
  if (lane_grant_ == 0 || child_key_ == 0 || !cold_ || cold_->lane == nullptr) return;
  auto permit = std::exchange(lane_grant_, 0);
  // Its ticket may be gone already (its owner ended): the lane takes the permit back as a
  // withdrawal either way, never as a used release.
  send(*cold_->lane, sy_ticket_gone_atom::value, job_ticket_ref{cold_->ticket.lock()}, permit);
}

void task_actor::hold_lane_grant(uint64_t id, const caf::actor& lane) {
  release_held_grant(); // (never two: a job holds one admission at a time)
  auto& c = cold();
  c.held_grant = id;
  // `lane` is the catalog's (spawn_extras::lane): kept by address, no reference counted.
  c.held_lane = &lane;
  // A job spawned from its ticket kept its lane from the spawn, for a grant given back
  // unused (give_back_grant); its body has taken the grant now.
  if (lane_grant_ == 0 && c.lane == &lane) c.lane = nullptr;
}

void task_actor::release_held_grant() noexcept {
  if (!cold_ || cold_->held_grant == 0) return;
  auto id = std::exchange(cold_->held_grant, 0);
  const auto& lane = *std::exchange(cold_->held_lane, nullptr);
  // What the task sent under the permit goes out before the next holder can get in.
  flush_posts();
  if (!release_lane_grant(lane, id)) send(lane, sy_release_atom::value, id);
}

void task_actor::leave_ticket() noexcept {
  if (!cold_) return;
  if (auto t = cold_->ticket.lock()) {
    std::lock_guard<spin_lock> guard{t->mtx};
    t->actor = nullptr;
  }
  cold_->ticket.reset();
}

void task_actor::cancel_child(child_entry& e, cancel_mode mode) {
  if (e.ticket) {
    // Not admitted yet (or admitted, its task not spawned): withdrawn, it never runs
    // (also on a graceful cancel); else its task gets the cancel.
    caf::actor running;
    if (mode.how == cancel_mode::kind::wait ||
        ticket_stop(e.ticket, running,
                    make_error(errc::cancelled, "", "job " + e.ticket->info.id + " was cancelled")))
      return;
    if (running) send_cancel(running, mode);
    return;
  }
  send_cancel(e.actor, mode);
}

void task_actor::uncount_lane_wait() noexcept {
  if (std::exchange(lane_wait_counted_, false)) env_->census.change(wait_census::channel, -1);
}

void task_actor::withdraw_from_lane() noexcept {
  if (!lane_start_ || !cold_ || cold_->lane == nullptr) return;
  const auto& lane = *std::exchange(cold_->lane, nullptr);
  // From this actor: the lane finds the reservation (or the grant) by its sender. Sent
  // before this actor's end, so before the down message the lane may also get.
  send(lane, sy_withdraw_atom::value, uint64_t{0});
}

std::string_view task_actor::parent_id() const noexcept {
  auto pos = id_.rfind('.');
  return pos == std::string::npos ? std::string_view{} : std::string_view{id_}.substr(0, pos);
}

std::string_view task_actor::root_id() const noexcept {
  return std::string_view{id_}.substr(0, id_.find('.'));
}

std::string task_actor::group_id() const {
  if (cold_ && !cold_->group.empty()) return cold_->group;
  // The branches of one combinator call are one group, named after the call's collector.
  if (branch_) return std::string{parent_id()} + "/b" + std::to_string(collector_);
  return id_;
}

std::string_view task_actor::task_name() const noexcept {
  return cold_ && !cold_->name.empty() ? std::string_view{cold_->name} : std::string_view{"task"};
}

task_actor::~task_actor() {
  // Notices of children that ended after this scope stopped taking them.
  auto* n = done_head_.exchange(nullptr, std::memory_order_acquire);
  while (n != nullptr)
    free_done(std::exchange(n, n->next));
}

bool task_actor::post_child_done(caf::actor_id child, bool raised, caf::error err) {
  auto* n = new (recycler::allocate(sizeof(done_node))) done_node{nullptr, child, raised, std::move(err)};
  auto* head = done_head_.load(std::memory_order_relaxed);
  do {
    n->next = head;
  } while (!done_head_.compare_exchange_weak(head, n, std::memory_order_release,
                                             std::memory_order_relaxed));
  return head == nullptr;
}

void task_actor::wake_scope(task_actor* scope, const caf::actor& p) {
  // From a worker's thread only: elsewhere (a system's shutdown cleaning up) CAF's own path.
  auto* eu = context();
  if (eu != nullptr && env_->notices_go_home)
    if (auto* home = scope->home_.load(std::memory_order_relaxed)) eu = home;
  p->eq_impl(caf::make_message_id(), ctrl(), eu, done_atom::value);
}

void task_actor::free_done(done_node* n) noexcept {
  n->~done_node();
  recycler::deallocate(n, sizeof(done_node));
}

void task_actor::drain_child_done() {
  // Newest first on the list: reversed, the notices go in the order the children pushed
  // them. Any child that pushes after the exchange finds the list empty and sends its own
  // done_atom.
  note_home();
  done_node* fifo = nullptr;
  for (auto* n = done_head_.exchange(nullptr, std::memory_order_acquire); n != nullptr;) {
    auto* next = n->next;
    n->next = fifo;
    fifo = n;
    n = next;
  }
  struct rest { // frees what is left if a handler throws (the task then ends)
    done_node*& head;
    ~rest() {
      while (head != nullptr)
        free_done(std::exchange(head, head->next));
    }
  } guard{fifo};
  while (fifo != nullptr) {
    auto* n = std::exchange(fifo, fifo->next);
    auto err = std::move(n->err);
    auto child = n->child;
    bool raised = n->raised;
    free_done(n);
    on_child_done(child, std::move(err), raised);
  }
}

namespace {

/// The one case of every task's behavior: a type nobody can send (it is never made into a
/// message).
struct never_sent {};

/// Every task's behavior. Never destroyed: a runtime torn down during static destruction
/// may still activate a task for the first time.
const caf::behavior& task_behavior() {
  static const caf::behavior& b = *new caf::behavior{[](const never_sent&) {}};
  return b;
}

} // namespace

caf::behavior task_actor::make_behavior() {
  // The protocol goes through dispatch(): straight from the activation (see resume), or
  // through the default handler, which gets `self` as an argument and so costs no
  // allocation per task.
  set_default_handler(
      [](caf::scheduled_actor* ptr, caf::message_view& mv) -> caf::result<caf::message> {
        if (static_cast<task_actor*>(ptr)->dispatch(mv)) return caf::delegated<caf::message>{};
        return caf::sec::unexpected_message;
      });
  if (supervised_) {
    // A supervisor's shutdown request is a graceful cancel; it kills us after the child's
    // shutdown time (the forced cancel: the frame is destroyed, RAII runs).
    set_exit_handler([this](caf::exit_msg& em) {
      if (!em.reason) return;
      if (em.reason.category() == caf::atom("exit") &&
          em.reason.code() == static_cast<uint8_t>(caf::exit_reason::user_shutdown)) {
        if (phase_ == phase::running) request_graceful(cancel_mode::unbounded);
        return;
      }
      quit(em.reason);
    });
  }
  auto install_task_behavior = [this] {
    // After the first run, not before: a body that ended in it has quit, and a task that
    // never suspends then never pushes onto CAF's behavior stack (the stack's first push is a
    // malloc, its clear a free: 4.5% of a burst of trivial tasks). The behavior's one case
    // takes nothing troupe sends: the whole protocol, `await` included, goes through
    // dispatch() (see resume), so every task shares this one behavior and its spawn
    // allocates none.
    if (getf(is_terminated_flag | is_shutting_down_flag)) return;
    if (bhvr_stack_.empty()) {
      become(task_behavior());
      return;
    }
    // The body put behaviors of its own on the stack in its first run (`cx.self()->become`,
    // the escape hatch): the task's goes under them, where it would have been had it been
    // installed first (under `keep_behavior`; a plain `become` would have replaced it, and
    // then the task's stays under: popping the body's own does not end the task).
    std::vector<caf::behavior> theirs;
    while (!bhvr_stack_.empty()) {
      theirs.push_back(bhvr_stack_.back());
      bhvr_stack_.pop_back();
    }
    bhvr_stack_.push_back(caf::behavior{task_behavior()});
    for (auto i = theirs.rbegin(); i != theirs.rend(); ++i)
      bhvr_stack_.push_back(std::move(*i));
    bhvr_stack_.cleanup();
  };
  // A deferred task starts on `start_atom` (from its parent once the parent's body suspends,
  // or from the runtime): what was queued before it (a cancel right after the spawn) goes
  // first. Any other starts now.
  if (started_) {
    // A job spawned from its ticket whose cancel came before this first activation: it
    // starts behind that cancel, which stops it first (its attempt never runs).
    if (child_key_ != 0 && cancel_flag_.load(std::memory_order_acquire)) {
      started_ = false;
      send(caf::actor_cast<caf::actor>(this), start_atom::value);
    } else {
      start();
    }
  } else if (!lane_start_ && (start_keys_.load(std::memory_order_acquire) & key_spawner) != 0) {
    // A deferred child started with no message (start_pending_children) before its first
    // activation: it starts now, ahead of the messages sent after the start. A forced
    // cancel that came first has finished it: its body never runs.
    started_ = true;
    if (phase_ == phase::running) {
      try {
        start();
      } catch (...) {
        auto eptr = std::current_exception();
        quit(exception_handler_ ? exception_handler_(this, eptr)
                                : caf::make_error(caf::sec::runtime_error));
        return {}; // CAF's activation finalizes it
      }
    }
  }
  install_task_behavior();
  return {};
}

bool task_actor::dispatch(caf::message_view& mv) {
  auto& x = mv.content();
  if (x.empty() || !x.match_element<caf::atom_value>(0)) return false;
  auto tag = x.get_as<caf::atom_value>(0);
  if (tag == start_atom::value) {
    if (lane_start_ && x.match_elements<caf::atom_value, uint64_t>()) {
      // Its lane's grant (a job): the start itself waits for the spawner's key too.
      uncount_lane_wait();
      lane_grant_ = x.get_as<uint64_t>(1);
      if ((start_keys_.fetch_or(key_lane, std::memory_order_acq_rel) & key_spawner) == 0)
        return true; // the spawner's key starts it
      // Both keys are in. A cancel sent before the spawner's key turned set the flag first:
      // then start behind that cancel (it stops the task first), else start now.
      if (cancel_flag_.load(std::memory_order_acquire)) {
        send(caf::actor_cast<caf::actor>(this), start_atom::value);
        return true;
      }
    }
    // A forced cancel that came first has finished the task: its body never runs (a permit
    // its lane sent goes back when the lane sees this actor end).
    if (!std::exchange(started_, true) && phase_ == phase::running) start();
    return true;
  }
  if (tag == await_atom::value && x.size() == 1) {
    // From outside a task (the runtime's await of a root): answered once the task is done.
    auto rp = make_response_promise();
    if (phase_ == phase::done) {
      deliver_result(rp);
      maybe_quit();
    } else {
      cold().awaiters.push_back(rp);
    }
    return true;
  }
  if (tag == cancel_atom::value && x.match_elements<caf::atom_value, cancel_mode>()) {
    on_cancel(x.get_as<cancel_mode>(1));
    return true;
  }
  if (tag == await_done_atom::value && x.match_elements<caf::atom_value, uint64_t>()) {
    if (is_parked(x.get_as<uint64_t>(1))) { // else abandoned: the outcome stays in the cell
      parked_->on_task_done();
      resume_parked();
    }
    return true;
  }
  if (tag == timer_atom::value && x.match_elements<caf::atom_value, uint64_t>()) {
    on_timer(x.get_as<uint64_t>(1));
    return true;
  }
  if (tag == force_atom::value && x.match_elements<caf::atom_value, uint64_t>()) {
    on_force_due(x.get_as<uint64_t>(1));
    return true;
  }
  if (tag == blocking_atom::value && x.match_elements<caf::atom_value, uint64_t, outcome_box>()) {
    auto seq = x.get_as<uint64_t>(1);
    if (is_parked(seq)) {
      parked_->on_box(outcome_box{x.get_as<outcome_box>(2)});
      resume_parked();
    }
    return true;
  }
  if (tag == q_ready_atom::value &&
      x.match_elements<caf::atom_value, uint64_t, uint64_t, uint8_t>()) {
    if (is_parked(x.get_as<uint64_t>(1)))
      parked_->on_ready(x.get_as<uint64_t>(2), x.get_as<uint8_t>(3));
    return true;
  }
  if (tag == q_value_atom::value && x.size() == 4) { // our own protocol: no type matching
    auto& from = current_sender();
    auto seq = x.get_as<uint64_t>(1);
    auto vseq = x.get_as<uint64_t>(2);
    // The value as a message of its own (the queue's hand-over), or this message's last
    // element (a typed send's direct hand-over: `(q_value, seq, vseq, boxed<T>)`).
    bool nested = x.type(3).first == caf::type_nr<caf::message>::value; // no rtti compare
    caf::message whole;
    auto value = [&]() -> caf::message& {
      if (nested) return *static_cast<caf::message*>(x.get_mutable(3));
      whole = mv.move_content_to_message(); // its last element is the value
      return whole;
    };
    auto l = find_link(from ? from->id() : caf::actor_id{0});
    // The link holds the queue's handle already: no reference taken per value.
    caf::actor other;
    if (l == nullptr) other = caf::actor_cast<caf::actor>(from);
    const caf::actor& q = l != nullptr ? l->queue : other;
    bool live = l != nullptr && seq == l->grant_seq && seq != 0;
    if (live && l->grant > 0) --l->grant;
    // Only the await that asked, or one relying on the live grant. A value of a grant that
    // ended goes back (stash): this task gave older values back when it ended that grant,
    // and taking this one now would pass them (a consumer saw 10 before 8).
    if (parked_ != nullptr && (is_parked(seq) || (live && parked_->takes_from(q.id())))) {
      if (nested || !parked_->on_value_in_place(q, x, 3)) parked_->on_value(q, vseq, value());
    } else {
      value_batch b;
      b.add(vseq, std::move(value()));
      stash(q, seq, b);
    }
    return true;
  }
  if (tag == q_values_atom::value && x.size() == 3) {
    auto q = caf::actor_cast<caf::actor>(current_sender());
    auto seq = x.get_as<uint64_t>(1);
    auto& vs = *static_cast<value_batch*>(x.get_mutable(2));
    auto l = find_link(q.id());
    bool live = l != nullptr && seq == l->grant_seq && seq != 0;
    if (live) l->grant = std::max<int64_t>(0, l->grant - static_cast<int64_t>(vs.size()));
    // The await that asked, or one relying on the live grant (values only: an empty answer
    // belongs to the await that asked). Values of an ended grant go back (see q_value).
    if (parked_ != nullptr &&
        (is_parked(seq) || (live && !vs.empty() && parked_->takes_from(q.id()))))
      parked_->on_values(q, vs);
    else
      stash(q, seq, vs);
    return true;
  }
  if (tag == q_fail_atom::value && x.match_elements<caf::atom_value, uint64_t, caf::error>()) {
    auto qid = current_sender() ? current_sender()->id() : caf::actor_id{0};
    auto seq = x.get_as<uint64_t>(1);
    auto l = find_link(qid);
    bool live = l != nullptr && l->grant_seq == seq && seq != 0;
    if (live) l->grant = 0; // a failed wait ends the grant at the queue too
    // Only the await that asked, or one relying on that very grant: an older answer is stale.
    if (parked_ != nullptr && (is_parked(seq) || (live && parked_->takes_from(qid))))
      parked_->on_fail(*static_cast<caf::error*>(x.get_mutable(2)));
    return true;
  }
  if (tag == q_revoke_atom::value && x.match_elements<caf::atom_value, caf::actor_id>()) {
    // A queue closed: the credits this task holds are void. Every value it posted with them
    // is ahead of this answer in the queue's mailbox.
    int64_t unused = 0;
    flush_posts(); // what was sent with the credits goes first
    if (auto l = find_link(x.get_as<caf::actor_id>(1))) unused = std::exchange(l->credits, 0);
    make_response_promise().deliver(unused);
    return true;
  }
  if (tag == q_held_atom::value && x.match_elements<caf::atom_value, caf::actor_id>()) {
    // A queue counts the values it handed over against its capacity: say what is left.
    int64_t n = 0;
    uint64_t consumed = 0;
    if (auto l = find_link(x.get_as<caf::actor_id>(1))) {
      n = static_cast<int64_t>(l->buffered.size());
      consumed = l->consumed;
      if (n > 0) l->report_empty = true;
    }
    make_response_promise().deliver(consumed, n);
    return true;
  }
  if (tag == done_atom::value && x.size() == 1) {
    drain_child_done();
    return true;
  }
  if (tag == report_atom::value &&
      x.match_elements<caf::atom_value, uint64_t, uint64_t, caf::actor_id, outcome_box>()) {
    on_report(x.get_as<uint64_t>(1), x.get_as<uint64_t>(2), x.get_as<caf::actor_id>(3),
              outcome_box{x.get_as<outcome_box>(4)});
    return true;
  }
  return false;
}

bool task_actor::failed_first(const child_entry& e) noexcept {
  return e.await_state && e.await_state->load(std::memory_order_acquire) == await_failed;
}

bool task_actor::failed_child_pending() const noexcept {
  for (auto& kvp : cold_->children)
    if (failed_first(kvp.second)) return true;
  return false;
}

void task_actor::forget_child(caf::actor_id id) {
  if (!cold_) return;
  auto i = cold_->children.find(id);
  if (i == cold_->children.end()) return;
  // A scope's child that failed before anything took it (an await that began later, a
  // cancel of the ended child): its end notice, still to come, fails the scope.
  if (failed_first(i->second)) {
    i->second.awaited = true;
    return;
  }
  cold_->children.erase(i);
  if (phase_ == phase::finishing && cold_->join_mode.how == cancel_mode::kind::wait &&
      --cold_->joining == 0)
    complete();
}

void task_actor::on_cancel(cancel_mode mode) {
  mode = mode.normalized(); // it may come from another node
  auto rp = make_response_promise();
  if (phase_ == phase::finishing && cold_ && cold_->join_mode.how == cancel_mode::kind::wait) {
    // A joining scope whose body has returned: a cancel reaches the children it waits for.
    if (mode.is_graceful()) {
      for (auto& kvp : cold_->children)
        cancel_child(kvp.second, mode);
      rp.deliver(true);
      return;
    }
    if (mode.releases()) release_on_done_ = true;
    if (!outcome_.err)
      outcome_ = {nullptr, make_error(errc::cancelled, "", "scope " + id_ + " was cancelled")};
    stopped_by_cancel_ = true;
    // (A join with a grace: its children keep the grace.)
    auto stop = mode.how == cancel_mode::kind::join && mode.grace_ns > 0
                    ? cancel_mode::graceful(mode.grace_ns)
                    : cancel_mode::force();
    for (auto& kvp : cold_->children)
      cancel_child(kvp.second, stop);
    cold_->cancellers.push_back(rp);
    return;
  }
  if (mode.is_graceful()) {
    rp.deliver(phase_ == phase::running);
    if (phase_ != phase::running) return;
    if ((lane_start_ || child_key_ != 0) && !started_)
      stop_body(); // a job still queued on its lane: no body code has run, none will
    else
      request_graceful(mode.grace_ns);
    return;
  }
  if (mode.releases()) release_on_done_ = true;
  if (phase_ == phase::done) {
    rp.deliver(false);
    if (release_on_done_) maybe_quit();
  } else {
    cold().cancellers.push_back(rp);
    if (phase_ == phase::finishing && mode.how != cancel_mode::kind::wait &&
        cold_->join_mode.how == cancel_mode::kind::join && cold_->join_mode.grace_ns > 0 &&
        !(mode.how == cancel_mode::kind::join && mode.grace_ns > 0)) {
      // Joining its children with a grace, and now told to stop: they are forced too (the
      // joins in flight and those still to come).
      cold_->join_mode = cancel_mode::join();
      for (auto& a : cold_->grace_joins)
        send_cancel(a, cancel_mode::force());
      cold_->grace_joins.clear();
    }
    if (phase_ != phase::running || mode.how == cancel_mode::kind::wait) return;
    // A join with a grace (its owner is under a graceful cancel): asked as a graceful
    // cancel is, answered when it has ended.
    if (mode.how == cancel_mode::kind::join && mode.grace_ns > 0 &&
        !((lane_start_ || child_key_ != 0) && !started_))
      request_graceful(mode.grace_ns);
    else
      stop_body();
  }
}

cancel_mode task_actor::children_stop_mode(bool joining) const noexcept {
  // Under a bounded graceful cancel (not forced yet): the children keep what is left of the
  // grace this task got.
  if (cancel_requested_ && !stopped_by_cancel_ && cold_ &&
      cold_->force_due != clock::time_point{} && cold_->force_due != clock::time_point::max()) {
    auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(cold_->force_due -
                                                                      env_->clock->now())
                    .count();
    if (left > 0) return joining ? cancel_mode::join(left) : cancel_mode::graceful(left);
  }
  return joining ? cancel_mode::join() : cancel_mode::force();
}

void task_actor::on_force_due(uint64_t gen) {
  if (cold_ && gen == cold_->force_gen && phase_ == phase::running) {
    cold_->force_timer = 0;
    stop_body();
  }
}

void task_actor::on_timer(uint64_t seq) {
  if (is_parked(seq)) {
    if (yield_pending_) {
      // A yield's message in the activation that sent it: the body yielded while CAF was
      // activating this actor (its first run starts there), and CAF handles one message
      // after that. Once more, behind whatever came meanwhile; this activation ends now.
      caf::anon_send(caf::actor_cast<caf::actor>(this), timer_atom::value, seq);
      return;
    }
    parked_timer_ = 0;
    if (parked_->on_timeout()) resume_parked();
  }
}

namespace {

enum class own_result { not_ours, consumed, terminated };

/// A mailbox visitor that offers each ordinary message to `Own` (troupe's protocol) first
/// and hands the rest to CAF's own visitor.
template <class Own>
struct own_first_visitor {
  Own& own;
  caf::scheduled_actor::mailbox_visitor caf_visitor;

  caf::intrusive::task_result operator()(size_t n, caf::scheduled_actor::upstream_queue& q,
                                         caf::mailbox_element& x) {
    return caf_visitor(n, q, x);
  }
  caf::intrusive::task_result
  operator()(size_t n, caf::scheduled_actor::downstream_queue& q, caf::stream_slot slot,
             caf::policy::downstream_messages::nested_queue_type& nq, caf::mailbox_element& x) {
    return caf_visitor(n, q, slot, nq, x);
  }
  template <class Queue>
  caf::intrusive::task_result operator()(size_t n, Queue& q, caf::mailbox_element& x) {
    switch (own(x)) {
      case own_result::consumed:
        return ++caf_visitor.handled_msgs < caf_visitor.max_throughput
                   ? caf::intrusive::task_result::resume
                   : caf::intrusive::task_result::stop_all;
      case own_result::terminated:
        return caf::intrusive::task_result::stop;
      default:
        return caf_visitor(n, q, x);
    }
  }
};

} // namespace

void task_actor::launch(caf::execution_unit* eu, bool lazy, bool hide) {
  // scheduled_actor::launch of CAF 0.17.6, step for step, without CAF_PUSH_AID_FROM_PTR
  // (see the declaration). A task actor is never detached; should one be, CAF's own runs.
  if (getf(is_detached_flag)) {
    caf::event_based_actor::launch(eu, lazy, hide);
    return;
  }
  if (!hide) register_at_system();
  // Spawned with lazy_init: not scheduled until its first message (its mailbox blocked).
  if (lazy && mailbox().try_block()) return;
  // The scheduler holds a reference while the actor waits to run.
  intrusive_ptr_add_ref(ctrl());
  eu->exec_later(this);
}

caf::resumable::resume_result task_actor::resume(caf::execution_unit* ctx, size_t max_throughput) {
  // CAF's activation handles up to max_throughput messages, a yield's own message among
  // them, so a yield would let nothing else run. Here an activation takes one message per
  // round and ends after one that yielded: the scheduler then puts the task behind the work
  // it has queued (resume_later). Awaiting_message or done hand the actor back to the
  // scheduler (another thread may run it at once), so nothing is touched after those.
  //
  // The loop is CAF's own activation (scheduled_actor::resume) without what a task never
  // uses: a task opens no streams (CAF reads the clock after every round to advance them)
  // and its behavior has no receive timeout; CAF's logger is quiet in this build (its
  // per-activation actor-id push reads two thread-locals). Measured: the clock read alone
  // was 5% of `channel_pingpong`.
  //
  // troupe's own protocol (an atom first: channel hand-overs, await wake-ups, timers, starts)
  // goes to dispatch() straight away. CAF would first categorize the message, try the
  // behavior's one case, then call the default handler through a std::function and build a
  // result to discard. So does the reply to the parked await's own request (a request to a
  // local actor; see request_awaiter), without the response handler CAF would register,
  // allocate and look up per request. Anything else, and anything while CAF awaits a
  // response, takes CAF's own path.
  //
  // A body that put a behavior of its own on top or opened a CAF stream through the escape
  // hatch (`cx.self()`) gets CAF's own activation from then on: its receive timeouts are
  // re-armed, its streams advanced, its behavior sees a message before troupe's protocol.
  yield_pending_ = false;
  // The census changes of this activation are counted here and applied at its end.
  census_scope census{env_->census};
  if (!activate(ctx)) return caf::resumable::done;
  if (!started_ && !lane_start_ && (start_keys_.load(std::memory_order_acquire) & key_spawner) != 0) {
    // A deferred child started with no message (start_pending_children): it starts now,
    // ahead of the messages sent after the start. A forced cancel that came first has
    // finished it: its body never runs. (A first activation starts it in make_behavior
    // instead; this one is for a child activated before, by a message that came before its
    // start: a graceful cancel sent right after the spawn, tested in task_cancel_test.)
    started_ = true;
    if (phase_ == phase::running) {
      try {
        start();
      } catch (...) {
        auto eptr = std::current_exception();
        quit(exception_handler_ ? exception_handler_(this, eptr)
                                : caf::make_error(caf::sec::runtime_error));
        finalize();
        return caf::resumable::done;
      }
      if (finalize()) return caf::resumable::done;
    }
  }
  auto plain = [this] {
    return stream_managers_.empty() && pending_stream_managers_.empty() && !bhvr_stack_.empty() &&
           bhvr_stack_.back().as_behavior_impl() == task_behavior().as_behavior_impl();
  };
  if (!plain()) {
    for (size_t n = 1;; ++n) {
      auto r = caf::event_based_actor::resume(ctx, 1);
      if (r != caf::resumable::resume_later) return r;
      if (yield_pending_ || n >= max_throughput) return caf::resumable::resume_later;
    }
  }
  size_t handled = 0;
  auto own = [this](caf::mailbox_element& x) -> own_result {
    if (!awaited_responses_.empty()) return own_result::not_ours;
    bool response = x.mid.is_response();
    if (response) {
      // The reply to the parked await's own request (a request_awaiter to a local actor);
      // any other response is CAF's (a handler registered with `request().then`).
      if (parked_ == nullptr) return own_result::not_ours;
    } else {
      auto& c = x.content();
      if (c.empty() || !c.match_element<caf::atom_value>(0)) return own_result::not_ours;
    }
    current_mailbox_element(&x);
    try {
      // Untouched when not taken: CAF's path answers it (or drops a stale response).
      if (!(response ? parked_->on_response(x) : dispatch(x))) return own_result::not_ours;
    } catch (...) {
      // As CAF's activation does: the exception handler's error ends the actor.
      auto eptr = std::current_exception();
      auto err = exception_handler_ ? exception_handler_(this, eptr)
                                    : caf::make_error(caf::sec::runtime_error);
      if (x.mid.is_request()) make_response_promise().deliver(err);
      quit(std::move(err));
      finalize();
      return own_result::terminated;
    }
    bhvr_stack_.cleanup();
    return finalize() ? own_result::terminated : own_result::consumed;
  };
  for (;;) {
    own_first_visitor<decltype(own)> f{own, {this, handled, handled + 1}}; // one per round
    if (!mailbox().new_round(3, f).consumed_items && mailbox().try_block())
      return caf::resumable::awaiting_message;
    if (finalize()) return caf::resumable::done;
    if (yield_pending_ || handled >= max_throughput || !plain()) break;
  }
  if (mailbox().try_block()) return caf::resumable::awaiting_message;
  return caf::resumable::resume_later;
}

void task_actor::on_report(uint64_t key, uint64_t index, caf::actor_id child, outcome_box box) {
  if (key == child_done_notice) {
    on_child_done(child, std::move(box.err), index == 1);
    return;
  }
  forget_child(child);
  if (!cold_ || phase_ != phase::running) return;
  if (auto i = cold_->collectors.find(key); i != cold_->collectors.end())
    i->second->on_report(index, std::move(box));
}

void task_actor::on_child_done(caf::actor_id child, caf::error err, bool raised) {
  // A scope's child announces its end itself: finished children leave the nursery without
  // a join round-trip (a handle the body holds keeps such a child alive for its await).
  if (!cold_) return;
  auto i = cold_->children.find(child);
  if (i == cold_->children.end()) return; // awaited and taken already, or being joined
  bool failed = err && !is_cancellation(err);
  if (phase_ == phase::running) {
    // The await in flight takes it (its reply forgets the child) -- unless the child failed
    // before that await began (`raised`: it stopped its siblings already): then, as if the
    // body had not reached the await, the scope fails with it.
    if (i->second.awaited && !raised) return;
    cold_->children.erase(i);
    // A scope fails with the first failure of a child its body is not awaiting.
    if (failed && cold_->fail_fast) finish({nullptr, std::move(err)});
    return;
  }
  if (phase_ != phase::finishing || cold_->join_mode.how != cancel_mode::kind::wait) return;
  // Draining after the body returned (a joining scope): count the children down; the first
  // failure still fails the scope and stops the others.
  cold_->children.erase(i);
  if (failed && !outcome_.err) {
    outcome_ = {nullptr, std::move(err)};
    auto stop = children_stop_mode(false);
    for (auto& kvp : cold_->children)
      cancel_child(kvp.second, stop);
  }
  if (--cold_->joining == 0) complete();
}

void task_actor::start() {
  if (!runner_) return; // ended before it started
  // Admitted and running: the lane counted it so (a job from a ticket keeps its lane to give
  // back a permit its body never took).
  if (cold_ && lane_start_) cold_->lane = nullptr;
  if (auto err = runner_->create(cx_)) {
    finish({nullptr, std::move(err)});
    return;
  }
  {
    running_body mark{this};
    runner_->handle().resume();
  }
  after_resume();
}

void task_actor::after_resume() {
  bool done = phase_ == phase::running && runner_ && runner_->handle().done();
  // A body that returns stops the jobs it did not await (finish), unless its task joins
  // them (a joining scope, a fail-fast group): those jobs get no go, so one its lane has
  // admitted already (its tickets go out every 256, see spawn_ticket) is withdrawn, not
  // spawned to be cancelled. The tickets still go out first: their lane counts them.
  if (done && !pending_tickets_.empty() && !(cold_ && (cold_->join_on_return || cold_->fail_fast))) {
    pending_tickets_.clear();
    flush_tickets();
  }
  if (!pending_starts_.empty() || !pending_tickets_.empty()) start_pending_children();
  if (done) finish(runner_->take_outcome());
}

void task_actor::start_pending_children() {
  // Tickets first, so a job that a child started here (or a job task started here)
  // submits queues behind them, as if they had gone out at once. The held tickets are the
  // last of pending_tickets_: they get their go before they go out (a lane that admits one
  // then spawns its task at once); the ones sent earlier in this run get it after, since a
  // lane may have admitted them already and their go starts their tasks.
  size_t held = cold_ ? std::min(cold_->tickets.size(), pending_tickets_.size()) : 0;
  size_t sent = pending_tickets_.size() - held;
  for (size_t i = sent; i < pending_tickets_.size(); ++i)
    ticket_go(pending_tickets_[i]);
  if (cold_ && !cold_->tickets.empty()) flush_tickets();
  for (size_t i = 0; i < sent; ++i)
    ticket_go(pending_tickets_[i]);
  pending_tickets_.clear();
  if (!pending_starts_.empty()) note_home();
  for (auto& p : pending_starts_) {
    if (p.lane_started) {
      turn_spawner_key(p.task);
      continue;
    }
    // An idle child (its mailbox blocked and empty, as from its lazy spawn on) is started
    // with no message: unblocked, its spawner key turned, and scheduled as a message to it
    // would schedule it; its activation sees the key and starts the body (see resume). Only
    // this thread can schedule it between the unblock and the key (a message sent
    // meanwhile finds the mailbox open and schedules nothing), and what comes after the
    // unblock was sent after the start. A child with messages waiting (a cancel sent
    // before now) or running gets `start_atom` behind them, so they still come first.
    auto* t = static_cast<task_actor*>(caf::actor_cast<caf::abstract_actor*>(p.task));
    if (t->mailbox().try_unblock()) {
      t->start_keys_.fetch_or(key_spawner, std::memory_order_release);
      intrusive_ptr_add_ref(t->ctrl()); // the scheduler's reference, as CAF's enqueue takes
      if (auto* eu = context())
        eu->exec_later(t);
      else
        home_system().scheduler().enqueue(t);
    } else {
      send(p.task, start_atom::value);
    }
  }
  pending_starts_.clear();
}

void task_actor::turn_spawner_key(const caf::actor& a) {
  auto* t = static_cast<task_actor*>(caf::actor_cast<caf::abstract_actor*>(a));
  if (t->start_keys_.fetch_or(key_spawner, std::memory_order_acq_rel) & key_lane)
    caf::anon_send(a, start_atom::value); // its grant came first: it waits for this
}

void task_actor::resume_parked() {
  auto a = unpark();
  if (parked_timer_ != 0) env_->clock->cancel(std::exchange(parked_timer_, 0));
  running_body mark{this};
  a->waiting_.resume();
  after_resume();
}

void task_actor::stop_body() {
  stopped_by_cancel_ = true;
  finish({nullptr, make_error(errc::cancelled, "", "task " + id_ + " was cancelled")});
}

std::optional<int64_t> task_actor::grace_left() const noexcept {
  if (!cancel_requested_ || !cold_ || cold_->force_due == clock::time_point{}) return std::nullopt;
  if (cold_->force_due == clock::time_point::max()) return cancel_mode::unbounded;
  auto left = cold_->force_due - env_->clock->now();
  return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(left).count());
}

void task_actor::request_graceful(int64_t grace_ns) {
  if (grace_ns < 0) grace_ns = 0;
  if (!cancel_requested_) cancel_signal_ = true;
  cancel_requested_ = true;
  auto& c = cold();
  auto due = grace_ns == cancel_mode::unbounded
                 ? clock::time_point::max()
                 : env_->clock->now() + std::chrono::nanoseconds{grace_ns};
  if (grace_ns == cancel_mode::unbounded) {
    // No force timer: whoever asked forces the stop itself (a supervisor kills).
    if (c.force_timer == 0) c.force_due = due;
  } else if (c.force_timer == 0 || due < c.force_due) {
    if (c.force_timer != 0) env_->clock->cancel(c.force_timer);
    c.force_due = due;
    ++c.force_gen;
    c.force_timer = env_->clock->schedule(due, caf::actor_cast<caf::actor>(this),
                                          caf::make_message(force_atom::value, c.force_gen));
  }
  // Children get the same deadline (and keep it when this body ends first: finish joins
  // them with what is left of it).
  for (auto& kvp : c.children)
    cancel_child(kvp.second, cancel_mode::graceful(grace_ns));
  // A body waiting in a structured call stays there: the call's children clean up within
  // the same grace, and the call throws once they have ended (structured_call).
  if (parked_ != nullptr && cancel_signal_ && structured_depth_ == 0) {
    cancel_signal_ = false;
    parked_->cancelled_ = true;
    parked_->on_abandon(this);
    resume_parked();
  }
}

void task_actor::flag_cancel(const caf::actor& a, cancel_mode mode) noexcept {
  if (!a || mode.how == cancel_mode::kind::wait) return;
  if (auto* t = dynamic_cast<task_actor*>(caf::actor_cast<caf::abstract_actor*>(a)))
    t->cancel_flag_.store(true, std::memory_order_release);
}

void task_actor::send_cancel(const caf::actor& a, cancel_mode mode) noexcept {
  flag_cancel(a, mode);
  caf::anon_send(a, cancel_atom::value, mode);
}

namespace {

std::atomic<group_raised_hook> group_raised{nullptr};

} // namespace

void set_group_raised_hook(group_raised_hook hook) noexcept {
  group_raised.store(hook, std::memory_order_release);
}

void task_actor::watch_remote(const caf::actor_addr& dest, uint64_t seq,
                              std::function<void(caf::error)> fail) {
  auto& c = cold();
  if (c.remote_dest) end_remote_watch();
  if (c.remote_seq == 0) // the first remote request of this task (await seqs start at 1)
    set_down_handler([](caf::scheduled_actor* ptr, caf::down_msg& dm) {
      auto* self = static_cast<task_actor*>(ptr);
      auto& cc = self->cold();
      if (!cc.remote_dest || dm.source != cc.remote_dest) return;
      auto fail = std::move(cc.remote_fail);
      cc.remote_fail = nullptr;
      cc.remote_dest = caf::actor_addr{};
      if (fail)
        fail(make_error(errc::node_down, "actor",
                        "the requested actor's node went down or its connection broke (" +
                            to_string(dm.reason) + ")"));
    });
  c.remote_dest = dest;
  c.remote_seq = seq;
  c.remote_fail = std::move(fail);
  monitor(dest);
}

void task_actor::end_remote_watch() noexcept {
  auto& c = *cold_;
  demonitor(c.remote_dest);
  c.remote_dest = caf::actor_addr{};
  c.remote_fail = nullptr;
}

void task_actor::raise_group() noexcept {
  // Unless a scope's body is awaiting this child already: then the failure is that await's
  // value, and the first of the two decides.
  if (!siblings_failed_ || raised_group_ || cancel_requested_ || stopped_by_cancel_) return;
  uint8_t open = await_open;
  if (await_state_ &&
      !await_state_->compare_exchange_strong(open, await_failed, std::memory_order_acq_rel))
    return;
  raised_group_ = true;
  siblings_failed_->store(true, std::memory_order_seq_cst);
  if (auto* hook = group_raised.load(std::memory_order_acquire)) hook();
}

void task_actor::finish(outcome_box out) {
  phase_ = phase::finishing;
  // A failure of its own (not a cancel) stops its fail-fast siblings at once (a body that
  // threw did so already, from its promise).
  if (out.err && !is_cancellation(out.err)) raise_group();
  if (std::exchange(live_counted_, false)) env_->census.change(wait_census::live, -1);
  uncount_lane_wait();
  withdraw_from_lane();
  give_back_grant();
  flush_posts();
  outcome_ = std::move(out);
  if (auto a = unpark()) a->on_abandon(this);
  if (parked_timer_ != 0) env_->clock->cancel(std::exchange(parked_timer_, 0));
  if (cold_ && cold_->force_timer != 0) env_->clock->cancel(std::exchange(cold_->force_timer, 0));
  // Destroying the frame runs the RAII cleanup of a cancelled body and releases every
  // handle it held. A body stopped inside a structured call keeps its frame until the
  // call's children have been joined (complete): they may see its locals by reference.
  if (structured_depth_ == 0) {
    // The frame goes now; the body's captures once the children are joined (complete).
    if (has_children())
      runner_->destroy();
    else
      drop_body(runner_);
    release_links();
  }
  if (!has_children()) {
    complete();
    return;
  }
  // Structured: children this body did not await are stopped and joined before the
  // outcome is reported.
  // At most join_window joins are in flight: no burst of enqueues from this actor, however
  // many children it has (a burst is what collapses CAF's work-stealing scheduler).
  auto& c = *cold_;
  if (c.join_on_return && !outcome_.err && !stopped_by_cancel_) {
    // A joining scope: its children announce their end (on_child_done); wait for that.
    c.join_mode = cancel_mode::wait();
    c.joining = c.children.size();
    return;
  }
  if (c.fail_fast && (!outcome_.err || !is_cancellation(outcome_.err)) &&
      failed_child_pending()) {
    // A child failed before the body returned (or threw), its end notice still on its way:
    // the failure came first, so it fails the scope. The others are stopped, and the scope
    // waits for every end notice (the failed child's carries its error: it raised the
    // group, which only a failure does) as a joining scope does. A body's own error came
    // second: it gives way.
    if (outcome_.err) outcome_ = outcome_box{};
    c.join_mode = cancel_mode::wait();
    c.joining = c.children.size();
    auto stop = children_stop_mode(false);
    for (auto& kvp : c.children)
      if (!failed_first(kvp.second)) cancel_child(kvp.second, stop);
    return;
  }
  // Joined: stopped now, or, under a graceful cancel, with what is left of its grace -- not
  // when the frame is kept for a structured call's children (finish within the call): its
  // locks and handles go only after them, so they are stopped now.
  c.join_mode = structured_depth_ > 0 ? cancel_mode::join() : children_stop_mode(true);
  c.to_join.reserve(c.children.size());
  for (auto& kvp : c.children) {
    auto& e = kvp.second;
    if (e.cell && e.cell->ended()) continue; // an ended child: nothing to join
    if (e.ticket) { // a job whose task may not exist: withdrawn, or joined as any child
      caf::actor running;
      if (!ticket_stop(e.ticket, running,
                       make_error(errc::cancelled, "", "job " + e.ticket->info.id + " was cancelled")) &&
          running)
        c.to_join.push_back(std::move(running));
      continue;
    }
    c.to_join.push_back(std::move(e.actor));
  }
  c.children.clear();
  if (c.join_mode.grace_ns > 0) c.grace_joins = c.to_join;
  c.joining = c.to_join.size();
  if (c.joining == 0) {
    complete();
    return;
  }
  for (size_t i = 0; i < join_window && !c.to_join.empty(); ++i)
    join_next();
}

void task_actor::join_next() {
  auto& c = *cold_;
  if (c.to_join.empty()) return;
  auto child = std::move(c.to_join.back());
  c.to_join.pop_back();
  auto joined = [this] {
    if (--cold_->joining == 0) {
      cold_->to_join.shrink_to_fit();
      std::vector<caf::actor>{}.swap(cold_->grace_joins);
      complete();
    } else {
      join_next();
    }
  };
  flag_cancel(child, cold_->join_mode);
  std::move(request(child, caf::infinite, cancel_atom::value, cold_->join_mode))
      .then([joined](bool) { joined(); }, [joined](caf::error&) { joined(); });
}

void task_actor::deliver_result(caf::response_promise& rp) {
  if (consumed_) {
    rp.deliver(make_error(errc::already_awaited, "handle",
                          "task " + id_ + " was awaited before; a result is handed out once"));
    return;
  }
  consumed_ = true;
  // Always as a value: an error reply is what a request to an actor that has exited answers
  // (`request_receiver_down`: the task is gone), so a failure delivered as an error reply
  // with that very code would read as a cancellation.
  rp.deliver(std::move(outcome_));
}

bool task_actor::hold_end() {
  if (exiting_ || phase_ == phase::done) return false;
  ++cold().end_holds;
  return true;
}

void task_actor::release_end() {
  if (!cold_ || cold_->end_holds == 0) return;
  if (--cold_->end_holds == 0 && std::exchange(cold_->end_deferred, false)) complete();
}

void task_actor::complete() {
  if (cold_ && cold_->end_holds > 0) {
    cold_->end_deferred = true; // release_end completes it
    return;
  }
  if (structured_depth_ > 0) { // the frame kept for the call's children (finish)
    drop_body(runner_);         // (its structured_call closes)
    release_links();
  } else {
    drop_body(runner_); // the captures, kept while the children were joined (finish)
  }
  phase_ = phase::done;
  if (branch_) {
    // A branch hands its outcome to the combinator that started it, then is done.
    if (!release_on_done_)
      if (auto p = caf::actor_cast<caf::actor>(parent_))
        send(p, report_atom::value, uint64_t{collector_}, uint64_t{index_},
             caf::abstract_actor::id(), std::move(outcome_));
    consumed_ = true;
  } else {
    auto notice_err = notify_parent_ ? outcome_.err : caf::error{};
    if (!consumed_ && cell_ && !supervised_) {
      // The outcome goes to the handle's cell and the actor exits: a registered await is
      // woken by one message; a later one takes it from there without any. Published
      // before the end notice below, so a scope that sees the notice finds the cell ready.
      consumed_ = true;
      if (cell_->publish(std::move(outcome_)))
        if (auto w = caf::actor_cast<caf::actor>(cell_->waiter))
          send(w, await_done_atom::value, cell_->waiter_seq);
    }
    // A scope's child tells the scope it has ended, and how: on the scope's list of ended
    // children, one done_atom per burst of ends. (The scope may take the notice before an
    // await_done sent above: either order gives the same result, see took_child and
    // on_child_done. The parent of a child with notify_parent_ is always the task_actor
    // that spawned it: spawn_special, spawn_ticket.)
    if (notify_parent_)
      if (auto p = caf::actor_cast<caf::actor>(parent_)) {
        auto* scope = static_cast<task_actor*>(caf::actor_cast<caf::abstract_actor*>(p));
        if (scope->post_child_done(report_key(), raised_group_, std::move(notice_err)))
          wake_scope(scope, p);
      }
  }
  leave_ticket(); // after the outcome is out: until then a cancel still finds this task
  release_held_grant(); // the lane's next job: after the outcome is out
  if (cold_ && cold_->slot) {
    consumed_ = true;
    cold_->slot->fill(std::move(outcome_));
  }
  if (cold_) {
    for (auto& rp : cold_->awaiters)
      deliver_result(rp);
    cold_->awaiters.clear();
  }
  if (cold_) {
    for (auto& rp : cold_->cancellers)
      rp.deliver(stopped_by_cancel_);
    cold_->cancellers.clear();
  }
  if (supervised_) {
    // The outcome is the exit reason: a failure fails the child, a cancellation is a
    // shutdown (a clean end), a value a normal exit. Nobody awaits the result.
    if (outcome_.err)
      exit_reason_ = is_cancellation(outcome_.err) ? caf::error{caf::exit_reason::user_shutdown}
                                                   : outcome_.err;
    consumed_ = true;
  }
  if (consumed_ || release_on_done_) maybe_quit();
}

void task_actor::on_exit() {
  // Any termination path (also a kill from plain CAF code or the runtime's last resort):
  // nobody waiting on this task may hang.
  exiting_ = true;
  if (std::exchange(live_counted_, false)) env_->census.change(wait_census::live, -1);
  uncount_lane_wait();
  withdraw_from_lane();
  give_back_grant();
  leave_ticket();
  release_held_grant();
  flush_posts();
  if (phase_ != phase::done) {
    if (auto a = unpark()) a->on_abandon(this);
    if (parked_timer_ != 0) env_->clock->cancel(std::exchange(parked_timer_, 0));
    if (cold_ && cold_->force_timer != 0) env_->clock->cancel(std::exchange(cold_->force_timer, 0));
    drop_body(runner_);
    release_links();
    auto err = make_error(errc::cancelled, "", "task " + id_ + " was terminated");
    if (cold_ && cold_->slot) cold_->slot->fill({nullptr, err});
    if (cell_ && !consumed_ && !supervised_) {
      consumed_ = true;
      if (cell_->publish({nullptr, err}))
        if (auto w = caf::actor_cast<caf::actor>(cell_->waiter))
          caf::anon_send(w, await_done_atom::value, cell_->waiter_seq);
    }
    if (cold_) {
      for (auto& rp : cold_->awaiters)
        rp.deliver(err);
      for (auto& rp : cold_->cancellers)
        rp.deliver(true);
      for (auto& kvp : cold_->children)
        cancel_child(kvp.second, cancel_mode::join());
      for (auto& a : cold_->to_join)
        send_cancel(a, cancel_mode::join());
    }
    // Whoever owns this task must learn that it ended, even outside the protocol.
    if (auto p = caf::actor_cast<caf::actor>(parent_)) {
      if (branch_)
        caf::anon_send(p, report_atom::value, uint64_t{collector_}, uint64_t{index_},
                       caf::abstract_actor::id(), outcome_box{nullptr, err});
      else if (notify_parent_)
        caf::anon_send(p, report_atom::value, child_done_notice, uint64_t{raised_group_ ? 1u : 0u},
                       report_key(), outcome_box{nullptr, err});
    }
  }
  cold_.reset();
}

} // namespace troupe::detail
