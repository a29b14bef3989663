#include <atomic>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;
using troupe::context;
using troupe::errc;
using troupe::task;

namespace {

troupe::runtime make_rt(bool virtual_time = false, size_t threads = 2) {
  auto rt = troupe::runtime::builder{}.threads(threads).virtual_time(virtual_time).build();
  REQUIRE(rt);
  return std::move(*rt);
}

task<int> leaf(int x) {
  co_return x + 1;
}

/// Awaits every handle in order and sums the values; -1 when any await fails.
template <class T>
task<long> sum_awaited(context& cx, std::vector<troupe::task_handle<T>>& hs) {
  long sum = 0;
  for (auto& h : hs) {
    auto r = co_await cx.await(h);
    if (!r) co_return -1;
    sum += *r;
  }
  co_return sum;
}

task<int> middle(context& cx, int x) {
  auto h = cx.spawn([x]() -> task<int> { return leaf(x); });
  auto v = co_await cx.await(h);
  co_return v ? *v * 2 : -1;
}

// GCC 12 miscompiles coroutines taking class types by value ("pure virtual method called").
// This one takes a caf::actor by value and must keep working with the chosen compiler.
task<int> ask_by_value(context& cx, caf::actor adder, int x) {
  auto r = co_await cx.request<int>(adder, x, x);
  co_return r ? *r : -1;
}

caf::behavior adder_actor() {
  return {[](int x, int y) { return x + y; },
          [](const std::string& s) -> caf::result<int> {
            return troupe::make_error(errc::invalid_argument, "s", s);
          }};
}

} // namespace

TEST_CASE("a task's value reaches run() and a void task completes") {
  auto rt = make_rt();
  auto v = rt.run([](context&) -> task<std::string> { co_return "hello"; });
  REQUIRE(v);
  CHECK(*v == "hello");
  bool ran = false;
  auto u = rt.run([&ran]() -> task<void> {
    ran = true;
    co_return;
  });
  CHECK(u);
  CHECK(ran);
}

TEST_CASE("await returns a child's value through a child-grandchild chain") {
  auto rt = make_rt();
  auto v = rt.run([](context& cx) -> task<int> {
    auto h = cx.spawn([](context& c) -> task<int> { return middle(c, 20); });
    auto r = co_await cx.await(h);
    co_return r ? *r : -1;
  });
  REQUIRE(v);
  CHECK(*v == 42);
}

TEST_CASE("10,000 tasks each awaiting a child that awaits a grandchild complete on 2 threads") {
  auto rt = make_rt(false, 2);
  constexpr int n = 10'000;
  auto total = rt.run([](context& cx) -> task<long> {
    std::vector<troupe::task_handle<int>> hs;
    hs.reserve(n);
    for (int i = 0; i < n; ++i)
      hs.push_back(cx.spawn([i](context& c) -> task<int> { return middle(c, i); }));
    co_return co_await sum_awaited(cx, hs);
  });
  REQUIRE(total);
  long expected = 0;
  for (int i = 0; i < n; ++i)
    expected += 2L * (i + 1);
  CHECK(*total == expected);
}

TEST_CASE("a coroutine taking a caf::actor by value awaits correctly") {
  auto rt = make_rt();
  auto adder = rt.system().spawn(adder_actor);
  auto v = rt.run([adder](context& cx) -> task<int> {
    int sum = 0;
    for (int i = 0; i < 1000; ++i)
      sum += co_await ask_by_value(cx, adder, 1);
    co_return sum;
  });
  REQUIRE(v);
  CHECK(*v == 2000);
  caf::anon_send_exit(adder, caf::exit_reason::user_shutdown);
}

TEST_CASE("a request to a plain CAF actor yields its reply or its error as a value") {
  auto rt = make_rt();
  auto adder = rt.system().spawn(adder_actor);
  auto v = rt.run([adder](context& cx) -> task<std::string> {
    auto ok = co_await cx.request<int>(adder, 2, 3);
    auto bad = co_await cx.request<int>(adder, std::string{"nope"});
    auto wrong = co_await cx.request<int>(adder, 1.5); // nobody handles a double
    co_return std::to_string(ok ? *ok : -1) + "|" + troupe::field_of(bad.error()) + "|" +
        (wrong.error() == caf::sec::unexpected_message ? "unexpected" : "?");
  });
  REQUIRE(v);
  CHECK(*v == "5|s|unexpected");
  caf::anon_send_exit(adder, caf::exit_reason::user_shutdown);
}

