#include <algorithm>
#include <deque>
#include <optional>
#include <unordered_map>
#include <vector>

#include <caf/all.hpp>

#include "primitive_actors.hpp"
#include "troupe/messages/errc.hpp"

namespace troupe::detail {

namespace {

using namespace troupe::atoms;

/// Flags of q_send / q_recv / q_offer.
constexpr uint8_t flag_wait = 1;    // park while it cannot be served (receive, offer)
constexpr uint8_t flag_credit = 1;  // the sender takes credits (send)
constexpr uint8_t flag_bounded = 2; // a timeout or deadline ends the wait anyway

size_t hash_of(const caf::message& m) {
  if (m.empty()) return 0;
  auto t = m.type(m.size() - 1); // the value is the last element
  if (t.second == nullptr) return t.first;
  // hash_code() hashes the type's name: remember the last one.
  thread_local const std::type_info* last = nullptr;
  thread_local size_t last_key = 0;
  if (t.second != last) {
    last = t.second;
    last_key = t.second->hash_code();
  }
  return last_key;
}

/// A channel or a mailbox: a bounded FIFO of values (each a one-element message holding a
/// `boxed<T>`), with parked senders (backpressure), parked receivers and select cases.
///
/// Credits: a task's send answered while there is room also grants it credits (room
/// reserved for it), which it spends on one-way `q_post`s. `buffered + outstanding credits
/// <= capacity` always holds. Closing revokes the credits (each holder answers with what it
/// did not use; its posts are ahead of that answer); a holder that ends returns them.
class queue_actor final : public caf::event_based_actor {
 public:
  queue_actor(caf::actor_config& cfg, queue_config qc)
      : caf::event_based_actor(cfg), cfg_(std::move(qc)) {
    window_ = std::min<int64_t>(cfg_.capacity / 4, 512);
  }

  const char* name() const override { return cfg_.mailbox ? "troupe.mailbox" : "troupe.channel"; }

