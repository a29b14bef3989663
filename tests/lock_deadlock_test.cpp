// Deadlock detection over locks: a wait-for cycle among tasks over mutex / rwlock /
// semaphore waits fails the acquire that closes it with `deadlock` naming the cycle's keys;
// a same-task upgrade answers `reentrant_acquire` at once; a wait with a timeout or under a
// deadline is never a deadlock; lock waits mixed with channel waits are caught by the census.

#include <atomic>
#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include <troupe/troupe.hpp>

#include "test_support.hpp"

using namespace std::chrono_literals;
using troupe::context;
using troupe::errc;
using troupe::task;

namespace {

using troupe_test::make_real_rt;
using troupe_test::make_virtual_rt;
using troupe_test::must;

/// What one side of an opposite-order pair saw.
struct side {
  bool deadlock = false;
  bool got_both = false;
  std::string message;
};

/// Takes `first`, tells the other side (`mine`), waits until the other side holds its first
/// lock (`theirs`), then takes `second`. On `deadlock` it gives `first` back (by returning).
task<side> take_two(context& c, std::string first, std::string second,
                    troupe::channel<int> mine, troupe::channel<int> theirs) {
  side s;
  auto p1 = must(co_await troupe::lock(c, first));
  must(co_await mine.send(c, 1));
  must(co_await theirs.receive(c));
  auto p2 = co_await troupe::lock(c, second);
  if (!p2) {
    s.deadlock = troupe::is(p2.error(), errc::deadlock);
    s.message = troupe::detail_of(p2.error());
    co_return s;
  }
  s.got_both = true;
  co_return s;
}

/// Two tasks take `a` then `b` and `b` then `a`; returns both sides.
task<std::pair<side, side>> opposite_order(context& cx, std::string a, std::string b) {
  auto ab = must(co_await troupe::open_channel<int>(cx, "", 1));
  auto ba = must(co_await troupe::open_channel<int>(cx, "", 1));
  auto t1 = cx.spawn([=](context& c) { return take_two(c, a, b, ab, ba); });
  auto t2 = cx.spawn([=](context& c) { return take_two(c, b, a, ba, ab); });
  auto r1 = must(co_await cx.await(t1));
  auto r2 = must(co_await cx.await(t2));
  co_return std::pair{r1, r2};
}

void check_one_fails(const std::pair<side, side>& r, const std::string& a, const std::string& b) {
  // Exactly one acquire closed the cycle and failed; the other went on once the loser
  // released its first lock.
  CHECK(r.first.deadlock != r.second.deadlock);
  CHECK(r.first.got_both != r.second.got_both);
  auto& loser = r.first.deadlock ? r.first : r.second;
  CHECK(loser.message.find("mutex \"" + a + "\"") != std::string::npos);
  CHECK(loser.message.find("mutex \"" + b + "\"") != std::string::npos);
}

} // namespace

TEST_CASE("virtual time: two tasks taking two mutexes in opposite order: one fails with deadlock, "
          "the other goes on") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) { return opposite_order(cx, "a", "b"); });
  REQUIRE(r);
  check_one_fails(*r, "a", "b");
}

TEST_CASE("real time: opposite-order mutexes are a deadlock every time (200 rounds)") {
  auto rt = make_real_rt();
  auto r = rt.run([](context& cx) -> task<int> {
    int ok = 0;
    for (int i = 0; i < 200; ++i) {
      auto a = "a" + std::to_string(i % 3);
      auto b = "b" + std::to_string(i % 3);
      auto sides = co_await opposite_order(cx, a, b);
      bool one = sides.first.deadlock != sides.second.deadlock &&
                 sides.first.got_both != sides.second.got_both;
      ok += one ? 1 : 0;
    }
    co_return ok;
  });
  REQUIRE(r);
  CHECK(*r == 200);
}

