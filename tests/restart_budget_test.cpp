// The restart budgets as a plain class, without an actor: their order and their windows.

#include <limits>

#include <catch2/catch.hpp>

#include <troupe/supervision/restart_budget.hpp>

using troupe::budget_verdict;
using troupe::child_budget;
using troupe::child_budget_limits;
using troupe::restart_budget;

TEST_CASE("restart budget: within both budgets a child is restarted, its window counted") {
  restart_budget b{3, 5000};
  child_budget c;
  child_budget_limits lim{5, 1000, 0};
  auto d1 = b.on_end(c, lim, 0);
  CHECK(d1.verdict == budget_verdict::restart);
  CHECK(d1.in_window == 1);
  CHECK(d1.restarts == 1);
  CHECK(d1.why.empty());
  auto d2 = b.on_end(c, lim, 10);
  CHECK(d2.in_window == 2);
  CHECK(d2.restarts == 2);
}

TEST_CASE("restart budget: a child's own budget comes first and does not spend the intensity") {
  restart_budget b{1, 5000};
  child_budget c;
  child_budget_limits lim{1, 1000, 0};
  CHECK(b.on_end(c, lim, 0).verdict == budget_verdict::restart); // intensity 1 of 1 used
  auto d = b.on_end(c, lim, 10);
  CHECK(d.verdict == budget_verdict::suppressed); // 2 > max_restarts 1: the child's budget
  CHECK(d.restarts == 0);                         // the intensity was not consulted
  CHECK(d.why == "restart budget spent: 2 restarts within 1000 ms");
  CHECK(b.restarts() == 1);
  SECTION("with a circuit, the circuit opens instead") {
    child_budget c2;
    child_budget_limits with_circuit{1, 1000, 250};
    restart_budget b2{10, 5000};
    (void)b2.on_end(c2, with_circuit, 0);
    CHECK(b2.on_end(c2, with_circuit, 1).verdict == budget_verdict::circuit_open);
  }
}

TEST_CASE("restart budget: more than intensity restarts within the period escalates") {
  restart_budget b{2, 1000};
  child_budget c;
  child_budget_limits none{0, 1000, 0}; // no budget of its own
  CHECK(b.on_end(c, none, 0).verdict == budget_verdict::restart);
  CHECK(b.on_end(c, none, 500).verdict == budget_verdict::restart);
  auto d = b.on_end(c, none, 999);
  CHECK(d.verdict == budget_verdict::escalate);
  CHECK(d.restarts == 3);
  CHECK(d.why == "3 restarts within 1000 ms (intensity 2)");
}

TEST_CASE("restart budget: the windows slide (a restart exactly one period old still counts, "
          "as in OTP)") {
  restart_budget b{2, 1000};
  child_budget c;
  child_budget_limits none{0, 1000, 0};
  CHECK(b.on_end(c, none, 0).verdict == budget_verdict::restart);
  CHECK(b.on_end(c, none, 500).verdict == budget_verdict::restart);
  auto d = b.on_end(c, none, 1001); // the one at 0 is out: 500 and 1001 remain
  CHECK(d.verdict == budget_verdict::restart);
  CHECK(d.restarts == 2);
  restart_budget e{2, 1000};
  child_budget c2;
  CHECK(e.on_end(c2, none, 0).verdict == budget_verdict::restart);
  CHECK(e.on_end(c2, none, 500).verdict == budget_verdict::restart);
  auto f = e.on_end(c2, none, 1000); // OTP keeps R >= Now - Period: 0, 500 and 1000 count
  CHECK(f.verdict == budget_verdict::escalate);
  CHECK(f.restarts == 3);
}

TEST_CASE("restart budget: a failed half-open try reopens the circuit at once") {
  restart_budget b{100, 5000};
  child_budget c;
  child_budget_limits lim{3, 1000, 250};
  c.half_open_since = 2000; // the one try after an open circuit
  auto d = b.on_end(c, lim, 2100); // within its window: reopen, whatever max_restarts says
  CHECK(d.verdict == budget_verdict::circuit_open);
  CHECK(d.why == "the half-open try failed");
  CHECK(c.half_open_since == -1);
  SECTION("a half-open try that lived past its window is a normal end") {
    child_budget c2;
    c2.half_open_since = 2000;
    CHECK(b.on_end(c2, lim, 3001).verdict == budget_verdict::restart);
  }
  SECTION("the window's edge is within it (as for the restarts)") {
    child_budget c3;
    c3.half_open_since = 2000;
    CHECK(b.on_end(c3, lim, 3000).verdict == budget_verdict::circuit_open);
  }
}

TEST_CASE("restart budget: an infinite period neither overflows nor forgets") {
  constexpr auto inf = std::numeric_limits<int64_t>::max();
  restart_budget b{2, inf};
  child_budget c;
  child_budget_limits lim{0, inf, 0};
  CHECK(b.on_end(c, lim, 0).verdict == budget_verdict::restart);
  CHECK(b.on_end(c, lim, 1'000'000).verdict == budget_verdict::restart);
  // a thousand years later (in ms), the first two still count
  CHECK(b.on_end(c, lim, int64_t{1000} * 366 * 24 * 3600 * 1000).verdict ==
        budget_verdict::escalate);
}

TEST_CASE("restart window: restarts at the same millisecond are counted one by one and leave "
          "together") {
  troupe::restart_window w;
  size_t counted_right = 0;
  for (size_t i = 1; i <= 10'000; ++i)
    counted_right += w.record(5, 1000) == i ? 1 : 0;
  CHECK(counted_right == 10'000);
  CHECK(w.record(6, 1000) == 10'001);
  CHECK(w.record(1005, 1000) == 10'002); // 1005 - 5 = 1000: all still inside (OTP's edge)
  CHECK(w.record(1006, 1000) == 3);      // the 10,000 at 5 leave at once
  w.prune(1007, 1000);                   // and the one at 6
  CHECK(w.size() == 2);
  w.prune(3000, 1000);
  CHECK(w.size() == 0);
  CHECK(w.record(3000, 1000) == 1);
}
