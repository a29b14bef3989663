#pragma once

// Internal: the combinators of `context`. Included at the end of context_impl.hpp.

#include <algorithm>
#include <deque>
#include <limits>
#include <unordered_map>
#include <utility>

#include "troupe/actors/detail/task_actor.hpp"

namespace troupe::detail {

/// Returns the value in `b` as a `T`, or its error.
template <class T>
caf::expected<T> unbox(outcome_box&& b) {
  if (b.err) return std::move(b.err);
  if constexpr (std::is_void_v<T>) {
    return {};
  } else {
    if (!b.value) return make_error(errc::task_failed, "result", "the task produced no value");
    return std::move(*static_cast<T*>(b.value.get()));
  }
}

/// A structured call in progress in the calling task's body (a scope, a deadline, a
/// combinator, a retry's attempt): its children are the call's, and none outlives it. A
/// graceful cancel that comes while it is open reaches them (the same grace) and does not
/// end the call's own awaits, so the call ends once they have ended; `close()` at its end
/// then throws `task_cancelled` (the caller's pending await). Opening one observes a
/// graceful cancel that came before: it throws then, with nothing started.
class structured_call {
 public:
  explicit structured_call(task_actor* self) : self_(self) {
    if (self_->take_cancel_signal()) throw task_cancelled{};
    self_->open_structured();
  }
  structured_call(const structured_call&) = delete;
  structured_call& operator=(const structured_call&) = delete;
  ~structured_call() {
    if (open_) self_->close_structured();
  }
  /// The call's children have ended: a graceful cancel that came meanwhile throws now.
  void close() {
    if (!std::exchange(open_, false)) return;
    self_->close_structured();
    if (self_->take_cancel_signal()) throw task_cancelled{};
  }

 private:
  task_actor* self_;
  bool open_ = true;
};

/// Returns the branches allowed at once for `max_concurrent` over `n` items.
inline size_t concurrency_limit(int64_t max_concurrent, size_t n) noexcept {
  if (max_concurrent <= 0 || static_cast<uint64_t>(max_concurrent) >= n)
    return std::max<size_t>(n, 1);
  return static_cast<size_t>(max_concurrent);
}

/// The branches of one combinator call: spawns them as reporting children of the calling
/// task and hands out their outcomes in completion order. Lives in the combinator's frame;
/// if that frame is destroyed (the task was cancelled), the branches still running are
/// cancelled (and joined by the task as its children).
template <class R>
class branch_set final : public collector_base {
 public:
  /// `n` is the number of branches this set may start (their indexes are 0..n-1).
  branch_set(context& cx, size_t n)
      : self_(detail::access::impl(cx)), key_(self_->add_collector(this)), running_(n) {}
  branch_set(const branch_set&) = delete;
  branch_set& operator=(const branch_set&) = delete;
  ~branch_set() {
    self_->remove_collector(key_);
    cancel_all();
  }

  /// Starts branch `index` running `body(context&) -> task<R>`.
  template <class Body>
  void start(size_t index, Body body) {
    spawn_extras extras;
    extras.branch = true;
    extras.collector = key_;
    extras.index = index;
    extras.siblings_failed = siblings_failed_;
    running_[index] = self_->spawn_special(make_runner(std::move(body)), spawn_options{}, extras);
    ++in_flight_;
  }

  /// Makes the branches one fail-fast group: the first to fail cancels the others at their
  /// next `co_await` / `yield_now` directly (the caller's cancel follows), so a sibling in
  /// a CPU-bound loop on another thread stops within one iteration. Call before `start`.
  void fail_fast() { siblings_failed_ = std::make_shared<std::atomic<bool>>(false); }

  [[nodiscard]] size_t in_flight() const noexcept { return in_flight_; }
  /// The calling task got a graceful cancel that waits for the call's end: start nothing
  /// more (the call ends once the running branches have).
  /// (Also when a sibling of the calling task's fail-fast group failed: its parent's cancel
  /// follows.)
  [[nodiscard]] bool stopping() const noexcept {
    return self_->cancel_signal_pending() || self_->sibling_failed();
  }
  [[nodiscard]] bool has_ready() const noexcept { return !ready_.empty(); }
  [[nodiscard]] bool empty() const noexcept { return in_flight_ == 0 && ready_.empty(); }

