#pragma once

// Internal: the awaiters behind `context` and its template members. Included at the end of
// <troupe/actors/context.hpp>.

#include <optional>
#include <tuple>
#include <type_traits>

#include <caf/actor_cast.hpp>
#include <caf/sec.hpp>
#include <caf/send.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/actors/detail/task_actor.hpp"
#include "troupe/messages/atoms.hpp"
#include "troupe/messages/errc.hpp"

namespace troupe::detail {

/// Stores a value of `T`, or nothing for `void`.
template <class T>
struct value_slot {
  std::optional<T> value;
  template <class U>
  void set(U&& x) {
    value.emplace(std::forward<U>(x));
  }
  caf::expected<T> take(caf::error& err) {
    if (err) return std::move(err);
    if (!value) return make_error(errc::task_failed, "result", "no value was delivered");
    return std::move(*value);
  }
};

template <>
struct value_slot<void> {
  caf::expected<void> take(caf::error& err) {
    if (err) return std::move(err);
    return {};
  }
};

/// Returns the error for a task that vanished while being awaited.
caf::error task_gone_error();

/// Returns the error for an exception thrown by a blocking job (call from a `catch`).
caf::error blocking_error_from_current_exception();

/// Common part of every awaiter: the cancellation check and the resume-on-reply guard.
class parked_awaiter : public awaiter_base {
 public:
  explicit parked_awaiter(task_actor* self) noexcept : self_(self) {}

 protected:
  /// Returns true (ready) when this await is the one that observes a graceful cancel.
  bool check_cancelled() noexcept {
    if (self_->take_cancel_signal()) {
      cancelled_ = true;
      return true;
    }
    return false;
  }
  void rethrow_if_cancelled() const {
    if (cancelled_) throw task_cancelled{};
  }
  uint64_t park(std::coroutine_handle<> h) noexcept {
    waiting_ = h;
    return self_->park(this);
  }

  task_actor* self_;
};

class sleep_awaiter : public parked_awaiter {
 public:
  sleep_awaiter(task_actor* self, clock::time_point due) noexcept
      : parked_awaiter(self), due_(due) {}
  bool await_ready() noexcept { return check_cancelled(); }
  void await_suspend(std::coroutine_handle<> h) {
    auto seq = park(h);
    if (due_ <= self_->env().clock->now()) {
      // Due already (`sleep(0ms)`, a `sleep_until` in the past): a yield, as in Trio and
      // asyncio, so that a loop of such sleeps lets the others run (on virtual time it
      // would hold the one thread for ever) and sees a queued cancel.
      self_->note_yield();
      caf::anon_send(caf::actor_cast<caf::actor>(self_), atoms::timer_atom::value, seq);
      return;
    }
    auto id = self_->env().clock->schedule(due_, caf::actor_cast<caf::actor>(self_),
                                           caf::make_message(atoms::timer_atom::value, seq));
    self_->parked_timer(id);
  }
  void await_resume() const { rethrow_if_cancelled(); }

