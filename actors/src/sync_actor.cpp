#include <algorithm>
#include <deque>
#include <unordered_map>
#include <unordered_set>

#include <caf/all.hpp>

#include "lock_graph.hpp"
#include "troupe/actors/detail/recycler.hpp"
#include "troupe/actors/detail/spin_lock.hpp"
#include "troupe/actors/detail/test_hooks.hpp"
#include "troupe/actors/context.hpp"
#include "primitive_actors.hpp"
#include "troupe/messages/atoms.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/interfaces.hpp"

namespace troupe::detail {

namespace {

using namespace troupe::atoms;

std::atomic<ticket_granted_hook> ticket_granted{nullptr};

double ms_between(clock::time_point a, clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

/// A FIFO, weighted permit pool: the one engine behind mutex (1 permit, not reentrant),
/// rwlock (readers take 1, a writer takes all), semaphore (weighted) and gate (1 each).
/// Strict FIFO: a waiter at the head that does not fit blocks those behind it, so a writer
/// or a heavy acquirer is never starved.
class sync_actor final : public sync_actor_type::base {
 public:
  sync_actor(caf::actor_config& cfg, sync_config sc)
      : sync_actor_type::base(cfg), cfg_(std::move(sc)) {
    metrics_.kind = cfg_.kind;
    metrics_.key = cfg_.key;
    name_ = std::string{to_string(cfg_.kind)} + " \"" + cfg_.key + "\"";
  }

  const char* name() const override { return "troupe.sync"; }

  /// A job task gives back its lane's grant of its ticket here, on its own thread (see
  /// release_lane_grant): the release, and the admission (and spawn) of the tickets at the
  /// head of the queue it makes room for, without a message and the lane's turn. Answers
  /// false, having done nothing, when the lane must do it in its turn: not a lane, the
  /// permit not a ticket's grant (its holder is watched), a drain waiting, the lane ended,
  /// or this thread inside a lane's turn already (an actor destroyed there: no lock is
  /// taken inside another, so two lanes never wait on each other).
  bool release_here(uint64_t id) {
    if (!cfg_.forget_idle || tl_holding != nullptr) return false;
    holder_guard g{this, true};
    if (exited_ || !drained_.empty()) return false;
    if (auto* h = ticket_hold_of(id)) {
      release_ticket(*h, true);
    } else {
      auto i = holders_.find(id);
      if (i == holders_.end() || i->second.who) return false;
      release(id);
    }
    // A head that is not a ticket: the lane's turn grants it (a release of nothing pumps).
    if (!pump(true))
      caf::anon_send(caf::actor_cast<caf::actor>(this), sy_release_atom::value, uint64_t{0});
    return true; // the tickets granted are admitted as `g` lets the lock go
  }

  behavior_type make_behavior() override {
    set_down_handler([this](caf::down_msg& dm) {
      auto g = hold();
      // A holder ended without releasing (a crash): its permits come back.
      monitored_.erase(dm.source.id());
      // The common case -- a task that released everything and waits for nothing -- costs a
      // lookup, not a scan (a lane sees one of these per job).
      if (count_of(holds_, dm.source) == 0 && count_of(waits_, dm.source) == 0) return;
      reserved_.erase(dm.source.id());
      claims_.erase(dm.source.id());
      // A reservation granted before its acquire came, and the acquire never came (a job
      // task under a deadline stopped before its body ran): never used, so no admission.
      if (auto g = early_.find(dm.source.id()); g != early_.end()) {
        auto id = g->second;
        early_.erase(g);
        ++metrics_.cancellations;
        unuse(id);
      }
      std::vector<uint64_t> ids;
      for (auto& kvp : holders_)
        if (kvp.second.who == dm.source) ids.push_back(kvp.first);
      for (auto id : ids)
        release(id);
      for (auto i = waiters_.begin(); i != waiters_.end();) {
        if (i->who == dm.source) {
          if (i->timer != 0) cfg_.clock->cancel(i->timer);
          ++metrics_.cancellations;
          count(waits_, i->who, -1);
          i = waiters_.erase(i);
        } else {
          ++i;
        }
      }
      pump();
    });
    return {
        [this](sy_acquire_atom, uint64_t seq, int64_t units, bool bounded,
               int64_t timeout_ns) -> caf::result<uint64_t> {
          auto g = hold();
          if (units < 1 || units > cfg_.capacity)
            return make_error(errc::permits_exceed_capacity, "permits",
                              std::to_string(units) + " permits asked of " +
                                  std::string{to_string(cfg_.kind)} + " \"" + cfg_.key +
                                  "\" with capacity " + std::to_string(cfg_.capacity));
          auto who = sender_addr();
          if (closed_)
            return make_error(errc::cancelled, "lane",
                              "\"" + cfg_.key + "\" is closed: the runtime is stopping");
          if (cfg_.kind == sync_kind::mutex) {
            for (auto& kvp : holders_)
              if (kvp.second.who == who)
                return make_error(errc::reentrant_acquire, "key",
                                  "this task already holds mutex \"" + cfg_.key + "\"");
          }
          // A reservation (sy_reserve) made for this actor: claim it.
          if (auto g = early_.find(who.id()); g != early_.end()) {
            auto id = g->second;
            early_.erase(g);
            if (auto h = holders_.find(id); h != holders_.end()) {
              h->second.seq = seq;
              return id;
            }
          }
          // Its reservation still queued: the grant goes to this acquire when it comes up.
          if (reserved_.count(who.id()) > 0) {
            auto rp = make_response_promise<uint64_t>();
            claims_[who.id()] = claim{seq, rp};
            reserved_.erase(who.id());
            return rp;
          }
          auto now = cfg_.clock->now();
          if (queue_empty() && units <= available()) return grant(who, seq, units, now, now);
          if (timeout_ns == 0) { // try-acquire: answer at once
            ++metrics_.timeouts;
            return uint64_t{0};
          }
          // It must wait. Permits it holds here that, with those it asks, exceed the
          // capacity can never come together: a same-task upgrade (a reader asking for the
          // write lock) without a timeout fails at once instead of waiting on itself.
          bool untimed = timeout_ns < 0 && !bounded;
          if (auto mine = untimed ? units_of(who) : 0; mine > 0 && mine + units > cfg_.capacity)
            return make_error(errc::reentrant_acquire, "key",
                              "this task holds " + std::to_string(mine) + " of " +
                                  describe() + " and asks for " + std::to_string(units) +
                                  " more: with capacity " + std::to_string(cfg_.capacity) +
                                  " that can never be granted");
          if (untimed && cfg_.graph) {
            extra_units_ = units;
            if (auto cycle = cfg_.graph->publish(id(), name_, state_of(&who), who.id())) {
              published_ = true;
              refresh(); // the key as it is, without the refused waiter
              std::string keys;
              for (auto& k : *cycle)
                keys += (keys.empty() ? "" : " -> ") + k;
              return make_error(errc::deadlock, "key",
                                "a wait-for cycle among tasks: " + keys + " -> " + cycle->front() +
                                    " (this acquire would close it, so it fails instead)");
            }
            published_ = true;
          }
          auto rp = make_response_promise<uint64_t>();
          waiter w{who, seq, units, rp, now, 0, ++next_waiter_, false, untimed, false};
          if (timeout_ns > 0)
            w.timer = cfg_.clock->schedule(now + std::chrono::nanoseconds{timeout_ns},
                                           caf::actor_cast<caf::actor>(this),
                                           caf::make_message(sy_timeout_atom::value, w.wid));
          count(waits_, who, +1);
          waiters_.push_back(std::move(w));
          watch(who);
          metrics_.max_queue_depth = std::max(metrics_.max_queue_depth, queue_depth());
          return rp;
        },
        [this](sy_release_atom, uint64_t id) -> caf::result<bool> {
          auto g = hold();
          auto ok = release(id);
          pump();
          answer_drained(); // a drain a job's thread found settled (see release)
          // A task's release is a one-way message (one per job on a lane): answered only
          // when asked, so CAF builds no reply to drop. `delegated` says none is due.
          auto* x = current_mailbox_element();
          if (x == nullptr || !x->mid.is_request()) return caf::delegated<bool>{};
          return ok;
        },
        [this](sy_withdraw_atom, uint64_t seq) {
          auto g = hold();
          auto who = sender_addr();
          // A claimed reservation: the acquirer gives up its place (and its claim).
          if (auto c = claims_.find(who.id()); c != claims_.end() && c->second.seq == seq) {
            c->second.rp.deliver(make_error(errc::cancelled, "", "the acquirer was cancelled"));
            claims_.erase(c);
            for (auto i = waiters_.begin(); i != waiters_.end(); ++i)
              if (i->who == who && i->reserved) {
                ++metrics_.cancellations;
                count(waits_, i->who, -1);
                waiters_.erase(i);
                break;
              }
            pump();
            return;
          }
          bool found = false;
          for (auto i = waiters_.begin(); i != waiters_.end(); ++i) {
            if (i->who == who && i->seq == seq) {
              if (i->timer != 0) cfg_.clock->cancel(i->timer);
              ++metrics_.cancellations;
              if (!i->reserved && !i->starts) // a reservation has no promise
                i->rp.deliver(make_error(errc::cancelled, "", "the acquirer was cancelled"));
              count(waits_, i->who, -1);
              waiters_.erase(i);
              found = true;
              break;
            }
          }
          // Granted just before the acquirer gave up: the grant is on its way to a wait that
          // no longer exists; release it here (the task's release of it will find nothing).
          // Never used, it was no admission: it counts as a withdrawal only.
          if (!found) {
            for (auto& kvp : holders_) {
              if (kvp.second.who == who && kvp.second.seq == seq) {
                unuse(kvp.first);
                ++metrics_.cancellations;
                found = true;
                break;
              }
            }
          }
          // (A job task's withdrawal always finds its reservation or grant: the spawner
          // sent the reservation before anything could stop the task.)
          pump();
        },
        [this](sy_timeout_atom, uint64_t wid) {
          auto g = hold();
          for (auto i = waiters_.begin(); i != waiters_.end(); ++i) {
            if (i->wid == wid) {
              ++metrics_.timeouts;
              metrics_.total_wait_ms += ms_between(i->since, turn_now());
              i->rp.deliver(uint64_t{0});
              count(waits_, i->who, -1);
              waiters_.erase(i);
              break;
            }
          }
          pump();
        },
        [this](sy_reserve_atom, caf::actor_addr who, bool start) {
          auto g = hold();
          if (!who) return; // there is nobody
          if (closed_) { // its acquire will be refused (an idle job task starts to meet it)
            if (start) start_job(who, 0);
            return;
          }
          waiter w{who, 0, 1, caf::response_promise{}, turn_now(), 0, ++next_waiter_, true,
                   false, start};
          if (!start) reserved_.insert(who.id());
          count(waits_, who, +1);
          waiters_.push_back(std::move(w));
          watch(who);
          pump();
          // Counted once it waits: admitted at once, it never queued.
          metrics_.max_queue_depth = std::max(metrics_.max_queue_depth, queue_depth());
        },
        [this](sy_ticket_atom, job_ticket_batch& batch) {
          // The batch came at one instant: one clock read for its tickets' waits, not one
          // each (100k queued at once read the clock 100k times).
          auto now = cfg_.clock->now();
          auto g = hold();
          for (auto& t : batch.tickets)
            if (t) queue_ticket(std::move(t), now);
        },
        [this](sy_ticket_gone_atom, job_ticket_ref& ref, uint64_t permit) {
          auto g = hold();
          // Withdrawn by a cancel before its task existed: admitted with `permit` (the grant
          // goes back unused), or still queued (it leaves the queue at its turn).
          auto& t = ref.ticket;
          if (!t) {
            // A job task that held `permit` and ended before its body ran, its ticket gone
            // already (its owner ended): the permit comes back unused, a withdrawal.
            if (permit != 0) {
              ++metrics_.cancellations;
              unuse(permit);
              pump();
            }
            return;
          }
          ++metrics_.cancellations;
          if (permit != 0) {
            unuse(permit);
            pump();
          } else if (t->arrived && !t->popped_gone && !closed_) {
            // Still in the queue: the depth no longer counts it. (Not arrived yet: its
            // submitter sends its tickets when its body suspends and a cancel at once; it
            // is dropped as it arrives, never counted.)
            t->gone_noted = true;
            ++gone_in_queue_;
          }
        },
        [this](sy_close_atom) -> uint64_t {
          auto g = hold();
          closed_ = true;
          uint64_t n = 0;
          // Both queues in their common order (by wid).
          auto ti = tickets_.begin();
          auto wi = waiters_.begin();
          while (ti != tickets_.end() || wi != waiters_.end()) {
            if (ti != tickets_.end() && (wi == waiters_.end() || ti->wid < wi->wid)) {
              // No task yet: the job fails as its acquire would have.
              caf::actor running;
              ti->ticket->popped_gone = true;
              if (ticket_stop(ti->ticket, running, closed_error(), true)) {
                ++metrics_.cancellations;
                ++n;
              }
              ++ti;
              continue;
            }
            auto& w = *wi++;
            if (w.timer != 0) cfg_.clock->cancel(w.timer);
            ++metrics_.cancellations;
            ++n;
            if (w.starts)
              start_job(w.who, 0);
            else if (!w.reserved)
              w.rp.deliver(make_error(errc::cancelled, "lane",
                                      "\"" + cfg_.key + "\" was closed: the runtime is stopping"));
          }
          for (auto& [id, cl] : claims_)
            cl.rp.deliver(make_error(errc::cancelled, "lane",
                                     "\"" + cfg_.key + "\" was closed: the runtime is stopping"));
          claims_.clear();
          reserved_.clear();
          waiters_.clear();
          tickets_.clear();
          gone_in_queue_ = 0;
          waits_.clear();
          refresh();
          return n;
        },
        [this](deadlock_atom) {
          auto g = hold();
          // The census found every live task stuck (channel and lock waits mixed): fail the
          // untimed waits here, as the channels fail theirs.
          auto err = make_error(errc::deadlock, "key",
                                "every live task waits on a channel or lock no other task can "
                                "release (" + describe() + ")");
          for (auto i = waiters_.begin(); i != waiters_.end();) {
            if (!i->untimed) {
              ++i;
              continue;
            }
            i->rp.deliver(err);
            ++metrics_.cancellations;
            count(waits_, i->who, -1);
            i = waiters_.erase(i);
          }
          pump();
        },
        [this](sy_drained_atom) -> caf::result<bool> {
          auto g = hold();
          if (held_units_ == 0) return true;
          auto rp = make_response_promise<bool>();
          drained_.push_back(rp);
          return rp;
        },
        [this](sy_metrics_atom) {
          auto g = hold();
          auto m = metrics_;
          m.queue_depth = queue_depth();
          m.held_now = cfg_.kind == sync_kind::semaphore
                           ? held_units_
                           : static_cast<int64_t>(holders_.size() + ticket_count_);
          return m;
        },
    };
  }

 private:
  caf::actor_addr sender_addr() { return caf::actor_cast<caf::actor_addr>(current_sender()); }

  struct holder {
    caf::actor_addr who;
    uint64_t seq; // of the acquire that got it
    int64_t units;
    clock::time_point since;
    /// The wait counted in `total_wait_ms` when it was granted.
    double wait_ms = 0;
  };
  /// The grants of tickets (a lane's jobs; see grant_ticket), not in `holders_`: a job's
  /// end gives its grant back on its own thread, usually not the one that granted it, and a
  /// map node made on one core and looked up and erased on the other cost three cache
  /// misses and an allocation per job. A slot is reused last-freed first, so a lane's few
  /// slots stay in one or two cache lines. A ticket's permit id is `ticket_permit_bit`,
  /// the grant's sequence number (38 bits) and the slot (24 bits): a stale id finds its
  /// slot holding another id, so it releases nothing, as with the map.
  struct ticket_hold {
    uint64_t id = 0; // 0: free
    int64_t units = 0;
    clock::time_point since;
    double wait_ms = 0;
  };
  static constexpr uint64_t ticket_permit_bit = uint64_t{1} << 62;
  static constexpr unsigned ticket_slot_bits = 24;
  static constexpr uint64_t ticket_slot_mask = (uint64_t{1} << ticket_slot_bits) - 1;
  struct waiter {
    caf::actor_addr who;
    uint64_t seq;
    int64_t units;
    caf::response_promise rp;
    clock::time_point since;
    clock::timer_id timer;
    uint64_t wid;
    /// Made by sy_reserve and not claimed yet: no acquire (and no promise) so far.
    bool reserved;
    /// No timeout and no deadline: a node of the wait-for graph (a timed wait ends anyway,
    /// so it is never a deadlock).
    bool untimed;
    /// A reservation whose grant starts the idle job task `who` (sy_reserve with start).
    bool starts = false;
  };
  /// A job queued as a ticket (`sy_ticket`): one permit, its grant admits it. In a queue of
  /// its own (`tickets_`), FIFO with `waiters_` by `wid`: a lane holds one per queued job
  /// (100k at once in a burst) and reads each once more, cold, at its grant, so a ticket's
  /// place is 32 bytes instead of a whole waiter's 120 (no promise, actor or timer).
  struct ticket_waiter {
    std::shared_ptr<job_ticket> ticket;
    clock::time_point since;
    uint64_t wid;
  };

  /// Queues one ticket of a `sy_ticket` batch (in its order, which came at `since`) and
  /// admits what fits.
  void queue_ticket(std::shared_ptr<job_ticket> t, clock::time_point since) {
    t->arrived = true;
    if (closed_) {
      caf::actor running;
      if (ticket_stop(t, running, closed_error(), true)) ++metrics_.cancellations;
      return;
    }
    // No lock: a withdrawal after this read is found at the ticket's admission (pump).
    if (t->state.load(std::memory_order_acquire) == job_ticket::withdrawn) {
      // Withdrawn before it got here (its submitter ended, a cancel in the submitter's
      // turn): it never queues, so the depth and its maximum never count it. Its
      // sy_ticket_gone counts the cancellation (it came first, before `arrived`, or comes
      // later and finds it out of the queue).
      t->popped_gone = true;
      return;
    }
    tickets_.push_back(ticket_waiter{std::move(t), since, ++next_waiter_});
    pump();
    // Counted once it waits: admitted at once, it never queued.
    metrics_.max_queue_depth = std::max(metrics_.max_queue_depth, queue_depth());
  }

  /// Takes back a grant nobody used (its acquirer gave up before it arrived): no
  /// acquisition, no release.
  void unuse(uint64_t id) {
    double waited = 0;
    if (auto* h = ticket_hold_of(id)) {
      waited = h->wait_ms;
    } else {
      auto i = holders_.find(id);
      if (i == holders_.end()) return;
      waited = i->second.wait_ms;
    }
    --metrics_.acquisitions;
    metrics_.total_wait_ms -= waited;
    release(id, false);
  }

  [[nodiscard]] bool queue_empty() const noexcept { return waiters_.empty() && tickets_.empty(); }
  /// The head of the queue (not empty) is a ticket: the older of the two queues' heads.
  [[nodiscard]] bool head_is_ticket() const noexcept {
    return !tickets_.empty() && (waiters_.empty() || tickets_.front().wid < waiters_.front().wid);
  }
  /// The permits the head of the queue (not empty) asks.
  [[nodiscard]] int64_t head_units() const noexcept {
    return head_is_ticket() ? 1 : waiters_.front().units;
  }

  /// Waiters in the queue that still wait (withdrawn tickets leave it at their turn).
  [[nodiscard]] int64_t queue_depth() const noexcept {
    return static_cast<int64_t>(waiters_.size() + tickets_.size()) - gone_in_queue_;
  }

  [[nodiscard]] caf::error closed_error() const {
    return make_error(errc::cancelled, "lane",
                      "\"" + cfg_.key + "\" was closed: the runtime is stopping");
  }

  /// Starts the idle job task `who` with no permit: the lane is closed, and its acquire
  /// meets the refusal.
  static void start_job(const caf::actor_addr& who, uint64_t id) {
    if (auto a = caf::actor_cast<caf::actor>(who)) caf::anon_send(a, start_atom::value, id);
  }

  void on_exit() override {
    auto g = hold();
    exited_ = true; // release_here leaves the rest to a message (which finds nobody)
    if (cfg_.graph && published_) cfg_.graph->forget(id());
    published_ = false;
  }

  /// The key as errors and the wait-for graph name it: `mutex "a"`.
  const std::string& describe() const { return name_; }

  /// Permits `who` holds here.
  int64_t units_of(const caf::actor_addr& who) const {
    if (count_of(holds_, who) == 0) return 0;
    int64_t n = 0;
    for (auto& kvp : holders_)
      if (kvp.second.who == who) n += kvp.second.units;
    return n;
  }

  /// The key for the wait-for graph, with `extra` as a last untimed waiter (one about to be
  /// queued).
  /// (Filled into a buffer kept between calls: no allocation once warm.)
  const lock_graph::key_state& state_of(const caf::actor_addr* extra) {
    auto& st = state_buf_;
    st.capacity = cfg_.capacity;
    st.holders.clear();
    st.waiters.clear();
    auto add = [&st](caf::actor_id who, int64_t units) {
      auto i = std::find_if(st.holders.begin(), st.holders.end(),
                            [who](auto& h) { return h.first == who; });
      if (i == st.holders.end())
        st.holders.emplace_back(who, units);
      else
        i->second += units;
    };
    for (auto& kvp : holders_)
      add(kvp.second.who.id(), kvp.second.units);
    if (ticket_units_ > 0) add(caf::actor_addr{}.id(), ticket_units_); // tickets hold as nobody
    for (auto& w : waiters_)
      if (w.untimed) st.waiters.emplace_back(w.who.id(), w.units);
    if (extra != nullptr) st.waiters.emplace_back(extra->id(), extra_units_);
    return st;
  }

  /// Brings the graph up to date: only while this key has (or just had) untimed waiters, so
  /// the uncontended path costs one branch.
  void refresh() {
    if (!cfg_.graph) return;
    if (!published_) {
      bool any = false;
      for (auto& w : waiters_)
        if (w.untimed) {
          any = true;
          break;
        }
      if (!any) return;
    }
    auto& st = state_of(nullptr);
    published_ = !st.waiters.empty();
    cfg_.graph->publish(id(), name_, st, 0);
  }

  [[nodiscard]] int64_t available() const noexcept { return cfg_.capacity - held_units_; }

  using counts = std::unordered_map<caf::actor_id, int64_t>;

  /// Adds `delta` to `who`'s count (dropping zeros).
  static void count(counts& xs, const caf::actor_addr& who, int64_t delta) {
    if (!who) return; // a ticket's grant: its task gives it back itself
    auto& n = xs[who.id()];
    n += delta;
    if (n <= 0) xs.erase(who.id());
  }
  static int64_t count_of(const counts& xs, const caf::actor_addr& who) {
    if (!who) return 0;
    auto i = xs.find(who.id());
    return i == xs.end() ? 0 : i->second;
  }

  /// Stops watching `who` once it holds and waits for nothing here (`forget_idle`: a lane),
  /// so a job that released costs no down message later.
  void forget_if_idle(const caf::actor_addr& who) {
    if (!cfg_.forget_idle || !who) return;
    if (count_of(holds_, who) != 0 || count_of(waits_, who) != 0) return;
    if (monitored_.erase(who.id()) > 0) demonitor(who);
  }

  void watch(const caf::actor_addr& who) {
    if (who && monitored_.insert(who.id()).second) monitor(who);
  }

  uint64_t grant(const caf::actor_addr& who, uint64_t seq, int64_t units, clock::time_point since,
                 clock::time_point now) {
    auto id = ++next_permit_;
    count(holds_, who, +1);
    auto waited = ms_between(since, now);
    holders_.emplace(id, holder{who, seq, units, now, waited});
    held_units_ += units;
    ++metrics_.acquisitions;
    metrics_.total_wait_ms += waited;
    watch(who);
    return id;
  }

  /// A grant that admits a ticket: held by nobody (the job's task gives it back itself), in
  /// a slot of `ticket_holds_` whose index the permit's id carries (see ticket_hold).
  uint64_t grant_ticket(int64_t units, clock::time_point since, clock::time_point now) {
    uint32_t slot;
    if (!ticket_free_.empty()) {
      slot = ticket_free_.back();
      ticket_free_.pop_back();
    } else if (ticket_holds_.size() < ticket_slot_mask + 1) {
      slot = static_cast<uint32_t>(ticket_holds_.size());
      ticket_holds_.emplace_back();
    } else { // 16M tickets running at once: the rest are held like any other grant
      return grant(caf::actor_addr{}, 0, units, since, now);
    }
    auto seq = ++next_permit_ & ((uint64_t{1} << (62 - ticket_slot_bits)) - 1);
    auto id = ticket_permit_bit | (seq << ticket_slot_bits) | slot;
    auto waited = ms_between(since, now);
    ticket_holds_[slot] = ticket_hold{id, units, now, waited};
    held_units_ += units;
    ticket_units_ += units;
    ++ticket_count_;
    ++metrics_.acquisitions;
    metrics_.total_wait_ms += waited;
    return id;
  }

  /// The ticket's grant `id` holds, or null (not a ticket's, or given back already).
  ticket_hold* ticket_hold_of(uint64_t id) noexcept {
    if ((id & ticket_permit_bit) == 0) return nullptr;
    auto slot = id & ticket_slot_mask;
    if (slot >= ticket_holds_.size() || ticket_holds_[slot].id != id) return nullptr;
    return &ticket_holds_[slot];
  }

  /// Releases permit `id`; `used`: it was taken into use (false: a grant its acquirer gave
  /// up before it arrived, counted as no release).
  bool release(uint64_t id, bool used = true) {
    if (auto* h = ticket_hold_of(id)) {
      release_ticket(*h, used);
      return true;
    }
    auto i = holders_.find(id);
    if (i == holders_.end()) return false;
    held_units_ -= i->second.units;
    count(holds_, i->second.who, -1);
    if (i->second.who)
      if (auto g = early_.find(i->second.who.id()); g != early_.end() && g->second == id)
        early_.erase(g);
    forget_if_idle(i->second.who);
    if (used) {
      ++metrics_.releases;
      metrics_.total_held_ms += ms_between(i->second.since, turn_now());
    }
    holders_.erase(i);
    after_release();
    return true;
  }

  /// Releases the ticket's grant `h` holds (see release).
  void release_ticket(ticket_hold& h, bool used) {
    held_units_ -= h.units;
    ticket_units_ -= h.units;
    --ticket_count_;
    if (used) {
      ++metrics_.releases;
      metrics_.total_held_ms += ms_between(h.since, turn_now());
    }
    ticket_free_.push_back(static_cast<uint32_t>(h.id & ticket_slot_mask));
    h.id = 0;
    after_release();
  }

  /// After a release: the drains waiting are answered once nothing is held.
  void after_release() {
    if (held_units_ == 0 && !drained_.empty()) {
      if (off_turn_) // a job's thread: a promise is answered in its actor's turn
        caf::anon_send(caf::actor_cast<caf::actor>(this), sy_release_atom::value, uint64_t{0});
      else
        answer_drained();
    }
  }

  /// Answers the drains waiting once no permit is held.
  void answer_drained() {
    if (held_units_ != 0 || drained_.empty()) return;
    for (auto& rp : drained_)
      rp.deliver(true);
    drained_.clear();
  }

  /// The clock, read at most once per message: a ticket's arrival, or a release, and the
  /// grants that follow share one read (a lane sees several messages per job). Every
  /// handler that reads it ends with `pump()`, which forgets the reading.
  clock::time_point turn_now() {
    if (!turn_now_) turn_now_ = cfg_.clock->now();
    return *turn_now_;
  }

  /// Grants the head of the queue while it fits. `tickets_only` (a job task releasing on its
  /// own thread, release_here): stops at a head that is not a ticket (its grant answers a
  /// promise or messages an actor: the lane's own turn does that) and answers false.
  bool pump(bool tickets_only = false) {
    struct forget {
      std::optional<clock::time_point>& t;
      ~forget() { t.reset(); }
    } forget_now{turn_now_};
    if (queue_empty() || head_units() > available()) {
      refresh();
      return true;
    }
    auto now = turn_now();
    while (!queue_empty()) {
      bool ticket = head_is_ticket();
      if ((ticket ? 1 : waiters_.front().units) > available()) break;
      if (ticket) { // the grant admits the ticket (its task spawned with it)
        auto tw = std::move(tickets_.front());
        tickets_.pop_front();
        auto& t = tw.ticket;
        // Out of the queue: a sy_ticket_gone still on its way no longer counts it there.
        t->popped_gone = true;
        if (t->gone_noted) { // withdrawn, and its sy_ticket_gone came: no grant
          --gone_in_queue_;
          continue;
        }
        // Admitted (its task spawned) once the lock is let go (see holder_guard): the spawn
        // is most of an admission's time, and a job ending on another thread would wait for
        // it to give its own grant back.
        admits_.emplace_back(std::move(t), grant_ticket(1, tw.since, now));
        continue;
      }
      if (tickets_only) return false;
      auto w = std::move(waiters_.front());
      waiters_.pop_front();
      count(waits_, w.who, -1);
      if (w.timer != 0) cfg_.clock->cancel(w.timer);
      if (cfg_.kind == sync_kind::mutex) {
        bool reentrant = false;
        for (auto& kvp : holders_)
          reentrant = reentrant || kvp.second.who == w.who;
        if (reentrant) {
          w.rp.deliver(make_error(errc::reentrant_acquire, "key",
                                  "this task already holds mutex \"" + cfg_.key + "\""));
          continue;
        }
      }
      if (w.starts) { // the grant starts the job's task, holding the permit
        auto a = caf::actor_cast<caf::actor>(w.who);
        if (!a) { // it ended while queued (its down message finds nothing left)
          ++metrics_.cancellations;
          continue;
        }
        caf::anon_send(a, start_atom::value, grant(w.who, 0, w.units, w.since, now));
        continue;
      }
      if (w.reserved) {
        if (auto c = claims_.find(w.who.id()); c != claims_.end()) { // its acquire came
          auto cl = std::move(c->second);
          claims_.erase(c);
          cl.rp.deliver(grant(w.who, cl.seq, w.units, w.since, now));
        } else { // granted before its acquire came: kept for it
          reserved_.erase(w.who.id());
          early_[w.who.id()] = grant(w.who, 0, w.units, w.since, now);
        }
        continue;
      }
      w.rp.deliver(grant(w.who, w.seq, w.units, w.since, now));
    }
    refresh();
    return true;
  }

  /// A lane's state is also changed by job tasks on their own threads (release_here): every
  /// handler of a lane holds this lock while it runs. Other kinds never take it.
  /// Tickets granted with their permits, in grant order.
  using admit_list = std::vector<std::pair<std::shared_ptr<job_ticket>, uint64_t>>;

  class holder_guard {
   public:
    /// `off_turn`: taken on a job's thread (release_here), not in the lane's turn. `admit`:
    /// admits the tickets granted meanwhile once the lock is let go (admit_granted).
    explicit holder_guard(sync_actor* self, bool off_turn = false, bool admit = true)
        : self_(self->cfg_.forget_idle ? self : nullptr), off_turn_(off_turn), admit_(admit) {
      if (self_ == nullptr) return;
      self_->lock_.lock();
      prev_ = std::exchange(tl_holding, self_);
      self_->off_turn_ = off_turn;
    }
    holder_guard(const holder_guard&) = delete;
    holder_guard& operator=(const holder_guard&) = delete;
    ~holder_guard() {
      if (self_ == nullptr) return;
      // The tickets granted under the lock are admitted without it (their buffer swapped
      // for this thread's spare one: no allocation once warm).
      admit_list xs;
      if (admit_ && !self_->admits_.empty()) {
        xs.swap(tl_spare_admits);
        xs.swap(self_->admits_);
      }
      self_->off_turn_ = false;
      tl_holding = prev_;
      self_->lock_.unlock();
      if (xs.empty()) return;
      self_->admit_granted(xs, off_turn_);
      xs.clear();
      tl_spare_admits.swap(xs);
    }

   private:
    sync_actor* self_;
    sync_actor* prev_ = nullptr;
    bool off_turn_;
    bool admit_;
  };
  holder_guard hold() { return holder_guard{this}; }
  /// Admits the tickets granted under the lock (spawns their tasks), in grant order, without
  /// the lock. A ticket withdrawn since its grant gives its permit back unused: under the
  /// lock again, the permit goes to the next waiters, and the tickets granted so join the
  /// end of `xs` (a loop, not a recursion: a long run of withdrawn tickets at the head of
  /// the queue costs no stack). Its sy_ticket_gone counts the cancellation (the ticket was
  /// out of the queue); a head that is not a ticket is granted by the lane's next turn.
  void admit_granted(admit_list& xs, bool off_turn) {
    auto hook = ticket_granted.load(std::memory_order_acquire);
    for (size_t i = 0; i < xs.size(); ++i) { // xs grows while this runs
      auto t = std::move(xs[i].first);
      auto id = xs[i].second;
      if (hook != nullptr) hook(t);
      if (ticket_admit(t, id)) continue;
      holder_guard g{this, off_turn, false};
      if (exited_) continue;
      unuse(id);
      if (!pump(true))
        caf::anon_send(caf::actor_cast<caf::actor>(this), sy_release_atom::value, uint64_t{0});
      for (auto& x : admits_)
        xs.push_back(std::move(x));
      admits_.clear();
    }
  }
  /// Tickets granted under the lock, admitted once it is let go (see holder_guard).
  admit_list admits_;
  static thread_local admit_list tl_spare_admits;
  /// The lock is held on a job's thread (release_here), not in the lane's turn: what must
  /// happen in the turn (answering a drain) goes by message.
  bool off_turn_ = false;
  /// The lane whose lock this thread holds (a release on it from inside goes by message).
  static thread_local sync_actor* tl_holding;
  spin_lock lock_;
  bool exited_ = false;

  sync_config cfg_;
  sync_metrics metrics_;
  std::optional<clock::time_point> turn_now_; // see turn_now()
  std::unordered_map<uint64_t, holder> holders_;
  std::vector<ticket_hold> ticket_holds_;
  std::vector<uint32_t> ticket_free_;
  int64_t ticket_units_ = 0;
  size_t ticket_count_ = 0;
  /// The queue, in two parts kept in one FIFO order by `wid`: acquires and reservations,
  /// and tickets (see ticket_waiter). From the recycler: a lane holds a ticket per queued
  /// job (100k at once in a burst), and the recycler gives such a burst 2 MB chunks instead
  /// of glibc's page-by-page growth.
  std::deque<waiter, recycler::allocator<waiter>> waiters_;
  std::deque<ticket_waiter, recycler::allocator<ticket_waiter>> tickets_;
  std::unordered_set<caf::actor_id> monitored_;
  /// Permits held and waits queued per actor: a down message finds in O(1) whether it
  /// concerns anything here.
  counts holds_;
  counts waits_;
  /// Reservations granted before their actor's acquire came: actor -> permit id.
  std::unordered_map<caf::actor_id, uint64_t> early_;
  /// Actors with a reservation queued and no acquire yet.
  std::unordered_set<caf::actor_id> reserved_;
  /// Acquires that claimed a reservation still queued: its grant goes to them.
  struct claim {
    uint64_t seq;
    caf::response_promise rp;
  };
  std::unordered_map<caf::actor_id, claim> claims_;
  int64_t held_units_ = 0;
  /// Withdrawn tickets still in `tickets_` whose `sy_ticket_gone` came.
  int64_t gone_in_queue_ = 0;
  /// Closed (sy_close): acquires are refused.
  bool closed_ = false;
  /// This key is in the wait-for graph (it has untimed waiters).
  bool published_ = false;
  /// `mutex "a"`: how errors and the graph name this key.
  std::string name_;
  lock_graph::key_state state_buf_;
  /// The permits the acquire being checked asks (state_of's `extra`).
  int64_t extra_units_ = 1;
  /// Waiting for no permit to be held (sy_drained).
  std::vector<caf::typed_response_promise<bool>> drained_;
  uint64_t next_permit_ = 0;
  uint64_t next_waiter_ = 0;
};

thread_local sync_actor* sync_actor::tl_holding = nullptr;
thread_local sync_actor::admit_list sync_actor::tl_spare_admits;

} // namespace

void set_ticket_granted_hook(ticket_granted_hook hook) noexcept {
  ticket_granted.store(hook, std::memory_order_release);
}

bool release_lane_grant(const caf::actor& lane, uint64_t id) {
  auto* a = caf::actor_cast<caf::abstract_actor*>(lane);
  return a != nullptr && static_cast<sync_actor*>(a)->release_here(id);
}

caf::actor spawn_sync(caf::actor_system& sys, sync_config cfg) {
  return caf::actor_cast<caf::actor>(sys.spawn<sync_actor>(std::move(cfg)));
}

} // namespace troupe::detail
