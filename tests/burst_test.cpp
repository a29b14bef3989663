// A burst of children: past the first 256 that one run of a body spawns, children are
// records (tickets with no lane) until the body suspends, and their actors are made and
// started 256 per activation. Everything a plain child does, they do.

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;
using troupe::context;
using troupe::errc;
using troupe::task;

namespace {

troupe::runtime make_rt(size_t threads = 2) {
  auto rt = troupe::runtime::builder{}.threads(threads).build();
  REQUIRE(rt);
  return std::move(*rt);
}

constexpr long burst = 256; // task_actor::burst_children

} // namespace

TEST_CASE("a burst of 8000 children holds a few hundred actors at once, and every child runs",
          "[burst]") {
  auto rt = make_rt();
  auto& sys = rt.system();
  auto base = static_cast<long>(sys.registry().running());
  std::atomic<long> ran{0}, peak{0};
  constexpr long n = 8000;
  auto v = rt.run([&](context& cx) -> task<long> {
    auto out = co_await cx.scope(
        [&](context& s) -> task<long> {
          for (long i = 0; i < n; ++i)
            (void)s.spawn([&]() -> task<int> {
              auto live = static_cast<long>(sys.registry().running()) - base;
              auto p = peak.load();
              while (live > p && !peak.compare_exchange_weak(p, live)) {
              }
              ran.fetch_add(1);
              co_return 1;
            });
          co_return 0;
        },
        {.on_return = troupe::scope_exit::join});
    co_return out ? *out : -1;
  });
  REQUIRE(v);
  CHECK(*v == 0);
  CHECK(ran.load() == n);
  // The root, the scope, the first 256 and a batch or two of 256 (the first activation may
  // start two), plus a batch the other worker took and still runs: far below 8000 (every
  // child at once, as before bursts were records).
  CHECK(peak.load() <= 8 * burst);
}

TEST_CASE("a burst's children have their ids from their spawn, and each sees its own",
          "[burst]") {
  auto rt = make_rt();
  constexpr long n = 1000;
  auto v = rt.run([](context& cx) -> task<long> {
    std::vector<troupe::task_handle<std::string>> hs;
    for (long i = 0; i < n; ++i)
      hs.push_back(cx.spawn([](context& c) -> task<std::string> { co_return c.task_id(); }));
    long right = 0;
    for (long i = 0; i < n; ++i) {
      auto& h = hs[static_cast<size_t>(i)];
      auto r = co_await cx.await(h);
      if (r && *r == h.id() && h.id() == cx.task_id() + "." + std::to_string(i + 1)) ++right;
    }
    co_return right;
  });
  REQUIRE(v);
  CHECK(*v == n);
}

TEST_CASE("a burst's child cancelled before the body suspends never runs; one cancelled "
          "gracefully runs and sees the cancel at its first await, as a plain child does",
          "[burst]") {
  auto rt = make_rt();
  struct seen {
    std::atomic<bool> forced_ran{false};
    std::atomic<int> graceful_ran{0};
    std::atomic<int> graceful_told{0};
  };
  auto s = std::make_shared<seen>();
  auto v = rt.run([s](context& cx) -> task<std::string> {
    std::vector<troupe::task_handle<int>> hs;
    auto graceful = [s](context& c) -> task<int> {
      s->graceful_ran.fetch_add(1);
      try {
        co_await c.sleep(1h);
      } catch (const troupe::task_cancelled&) {
        s->graceful_told.fetch_add(1);
        co_return 7; // it cleans up and answers
      }
      co_return 0;
    };
    hs.push_back(cx.spawn(graceful)); // a plain child (the first of the run)
    for (long i = 1; i < 2 * burst; ++i)
      hs.push_back(cx.spawn([]() -> task<int> { co_return 1; }));
    auto forced = cx.spawn([s]() -> task<int> {
      s->forced_ran = true;
      co_return 1;
    });
    auto late_graceful = cx.spawn(graceful); // a burst's child
    // No await between the spawns and the cancels: neither child has started.
    auto c1 = co_await cx.cancel(forced);
    auto a1 = co_await cx.await(forced);
    auto c2 = co_await cx.cancel_graceful(late_graceful, 1s);
    auto c3 = co_await cx.cancel_graceful(hs[0], 1s);
    auto a2 = co_await cx.await(late_graceful);
    auto a3 = co_await cx.await(hs[0]);
    for (size_t i = 1; i < hs.size(); ++i)
      (void)co_await cx.await(hs[i]);
    std::string out;
    out += c1 && *c1 ? "T" : "F";
    out += !a1 && a1.error() == errc::cancelled ? "c" : "?";
    out += c2 && *c2 ? "T" : "F";
    out += c3 && *c3 ? "T" : "F";
    out += a2 ? std::to_string(*a2) : "e";
    out += a3 ? std::to_string(*a3) : "e";
    co_return out;
  });
  REQUIRE(v);
  CHECK(*v == "TcTT77");
  CHECK_FALSE(s->forced_ran.load());
  CHECK(s->graceful_ran.load() == 2);
  CHECK(s->graceful_told.load() == 2);
}