TEST_CASE("a request's reply is checked against the awaited type, void replies included") {
  auto rt = make_rt();
  auto a = rt.system().spawn([]() -> caf::behavior {
    return {[](int) { return std::string{"text"}; }, [](double) {}};
  });
  auto v = rt.run([a](context& cx) -> task<std::string> {
    auto wrong = co_await cx.request<int>(a, 1);       // a string comes back
    auto done = co_await cx.request<void>(a, 1.5);     // an empty reply
    auto not_void = co_await cx.request<void>(a, 2);   // a string where nothing was expected
    auto text = co_await cx.request<std::string>(a, 3);
    co_return std::string{wrong ? "?" : wrong.error() == caf::sec::unexpected_response ? "u" : "e"} +
        (done ? "ok" : "?") +
        (not_void ? "?" : not_void.error() == caf::sec::unexpected_response ? "u" : "e") +
        (text ? *text : "?");
  });
  REQUIRE(v);
  CHECK(*v == "uokutext");
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

TEST_CASE("a body's own CAF request().then gets its reply next to troupe's awaited requests") {
  auto rt = make_rt();
  auto echo = rt.system().spawn([]() -> caf::behavior { return {[](int x) { return x; }}; });
  auto v = rt.run([echo](context& cx) -> task<std::string> {
    auto raw = std::make_shared<int>(0);
    cx.self()->request(echo, caf::infinite, 5).then([raw](int x) { *raw = x; });
    auto mine = co_await cx.request<int>(echo, 7); // the raw reply comes first: CAF's
    auto again = co_await cx.request<int>(echo, 8);
    co_return std::to_string(*raw) + "|" + std::to_string(mine ? *mine : -1) + "|" +
        std::to_string(again ? *again : -1);
  });
  REQUIRE(v);
  CHECK(*v == "5|7|8");
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
}

TEST_CASE("a message a task does not know is answered as CAF answers it, atom first or not") {
  auto rt = make_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto h = cx.spawn([](context& c) -> task<int> {
      co_await c.sleep(1h);
      co_return 0;
    });
    // troupe's protocol tags its messages with an atom: this one it does not know.
    auto a = co_await cx.request<int>(h.actor(), caf::ok_atom::value);
    auto b = co_await cx.request<int>(h.actor(), 1.5);
    (void)co_await cx.cancel(h);
    auto says = [](const caf::expected<int>& r) {
      return r ? "?" : r.error() == caf::sec::unexpected_message ? "u" : "e";
    };
    co_return std::string{says(a)} + says(b);
  });
  REQUIRE(v);
  CHECK(*v == "uu");
}

TEST_CASE("a body that puts a behavior of its own on top through cx.self() keeps CAF's "
          "receive timeouts") {
  auto rt = make_rt();
  auto fired = std::make_shared<std::atomic<int>>(0);
  auto v = rt.run([fired](context& cx) -> task<int> {
    cx.self()->become(caf::keep_behavior,
                      caf::behavior{[](caf::ok_atom) {},
                                    caf::after(std::chrono::milliseconds(1)) >> [fired] {
                                      ++*fired;
                                    }});
    // Idle between the sleeps' own wake-ups: the timeout fires, and must be armed again
    // after each message (CAF's activation does that; troupe's own loop would not).
    for (int i = 0; i < 2000 && fired->load() < 3; ++i)
      co_await cx.sleep(2ms);
    co_return fired->load();
  });
  REQUIRE(v);
  CHECK(*v >= 3);
}

TEST_CASE("a body that throws fails its task with task_failed and the message") {
  auto rt = make_rt();
  auto v = rt.run([]() -> task<int> {
    throw std::runtime_error("boom");
    co_return 1;
  });
  REQUIRE_FALSE(v);
  CHECK(troupe::is(v.error(), errc::task_failed));
  CHECK(troupe::detail_of(v.error()) == "boom");
}

TEST_CASE("a body that throws a non-standard exception fails with task_failed") {
  auto rt = make_rt();
  auto v = rt.run([]() -> task<int> {
    throw 42;
    co_return 1;
  });
  REQUIRE_FALSE(v);
  CHECK(troupe::is(v.error(), errc::task_failed));
  CHECK(troupe::detail_of(v.error()).find("non-standard") != std::string::npos);
}

TEST_CASE("a body that throws task_error fails with exactly that error") {
  auto rt = make_rt();
  auto v = rt.run([](context& cx) -> task<int> {
    auto h = cx.spawn([]() -> task<int> {
      throw troupe::task_error{troupe::make_error(errc::invalid_argument, "x", "negative")};
      co_return 0;
    });
    auto r = co_await cx.await(h);
    if (!r) throw troupe::task_error{r.error()};
    co_return *r;
  });
  REQUIRE_FALSE(v);
  CHECK(troupe::is(v.error(), errc::invalid_argument));
  CHECK(troupe::field_of(v.error()) == "x");
}