TEST_CASE("a reader asking for the write lock of the rwlock it holds fails with reentrant_acquire "
          "at once") {
  auto run = [](troupe::runtime& rt) {
    return rt.run([](context& cx) -> task<std::string> {
      auto r = must(co_await troupe::lock_rw(cx, "rw", troupe::rw_mode::read));
      auto w = co_await troupe::lock_rw(cx, "rw", troupe::rw_mode::write);
      std::string out = troupe_test::fails_with(w, errc::reentrant_acquire) ? "reentrant" : "?";
      out += troupe::field_of(w.error()) == "key" ? ",key" : ",?";
      r.release();
      auto w2 = co_await troupe::lock_rw(cx, "rw", troupe::rw_mode::write, {.timeout = 0ms});
      out += w2 && *w2 ? ",free" : ",held";
      co_return out;
    });
  };
  auto vrt = make_virtual_rt();
  auto v = run(vrt);
  REQUIRE(v);
  CHECK(*v == "reentrant,key,free");
  auto rrt = make_real_rt();
  for (int i = 0; i < 200; ++i) {
    auto x = run(rrt);
    REQUIRE(x);
    REQUIRE(*x == "reentrant,key,free");
  }
}

TEST_CASE("a semaphore holder asking for more than can ever fit fails with reentrant_acquire; "
          "asking for what others hold waits") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto mine = must(co_await troupe::acquire_semaphore(cx, "s", 3, 2));
    auto never = co_await troupe::acquire_semaphore(cx, "s", 3, 2);
    std::string out = troupe_test::fails_with(never, errc::reentrant_acquire) ? "reentrant" : "?";
    // One permit held by another task that lets it go later: this wait is legitimate.
    auto other = cx.spawn([](context& c) -> task<void> {
      auto p = must(co_await troupe::acquire_semaphore(c, "s", 3, 1));
      co_await c.sleep(50ms);
    });
    co_await cx.sleep(10ms);
    mine.release();
    auto back = must(co_await troupe::acquire_semaphore(cx, "s", 3, 3));
    out += back ? ",waited@" + std::to_string(troupe_test::ms(cx)) : ",?";
    must(co_await cx.await(other));
    co_return out;
  });
  REQUIRE(v);
  CHECK(*v == "reentrant,waited@50");
}

TEST_CASE("a reader re-acquiring while a writer waits behind it is a deadlock (FIFO)") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto r = must(co_await troupe::lock_rw(cx, "rw", troupe::rw_mode::read));
    auto writer = cx.spawn([](context& c) -> task<bool> {
      auto w = co_await troupe::lock_rw(c, "rw", troupe::rw_mode::write);
      co_return static_cast<bool>(w);
    });
    co_await cx.sleep(10ms); // the writer queues, blocked by this reader
    auto again = co_await troupe::lock_rw(cx, "rw", troupe::rw_mode::read);
    std::string out = troupe_test::fails_with(again, errc::deadlock) ? "deadlock" : "?";
    r.release();
    out += must(co_await cx.await(writer)) ? ",writer ran" : ",?";
    co_return out;
  });
  REQUIRE(v);
  CHECK(*v == "deadlock,writer ran");
}

TEST_CASE("a cycle of three tasks over a mutex, a semaphore and an rwlock names its three keys") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    // t1 holds mutex m, wants semaphore s; t2 holds s, wants rwlock w (write); t3 holds a
    // read of w, wants m. Arrivals are staggered so t3's acquire closes the cycle.
    auto t1 = cx.spawn([](context& c) -> task<std::string> {
      auto m = must(co_await troupe::lock(c, "m"));
      co_await c.sleep(10ms);
      auto s = co_await troupe::acquire_semaphore(c, "s", 1, 1);
      co_return s ? "t1 ok" : troupe::detail_of(s.error());
    });
    auto t2 = cx.spawn([](context& c) -> task<std::string> {
      auto s = must(co_await troupe::acquire_semaphore(c, "s", 1, 1));
      co_await c.sleep(20ms);
      auto w = co_await troupe::lock_rw(c, "w", troupe::rw_mode::write);
      co_return w ? "t2 ok" : troupe::detail_of(w.error());
    });
    auto t3 = cx.spawn([](context& c) -> task<std::string> {
      auto r = must(co_await troupe::lock_rw(c, "w", troupe::rw_mode::read));
      co_await c.sleep(30ms);
      auto m = co_await troupe::lock(c, "m");
      if (m) co_return "t3 ok";
      co_return troupe::is(m.error(), errc::deadlock) ? "deadlock: " + troupe::detail_of(m.error())
                                                      : "other";
    });
    auto r3 = must(co_await cx.await(t3));
    auto r2 = must(co_await cx.await(t2));
    auto r1 = must(co_await cx.await(t1));
    co_return r1 + "|" + r2 + "|" + r3;
  });
  REQUIRE(v);
  INFO(*v);
  CHECK(v->find("t1 ok|t2 ok|deadlock: ") == 0);
  CHECK(v->find("mutex \"m\"") != std::string::npos);
  CHECK(v->find("semaphore \"s\"") != std::string::npos);
  CHECK(v->find("rwlock \"w\"") != std::string::npos);
}

