#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <troupe/troupe.hpp>

#include "supervision_support.hpp"

using namespace std::chrono_literals;
using troupe::child_status;
using troupe::errc;
using troupe::restart_mode;
using troupe::supervisor_spec;


// -- specs ----------------------------------------------------------------------------------

TEST_CASE("an invalid spec is refused before any child starts, naming the field") {
  auto rt = make_virtual_rt();
  int started = 0;
  auto counting = [&started](caf::actor_system& sys) -> troupe::start_result {
    ++started;
    return std::optional<caf::actor>{sys.spawn(worker)};
  };
  supervisor_spec dup;
  dup.children = {child("a"), child("a")};
  dup.children[0].start = counting;
  auto r1 = rt.supervise(dup);
  REQUIRE_FALSE(r1);
  CHECK(troupe::is(r1.error(), errc::invalid_spec));
  CHECK(troupe::field_of(r1.error()) == "children[1].name");
  CHECK(started == 0);
  supervisor_spec nostart;
  nostart.children = {child("a")};
  nostart.children[0].start = nullptr;
  CHECK(troupe::field_of(rt.supervise(nostart).error()) == "children[0].start");
  supervisor_spec negative;
  negative.period_ms = -5;
  CHECK(troupe::field_of(rt.supervise(negative).error()) == "period_ms");
  supervisor_spec window;
  window.children = {child("a")};
  window.children[0].window_ms = -1;
  CHECK(troupe::field_of(rt.supervise(window).error()) == "children[0].window_ms");
}

TEST_CASE("a JSON spec is read completely and refused on unknown or bad fields") {
  std::map<std::string, troupe::start_fn> factories{{"worker", start_worker()}};
  auto ok = troupe::spec_from_json(nlohmann::json::parse(R"({
    "name": "api", "strategy": "rest_for_one", "intensity": 3, "period_ms": 1000,
    "children": [{"name": "db", "start": "worker", "restart": "on_failure",
                  "shutdown": "brutal_kill", "max_restarts": 2, "window_ms": 500,
                  "backoff_ms": 10, "factor": 1.5, "max_backoff_ms": 100, "jitter_ms": 5,
                  "circuit_open_ms": 250}]})"),
                                   factories);
  REQUIRE(ok);
  CHECK(ok->strategy == troupe::strategy::rest_for_one);
  CHECK(ok->children.at(0).brutal_kill);
  CHECK(ok->children.at(0).restart == restart_mode::on_failure);
  CHECK(ok->children.at(0).circuit_open_ms == 250);
  auto field = [&](const char* text) {
    auto r = troupe::spec_from_json(nlohmann::json::parse(text), factories);
    REQUIRE_FALSE(r);
    CHECK(troupe::is(r.error(), errc::invalid_spec));
    return troupe::field_of(r.error());
  };
  CHECK(field(R"({"strategy": "one_for_some"})") == "strategy");
  CHECK(field(R"({"period_ms": -1})") == "period_ms");
  CHECK(field(R"({"colour": "red"})") == "colour");
  CHECK(field(R"({"children": [{"name": "a", "start": "nope"}]})") == "children[0].start");
  CHECK(field(R"({"children": [{"name": "a"}]})") == "children[0].start");
  CHECK(field(R"({"children": [{"name": "a", "start": "worker", "restart": "sometimes"}]})") ==
        "children[0].restart");
  CHECK(field(R"({"children": [{"name": "a", "start": "worker", "extra": 1}]})") ==
        "children[0].extra");
  CHECK(field(R"({"children": [{"name": "a", "start": "worker"},
                               {"name": "a", "start": "worker"}]})") == "children[1].name");
}

// -- strategies -----------------------------------------------------------------------------

TEST_CASE("one_for_one restarts only the failed child") {
  harness h;
  supervisor_spec spec;
  spec.intensity = 10;
  spec.children = {child("a"), child("b"), child("c")};
  h.start(spec);
  auto a0 = h.actor_of(0), b0 = h.actor_of(1), c0 = h.actor_of(2);
  h.send(1, crash_atom::value);
  auto st = h.state();
  CHECK(st.children[0].actor == a0);
  CHECK(st.children[1].actor != b0);
  CHECK(st.children[1].status == child_status::running);
  CHECK(st.children[1].restarts == 1);
  CHECK(st.children[2].actor == c0);
  CHECK(h.events("restarted") == std::vector<std::string>{"restarted:b@0"});
}

TEST_CASE("one_for_all restarts every child when one fails") {
  harness h;
  supervisor_spec spec;
  spec.strategy = troupe::strategy::one_for_all;
  spec.intensity = 10;
  spec.children = {child("a"), child("b"), child("c")};
  h.start(spec);
  auto before = h.state();
  h.send(1, crash_atom::value);
  auto st = h.state();
  for (size_t i = 0; i < 3; ++i) {
    CHECK(st.children[i].status == child_status::running);
    CHECK(st.children[i].actor != before.children[i].actor);
  }
  // Restarted in start order.
  CHECK(h.events("restarted") ==
        std::vector<std::string>{"restarted:a@0", "restarted:b@0", "restarted:c@0"});
}

namespace {

/// one_for_all over a, b (ignores exit requests: killed after its 500 ms shutdown), c.
supervisor_spec stubborn_middle_group(int64_t intensity) {
  supervisor_spec spec;
  spec.strategy = troupe::strategy::one_for_all;
  spec.intensity = intensity;
  spec.children = {child("a"), child("b"), child("c")};
  spec.children[1].start = start_stubborn();
  spec.children[1].shutdown_ms = 500;
  return spec;
}

} // namespace

