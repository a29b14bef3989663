#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <troupe/troupe.hpp>

#include "test_support.hpp"

using namespace std::chrono_literals;
using troupe::context;
using troupe::errc;
using troupe::task;

namespace {

using troupe_test::guard;
using troupe_test::make_virtual_rt;
using troupe_test::ms;

std::vector<int> iota(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i)
    v[i] = i;
  return v;
}

} // namespace

// -- scope ----------------------------------------------------------------------------------

TEST_CASE("a scope fails with its first failing child's error after cancelling the siblings") {
  auto rt = make_virtual_rt();
  auto cleaned = std::make_shared<int>(0);
  auto v = rt.run([cleaned](context& cx) -> task<std::string> {
    auto r = co_await cx.scope([cleaned](context& s) -> task<int> {
      guard body_guard{cleaned};
      (void)s.spawn([cleaned](context& c) -> task<int> {
        guard g{cleaned};
        co_await c.sleep(1h);
        co_return 1;
      });
      (void)s.spawn([](context& c) -> task<int> {
        co_await c.sleep(5ms);
        throw std::runtime_error("disk full");
      });
      co_await s.sleep(1h);
      co_return 0;
    });
    co_return (r ? std::string{"ok"} : troupe::detail_of(r.error())) + "|" +
        std::to_string(*cleaned) + "|" + std::to_string(ms(cx));
  });
  REQUIRE(v);
  CHECK(*v == "disk full|2|5"); // the sleeper and the scope body were cleaned up, at 5 ms
}

TEST_CASE("a scope fails when a child it did not await failed before the body returned") {
  // The child fails at its first run, while its end notice is still on its way to the scope
  // when the body returns (or cancels it): the failure came first, so it fails the scope,
  // whichever exit mode the scope has.
  for (int variant = 0; variant < 3; ++variant) {
    for (auto mode : {troupe::scope_exit::cancel, troupe::scope_exit::join}) {
      CAPTURE(variant, static_cast<int>(mode));
      auto rt = make_virtual_rt();
      auto v = rt.run([variant, mode](context& cx) -> task<std::string> {
        auto r = co_await cx.scope(
            [variant](context& s) -> task<int> {
              auto ok = s.spawn([](context&) -> task<int> { co_return 1; });
              auto bad = s.spawn([](context&) -> task<int> {
                throw std::runtime_error("boom");
                co_return 0;
              });
              if (variant == 0) co_await s.yield_now(); // the failing child runs meanwhile
              if (variant == 1) (void)co_await s.await(ok);
              if (variant == 2) {
                co_await s.yield_now();
                (void)co_await s.cancel(bad); // it has ended already: nothing to stop
              }
              co_return 42;
            },
            {.on_return = mode});
        co_return r ? std::to_string(*r) : troupe::detail_of(r.error());
      });
      REQUIRE(v);
      CHECK(*v == "boom");
    }
  }
}

TEST_CASE("awaiting a child inside a scope takes it out of the nursery") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto r = co_await cx.scope([](context& s) -> task<std::string> {
      auto h = s.spawn([](context& c) -> task<int> {
        co_await c.sleep(5ms);
        throw std::runtime_error("handled by the awaiter");
      });
      auto x = co_await s.await(h);
      co_return x ? "?" : "got: " + troupe::detail_of(x.error());
    });
    co_return r ? *r : troupe::render(r.error());
  });
  REQUIRE(v);
  CHECK(*v == "got: handled by the awaiter");
}

TEST_CASE("a scope whose body returns cancels and joins the children still running") {
  auto rt = make_virtual_rt();
  auto cleaned = std::make_shared<int>(0);
  auto v = rt.run([cleaned](context& cx) -> task<std::string> {
    auto r = co_await cx.scope([cleaned](context& s) -> task<int> {
      for (int i = 0; i < 3; ++i)
        (void)s.spawn([cleaned](context& c) -> task<int> {
          guard g{cleaned};
          co_await c.sleep(1h);
          co_return 1;
        });
      co_await s.sleep(2ms);
      co_return 42;
    });
    auto seen = *cleaned; // joined before the scope answered
    co_return std::to_string(r ? *r : -1) + "|" + std::to_string(seen);
  });
  REQUIRE(v);
  CHECK(*v == "42|3");
}

TEST_CASE("a scope body that throws cancels its children and fails with the exception") {
  auto rt = make_virtual_rt();
  auto cleaned = std::make_shared<int>(0);
  auto v = rt.run([cleaned](context& cx) -> task<std::string> {
    auto r = co_await cx.scope([cleaned](context& s) -> task<int> {
      (void)s.spawn([cleaned](context& c) -> task<int> {
        guard g{cleaned};
        co_await c.sleep(1h);
        co_return 1;
      });
      co_await s.sleep(1ms);
      throw std::logic_error("early exit");
    });
    co_return (r ? "?" : troupe::detail_of(r.error())) + "|" + std::to_string(*cleaned);
  });
  REQUIRE(v);
  CHECK(*v == "early exit|1");
}

// -- parallel / parallel_each ------------------------------------------------------------

TEST_CASE("parallel_each returns results in index order whatever the completion order") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::vector<int>> {
    auto r = co_await cx.parallel_each(iota(5), [](context& c, const int& i) -> task<int> {
      co_await c.sleep(std::chrono::milliseconds(50 - 10 * i)); // the last finishes first
      co_return i* i;
    });
    co_return r ? *r : std::vector<int>{};
  });
  REQUIRE(v);
  CHECK(*v == std::vector<int>{0, 1, 4, 9, 16});
}

TEST_CASE("parallel_each fails fast: cancels in-flight branches, never starts queued ones") {
  auto rt = make_virtual_rt();
  auto cleaned = std::make_shared<int>(0);
  auto started = std::make_shared<int>(0);
  auto v = rt.run([cleaned, started](context& cx) -> task<std::string> {
    auto r = co_await cx.parallel_each(iota(10),
                                       [cleaned, started](context& c, const int& i) -> task<int> {
                                         ++*started;
                                         guard g{cleaned};
                                         if (i == 1) {
                                           co_await c.sleep(3ms);
                                           throw std::runtime_error("branch 1 failed");
                                         }
                                         co_await c.sleep(1h);
                                         co_return i;
                                       },
                                       {.max_concurrent = 2});
    // All cancelled branches were joined before the call returned.
    co_return troupe::detail_of(r.error()) + "|started " + std::to_string(*started) + "|cleaned " +
        std::to_string(*cleaned) + "|at " + std::to_string(ms(cx));
  });
  REQUIRE(v);
  CHECK(*v == "branch 1 failed|started 2|cleaned 2|at 3");
}