  /// Stops every running branch (forced; under a graceful cancel of the calling task, with
  /// what is left of its grace); their (cancelled) outcomes still arrive.
  void cancel_all() {
    if (in_flight_ == 0) return;
    auto mode = self_->children_stop_mode(false);
    for (auto& a : running_)
      if (a) task_actor::send_cancel(a, mode);
  }

  void on_report(size_t index, outcome_box&& box) override {
    if (index >= running_.size() || !running_[index]) return;
    running_[index] = nullptr;
    --in_flight_;
    ready_.emplace_back(index, std::move(box));
    if (waiting_ && self_->is_parked(seq_)) {
      waiting_ = false;
      self_->resume_parked();
    }
  }

  class next_awaiter : public parked_awaiter {
   public:
    explicit next_awaiter(branch_set* set) noexcept : parked_awaiter(set->self_), set_(set) {
      wait_kind_ = wait_kind::tasks;
    }
    bool await_ready() noexcept { return check_cancelled() || set_->has_ready(); }
    void await_suspend(std::coroutine_handle<> h) {
      set_->seq_ = park(h);
      set_->waiting_ = true;
    }
    std::pair<size_t, caf::expected<R>> await_resume() {
      set_->waiting_ = false;
      rethrow_if_cancelled();
      auto [index, box] = std::move(set_->ready_.front());
      set_->ready_.pop_front();
      return {index, unbox<R>(std::move(box))};
    }

   private:
    branch_set* set_;
  };

  /// Suspends until a branch has finished: yields (index, value or error). Call it only
  /// while `!empty()`.
  next_awaiter next() { return next_awaiter{this}; }

 private:
  task_actor* self_;
  uint64_t key_;
  bool waiting_ = false;
  uint64_t seq_ = 0;
  std::vector<caf::actor> running_;
  size_t in_flight_ = 0;
  std::deque<std::pair<size_t, outcome_box>> ready_;
  std::shared_ptr<std::atomic<bool>> siblings_failed_;
};

/// Returns a branch body that runs `body(cx, item)` for one captured item.
template <class R, class F, class Item>
auto bind_item(const F& body, Item item) {
  return [body, item = std::move(item)](context& c) -> task<R> { return body(c, item); };
}

/// The error a branch that was never started because the token tripped reports.
caf::error abandoned_error(const abort_reason& reason, bool started);

} // namespace troupe::detail

namespace troupe {

/// The results of `context::as_stream`, in completion order.
template <class Item, class F, class R>
class branch_stream {
 public:
  branch_stream(context& cx, std::vector<Item> items, F body, parallel_options opts)
      : set_(cx, items.size()), items_(std::move(items)), body_(std::move(body)),
        limit_(detail::concurrency_limit(opts.max_concurrent, items_.size())) {
    set_.fail_fast();
    fill();
  }
  branch_stream(const branch_stream&) = delete;
  branch_stream& operator=(const branch_stream&) = delete;

  /// Yields the next result in completion order, the first failure (after cancelling the
  /// rest), or nothing at the end.
  task<std::optional<caf::expected<indexed<R>>>> next() {
    if (done_ || set_.empty()) {
      done_ = true;
      co_return std::nullopt;
    }
    auto [index, r] = co_await set_.next();
    if (!r) {
      done_ = true;
      auto err = std::move(r.error());
      size_t err_index = index;
      set_.cancel_all();
      // As in parallel_each: a real failure beats a cancellation (a sibling cancelled by
      // the failure may report first), then the lowest index wins.
      while (!set_.empty()) {
        auto [later, r2] = co_await set_.next();
        if (r2) continue;
        bool real = !is_cancellation(r2.error());
        bool have_real = !is_cancellation(err);
        if ((real && !have_real) || (real == have_real && later < err_index)) {
          err_index = later;
          err = std::move(r2.error());
        }
      }
      co_return caf::expected<indexed<R>>{std::move(err)};
    }
    fill();
    co_return caf::expected<indexed<R>>{indexed<R>{index, std::move(*r)}};
  }

