// Messaging: channel_pingpong, mailbox_throughput, semaphore_contention.

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

#include <troupe/troupe.hpp>

#include "bench_support.hpp"

namespace troupe_bench {

// -- channel_pingpong: N values each way between two tasks over two channels -----------------

double troupe_channel_pingpong(long n) {
  auto rt = make_runtime();
  auto t0 = clk::now();
  auto r = rt.run([n](context& cx) -> task<long> {
    auto ping = co_await troupe::open_channel<long>(cx, "", 64);
    auto pong = co_await troupe::open_channel<long>(cx, "", 64);
    if (!ping || !pong) co_return -1;
    auto a = *ping;
    auto b = *pong;
    auto echo = cx.spawn([a, b, n](context& c) -> task<void> {
      for (long i = 0; i < n; ++i) {
        auto v = co_await a.receive(c);
        if (!v || !co_await b.send(c, *v)) co_return;
      }
    });
    long sum = 0;
    for (long i = 0; i < n; ++i) {
      if (!co_await a.send(cx, i)) co_return -1;
      auto v = co_await b.receive(cx);
      if (!v) co_return -1;
      sum += *v;
    }
    (void)co_await cx.await(echo);
    co_return sum;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n * (n - 1) / 2) std::fprintf(stderr, "channel_pingpong: wrong result\n");
  print_sched_counters(rt.system(), "channel_pingpong");
  return s;
}

double caf_channel_pingpong(long n) {
  caf_env env;
  caf::scoped_actor self{*env.sys};
  auto pong = env.sys->spawn(
      [](caf::event_based_actor*) -> caf::behavior { return {[](long i) { return i; }}; });
  auto t0 = clk::now();
  auto ping = env.sys->spawn(
      [n, pong](caf::event_based_actor* s, caf::actor done) -> caf::behavior {
        s->send(pong, long{0});
        return {[=](long i) {
          if (i + 1 == n)
            s->send(done, true);
          else
            s->send(pong, i + 1);
        }};
      },
      caf::actor_cast<caf::actor>(self));
  self->receive([](bool) {});
  auto s = seconds_since(t0);
  self->send_exit(ping, caf::exit_reason::user_shutdown);
  self->send_exit(pong, caf::exit_reason::user_shutdown);
  return s;
}

// -- mailbox_throughput: N sends to a mailbox drained by one receiver ------------------------

double troupe_mailbox_throughput(long n) {
  auto rt = make_runtime();
  auto t0 = clk::now();
  auto r = rt.run([n](context& cx) -> task<long> {
    auto mb = co_await troupe::open_mailbox(cx, {.name = "bench", .capacity = 1024});
    if (!mb) co_return -1;
    auto box = *mb;
    auto sender = cx.spawn([box, n](context& c) -> task<void> {
      for (long i = 0; i < n; ++i)
        if (!*(co_await troupe::mailbox_send(c, box, i))) co_return;
    });
    long count = 0;
    for (long i = 0; i < n; ++i) {
      auto m = co_await troupe::mailbox_receive_as<long>(cx, box);
      if (!m) co_return -1;
      ++count;
    }
    (void)co_await cx.await(sender);
    co_return count;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "mailbox_throughput: wrong result\n");
  return s;
}

double caf_mailbox_throughput(long n) {
  caf_env env;
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  auto recv = env.sys->spawn(
      [n](caf::event_based_actor* s, caf::actor done) -> caf::behavior {
        auto count = std::make_shared<long>(0);
        return {[=](long) {
          if (++*count == n) s->send(done, true);
        }};
      },
      caf::actor_cast<caf::actor>(self));
  env.sys->spawn([n, recv](caf::event_based_actor* s) {
    for (long i = 0; i < n; ++i)
      s->send(recv, i);
  });
  self->receive([](bool) {});
  auto s = seconds_since(t0);
  self->send_exit(recv, caf::exit_reason::user_shutdown);
  return s;
}

// -- semaphore_contention: 8 tasks x N/8 acquire/release on one semaphore of 2 ---------------

void semaphore_contention(long n) {
  auto rt = make_runtime();
  constexpr int tasks = 8;
  long per = n / tasks;
  auto t0 = clk::now();
  auto r = rt.run([per](context& cx) -> task<long> {
    auto done = co_await cx.parallel(tasks, [per](context& c, size_t) -> task<long> {
      auto sem = co_await troupe::open_semaphore(c, "bench", 2);
      if (!sem) co_return 0;
      long got = 0;
      for (long i = 0; i < per; ++i) {
        auto p = co_await sem->acquire(c);
        if (p && *p) ++got;
      }
      co_return got;
    });
    if (!done) co_return -1;
    long sum = 0;
    for (auto x : *done)
      sum += x;
    co_return sum;
  });
  auto s = seconds_since(t0);
  long total = per * tasks;
  if (!r || *r != total) std::fprintf(stderr, "semaphore_contention: wrong result\n");
  if (opts.json)
    std::printf("{\"scenario\": \"semaphore_contention\", \"n\": %ld, \"troupe_per_s\": %.0f, "
                "\"caf_per_s\": null, \"ratio\": null, \"tasks\": %d, \"permits\": 2, "
                "\"threads\": %zu}\n",
                total, total / s, tasks, opts.threads);
  else
    std::printf("%-18s n=%-8ld troupe %12.0f acquisitions/s (8 tasks, 2 permits; no CAF "
                "equivalent)\n",
                "semaphore_contention", total, total / s);
  std::fflush(stdout);
}

} // namespace troupe_bench