TEST_CASE("when several branches fail, the lowest index's error is reported") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto r = co_await cx.parallel_each(iota(6), [](context& c, const int& i) -> task<int> {
      co_await c.sleep(std::chrono::milliseconds(i == 0 ? 10 : 1)); // index 0 fails last
      if (i % 2 == 0) throw std::runtime_error("failed " + std::to_string(i));
      co_return i;
    });
    co_return troupe::detail_of(r.error());
  });
  REQUIRE(v);
  // Index 2 and 4 fail at 1 ms; index 0 was still running and is cancelled: 2 wins.
  CHECK(*v == "failed 2");
}

TEST_CASE("parallel over n indexes, and the degenerate inputs") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto sum =
        co_await cx.parallel(100, [](context&, const size_t& i) -> task<size_t> { co_return i; });
    auto none = co_await cx.parallel_each(std::vector<int>{},
                                          [](context&, const int&) -> task<int> { co_return 1; });
    auto negative =
        co_await cx.parallel(-5, [](context&, const size_t&) -> task<int> { co_return 1; });
    auto absurd =
        co_await cx.parallel_each(iota(7), [](context&, const int& i) -> task<int> { co_return i; },
                                  {.max_concurrent = std::numeric_limits<int64_t>::max()});
    auto unlimited = co_await cx.parallel_each(
        iota(7), [](context&, const int& i) -> task<int> { co_return i; }, {.max_concurrent = -3});
    auto weird = co_await cx.parallel_each(iota(3), [](context&, const int& i) -> task<int> {
      if (i == 2) throw 42; // not a std::exception
      co_return i;
    });
    size_t total = 0;
    for (auto x : *sum)
      total += x;
    co_return std::to_string(total) + "|" + std::to_string(none->size()) + "|" +
        std::to_string(negative->size()) + "|" + std::to_string(absurd->size()) + "|" +
        std::to_string(unlimited->size()) + "|" +
        std::string{troupe::name_of(static_cast<errc>(weird.error().code()))} + "|" +
        std::to_string(ms(cx));
  });
  REQUIRE(v);
  CHECK(*v == "4950|0|0|7|7|task_failed|0");
}

TEST_CASE("parallel_each over 100,000 items with unlimited concurrency completes") {
  auto rt = troupe::runtime::builder{}.build(); // the default (work-stealing) scheduler
  REQUIRE(rt);
  auto v = rt->run([](context& cx) -> task<long> {
    std::vector<int> items(100'000, 1);
    auto r = co_await cx.parallel_each(std::move(items),
                                       [](context&, const int& x) -> task<int> { co_return x; },
                                       {.max_concurrent = 0});
    long sum = 0;
    if (r)
      for (auto x : *r)
        sum += x;
    co_return sum;
  });
  REQUIRE(v);
  CHECK(*v == 100'000);
}

// -- as_stream ------------------------------------------------------------------------------

TEST_CASE("as_stream yields in completion order and honours max_concurrent") {
  auto rt = make_virtual_rt();
  auto running = std::make_shared<int>(0);
  auto peak = std::make_shared<int>(0);
  auto v = rt.run([running, peak](context& cx) -> task<std::string> {
    auto s = cx.as_stream(std::vector<int>{30, 10, 20, 5, 1},
                          [running, peak](context& c, const int& d) -> task<int> {
                            *peak = std::max(*peak, ++*running);
                            co_await c.sleep(std::chrono::milliseconds(d));
                            --*running;
                            co_return d;
                          },
                          {.max_concurrent = 2});
    std::string out;
    while (auto item = co_await s.next()) {
      REQUIRE(*item);
      out += std::to_string((*item)->index) + ":" + std::to_string((*item)->value) + " ";
    }
    co_return out + "peak " + std::to_string(*peak);
  });
  REQUIRE(v);
  // 30 and 10 start; 10 ends at 10 -> 20 starts; 30 ends at 30 and 20 at 30 (FIFO by
  // start) ... each next branch starts as one finishes.
  CHECK(*v == "1:10 0:30 2:20 4:1 3:5 peak 2");
}

TEST_CASE("as_stream surfaces a failure when the consumer reaches it and cancels the rest") {
  auto rt = make_virtual_rt();
  auto cleaned = std::make_shared<int>(0);
  auto v = rt.run([cleaned](context& cx) -> task<std::string> {
    auto s = cx.as_stream(iota(4), [cleaned](context& c, const int& i) -> task<int> {
      guard g{cleaned};
      if (i == 2) {
        co_await c.sleep(5ms);
        throw std::runtime_error("stream broke");
      }
      co_await c.sleep(std::chrono::milliseconds(i == 0 ? 1 : 1000));
      co_return i;
    });
    std::string out;
    while (auto item = co_await s.next()) {
      if (*item)
        out += std::to_string((*item)->index) + " ";
      else
        out +=
            "error: " + troupe::detail_of(item->error()) + " cleaned " + std::to_string(*cleaned);
    }
    co_return out;
  });
  REQUIRE(v);
  CHECK(*v == "0 error: stream broke cleaned 4");
}

TEST_CASE("as_stream reports the lowest index's error when several branches fail") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto s = cx.as_stream(iota(6), [](context& c, const int& i) -> task<int> {
      // Index 2 yields first, so index 4's timer fires first at 1 ms: 4 reports before 2,
      // and both fail for real (neither awaits again after the other failed).
      if (i == 2) {
        co_await c.yield_now();
        co_await c.yield_now();
      }
      co_await c.sleep(std::chrono::milliseconds(i % 2 == 0 && i != 0 ? 1 : 1000));
      if (i == 2 || i == 4) throw std::runtime_error("failed " + std::to_string(i));
      co_return i;
    });
    co_await cx.sleep(5ms); // both failures are in before the first pull
    std::string out;
    while (auto item = co_await s.next())
      out += *item ? std::to_string((*item)->index) + " " : troupe::detail_of(item->error());
    co_return out;
  });
  REQUIRE(v);
  CHECK(*v == "failed 2");
}

// -- settle and race --------------------------------------------------------------------------

TEST_CASE("parallel_settle never cancels; an error returned as a value counts as success") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto r = co_await cx.parallel_settle(
        iota(4), [](context& c, const int& i) -> task<caf::expected<int>> {
          co_await c.sleep(std::chrono::milliseconds(i));
          if (i == 1) throw std::runtime_error("thrown");
          if (i == 2) co_return troupe::make_error(errc::invalid_argument, "i", "returned");
          co_return i * 10;
        });
    std::string out = std::to_string(r.succeeded) + " ok, " + std::to_string(r.failed) + " failed:";
    for (auto& x : r.results)
      out += x ? (*x ? " " + std::to_string(**x) : " value-error")
               : " " + troupe::detail_of(x.error());
    co_return out;
  });
  REQUIRE(v);
  CHECK(*v == "3 ok, 1 failed: 0 thrown value-error 30");
}

