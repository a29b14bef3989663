#pragma once

// Internal: the awaiters behind channels and mailboxes (one queue protocol, see
// <troupe/messages/messaging.hpp>). They work on type-erased values: a one-element
// `caf::message` holding a `boxed<T>`.

#include <optional>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/message.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/messaging.hpp"

namespace troupe::detail {

/// A value in a channel or mailbox. Boxing lets any copyable or movable type travel in a
/// local CAF message without an `inspect` overload.
template <class T>
struct boxed {
  T value;
};

/// Returns the type key of values of `T` in a queue.
template <class T>
size_t type_key() noexcept {
  static const size_t key = typeid(boxed<T>).hash_code(); // hashes the name: once
  return key;
}

/// Returns the readable name of `T` for error messages.
template <class T>
std::string type_label() {
  return typeid(T).name();
}

/// Returns a queue value holding `x`: the post message itself, `(q_post, boxed<T>)`, so that
/// a credited send allocates one message and the queue stores it as it came.
template <class T>
caf::message box_value(T&& x) {
  return caf::make_message(atoms::q_post_atom::value, boxed<std::decay_t<T>>{std::forward<T>(x)});
}

/// Moves the `T` out of a queue value (its last element; the caller checked its type).
template <class T>
T unbox_value(caf::message& m) {
  return std::move(m.get_mutable_as<boxed<T>>(m.size() - 1).value);
}

/// Returns whether a queue value holds a `T`.
template <class T>
bool holds_value(const caf::message& m) {
  return !m.empty() && m.match_element<boxed<T>>(m.size() - 1);
}

/// Returns the type key of a queue value.
inline size_t value_key(const caf::message& m) {
  if (m.empty()) return 0;
  auto t = m.type(m.size() - 1);
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

using atoms::q_flag_bounded;
using atoms::q_flag_credit;
using atoms::q_flag_wait;

/// Sends one value: a one-way post while the task holds credits, else a request answered
/// once the value is buffered (that wait is the backpressure).
class queue_send_awaiter : public parked_awaiter {
 public:
  /// `q` is only read here: the task's link to the queue holds the handle from then on
  /// (no reference-count step per send; links live as long as the task).
  queue_send_awaiter(task_actor* self, const caf::actor& q, caf::message value,
                     caf::error pre = {})
      : parked_awaiter(self), l_(q ? &self->link(q) : nullptr), value_(std::move(value)),
        err_(std::move(pre)) {}

  bool await_ready() {
    if (check_cancelled() || err_) return true;
    if (l_ == nullptr) {
      err_ = make_error(errc::invalid_handle, "channel", "the handle is empty");
      return true;
    }
    auto& l = *l_;
    if (l.slot != nullptr && hand_over_directly(l)) return true;
    if (l.credits > 0) {
      --l.credits;
      box_now();
      self_->post(l.queue, std::move(value_), l.slot); // value_ is the whole post message
      return true;
    }
    return false;
  }

  void await_suspend(std::coroutine_handle<> h) {
    auto bounded = self_->deadline().has_value();
    if (!bounded) wait_kind_ = wait_kind::channel;
    seq_ = park(h);
    auto st = self_;
    auto seq = seq_;
    auto q = l_->queue;
    uint8_t flags = q_flag_credit | (bounded ? q_flag_bounded : 0);
    ++l_->sends_out;
    box_now();
    self_->request(q, caf::infinite, atoms::q_send_atom::value, seq_, std::move(value_), flags)
        .then(
            [st, seq, q](int64_t granted) {
              if (auto l = st->find_link(q.id()); l != nullptr && l->sends_out > 0) --l->sends_out;
              // Credits count even when the await was abandoned: the room is reserved.
              if (granted > 0) {
                if (auto l = st->find_link(q.id()); l != nullptr && st->body_running())
                  l->credits += granted;
                else
                  st->send(q, atoms::q_return_atom::value, granted, value_batch{}, false,
                           uint64_t{0});
              }
              if (st->is_parked(seq)) st->resume_parked();
            },
            [st, seq, q](caf::error& e) {
              if (auto l = st->find_link(q.id()); l != nullptr && l->sends_out > 0) --l->sends_out;
              if (!st->is_parked(seq)) return;
              static_cast<queue_send_awaiter*>(st->parked())->err_ = std::move(e);
              st->resume_parked();
            });
  }

  void on_abandon(task_actor* self) noexcept override {
    self->send(l_->queue, atoms::q_withdraw_atom::value, seq_);
  }

  caf::error take_error() {
    rethrow_if_cancelled();
    return std::move(err_);
  }

 private:
  /// A receiver waits and the queue is idle with room reserved for this (its slot is
  /// armed): the value goes to the receiver in one message, as if the queue had handed it
  /// over. Not when values this task sent earlier may still be on their way to the queue
  /// (FIFO: its unsent or unhandled posts, a send request not answered yet), and once per
  /// activation (a burst goes out in one post message instead). Posts to other queues go
  /// out first, as before any send to another queue: what the receiver does next may
  /// depend on them.
  bool hand_over_directly(queue_link& l) {
    auto* s = l.slot;
    if (l.last_direct == self_->parked_seq() || l.sends_out > 0 || self_->posting_to(l.queue) ||
        s->posts_in_flight.load(std::memory_order_acquire) != 0)
      return false;
    self_->flush_posts();
    std::unique_lock<slot_lock> guard{s->mtx, std::try_to_lock};
    if (!guard.owns_lock() || !s->armed || s->budget <= 0) return false;
    auto key = unboxed_ != nullptr ? unboxed_->key() : value_key(value_);
    if (s->type != 0 && key != s->type) return false; // the queue says why
    // Sent as the queue (the receiver knows its grants by queue), in claim order. The
    // message is made before the slot books the value: if making it throws (no memory, a
    // throwing move of the value), the slot is as it was and the send fails with it.
    auto from = caf::actor_cast<caf::strong_actor_ptr>(l.queue);
    auto vseq = s->next_seq + 1;
    auto msg = unboxed_ != nullptr
                   // `(q_value, seq, vseq, boxed<T>)`: the value and its message in one block
                   ? unboxed_->direct(*this, std::move(from), s->grant_seq, vseq)
                   : caf::make_mailbox_element(std::move(from), caf::make_message_id(), {},
                                               atoms::q_value_atom::value, s->grant_seq, vseq,
                                               std::move(value_));
    --s->budget;
    --s->grant_left;
    ++s->handed;
    s->next_seq = vseq;
    s->receiver->enqueue(std::move(msg), self_->context());
    unboxed_ = nullptr;
    l.last_direct = self_->parked_seq();
    return true;
  }

 protected:
  /// What a typed send (typed_send_awaiter) holds in place of `value_`: its value, not boxed
  /// yet. A direct hand-over puts it straight into the receiver's mailbox element
  /// (`(q_value, seq, vseq, boxed<T>)`: one allocation, where a boxed value wrapped in a
  /// `q_value` message takes two); a post or a send request boxes it first (box_now).
  struct unboxed_ops {
    caf::message (*box)(queue_send_awaiter&);
    caf::mailbox_element_ptr (*direct)(queue_send_awaiter&, caf::strong_actor_ptr from,
                                       uint64_t seq, uint64_t vseq);
    size_t (*key)();
  };
  queue_send_awaiter(task_actor* self, const caf::actor& q, const unboxed_ops* ops)
      : parked_awaiter(self), l_(q ? &self->link(q) : nullptr), unboxed_(ops) {}

 private:
  /// Makes `value_` the post message of a value held unboxed.
  void box_now() {
    if (unboxed_ != nullptr) value_ = std::exchange(unboxed_, nullptr)->box(*this);
  }

  queue_link* l_;
  caf::message value_;
  /// Set while the value is held unboxed by a typed_send_awaiter.
  const unboxed_ops* unboxed_ = nullptr;
  caf::error err_;
  uint64_t seq_ = 0;
};

/// A channel's send: holds its `T` unboxed until it knows how the value travels (see
/// queue_send_awaiter::unboxed_ops).
template <class T>
class typed_send_awaiter : public queue_send_awaiter {
 public:
  typed_send_awaiter(task_actor* self, const caf::actor& q, T value)
      : queue_send_awaiter(self, q, &ops), v_(std::move(value)) {}

 private:
  static typed_send_awaiter& self_of(queue_send_awaiter& a) {
    return static_cast<typed_send_awaiter&>(a);
  }
  static caf::message box(queue_send_awaiter& a) { return box_value(std::move(self_of(a).v_)); }
  static caf::mailbox_element_ptr direct(queue_send_awaiter& a, caf::strong_actor_ptr from,
                                         uint64_t seq, uint64_t vseq) {
    return caf::make_mailbox_element(std::move(from), caf::make_message_id(), {},
                                     atoms::q_value_atom::value, seq, vseq,
                                     boxed<T>{std::move(self_of(a).v_)});
  }
  static constexpr unboxed_ops ops{&box, &direct, &type_key<T>};
  T v_;
};

/// Receives one value (or, with `wait` false, maybe none). Values the queue hands over in a
/// batch, or under the task's standing grant, wait in the task's link for the next receive.
class queue_recv_awaiter : public parked_awaiter {
 public:
  /// `q` is only read here (see queue_send_awaiter).
  /// `field`: what an empty `q` is named in its `invalid_handle` error.
  queue_recv_awaiter(task_actor* self, const caf::actor& q, uint64_t batch, size_t type,
                     bool wait, const char* field = "channel")
      : parked_awaiter(self), l_(q ? &self->link(q) : nullptr), batch_(batch), type_(type),
        wait_(wait), field_(field) {}

  bool await_ready() {
    if (check_cancelled()) return true;
    if (l_ == nullptr) {
      err_ = make_error(errc::invalid_handle, field_, "the handle is empty");
      return true;
    }
    auto& l = *l_;
    return !l.buffered.empty() && take_front(l);
  }

  void await_suspend(std::coroutine_handle<> h) {
    auto bounded = self_->deadline().has_value();
    if (!bounded && wait_) wait_kind_ = wait_kind::channel;
    seq_ = park(h);
    uint8_t flags = (wait_ ? q_flag_wait : 0) | (bounded ? q_flag_bounded : 0);
    auto& l = *l_;
    l.receiving = true;
    if (wait_ && l.grant > 0 && l.grant_type == type_ && l.grant_bounded == bounded &&
        !l.report_empty)
      return; // the standing grant serves this wait: its next value comes by itself
    if (wait_ && l.grant == 0 && l.grant_seq != 0 && l.grant_type == type_ &&
        l.grant_bounded == bounded && !l.report_empty && l.buffered.empty() &&
        l.slot != nullptr && renew_here(l))
      return; // renewed at the slot: the next value comes by itself, as above
    l.report_empty = false;
    l.grant = wait_ ? static_cast<int64_t>(batch_) : 0;
    l.grant_seq = seq_;
    l.grant_type = type_;
    l.grant_bounded = bounded;
    // Answered by one-way q_values / q_fail (see task_actor::dispatch).
    self_->send(l.queue, atoms::q_recv_atom::value, seq_, batch_, type_, flags, l.consumed);
  }

  bool takes_from(caf::actor_id id) const override {
    return l_ != nullptr && l_->queue.id() == id;
  }

  void on_values(const caf::actor& q, value_batch& vs) override {
    if (!vs.empty()) {
      auto& l = self_->link(q);
      l.hold(vs);
      take_front(l);
    }
    self_->resume_parked();
  }

  void on_value(const caf::actor& q, uint64_t seq, caf::message& m) override {
    auto& l = self_->link(q);
    if (l.buffered.empty()) {
      take_one(l, seq, m); // nothing held: this value is the oldest, no trip through the buffer
    } else {
      l.hold(seq, std::move(m));
      take_front(l);
    }
    self_->resume_parked();
  }

  void on_fail(caf::error& e) override {
    err_ = std::move(e);
    self_->resume_parked();
  }

  void on_abandon(task_actor* self) noexcept override {
    // Ends the grant this wait relied on; values already on their way go back.
    if (auto l = l_; l != nullptr && l->grant > 0) {
      l->grant = 0;
      self->send(l->queue, atoms::q_withdraw_atom::value, std::exchange(l->grant_seq, 0));
    }
  }

  /// Returns the value (nothing when none was available without waiting) or the error.
  caf::expected<std::optional<caf::message>> take() {
    rethrow_if_cancelled();
    if (err_) return std::move(err_);
    if (!got_) return std::optional<caf::message>{};
    return std::optional<caf::message>{std::move(value_)};
  }

  /// take() without its wrapping: the error (then null), else the value, or null for
  /// none. The value stays in this awaiter (a typed receive unboxes it in place).
  caf::message* take_in_place(caf::error& err) {
    rethrow_if_cancelled();
    if (err_) {
      err = std::move(err_);
      return nullptr;
    }
    return got_ ? &value_ : nullptr;
  }

 protected:
  /// For a value of type `key` taken in place (typed_recv_awaiter): the link of `q` when
  /// nothing is held there (else the value must queue behind what is) and this receive
  /// takes that type (else it fails as take_one() says); null otherwise.
  queue_link* in_place_link(const caf::actor& q, size_t key) {
    if (type_ != 0 && key != type_) return nullptr;
    auto& l = self_->link(q);
    return l.buffered.empty() ? &l : nullptr;
  }
  /// A value taken in place from `l`: counted as take_one() counts it, and the await resumed.
  void took_in_place(queue_link& l) {
    ++l.consumed;
    got_ = true;
    self_->resume_parked();
  }

 private:
  /// Takes the oldest held value, unless a typed receive finds another type there (then
  /// the value stays and the receive fails with `wrong_type`). Returns true.
  bool take_front(queue_link& l) {
    if (type_ != 0 && value_key(l.buffered.front().m) != type_) {
      err_ = make_error(errc::wrong_type, "value", "the next value is of another type");
      return true;
    }
    value_ = std::move(l.buffered.front().m);
    l.buffered.pop_front();
    ++l.consumed;
    got_ = true;
    return true;
  }

  /// take_front() for a value that arrived while nothing was held: the same checks, and a
  /// value of another type is held for the next receive, as take_front() leaves it.
  void take_one(queue_link& l, uint64_t seq, caf::message& m) {
    if (type_ != 0 && value_key(m) != type_) {
      l.buffered.push_back(queue_link::held{seq, std::move(m)});
      err_ = make_error(errc::wrong_type, "value", "the next value is of another type");
      return;
    }
    value_ = std::move(m);
    ++l.consumed;
    got_ = true;
  }

  /// The grant was used up by direct hand-overs and the queue, idle, still has the slot
  /// armed for it as its only taker: renews it there (the same grant, `batch_` more values),
  /// which is what a `q_recv` of this grant would make the queue do, without its message.
  /// The values consumed since the queue last heard of it are the room it frees.
  bool renew_here(queue_link& l) {
    auto* s = l.slot;
    std::unique_lock<slot_lock> guard{s->mtx, std::try_to_lock};
    if (!guard.owns_lock() || !s->armed || !s->exclusive || s->grant_left != 0 ||
        s->grant_seq != l.grant_seq ||
        s->receiver != static_cast<caf::abstract_actor*>(self_))
      return false;
    auto gain = l.consumed > s->reported ? static_cast<int64_t>(l.consumed - s->reported) : 0;
    auto room = s->spare + s->budget + gain;
    auto budget = std::min<int64_t>(static_cast<int64_t>(batch_), room);
    if (budget <= 0) return false;
    s->budget = budget;
    s->spare = room - budget;
    s->grant_left = static_cast<int64_t>(batch_);
    s->reported = l.consumed;
    s->renewed = true;
    l.grant = static_cast<int64_t>(batch_);
    return true;
  }

  queue_link* l_;
  uint64_t batch_;
  size_t type_;
  bool wait_;
  const char* field_;
  uint64_t seq_ = 0;
  bool got_ = false;
  caf::message value_;
  caf::error err_;
};

/// The outcome of an untyped select.
struct select_outcome {
  enum kind_t : uint8_t { value, timeout, nothing } kind = nothing;
  size_t index = 0;
  caf::message item;
};

/// A receive of a channel of `T`: a value a typed send handed over directly is moved out of
/// its mailbox element into `direct_`, with no message of its own (see typed_send_awaiter).
template <class T>
class typed_recv_awaiter : public queue_recv_awaiter {
 public:
  using queue_recv_awaiter::queue_recv_awaiter;

  bool on_value_in_place(const caf::actor& q, caf::type_erased_tuple& x, size_t pos) override {
    // A move that may throw would throw out of the task's dispatch with the value half
    // moved: such a value comes as a message of its own instead (on_value).
    if constexpr (!std::is_nothrow_move_constructible_v<T>) {
      return false;
    } else {
      // The type by address first: match_element compares the type_info objects (by name).
      auto t = x.type(pos);
      if (t.first != 0 || t.second == nullptr ||
          (t.second != &typeid(boxed<T>) && *t.second != typeid(boxed<T>)))
        return false;
      auto* l = in_place_link(q, type_key<T>());
      if (l == nullptr) return false;
      direct_.emplace(std::move(static_cast<boxed<T>*>(x.get_mutable(pos))->value));
      took_in_place(*l);
      return true;
    }
  }

 protected:
  /// The value taken in place (then `take()` finds an empty message).
  std::optional<T> direct_;
};

/// Waits for the first of several queues to have a value. Protocol: an offer to every
/// queue; a queue with a value reserves its head for this select and says so (`q_ready`);
/// the first ready case wins and takes its reserved value (`q_take`); every other case is
/// withdrawn, which releases its reservation. A value is never taken for a losing case, so
/// nothing has to be put back and the order of every queue is kept.
class select_awaiter : public parked_awaiter {
 public:
  select_awaiter(task_actor* self, std::vector<caf::actor> qs,
                 std::optional<clock::duration> timeout, bool nonblocking, caf::error pre)
      : parked_awaiter(self), qs_(std::move(qs)), timeout_(timeout), nonblocking_(nonblocking),
        err_(std::move(pre)) {}

  bool await_ready() {
    if (check_cancelled() || err_) return true;
    for (size_t i = 0; i < qs_.size(); ++i) {
      if (!qs_[i]) {
        err_ = make_error(errc::invalid_handle, "channels[" + std::to_string(i) + "]",
                          "the handle is empty");
        return true;
      }
    }
    // Values this task holds already win at once, lowest index first.
    for (size_t i = 0; i < qs_.size(); ++i) {
      if (auto l = self_->find_link(qs_[i].id()); l != nullptr && !l->buffered.empty()) {
        win(i, *l);
        return true;
      }
    }
    return false;
  }

  void await_suspend(std::coroutine_handle<> h) {
    auto bounded = timeout_.has_value() || nonblocking_ || self_->deadline().has_value();
    if (!bounded) wait_kind_ = wait_kind::channel;
    seq_ = park(h);
    status_.assign(qs_.size(), 255);
    uint8_t flags = (nonblocking_ ? 0 : q_flag_wait) | (bounded ? q_flag_bounded : 0);
    for (size_t i = 0; i < qs_.size(); ++i)
      self_->send(qs_[i], atoms::q_offer_atom::value, seq_, uint64_t{i}, flags);
    if (timeout_) {
      timer_ = self_->env().clock->schedule(self_->env().clock->now() + *timeout_,
                                            caf::actor_cast<caf::actor>(self_),
                                            caf::make_message(atoms::timer_atom::value, seq_));
      self_->parked_timer(timer_);
    }
  }

  void on_ready(uint64_t index, uint8_t status) override {
    if (decided_ || index >= qs_.size()) return;
    status_[index] = status;
    switch (status) {
      case atoms::select_ready:
        if (!nonblocking_) {
          take(index);
          return;
        }
        break;
      case atoms::select_deadlock:
        fail(make_error(errc::deadlock, "channels",
                        "every live task waits on a channel operation no other task can "
                        "complete"));
        return;
      case atoms::select_wrong_type:
        fail(make_error(errc::wrong_type, "channels[" + std::to_string(index) + "]",
                        "the next value is of another type"));
        return;
      default:
        break;
    }
    size_t closed = 0;
    size_t answered = 0;
    for (auto s : status_) {
      closed += s == atoms::select_closed ? 1 : 0;
      answered += s != 255 ? 1 : 0;
    }
    if (closed == qs_.size()) {
      fail(make_error(errc::channel_closed, "channels", "every channel of the select is closed"));
      return;
    }
    if (nonblocking_ && answered == qs_.size()) {
      for (size_t i = 0; i < qs_.size(); ++i) {
        if (status_[i] == atoms::select_ready) {
          take(i);
          return;
        }
      }
      decided_ = true; // nothing ready: the default case
      out_.kind = select_outcome::nothing;
      withdraw_all(qs_.size());
      self_->resume_parked();
    }
  }

  bool on_timeout() override { return !taking_; }

  bool takes_from(caf::actor_id id) const override {
    if (decided_) return false;
    for (auto& q : qs_)
      if (q.id() == id) return true;
    return false;
  }

  /// Values a standing receive grant of this task handed over: the oldest one wins.
  void on_values(const caf::actor& q, value_batch& vs) override {
    if (vs.empty()) return;
    size_t index = 0;
    while (index < qs_.size() && qs_[index].id() != q.id())
      ++index;
    auto& l = self_->link(q);
    l.hold(vs);
    stop_timer();
    withdraw_all(qs_.size());
    win(index, l);
    self_->resume_parked();
  }

  void on_abandon(task_actor* self) noexcept override {
    // A take in flight is answered to a stale seq: its value goes back (the actor is held
    // alive for it).
    if (!decided_) withdraw_all(qs_.size(), self);
  }

  caf::expected<select_outcome> take_result() {
    rethrow_if_cancelled();
    if (err_) return std::move(err_);
    if (out_.kind == select_outcome::value || (decided_ && !taking_)) return std::move(out_);
    // Resumed by the timeout.
    if (!decided_) withdraw_all(qs_.size());
    decided_ = true;
    out_.kind = select_outcome::timeout;
    return std::move(out_);
  }

 private:
  void win(size_t index, queue_link& l) {
    decided_ = true;
    out_.kind = select_outcome::value;
    out_.index = index;
    out_.item = std::move(l.buffered.front().m);
    l.buffered.pop_front();
    ++l.consumed;
  }

  void stop_timer() {
    if (timer_ != 0) {
      self_->env().clock->cancel(timer_);
      self_->parked_timer(0);
      timer_ = 0;
    }
  }

  void take(size_t index) {
    decided_ = true;
    taking_ = true;
    winner_ = index;
    stop_timer();
    withdraw_all(index);
    auto st = self_;
    auto seq = seq_;
    auto q = qs_[index];
    st->hold(); // the reserved value is on its way here: this actor stays for it
    self_->request(q, caf::infinite, atoms::q_take_atom::value, seq)
        .then(
            [st, seq, q, index](value_batch& vs) {
              if (!st->is_parked(seq)) { // given up meanwhile: the value goes back
                if (!vs.empty())
                  st->send(q, atoms::q_return_atom::value, int64_t{0}, std::move(vs), false,
                           uint64_t{0});
                st->unhold();
                return;
              }
              auto me = static_cast<select_awaiter*>(st->parked());
              me->taking_ = false;
              if (vs.empty()) {
                me->err_ =
                    make_error(errc::channel_closed, "channels", "the reserved value was gone");
              } else {
                auto& l = st->link(q);
                l.hold(vs);
                me->win(index, l);
              }
              st->resume_parked();
              st->unhold();
            },
            [st, seq](caf::error& e) {
              if (st->is_parked(seq)) {
                auto me = static_cast<select_awaiter*>(st->parked());
                me->taking_ = false;
                me->err_ = std::move(e);
                st->resume_parked();
              }
              st->unhold();
            });
  }

  void fail(caf::error e) {
    decided_ = true;
    err_ = std::move(e);
    withdraw_all(qs_.size());
    self_->resume_parked();
  }

  /// Withdraws every case but `except`.
  void withdraw_all(size_t except, task_actor* self = nullptr) noexcept {
    if (self == nullptr) self = self_;
    for (size_t i = 0; i < qs_.size(); ++i)
      if (i != except && qs_[i]) self->send(qs_[i], atoms::q_withdraw_atom::value, seq_);
  }

  std::vector<caf::actor> qs_;
  std::optional<clock::duration> timeout_;
  bool nonblocking_;
  caf::error err_;
  uint64_t seq_ = 0;
  std::vector<uint8_t> status_;
  bool decided_ = false;
  bool taking_ = false;
  size_t winner_ = 0;
  clock::timer_id timer_ = 0;
  select_outcome out_;
};

} // namespace troupe::detail

template <class T>
struct caf::allowed_unsafe_message_type<troupe::detail::boxed<T>> : std::true_type {};