 private:
  clock::time_point due_;
};

class yield_awaiter : public parked_awaiter {
 public:
  explicit yield_awaiter(task_actor* self) noexcept : parked_awaiter(self) {}
  bool await_ready() noexcept { return check_cancelled(); }
  void await_suspend(std::coroutine_handle<> h) {
    auto seq = park(h);
    // Goes to the back of the mailbox: what arrived before it is handled first. And the
    // activation ends here, so that the task goes behind the work its worker has queued
    // (task_actor::resume); CAF alone would handle this message in the same activation.
    self_->note_yield();
    caf::anon_send(caf::actor_cast<caf::actor>(self_), atoms::timer_atom::value, seq);
  }
  void await_resume() const { rethrow_if_cancelled(); }
};

template <class R, class Handle, class... Ts>
class request_awaiter : public parked_awaiter {
 public:
  /// An empty `dest` answers `invalid_handle` naming `empty_field` without sending (a
  /// channel's or mailbox's own calls name their handle).
  request_awaiter(task_actor* self, Handle dest, std::tuple<Ts...> args,
                  const char* empty_field = "dest")
      : parked_awaiter(self), dest_(std::move(dest)), args_(std::move(args)) {
    if (!dest_) err_ = make_error(errc::invalid_handle, empty_field, "the handle is empty");
  }
  bool await_ready() noexcept { return check_cancelled() || static_cast<bool>(err_); }
  void await_suspend(std::coroutine_handle<> h) {
    auto seq = park(h);
    auto st = self_;
    // An actor on another node: its node going down fails the await (node_down). (The
    // control block's node by reference: no node_id copies on the local hot path.)
    auto* ctrl = caf::actor_cast<caf::actor_control_block*>(dest_);
    bool remote = ctrl != nullptr && ctrl->node() != self_->home_system().node();
    auto on_error = [st, seq, remote](caf::error& e) {
      if (remote) st->unwatch_remote(seq);
      if (!st->is_parked(seq)) return;
      static_cast<request_awaiter*>(st->parked())->err_ = std::move(e);
      st->resume_parked();
    };
    if constexpr (own_path) {
      if (!remote) {
        // A local actor: the request goes out with this task's own request id and its
        // response comes straight back to this await (task_actor::resume hands it to
        // on_response), without a response handler registered at CAF per request.
        auto id = self_->new_request_id(caf::message_priority::normal);
        rid_ = id.response_id();
        std::apply(
            [&](auto&... xs) {
              ctrl->enqueue(caf::make_mailbox_element(self_->ctrl(), id, {}, std::move(xs)...),
                            self_->context());
            },
            args_);
        return;
      }
    }
    std::apply(
        [&](auto&... xs) {
          auto req = self_->request(dest_, caf::infinite, std::move(xs)...);
          if constexpr (std::is_void_v<R>) {
            std::move(req).then(
                [st, seq, remote]() {
                  if (remote) st->unwatch_remote(seq);
                  if (st->is_parked(seq)) st->resume_parked();
                },
                on_error);
          } else {
            std::move(req).then(
                [st, seq, remote](R& r) {
                  if (remote) st->unwatch_remote(seq);
                  if (!st->is_parked(seq)) return;
                  static_cast<request_awaiter*>(st->parked())->slot_.set(std::move(r));
                  st->resume_parked();
                },
                on_error);
          }
        },
        args_);
    if (remote)
      self_->watch_remote(dest_.address(), seq, [st, seq](caf::error e) {
        if (!st->is_parked(seq)) return;
        static_cast<request_awaiter*>(st->parked())->err_ = std::move(e);
        st->resume_parked();
      });
  }
  caf::expected<R> await_resume() {
    rethrow_if_cancelled();
    return slot_.take(err_);
  }

  bool on_response(caf::mailbox_element& x) override {
    if (x.mid != rid_) return false;
    // As CAF's response handler would take it: the reply, an error, or anything else as
    // `unexpected_response`.
    auto& c = x.content();
    if constexpr (std::is_void_v<R>) {
      if (c.empty() || c.match_elements<caf::unit_t>()) {
        // done
      } else if (c.match_elements<caf::error>()) {
        err_ = std::move(c.get_mutable_as<caf::error>(0));
      } else {
        err_ = caf::make_error(caf::sec::unexpected_response, x.move_content_to_message());
      }
    } else {
      if (c.match_elements<R>())
        slot_.set(std::move(c.get_mutable_as<R>(0)));
      else if (c.match_elements<caf::error>())
        err_ = std::move(c.get_mutable_as<caf::error>(0));
      else
        err_ = caf::make_error(caf::sec::unexpected_response, x.move_content_to_message());
    }
    self_->resume_parked();
    return true;
  }

 private:
  /// Requests to a dynamically typed local actor take troupe's own response path (a typed
  /// handle keeps CAF's, which checks the interface; a reply of any content stays CAF's).
  static constexpr bool own_path =
      std::is_same_v<Handle, caf::actor> && !std::is_same_v<std::decay_t<R>, caf::message>;