TEST_CASE("a lock wait with a timeout or under a deadline is never reported as a deadlock") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto ab = must(co_await troupe::open_channel<int>(cx, "", 1));
    auto ba = must(co_await troupe::open_channel<int>(cx, "", 1));
    // t1 waits for b with a timeout, t2 for a under a deadline: a cycle, but both bounded.
    auto t1 = cx.spawn([ab, ba](context& c) -> task<std::string> {
      auto a = must(co_await troupe::lock(c, "a"));
      must(co_await ab.send(c, 1));
      must(co_await ba.receive(c));
      auto b = co_await troupe::lock(c, "b", {.timeout = 100ms});
      if (!b) co_return std::string{troupe::name_of(errc(b.error().code()))};
      co_return *b ? "got b" : "timed out";
    });
    auto t2 = cx.spawn([ab, ba](context& c) -> task<std::string> {
      auto b = must(co_await troupe::lock(c, "b"));
      must(co_await ba.send(c, 1));
      must(co_await ab.receive(c));
      auto a = co_await c.deadline(1s, [](context& d) -> task<bool> {
        auto p = co_await troupe::lock(d, "a");
        if (!p) throw std::runtime_error(std::string{troupe::name_of(errc(p.error().code()))});
        co_return static_cast<bool>(*p);
      });
      co_return a ? std::string{"got a"} : troupe::detail_of(a.error());
    });
    auto r1 = must(co_await cx.await(t1));
    auto r2 = must(co_await cx.await(t2));
    co_return r1 + "," + r2;
  });
  REQUIRE(v);
  CHECK(*v == "timed out,got a");
}

TEST_CASE("lock waits mixed with channel waits: every task stuck is a deadlock, not a hang") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto c = must(co_await troupe::open_channel<int>(cx, "", 1));
    auto held = must(co_await troupe::open_channel<int>(cx, "", 1));
    // t1 holds m and waits for a value t2 would send only after taking m.
    auto t1 = cx.spawn([c, held](context& x) -> task<std::string> {
      auto m = must(co_await troupe::lock(x, "m"));
      must(co_await held.send(x, 1));
      auto got = co_await c.receive(x);
      co_return got ? "value" : std::string{troupe::name_of(errc(got.error().code()))};
    });
    auto t2 = cx.spawn([c, held](context& x) -> task<std::string> {
      must(co_await held.receive(x));
      auto m = co_await troupe::lock(x, "m");
      if (!m) co_return std::string{troupe::name_of(errc(m.error().code()))};
      must(co_await c.send(x, 1));
      co_return "sent";
    });
    auto r1 = must(co_await cx.await(t1));
    auto r2 = must(co_await cx.await(t2));
    co_return r1 + "," + r2;
  });
  REQUIRE(v);
  // Both waits fail (the census sees every task stuck, it cannot tell which one to fail).
  CHECK(*v == "deadlock,deadlock");
}

