#include <vector>

#include <catch2/catch.hpp>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;

namespace {

using tick_atom = caf::atom_constant<caf::atom("tick")>;

struct recorder_state {
  std::vector<int> seen;
  std::vector<int64_t> at_ms;
};

} // namespace

TEST_CASE("the virtual clock fires everything due, in order, each at its own time") {
  auto rt = troupe::runtime::builder{}.virtual_time().build();
  REQUIRE(rt);
  auto& clk = *rt->virtual_time();
  auto log = std::make_shared<recorder_state>();
  auto rec = rt->system().spawn([log, &clk](caf::event_based_actor*) -> caf::behavior {
    return {[log, &clk](tick_atom, int n) {
      log->seen.push_back(n);
      log->at_ms.push_back(clk.now_ms());
    }};
  });
  auto t0 = clk.now();
  clk.schedule(t0 + 30ms, rec, caf::make_message(tick_atom::value, 3));
  clk.schedule(t0 + 10ms, rec, caf::make_message(tick_atom::value, 1));
  clk.schedule(t0 + 20ms, rec, caf::make_message(tick_atom::value, 2));
  clk.schedule(t0 + 20ms, rec, caf::make_message(tick_atom::value, 22)); // same instant: FIFO
  auto late = clk.schedule(t0 + 80ms, rec, caf::make_message(tick_atom::value, 8));
  CHECK(clk.pending() == 5);
  CHECK(rt->advance(25ms) == 3);
  CHECK(log->seen == std::vector<int>{1, 2, 22});
  CHECK(log->at_ms == std::vector<int64_t>{10, 20, 20});
  CHECK(clk.now_ms() == 25);
  CHECK(clk.cancel(late));
  CHECK_FALSE(clk.cancel(late));
  CHECK(rt->advance(100ms) == 1);
  CHECK(log->seen == std::vector<int>{1, 2, 22, 3});
  CHECK(clk.now_ms() == 125);
  CHECK(clk.pending() == 0);
  caf::anon_send_exit(rec, caf::exit_reason::user_shutdown);
}

TEST_CASE("a timer scheduled by a fired timer's receiver fires within the same advance") {
  auto rt = troupe::runtime::builder{}.virtual_time().build();
  REQUIRE(rt);
  auto& clk = *rt->virtual_time();
  auto log = std::make_shared<recorder_state>();
  auto rec = rt->system().spawn([log, &clk](caf::event_based_actor* self) -> caf::behavior {
    return {[log, &clk, self](tick_atom, int n) {
      log->seen.push_back(n);
      log->at_ms.push_back(clk.now_ms());
      if (n < 5)
        clk.schedule(clk.now() + 10ms, caf::actor_cast<caf::actor>(self),
                     caf::make_message(tick_atom::value, n + 1));
    }};
  });
  clk.schedule(clk.now() + 10ms, rec, caf::make_message(tick_atom::value, 1));
  CHECK(rt->advance(35ms) == 3);
  CHECK(log->at_ms == std::vector<int64_t>{10, 20, 30});
  CHECK(rt->advance(1h) == 2);
  CHECK(log->at_ms == std::vector<int64_t>{10, 20, 30, 40, 50});
  caf::anon_send_exit(rec, caf::exit_reason::user_shutdown);
}

TEST_CASE("the real clock delivers a due timer and never a cancelled one") {
  auto rt = troupe::runtime::builder{}.threads(1).build();
  REQUIRE(rt);
  auto& clk = rt->clock();
  CHECK_FALSE(clk.is_virtual());
  caf::scoped_actor self{rt->system()};
  // Due well after the other one (1 ms was flaky: a loaded machine, ASan, could pass it
  // before the cancel); cancelled, it never comes, and the one after it does.
  auto cancelled = clk.schedule(clk.now() + 50ms, self, caf::make_message(tick_atom::value, 1));
  REQUIRE(clk.cancel(cancelled));
  clk.schedule(clk.now() + 2ms, self, caf::make_message(tick_atom::value, 2));
  int got = 0;
  self->receive([&](tick_atom, int n) { got = n; },
                caf::after(std::chrono::seconds(10)) >> [&] { got = -1; });
  CHECK(got == 2);
  CHECK(clk.pending() == 0);
}