  Handle dest_;
  std::tuple<Ts...> args_;
  value_slot<R> slot_;
  caf::error err_;
  /// The response id of this await's own request (own_path), or none.
  caf::message_id rid_;
};

/// A request through one of troupe's handles to its actor (a channel's or mailbox's close
/// and metrics): an empty handle answers `invalid_handle` naming `field`.
template <class R, class... Ts>
auto handle_request(context& cx, const caf::actor& dest, const char* field, Ts&&... xs) {
  return request_awaiter<R, caf::actor, std::decay_t<Ts>...>{
      access::impl(cx), dest, std::make_tuple(std::forward<Ts>(xs)...), field};
}

/// Validates a handle for an operation of `self`; returns an error or nothing.
caf::error check_handle(task_actor* self, const std::shared_ptr<handle_state>& st);

template <class T>
class await_awaiter : public parked_awaiter {
 public:
  await_awaiter(task_actor* self, std::shared_ptr<handle_state> st) noexcept
      : parked_awaiter(self), st_(std::move(st)) {
    wait_kind_ = wait_kind::tasks;
  }
  bool await_ready() {
    if (check_cancelled()) return true;
    if ((err_ = check_handle(self_, st_))) return true;
    if (st_->awaited.exchange(true)) {
      err_ = make_error(errc::already_awaited, "handle",
                        "task " + st_->id + " was awaited before; a result is handed out once");
      return true;
    }
    if (st_->cell) { // a child of a task or a job: it wakes this await (see result_cell)
      if (!st_->cell->available()) return false;
      take_from_cell();
      return true;
    }
    if (st_->pending_owner != nullptr && !st_->orphan) {
      // An earlier await of this task was abandoned and its reply has not arrived yet.
      if (st_->pending_owner != self_) {
        err_ = make_error(errc::already_awaited, "handle",
                          "task " + st_->id + " is being awaited by another task");
        return true;
      }
      waits_for_pending_ = true;
      return false;
    }
    if (st_->orphan) { // an earlier, abandoned await left the result here
      auto box = std::move(*st_->orphan);
      st_->orphan.reset();
      if constexpr (!std::is_void_v<T>) {
        if (box.value) slot_.set(std::move(*static_cast<T*>(box.value.get())));
      }
      err_ = std::move(box.err);
      return true;
    }
    return false;
  }
  void await_suspend(std::coroutine_handle<> h) {
    auto seq = park(h);
    if (st_->cell) {
      registered_ = true;
      self_->mark_awaited(st_->key());
      if (!st_->cell->wait(caf::actor_cast<caf::actor_addr>(self_), seq)) // it ended meanwhile
        caf::anon_send(caf::actor_cast<caf::actor>(self_), atoms::await_done_atom::value, seq);
      return;
    }
    if (waits_for_pending_) { // the abandoned await's reply resumes this one
      st_->pending_waiter = seq;
      return;
    }
    auto st = self_;
    auto child = st_->actor.id();
    st->mark_awaited(child);
    auto hs = st_;
    std::move(self_->request(st_->actor, caf::infinite, atoms::await_atom::value))
        .then(
            [st, seq, child, hs](outcome_box& b) {
              st->forget_child(child);
              if (!st->is_parked(seq)) { // the await was abandoned
                auto waiter = std::exchange(hs->pending_waiter, 0);
                hs->pending_owner = nullptr;
                if (waiter == 0 || !st->is_parked(waiter)) { // keep it for the next await
                  hs->orphan = std::make_unique<outcome_box>(std::move(b));
                  hs->awaited.store(false);
                  return;
                }
                // else: a later await of the same task is parked, waiting for exactly this
              }
              auto* me = static_cast<await_awaiter*>(st->parked());
              if constexpr (!std::is_void_v<T>) {
                if (b.value) me->slot_.set(std::move(*static_cast<T*>(b.value.get())));
              }
              me->err_ = std::move(b.err);
              st->resume_parked();
            },
            [st, seq, child, hs](caf::error& e) {
              st->forget_child(child);
              auto err = e == caf::sec::request_receiver_down ? task_gone_error() : std::move(e);
              if (!st->is_parked(seq)) {
                auto waiter = std::exchange(hs->pending_waiter, 0);
                hs->pending_owner = nullptr;
                if (waiter == 0 || !st->is_parked(waiter)) {
                  hs->orphan = std::make_unique<outcome_box>(outcome_box{nullptr, std::move(err)});
                  hs->awaited.store(false);
                  return;
                }
              }
              static_cast<await_awaiter*>(st->parked())->err_ = std::move(err);
              st->resume_parked();
            });
  }
  void on_task_done() override {
    if (st_->cell->available())
      take_from_cell();
    else
      err_ = task_gone_error();
    got_ = true;
  }
  void on_abandon(task_actor*) noexcept override { withdraw(); }
  caf::expected<T> await_resume() {
    withdraw();
    if (withdrawn_) {
      // The body goes on: the nursery entry must not wait for an await that is gone. A
      // child that has ended leaves it (as an abandoned await's reply did); one still
      // running is unawaited again, so its end notice is handled as such.
      auto child = st_->key();
      if (st_->cell->ended())
        self_->forget_child(child);
      else
        self_->unmark_awaited(child);
    }
    if (cancelled_ && waiting_ && !waits_for_pending_ && !st_->cell) {
      // Abandoned while its reply is on the way: a later await of the handle takes it.
      st_->pending_owner = self_;
      st_->awaited.store(false);
    }
    rethrow_if_cancelled();
    return slot_.take(err_);
  }