TEST_CASE("no false deadlock: a semaphore waiter that another holder's release serves waits on "
          "none of them in particular") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    // w holds mutex m and asks for 1 of semaphore s (2 permits, both held); a holds one and
    // waits for m; b holds the other and lets it go at 10 ms. w -> a -> w looks like a
    // cycle, but b's release serves w: not a deadlock.
    auto ma = must(co_await troupe::open_channel<int>(cx, "", 1));
    auto w = cx.spawn([ma](context& c) -> task<std::string> {
      auto m = must(co_await troupe::lock(c, "m"));
      must(co_await ma.receive(c)); // a and b hold their permits now
      auto p = co_await troupe::acquire_semaphore(c, "s", 2, 1);
      co_return p ? "w got s@" + std::to_string(troupe_test::ms(c)) : troupe::render(p.error());
    });
    auto a = cx.spawn([ma](context& c) -> task<std::string> {
      auto p = must(co_await troupe::acquire_semaphore(c, "s", 2, 1));
      auto b = c.spawn([](context& d) -> task<void> {
        auto q = must(co_await troupe::acquire_semaphore(d, "s", 2, 1));
        co_await d.sleep(10ms);
      });
      co_await c.sleep(1ms);
      must(co_await ma.send(c, 1));
      auto m = co_await troupe::lock(c, "m");
      must(co_await c.await(b));
      co_return m ? std::string{"a got m"} : troupe::render(m.error());
    });
    auto rw = must(co_await cx.await(w));
    auto ra = must(co_await cx.await(a));
    co_return rw + "|" + ra;
  });
  REQUIRE(v);
  CHECK(*v == "w got s@10|a got m");
}

TEST_CASE("no false deadlock: a reader re-acquiring behind a writer that waits with a timeout") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto r = must(co_await troupe::lock_rw(cx, "rw", troupe::rw_mode::read));
    auto writer = cx.spawn([](context& c) -> task<bool> {
      auto w = must(co_await troupe::lock_rw(c, "rw", troupe::rw_mode::write, {.timeout = 20ms}));
      co_return static_cast<bool>(w);
    });
    co_await cx.sleep(5ms);
    auto again = co_await troupe::lock_rw(cx, "rw", troupe::rw_mode::read);
    std::string out = again ? "read again@" + std::to_string(troupe_test::ms(cx))
                            : troupe::render(again.error());
    out += must(co_await cx.await(writer)) ? ",writer got it" : ",writer timed out";
    co_return out;
  });
  REQUIRE(v);
  CHECK(*v == "read again@20,writer timed out");
}

TEST_CASE("a semaphore waiter's own permits do not free it: waiting for one more of a key it "
          "holds, on a holder that waits for its mutex, is a cycle") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    // s has 2 permits. t1 holds mutex n and 1 of s, and at 10 ms asks for 1 more of s (it
    // fits the capacity, so it waits); t2 holds the other permit of s and at 20 ms asks for
    // n. t1 needs t2's permit (its own stays held while it waits), t2 needs n: a cycle,
    // failed at once at 20 ms -- not later by the census, which a busy task keeps quiet.
    auto busy = cx.spawn([](context& c) -> task<void> {
      for (int i = 0; i < 100; ++i)
        co_await c.sleep(10ms);
    });
    auto t1 = cx.spawn([](context& c) -> task<std::string> {
      auto n = must(co_await troupe::lock(c, "n"));
      auto s1 = must(co_await troupe::acquire_semaphore(c, "s", 2, 1));
      co_await c.sleep(10ms);
      auto s2 = co_await troupe::acquire_semaphore(c, "s", 2, 1);
      co_return s2 ? "t1 ok@" + std::to_string(troupe_test::ms(c)) : troupe::render(s2.error());
    });
    auto t2 = cx.spawn([](context& c) -> task<std::string> {
      co_await c.sleep(1ms);
      auto s = must(co_await troupe::acquire_semaphore(c, "s", 2, 1));
      co_await c.sleep(19ms);
      auto n = co_await troupe::lock(c, "n");
      if (n) co_return "t2 ok";
      co_return troupe::is(n.error(), errc::deadlock)
          ? "deadlock@" + std::to_string(troupe_test::ms(c)) + ": " + troupe::detail_of(n.error())
          : troupe::render(n.error());
    });
    auto r2 = must(co_await cx.await(t2));
    auto r1 = must(co_await cx.await(t1));
    (void)co_await cx.cancel(busy);
    co_return r1 + "|" + r2;
  });
  REQUIRE(v);
  INFO(*v);
  CHECK(v->find("t1 ok@20|deadlock@20: ") == 0);
  CHECK(v->find("mutex \"n\"") != std::string::npos);
  CHECK(v->find("semaphore \"s\"") != std::string::npos);
}