TEST_CASE("a group restart stops the others one at a time, the last started first (OTP)") {
  // c fails. OTP stops b, waits for its end (the kill at 500 ms), then stops a; then starts
  // a, b, c.
  harness h;
  h.start(stubborn_middle_group(10));
  auto a0 = h.actor_of(0);
  h.send(2, crash_atom::value);
  h.rt.advance(100ms);
  {
    auto st = h.state(); // b is being stopped; a still runs (its turn comes after b's end)
    CHECK(st.children[0].status == child_status::running);
    CHECK(st.children[0].actor == a0);
    CHECK(st.children[2].status == child_status::waiting);
  }
  h.rt.advance(500ms);
  CHECK(h.events("stopped") == std::vector<std::string>{"stopped:b@500", "stopped:a@500"});
  CHECK(h.events("killed") == std::vector<std::string>{"killed:b@500"});
  CHECK(h.events("restarted") ==
        std::vector<std::string>{"restarted:a@500", "restarted:b@500", "restarted:c@500"});
  auto st = h.state();
  for (auto& c : st.children)
    CHECK(c.status == child_status::running);
}

TEST_CASE("a child that ends while a group restart waits to stop it is part of that round") {
  // a ends by itself while the round stops b: its end is the round's stop of it, not a
  // second failure (intensity 1 is not exceeded), and each child restarts once.
  harness h;
  h.start(stubborn_middle_group(1));
  h.send(2, crash_atom::value);
  h.rt.advance(100ms);
  h.send(0, crash_atom::value);
  CHECK(h.state().children[0].status == child_status::waiting);
  h.rt.advance(500ms);
  auto st = h.state();
  CHECK(st.status == troupe::supervisor_status::running);
  for (auto& c : st.children) {
    CHECK(c.status == child_status::running);
    CHECK(c.restarts == 1);
  }
}

TEST_CASE("rest_for_one restarts the failed child and those started after it") {
  harness h;
  supervisor_spec spec;
  spec.strategy = troupe::strategy::rest_for_one;
  spec.intensity = 10;
  spec.children = {child("producer"), child("transformer"), child("sink")};
  h.start(spec);
  auto before = h.state();
  h.send(1, crash_atom::value);
  auto st = h.state();
  CHECK(st.children[0].actor == before.children[0].actor);
  CHECK(st.children[1].actor != before.children[1].actor);
  CHECK(st.children[2].actor != before.children[2].actor);
  CHECK(st.children[0].restarts == 0);
  CHECK(st.children[2].restarts == 1);
}

TEST_CASE("escalate_to_parent: a failing child fails the supervisor, which stops the rest") {
  harness h;
  supervisor_spec spec;
  spec.strategy = troupe::strategy::escalate_to_parent;
  spec.children = {child("a"), child("b")};
  h.start(spec);
  caf::anon_send(h.actor_of(1), crash_atom::value);
  auto fin = h.rt.supervisor_wait(h.sup);
  REQUIRE(fin);
  CHECK(fin->status == troupe::supervisor_status::failed);
  CHECK(fin->reason.find("TROUPE-SUP-004") != std::string::npos);
  CHECK(fin->children[0].status == child_status::stopped);
  h.sup.actor = nullptr;
}

// -- restart modes -------------------------------------------------------------------------------

TEST_CASE("restart modes: always, on_failure and never") {
  harness h;
  supervisor_spec spec;
  spec.intensity = 10;
  spec.children = {child("perm", restart_mode::always), child("trans", restart_mode::on_failure),
                   child("temp", restart_mode::never), child("trans2", restart_mode::on_failure)};
  h.start(spec);
  h.send(0, finish_atom::value); // a normal exit of a permanent child: restarted
  h.send(1, finish_atom::value); // a normal exit of a transient child: not restarted
  auto trans2 = h.actor_of(3);
  h.send(2, crash_atom::value); // a temporary child: never restarted, and forgotten (OTP)
  caf::anon_send(trans2, crash_atom::value); // a failure of a transient child: restarted
  h.rt.drain();
  auto st = h.state();
  REQUIRE(st.children.size() == 3);
  CHECK(st.children[0].status == child_status::running);
  CHECK(st.children[0].restarts == 1);
  CHECK(st.children[1].status == child_status::stopped);
  CHECK(st.children[2].name == "trans2");
  CHECK(st.children[2].status == child_status::running);
  CHECK(st.children[2].restarts == 1);
  CHECK(h.events("forgotten") == std::vector<std::string>{"forgotten:temp@0"});
}

// -- budgets
// ---------------------------------------------------------------------------------------

namespace {

/// Crashes child 0 `n` times, `gap` apart; returns the final supervisor status.
troupe::supervisor_status crash_spaced(harness& h, int n, std::chrono::milliseconds gap) {
  for (int i = 0; i < n; ++i) {
    if (i > 0) h.rt.advance(gap);
    auto st = h.state();
    if (st.status != troupe::supervisor_status::running) return st.status;
    h.send(0, crash_atom::value);
  }
  auto st = h.rt.supervisor_state_of(h.sup);
  return st ? st->status : troupe::supervisor_status::failed;
}

} // namespace

TEST_CASE("restart intensity: restarts spaced just inside the period escalate") {
  harness h;
  supervisor_spec spec;
  spec.intensity = 2;
  spec.period_ms = 1000;
  spec.children = {child("flaky")};
  h.start(spec);
  // Three restarts at 0, 499 and 998 ms: all within 1000 ms, one more than the intensity.
  crash_spaced(h, 3, 499ms);
  auto fin = h.rt.supervisor_wait(h.sup);
  REQUIRE(fin);
  CHECK(fin->status == troupe::supervisor_status::failed);
  CHECK(fin->reason.find("intensity_exceeded") != std::string::npos);
  h.sup.actor = nullptr;
}