 private:
  /// An abandoned await (a cancel, the body destroyed) withdraws from the cell: the
  /// outcome, now or when it comes, waits there for the next await of the handle.
  void withdraw() noexcept {
    if (!registered_ || got_ || withdrawn_) return;
    withdrawn_ = true;
    st_->cell->unwait();
    st_->awaited.store(false);
  }
  /// Takes the child's outcome from the handle's cell.
  void take_from_cell() {
    auto box = st_->cell->take();
    self_->took_child(st_->key());
    if constexpr (!std::is_void_v<T>) {
      if (box.value) slot_.set(std::move(*static_cast<T*>(box.value.get())));
    }
    err_ = std::move(box.err);
  }

  std::shared_ptr<handle_state> st_;
  bool waits_for_pending_ = false;
  bool registered_ = false; // in the cell
  bool withdrawn_ = false;  // abandoned after registering
  bool got_ = false;        // the cell's outcome
  value_slot<T> slot_;
  caf::error err_;
};

/// The outcome of awaiting a task until a deadline.
template <class T>
struct until_result {
  bool timed_out = false;
  caf::expected<T> result;
};

/// Awaits a task, or the clock reaching `due`, whichever comes first.
template <class T>
class await_until_awaiter : public parked_awaiter {
 public:
  await_until_awaiter(task_actor* self, std::shared_ptr<handle_state> st,
                      clock::time_point due) noexcept
      : parked_awaiter(self), st_(std::move(st)), due_(due) {}
  bool await_ready() {
    if (check_cancelled()) return true;
    if ((err_ = check_handle(self_, st_)) || st_->awaited.exchange(true)) {
      if (!err_)
        err_ =
            make_error(errc::already_awaited, "handle", "task " + st_->id + " was awaited before");
      got_ = true;
      return true;
    }
    return false;
  }
  void await_suspend(std::coroutine_handle<> h) {
    auto seq = park(h);
    auto st = self_;
    auto child = st_->actor.id();
    st->mark_awaited(child);
    std::move(self_->request(st_->actor, caf::infinite, atoms::await_atom::value))
        .then(
            [st, seq, child](outcome_box& b) {
              st->forget_child(child);
              if (!st->is_parked(seq)) return;
              auto* me = static_cast<await_until_awaiter*>(st->parked());
              if constexpr (!std::is_void_v<T>) {
                if (b.value) me->slot_.set(std::move(*static_cast<T*>(b.value.get())));
              }
              me->err_ = std::move(b.err);
              me->got_ = true;
              st->resume_parked();
            },
            [st, seq, child](caf::error& e) {
              st->forget_child(child);
              if (!st->is_parked(seq)) return;
              auto* me = static_cast<await_until_awaiter*>(st->parked());
              me->err_ = e == caf::sec::request_receiver_down ? task_gone_error() : std::move(e);
              me->got_ = true;
              st->resume_parked();
            });
    // The same seq: whichever of reply and timer comes first resumes the body.
    self_->parked_timer(
        self_->env().clock->schedule(due_, caf::actor_cast<caf::actor>(self_),
                                     caf::make_message(atoms::timer_atom::value, seq)));
  }
  until_result<T> await_resume() {
    rethrow_if_cancelled();
    if (!got_)
      return {true, caf::expected<T>{
                        make_error(errc::deadline_exceeded, "deadline", "the deadline passed")}};
    return {false, slot_.take(err_)};
  }