TEST_CASE("a directly awaited task<T> runs inline and its exception propagates") {
  auto rt = make_rt();
  auto v = rt.run([](context&) -> task<int> {
    auto sub = []() -> task<int> {
      throw std::logic_error("inner");
      co_return 0;
    };
    try {
      co_await sub();
    } catch (const std::logic_error& e) {
      co_return std::string{e.what()} == "inner" ? 7 : -1;
    }
    co_return -2;
  });
  REQUIRE(v);
  CHECK(*v == 7);
}

TEST_CASE("a null body answers empty_body from run, spawn and await") {
  auto rt = make_rt();
  std::function<task<int>(context&)> none;
  auto v = rt.run(none);
  REQUIRE_FALSE(v);
  CHECK(troupe::is(v.error(), errc::empty_body));
  CHECK(troupe::field_of(v.error()) == "body");
  auto w = rt.run([none](context& cx) -> task<bool> {
    auto h = cx.spawn(none);
    auto r = co_await cx.await(h);
    co_return !r && troupe::is(r.error(), errc::empty_body);
  });
  REQUIRE(w);
  CHECK(*w);
}

TEST_CASE("awaiting a handle twice answers already_awaited; an empty handle invalid_handle") {
  auto rt = make_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto h = cx.spawn([]() -> task<int> { co_return 5; });
    auto copy = h;
    auto first = co_await cx.await(h);
    auto second = co_await cx.await(copy);
    troupe::task_handle<int> empty;
    auto third = co_await cx.await(empty);
    co_return std::to_string(first ? *first : -1) + " " +
        std::string{troupe::name_of(static_cast<errc>(second.error().code()))} + " " +
        std::string{troupe::name_of(static_cast<errc>(third.error().code()))};
  });
  REQUIRE(v);
  CHECK(*v == "5 already_awaited invalid_handle");
}

TEST_CASE("awaiting or cancelling a task of another runtime answers foreign_task") {
  auto rt1 = make_rt(false, 1);
  auto rt2 = make_rt(false, 1);
  auto h = rt1.spawn([](context& cx) -> task<int> {
    co_await cx.sleep(1h);
    co_return 1;
  });
  REQUIRE(h);
  auto v = rt2.run([h = *h](context& cx) -> task<bool> {
    auto r = co_await cx.await(h);
    auto c = co_await cx.cancel(h);
    co_return !r && troupe::is(r.error(), errc::foreign_task) && !c &&
        troupe::is(c.error(), errc::foreign_task);
  });
  REQUIRE(v);
  CHECK(*v);
  // The handle still works in its own runtime: the foreign await did not consume it.
  auto c = rt1.cancel(*h);
  REQUIRE(c);
  CHECK(*c);
}

TEST_CASE("task ids are deterministic and name parent, root and group") {
  auto rt = make_rt(true);
  auto v = rt.run([](context& cx) -> task<std::vector<std::string>> {
    std::vector<std::string> out{cx.task_id() + "|" + cx.parent_task_id() + "|" +
                                 cx.root_task_id() + "|" + cx.task_group_id() + "|" + cx.name()};
    auto group = cx.new_group_id();
    auto describe = [](context& c) -> task<std::string> {
      auto grand = c.spawn([](context& g) -> task<std::string> {
        co_return g.task_id() + "|" + g.parent_task_id() + "|" + g.root_task_id();
      });
      auto r = co_await c.await(grand);
      co_return c.task_id() + "|" + c.parent_task_id() + "|" + c.task_group_id() + "|" + c.name() +
          " > " + (r ? *r : "?");
    };
    auto a = cx.spawn(describe, {.name = "a", .group = group});
    auto b = cx.spawn(describe, {.name = "b", .group = group});
    auto c = cx.spawn(describe);
    for (auto* h : {&a, &b, &c}) {
      auto r = co_await cx.await(*h);
      out.push_back(r ? *r : "?");
    }
    co_return out;
  });
  REQUIRE(v);
  REQUIRE(v->size() == 4);
  CHECK((*v)[0] == "1||1|1|task");
  CHECK((*v)[1] == "1.1|1|1/g1|a > 1.1.1|1.1|1");
  CHECK((*v)[2] == "1.2|1|1/g1|b > 1.2.1|1.2|1");
  CHECK((*v)[3] == "1.3|1|1.3|task > 1.3.1|1.3|1");
  auto second = rt.run([](context& cx) -> task<std::string> { co_return cx.task_id(); });
  REQUIRE(second);
  CHECK(*second == "2");
}