TEST_CASE("parallel_race: the first success wins and the rest are cancelled") {
  auto rt = make_virtual_rt();
  auto cleaned = std::make_shared<int>(0);
  auto v = rt.run([cleaned](context& cx) -> task<std::string> {
    auto r = co_await cx.parallel_race(std::vector<int>{40, 7, 25},
                                       [cleaned](context& c, const int& d) -> task<std::string> {
                                         guard g{cleaned};
                                         co_await c.sleep(std::chrono::milliseconds(d));
                                         co_return "mirror " + std::to_string(d);
                                       });
    co_return (r ? r->value + " #" + std::to_string(r->index) : "?") + "|" +
        std::to_string(*cleaned) + "|" + std::to_string(ms(cx));
  });
  REQUIRE(v);
  CHECK(*v == "mirror 7 #1|3|7");
}

TEST_CASE("parallel_race: when every branch fails, an aggregate error lists them all") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto r = co_await cx.parallel_race(iota(3), [](context&, const int& i) -> task<int> {
      throw std::runtime_error("no " + std::to_string(i));
      co_return 0;
    });
    auto empty = co_await cx.parallel_race(std::vector<int>{},
                                           [](context&, const int&) -> task<int> { co_return 0; });
    std::string out{troupe::name_of(static_cast<errc>(r.error().code()))};
    for (auto& e : troupe::errors_of(r.error()))
      out += " " + troupe::detail_of(e);
    co_return out + "|" + (troupe::is(empty.error(), errc::all_failed) ? "empty" : "?");
  });
  REQUIRE(v);
  CHECK(*v == "all_failed no 0 no 1 no 2|empty");
}

// -- abort tokens ------------------------------------------------------------------------------

TEST_CASE("an abort token is first-writer-wins and refuses a reason without a code") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto tok = cx.make_abort_token();
    auto before = co_await cx.abort_requested(tok);
    auto first = co_await cx.request_abort(tok, {"lane_red", "lane 3 failed"});
    auto second = co_await cx.request_abort(tok, {"other", "too late"});
    auto bad = co_await cx.request_abort(tok, {"", "no code"});
    auto after = co_await cx.abort_requested(tok);
    co_return std::string{before ? "?" : "clear"} + "|" + (first && *first ? "won" : "?") + "|" +
        (second && !*second ? "lost" : "?") + "|" + troupe::field_of(bad.error()) + "|" +
        (after ? after->code + ":" + after->message : "?");
  });
  REQUIRE(v);
  CHECK(*v == "clear|won|lost|reason.code|lane_red:lane 3 failed");
}

TEST_CASE("settle_with_abort: one lane goes red, the others stop at their next poll") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    troupe::abort_options opts;
    opts.max_concurrent = 4;
    opts.abort_on = [](const caf::error& e, size_t i) -> std::optional<troupe::abort_reason> {
      return troupe::abort_reason{"lane_red",
                                  "lane " + std::to_string(i) + ": " + troupe::detail_of(e)};
    };
    auto out = co_await cx.settle_with_abort(
        iota(6),
        [](context& c, const int& lane, troupe::abort_token tok) -> task<caf::expected<int>> {
          for (int step = 0; step < 10; ++step) {
            co_await c.check_abort(tok); // the poll
            co_await c.sleep(5ms);
            if (lane == 2 && step == 3)
              co_return troupe::make_error(errc::invalid_argument, "lane", "tests red");
          }
          co_return lane;
        },
        opts);
    REQUIRE(out);
    auto decisive = troupe::decisive_error(*out);
    std::string idx;
    for (auto i : out->abandoned_indexes)
      idx += std::to_string(i);
    co_return std::to_string(out->succeeded) + "/" + std::to_string(out->failed) + "/" +
        std::to_string(out->abandoned) + "|" + (out->aborted ? out->reason->code : "-") + "|" +
        idx + "|" + (decisive ? troupe::detail_of(*decisive) : "-") + "|" + std::to_string(ms(cx));
  });
  REQUIRE(v);
  // Lanes 0..3 run; lane 2 goes red at 20 ms. Lanes 0, 1, 3 polled at 20 ms too, just before
  // the token tripped, so they stop at their next poll, 25 ms; 4 and 5 never start.
  CHECK(*v == "0/1/5|lane_red|01345|tests red|25");
}

TEST_CASE("settle_with_abort: max_failures trips the token; a value below 1 is refused") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto body = [](context& c, const int& i, troupe::abort_token tok) -> task<int> {
      co_await c.sleep(std::chrono::milliseconds(i + 1));
      if (i < 3) throw std::runtime_error("f" + std::to_string(i));
      co_await c.check_abort(tok);
      co_return i;
    };
    auto bad = co_await cx.settle_with_abort(iota(5), body, {.max_failures = 0});
    auto out =
        co_await cx.settle_with_abort(iota(8), body, {.max_concurrent = 4, .max_failures = 2});
    REQUIRE(out);
    co_return troupe::field_of(bad.error()) + "|" + std::to_string(out->failed) + "|" +
        (out->aborted ? out->reason->code : "-") + "|" + std::to_string(out->succeeded);
  });
  REQUIRE(v);
  CHECK(*v == "max_failures|3|max_failures|0");
}

// -- deadline and retry ------------------------------------------------------------------------

TEST_CASE("deadline cancels the body at its deadline and answers deadline_exceeded") {
  auto rt = make_virtual_rt();
  auto cleaned = std::make_shared<int>(0);
  auto v = rt.run([cleaned](context& cx) -> task<std::string> {
    auto slow = co_await cx.deadline(50ms, [cleaned](context& c) -> task<int> {
      guard g{cleaned};
      co_await c.sleep(1h);
      co_return 1;
    });
    auto at = ms(cx);
    auto fast = co_await cx.deadline(50ms, [](context& c) -> task<int> {
      co_await c.sleep(10ms);
      co_return 2;
    });
    co_return std::string{troupe::name_of(static_cast<errc>(slow.error().code()))} + "@" +
        std::to_string(at) + "|" + std::to_string(*cleaned) + "|" +
        std::to_string(fast ? *fast : -1);
  });
  REQUIRE(v);
  CHECK(*v == "deadline_exceeded@50|1|2");
}