 private:
  std::shared_ptr<handle_state> st_;
  clock::time_point due_;
  bool got_ = false;
  value_slot<T> slot_;
  caf::error err_;
};

class cancel_awaiter : public parked_awaiter {
 public:
  /// `mode`: force, or graceful with a grace period.
  cancel_awaiter(task_actor* self, std::shared_ptr<handle_state> st, cancel_mode mode,
                 caf::error pre = {}) noexcept
      : parked_awaiter(self), st_(std::move(st)), mode_(mode), err_(std::move(pre)) {}
  bool await_ready() {
    if (check_cancelled() || err_) return true;
    err_ = check_handle(self_, st_);
    if (!err_ && st_->cell && st_->cell->ended()) {
      // It has ended (its outcome is in the cell, or was taken): nothing left to stop.
      if (!mode_.is_graceful()) self_->forget_child(st_->key());
      return true;
    }
    if (err_) return true;
    target_ = st_->actor;
    if (st_->ticket) {
      // A job whose task does not exist yet is withdrawn here (also by a graceful cancel:
      // it never runs); one whose lane has spawned its task is cancelled as any task.
      if (ticket_stop(st_->ticket, target_,
                      make_error(errc::cancelled, "", "job " + st_->id + " was cancelled"))) {
        self_->forget_child(st_->key());
        value_ = true;
        return true;
      }
      if (!target_) return true; // withdrawn before: nothing left to stop
    }
    return false;
  }
  void await_suspend(std::coroutine_handle<> h) {
    auto seq = park(h);
    auto st = self_;
    auto child = st_->key();
    bool forced = !mode_.is_graceful();
    auto on_value = [st, seq, child, forced](bool b) {
      if (forced) // the child has ended: the nursery no longer holds it
        st->forget_child(child);
      if (!st->is_parked(seq)) return;
      static_cast<cancel_awaiter*>(st->parked())->value_ = b;
      st->resume_parked();
    };
    auto on_error = [st, seq, child, forced](caf::error& e) {
      if (forced && e == caf::sec::request_receiver_down) // it has ended: out of the nursery
        st->forget_child(child);
      if (!st->is_parked(seq)) return;
      if (e != caf::sec::request_receiver_down) // gone already: nothing left to stop
        static_cast<cancel_awaiter*>(st->parked())->err_ = std::move(e);
      st->resume_parked();
    };
    task_actor::flag_cancel(target_, mode_);
    std::move(self_->request(target_, caf::infinite, atoms::cancel_atom::value, mode_))
        .then(on_value, on_error);
  }
  caf::expected<bool> await_resume() {
    rethrow_if_cancelled();
    if (err_) return std::move(err_);
    return value_;
  }

 private:
  std::shared_ptr<handle_state> st_;
  cancel_mode mode_;
  /// The task actor the cancel goes to.
  caf::actor target_;
  bool value_ = false;
  caf::error err_;
};

template <class R, class F>
class blocking_awaiter : public parked_awaiter {
 public:
  blocking_awaiter(task_actor* self, F fn) : parked_awaiter(self), fn_(std::move(fn)) {}
  bool await_ready() noexcept { return check_cancelled(); }
  void await_suspend(std::coroutine_handle<> h) {
    auto seq = park(h);
    auto target = caf::actor_cast<caf::actor>(self_);
    self_->env().blocking->submit([fn = std::move(fn_), target, seq]() mutable {
      outcome_box box;
      try {
        if constexpr (std::is_void_v<R>)
          fn();
        else
          box.value = std::make_shared<R>(fn());
      } catch (...) {
        box.err = blocking_error_from_current_exception();
      }
      caf::anon_send(target, atoms::blocking_atom::value, seq, std::move(box));
    });
  }
  void on_box(outcome_box&& box) override {
    if constexpr (!std::is_void_v<R>) {
      if (box.value) slot_.set(std::move(*static_cast<R*>(box.value.get())));
    }
    err_ = std::move(box.err);
  }
  caf::expected<R> await_resume() {
    rethrow_if_cancelled();
    return slot_.take(err_);
  }