 private:
  void fill() {
    while (next_ < items_.size() && set_.in_flight() < limit_) {
      set_.start(next_, detail::bind_item<R>(body_, std::move(items_[next_])));
      ++next_;
    }
  }

  detail::branch_set<R> set_;
  std::vector<Item> items_;
  F body_;
  size_t limit_;
  size_t next_ = 0;
  bool done_ = false;
};

template <class F>
auto context::scope(F body, scope_options opts) -> task<caf::expected<detail::body_value_t<F>>> {
  using T = detail::body_value_t<F>;
  detail::structured_call call{self_};
  detail::spawn_extras extras;
  extras.fail_fast = true;
  extras.join_on_return = opts.on_return == scope_exit::join;
  extras.awaited_from_spawn = true;
  std::string id;
  auto a =
      self_->spawn_special(detail::make_runner(std::move(body)), {.name = "scope"}, extras, &id);
  task_handle<T> h{
      detail::recycler::make_shared<detail::handle_state>(std::move(a), std::move(id), &self_->env())};
  auto r = co_await await(h);
  call.close();
  co_return r;
}

template <class Item, class F>
auto context::parallel_each(std::vector<Item> items, F body, parallel_options opts)
    -> task<caf::expected<std::vector<detail::branch_value_t<F, Item>>>> {
  using R = detail::branch_value_t<F, Item>;
  const size_t n = items.size();
  if (n == 0) co_return std::vector<R>{};
  detail::structured_call call{self_};
  std::vector<std::optional<R>> slots(n);
  detail::branch_set<R> set{*this, n};
  set.fail_fast();
  const size_t limit = detail::concurrency_limit(opts.max_concurrent, n);
  size_t next = 0;
  bool failing = false;
  size_t failed_index = n;
  caf::error failure;
  auto fill = [&] {
    while (!failing && !set.stopping() && next < n && set.in_flight() < limit) {
      set.start(next, detail::bind_item<R>(body, std::move(items[next])));
      ++next;
    }
  };
  fill();
  while (!set.empty()) {
    auto [index, r] = co_await set.next();
    if (r) {
      if (!failing) slots[index] = std::move(*r);
    } else if (!failing || !is_cancellation(r.error())) {
      // The error reported: a real failure beats a cancellation, then the lowest index wins.
      bool real = !is_cancellation(r.error());
      bool have_real = failing && !is_cancellation(failure);
      if (!failing || (real && !have_real) || (real == have_real && index < failed_index)) {
        failed_index = index;
        failure = std::move(r.error());
      }
      if (!failing) {
        failing = true;
        set.cancel_all();
      }
    }
    fill();
  }
  call.close();
  if (failing) co_return failure;
  std::vector<R> out;
  out.reserve(n);
  for (auto& s : slots) {
    if (!s) // never started: the call was stopping
      co_return make_error(errc::cancelled, "", "the call was cancelled");
    out.push_back(std::move(*s));
  }
  co_return out;
}

template <class F>
auto context::parallel(int64_t n, F body, parallel_options opts)
    -> task<caf::expected<std::vector<detail::branch_value_t<F, size_t>>>> {
  std::vector<size_t> indexes(n > 0 ? static_cast<size_t>(n) : 0);
  for (size_t i = 0; i < indexes.size(); ++i)
    indexes[i] = i;
  co_return co_await parallel_each(std::move(indexes), std::move(body), opts);
}

template <class Item, class F>
auto context::parallel_settle(std::vector<Item> items, F body, parallel_options opts)
    -> task<settle_result<detail::branch_value_t<F, Item>>> {
  using R = detail::branch_value_t<F, Item>;
  const size_t n = items.size();
  settle_result<R> out;
  if (n == 0) co_return out;
  detail::structured_call call{self_};
  std::vector<std::optional<caf::expected<R>>> slots(n);
  detail::branch_set<R> set{*this, n};
  const size_t limit = detail::concurrency_limit(opts.max_concurrent, n);
  size_t next = 0;
  auto fill = [&] {
    while (!set.stopping() && next < n && set.in_flight() < limit) {
      set.start(next, detail::bind_item<R>(body, std::move(items[next])));
      ++next;
    }
  };
  fill();
  while (!set.empty()) {
    auto [index, r] = co_await set.next();
    if (r)
      ++out.succeeded;
    else
      ++out.failed;
    slots[index] = std::move(r);
    fill();
  }
  call.close();
  out.results.reserve(n);
  for (auto& s : slots) // never started (the call was stopping): cancelled
    out.results.push_back(s ? std::move(*s)
                            : caf::expected<R>{make_error(errc::cancelled, "",
                                                          "the call was cancelled")});
  co_return out;
}

template <class Item, class F>
auto context::parallel_race(std::vector<Item> items, F body, parallel_options opts)
    -> task<caf::expected<race_winner<detail::branch_value_t<F, Item>>>> {
  using R = detail::branch_value_t<F, Item>;
  const size_t n = items.size();
  if (n == 0)
    co_return make_error(errc::all_failed, "items", "a race needs at least one branch",
                         std::vector<caf::error>{});
  detail::structured_call call{self_};
  std::vector<caf::error> errors(n);
  std::optional<race_winner<R>> winner;
  detail::branch_set<R> set{*this, n};
  const size_t limit = detail::concurrency_limit(opts.max_concurrent, n);
  size_t next = 0;
  auto fill = [&] {
    while (!winner && !set.stopping() && next < n && set.in_flight() < limit) {
      set.start(next, detail::bind_item<R>(body, std::move(items[next])));
      ++next;
    }
  };
  fill();
  while (!set.empty()) {
    auto [index, r] = co_await set.next();
    if constexpr (detail::is_expected<R>::value) {
      // A branch that returns an error as a value has failed: a race is never won by one.
      if (r && !*r) {
        errors[index] = r->error();
        fill();
        continue;
      }
    }
    if (r && !winner) {
      winner = race_winner<R>{index, std::move(*r)};
      set.cancel_all();
    } else if (!r) {
      errors[index] = std::move(r.error());
    }
    fill();
  }
  call.close();
  if (winner) co_return std::move(*winner);
  co_return make_error(errc::all_failed, "items", "all " + std::to_string(n) + " branches failed",
                       std::move(errors));
}

template <class Item, class F>
auto context::as_stream(std::vector<Item> items, F body, parallel_options opts) {
  using R = detail::branch_value_t<F, Item>;
  return branch_stream<Item, F, R>{*this, std::move(items), std::move(body), opts};
}

template <class Item, class F>
auto context::settle_with_abort(std::vector<Item> items, F body, abort_options opts)
    -> task<caf::expected<abort_outcome<detail::abort_branch_value_t<F, Item>>>> {
  using R = detail::abort_branch_value_t<F, Item>;
  using flat = typename detail::flat_expected<R>::type;
  if (opts.max_failures && *opts.max_failures < 1)
    co_return make_error(errc::invalid_argument, "max_failures",
                         "must be at least 1, got " + std::to_string(*opts.max_failures));
  const size_t n = items.size();
  abort_outcome<R> out;
  if (n == 0) co_return out;
  detail::structured_call call{self_};
  auto token = make_abort_token();
  std::vector<std::optional<flat>> slots(n);
  detail::branch_set<R> set{*this, n};
  const size_t limit = detail::concurrency_limit(opts.max_concurrent, n);
  size_t next = 0;
  size_t failures = 0;
  auto trip = [&](abort_reason reason) -> task<void> {
    (void)co_await request_abort(token, std::move(reason));
  };
  while (next < n || !set.empty()) {
    // Start queued branches while the token has not tripped.
    if (next < n && set.in_flight() < limit && !out.aborted && !set.stopping()) {
      if (auto reason = co_await abort_requested(token)) {
        out.aborted = true;
        out.reason = std::move(*reason);
        continue;
      }
      while (next < n && set.in_flight() < limit) {
        auto i = next++;
        set.start(i, [body, tok = token, item = std::move(items[i])](context& c) -> task<R> {
          return body(c, item, tok);
        });
      }
    }
    if (set.empty()) {
      if (out.aborted || set.stopping()) break; // the rest never start
      continue;
    }
    auto got = co_await set.next();
    auto index = got.first;
    auto& r = got.second;
    flat value = [&]() -> flat {
      if (!r) return std::move(r.error());
      if constexpr (detail::is_expected<R>::value)
        return std::move(*r);
      else
        return flat{std::move(*r)};
    }();
    if (value) {
      ++out.succeeded;
    } else if (is(value.error(), errc::abandoned)) {
      ++out.abandoned;
      out.abandoned_indexes.push_back(index);
    } else {
      ++out.failed;
      ++failures;
      if (opts.abort_on)
        if (auto reason = opts.abort_on(value.error(), index)) co_await trip(std::move(*reason));
      if (opts.max_failures && failures >= static_cast<size_t>(*opts.max_failures))
        co_await trip(
            abort_reason{"max_failures", std::to_string(failures) + " branches failed", 0});
    }
    slots[index] = std::move(value);
  }
  if (auto reason = co_await abort_requested(token)) {
    out.aborted = true;
    out.reason = std::move(*reason);
  }
  out.results.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (slots[i]) {
      out.results.push_back(std::move(*slots[i]));
    } else { // never started
      out.results.push_back(detail::abandoned_error(out.reason.value_or(abort_reason{}), false));
      ++out.abandoned;
      out.abandoned_indexes.push_back(i);
    }
  }
  std::sort(out.abandoned_indexes.begin(), out.abandoned_indexes.end());
  call.close();
  co_return out;
}