TEST_CASE("nested deadlines take the tighter one") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto r = co_await cx.deadline(100ms, [](context& c) -> task<std::string> {
      auto inner = co_await c.deadline(10s, [](context& ic) -> task<int64_t> {
        auto d = ic.current_deadline();
        co_await ic.sleep(1h);
        co_return d
            ? std::chrono::duration_cast<std::chrono::milliseconds>(d->time_since_epoch()).count()
            : -1;
      });
      co_return inner ? "inner finished" : troupe::render(inner.error());
    });
    co_return (r ? *r : std::string{troupe::name_of(static_cast<errc>(r.error().code()))}) +
        " at " + std::to_string(ms(cx));
  });
  REQUIRE(v);
  CHECK(*v == "deadline_exceeded at 100");
}

TEST_CASE("retry runs the body until it succeeds, or answers the last error") {
  auto rt = make_virtual_rt();
  auto tries = std::make_shared<int>(0);
  auto v = rt.run([tries](context& cx) -> task<std::string> {
    auto ok = co_await cx.retry(5,
                                [tries]() -> task<int> {
                                  if (++*tries < 3)
                                    throw std::runtime_error("flaky " + std::to_string(*tries));
                                  co_return 7;
                                },
                                {.delay = 100ms});
    auto at = ms(cx);
    auto never = co_await cx.retry(2, []() -> task<caf::expected<int>> {
      co_return troupe::make_error(errc::invalid_argument, "x", "always");
    });
    auto bad = co_await cx.retry(0, []() -> task<int> { co_return 1; });
    co_return std::to_string(ok ? *ok : -1) + " after " + std::to_string(*tries) + " at " +
        std::to_string(at) + "|" + troupe::detail_of(never.error()) + "|" +
        troupe::field_of(bad.error());
  });
  REQUIRE(v);
  CHECK(*v == "7 after 3 at 200|always|attempts");
}

TEST_CASE("a joining scope waits for its children; a failure while draining still fails it") {
  auto rt = make_virtual_rt();
  auto done = std::make_shared<int>(0);
  auto cleaned = std::make_shared<int>(0);
  auto v = rt.run([done, cleaned](context& cx) -> task<std::string> {
    auto joined = co_await cx.scope(
        [done](context& s) -> task<int> {
          for (int i = 1; i <= 3; ++i)
            (void)s.spawn([done, i](context& c) -> task<int> {
              co_await c.sleep(std::chrono::milliseconds(10 * i));
              ++*done;
              co_return i;
            });
          co_return 5; // returns at once; the scope waits for the three
        },
        {.on_return = troupe::scope_exit::join});
    auto at = ms(cx);
    auto failed = co_await cx.scope(
        [cleaned](context& s) -> task<int> {
          (void)s.spawn([cleaned](context& c) -> task<int> {
            guard g{cleaned};
            co_await c.sleep(1h);
            co_return 1;
          });
          (void)s.spawn([](context& c) -> task<int> {
            co_await c.sleep(5ms);
            throw std::runtime_error("late failure");
          });
          co_return 6;
        },
        {.on_return = troupe::scope_exit::join});
    co_return std::to_string(joined ? *joined : -1) + "|" + std::to_string(*done) + "@" +
        std::to_string(at) + "|" + (failed ? "?" : troupe::detail_of(failed.error())) + "|" +
        std::to_string(*cleaned) + "@" + std::to_string(ms(cx));
  });
  REQUIRE(v);
  CHECK(*v == "5|3@30|late failure|1@35");
}

TEST_CASE("a burst of children ending on two threads while their scope still spawns: every end "
          "notice is taken, and a failure among them fails the scope") {
  // The children's end notices go on the scope's list of ended children, pushed from both
  // workers while the scope takes them (one done message per burst): none may be lost (a
  // lost one leaves the joining scope waiting for good: the suite's timeout fails it, as
  // no deadline ends a scope before its children have ended).
  auto rt = troupe::runtime::builder{}.threads(2).build();
  REQUIRE(rt);
  constexpr int n = 20000;
  auto ended = std::make_shared<std::atomic<int>>(0);
  auto r = rt->run([ended](context& cx) -> task<std::string> {
    auto joined = co_await cx.scope(
        [ended](context& s) -> task<int> {
          for (int i = 0; i < n; ++i) {
            (void)s.spawn([ended]() -> task<int> {
              ended->fetch_add(1);
              co_return 1;
            });
            if (i % 500 == 499) co_await s.yield_now(); // those so far start, and end meanwhile
          }
          co_return 7;
        },
        {.on_return = troupe::scope_exit::join});
    auto all = ended->load();
    auto failed = co_await cx.scope(
        [](context& s) -> task<int> {
          for (int i = 0; i < n; ++i) {
            (void)s.spawn([i]() -> task<int> {
              if (i == n / 2) throw std::runtime_error("child 10000 failed");
              co_return 1;
            });
            if (i % 500 == 499) co_await s.yield_now();
          }
          co_return 8;
        },
        {.on_return = troupe::scope_exit::join});
    co_return std::to_string(joined ? *joined : -1) + "|" + std::to_string(all) + "|" +
        (failed ? "no failure" : troupe::detail_of(failed.error()));
  });
  REQUIRE(r);
  CHECK(*r == "7|20000|child 10000 failed");
}

TEST_CASE("every form answers an empty item list at once") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    std::vector<int> none;
    auto body = [](context&, const int& i) -> task<int> { co_return i; };
    auto settle = co_await cx.parallel_settle(none, body);
    auto s = cx.as_stream(none, body);
    auto first = co_await s.next();
    auto aborted = co_await cx.settle_with_abort(
        none, [](context&, const int& i, troupe::abort_token) -> task<int> { co_return i; });
    co_return std::to_string(settle.results.size()) + "|" + (first ? "?" : "end") + "|" +
        std::to_string(aborted->results.size()) + "|" + std::to_string(ms(cx));
  });
  REQUIRE(v);
  CHECK(*v == "0|end|0|0");
}

// -- regressions found in review -------------------------------------------------------------

TEST_CASE("a joining scope whose body leaves a stream half-read still completes") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto r = co_await cx.scope(
        [](context& s) -> task<int> {
          auto stream = s.as_stream(iota(4), [](context& c, const int& i) -> task<int> {
            co_await c.sleep(std::chrono::milliseconds(1 + 1000 * i));
            co_return i;
          });
          auto first = co_await stream.next();
          co_return first&&* first ? (*first)->value : -1;
        },
        {.on_return = troupe::scope_exit::join});
    co_return std::to_string(r ? *r : -1) + " at " + std::to_string(ms(cx));
  });
  REQUIRE(v); // before the fix: the scope miscounted its branches and never completed
  CHECK(*v == "0 at 1");
}

