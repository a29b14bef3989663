// Tasks and structured concurrency: spawn_await, sequential_await, parked_rss, parallel_each,
// scope_fanout.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <malloc.h>
#include <mutex>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include <troupe/actors/detail/actor_slab.hpp>
#include <troupe/troupe.hpp>

#include "bench_support.hpp"

namespace troupe_bench {

namespace {

/// Bytes of heap in use: glibc's, plus the task actors' blocks in troupe's actor slab.
long heap_in_use() {
  auto slab = troupe::detail::actor_slab::stats();
  return static_cast<long>(mallinfo2().uordblks) + static_cast<long>(slab.live * slab.block_bytes);
}

} // namespace

// -- spawn_await: spawn N trivial tasks, then await each ------------------------------------

using go_atom = caf::atom_constant<caf::atom("go")>;

double troupe_spawn_await(long n) {
  auto rt = make_runtime();
  auto t0 = clk::now();
  auto r = rt.run([n](context& cx) -> task<long> {
    std::vector<troupe::task_handle<int>> hs;
    hs.reserve(n);
    for (long i = 0; i < n; ++i)
      hs.push_back(cx.spawn([]() -> task<int> { co_return 1; }));
    long sum = 0;
    for (auto& h : hs)
      if (auto v = co_await cx.await(h)) sum += *v;
    co_return sum;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "spawn_await: wrong result\n");
  print_sched_counters(rt.system(), "spawn_await");
  return s;
}

struct spawner_state {
  std::vector<caf::actor> kids;
  size_t next = 0;
  long sum = 0;
  caf::response_promise done;
};

void caf_await_next(caf::stateful_actor<spawner_state>* self) {
  auto& st = self->state;
  if (st.next == st.kids.size()) {
    st.kids.clear();
    st.done.deliver(st.sum);
    return;
  }
  auto k = st.kids[st.next++];
  self->request(k, caf::infinite, caf::get_atom::value).then([self](int v) {
    self->state.sum += v;
    caf_await_next(self);
  });
}

double caf_spawn_await(long n) {
  caf_env env;
  auto driver = env.sys->spawn([n](caf::stateful_actor<spawner_state>* self) -> caf::behavior {
    return {[self, n](go_atom) {
      self->state.done = self->make_response_promise();
      self->state.kids.reserve(n);
      for (long i = 0; i < n; ++i)
        self->state.kids.push_back(self->spawn([](caf::event_based_actor* kid) -> caf::behavior {
          return {[kid](caf::get_atom) {
            kid->quit();
            return 1;
          }};
        }));
      caf_await_next(self);
      return self->state.done;
    }};
  });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  self->request(driver, caf::infinite, go_atom::value)
      .receive([](long) {}, [](caf::error&) { std::fprintf(stderr, "caf spawn_await failed\n"); });
  auto s = seconds_since(t0);
  self->send_exit(driver, caf::exit_reason::user_shutdown);
  return s;
}

// -- sequential_await: N co_awaited requests from one task ---------------------------------

caf::behavior adder() {
  return {[](int x, int y) { return x + y; }};
}

double troupe_sequential_await(long n) {
  auto rt = make_runtime();
  auto a = rt.system().spawn(adder);
  auto t0 = clk::now();
  auto r = rt.run([n, a](context& cx) -> task<long> {
    long sum = 0;
    for (long i = 0; i < n; ++i)
      if (auto v = co_await cx.request<int>(a, 1, 0)) sum += *v;
    co_return sum;
  });
  auto s = seconds_since(t0);
  print_sched_counters(rt.system(), "sequential_await");
  if (!r || *r != n) std::fprintf(stderr, "sequential_await: wrong result\n");
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  return s;
}

struct chain_state {
  long left = 0;
  long sum = 0;
  caf::actor target;
  caf::response_promise done;
};

void caf_chain_next(caf::stateful_actor<chain_state>* self) {
  if (self->state.left-- == 0) {
    self->state.done.deliver(self->state.sum);
    return;
  }
  self->request(self->state.target, caf::infinite, 1, 0).then([self](int v) {
    self->state.sum += v;
    caf_chain_next(self);
  });
}

double caf_sequential_await(long n) {
  caf_env env;
  auto a = env.sys->spawn(adder);
  auto driver = env.sys->spawn([n, a](caf::stateful_actor<chain_state>* self) -> caf::behavior {
    return {[self, n, a](go_atom) {
      self->state.left = n;
      self->state.target = a;
      self->state.done = self->make_response_promise();
      caf_chain_next(self);
      return self->state.done;
    }};
  });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  self->request(driver, caf::infinite, go_atom::value)
      .receive([](long) {}, [](caf::error&) { std::fprintf(stderr, "caf chain failed\n"); });
  auto s = seconds_since(t0);
  self->send_exit(driver, caf::exit_reason::user_shutdown);
  self->send_exit(a, caf::exit_reason::user_shutdown);
  return s;
}

// -- stream_pull: N values pulled from a troupe::stream ---------------------------------------

namespace {

troupe::stream<long> naturals(context& cx, long n) {
  (void)cx;
  for (long i = 0; i < n; ++i)
    co_yield i;
}

troupe::stream<long> answers(context& cx, caf::actor a, long n) {
  for (long i = 0; i < n; ++i)
    if (auto v = co_await cx.request<int>(a, 1, 0)) co_yield *v;
}

} // namespace

double troupe_stream_pull(long n) {
  auto rt = make_runtime();
  auto t0 = clk::now();
  auto r = rt.run([n](context& cx) -> task<long> {
    long count = 0;
    auto s = naturals(cx, n);
    while (auto v = co_await s.next())
      count += *v >= 0 ? 1 : 0;
    co_return count;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "stream_pull: wrong result\n");
  return s;
}

double troupe_stream_pull_request(long n) {
  auto rt = make_runtime();
  auto a = rt.system().spawn(adder);
  auto t0 = clk::now();
  auto r = rt.run([n, a](context& cx) -> task<long> {
    long sum = 0;
    auto s = answers(cx, a, n);
    while (auto v = co_await s.next())
      sum += *v;
    co_return sum;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "stream_pull_request: wrong result\n");
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  return s;
}

// -- parked_rss: memory of N tasks suspended on a never-answered await ----------------------

void parked_rss(long n) {
  // Raw CAF first: N bare actors with a one-handler behavior.
  long caf_bytes = 0;
  {
    caf_env env;
    std::vector<caf::actor> actors;
    actors.reserve(n);
    auto before = rss_kib();
    for (long i = 0; i < n; ++i)
      actors.push_back(env.sys->spawn([]() -> caf::behavior { return {[](int) {}}; }));
    caf::scoped_actor self{*env.sys};
    for (auto& a : actors) // make sure every actor has been initialized
      self->request(a, caf::infinite, 0).receive([] {}, [](caf::error&) {});
    caf_bytes = (rss_kib() - before) * 1024;
    for (auto& a : actors)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
  auto rt = make_runtime();
  auto received = std::make_shared<std::atomic<long>>(0);
  auto silent = rt.system().spawn([received](caf::event_based_actor*) -> caf::behavior {
    return {[received](int) -> caf::result<int> {
      ++*received;
      return caf::delegated<int>{};
    }};
  });
  auto heap = std::make_shared<long>(0);
  auto r = rt.run([n, silent, received, heap](context& cx) -> task<long> {
    std::vector<troupe::task_handle<int>> hs;
    hs.reserve(n);
    auto before = rss_kib();
    auto heap_before = heap_in_use();
    for (long i = 0; i < n; ++i)
      hs.push_back(cx.spawn([silent](context& c) -> task<int> {
        auto v = co_await c.request<int>(silent, 1);
        co_return v ? *v : 0;
      }));
    while (received->load() < n) // every task is parked on its await
      co_await cx.yield_now();
    *heap = heap_in_use() - heap_before;
    co_return (rss_kib() - before) * 1024;
  }); // the root ends: its parked children are cancelled and joined
  caf::anon_send_exit(silent, caf::exit_reason::user_shutdown);
  long troupe_bytes = r ? *r : -1;
  if (opts.json)
    std::printf("{\"scenario\": \"parked_rss\", \"n\": %ld, \"troupe_bytes_per_task\": %.0f, "
                "\"troupe_heap_bytes_per_task\": %.0f, \"caf_bytes_per_actor\": %.0f, "
                "\"target_bytes\": 2048}\n",
                n, double(troupe_bytes) / n, double(*heap) / n, double(caf_bytes) / n);
  else
    std::printf("%-18s n=%-8ld troupe %8.0f B/parked task (heap %.0f B)   caf %8.0f B/bare actor\n",
                "parked_rss", n, double(troupe_bytes) / n, double(*heap) / n,
                double(caf_bytes) / n);
  std::fflush(stdout);
}

// -- finished_rss: memory of N children that ended and are not awaited yet --------------------

void finished_rss(long n) {
  // A child that ends unawaited leaves its outcome in its handle's cell and its actor
  // terminates; what stays allocated is the handle's state, the outcome and the terminated
  // actor object (the handle holds a strong reference to it until it goes).
  auto rt = make_runtime();
  auto& sys = rt.system();
  auto base = sys.registry().running();
  auto heap = std::make_shared<long>(0);
  auto live = std::make_shared<long>(0);
  auto r = rt.run([n, &sys, base, heap, live](context& cx) -> task<long> {
    std::vector<troupe::task_handle<int>> hs;
    hs.reserve(n);
    auto heap_before = heap_in_use();
    for (long i = 0; i < n; ++i)
      hs.push_back(cx.spawn([]() -> task<int> { co_return 1; }));
    // Every child runs and ends (this root is the one actor left besides the base).
    for (int k = 0; k < 1'000'000 && sys.registry().running() > base + 1; ++k)
      co_await cx.yield_now();
    *live = static_cast<long>(sys.registry().running() - base - 1);
    *heap = heap_in_use() - heap_before;
    long sum = 0;
    for (auto& h : hs)
      if (auto v = co_await cx.await(h)) sum += *v;
    co_return sum;
  });
  if (!r || *r != n) std::fprintf(stderr, "finished_rss: wrong result\n");
  if (opts.json)
    std::printf("{\"scenario\": \"finished_rss\", \"n\": %ld, \"heap_bytes_per_child\": %.0f, "
                "\"actors_left\": %ld}\n",
                n, double(*heap) / n, *live);
  else
    std::printf("%-18s n=%-8ld %8.0f B of heap per finished, unawaited child   (%ld of their "
                "actors still running)\n",
                "finished_rss", n, double(*heap) / n, *live);
  std::fflush(stdout);
}

// -- parallel_each: N trivial items, a window of `window` in flight ---------------------------


double troupe_parallel_each(long n) {
  auto rt = make_runtime();
  auto t0 = clk::now();
  auto r = rt.run([n](context& cx) -> task<long> {
    std::vector<int> items(n, 1);
    auto out = co_await cx.parallel_each(std::move(items),
                                         [](context&, const int& x) -> task<int> { co_return x; },
                                         {.max_concurrent = window_arg});
    long sum = 0;
    if (out)
      for (auto x : *out)
        sum += x;
    co_return sum;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "parallel_each: wrong result\n");
  print_sched_counters(rt.system(), "parallel_each");
  return s;
}

struct dispatcher_state {
  long total = 0;
  long started = 0;
  long done = 0;
  long sum = 0;
  caf::response_promise finished;
};

void dispatch_one(caf::stateful_actor<dispatcher_state>* self) {
  auto w = self->spawn([](caf::event_based_actor* me) -> caf::behavior {
    return {[me](int x) {
      me->quit();
      return x;
    }};
  });
  ++self->state.started;
  self->request(w, caf::infinite, 1).then([self](int v) {
    auto& st = self->state;
    st.sum += v;
    if (++st.done == st.total) {
      st.finished.deliver(st.sum);
      return;
    }
    if (st.started < st.total) dispatch_one(self);
  });
}

double caf_dispatch_window(long n, long window) {
  caf_env env;
  window = window <= 0 ? n : std::min(window, n);
  auto driver =
      env.sys->spawn([n, window](caf::stateful_actor<dispatcher_state>* self) -> caf::behavior {
        return {[self, n, window](go_atom) {
          self->state.total = n;
          self->state.finished = self->make_response_promise();
          for (long i = 0; i < window; ++i)
            dispatch_one(self);
          return self->state.finished;
        }};
      });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  long sum = -1;
  self->request(driver, caf::infinite, go_atom::value)
      .receive([&](long x) { sum = x; },
               [](caf::error&) { std::fprintf(stderr, "caf dispatcher failed\n"); });
  auto s = seconds_since(t0);
  if (sum != n) std::fprintf(stderr, "caf dispatcher: wrong sum\n");
  self->send_exit(driver, caf::exit_reason::user_shutdown);
  return s;
}

double caf_parallel_each(long n) {
  return caf_dispatch_window(n, window_arg);
}

// -- scope_fanout: a scope spawns N trivial children and joins them -------------------------

double troupe_scope_fanout(long n) {
  auto rt = make_runtime();
  auto t0 = clk::now();
  auto r = rt.run([n](context& cx) -> task<int> {
    auto out = co_await cx.scope(
        [n](context& s) -> task<int> {
          for (long i = 0; i < n; ++i)
            (void)s.spawn([]() -> task<int> { co_return 1; });
          co_return 0;
        },
        {.on_return = troupe::scope_exit::join});
    co_return out ? *out : -1;
  });
  auto s = seconds_since(t0);
  if (!r || *r != 0) std::fprintf(stderr, "scope_fanout: wrong result\n");
  return s;
}

// -- spawn_unawaited: a task spawns N trivial children, lets them end, returns unawaited -------

double troupe_spawn_unawaited(long n) {
  // The children end on their own (their outcomes wait in their handles' cells); the body
  // returns without awaiting them, and the task's end joins what is left: nothing, as
  // every child has ended (a join request per child before 2026-12-03). The raw-CAF side
  // is scope_fanout's: spawn N actors that quit, wait for their N down messages.
  auto rt = make_runtime();
  auto& sys = rt.system();
  auto base = sys.registry().running();
  auto t0 = clk::now();
  auto r = rt.run([n, &sys, base](context& cx) -> task<long> {
    std::vector<troupe::task_handle<int>> hs;
    hs.reserve(n);
    for (long i = 0; i < n; ++i)
      hs.push_back(cx.spawn([]() -> task<int> { co_return 1; }));
    while (sys.registry().running() > base + 1)
      co_await cx.yield_now();
    co_return n;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "spawn_unawaited: wrong result\n");
  return s;
}

double caf_scope_fanout(long n) {
  caf_env env;
  auto driver = env.sys->spawn([n](caf::stateful_actor<countdown_state>* self) -> caf::behavior {
    self->set_down_handler([self](caf::down_msg&) {
      if (--self->state.left == 0) self->state.done.deliver(true);
    });
    return {[self, n](go_atom) {
      self->state.left = n;
      self->state.done = self->make_response_promise();
      for (long i = 0; i < n; ++i)
        self->spawn<caf::monitored>([](caf::event_based_actor* kid) -> caf::behavior {
          kid->quit();
          return {};
        });
      return self->state.done;
    }};
  });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  self->request(driver, caf::infinite, go_atom::value)
      .receive([](bool) {}, [](caf::error&) { std::fprintf(stderr, "caf fanout failed\n"); });
  auto s = seconds_since(t0);
  self->send_exit(driver, caf::exit_reason::user_shutdown);
  return s;
}

} // namespace troupe_bench