TEST_CASE("a burst's child has its actor before the body suspends, and it answers requests",
          "[burst]") {
  auto rt = make_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    std::vector<troupe::task_handle<int>> hs;
    for (long i = 0; i < burst + 10; ++i)
      hs.push_back(cx.spawn([](context& c) -> task<int> {
        co_await c.sleep(1h);
        co_return 0;
      }));
    auto& late = hs.back();
    caf::actor a = late.actor(); // made now (idle until this body suspends)
    caf::actor again = late.actor();
    std::string out = a ? "a" : "-";
    out += a == again ? "=" : "!";
    // A message the task does not know is answered as CAF answers it (see task_test).
    auto r = co_await cx.request<int>(a, caf::ok_atom::value);
    out += !r && r.error() == caf::sec::unexpected_message ? "u" : "?";
    for (auto& h : hs)
      (void)co_await cx.cancel(h);
    auto gone = cx.spawn([]() -> task<int> { co_return 0; }); // the plain path again
    (void)gone;
    co_return out;
  });
  REQUIRE(v);
  CHECK(*v == "a=u");
}

TEST_CASE("a failing child of a burst fails its scope and stops the rest", "[burst]") {
  auto rt = make_rt();
  std::atomic<long> ran{0};
  constexpr long n = 3000;
  auto v = rt.run([&ran](context& cx) -> task<std::string> {
    auto out = co_await cx.scope(
        [&ran](context& s) -> task<int> {
          for (long i = 0; i < n; ++i)
            (void)s.spawn([&ran, i](context& c) -> task<int> {
              ran.fetch_add(1);
              if (i == 700) throw troupe::task_error{troupe::make_error(errc::not_found, "x", "child 700")};
              co_await c.sleep(1h); // the others wait until stopped
              co_return 1;
            });
          co_return 0;
        },
        {.on_return = troupe::scope_exit::join});
    if (out) co_return "no failure";
    co_return troupe::render(out.error());
  });
  REQUIRE(v);
  CHECK(v->find("child 700") != std::string::npos);
  // Children made after the failure never ran: their records were withdrawn.
  CHECK(ran.load() <= n);
  CHECK(ran.load() >= 701);
}

TEST_CASE("a task cancelled in the middle of its burst stops every child as a plain child: "
          "each has run up to its first await, none is left behind",
          "[burst]") {
  auto rt = make_rt();
  struct counter {
    std::atomic<long>* n;
    ~counter() { n->fetch_add(1); }
  };
  std::atomic<long> ran{0}, cleaned{0};
  constexpr long n = 20000;
  auto v = rt.run([&](context& cx) -> task<std::string> {
    auto h = cx.spawn([&](context& c) -> task<int> {
      for (long i = 0; i < n; ++i)
        (void)c.spawn([&](context& k) -> task<int> {
          counter g{&cleaned};
          ran.fetch_add(1);
          co_await k.sleep(1h);
          co_return 1;
        });
      co_await c.sleep(1h); // its children are due: made and started a batch at a time
      co_return 0;
    });
    co_await cx.sleep(1ms); // the burst is under way
    auto c = co_await cx.cancel(h);
    auto r = co_await cx.await(h);
    co_return std::string{c && *c ? "T" : "F"} + (!r && r.error() == errc::cancelled ? "c" : "?");
  });
  REQUIRE(v);
  CHECK(*v == "Tc");
  // Due when the cancel came: each was started (the rest at once), then stopped.
  CHECK(ran.load() == n);
  CHECK(cleaned.load() == n);
  CHECK(rt.clock().pending() == 0);
}

TEST_CASE("a burst's child cancelled once its spawner's body has suspended has run up to its "
          "first await, made or not yet made, as a plain child has",
          "[burst]") {
  auto rt = make_rt(1);
  constexpr long n = 1200;
  auto ran = std::make_shared<std::vector<char>>(n, 0);
  auto v = rt.run([ran](context& cx) -> task<std::string> {
    std::vector<troupe::task_handle<int>> hs;
    for (long i = 0; i < n; ++i)
      hs.push_back(cx.spawn([ran, i](context& c) -> task<int> {
        (*ran)[static_cast<size_t>(i)] = 1; // one thread: no race
        co_await c.sleep(1h);
        co_return 1;
      }));
    co_await cx.yield_now(); // the children are due; the last ones are not made yet
    std::string out;
    for (long i : {1199L, 1100L, 300L, 0L}) { // the last first: not made yet
      auto& h = hs[static_cast<size_t>(i)];
      auto c = co_await cx.cancel(h);
      auto r = co_await cx.await(h);
      out += c && *c ? "T" : "F";
      out += !r && r.error() == errc::cancelled ? "c" : "?";
      out += (*ran)[static_cast<size_t>(i)] ? "r" : "-";
    }
    for (auto& h : hs)
      (void)co_await cx.cancel(h);
    co_return out;
  });
  REQUIRE(v);
  CHECK(*v == "TcrTcrTcrTcr");
}