TEST_CASE("cancelling a joining scope while it waits for its children stops them") {
  auto rt = make_virtual_rt();
  auto cleaned = std::make_shared<int>(0);
  auto v = rt.run([cleaned](context& cx) -> task<std::string> {
    auto holder = cx.spawn([cleaned](context& c) -> task<int> {
      auto r = co_await c.scope(
          [cleaned](context& s) -> task<int> {
            (void)s.spawn([cleaned](context& k) -> task<int> {
              guard g{cleaned};
              co_await k.sleep(1h);
              co_return 1;
            });
            co_return 0; // the scope now waits for its child
          },
          {.on_return = troupe::scope_exit::join});
      co_return r ? *r : -1;
    });
    co_await cx.sleep(10ms);
    auto stopped = co_await cx.cancel(holder);
    co_return std::to_string(stopped && *stopped) + "|" + std::to_string(*cleaned) + "|" +
        std::to_string(ms(cx));
  });
  REQUIRE(v);
  CHECK(*v == "1|1|10"); // at once, not after the child's hour
}

TEST_CASE("an await abandoned by a graceful cancel leaves the result to the next await") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    // The worker is not P's child (a graceful cancel of P would reach P's own children).
    auto worker = cx.spawn([](context& k) -> task<int> {
      co_await k.sleep(50ms);
      co_return 7;
    });
    auto p = cx.spawn([worker](context& c) -> task<std::string> {
      try {
        (void)co_await c.await(worker);
        co_return "not cancelled?";
      } catch (const troupe::task_cancelled&) {
      }
      auto again = co_await c.await(worker); // cleanup: take the result after all
      co_return again ? std::to_string(*again) : troupe::render(again.error());
    });
    co_await cx.sleep(10ms);
    (void)co_await cx.cancel_graceful(p, 1s);
    auto r = co_await cx.await(p);
    co_return (r ? *r : troupe::render(r.error())) + " at " + std::to_string(ms(cx));
  });
  REQUIRE(v);
  CHECK(*v == "7 at 50");
}

TEST_CASE("a graceful cancel reaches the children a task awaits") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto p = cx.spawn([](context& c) -> task<std::string> {
      auto child = c.spawn([](context& k) -> task<int> {
        co_await k.sleep(50ms);
        co_return 7;
      });
      try {
        (void)co_await c.await(child);
      } catch (const troupe::task_cancelled&) {
      }
      auto again = co_await c.await(child);
      co_return again ? "?" : std::string{troupe::name_of(static_cast<errc>(again.error().code()))};
    });
    co_await cx.sleep(10ms);
    (void)co_await cx.cancel_graceful(p, 1s);
    auto r = co_await cx.await(p);
    co_return (r ? *r : "?") + " at " + std::to_string(ms(cx));
  });
  REQUIRE(v);
  CHECK(*v == "cancelled at 10");
}

TEST_CASE("a branch that ends outside the protocol still reports to its combinator") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto r = co_await cx.parallel_settle(iota(3), [](context& c, const int& i) -> task<int> {
      if (i == 1) {
        c.self()->quit(caf::sec::runtime_error); // the actor is gone after this handler
        co_await c.sleep(1h);
      }
      co_return i;
    });
    co_return std::to_string(r.succeeded) + "/" + std::to_string(r.failed) + "|" +
        (r.results[1]
             ? "?"
             : std::string{troupe::name_of(static_cast<errc>(r.results[1].error().code()))});
  });
  REQUIRE(v);
  CHECK(*v == "2/1|cancelled");
}

TEST_CASE("fail-fast reports a real failure rather than an earlier cancellation") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto r = co_await cx.parallel_each(iota(4), [](context& c, const int& i) -> task<int> {
      // 0 and 3 fail as they start, 0 first: its report arrives before 3's.
      if (i == 0) // a cancellation-class error, e.g. from awaiting a cancelled child
        throw troupe::task_error{troupe::make_error(errc::cancelled, "", "child cancelled")};
      if (i == 3) throw std::runtime_error("the real failure");
      co_await c.sleep(1h);
      co_return i;
    });
    co_return troupe::detail_of(r.error());
  });
  REQUIRE(v);
  CHECK(*v == "the real failure");
}

TEST_CASE("stop() ends a runtime whose joining scope waits on a child that never ends") {
  auto cleaned = std::make_shared<int>(0);
  {
    auto rt = make_virtual_rt();
    auto h = rt.spawn([cleaned](context& cx) -> task<int> {
      auto r = co_await cx.scope(
          [cleaned](context& s) -> task<int> {
            (void)s.spawn([cleaned](context& k) -> task<int> {
              guard g{cleaned};
              for (;;)
                co_await k.sleep(1s);
            });
            co_return 0;
          },
          {.on_return = troupe::scope_exit::join});
      co_return r ? *r : -1;
    });
    REQUIRE(h);
    rt.advance(5s);
    rt.stop();
  }
  CHECK(*cleaned == 1);
}

// -- the error-as-value rule, one test per combinator (README: "Errors returned as values") --

namespace {

using ev = caf::expected<int>;

/// Branch i returns an error as a value for odd i (after i ms), a value for even i.
task<ev> odd_fails(context& c, int i) {
  co_await c.sleep(std::chrono::milliseconds(i));
  if (i % 2 == 1) co_return troupe::make_error(errc::not_found, "branch", std::to_string(i));
  co_return i * 10;
}

std::string show(const ev& x) {
  return x ? std::to_string(*x) : "err " + troupe::detail_of(x.error());
}

} // namespace

TEST_CASE("error as value: collecting combinators hand a returned error back as a value") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    std::string out;
    // parallel_each / parallel: no fail-fast on a returned error; it is the branch's value.
    auto each = co_await cx.parallel_each(iota(4), [](context& c, const int& i) { return odd_fails(c, i); });
    for (auto& x : *each)
      out += show(x) + ",";
    auto par = co_await cx.parallel(2, [](context& c, size_t i) { return odd_fails(c, static_cast<int>(i)); });
    out += "|" + show((*par)[1]);
    // parallel_settle: the branch succeeded (it produced a value that is an error).
    auto settled = co_await cx.parallel_settle(iota(4), [](context& c, const int& i) { return odd_fails(c, i); });
    out += "|" + std::to_string(settled.succeeded) + "/" + std::to_string(settled.failed);
    // as_stream: the value comes through in completion order.
    auto s = cx.as_stream(std::vector<int>{1}, [](context& c, const int& i) { return odd_fails(c, i); });
    auto first = co_await s.next();
    out += "|" + (first && *first ? show((*first)->value) : std::string{"?"});
    // scope and deadline: the body's value, unchanged.
    auto sc = co_await cx.scope([](context& c) { return odd_fails(c, 3); });
    auto dl = co_await cx.deadline(1s, [](context& c) { return odd_fails(c, 5); });
    out += "|" + show(*sc) + "|" + show(*dl);
    co_return out;
  });
  REQUIRE(v);
  CHECK(*v == "0,err 1,20,err 3,|err 1|4/0|err 1|err 3|err 5");
}