  caf::behavior make_behavior() override {
    // Posts `(q_post, boxed<T>)` carry any type: they bypass the typed behavior and are
    // stored as they came (no copy, no second allocation).
    set_default_handler(
        [](caf::scheduled_actor* ptr, caf::message_view& mv) -> caf::result<caf::message> {
          auto& x = mv.content();
          if (x.size() == 2 && x.match_element<caf::atom_value>(0) &&
              x.get_as<caf::atom_value>(0) == q_post_atom::value) {
            static_cast<queue_actor*>(ptr)->on_post(mv.move_content_to_message());
            return caf::delegated<caf::message>{}; // one-way: no answer
          }
          return caf::sec::unexpected_message;
        });
    set_down_handler([this](caf::down_msg& dm) {
      // A credit holder ended: its posts arrived before this notice; the rest is void.
      if (auto i = credits_.find(dm.source.id()); i != credits_.end()) {
        outstanding_ -= i->second;
        credits_.erase(i);
        holders_.erase(dm.source.id());
      }
      serve();
    });
    return {
        [this](q_send_atom, uint64_t seq, caf::message& v, uint8_t flags) -> caf::result<int64_t> {
          if (closed_) {
            ++failed_;
            return closed_error();
          }
          if (cfg_.type_hash != 0 && hash_of(v) != cfg_.type_hash) {
            ++failed_;
            return make_error(errc::wrong_type, "value",
                              "channel \"" + cfg_.name + "\" carries " + cfg_.type_name);
          }
          auto who = sender_addr();
          if (senders_.empty() && room() > 0) {
            push(std::move(v));
            auto g = (flags & flag_credit) ? grant(who) : 0;
            serve();
            return g;
          }
          auto rp = make_response_promise<int64_t>();
          senders_.push_back(sender_wait{who, seq, rp, std::move(v), (flags & flag_credit) != 0,
                                         (flags & flag_bounded) != 0});
          settle();
          return rp;
        },
        [this](q_recv_atom, uint64_t seq, uint64_t max, size_t type, uint8_t flags) {
          // The receiver is parked with an empty local buffer. It grants `max` values: they
          // go to it as they come (a standing grant), each without a new request.
          if (max == 0) max = 1;
          auto to = caf::actor_cast<caf::actor>(current_sender());
          for (auto i = takers_.begin(); i != takers_.end(); ++i) {
            if (!i->offer && i->who == to) { // its earlier grant: replaced by this one
              takers_.erase(i);
              break;
            }
          }
          if (!buf_.empty() && takers_.empty() && !reserved_) {
            if (type != 0 && hash_of(buf_.front()) != type) {
              send(to, q_fail_atom::value, seq, wrong_type_at_head());
              return;
            }
            auto out = take(max, type);
            auto left = max - out.size();
            send(to, q_values_atom::value, seq, std::move(out));
            if (left > 0 && (flags & flag_wait) != 0)
              takers_.push_back(
                  taker{false, std::move(to), seq, left, type, 0, (flags & flag_bounded) != 0});
            serve(); // room for a waiting sender
            return;
          }
          if (drained()) {
            send(to, q_fail_atom::value, seq, closed_error());
            return;
          }
          if ((flags & flag_wait) == 0) {
            send(to, q_values_atom::value, seq, std::vector<caf::message>{});
            return;
          }
          takers_.push_back(
              taker{false, std::move(to), seq, max, type, 0, (flags & flag_bounded) != 0});
          settle();
        },
        [this](q_offer_atom, uint64_t seq, uint64_t index, uint8_t flags) {
          settle_guard guard{this};
          auto to = caf::actor_cast<caf::actor>(current_sender());
          auto who = caf::actor_cast<caf::actor_addr>(to);
          if (!buf_.empty() && takers_.empty() && !reserved_) {
            if (cfg_.type_hash != 0 && hash_of(buf_.front()) != cfg_.type_hash) {
              send(to, q_ready_atom::value, seq, index, uint8_t{select_wrong_type});
              return;
            }
            reserved_ = std::make_pair(who, seq);
            send(to, q_ready_atom::value, seq, index, uint8_t{select_ready});
            return;
          }
          if (drained()) {
            send(to, q_ready_atom::value, seq, index, uint8_t{select_closed});
            return;
          }
          if ((flags & flag_wait) == 0) {
            send(to, q_ready_atom::value, seq, index, uint8_t{select_empty});
            return;
          }
          takers_.push_back(
              taker{true, std::move(to), seq, 1, 0, index, (flags & flag_bounded) != 0});
        },
        [this](q_take_atom, uint64_t seq) -> std::vector<caf::message> {
          settle_guard guard{this};
          std::vector<caf::message> out;
          if (reserved_ && reserved_->first == sender_addr() && reserved_->second == seq) {
            reserved_.reset();
            out.push_back(std::move(buf_.front()));
            buf_.pop_front();
            ++received_;
            serve();
          }
          return out;
        },
        [this](q_withdraw_atom, uint64_t seq) { withdraw(sender_addr(), seq); },
        [this](q_posts_atom, std::vector<caf::message>& values) {
          auto n = static_cast<int64_t>(values.size());
          if (auto i = credits_.find(current_sender()->id()); i != credits_.end()) {
            auto k = std::min(n, i->second);
            i->second -= k;
            outstanding_ -= k;
          }
          for (auto& v : values)
            push(std::move(v));
          serve();
        },
        [this](q_return_atom, int64_t unused,
               std::vector<caf::message>& values) -> caf::result<bool> {
          auto who = sender_addr();
          bool answer = current_mailbox_element()->mid.is_request();
          // The task has ended: its standing grant is void.
          for (auto i = takers_.begin(); i != takers_.end();) {
            if (!i->offer && i->who.address() == who)
              i = takers_.erase(i);
            else
              ++i;
          }
          if (auto i = credits_.find(who.id()); i != credits_.end()) {
            auto n = std::min(unused, i->second);
            i->second -= n;
            outstanding_ -= n;
          }
          // Taken but not consumed: back to the front, in their order.
          received_ -= std::min<uint64_t>(received_, values.size());
          buf_.insert(buf_.begin(), std::make_move_iterator(values.begin()),
                      std::make_move_iterator(values.end()));
          serve();
          if (answer) return true; // the task waits for this before it goes
          return caf::delegated<bool>{};
        },
        [this](q_close_atom) -> bool {
          if (closed_) return false;
          closed_ = true;
          for (auto& s : senders_) {
            ++failed_;
            s.rp.deliver(closed_error());
          }
          senders_.clear();
          for (auto& kvp : credits_) {
            if (kvp.second <= 0) continue;
            auto id = kvp.first;
            auto holder = caf::actor_cast<caf::actor>(holders_[id]);
            if (!holder) continue;
            request(holder, caf::infinite, q_revoke_atom::value, caf::abstract_actor::id())
                .then(
                    [this, id](int64_t unused) {
                      if (auto i = credits_.find(id); i != credits_.end()) {
                        auto n = std::min(unused, i->second);
                        i->second -= n;
                        outstanding_ -= n;
                      }
                      serve();
                    },
                    [this, id](caf::error&) {
                      if (auto i = credits_.find(id); i != credits_.end()) {
                        outstanding_ -= i->second;
                        i->second = 0;
                      }
                      serve();
                    });
          }
          serve();
          return true;
        },
        [this](q_metrics_atom) {
          settle_guard guard{this};
          queue_metrics m;
          m.name = cfg_.name;
          m.depth = static_cast<int64_t>(buf_.size());
          m.capacity = cfg_.capacity;
          m.sent = sent_;
          m.received = received_;
          m.failed_sends = failed_;
          m.closed = closed_;
          m.waiting_senders = senders_.size();
          m.waiting_receivers = takers_.size();
          return m;
        },
        [this](deadlock_atom) {
          settle_guard guard{this};
          // Every live task is stuck: fail the waits that nothing else will end.
          auto err = make_error(errc::deadlock, cfg_.mailbox ? "mailbox" : "channel",
                                "every live task waits on a channel operation no other task "
                                "can complete (\"" +
                                    cfg_.name + "\")");
          std::deque<taker> keep;
          for (auto& t : takers_) {
            if (t.bounded) {
              keep.push_back(std::move(t));
            } else if (t.offer) {
              send(t.who, q_ready_atom::value, t.seq, t.index, uint8_t{select_deadlock});
            } else {
              send(t.who, q_fail_atom::value, t.seq, err);
            }
          }
          takers_ = std::move(keep);
          std::deque<sender_wait> keep_s;
          for (auto& s : senders_) {
            if (s.bounded)
              keep_s.push_back(std::move(s));
            else
              s.rp.deliver(err);
          }
          senders_ = std::move(keep_s);
        },
    };
  }