TEST_CASE("task-local values are inherited as a snapshot that later writes do not cross") {
  auto rt = make_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    cx.set_local("user", std::string{"ada"});
    cx.set_local("n", 1);
    auto child = cx.spawn([](context& c) -> task<std::string> {
      // Parent writes after the spawn; the child must not see them.
      co_await c.sleep(5ms);
      auto user = c.local<std::string>("user");
      auto n = c.local<int>("n");
      auto wrong_type = c.local<double>("n");
      c.set_local("n", 100); // the parent must not see this
      co_return (user ? *user : "?") + ":" + std::to_string(n ? *n : -1) + ":" +
          (!wrong_type ? "typed" : "untyped");
    });
    cx.set_local("user", std::string{"bob"});
    cx.set_local("n", 2);
    auto r = co_await cx.await(child);
    co_return (r ? *r : troupe::render(r.error())) + "|" + *cx.local<std::string>("user") + ":" +
        std::to_string(*cx.local<int>("n")) + "|" + (cx.erase_local("n") ? "erased" : "kept") +
        (!cx.local<int>("n") ? ":gone" : ":still");
  });
  REQUIRE(v);
  CHECK(*v == "ada:1:typed|bob:2|erased:gone");
  // erase_local hands back the value it removed (nothing when there was none).
  auto prev = rt.run([](context& cx) -> task<std::string> {
    cx.set_local("tenant", std::string{"acme"});
    auto was = cx.erase_local("tenant");
    auto again = cx.erase_local("tenant");
    co_return (was ? std::any_cast<std::string>(*was) : std::string{"none"}) + "|" +
        (again ? "still" : "none");
  });
  REQUIRE(prev);
  CHECK(*prev == "acme|none");
}

TEST_CASE("spawn_blocking runs off the scheduler threads and maps exceptions") {
  auto rt = make_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto actor_thread = std::this_thread::get_id();
    auto other = co_await cx.spawn_blocking([] { return std::this_thread::get_id(); });
    auto failed = co_await cx.spawn_blocking([]() -> int { throw std::runtime_error("io"); });
    auto nothing = co_await cx.spawn_blocking([] {});
    co_return std::string{other && *other != actor_thread ? "off" : "on"} + "|" +
        (!failed && troupe::is(failed.error(), errc::blocking_failed)
             ? troupe::detail_of(failed.error())
             : "?") +
        "|" + (nothing ? "void" : "?");
  });
  REQUIRE(v);
  CHECK(*v == "off|io|void");
}

TEST_CASE("sleep runs on the runtime clock: virtual time jumps an hour at once") {
  auto rt = make_rt(true);
  auto v = rt.run([](context& cx) -> task<int64_t> {
    auto t0 = cx.now();
    co_await cx.sleep(1h);
    co_await cx.sleep(30min);
    co_await cx.sleep(-5s); // a past deadline does not suspend
    co_return std::chrono::duration_cast<std::chrono::minutes>(cx.now() - t0).count();
  });
  REQUIRE(v);
  CHECK(*v == 90);
  CHECK(rt.virtual_time()->now_ms() == 90 * 60 * 1000);
}

TEST_CASE("virtual time: a body that waits forever answers stalled instead of hanging") {
  auto rt = make_rt(true);
  auto silent = rt.system().spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](int) -> caf::result<int> { return caf::delegated<int>{}; }};
  });
  auto v = rt.run([silent](context& cx) -> task<int> {
    auto r = co_await cx.request<int>(silent, 1);
    co_return r ? *r : -1;
  });
  REQUIRE_FALSE(v);
  CHECK(troupe::is(v.error(), errc::stalled));
  caf::anon_send_exit(silent, caf::exit_reason::user_shutdown);
  rt.drain();
}

TEST_CASE("spawn and await from main, outside any task") {
  auto rt = make_rt();
  auto h = rt.spawn([]() -> task<int> { co_return 9; });
  REQUIRE(h);
  CHECK_FALSE(h->id().empty());
  auto r = rt.await(*h);
  REQUIRE(r);
  CHECK(*r == 9);
  auto again = rt.await(*h);
  REQUIRE_FALSE(again);
  CHECK(troupe::is(again.error(), errc::already_awaited));
}