TEST_CASE("error as value: deciding combinators count a returned error as a failure") {
  auto rt = make_virtual_rt();
  auto tries = std::make_shared<int>(0);
  auto v = rt.run([tries](context& cx) -> task<std::string> {
    std::string out;
    // parallel_race: the odd branch answers first (1 ms) with an error: it does not win.
    auto race = co_await cx.parallel_race(std::vector<int>{1, 4}, [](context& c, const int& i) { return odd_fails(c, i); });
    out += race ? std::to_string(race->index) + ":" + show(race->value) : "?";
    // ... and when every branch returns an error: all_failed, listing each.
    auto none = co_await cx.parallel_race(std::vector<int>{1, 3}, [](context& c, const int& i) { return odd_fails(c, i); });
    out += "|" + std::string{troupe::name_of(static_cast<errc>(none.error().code()))} + " " +
           std::to_string(troupe::errors_of(none.error()).size());
    // retry: a returned error is retried; the result is flat (expected<int>).
    caf::expected<int> r = co_await cx.retry(4, [tries](context& c) -> task<ev> {
      return odd_fails(c, ++*tries < 3 ? 1 : 2);
    });
    out += "|" + show(r) + " after " + std::to_string(*tries);
    // settle_with_abort: a returned error is a failure (and may trip the token).
    auto ab = co_await cx.settle_with_abort(iota(4), [](context& c, const int& i, troupe::abort_token) {
      return odd_fails(c, i);
    });
    out += "|" + std::to_string(ab->succeeded) + "/" + std::to_string(ab->failed);
    co_return out;
  });
  REQUIRE(v);
  CHECK(*v == "1:40|all_failed 2|20 after 3|2/2");
}

TEST_CASE("a joining scope whose await was abandoned by a graceful cancel still drains") {
  // The body awaits a child, a graceful cancel abandons that await, the child ends (its end
  // notice reaches the scope while the body still runs) and the body returns later: the
  // scope must not wait for the child's end a second time.
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto p = cx.spawn([](context& c) -> task<std::string> {
      try {
        (void)co_await c.scope(
          [](context& s) -> task<int> {
            auto child = s.spawn([](context& k) -> task<int> {
              try {
                co_await k.sleep(50ms);
              } catch (const troupe::task_cancelled&) {
              }
              co_return 1;
            });
            try {
              (void)co_await s.await(child);
            } catch (const troupe::task_cancelled&) {
            }
            co_await s.sleep(5ms); // the child ends meanwhile
            co_return 7;
          },
          {.on_return = troupe::scope_exit::join});
      } catch (const troupe::task_cancelled&) { // the cancel reached the scope too; the
        // call throws once the scope has ended (at 15 ms: its body returned 7 and drained)
      }
      co_await c.sleep(20ms); // then this task ends, joining the scope: it must have drained
      co_return std::string{"p ended"};
    });
    co_await cx.sleep(10ms);
    (void)co_await cx.cancel_graceful(p, 1s);
    auto r = co_await cx.await(p);
    co_return (r ? *r : troupe::render(r.error())) + " at " + std::to_string(ms(cx));
  });
  REQUIRE(v);
  CHECK(*v == "p ended at 35");
}

// -- a graceful cancel of a task waiting in a structured call -------------------------------

namespace {

/// A body that sleeps until cancelled, then cleans up for 10 ms (logging it) and rethrows.
task<int> cleans_up_10ms(context& c, std::shared_ptr<std::vector<std::string>> log,
                         std::string name) {
  bool cancelled = false;
  try {
    co_await c.sleep(1h);
  } catch (const troupe::task_cancelled&) {
    cancelled = true;
  }
  if (cancelled) { // (no co_await in a handler)
    co_await c.sleep(10ms);
    log->push_back(name + " cleaned@" + std::to_string(ms(c)));
    throw troupe::task_cancelled{};
  }
  co_return 0;
}

/// Spawns a task that waits in the structured call `kind`, cancels it gracefully (1 s of
/// grace) at 4 ms, and returns the log: the children's cleanup, then where the call left.
task<std::vector<std::string>> graceful_in_call(context& cx, std::string kind) {
  auto log = std::make_shared<std::vector<std::string>>();
  auto p = cx.spawn([log, kind](context& c) -> task<int> {
    std::string local = "alive"; // what the call's children see by reference
    try {
      if (kind == "scope") {
        (void)co_await c.scope([&](context& s) -> task<int> {
          (void)s.spawn([log](context& x) { return cleans_up_10ms(x, log, "child"); });
          auto r = co_await cleans_up_10ms(s, log, "scope body, " + local);
          co_return r;
        });
      } else if (kind == "deadline") {
        (void)co_await c.deadline(1h, [&](context& d) {
          return cleans_up_10ms(d, log, "deadline body, " + local);
        });
      } else if (kind == "settle") {
        auto r = co_await c.parallel_settle(iota(2), [&](context& b, const int& i) {
          return cleans_up_10ms(b, log, "branch " + std::to_string(i) + ", " + local);
        });
        log->push_back("settled: " + std::to_string(r.failed) + " failed");
      } else if (kind == "each") {
        (void)co_await c.parallel_each(iota(2), [&](context& b, const int& i) {
          return cleans_up_10ms(b, log, "branch " + std::to_string(i) + ", " + local);
        });
      } else if (kind == "race") {
        (void)co_await c.parallel_race(iota(2), [&](context& b, const int& i) {
          return cleans_up_10ms(b, log, "branch " + std::to_string(i) + ", " + local);
        });
      } else if (kind == "abort") {
        (void)co_await c.settle_with_abort(
            iota(2), [&](context& b, const int& i, const troupe::abort_token&) {
              return cleans_up_10ms(b, log, "branch " + std::to_string(i) + ", " + local);
            });
      } else if (kind == "retry") {
        (void)co_await c.retry(3, [&](context& a) {
          return cleans_up_10ms(a, log, "attempt, " + local);
        });
      }
      log->push_back("call returned@" + std::to_string(ms(c)));
    } catch (const troupe::task_cancelled&) {
      log->push_back("call threw task_cancelled@" + std::to_string(ms(c)));
    }
    local = "gone";
    co_return 0;
  });
  co_await cx.sleep(4ms);
  (void)co_await cx.cancel_graceful(p, 1s);
  (void)co_await cx.await(p);
  std::sort(log->begin(), log->end() - 1); // the children's order among themselves is free
  co_return *log;
}

} // namespace