TEST_CASE("restart intensity: restarts spaced just outside the period are fine") {
  harness h;
  supervisor_spec spec;
  spec.intensity = 2;
  spec.period_ms = 1000;
  spec.children = {child("flaky")};
  h.start(spec);
  // At 0, 501, 1002, 1503: never three within any 1000 ms.
  CHECK(crash_spaced(h, 4, 501ms) == troupe::supervisor_status::running);
  CHECK(h.state().children[0].restarts == 4);
}

TEST_CASE("a child over its own budget is suppressed while its siblings go on") {
  harness h;
  supervisor_spec spec;
  spec.intensity = 100;
  spec.children = {child("flaky"), child("steady")};
  spec.children[0].max_restarts = 2;
  spec.children[0].window_ms = 10'000;
  h.start(spec);
  for (int i = 0; i < 3; ++i)
    h.send(0, crash_atom::value);
  auto st = h.state();
  CHECK(st.status == troupe::supervisor_status::running);
  CHECK(st.children[0].status == child_status::suppressed);
  CHECK(st.children[0].restarts == 2);
  CHECK(st.children[1].status == child_status::running);
  CHECK(h.events("suppressed").size() == 1);
}

// -- pacing ---------------------------------------------------------------------------------------

TEST_CASE("exponential backoff waits exactly, on the runtime clock") {
  harness h;
  supervisor_spec spec;
  spec.intensity = 100;
  spec.period_ms = 100'000;
  spec.children = {child("svc")};
  spec.children[0].backoff_ms = 100;
  spec.children[0].factor = 2.0;
  spec.children[0].max_backoff_ms = 250;
  h.start(spec);
  for (int i = 0; i < 3; ++i) {
    h.send(0, crash_atom::value);
    auto st = h.state();
    CHECK(st.children[0].status == child_status::waiting);
    h.rt.advance(1s); // the restart happens inside this second
  }
  CHECK(h.events("restarted") ==
        std::vector<std::string>{"restarted:svc@100", "restarted:svc@1200", "restarted:svc@2250"});
}