TEST_CASE("yield_now gives the thread to other tasks even on one scheduler thread") {
  auto rt = troupe::runtime::builder{}.threads(1).build();
  REQUIRE(rt);
  auto v = rt->run([](context& cx) -> task<long> {
    auto flag = std::make_shared<std::atomic<bool>>(false);
    auto h = cx.spawn([flag]() -> task<void> {
      flag->store(true);
      co_return;
    });
    long spins = 0;
    // Bounded: a yield that does not let the child run would exhaust this loop.
    while (!flag->load() && spins < 10'000'000) {
      ++spins;
      co_await cx.yield_now();
    }
    (void)co_await cx.await(h);
    co_return flag->load() ? spins : -1;
  });
  REQUIRE(v);
  CHECK(*v >= 0);
  CHECK(*v < 10'000'000);
}

TEST_CASE("a task that ends with 20,000 unawaited children joins them all") {
  auto rt = make_rt(false, 2);
  auto cleaned = std::make_shared<std::atomic<int>>(0);
  struct counter {
    std::shared_ptr<std::atomic<int>> n;
    ~counter() { ++*n; }
  };
  auto v = rt.run([cleaned](context& cx) -> task<int> {
    for (int i = 0; i < 20'000; ++i)
      (void)cx.spawn([cleaned](context& c) -> task<int> {
        counter g{cleaned};
        co_await c.sleep(1h);
        co_return 0;
      });
    co_return 1;
  });
  REQUIRE(v);
  CHECK(*cleaned == 20'000);
  CHECK(rt.clock().pending() == 0);
}

TEST_CASE("virtual time: a child that ends unawaited leaves its outcome and exits; a later "
          "await takes it") {
  auto rt = make_rt(true);
  auto& sys = rt.system();
  auto v = rt.run([&sys](context& cx) -> task<std::string> {
    std::vector<troupe::task_handle<int>> hs;
    for (int i = 0; i < 50; ++i)
      hs.push_back(cx.spawn([i]() -> task<int> { co_return i; }));
    hs.push_back(cx.spawn([]() -> task<int> {
      throw std::runtime_error("boom");
      co_return 0;
    }));
    auto before = sys.registry().running();
    co_await cx.sleep(1ms); // every child runs and ends; nobody awaits them yet
    auto after = sys.registry().running();
    int sum = 0;
    for (int i = 0; i < 50; ++i) {
      auto r = co_await cx.await(hs[static_cast<size_t>(i)]);
      sum += r ? *r : -1000;
    }
    auto failed = co_await cx.await(hs[50]);
    auto again = co_await cx.await(hs[0]);
    auto stopped = co_await cx.cancel(hs[1]);
    co_return std::to_string(before - after) + " " + std::to_string(sum) + " " +
        (failed ? "value" : troupe::is_cancellation(failed.error()) ? "cancelled" : "failed") +
        " " + (again ? "again" : std::string{troupe::name_of(static_cast<errc>(again.error().code()))}) +
        " " + (stopped ? (*stopped ? "true" : "false") : "error");
  });
  REQUIRE(v);
  // The 51 children's actors are gone before anyone awaited them; their outcomes are not.
  CHECK(*v == "51 1225 failed already_awaited false");
}

TEST_CASE("real time: awaits that race their children's end get every value (200 rounds)") {
  auto rt = make_rt(false, 2);
  for (int round = 0; round < 200; ++round) {
    auto v = rt.run([round](context& cx) -> task<long> {
      std::vector<troupe::task_handle<long>> hs;
      for (long i = 0; i < 16; ++i)
        hs.push_back(cx.spawn([i, round]() -> task<long> {
          volatile long spin = 0;
          for (long k = 0; k < (i * 37 + round) % 200; ++k)
            spin = spin + k;
          co_return i;
        }));
      if (round % 2 == 0) co_await cx.yield_now();
      co_return co_await sum_awaited(cx, hs);
    });
    REQUIRE(v);
    REQUIRE(*v == 120);
  }
}

TEST_CASE("virtual time: a child killed by plain CAF code while awaited wakes its awaiter") {
  auto rt = make_rt(true);
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto h = cx.spawn([](context& c) -> task<int> {
      co_await c.sleep(1h);
      co_return 1;
    });
    auto killer = cx.spawn([target = h.actor()](context& c) -> task<void> {
      co_await c.sleep(5ms); // the parent's await is registered by then
      caf::anon_send_exit(target, caf::exit_reason::kill);
    });
    auto r = co_await cx.await(h);
    (void)co_await cx.await(killer);
    co_return (r ? "value" : troupe::render(r.error())) + std::string{" at "} +
        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                           cx.now().time_since_epoch())
                           .count());
  });
  REQUIRE(v);
  CHECK(v->find("was terminated") != std::string::npos);
  CHECK(v->find(" at 5") != std::string::npos);
}