template <class F>
auto context::deadline(clock::duration d, F body) -> task<caf::expected<detail::body_value_t<F>>> {
  using T = detail::body_value_t<F>;
  detail::structured_call call{self_};
  auto due = now() + d;
  if (auto outer = current_deadline(); outer && *outer < due) due = *outer;
  detail::spawn_extras extras;
  extras.deadline = due;
  extras.awaited_from_spawn = true;
  std::string id;
  auto a =
      self_->spawn_special(detail::make_runner(std::move(body)), {.name = "deadline"}, extras, &id);
  auto st = detail::recycler::make_shared<detail::handle_state>(std::move(a), std::move(id), &self_->env());
  auto r = co_await detail::await_until_awaiter<T>{self_, st, due};
  if (r.timed_out) {
    (void)co_await cancel(task_handle<T>{st});
    self_->forget_child(st->actor.id());
    call.close();
    co_return make_error(errc::deadline_exceeded, "deadline",
                         "the body was cancelled at its deadline");
  }
  call.close();
  co_return std::move(r.result);
}

template <class F>
auto context::retry(int64_t attempts, F body, retry_options opts)
    -> task<typename detail::flat_expected<detail::body_value_t<F>>::type> {
  using T = detail::body_value_t<F>;
  if (attempts < 1)
    co_return make_error(errc::invalid_argument, "attempts",
                         "must be at least 1, got " + std::to_string(attempts));
  caf::error last;
  for (int64_t i = 0; i < attempts; ++i) {
    if (i > 0 && opts.delay.count() > 0) co_await sleep(opts.delay);
    detail::structured_call call{self_};
    auto h = spawn(body, {.name = "attempt"});
    auto r = co_await await(h);
    call.close();
    if (!r) {
      last = std::move(r.error());
      continue;
    }
    if constexpr (detail::is_expected<T>::value) {
      if (!*r) {
        last = r->error();
        continue;
      }
      co_return std::move(*r); // flat: the body's own expected
    } else {
      co_return std::move(r);
    }
  }
  co_return last;
}

} // namespace troupe