 private:
  caf::actor_addr sender_addr() { return caf::actor_cast<caf::actor_addr>(current_sender()); }

  struct taker {
    bool offer; // a select case (answered with q_ready) or a receive (q_values / q_fail)
    caf::actor who;
    uint64_t seq;
    uint64_t max;
    size_t type;
    uint64_t index;
    bool bounded;
  };
  struct sender_wait {
    caf::actor_addr who;
    uint64_t seq;
    caf::response_promise rp;
    caf::message value;
    bool wants_credit;
    bool bounded;
  };

  caf::error closed_error() const {
    return cfg_.mailbox ? make_error(errc::mailbox_closed, "mailbox",
                                     "mailbox \"" + cfg_.name + "\" is closed")
                        : make_error(errc::channel_closed, "channel",
                                     "channel \"" + cfg_.name + "\" is closed");
  }

  caf::error wrong_type_at_head() const {
    return make_error(errc::wrong_type, "value",
                      "the next value in \"" + cfg_.name + "\" is of another type");
  }

  [[nodiscard]] int64_t room() const noexcept {
    return cfg_.capacity - static_cast<int64_t>(buf_.size()) - outstanding_;
  }

  /// Closed, nothing buffered, and no credited post can still arrive.
  [[nodiscard]] bool drained() const noexcept {
    return closed_ && buf_.empty() && outstanding_ <= 0 && !reserved_;
  }

  void push(caf::message v) {
    buf_.push_back(std::move(v));
    ++sent_;
  }

  void on_post(caf::message v) {
    if (auto i = credits_.find(current_sender()->id()); i != credits_.end() && i->second > 0) {
      --i->second;
      --outstanding_;
    }
    push(std::move(v));
    serve();
  }

  int64_t grant(const caf::actor_addr& who) {
    if (closed_ || window_ <= 0) return 0;
    auto g = std::min(window_, room());
    if (g <= 0) return 0;
    auto id = who.id();
    auto [i, fresh] = credits_.emplace(id, 0);
    if (fresh) {
      holders_[id] = who;
      monitor(who);
    }
    i->second += g;
    outstanding_ += g;
    return g;
  }