TEST_CASE("jitter is deterministic: a replay waits the same") {
  troupe::child_spec c = child("svc");
  c.backoff_ms = 100;
  c.jitter_ms = 40;
  for (uint64_t attempt = 1; attempt <= 5; ++attempt) {
    auto d = troupe::restart_delay_ms(c, attempt);
    CHECK(d == troupe::restart_delay_ms(c, attempt));
    auto base = std::min<int64_t>(100 << (attempt - 1), c.max_backoff_ms);
    CHECK(d >= base);
    CHECK(d <= base + 40);
  }
  // Large attempt numbers neither overflow nor turn into NaN.
  CHECK(troupe::restart_delay_ms(c, 100'000) >= c.max_backoff_ms);
  CHECK(troupe::restart_delay_ms(c, 100'000) <= c.max_backoff_ms + 40);
  auto none = child("none");
  CHECK(troupe::restart_delay_ms(none, 100'000) == 0);
  auto other = c;
  other.name = "svc2";
  bool differs = false;
  for (uint64_t attempt = 1; attempt <= 5; ++attempt)
    differs =
        differs || troupe::restart_delay_ms(c, attempt) != troupe::restart_delay_ms(other, attempt);
  CHECK(differs);
}

// -- start failures, shutdown --------------------------------------------------------------------

TEST_CASE("a child that fails to start fails the supervisor; one that answers ignore does not") {
  auto rt = make_virtual_rt();
  supervisor_spec spec;
  spec.children = {child("first"), child("ignored"), child("broken"), child("never")};
  spec.children[1].start = [](caf::actor_system&) -> troupe::start_result {
    return std::optional<caf::actor>{};
  };
  spec.children[2].start = [](caf::actor_system&) -> troupe::start_result {
    return troupe::make_error(errc::invalid_argument, "port", "port 80 is taken");
  };
  int never_started = 0;
  spec.children[3].start = [&never_started](caf::actor_system& sys) -> troupe::start_result {
    ++never_started;
    return std::optional<caf::actor>{sys.spawn(worker)};
  };
  auto r = rt.supervise(spec);
  REQUIRE_FALSE(r);
  CHECK(troupe::is(r.error(), errc::start_failed));
  CHECK(troupe::detail_of(r.error()).find("port 80 is taken") != std::string::npos);
  CHECK(never_started == 0);
  auto ok = rt.supervise(supervisor_spec{"s2",
                                         troupe::strategy::one_for_one,
                                         1,
                                         5000,
                                         troupe::auto_shutdown::never,
                                         {child("a"), spec.children[1]},
                                         std::nullopt,
                                         0});
  REQUIRE(ok);
  auto st = rt.supervisor_state_of(*ok);
  REQUIRE(st);
  CHECK(st->children[1].status == child_status::stopped);
  CHECK(st->status == troupe::supervisor_status::running);
  (void)rt.supervisor_stop(*ok, 1s);
}

TEST_CASE("stop: children stop in reverse order; a stubborn one is killed after its timeout") {
  harness h;
  supervisor_spec spec;
  spec.children = {child("a"), child("stubborn"), child("brutal"), child("c")};
  spec.children[1].start = [](caf::actor_system& sys) -> troupe::start_result {
    return std::optional<caf::actor>{sys.spawn(stubborn)};
  };
  spec.children[1].shutdown_ms = 500;
  spec.children[2].brutal_kill = true;
  h.start(spec);
  auto fin = h.rt.supervisor_stop(h.sup, 10s);
  REQUIRE(fin);
  CHECK(fin->status == troupe::supervisor_status::stopped);
  auto stops = h.events("stopped");
  CHECK(stops == std::vector<std::string>{"stopped:c@0", "stopped:brutal@0", "stopped:stubborn@500",
                                          "stopped:a@500"});
  CHECK(h.events("killed") == std::vector<std::string>{"killed:stubborn@500"});
  h.sup.actor = nullptr;
}

TEST_CASE("a child whose restart keeps failing: the supervisor reports and stops cleanly") {
  harness h;
  auto starts = std::make_shared<int>(0);
  supervisor_spec spec;
  spec.intensity = 3;
  spec.children = {child("fragile"), child("other")};
  spec.children[0].start = [starts](caf::actor_system& sys) -> troupe::start_result {
    if (++*starts > 1)
      return troupe::make_error(errc::invalid_argument, "db", "connection refused");
    return std::optional<caf::actor>{sys.spawn(worker)};
  };
  h.start(spec);
  h.send(0, crash_atom::value);
  auto fin = h.rt.supervisor_wait(h.sup);
  REQUIRE(fin);
  CHECK(fin->status == troupe::supervisor_status::failed);
  CHECK(fin->reason.find("intensity_exceeded") != std::string::npos);
  CHECK(fin->children[1].status == child_status::stopped);
  CHECK(*starts == 4); // the first start, then 3 failed restarts; a 4th would exceed 3
  h.sup.actor = nullptr;
}

TEST_CASE("nested supervisors: a subtree that gives up is restarted by its parent") {
  harness h;
  supervisor_spec inner;
  inner.name = "inner";
  inner.intensity = 0; // gives up at the first failure
  inner.children = {child("leaf")};
  supervisor_spec outer;
  outer.name = "outer";
  outer.intensity = 5;
  outer.children = {troupe::child_spec{}};
  outer.children[0].name = "subtree";
  outer.children[0].start = troupe::supervisor_child(h.rt.clock(), inner);
  h.start(outer);
  auto inner_sup = h.actor_of(0);
  auto inner_state = h.rt.supervisor_state_of(inner_sup);
  REQUIRE(inner_state);
  caf::anon_send(inner_state->children[0].actor, crash_atom::value);
  h.rt.drain();
  auto st = h.state();
  CHECK(st.status == troupe::supervisor_status::running);
  CHECK(st.children[0].restarts == 1);
  CHECK(st.children[0].actor != inner_sup);
  CHECK(st.children[0].last_error.find("intensity_exceeded") != std::string::npos);
  // Stopping the outer supervisor stops the subtree (and its leaf) first.
  auto fin = h.rt.supervisor_stop(h.sup, 1s);
  REQUIRE(fin);
  CHECK(fin->status == troupe::supervisor_status::stopped);
  h.sup.actor = nullptr;
}

TEST_CASE("a supervisor restarts a child that crashes at once 20,000 times and keeps going") {
  // Guards two bugs found by the benchmark: a NaN backoff after ~1000 restarts, and a late
  // link message of a replaced child taken for a shutdown request.
  auto rt = troupe::runtime::builder{}.build();
  REQUIRE(rt);
  auto starts = std::make_shared<std::atomic<long>>(0);
  auto done = std::make_shared<std::promise<void>>();
  supervisor_spec spec;
  spec.intensity = 1'000'000;
  spec.children = {child("crasher")};
  spec.children[0].start = [starts, done](caf::actor_system& sys) -> troupe::start_result {
    if (++*starts == 20'001) {
      done->set_value();
      return std::optional<caf::actor>{sys.spawn(worker)}; // stays up
    }
    return std::optional<caf::actor>{sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
      self->quit(caf::sec::runtime_error);
      return {};
    })};
  };
  auto sup = rt->supervise(spec);
  REQUIRE(sup);
  done->get_future().wait(); // bounded by the suite's timeout
  auto st = rt->supervisor_state_of(*sup);
  REQUIRE(st);
  CHECK(st->status == troupe::supervisor_status::running);
  CHECK(st->children[0].restarts == 20'000);
  auto fin = rt->supervisor_stop(*sup, 1s);
  REQUIRE(fin);
  CHECK(fin->status == troupe::supervisor_status::stopped);
}

TEST_CASE("circuit breaker: a spent budget opens the circuit, then one half-open try") {
  harness h;
  supervisor_spec spec;
  spec.intensity = 100;
  spec.period_ms = 100'000;
  spec.children = {child("db"), child("web")};
  spec.children[0].max_restarts = 1;
  spec.children[0].window_ms = 5000;
  spec.children[0].circuit_open_ms = 1000;
  h.start(spec);
  h.send(0, crash_atom::value); // restart #1 at 0
  h.send(0, crash_atom::value); // budget spent at 0: the circuit opens until 1000
  auto st = h.state();
  CHECK(st.children[0].status == child_status::circuit_open);
  CHECK(st.children[0].next_restart_ms == 1000);
  CHECK(st.children[1].status == child_status::running);
  h.rt.advance(1000ms); // the half-open try
  CHECK(h.state().children[0].status == child_status::running);
  h.send(0, crash_atom::value); // the try fails within its window: open again until 2000
  CHECK(h.state().children[0].status == child_status::circuit_open);
  CHECK(h.state().children[0].next_restart_ms == 2000);
  h.rt.advance(1000ms);         // another half-open try at 2000
  h.rt.advance(6000ms);         // it proves itself for longer than the window
  h.send(0, crash_atom::value); // a plain failure again: restarted on a fresh budget
  CHECK(h.state().children[0].status == child_status::running);
  CHECK(h.events("circuit_open") ==
        std::vector<std::string>{"circuit_open:db@0", "circuit_open:db@1000"});
  CHECK(h.events("half_open") ==
        std::vector<std::string>{"half_open:db@1000", "half_open:db@2000"});
}

TEST_CASE("dynamic children: start, terminate, restart, delete, which and count") {
  harness h;
  supervisor_spec spec;
  spec.intensity = 10;
  spec.children = {child("base")};
  h.start(spec);
  auto added = h.rt.start_child(h.sup, child("extra"));
  REQUIRE(added);
  CHECK(added->status == child_status::running);
  auto dup = h.rt.start_child(h.sup, child("extra"));
  REQUIRE_FALSE(dup);
  CHECK(troupe::is(dup.error(), errc::already_started)); // OTP's {already_started, Pid}
  CHECK(troupe::field_of(dup.error()) == "name");
  auto counts = h.rt.count_children(h.sup);
  REQUIRE(counts);
  CHECK(counts->specs == 2);
  CHECK(counts->active == 2);
  // terminate: stopped and, although permanent, not restarted
  auto t = h.rt.terminate_child(h.sup, "extra");
  REQUIRE(t);
  CHECK(*t);
  auto kids = h.rt.which_children(h.sup);
  REQUIRE(kids);
  CHECK(kids->at(1).status == child_status::stopped);
  CHECK(h.rt.count_children(h.sup)->active == 1);
  CHECK_FALSE(*h.rt.terminate_child(h.sup, "extra")); // not running any more
  auto present = h.rt.start_child(h.sup, child("extra"));
  REQUIRE_FALSE(present);
  CHECK(troupe::is(present.error(), errc::already_present)); // OTP's already_present
  auto running = h.rt.delete_child(h.sup, "base");
  REQUIRE_FALSE(running);
  CHECK(troupe::is(running.error(), errc::child_running));
  auto again = h.rt.restart_child(h.sup, "extra");
  REQUIRE(again);
  CHECK(again->status == child_status::running);
  CHECK(again->restarts == 1);
  REQUIRE(*h.rt.terminate_child(h.sup, "extra"));
  auto del = h.rt.delete_child(h.sup, "extra");
  REQUIRE(del);
  CHECK(*del);
  CHECK(h.rt.count_children(h.sup)->specs == 1);
  auto unknown = h.rt.restart_child(h.sup, "ghost");
  REQUIRE_FALSE(unknown);
  CHECK(troupe::is(unknown.error(), errc::unknown_child));
  CHECK(troupe::field_of(unknown.error()) == "name");
  // The remaining child still restarts normally (timers were keyed by uid, not index).
  h.send(0, crash_atom::value);
  CHECK(h.state().children[0].restarts == 1);
}

TEST_CASE("auto_shutdown: significant children end the supervisor, as in OTP") {
  auto significant = [](std::string name) {
    auto c = child(std::move(name), restart_mode::on_failure);
    c.significant = true;
    return c;
  };
  SECTION("any_significant: the first one that ends stops the supervisor") {
    harness h;
    supervisor_spec spec;
    spec.auto_shutdown = troupe::auto_shutdown::any_significant;
    spec.children = {child("web"), significant("job1"), significant("job2")};
    h.start(spec);
    h.send(1, finish_atom::value);
    auto fin = h.rt.supervisor_wait(h.sup);
    REQUIRE(fin);
    CHECK(fin->status == troupe::supervisor_status::stopped);
    CHECK(fin->reason.find("job1") != std::string::npos);
    h.sup.actor = nullptr;
  }
  SECTION("all_significant: only when every significant child has ended") {
    harness h;
    supervisor_spec spec;
    spec.auto_shutdown = troupe::auto_shutdown::all_significant;
    spec.children = {child("web"), significant("job1"), significant("job2")};
    h.start(spec);
    h.send(1, finish_atom::value);
    CHECK(h.state().status == troupe::supervisor_status::running);
    h.send(1 + 1, finish_atom::value);
    auto fin = h.rt.supervisor_wait(h.sup);
    REQUIRE(fin);
    CHECK(fin->status == troupe::supervisor_status::stopped);
    h.sup.actor = nullptr;
  }
  SECTION("a failing significant child is restarted, not counted as ended") {
    harness h;
    supervisor_spec spec;
    spec.intensity = 5;
    spec.auto_shutdown = troupe::auto_shutdown::any_significant;
    spec.children = {significant("job")};
    h.start(spec);
    h.send(0, crash_atom::value);
    CHECK(h.state().status == troupe::supervisor_status::running);
    CHECK(h.state().children[0].restarts == 1);
  }
  SECTION("a significant child whose restarts are suppressed has ended: any_significant stops "
          "the supervisor") {
    harness h;
    supervisor_spec spec;
    spec.intensity = 10;
    spec.auto_shutdown = troupe::auto_shutdown::any_significant;
    spec.children = {child("web"), significant("job")};
    spec.children[1].max_restarts = 1;
    spec.children[1].window_ms = 60'000;
    h.start(spec);
    h.send(1, crash_atom::value); // restarted
    CHECK(h.state().status == troupe::supervisor_status::running);
    h.send(1, crash_atom::value); // its budget is spent: it stays down
    auto fin = h.rt.supervisor_wait(h.sup);
    REQUIRE(fin);
    CHECK(fin->status == troupe::supervisor_status::stopped);
    CHECK(fin->reason.find("job") != std::string::npos);
    h.sup.actor = nullptr;
  }
  SECTION("invalid combinations are refused") {
    auto rt = make_virtual_rt();
    supervisor_spec permanent;
    permanent.auto_shutdown = troupe::auto_shutdown::any_significant;
    permanent.children = {child("a")};
    permanent.children[0].significant = true;
    CHECK(troupe::field_of(rt.supervise(permanent).error()) == "children[0].significant");
    supervisor_spec never;
    never.children = {significant("a")};
    CHECK(troupe::field_of(rt.supervise(never).error()) == "children[0].significant");
  }
}

TEST_CASE("supervisor_metrics counts what happened") {
  harness h;
  supervisor_spec spec;
  spec.intensity = 10;
  spec.children = {child("a"), child("b", restart_mode::on_failure)};
  spec.children[0].max_restarts = 1;
  h.start(spec);
  h.send(0, crash_atom::value);  // failure + restart
  h.send(0, crash_atom::value);  // failure + suppressed
  h.send(1, finish_atom::value); // a normal exit, not restarted
  auto m =
      h.rt.run([&](troupe::context& cx) -> troupe::task<caf::expected<troupe::supervisor_metrics>> {
        co_return co_await cx.request<troupe::supervisor_metrics>(
            h.sup.actor, troupe::atoms::sup_metrics_atom::value);
      });
  REQUIRE(m);
  REQUIRE(*m);
  auto& x = **m;
  CHECK(x.started == 3);
  CHECK(x.restarts == 1);
  CHECK(x.failures == 2);
  CHECK(x.normal_exits == 1);
  CHECK(x.suppressed == 1);
  CHECK(x.children == 2);
  CHECK(x.active == 0);
}

// -- resident services ---------------------------------------------------------------------------

TEST_CASE("a child exiting by itself during shutdown is recorded, not restarted") {
  harness h;
  supervisor_spec spec;
  spec.intensity = 10;
  spec.children = {child("a"), child("stubborn"), child("c")};
  spec.children[1].start = [](caf::actor_system& sys) -> troupe::start_result {
    return std::optional<caf::actor>{sys.spawn(stubborn)};
  };
  spec.children[1].shutdown_ms = 500;
  h.start(spec);
  auto a = h.actor_of(0);
  // Stop in a task, and crash "a" while the supervisor waits for "stubborn".
  auto v = h.rt.run([&](troupe::context& cx) -> troupe::task<std::string> {
    auto stopper =
        cx.spawn([&](troupe::context& c) -> troupe::task<caf::expected<troupe::supervisor_state>> {
          co_return co_await c.request<troupe::supervisor_state>(
              h.sup.actor, troupe::atoms::sup_stop_atom::value, int64_t{10'000});
        });
    co_await cx.sleep(std::chrono::milliseconds(100));
    caf::anon_send(a, crash_atom::value);
    auto fin = co_await cx.await(stopper);
    if (!fin || !*fin) co_return "?";
    auto& st = **fin;
    co_return std::string{troupe::to_string(st.status)} + "|" +
        troupe::to_string(st.children[0].status) + "|" + std::to_string(st.children[0].restarts) +
        "|" + std::to_string(cx.clock().now_ms());
  });
  REQUIRE(v);
  CHECK(*v == "stopped|failed|0|500");
  h.sup.actor = nullptr;
}

TEST_CASE("every strategy escalates when the intensity is exceeded") {
  for (auto strat : {troupe::strategy::one_for_one, troupe::strategy::one_for_all,
                     troupe::strategy::rest_for_one}) {
    harness h;
    supervisor_spec spec;
    spec.strategy = strat;
    spec.intensity = 1;
    spec.children = {child("a"), child("b"), child("c")};
    h.start(spec);
    h.send(1, crash_atom::value); // restart 1: within the intensity
    h.send(1, crash_atom::value); // restart 2 within 5 s: escalates
    auto fin = h.rt.supervisor_wait(h.sup);
    REQUIRE(fin);
    CHECK(fin->status == troupe::supervisor_status::failed);
    CHECK(fin->reason.find("intensity_exceeded") != std::string::npos);
    for (auto& c : fin->children)
      CHECK_FALSE(c.actor); // every child was stopped
    h.sup.actor = nullptr;
  }
}

// -- regressions found in review ------------------------------------------------------------

TEST_CASE("stopping while a stubborn child is being terminated still kills it on time") {
  harness h;
  supervisor_spec spec;
  spec.children = {child("a"), child("stubborn")};
  spec.children[1].start = [](caf::actor_system& sys) -> troupe::start_result {
    return std::optional<caf::actor>{sys.spawn(stubborn)};
  };
  spec.children[1].shutdown_ms = 500;
  h.start(spec);
  auto v = h.rt.run([&](troupe::context& cx) -> troupe::task<std::string> {
    // terminate_child starts the termination (kill due at 500 ms); a stop without a timeout
    // follows at once. Before the fix, the stop cancelled the kill timer and hung.
    auto term = terminate_in_task(cx, h.sup.actor, "stubborn");
    co_await cx.yield_now();
    auto fin = co_await cx.request<troupe::supervisor_state>(
        h.sup.actor, troupe::atoms::sup_stop_atom::value, int64_t{-1});
    auto t = co_await cx.await(term);
    co_return std::string{fin ? troupe::to_string(fin->status) : "?"} + "|" +
        (t && *t && **t ? "terminated" : "?") + "|" + std::to_string(cx.clock().now_ms());
  });
  REQUIRE(v);
  CHECK(*v == "stopped|terminated|500");
  h.sup.actor = nullptr;
}

TEST_CASE("restart_child during a group restart's backoff does not start the child twice") {
  harness h;
  supervisor_spec spec;
  spec.strategy = troupe::strategy::one_for_all;
  spec.intensity = 10;
  spec.children = {child("a"), child("b")};
  spec.children[0].backoff_ms = 100;
  h.start(spec);
  h.send(0, crash_atom::value); // b is stopped; the group restarts in 100 ms
  CHECK(h.state().children[1].status == child_status::waiting);
  // OTP: restart_child on a child its supervisor is about to restart answers `restarting`;
  // the group restart goes on and starts it once.
  auto b = h.rt.restart_child(h.sup, "b");
  REQUIRE_FALSE(b);
  CHECK(troupe::is(b.error(), errc::restarting));
  h.rt.advance(std::chrono::milliseconds(200));
  auto st = h.state();
  CHECK(st.children[0].status == child_status::running);
  CHECK(st.children[1].status == child_status::running);
  CHECK(st.children[1].restarts == 1);
  CHECK(h.events("started").size() == 4); // a and b, then each once more
}

TEST_CASE("stop() stops running supervisors too (virtual and real time)") {
  for (bool real : {false, true}) {
    auto rt = real ? troupe_test::make_real_rt() : make_virtual_rt();
    supervisor_spec spec;
    spec.children = {child("a"), child("b")};
    auto sup = rt.supervise(spec);
    REQUIRE(sup);
    rt.stop(); // returns: the supervisor stopped its children and ended (ctest's timeout would)
    CHECK(rt.stopped());
    REQUIRE(sup->final);
    std::lock_guard<std::mutex> guard{sup->final->mtx};
    CHECK(sup->final->state.has_value());
  }
}

// The supervisor renders a failure's reason once and reuses it while the same reason repeats
// (supervisor_actor::rendered); reasons that differ only in their context are told apart.
TEST_CASE("a child's last error follows each failure's own reason, context included") {
  harness h;
  supervisor_spec spec;
  spec.intensity = 100;
  spec.children = {child("a")};
  h.start(spec);
  auto fail_with = [&](caf::error reason) {
    auto a = h.actor_of(0);
    a->enqueue(nullptr, caf::make_message_id(),
               caf::make_message(caf::exit_msg{a.address(), std::move(reason)}), nullptr);
    h.rt.drain();
    return h.state().children.at(0).last_error;
  };
  auto plain = fail_with(caf::sec::runtime_error);
  CHECK(plain == troupe::render(caf::sec::runtime_error));
  CHECK(fail_with(caf::sec::runtime_error) == plain);
  auto one = fail_with(troupe::make_error(errc::child_failed, "one", "first detail"));
  CHECK(one.find("first detail") != std::string::npos);
  auto two = fail_with(troupe::make_error(errc::child_failed, "two", "second detail"));
  CHECK(two.find("second detail") != std::string::npos);
  CHECK(fail_with(caf::sec::unexpected_message) == troupe::render(caf::sec::unexpected_message));
  CHECK(fail_with(caf::sec::runtime_error) == plain);
  CHECK(h.state().children.at(0).restarts == 6);
}

TEST_CASE("the event log keeps the last 1024 events, each intact, and a cursor reads its tail") {
  // 700 restarts of a child that fails at once: 1 + 700 * 3 events. Failures alternate a
  // short reason and a long one, so the log's reused slots see their strings grow and shrink.
  harness h;
  auto starts = std::make_shared<int>(0);
  supervisor_spec spec;
  spec.intensity = 1'000'000;
  spec.children = {child("crasher")};
  spec.children[0].start = [starts](caf::actor_system& sys) -> troupe::start_result {
    auto n = ++*starts;
    if (n > 700) return std::optional<caf::actor>{sys.spawn(worker)}; // stays up
    return std::optional<caf::actor>{sys.spawn([n](caf::event_based_actor* self) -> caf::behavior {
      if (n % 2 == 0)
        self->quit(caf::sec::runtime_error);
      else
        self->quit(caf::make_error(caf::sec::runtime_error,
                                   std::string(100, 'x') + "-" + std::to_string(n)));
      return {};
    })};
  };
  h.start(spec);
  h.rt.drain();
  REQUIRE(*starts == 701);
  auto ev = h.rt.supervisor_events(h.sup);
  REQUIRE(ev);
  const uint64_t total = 1 + 700 * 3;
  REQUIRE(ev->size() == 1024);
  CHECK(ev->back().seq == total);
  size_t wrong = 0;
  for (size_t i = 0; i < ev->size(); ++i) {
    auto& e = (*ev)[i];
    auto seq = total - 1023 + i;
    if (e.seq != seq || e.child != "crasher") ++wrong;
    // Restart k's events are seq 3k-1 (failed: start k ended), 3k (started), 3k+1 (restarted).
    auto k = (seq + 1) / 3;
    switch (seq % 3) {
      case 2: { // failed; the start that ended was start k
        bool long_reason = k % 2 == 1;
        auto tail = "-" + std::to_string(k);
        bool has_tail = e.reason.find(std::string(100, 'x') + tail) != std::string::npos;
        if (e.kind != troupe::supervisor_event_kind::failed || has_tail != long_reason) ++wrong;
        break;
      }
      case 0:
        if (e.kind != troupe::supervisor_event_kind::started || !e.reason.empty()) ++wrong;
        break;
      case 1:
        if (e.kind != troupe::supervisor_event_kind::restarted ||
            e.reason != "restart #" + std::to_string(seq / 3))
          ++wrong;
        break;
    }
  }
  CHECK(wrong == 0);
  // A cursor inside the log gets what follows it; one older than the log gets all of it.
  auto tails = h.rt.run([sup = h.sup](troupe::context& cx) -> troupe::task<std::vector<size_t>> {
    std::vector<size_t> sizes;
    for (uint64_t after : {total - 10, uint64_t{5}, total - 1023, total - 1024}) {
      auto evs = co_await troupe::supervisor_next_events(cx, sup, after);
      sizes.push_back(evs ? evs->size() : 0);
      if (evs && !evs->empty() && evs->front().seq != std::max(after + 1, total - 1023))
        sizes.push_back(999);
    }
    co_return sizes;
  });
  REQUIRE(tails);
  CHECK(*tails == std::vector<size_t>{10, 1024, 1023, 1024});
}

// -- the kill queue (one clock timer for the earliest kill deadline) --------------------------

TEST_CASE("kill deadlines: a later termination with a shorter shutdown is killed first, at its "
          "own deadline") {
  harness h;
  supervisor_spec spec;
  spec.children = {child("slow"), child("quick")};
  for (auto& c : spec.children)
    c.start = start_stubborn();
  spec.children[0].shutdown_ms = 1000;
  spec.children[1].shutdown_ms = 200;
  h.start(spec);
  auto v = h.rt.run([&](troupe::context& cx) -> troupe::task<std::string> {
    auto term = [&](std::string name) { return terminate_in_task(cx, h.sup.actor, name); };
    auto slow = term("slow"); // its deadline (1000) arms the clock first
    co_await cx.sleep(std::chrono::milliseconds(100));
    auto quick = term("quick"); // due at 300: earlier, so the clock is armed again
    auto a = co_await cx.await(slow);
    auto b = co_await cx.await(quick);
    co_return std::string{a && *a && **a ? "ok" : "?"} + (b && *b && **b ? "ok" : "?");
  });
  REQUIRE(v);
  CHECK(*v == "okok");
  // Without re-arming for an earlier deadline, quick would wait for slow's (1000).
  CHECK(h.events("killed") == std::vector<std::string>{"killed:quick@300", "killed:slow@1000"});
}

TEST_CASE("kill deadlines: a deadline left by a termination that ended in time kills nothing; "
          "the next termination's own deadline counts") {
  harness h;
  supervisor_spec spec;
  spec.children = {child("anchor"), child("w")};
  auto starts = std::make_shared<int>(0);
  spec.children[0].start = start_stubborn();
  spec.children[0].shutdown_ms = 2000; // keeps a live deadline queued throughout
  // w's first incarnation stops when asked; its second ignores it.
  spec.children[1].start = [starts](caf::actor_system& sys) -> troupe::start_result {
    return std::optional<caf::actor>{++*starts == 1 ? sys.spawn(worker) : sys.spawn(stubborn)};
  };
  spec.children[1].shutdown_ms = 500;
  h.start(spec);
  auto v = h.rt.run([&](troupe::context& cx) -> troupe::task<std::string> {
    auto term = [&](std::string name) { return terminate_in_task(cx, h.sup.actor, name); };
    auto anchor = term("anchor");                  // due at 2000
    auto first = co_await cx.await(term("w"));     // stops at once; its 500 stays queued
    co_await cx.sleep(std::chrono::milliseconds(100));
    auto again = co_await cx.request<troupe::child_state>(
        h.sup.actor, troupe::atoms::sup_restart_atom::value, std::string{"w"});
    auto second = co_await cx.await(term("w"));    // due at 600, behind the stale 500
    auto t = cx.clock().now_ms();
    auto last = co_await cx.await(anchor);
    co_return std::string{first && *first && **first ? "ok" : "?"} + (again ? "ok" : "?") +
        (second && *second && **second ? "ok" : "?") + (last && *last && **last ? "ok" : "?") +
        "@" + std::to_string(t);
  });
  REQUIRE(v);
  CHECK(*v == "okokokok@600");
  // A stale deadline taken for the live one would kill w at 500.
  CHECK(h.events("killed") == std::vector<std::string>{"killed:w@600", "killed:anchor@2000"});
}

TEST_CASE("kill deadlines: on virtual time a termination that ends in time leaves no timer "
          "pending") {
  harness h;
  supervisor_spec spec;
  spec.children = {child("w")};
  spec.children[0].shutdown_ms = 5000;
  h.start(spec);
  auto before = h.rt.clock().pending();
  auto t = h.rt.terminate_child(h.sup, "w");
  REQUIRE(t);
  CHECK(*t);
  // Nothing left for `advance` or a stalled run to jump 5 s ahead to.
  CHECK(h.rt.clock().pending() == before);
  CHECK(h.rt.clock().now_ms() == 0);
}

TEST_CASE("a child that has ended before its supervisor first runs is seen ending (its down "
          "message waits in the supervisor's mailbox)") {
  // The static children start in the supervisor's constructor, and each is watched there:
  // a child already gone is reported at once, before CAF has launched the supervisor.
  harness h;
  auto starts = std::make_shared<int>(0);
  supervisor_spec spec;
  spec.intensity = 10;
  spec.children = {child("early")};
  spec.children[0].start = [starts](caf::actor_system& sys) -> troupe::start_result {
    if (++*starts > 1) return std::optional<caf::actor>{sys.spawn(worker)};
    caf::actor gone;
    {
      caf::scoped_actor s{sys}; // ends (normally) when this scope closes
      gone = caf::actor_cast<caf::actor>(s);
    }
    return std::optional<caf::actor>{gone};
  };
  h.start(spec);
  h.rt.drain();
  auto st = h.state();
  CHECK(*starts == 2);
  CHECK(st.children.at(0).status == child_status::running);
  CHECK(st.children.at(0).restarts == 1);
  CHECK(h.events("stopped") == std::vector<std::string>{"stopped:early@0"});
  CHECK(h.events("restarted") == std::vector<std::string>{"restarted:early@0"});
}