 private:
  F fn_;
  value_slot<R> slot_;
  caf::error err_;
};

} // namespace troupe::detail

namespace troupe {

inline auto context::sleep(clock::duration d) {
  return detail::sleep_awaiter{self_, now() + d};
}

inline auto context::sleep_until(clock::time_point t) {
  return detail::sleep_awaiter{self_, t};
}

inline auto context::yield_now() {
  return detail::yield_awaiter{self_};
}

template <class F>
auto context::spawn(F&& body, spawn_options opts) {
  auto r = detail::make_runner(std::forward<F>(body));
  using T = typename std::decay_t<decltype(*r)>::value_type;
  return task_handle<T>{self_->spawn_child(std::move(r), std::move(opts))};
}

template <class T>
auto context::await(const task_handle<T>& h) {
  return detail::await_awaiter<T>{self_, detail::access::state(h)};
}

template <class T>
auto context::cancel(const task_handle<T>& h) {
  return detail::cancel_awaiter{self_, detail::access::state(h), cancel_mode::force()};
}

template <class T>
auto context::cancel_graceful(const task_handle<T>& h, clock::duration grace) {
  if (grace.count() < 0)
    return detail::cancel_awaiter{
        self_, detail::access::state(h), cancel_mode::graceful(0),
        make_error(errc::invalid_argument, "grace", "a grace period cannot be negative")};
  return detail::cancel_awaiter{
      self_, detail::access::state(h),
      cancel_mode::graceful(
          std::chrono::duration_cast<std::chrono::nanoseconds>(grace).count())};
}

template <class R, class Handle, class... Ts>
auto context::request(const Handle& dest, Ts&&... xs) {
  return detail::request_awaiter<R, Handle, std::decay_t<Ts>...>{
      self_, dest, std::make_tuple(std::forward<Ts>(xs)...)};
}

namespace detail {

/// The single reply type of a typed request (void for none).
template <class List>
struct single_reply;

template <>
struct single_reply<caf::detail::type_list<>> {
  using type = void;
};

template <>
struct single_reply<caf::detail::type_list<void>> {
  using type = void;
};

template <class R>
struct single_reply<caf::detail::type_list<R>> {
  using type = R;
};

} // namespace detail

template <class Handle, class... Ts>
  requires caf::is_typed_actor<Handle>::value
auto context::request(const Handle& dest, Ts&&... xs) {
  using rt = caf::response_type<typename Handle::signatures,
                                caf::detail::implicit_conversions_t<std::decay_t<Ts>>...>;
  static_assert(rt::valid, "the actor's interface has no such message");
  using R = typename detail::single_reply<typename rt::type>::type;
  return request<R>(dest, std::forward<Ts>(xs)...);
}

template <class F>
auto context::spawn_blocking(F&& fn) {
  using D = std::decay_t<F>;
  using R = std::invoke_result_t<D&>;
  return detail::blocking_awaiter<R, D>{self_, std::forward<F>(fn)};
}

template <class T>
void context::set_local(std::string key, T value) {
  using map_type = task_locals::element_type;
  auto m = locals() ? std::make_shared<std::remove_const_t<map_type>>(*locals())
                    : std::make_shared<std::remove_const_t<map_type>>();
  (*m)[std::move(key)] = std::any{std::move(value)};
  locals(std::move(m));
}

template <class T>
std::optional<T> context::local(std::string_view key) const {
  auto& m = locals();
  if (!m) return std::nullopt;
  auto i = m->find(key);
  if (i == m->end()) return std::nullopt;
  if (auto ptr = std::any_cast<T>(&i->second)) return *ptr;
  return std::nullopt;
}

inline bool context::has_local(std::string_view key) const {
  auto& m = locals();
  return m && m->find(key) != m->end();
}

} // namespace troupe

#include "troupe/actors/detail/structured_impl.hpp"