  std::vector<caf::message> take(uint64_t max, size_t type) {
    std::vector<caf::message> out;
    auto n = std::min<size_t>(max, buf_.size());
    out.reserve(n);
    while (out.size() < n && (type == 0 || hash_of(buf_.front()) == type)) {
      out.push_back(std::move(buf_.front()));
      buf_.pop_front();
    }
    received_ += out.size();
    return out;
  }

  void withdraw(const caf::actor_addr& who, uint64_t seq) {
    auto gone = make_error(errc::cancelled, "", "the wait was withdrawn");
    for (auto i = takers_.begin(); i != takers_.end(); ++i) {
      if (i->who.address() == who && i->seq == seq) {
        takers_.erase(i);
        break;
      }
    }
    for (auto i = senders_.begin(); i != senders_.end(); ++i) {
      if (i->who == who && i->seq == seq) {
        i->rp.deliver(gone);
        senders_.erase(i);
        break;
      }
    }
    if (reserved_ && reserved_->first == who && reserved_->second == seq) reserved_.reset();
    serve();
  }

  /// Moves values from parked senders into the buffer and from the buffer to parked
  /// takers until neither can progress; fails the takers once closed and drained.
  ///
  /// Values for receivers are handed over only when this actor's mailbox is empty: under
  /// load, the values of a burst of sends go out in one message per receiver; alone, a
  /// value goes at once. Every handler ends in serve() or settle(), so a deferred hand-over
  /// happens at the latest after the last message of a burst.
  void serve() {
    for (bool progress = true; progress;) {
      progress = false;
      while (!senders_.empty() && !closed_ && room() > 0) {
        auto s = std::move(senders_.front());
        senders_.pop_front();
        push(std::move(s.value));
        s.rp.deliver(s.wants_credit ? grant(s.who) : int64_t{0});
        progress = true;
      }
      if (!buf_.empty() && !reserved_ && !takers_.empty() && !mailbox().empty()) {
        deferred_ = true; // more messages to handle first: hand over a batch later
        break;
      }
      deferred_ = false;
      while (!buf_.empty() && !reserved_ && !takers_.empty()) {
        auto t = std::move(takers_.front());
        takers_.pop_front();
        progress = true;
        auto want = t.offer ? cfg_.type_hash : t.type;
        if (want != 0 && hash_of(buf_.front()) != want) {
          if (t.offer)
            send(t.who, q_ready_atom::value, t.seq, t.index, uint8_t{select_wrong_type});
          else
            send(t.who, q_fail_atom::value, t.seq, wrong_type_at_head());
          continue;
        }
        if (t.offer) {
          reserved_ = std::make_pair(t.who.address(), t.seq);
          send(t.who, q_ready_atom::value, t.seq, t.index, uint8_t{select_ready});
        } else {
          auto out = take(t.max, t.type);
          t.max -= out.size();
          send(t.who, q_values_atom::value, t.seq, std::move(out));
          if (t.max > 0) takers_.push_back(std::move(t)); // the grant stands, behind the others
        }
      }
    }
    if (drained() && !takers_.empty()) {
      auto err = closed_error();
      for (auto& t : takers_) {
        if (t.offer)
          send(t.who, q_ready_atom::value, t.seq, t.index, uint8_t{select_closed});
        else
          send(t.who, q_fail_atom::value, t.seq, err);
      }
      takers_.clear();
    }
  }

  /// Ends a handler that did not call serve(): hands over what a burst deferred.
  void settle() {
    if (deferred_) serve();
  }

  struct settle_guard {
    queue_actor* self;
    ~settle_guard() { self->settle(); }
  };

  bool deferred_ = false;
  queue_config cfg_;
  int64_t window_ = 0;
  std::deque<caf::message> buf_;
  std::deque<taker> takers_;
  std::deque<sender_wait> senders_;
  std::unordered_map<caf::actor_id, int64_t> credits_;
  std::unordered_map<caf::actor_id, caf::actor_addr> holders_;
  int64_t outstanding_ = 0;
  bool closed_ = false;
  /// The head value, reserved for a select that has not taken it yet.
  std::optional<std::pair<caf::actor_addr, uint64_t>> reserved_;
  uint64_t sent_ = 0;
  uint64_t received_ = 0;
  uint64_t failed_ = 0;
};

} // namespace

caf::actor spawn_queue(caf::actor_system& sys, queue_config cfg) {
  return sys.spawn<queue_actor>(std::move(cfg));
}

} // namespace troupe::detail