TEST_CASE("a graceful cancel of a task waiting in a structured call gives the call's children "
          "their grace, and the call throws task_cancelled only once they have ended") {
  // The children see the caller's locals by reference: they clean up while those still live,
  // with the caller's grace (10 ms each, not cut short by a forced cancel), and the call
  // throws after that. (Before 2026-12-04 the call threw at once, at 4 ms: a combinator's
  // branches were forced at once, and a scope or deadline body ran on after the caller left.)
  using V = std::vector<std::string>;
  auto run = [](std::string kind) {
    auto rt = make_virtual_rt();
    auto v = rt.run([kind](context& cx) { return graceful_in_call(cx, kind); });
    REQUIRE(v);
    return *v;
  };
  CHECK(run("scope") == V{"child cleaned@14", "scope body, alive cleaned@14",
                          "call threw task_cancelled@14"});
  CHECK(run("deadline") == V{"deadline body, alive cleaned@14", "call threw task_cancelled@14"});
  for (auto kind : {"settle", "each", "race", "abort"}) {
    CAPTURE(kind);
    CHECK(run(kind) == V{"branch 0, alive cleaned@14", "branch 1, alive cleaned@14",
                         "call threw task_cancelled@14"});
  }
  // One attempt cleans up; no other attempt starts.
  CHECK(run("retry") == V{"attempt, alive cleaned@14", "call threw task_cancelled@14"});
}

TEST_CASE("after a graceful cancel, cleanup may still call structured calls: they answer, and "
          "their children inherit the cancel") {
  auto rt = make_virtual_rt();
  auto started = std::make_shared<int>(0);
  auto v = rt.run([started](context& cx) -> task<std::string> {
    auto p = cx.spawn([started](context& c) -> task<std::string> {
      std::string out;
      try {
        co_await c.sleep(1h);
      } catch (const troupe::task_cancelled&) {
        out += "cancelled;"; // once: the calls below run
      }
      auto s = co_await c.scope([started](context& x) -> task<int> {
        co_await x.sleep(1ms);
        co_return ++*started;
      });
      auto each = co_await c.parallel(2, [started](context& b, const size_t&) -> task<int> {
        co_await b.sleep(1ms);
        co_return ++*started;
      });
      // Children spawned by a cancelled task are cancelled too (the same grace): each call
      // answers (it does not throw again) with its children's cancellation.
      out += std::string{!s && troupe::is_cancellation(s.error()) ? "scope cancelled;" : "?;"} +
          (!each && troupe::is_cancellation(each.error()) ? "parallel cancelled@" : "?@") +
          std::to_string(ms(c));
      co_return out;
    });
    co_return co_await troupe_test::graceful_cancel_and_await(cx, p, 3ms);
  });
  REQUIRE(v);
  CHECK(*v == "cancelled;scope cancelled;parallel cancelled@3");
  CHECK(*started == 0);
}

TEST_CASE("a task forced to stop inside a structured call keeps its frame until the call's "
          "children have ended") {
  // The scope's body (and a deadline's) sees the caller's locals by reference; a forced
  // cancel of the caller stops the children too, and their cleanup (a destructor here) must
  // find those locals alive. (Before 2026-12-04 the caller's frame went first.)
  for (std::string kind : {"scope", "deadline", "each"}) {
    CAPTURE(kind);
    auto rt = make_virtual_rt();
    auto seen = std::make_shared<std::vector<std::string>>();
    auto v = rt.run([kind, seen](context& cx) -> task<std::string> {
      auto p = cx.spawn([kind, seen](context& c) -> task<int> {
        // (The flag is shared, so the check itself never reads a frame that is gone.)
        struct life {
          std::shared_ptr<bool> alive = std::make_shared<bool>(true);
          ~life() { *alive = false; }
        } local;
        struct touch {
          std::shared_ptr<bool> alive;
          std::shared_ptr<std::vector<std::string>> seen;
          ~touch() { seen->push_back(*alive ? "alive" : "gone"); }
        };
        if (kind == "scope")
          (void)co_await c.scope([&](context& s) -> task<int> {
            touch t{local.alive, seen};
            co_await s.sleep(1h);
            co_return 0;
          });
        else if (kind == "deadline")
          (void)co_await c.deadline(2h, [&](context& s) -> task<int> {
            touch t{local.alive, seen};
            co_await s.sleep(1h);
            co_return 0;
          });
        else
          (void)co_await c.parallel(2, [&](context& s, const size_t&) -> task<int> {
            touch t{local.alive, seen};
            co_await s.sleep(1h);
            co_return 0;
          });
        co_return 1;
      });
      co_await cx.sleep(5ms);
      (void)co_await cx.cancel(p);
      auto r = co_await cx.await(p);
      co_return r ? std::string{"?"} : troupe::render(r.error());
    });
    REQUIRE(v);
    CHECK(v->find("cancelled") != std::string::npos);
    CHECK(*seen == std::vector<std::string>(kind == "each" ? 2 : 1, "alive"));
  }
}

TEST_CASE("a combinator under a graceful cancel starts no further branch") {
  // One branch at a time: the running one cleans up, no queued one starts, and the call
  // throws once it has ended (before, every queued item was started as the running
  // branches reported, each running until its first await).
  for (std::string kind : {"settle", "each", "race", "abort"}) {
    CAPTURE(kind);
    auto rt = make_virtual_rt();
    auto started = std::make_shared<int>(0);
    auto v = rt.run([kind, started](context& cx) -> task<std::string> {
      auto p = cx.spawn([kind, started](context& c) -> task<std::string> {
        auto body = [started](context& b, const int&) -> task<int> {
          ++*started;
          co_await b.sleep(10ms);
          co_return 1;
        };
        troupe::parallel_options one{.max_concurrent = 1};
        try {
          if (kind == "settle")
            (void)co_await c.parallel_settle(iota(10), body, one);
          else if (kind == "each")
            (void)co_await c.parallel_each(iota(10), body, one);
          else if (kind == "race")
            (void)co_await c.parallel_race(iota(10), body, one);
          else
            (void)co_await c.settle_with_abort(
                iota(10),
                [body](context& b, const int& i, const troupe::abort_token&) {
                  return body(b, i);
                },
                {.max_concurrent = 1});
        } catch (const troupe::task_cancelled&) {
          co_return "threw@" + std::to_string(ms(c));
        }
        co_return std::string{"returned"};
      });
      co_return co_await troupe_test::graceful_cancel_and_await(cx, p, 5ms);
    });
    REQUIRE(v);
    CHECK(*v == "threw@5");
    CHECK(*started == 1);
  }
}

TEST_CASE("a forced cancel of a task joining its children with a grace forces them too") {
  // p's body ends under a graceful cancel (1 s of grace) while its child cleans up for
  // 500 ms: the child is joined with the grace; a forced cancel 2 ms later forces it, and
  // p is done then, not when the child's cleanup would have ended.
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto p = cx.spawn([](context& c) -> task<int> {
      (void)c.spawn([](context& k) -> task<int> {
        bool cancelled = false;
        try {
          co_await k.sleep(1h);
        } catch (const troupe::task_cancelled&) {
          cancelled = true;
        }
        if (cancelled) co_await k.sleep(500ms);
        co_return 1;
      });
      co_await c.sleep(1h); // throws at the graceful cancel: the body ends
      co_return 0;
    });
    co_await cx.sleep(5ms);
    (void)co_await cx.cancel_graceful(p, 1s);
    co_await cx.sleep(2ms);
    auto forced = co_await cx.cancel(p);
    auto r = co_await cx.await(p);
    co_return std::string{forced ? "answered" : "?"} + " " +
        (r ? "value" : troupe::render(r.error()).substr(0, 0) + "ended") + "@" +
        std::to_string(ms(cx));
  });
  REQUIRE(v);
  CHECK(*v == "answered ended@7");
}

TEST_CASE("a branch whose sibling failed starts nothing more in a combinator of its own") {
  // as_stream's branches are a fail-fast group; branch 0 fails at once while branch 1 runs
  // a settle of 1000 items one at a time. Nobody pulls the stream (so no cancel comes from
  // the caller yet): branch 1's settle still stops starting items once the group failed.
  auto rt = make_virtual_rt();
  auto started = std::make_shared<int>(0);
  auto v = rt.run([started](context& cx) -> task<int> {
    auto s = cx.as_stream(iota(2), [started](context& b, const int& i) -> task<int> {
      if (i == 0) {
        co_await b.sleep(1ms);
        throw std::runtime_error("branch 0 failed");
      }
      auto r = co_await b.parallel_settle(
          iota(1000),
          [started](context& g, const int&) -> task<int> {
            ++*started;
            co_await g.sleep(1ms);
            co_return 1;
          },
          {.max_concurrent = 1});
      co_return static_cast<int>(r.succeeded);
    });
    co_await cx.sleep(100ms);
    co_return *started;
  });
  REQUIRE(v);
  CHECK(*v <= 2); // the item running when the group failed (and none after it)
}

TEST_CASE("a child that throws a cancellation-class error does not stop its scope's siblings") {
  // errc::cancelled is not a failure: a child passing on an awaited child's cancellation
  // ends the scope no more than a child that was cancelled itself (before, it stopped every
  // sibling, also ones spawned later, while the scope still answered its body's value).
  auto rt = make_virtual_rt();
  auto log = std::make_shared<std::string>();
  auto v = rt.run([log](context& cx) -> task<std::string> {
    auto r = co_await cx.scope(
        [log](context& s) -> task<int> {
          (void)s.spawn([](context& c) -> task<int> {
            co_await c.yield_now(); // a coroutine: the throw ends its body
            throw troupe::task_error{troupe::make_error(errc::cancelled, "", "child cancelled")};
          });
          co_await s.sleep(1ms);
          (void)s.spawn([log](context& c) -> task<int> {
            co_await c.sleep(1ms);
            *log += "B";
            co_return 2;
          });
          co_return 7;
        },
        {.on_return = troupe::scope_exit::join});
    co_return (r ? std::to_string(*r) : troupe::detail_of(r.error())) + "|" + *log;
  });
  REQUIRE(v);
  CHECK(*v == "7|B");
}

TEST_CASE("a scope whose body throws after a child failed reports the child's failure") {
  // The first failure decides (tasks.md): the child's came first, the body's after it.
  // Before, a body that threw (rather than returned) replaced it with its own error.
  for (auto mode : {troupe::scope_exit::cancel, troupe::scope_exit::join}) {
    CAPTURE(static_cast<int>(mode));
    auto rt = make_virtual_rt();
    auto v = rt.run([mode](context& cx) -> task<std::string> {
      auto r = co_await cx.scope(
          [](context& s) -> task<int> {
            (void)s.spawn([](context&) -> task<int> { co_return 1; });
            (void)s.spawn([](context&) -> task<int> {
              throw std::runtime_error("boom");
              co_return 0;
            });
            co_await s.yield_now(); // the failing child runs meanwhile
            throw std::runtime_error("body");
          },
          {.on_return = mode});
      co_return r ? std::to_string(*r) : troupe::detail_of(r.error());
    });
    REQUIRE(v);
    CHECK(*v == "boom");
  }
}

TEST_CASE("a deadline and a body that ends at the same instant: on the virtual clock the "
          "deadline fires first") {
  // Pinned rule (docs/tasks.md): the deadline's timer is set before any timer the body sets,
  // so at the same instant it comes first; one tick earlier the value wins.
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto body = [](std::chrono::milliseconds d) {
      return [d](context& c) -> task<int> {
        co_await c.sleep(d);
        co_return 42;
      };
    };
    auto tie = co_await cx.deadline(100ms, body(100ms));
    auto before = co_await cx.deadline(100ms, body(99ms));
    auto show = [](const caf::expected<int>& r) {
      return r ? std::to_string(*r)
               : troupe::is(r.error(), errc::deadline_exceeded) ? std::string{"exceeded"}
                                                                : troupe::render(r.error());
    };
    co_return show(tie) + "|" + show(before);
  });
  REQUIRE(v);
  CHECK(*v == "exceeded|42");
}

TEST_CASE("fail-fast stops a sibling that only yields, in a loop that never ends by itself") {
  // A branch looping on yield_now() polls for cancellation at every yield; the sibling's
  // failure must reach it. A sleep that is due already (sleep(0ms), a sleep_until in the
  // past) is a yield too: before, it did not suspend, and on virtual time the loop held the
  // one thread for ever (the failing sibling never ran).
  for (int how : {0, 1, 2})
    for (bool virtual_time : {true, false}) {
      CAPTURE(how, virtual_time);
      auto rt = virtual_time ? make_virtual_rt() : troupe_test::make_real_rt();
      auto v = rt.run([how](context& cx) -> task<std::string> {
        auto r = co_await cx.parallel(2, [how](context& c, const size_t& i) -> task<int> {
          if (i == 0)
            for (;;) {
              if (how == 0) co_await c.yield_now();
              if (how == 1) co_await c.sleep(0ms);
              if (how == 2) co_await c.sleep_until(c.now() - 1ms);
            }
          co_await c.yield_now();
          throw std::runtime_error("boom");
        });
        co_return r ? std::string{"value"} : troupe::detail_of(r.error());
      });
      REQUIRE(v);
      CHECK(*v == "boom");
    }
}
