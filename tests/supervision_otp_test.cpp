// OTP's restart semantics, exactly (and where troupe differs, the documented choice).

#include <memory>
#include <string>
#include <vector>

#include "supervision_support.hpp"

namespace {

troupe::supervisor_metrics metrics_of(harness& h) {
  auto m = h.rt.supervisor_metrics_of(h.sup);
  REQUIRE(m);
  return *m;
}

const troupe::child_state* find_child(const troupe::supervisor_state& st, const std::string& n) {
  for (auto& c : st.children)
    if (c.name == n) return &c;
  return nullptr;
}

/// A start function that counts its calls and fails from call `fail_from` on (0: never)
/// until `*healed`.
troupe::start_fn flaky_start(std::shared_ptr<int> calls, int fail_from,
                             std::shared_ptr<bool> healed = nullptr) {
  return [calls, fail_from, healed](caf::actor_system& sys) -> troupe::start_result {
    ++*calls;
    if (fail_from > 0 && *calls >= fail_from && !(healed && *healed))
      return troupe::make_error(errc::invalid_argument, "db", "connection refused");
    return std::optional<caf::actor>{sys.spawn(worker)};
  };
}

/// rest_for_one over a, b, c, where b's restarts fail until `*healed` and its own budget
/// (2 restarts a minute) opens its circuit for `circuit_open_ms` (0: suppresses it instead).
supervisor_spec flaky_b_group(std::shared_ptr<bool> healed, int64_t circuit_open_ms) {
  supervisor_spec spec;
  spec.strategy = troupe::strategy::rest_for_one;
  spec.intensity = 100;
  spec.period_ms = 60'000;
  spec.children = {child("a"), child("b"), child("c")};
  spec.children[1].start = flaky_start(std::make_shared<int>(0), 2, std::move(healed));
  spec.children[1].max_restarts = 2;
  spec.children[1].window_ms = 60'000;
  spec.children[1].circuit_open_ms = circuit_open_ms;
  return spec;
}

} // namespace

// -- clean ends ------------------------------------------------------------------------------

TEST_CASE("a shutdown exit is a clean end for every restart mode, with or without context") {
  for (caf::atom_value what : {caf::atom_value{shutdown_atom::value}, caf::atom_value{shutdown_ctx_atom::value}}) {
    harness h;
    supervisor_spec spec;
    spec.intensity = 10;
    spec.keep_ended_temporaries = 4; // keep the temporary listed, to see how it ended
    spec.children = {child("perm", restart_mode::always), child("trans", restart_mode::on_failure),
                     child("temp", restart_mode::never)};
    h.start(spec);
    h.send(1, what);
    h.send(2, what);
    h.send(0, what);
    auto st = h.state();
    CHECK(find_child(st, "trans")->status == child_status::stopped); // not restarted
    CHECK(find_child(st, "trans")->restarts == 0);
    CHECK(find_child(st, "temp")->status == child_status::stopped); // not `failed`
    CHECK(find_child(st, "perm")->status == child_status::running); // permanent: restarted
    CHECK(find_child(st, "perm")->restarts == 1);
    auto m = metrics_of(h);
    CHECK(m.failures == 0);
    CHECK(m.normal_exits == 3);
    CHECK(h.events("failed").empty());
  }
}

TEST_CASE("temporary children are never restarted, not even by a group restart") {
  for (auto strat : {troupe::strategy::one_for_all, troupe::strategy::rest_for_one}) {
    harness h;
    supervisor_spec spec;
    spec.strategy = strat;
    spec.intensity = 10;
    spec.children = {child("a"), child("temp", restart_mode::never), child("c")};
    h.start(spec);
    h.send(0, crash_atom::value); // the group restart stops temp: it stays stopped
    auto st = h.state();
    CHECK(find_child(st, "temp") == nullptr); // and is forgotten (OTP)
    CHECK(find_child(st, "a")->status == child_status::running);
    CHECK(find_child(st, "c")->status == child_status::running);
    CHECK(find_child(st, "c")->restarts == 1);
    CHECK(h.events("started").size() == 5); // a, temp, c; then a and c
  }
}

TEST_CASE("temporary children are forgotten when they end: no growth, names reusable") {
  harness h;
  supervisor_spec spec;
  spec.intensity = 10;
  h.start(spec);
  auto payload = std::make_shared<std::string>("captured by every start function");
  for (int i = 0; i < 200; ++i) {
    auto c = child("job", restart_mode::never); // the same name each time: reusable
    c.start = [payload](caf::actor_system& sys) -> troupe::start_result {
      return std::optional<caf::actor>{sys.spawn(worker)};
    };
    auto added = h.rt.start_child(h.sup, c);
    REQUIRE(added);
    caf::anon_send(added->actor, i % 2 == 0 ? crash_atom::value : finish_atom::value);
    h.rt.drain();
  }
  auto n = h.rt.count_children(h.sup);
  REQUIRE(n);
  CHECK(n->specs == 0);
  CHECK(n->active == 0);
  CHECK(payload.use_count() == 1); // the specs (and what they captured) are gone
  CHECK(h.events("forgotten").size() == 200);
  // terminate_child of a temporary deletes it too (OTP).
  auto c = child("t", restart_mode::never);
  REQUIRE(h.rt.start_child(h.sup, c));
  CHECK(*h.rt.terminate_child(h.sup, "t"));
  CHECK(h.rt.count_children(h.sup)->specs == 0);
  // An ignoring temporary child is not kept either.
  auto ign = child("ign", restart_mode::never);
  ign.start = [](caf::actor_system&) -> troupe::start_result { return std::optional<caf::actor>{}; };
  auto r = h.rt.start_child(h.sup, ign);
  REQUIRE(r);
  CHECK(r->status == child_status::stopped);
  CHECK(h.rt.count_children(h.sup)->specs == 0);
}

TEST_CASE("keep_ended_temporaries keeps the most recent ended temporaries, capped") {
  harness h;
  supervisor_spec spec;
  spec.keep_ended_temporaries = 3;
  h.start(spec);
  for (int i = 0; i < 10; ++i) {
    auto added = h.rt.start_child(h.sup, child("t" + std::to_string(i), restart_mode::never));
    REQUIRE(added);
    caf::anon_send(added->actor, i == 9 ? crash_atom::value : finish_atom::value);
    h.rt.drain();
  }
  auto st = h.state();
  REQUIRE(st.children.size() == 3);
  CHECK(st.children[0].name == "t7");
  CHECK(st.children[2].name == "t9");
  CHECK(st.children[2].status == child_status::failed);
  CHECK(st.children[0].status == child_status::stopped);
}

// -- manual restarts and group restarts ------------------------------------------------------

TEST_CASE("restart_child on a child waiting to restart answers restarting; the loop goes on") {
  harness h;
  supervisor_spec spec;
  spec.intensity = 3;
  spec.period_ms = 60'000;
  auto calls = std::make_shared<int>(0);
  spec.children = {child("db"), child("other")};
  spec.children[0].start = flaky_start(calls, 2); // the first start works, restarts fail
  spec.children[0].backoff_ms = 100;
  h.start(spec);
  h.send(0, crash_atom::value);
  CHECK(h.state().children[0].status == child_status::waiting);
  auto r = h.rt.restart_child(h.sup, "db");
  REQUIRE_FALSE(r);
  CHECK(troupe::is(r.error(), errc::restarting));
  CHECK(troupe::field_of(r.error()) == "name");
  auto del = h.rt.delete_child(h.sup, "db");
  REQUIRE_FALSE(del);
  CHECK(troupe::is(del.error(), errc::restarting));
  // Not abandoned: the restart loop keeps trying until the intensity trips, and the
  // supervisor escalates (it does not stay `running` with a dead child).
  h.rt.advance(10s);
  auto fin = h.rt.supervisor_wait(h.sup);
  REQUIRE(fin);
  CHECK(fin->status == troupe::supervisor_status::failed);
  CHECK(fin->reason.find("intensity_exceeded") != std::string::npos);
  CHECK(*calls == 4); // the start, then 3 failed restarts (intensity 3)
  h.sup.actor = nullptr;
}

TEST_CASE("a failed restart_child of a stopped child leaves it down (status failed, its error "
          "kept); nothing is scheduled") {
  harness h;
  supervisor_spec spec;
  auto calls = std::make_shared<int>(0);
  spec.children = {child("db")};
  spec.children[0].start = flaky_start(calls, 2);
  h.start(spec);
  REQUIRE(*h.rt.terminate_child(h.sup, "db"));
  auto r = h.rt.restart_child(h.sup, "db");
  REQUIRE_FALSE(r);
  CHECK(troupe::is(r.error(), errc::start_failed));
  REQUIRE(troupe::errors_of(r.error()).size() == 1);
  CHECK(troupe::field_of(troupe::errors_of(r.error())[0]) == "db");
  h.rt.advance(10s);
  CHECK(*calls == 2);
  auto st = h.state();
  CHECK(st.status == troupe::supervisor_status::running);
  CHECK(st.children[0].status == child_status::failed);
  auto running = h.rt.restart_child(h.sup, "nope");
  CHECK(troupe::is(running.error(), errc::unknown_child));
}

TEST_CASE("rest_for_one: later children wait while an earlier child's restart keeps failing") {
  harness h;
  supervisor_spec spec;
  spec.strategy = troupe::strategy::rest_for_one;
  spec.intensity = 100;
  spec.period_ms = 1000;
  auto db_calls = std::make_shared<int>(0);
  auto healed = std::make_shared<bool>(false);
  auto later_calls = std::make_shared<int>(0);
  spec.children = {child("first"), child("db"), child("cache"), child("web")};
  spec.children[1].start = flaky_start(db_calls, 2, healed);
  spec.children[1].backoff_ms = 50;
  spec.children[1].max_backoff_ms = 50;
  spec.children[2].start = flaky_start(later_calls, 0);
  spec.children[3].start = flaky_start(later_calls, 0);
  h.start(spec);
  CHECK(*later_calls == 2);
  h.send(1, crash_atom::value);
  h.rt.advance(500ms); // about ten failed restarts of db
  CHECK(*db_calls > 5);
  CHECK(*later_calls == 2); // cache and web were not started and killed on every attempt
  auto st = h.state();
  CHECK(st.children[0].status == child_status::running);
  CHECK_FALSE(st.children[2].actor);
  CHECK_FALSE(st.children[3].actor);
  *healed = true;
  h.rt.advance(100ms);
  st = h.state();
  CHECK(st.children[1].status == child_status::running);
  CHECK(st.children[2].status == child_status::running);
  CHECK(st.children[3].status == child_status::running);
  CHECK(*later_calls == 4); // each started once more, after db
}

TEST_CASE("rest_for_one: terminate_child of the failing child cancels the group restart") {
  harness h;
  supervisor_spec spec;
  spec.strategy = troupe::strategy::rest_for_one;
  spec.intensity = 100;
  spec.period_ms = 1000;
  auto db_calls = std::make_shared<int>(0);
  auto later_calls = std::make_shared<int>(0);
  spec.children = {child("db"), child("cache")};
  spec.children[0].start = flaky_start(db_calls, 2);
  spec.children[0].backoff_ms = 50;
  spec.children[1].start = flaky_start(later_calls, 0);
  h.start(spec);
  h.send(0, crash_atom::value);
  h.rt.advance(200ms);
  auto t = h.rt.terminate_child(h.sup, "db");
  REQUIRE(t);
  CHECK_FALSE(*t); // it was not running
  auto calls_then = *db_calls;
  h.rt.advance(5s);
  CHECK(*db_calls == calls_then); // no more restarts of db
  CHECK(*later_calls == 1);       // and cache is not started by the cancelled group restart
  auto st = h.state();
  CHECK(st.status == troupe::supervisor_status::running);
  CHECK(st.children[0].status == child_status::stopped);
  CHECK(st.children[1].status == child_status::stopped);
  CHECK_FALSE(st.children[1].actor);
  // Both can be started again by hand.
  CHECK(h.rt.restart_child(h.sup, "cache"));
}

TEST_CASE("rest_for_one: terminate_child of a later child during the group's backoff stops "
          "it and those after it; the failed child still restarts when the backoff ends") {
  harness h;
  supervisor_spec spec;
  spec.strategy = troupe::strategy::rest_for_one;
  spec.intensity = 10;
  spec.children = {child("a"), child("b"), child("c")};
  spec.children[0].backoff_ms = 60'000;
  spec.children[0].max_backoff_ms = 60'000;
  h.start(spec);
  h.send(0, crash_atom::value); // a, b and c wait for the group restart
  for (auto& c : h.state().children)
    REQUIRE(c.status == child_status::waiting);
  auto t = h.rt.terminate_child(h.sup, "b");
  REQUIRE(t);
  CHECK_FALSE(*t); // it was not running
  h.rt.advance(61s);
  auto st = h.state();
  CHECK(find_child(st, "a")->status == child_status::running);
  CHECK(find_child(st, "a")->restarts == 1);
  CHECK(find_child(st, "b")->status == child_status::stopped);
  CHECK(find_child(st, "c")->status == child_status::stopped);
  CHECK(h.rt.clock().pending() == 0);
}

TEST_CASE("rest_for_one: a group restart that begins while an earlier one waits for its backoff "
          "replaces it; the old timer restarts nothing while children still stop") {
  harness h;
  supervisor_spec spec;
  spec.strategy = troupe::strategy::rest_for_one;
  spec.intensity = 10;
  spec.children = {child("a"), child("b"), child("c")};
  spec.children[1].start = start_stubborn();
  spec.children[1].shutdown_ms = 1000;
  spec.children[2].backoff_ms = 100;
  spec.children[2].max_backoff_ms = 100;
  h.start(spec);
  h.send(2, crash_atom::value); // c waits 100 ms for its group restart
  auto old_b = h.actor_of(1);
  h.send(0, crash_atom::value); // a's group restart: b (stubborn) must be killed at 1000 ms
  h.rt.advance(100ms);          // the first group restart's timer would fire here
  {
    auto st = h.state();
    CHECK(find_child(st, "b")->actor == old_b); // still stopping: not started over it
    CHECK(find_child(st, "c")->status == child_status::waiting);
  }
  h.rt.advance(2s);
  auto st = h.state();
  for (auto& c : st.children)
    CHECK(c.status == child_status::running);
  CHECK(find_child(st, "b")->actor != old_b);
  auto n = h.rt.count_children(h.sup);
  REQUIRE(n);
  CHECK(n->active == 3);
  caf::scoped_actor self{h.rt.system()};
  self->monitor(old_b);
  bool down = false;
  self->receive([&](caf::down_msg& dm) { down = dm.source == old_b.address(); },
                caf::after(std::chrono::seconds(0)) >> [] {});
  CHECK(down); // the stubborn incarnation was killed, not left running unsupervised
}

TEST_CASE("rest_for_one: terminating an earlier child does not start a later child's backoff "
          "over") {
  harness h;
  supervisor_spec spec;
  spec.strategy = troupe::strategy::rest_for_one;
  spec.children = {child("a"), child("b"), child("c")};
  spec.children[2].backoff_ms = 100;
  spec.children[2].max_backoff_ms = 100;
  h.start(spec);
  h.send(2, crash_atom::value); // c restarts at 100 ms
  h.rt.advance(50ms);
  auto t = h.rt.terminate_child(h.sup, "a");
  REQUIRE(t);
  CHECK(*t);
  h.rt.advance(50ms);
  auto st = h.state();
  CHECK(find_child(st, "c")->status == child_status::running); // at 100 ms, not 150
  CHECK(find_child(st, "a")->status == child_status::stopped);
  CHECK(find_child(st, "b")->status == child_status::running);
  CHECK(h.rt.restart_child(h.sup, "a"));
}

TEST_CASE("rest_for_one: terminate_child of the failed child while a later child still stops "
          "for the group restart: that child stays stopped") {
  harness h;
  supervisor_spec spec;
  spec.strategy = troupe::strategy::rest_for_one;
  spec.intensity = 10;
  spec.children = {child("a"), child("b")};
  spec.children[1].start = start_stubborn();
  spec.children[1].shutdown_ms = 1000;
  h.start(spec);
  h.send(0, crash_atom::value); // b is asked to stop; it is killed at 1000 ms
  auto t = h.rt.terminate_child(h.sup, "a");
  REQUIRE(t);
  CHECK_FALSE(*t); // it was not running
  h.rt.advance(2s);
  auto st = h.state();
  CHECK(find_child(st, "a")->status == child_status::stopped);
  CHECK(find_child(st, "b")->status == child_status::stopped); // as if it had stopped first
  CHECK_FALSE(find_child(st, "b")->actor);
  CHECK(h.rt.restart_child(h.sup, "b"));
}

TEST_CASE("rest_for_one: when the failed child's circuit opens during the group restart, the "
          "children after it wait, and start once it runs again") {
  harness h;
  auto healed = std::make_shared<bool>(false);
  h.start(flaky_b_group(healed, 1000));
  h.send(1, crash_atom::value);
  {
    auto st = h.state();
    REQUIRE(find_child(st, "b")->status == child_status::circuit_open);
    CHECK(find_child(st, "c")->status == child_status::waiting); // until b runs again
    CHECK(find_child(st, "a")->status == child_status::running);
  }
  *healed = true;
  h.rt.advance(1s); // the half-open try starts b
  auto st = h.state();
  CHECK(find_child(st, "b")->status == child_status::running);
  CHECK(find_child(st, "c")->status == child_status::running);
  CHECK(find_child(st, "c")->restarts == 1);
  auto n = h.rt.count_children(h.sup);
  REQUIRE(n);
  CHECK(n->active == 3);
}

TEST_CASE("rest_for_one: when the failed child's restarts are suppressed, the children after "
          "it wait, and start once it is restarted by hand") {
  harness h;
  auto healed = std::make_shared<bool>(false);
  h.start(flaky_b_group(healed, 0)); // no circuit: suppressed until restarted by hand
  h.send(1, crash_atom::value);
  {
    auto st = h.state();
    REQUIRE(find_child(st, "b")->status == child_status::suppressed);
    CHECK(find_child(st, "c")->status == child_status::waiting);
  }
  *healed = true;
  auto r = h.rt.restart_child(h.sup, "b");
  REQUIRE(r);
  h.rt.drain();
  auto st = h.state();
  CHECK(find_child(st, "b")->status == child_status::running);
  CHECK(find_child(st, "c")->status == child_status::running);
  auto n = h.rt.count_children(h.sup);
  REQUIRE(n);
  CHECK(n->active == 3);
}

TEST_CASE("rest_for_one: deleting the suppressed child a round stopped at starts the children "
          "waiting behind it") {
  harness h;
  auto healed = std::make_shared<bool>(false);
  h.start(flaky_b_group(healed, 0)); // suppressed until restarted by hand
  h.send(1, crash_atom::value);
  REQUIRE(find_child(h.state(), "b")->status == child_status::suppressed);
  REQUIRE(find_child(h.state(), "c")->status == child_status::waiting);
  REQUIRE(h.rt.delete_child(h.sup, "b"));
  h.rt.drain();
  auto st = h.state();
  CHECK(find_child(st, "b") == nullptr);
  CHECK(find_child(st, "c")->status == child_status::running);
  CHECK(find_child(st, "c")->actor);
}

TEST_CASE("rest_for_one: the children waiting behind a circuit-open child stay waiting when "
          "another child is restarted by hand, and start once that child runs") {
  harness h;
  auto healed = std::make_shared<bool>(false);
  h.start(flaky_b_group(healed, 1000));
  REQUIRE(h.rt.terminate_child(h.sup, "a"));
  h.send(1, crash_atom::value); // b's circuit opens; c waits behind it
  REQUIRE(find_child(h.state(), "b")->status == child_status::circuit_open);
  REQUIRE(h.rt.restart_child(h.sup, "a")); // not the child the round waits for
  h.rt.drain();
  {
    auto st = h.state();
    CHECK(find_child(st, "a")->status == child_status::running);
    CHECK(find_child(st, "c")->status == child_status::waiting); // b is still down
    CHECK_FALSE(find_child(st, "c")->actor);
  }
  REQUIRE(h.rt.terminate_child(h.sup, "a")); // a termination outside the group: the same
  CHECK(find_child(h.state(), "c")->status == child_status::waiting);
  *healed = true;
  h.rt.advance(1s); // b's half-open try
  auto st = h.state();
  CHECK(find_child(st, "b")->status == child_status::running);
  CHECK(find_child(st, "c")->status == child_status::running);
  CHECK(find_child(st, "c")->restarts == 1);
}

TEST_CASE("rest_for_one: a group restart with an infinite backoff waits for good, whatever is "
          "done by hand to a child outside it") {
  harness h;
  supervisor_spec spec;
  spec.strategy = troupe::strategy::rest_for_one;
  spec.children = {child("a"), child("b"), child("c")};
  spec.children[1].backoff_ms = troupe::infinity;
  spec.children[1].max_backoff_ms = troupe::infinity;
  h.start(spec);
  h.send(1, crash_atom::value);
  CHECK(h.events("waiting").size() == 1);
  REQUIRE(h.rt.terminate_child(h.sup, "a"));
  REQUIRE(h.rt.restart_child(h.sup, "a"));
  h.rt.drain();
  auto st = h.state();
  CHECK(find_child(st, "b")->status == child_status::waiting);
  CHECK(find_child(st, "c")->status == child_status::waiting);
  CHECK_FALSE(find_child(st, "b")->actor);
  CHECK(h.events("waiting").size() == 1); // the backoff was not started over
}

TEST_CASE("one_for_all: a child waiting for the retry of its failed restart is in the next "
          "group restart, so no child starts while it is down") {
  // a's second start hands over an actor that is dead already (its down comes at once), b's
  // second start fails (its retry comes after a's down): a's new group restart must take
  // b along, or c starts while b is down and b's retry then stops everything again.
  harness h;
  caf::actor dead;
  {
    dead = h.rt.system().spawn(worker);
    caf::scoped_actor self{h.rt.system()};
    self->monitor(dead);
    caf::anon_send_exit(dead, caf::exit_reason::kill);
    h.rt.drain();
    bool down = false;
    self->receive([&](caf::down_msg&) { down = true; },
                  caf::after(std::chrono::seconds(0)) >> [] {});
    REQUIRE(down);
  }
  supervisor_spec spec;
  spec.strategy = troupe::strategy::one_for_all;
  spec.intensity = 100;
  spec.period_ms = 60'000;
  auto a_calls = std::make_shared<int>(0);
  auto b_calls = std::make_shared<int>(0);
  spec.children = {child("a"), child("b"), child("c")};
  spec.children[0].start = [a_calls, dead](caf::actor_system& sys) -> troupe::start_result {
    if (++*a_calls == 2) return std::optional<caf::actor>{dead};
    return std::optional<caf::actor>{sys.spawn(worker)};
  };
  spec.children[1].start = [b_calls](caf::actor_system& sys) -> troupe::start_result {
    if (++*b_calls == 2) return troupe::make_error(errc::invalid_argument, "b", "refused once");
    return std::optional<caf::actor>{sys.spawn(worker)};
  };
  h.start(spec);
  h.send(0, crash_atom::value);
  h.rt.drain();
  auto st = h.state();
  for (auto& c : st.children)
    CHECK(c.status == child_status::running);
  // c is restarted once, in the round that found a and b running: never beside a down b.
  CHECK(find_child(st, "c")->restarts == 1);
  CHECK(find_child(st, "a")->restarts == 2); // the dead one, then a live one
  auto n = h.rt.count_children(h.sup);
  REQUIRE(n);
  CHECK(n->active == 3);
}

TEST_CASE("a significant child can be added dynamically when auto_shutdown allows it") {
  harness h;
  supervisor_spec spec;
  spec.auto_shutdown = troupe::auto_shutdown::any_significant;
  spec.children = {child("base")};
  h.start(spec);
  auto job = child("job", restart_mode::on_failure);
  job.significant = true;
  auto added = h.rt.start_child(h.sup, job);
  REQUIRE(added);
  caf::anon_send(added->actor, finish_atom::value);
  auto fin = h.rt.supervisor_wait(h.sup);
  REQUIRE(fin);
  CHECK(fin->status == troupe::supervisor_status::stopped);
  CHECK(fin->reason.find("job") != std::string::npos);
  h.sup.actor = nullptr;
  // Refused where auto_shutdown is never, naming the field.
  harness h2;
  supervisor_spec plain;
  plain.children = {child("base")};
  h2.start(plain);
  auto refused = h2.rt.start_child(h2.sup, job);
  REQUIRE_FALSE(refused);
  CHECK(troupe::is(refused.error(), errc::invalid_spec));
  CHECK(troupe::field_of(refused.error()) == "child.significant");
}

TEST_CASE("budget before intensity: with default intensity a per-child budget suppresses") {
  harness h;
  supervisor_spec spec; // intensity 1 within 5 s (OTP's default)
  spec.children = {child("flaky"), child("steady")};
  spec.children[0].max_restarts = 1;
  spec.children[0].window_ms = 60'000;
  h.start(spec);
  h.send(0, crash_atom::value); // restart 1: within both budgets
  h.send(0, crash_atom::value); // the child's budget is spent: suppressed, not escalated
  auto st = h.state();
  CHECK(st.status == troupe::supervisor_status::running);
  CHECK(st.children[0].status == child_status::suppressed);
  CHECK(st.children[1].status == child_status::running);
  CHECK(metrics_of(h).suppressed == 1);
}

TEST_CASE("budget before intensity: a suppressed failure does not count toward intensity") {
  harness h;
  supervisor_spec spec;
  spec.intensity = 2; // within 5 s: the flaky child's restart, then one more
  spec.children = {child("flaky"), child("steady")};
  spec.children[0].max_restarts = 1;
  spec.children[0].window_ms = 60'000;
  h.start(spec);
  h.send(0, crash_atom::value); // restarted: 1 of 2
  h.send(0, crash_atom::value); // suppressed: still 1 of 2 (counted, it would be 2)
  h.send(1, crash_atom::value); // restarted: 2 of 2 (counted above, 3: escalated)
  auto st = h.state();
  CHECK(st.status == troupe::supervisor_status::running);
  CHECK(st.children[0].status == child_status::suppressed);
  CHECK(st.children[1].status == child_status::running);
  CHECK(st.children[1].restarts == 1);
  CHECK(h.rt.clock().now_ms() == 0); // all within one instant of the 5 s period
}

// -- starting --------------------------------------------------------------------------------

TEST_CASE("a subtree that cannot start fails its parent's start, naming the path") {
  auto rt = make_virtual_rt();
  auto calls = std::make_shared<int>(0);
  supervisor_spec inner;
  inner.name = "inner";
  inner.children = {child("ok"), child("child")};
  inner.children[1].start = flaky_start(calls, 1);
  supervisor_spec outer;
  outer.name = "outer";
  outer.intensity = 100;
  outer.children = {child("first"),
                    troupe::supervisor_child_spec("inner", rt.clock(), inner)};
  auto r = rt.supervise(outer);
  REQUIRE_FALSE(r);
  CHECK(troupe::is(r.error(), errc::start_failed));
  CHECK(troupe::field_of(r.error()) == "outer/inner/child");
  auto causes = troupe::errors_of(r.error());
  REQUIRE(causes.size() == 1);
  CHECK(troupe::is(causes[0], errc::invalid_argument)); // the start function's own error
  CHECK(troupe::field_of(causes[0]) == "db");
  CHECK(*calls == 1); // no restart loop at t=0
  rt.drain();
}

namespace {

/// A child that takes 100 ms (runtime clock) to stop when asked, and logs "name@ms" then.
troupe::child_spec slow_stopper(troupe::clock& clk, std::shared_ptr<std::vector<std::string>> log,
                                std::string name) {
  troupe::child_spec c;
  c.name = name;
  c.shutdown_ms = 1000;
  c.start = [&clk, log, name](caf::actor_system& sys) -> troupe::start_result {
    return std::optional<caf::actor>{
        sys.spawn([&clk, log, name](caf::event_based_actor* self) -> caf::behavior {
          self->set_exit_handler([self, &clk](caf::exit_msg&) {
            clk.schedule(clk.now() + 100ms, caf::actor_cast<caf::actor>(self),
                         caf::make_message(sup_test::finish_atom::value));
          });
          return {[self, &clk, log, name](sup_test::finish_atom) {
            log->push_back(name + "@" + std::to_string(clk.now_ms()));
            self->quit();
          }};
        })};
  };
  return c;
}

troupe::child_spec failing_child(std::string name) {
  auto c = child(std::move(name));
  c.start = [](caf::actor_system&) -> troupe::start_result {
    return troupe::make_error(errc::invalid_argument, "db", "no database");
  };
  return c;
}

} // namespace

TEST_CASE("a start failure answers once the children started before it have stopped, in "
          "reverse order (OTP's start_link)") {
  // Before 2026-12-05 the answer came at once, while they were still stopping.
  for (bool task_form : {false, true}) {
    CAPTURE(task_form);
    auto rt = make_virtual_rt();
    auto log = std::make_shared<std::vector<std::string>>();
    supervisor_spec spec;
    spec.name = "app";
    spec.children = {slow_stopper(rt.clock(), log, "a"), slow_stopper(rt.clock(), log, "b"),
                     failing_child("c")};
    auto show = [](const caf::expected<troupe::supervisor_ref>& s) {
      return s ? std::string{"started"}
               : std::string{troupe::name_of(static_cast<errc>(s.error().code()))} + " " +
                     troupe::field_of(s.error());
    };
    std::string answer;
    if (task_form) {
      auto r = rt.run([spec, show](troupe::context& cx) -> troupe::task<std::string> {
        co_return show(co_await troupe::supervise(cx, spec));
      });
      REQUIRE(r);
      answer = *r;
    } else {
      answer = show(rt.supervise(spec));
    }
    CHECK(answer == "start_failed app/c");
    CHECK(*log == std::vector<std::string>{"b@100", "a@200"});
    CHECK(rt.clock().now_ms() == 200);
  }
}

TEST_CASE("a subtree that cannot start has stopped what it started before its parent stops "
          "the children before it") {
  auto rt = make_virtual_rt();
  auto log = std::make_shared<std::vector<std::string>>();
  supervisor_spec inner;
  inner.name = "inner";
  inner.children = {slow_stopper(rt.clock(), log, "x"), failing_child("y")};
  supervisor_spec outer;
  outer.name = "outer";
  outer.children = {slow_stopper(rt.clock(), log, "a"),
                    troupe::supervisor_child_spec("inner", rt.clock(), inner)};
  auto r = rt.supervise(outer);
  REQUIRE_FALSE(r);
  CHECK(troupe::field_of(r.error()) == "outer/inner/y");
  // OTP: the subtree's start_link returns once x has stopped; then a stops.
  CHECK(*log == std::vector<std::string>{"x@100", "a@200"});
  CHECK(rt.clock().now_ms() == 200);
}

TEST_CASE("start_child of a subtree that cannot start answers once the subtree has stopped "
          "what it started") {
  auto rt = make_virtual_rt();
  auto log = std::make_shared<std::vector<std::string>>();
  supervisor_spec top;
  top.name = "top";
  top.children = {child("w")};
  auto sup = rt.supervise(top);
  REQUIRE(sup);
  supervisor_spec inner;
  inner.name = "inner";
  inner.children = {slow_stopper(rt.clock(), log, "x"), failing_child("y")};
  auto r = rt.start_child(*sup, troupe::supervisor_child_spec("inner", rt.clock(), inner));
  REQUIRE_FALSE(r);
  CHECK(troupe::is(r.error(), errc::start_failed));
  CHECK(*log == std::vector<std::string>{"x@100"}); // before 2026-12-05: {} at 0 ms
  CHECK(rt.clock().now_ms() == 100);
  auto st = rt.supervisor_state_of(*sup);
  REQUIRE(st);
  CHECK(st->children.size() == 1); // the failed subtree is not kept
  (void)rt.supervisor_stop(*sup, 1s);
}

TEST_CASE("restart_child of a subtree that cannot start any more answers once it has stopped "
          "what it started") {
  auto rt = make_virtual_rt();
  auto log = std::make_shared<std::vector<std::string>>();
  auto calls = std::make_shared<int>(0);
  supervisor_spec inner;
  inner.name = "inner";
  inner.children = {slow_stopper(rt.clock(), log, "x"), child("y")};
  inner.children[1].start = flaky_start(calls, 2); // starts once, then fails
  supervisor_spec top;
  top.name = "top";
  top.children = {troupe::supervisor_child_spec("inner", rt.clock(), inner)};
  auto sup = rt.supervise(top);
  REQUIRE(sup);
  REQUIRE(*rt.terminate_child(*sup, "inner"));
  CHECK(*log == std::vector<std::string>{"x@100"});
  auto r = rt.restart_child(*sup, "inner");
  REQUIRE_FALSE(r);
  CHECK(troupe::is(r.error(), errc::start_failed));
  CHECK(*log == std::vector<std::string>{"x@100", "x@200"}); // before 2026-12-05: at 100 ms
  CHECK(rt.clock().now_ms() == 200);
  (void)rt.supervisor_stop(*sup, 1s);
}

TEST_CASE("a child's start error is a structured cause of start_failed") {
  auto rt = make_virtual_rt();
  supervisor_spec spec;
  spec.name = "app";
  spec.children = {child("web")};
  spec.children[0].start = [](caf::actor_system&) -> troupe::start_result {
    return troupe::make_error(errc::invalid_argument, "port", "port 80 is taken");
  };
  auto r = rt.supervise(spec);
  REQUIRE_FALSE(r);
  CHECK(troupe::field_of(r.error()) == "app/web");
  REQUIRE(troupe::errors_of(r.error()).size() == 1);
  CHECK(troupe::field_of(troupe::errors_of(r.error())[0]) == "port");
}

// -- durations and validation ----------------------------------------------------------------

TEST_CASE("millisecond fields saturate: infinity never fires, nothing overflows") {
  SECTION("shutdown_ms = INT64_MAX: the stubborn child is not killed") {
    harness h;
    supervisor_spec spec;
    spec.children = {child("stubborn")};
    spec.children[0].start = [](caf::actor_system& sys) -> troupe::start_result {
      return std::optional<caf::actor>{sys.spawn(stubborn)};
    };
    spec.children[0].shutdown_ms = std::numeric_limits<int64_t>::max();
    h.start(spec);
    auto t = h.rt.run([sup = h.sup](troupe::context& cx) -> troupe::task<caf::expected<bool>> {
      co_return co_await cx.deadline(1h, [sup](troupe::context& c) -> troupe::task<bool> {
        auto r = co_await troupe::terminate_child(c, sup, "stubborn");
        co_return r && *r;
      });
    });
    REQUIRE(t);
    REQUIRE_FALSE(*t);
    CHECK(troupe::is(t->error(), errc::deadline_exceeded)); // an hour later, still waiting
    CHECK(h.events("killed").empty());
    auto st = h.state();
    CHECK(st.children[0].actor); // still there
    caf::anon_send_exit(st.children[0].actor, caf::exit_reason::kill);
    h.rt.drain();
  }
  SECTION("circuit_open_ms = INT64_MAX: the circuit stays open") {
    harness h;
    supervisor_spec spec;
    spec.intensity = 10;
    spec.children = {child("c")};
    spec.children[0].max_restarts = 1;
    spec.children[0].circuit_open_ms = std::numeric_limits<int64_t>::max();
    h.start(spec);
    h.send(0, crash_atom::value);
    h.send(0, crash_atom::value);
    h.rt.advance(24h);
    auto st = h.state();
    CHECK(st.children[0].status == child_status::circuit_open);
    CHECK(st.children[0].next_restart_ms == troupe::infinity);
  }
  SECTION("backoff caps and jitter near INT64_MAX saturate") {
    troupe::child_spec c;
    c.name = "x";
    c.backoff_ms = 1;
    c.factor = 10;
    c.max_backoff_ms = troupe::infinity;
    c.jitter_ms = troupe::infinity;
    for (uint64_t n : {1ull, 30ull, 1000ull}) {
      auto d = troupe::restart_delay_ms(c, n);
      CHECK(d >= 0);
      CHECK(d <= troupe::infinity);
    }
    CHECK(troupe::saturating_add(troupe::infinity - 5, 10) == troupe::infinity);
  }
  SECTION("a supervisor child's shutdown defaults to infinity (OTP)") {
    auto rt = make_virtual_rt();
    supervisor_spec inner;
    inner.name = "inner";
    inner.children = {child("slow")};
    inner.children[0].start = [](caf::actor_system& sys) -> troupe::start_result {
      return std::optional<caf::actor>{sys.spawn(stubborn)};
    };
    inner.children[0].shutdown_ms = 20'000; // longer than a worker's default of 5 s
    supervisor_spec outer;
    outer.name = "outer";
    troupe::child_spec sub;
    sub.name = "inner";
    sub.start = troupe::supervisor_child(rt.clock(), inner); // recognised as a supervisor
    outer.children = {sub};
    auto sup = rt.supervise(outer);
    REQUIRE(sup);
    auto fin = rt.supervisor_stop(*sup, std::chrono::milliseconds(-1)); // no overall timeout
    REQUIRE(fin);
    CHECK(fin->status == troupe::supervisor_status::stopped);
    auto ev = rt.supervisor_events(*sup);
    REQUIRE(ev);
    bool subtree_killed = false;
    bool leaf_killed_at_20s = false;
    for (auto& e : *ev) {
      if (e.kind == troupe::supervisor_event_kind::killed && e.child == "inner") subtree_killed = true;
      if (e.kind == troupe::supervisor_event_kind::killed && e.child == "inner/slow" && e.at_ms == 20'000)
        leaf_killed_at_20s = true;
    }
    CHECK_FALSE(subtree_killed); // the subtree was given the time its own child needs
    CHECK(leaf_killed_at_20s);
  }
}

TEST_CASE("validate refuses out-of-range enum values, naming the field") {
  auto rt = make_virtual_rt();
  supervisor_spec s1;
  s1.strategy = static_cast<troupe::strategy>(9);
  CHECK(troupe::field_of(troupe::validate(s1)) == "strategy");
  supervisor_spec s2;
  s2.auto_shutdown = static_cast<troupe::auto_shutdown>(5);
  CHECK(troupe::field_of(troupe::validate(s2)) == "auto_shutdown");
  supervisor_spec s3;
  s3.children = {child("a")};
  s3.children[0].restart = static_cast<restart_mode>(7);
  CHECK(troupe::field_of(troupe::validate(s3)) == "children[0].restart");
  CHECK(troupe::is(troupe::validate(s3), errc::invalid_spec));
  supervisor_spec s4;
  s4.children = {child("a")};
  s4.children[0].kind = static_cast<troupe::child_kind>(3);
  CHECK(troupe::field_of(troupe::validate(s4)) == "children[0].type");
  auto refused = rt.supervise(s1);
  REQUIRE_FALSE(refused);
  CHECK(troupe::is(refused.error(), errc::invalid_spec));
  // A dynamic supervisor with auto_shutdown: refused, as OTP 27 refuses it for
  // simple_one_for_one (its children are not significant).
  supervisor_spec s5;
  s5.child_template = troupe::child_template{};
  s5.child_template->start = [](caf::actor_system& sys, const caf::message&) -> troupe::start_result {
    return std::optional<caf::actor>{sys.spawn(sup_test::worker)};
  };
  CHECK_FALSE(troupe::validate(s5));
  s5.auto_shutdown = troupe::auto_shutdown::any_significant;
  CHECK(troupe::field_of(troupe::validate(s5)) == "auto_shutdown");
  CHECK(troupe::is(troupe::validate(s5), errc::invalid_spec));
}

// -- bookkeeping -----------------------------------------------------------------------------

TEST_CASE("a kill at the stop timeout is logged and counted; counts answer after the end") {
  harness h;
  supervisor_spec spec;
  spec.children = {child("a"), child("stubborn")};
  spec.children[1].start = [](caf::actor_system& sys) -> troupe::start_result {
    return std::optional<caf::actor>{sys.spawn(stubborn)};
  };
  spec.children[1].shutdown_ms = troupe::infinity;
  h.start(spec);
  auto fin = h.rt.supervisor_stop(h.sup, 300ms);
  REQUIRE(fin);
  // Everything still alive at the stop timeout is killed, each kill logged.
  CHECK(h.events("killed") == std::vector<std::string>{"killed:a@300", "killed:stubborn@300"});
  auto m = h.rt.supervisor_metrics_of(h.sup); // answered from the final state
  REQUIRE(m);
  CHECK(m->kills == 2);
  auto n = h.rt.count_children(h.sup);
  REQUIRE(n);
  CHECK(n->specs == 2);
  CHECK(n->active == 0);
  auto kids = h.rt.which_children(h.sup);
  REQUIRE(kids);
  CHECK(kids->size() == 2);
  h.sup.actor = nullptr;
}

TEST_CASE("counts distinguish supervisors from workers (OTP's count_children)") {
  harness h;
  supervisor_spec inner;
  inner.name = "inner";
  inner.children = {child("leaf")};
  supervisor_spec spec;
  spec.children = {child("w1"), troupe::supervisor_child_spec("sub", h.rt.clock(), inner),
                   child("w2")};
  troupe::child_spec explicit_sup = child("declared");
  explicit_sup.kind = troupe::child_kind::supervisor;
  spec.children.push_back(explicit_sup);
  h.start(spec);
  auto n = h.rt.count_children(h.sup);
  REQUIRE(n);
  CHECK(n->specs == 4);
  CHECK(n->active == 4);
  CHECK(n->supervisors == 2);
  CHECK(n->workers == 2);
  CHECK(h.state().children[1].kind == troupe::child_kind::supervisor);
}

TEST_CASE("nested supervisors' events reach the top, path-qualified, on one clock") {
  harness h;
  supervisor_spec parsers;
  parsers.name = "parsers";
  parsers.intensity = 10;
  parsers.children = {child("parser-1"), child("parser-2"), child("parser-3")};
  supervisor_spec mid;
  mid.name = "mid";
  mid.children = {troupe::supervisor_child_spec("parsers", h.rt.clock(), parsers)};
  supervisor_spec app;
  app.name = "app";
  app.children = {troupe::supervisor_child_spec("mid", h.rt.clock(), mid)};
  h.start(app);
  h.rt.advance(1234ms);
  auto mid_st = h.rt.supervisor_state_of(h.actor_of(0));
  REQUIRE(mid_st);
  auto par_st = h.rt.supervisor_state_of(mid_st->children[0].actor);
  REQUIRE(par_st);
  caf::anon_send(par_st->children[2].actor, crash_atom::value);
  h.rt.drain();
  auto failed = h.events("failed");
  REQUIRE(failed.size() == 1);
  CHECK(failed[0] == "failed:mid/parsers/parser-3@1234");
  auto restarted = h.events("restarted");
  CHECK(restarted == std::vector<std::string>{"restarted:mid/parsers/parser-3@1234"});
  CHECK(metrics_of(h).failures == 0); // not the top's own failure
}

TEST_CASE("a real-time supervisor stamps events on the event log's clock (epoch ms)") {
  auto rt = troupe_test::make_real_rt();
  supervisor_spec spec;
  spec.children = {child("a")};
  auto sup = rt.supervise(spec);
  REQUIRE(sup);
  auto ev = rt.supervisor_events(*sup);
  REQUIRE(ev);
  REQUIRE_FALSE(ev->empty());
  auto wall = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count();
  CHECK(std::abs(wall - ev->front().at_ms) < 60'000);
  (void)rt.supervisor_stop(*sup, 1s);
}

TEST_CASE("an ignoring child is kept, unless it is temporary (OTP)") {
  harness h;
  auto ignore = [](caf::actor_system&) -> troupe::start_result { return std::optional<caf::actor>{}; };
  supervisor_spec spec;
  spec.children = {child("perm"), child("temp", restart_mode::never), child("other")};
  spec.children[0].start = ignore;
  spec.children[1].start = ignore;
  h.start(spec);
  auto st = h.state();
  REQUIRE(st.children.size() == 2);
  CHECK(st.children[0].name == "perm");
  CHECK(st.children[0].status == child_status::stopped);
  CHECK(st.children[1].name == "other");
  CHECK(h.events("ignored").size() == 2);
}

TEST_CASE("a subscriber that ended is dropped (no growth with short-lived subscribers)") {
  harness h;
  supervisor_spec spec;
  spec.children = {child("a")};
  h.start(spec);
  std::vector<caf::actor> subs;
  for (int i = 0; i < 3; ++i) {
    subs.push_back(h.rt.system().spawn([](caf::event_based_actor*) -> caf::behavior {
      return {[](const troupe::supervisor_event&) {}};
    }));
    caf::anon_send(h.sup.actor, troupe::atoms::sup_subscribe_atom::value, subs.back());
  }
  h.rt.drain();
  CHECK(metrics_of(h).subscribers == 3);
  caf::anon_send_exit(subs[0], caf::exit_reason::kill);
  caf::anon_send_exit(subs[2], caf::exit_reason::user_shutdown);
  h.rt.drain();
  CHECK(metrics_of(h).subscribers == 1);
  h.send(0, crash_atom::value); // events still reach the live one, and nothing breaks
  CHECK(h.state().children[0].restarts == 1);
  caf::anon_send_exit(subs[1], caf::exit_reason::kill);
  h.rt.drain();
  CHECK(metrics_of(h).subscribers == 0);
}

TEST_CASE("a static temporary child is forgotten with its start function when it ends") {
  // As a start_child temporary (above): what its start function captured goes with it.
  harness h;
  auto payload = std::make_shared<std::string>("captured by the static child's start");
  supervisor_spec spec;
  spec.intensity = 10;
  spec.children = {child("once", restart_mode::never), child("stays")};
  spec.children[0].start = [payload](caf::actor_system& sys) -> troupe::start_result {
    return std::optional<caf::actor>{sys.spawn(worker)};
  };
  std::weak_ptr<std::string> watch = payload;
  payload.reset();
  h.start(std::move(spec)); // the supervisor's copy is the only one
  CHECK_FALSE(watch.expired()); // its spec holds it while the child lives
  h.send(0, finish_atom::value);
  CHECK(watch.expired());
  CHECK(h.rt.count_children(h.sup)->specs == 1);
}

TEST_CASE("start_child's start_failed carries the start function's error as its cause") {
  harness h;
  h.start(supervisor_spec{});
  auto c = child("db");
  c.start = [](caf::actor_system&) -> troupe::start_result {
    return troupe::make_error(errc::not_found, "port", "no such port");
  };
  auto r = h.rt.start_child(h.sup, c);
  REQUIRE_FALSE(r);
  CHECK(troupe::is(r.error(), errc::start_failed));
  REQUIRE(troupe::errors_of(r.error()).size() == 1);
  CHECK(troupe::is(troupe::errors_of(r.error())[0], errc::not_found));
  CHECK(troupe::field_of(troupe::errors_of(r.error())[0]) == "port");
}

TEST_CASE("a stopped supervisor leaves no timer of its stop behind (virtual time)") {
  // stop(timeout) and a dynamic supervisor's stop bound each schedule a timer; once the
  // supervisor has ended they would only hold it (and all it keeps) alive until they fire,
  // and be where `advance` or a stalled run jumps to.
  {
    harness h;
    supervisor_spec spec;
    spec.children = {child("a"), child("b")};
    h.start(spec);
    auto before = h.rt.clock().pending();
    auto fin = h.rt.supervisor_stop(h.sup, 30s);
    REQUIRE(fin);
    CHECK(fin->status == troupe::supervisor_status::stopped);
    CHECK(h.rt.clock().pending() == before);
    CHECK(h.rt.clock().now_ms() == 0);
    h.sup.actor = nullptr;
  }
  {
    harness h;
    supervisor_spec spec;
    troupe::child_template t;
    t.name = "conn";
    t.start = [](caf::actor_system& sys, const caf::message&) -> troupe::start_result {
      return std::optional<caf::actor>{sys.spawn(worker)};
    };
    t.shutdown_ms = 5000;
    spec.child_template = t;
    h.start(spec);
    for (int i = 0; i < 3; ++i)
      REQUIRE(h.rt.start_child(h.sup, caf::make_message(i)));
    auto before = h.rt.clock().pending();
    auto fin = h.rt.supervisor_stop(h.sup, std::chrono::milliseconds(-1));
    REQUIRE(fin);
    CHECK(h.events("killed").empty()); // they stopped in time
    CHECK(h.rt.clock().pending() == before);
    CHECK(h.rt.clock().now_ms() == 0);
    h.sup.actor = nullptr;
  }
}

TEST_CASE("administration calls to a supervisor that has ended answer supervisor_stopping") {
  // OTP: a call to a dead supervisor exits with noproc; here, a typed error naming it
  // (not CAF's request_receiver_down), as for a call during its stop.
  harness h;
  supervisor_spec spec;
  spec.name = "gone";
  spec.children = {child("a")};
  h.start(spec);
  REQUIRE(h.rt.supervisor_stop(h.sup, 1s));
  auto expect_ended = [](const caf::error& e) {
    CHECK(troupe::is(e, errc::supervisor_stopping));
    CHECK(troupe::field_of(e) == "supervisor");
    CHECK(troupe::render(e).find("\"gone\" has ended (stopped)") != std::string::npos);
  };
  auto s = h.rt.start_child(h.sup, child("b"));
  REQUIRE_FALSE(s);
  expect_ended(s.error());
  auto t = h.rt.terminate_child(h.sup, "a");
  REQUIRE_FALSE(t);
  expect_ended(t.error());
  auto r = h.rt.restart_child(h.sup, "a");
  REQUIRE_FALSE(r);
  expect_ended(r.error());
  auto d = h.rt.delete_child(h.sup, "a");
  REQUIRE_FALSE(d);
  expect_ended(d.error());
  // The read calls answer its final state.
  auto n = h.rt.count_children(h.sup);
  REQUIRE(n);
  CHECK(n->specs == 1);
  h.sup.actor = nullptr;
}

TEST_CASE("a supervisor killed from outside records a final state: its children die with it, "
          "reads answer it, calls answer supervisor_stopping, a waiter is answered") {
  harness h;
  supervisor_spec spec;
  spec.name = "victim";
  spec.intensity = 10;
  spec.children = {child("a"), child("w")};
  spec.children[1].backoff_ms = 60'000; // "w" will wait to restart when the kill comes
  spec.children[1].max_backoff_ms = 60'000;
  h.start(spec);
  auto before = h.rt.clock().pending();
  auto a = h.actor_of(0);
  h.send(1, crash_atom::value);
  REQUIRE(h.state().children[1].status == child_status::waiting);
  caf::scoped_actor self{h.rt.system()};
  self->monitor(a);
  auto sup = h.sup;
  // A task waits for the supervisor's end; the kill comes while it waits.
  auto v = h.rt.run([sup](troupe::context& cx) -> troupe::task<std::string> {
    auto waiter = cx.spawn([sup](troupe::context& c) -> troupe::task<std::string> {
      auto fin = co_await troupe::supervisor_wait(c, sup);
      co_return fin ? std::string{troupe::to_string(fin->status)} : troupe::render(fin.error());
    });
    co_await cx.sleep(1ms);
    caf::anon_send_exit(sup.actor, caf::exit_reason::kill);
    auto r = co_await cx.await(waiter);
    co_return r ? *r : troupe::render(r.error());
  });
  REQUIRE(v);
  CHECK(*v == "failed");
  bool a_down = false;
  self->receive([&](caf::down_msg& dm) { a_down = dm.source == a.address(); },
                caf::after(std::chrono::seconds(0)) >> [] {});
  CHECK(a_down); // the running child was killed with it
  CHECK(h.rt.clock().pending() == before); // the backoff's timer went with it
  auto st = h.rt.supervisor_state_of(h.sup);
  REQUIRE(st);
  CHECK(st->status == troupe::supervisor_status::failed);
  CHECK(st->reason.rfind("killed: ended without its stop sequence", 0) == 0);
  CHECK(h.events("shutdown").size() == 1); // its end is an event, as every other end
  REQUIRE(st->children.size() == 2);
  for (auto& c : st->children) {
    CHECK(c.status == child_status::stopped);
    CHECK(c.last_error == "killed with its supervisor");
    CHECK_FALSE(c.actor); // the final state holds no actor
  }
  auto n = h.rt.count_children(h.sup);
  REQUIRE(n);
  CHECK(n->specs == 2);
  CHECK(n->active == 0);
  auto t = h.rt.terminate_child(h.sup, "a");
  REQUIRE_FALSE(t);
  CHECK(troupe::is(t.error(), errc::supervisor_stopping));
  CHECK(troupe::render(t.error()).find("\"victim\" has ended (failed)") != std::string::npos);
  auto s = h.rt.start_child(h.sup, child("b"));
  REQUIRE_FALSE(s);
  CHECK(troupe::is(s.error(), errc::supervisor_stopping));
  h.sup.actor = nullptr;
}

TEST_CASE("start_child and restart_child during a supervisor's stop answer supervisor_stopping") {
  harness h;
  supervisor_spec spec;
  spec.name = "closing";
  spec.children = {child("a"), child("slow")};
  spec.children[1].start = start_stubborn(); // stopped first, killed at its 1000 ms shutdown
  spec.children[1].shutdown_ms = 1000;
  h.start(spec);
  REQUIRE(*h.rt.terminate_child(h.sup, "a")); // not running: restart_child would start it
  auto sup = h.sup;
  auto v = h.rt.run([sup](troupe::context& cx) -> troupe::task<std::string> {
    auto stopper = cx.spawn([sup](troupe::context& c) -> troupe::task<bool> {
      auto fin = co_await troupe::supervisor_stop(c, sup, std::chrono::milliseconds(-1));
      co_return fin && fin->status == troupe::supervisor_status::stopped;
    });
    co_await cx.sleep(1ms); // the stop has begun: "slow" has 999 ms to go
    auto s = co_await troupe::start_child(cx, sup, child("b"));
    auto r = co_await troupe::restart_child(cx, sup, "a");
    auto stopped = co_await cx.await(stopper);
    std::string out;
    out += !s && troupe::is(s.error(), errc::supervisor_stopping) ? "start:stopping " : "start:? ";
    out += !r && troupe::is(r.error(), errc::supervisor_stopping) ? "restart:stopping " : "restart:? ";
    out += stopped && *stopped ? "stopped@" : "?@";
    co_return out + std::to_string(cx.clock().now_ms());
  });
  REQUIRE(v);
  CHECK(*v == "start:stopping restart:stopping stopped@1000");
  h.sup.actor = nullptr;
}

TEST_CASE("a waiting restart that terminate_child supersedes leaves no timer behind, and the "
          "child restarts on request (virtual time)") {
  // Before: the superseded timer stayed pending until it fired (a minute here), where
  // `advance` and a stalled run would jump to, holding the supervisor until then.
  auto superseded = [](supervisor_spec spec, const std::string& name, auto crash) {
    harness h;
    h.start(std::move(spec));
    auto before = h.rt.clock().pending();
    crash(h);
    CHECK(h.rt.clock().pending() > before); // a restart waits for its timer
    auto t = h.rt.terminate_child(h.sup, name);
    REQUIRE(t);
    CHECK_FALSE(*t); // it was not running
    CHECK(h.rt.clock().pending() == before);
    for (auto& c : h.state().children)
      CHECK(c.status == child_status::stopped);
    auto r = h.rt.restart_child(h.sup, name);
    REQUIRE(r);
    CHECK(r->status == child_status::running);
    CHECK(h.rt.clock().now_ms() == 0);
  };
  SECTION("backoff") {
    supervisor_spec spec;
    spec.children = {child("w")};
    spec.children[0].backoff_ms = 60'000;
    spec.children[0].max_backoff_ms = 60'000;
    superseded(spec, "w", [](harness& h) { h.send(0, crash_atom::value); });
  }
  SECTION("open circuit") {
    supervisor_spec spec;
    spec.intensity = 10;
    spec.children = {child("w")};
    spec.children[0].max_restarts = 1;
    spec.children[0].window_ms = 60'000;
    spec.children[0].circuit_open_ms = 60'000;
    superseded(spec, "w", [](harness& h) {
      h.send(0, crash_atom::value); // restarted
      h.send(0, crash_atom::value); // the circuit opens for 60 s
      REQUIRE(h.state().children[0].status == child_status::circuit_open);
    });
  }
  SECTION("group restart") {
    supervisor_spec spec;
    spec.strategy = troupe::strategy::one_for_all;
    spec.children = {child("a")};
    spec.children[0].backoff_ms = 60'000;
    spec.children[0].max_backoff_ms = 60'000;
    superseded(spec, "a", [](harness& h) { h.send(0, crash_atom::value); });
  }
}

TEST_CASE("a stop cancels the restart timers of children waiting to restart (virtual time)") {
  // A backoff, an open circuit, a group restart's backoff: each timer would hold the ended
  // supervisor alive until it fires, and be where `advance` jumps to.
  auto stopped_with_nothing_pending = [](supervisor_spec spec, auto crash) {
    harness h;
    h.start(std::move(spec));
    auto before = h.rt.clock().pending();
    crash(h);
    CHECK(h.rt.clock().pending() > before); // a restart waits for its timer
    auto fin = h.rt.supervisor_stop(h.sup, 1s);
    REQUIRE(fin);
    CHECK(fin->status == troupe::supervisor_status::stopped);
    CHECK(h.rt.clock().pending() == before);
    CHECK(h.rt.clock().now_ms() == 0);
    h.sup.actor = nullptr;
  };
  SECTION("backoff") {
    supervisor_spec spec;
    spec.children = {child("w")};
    spec.children[0].backoff_ms = 60'000;
    spec.children[0].max_backoff_ms = 60'000;
    stopped_with_nothing_pending(spec, [](harness& h) { h.send(0, crash_atom::value); });
  }
  SECTION("open circuit") {
    supervisor_spec spec;
    spec.intensity = 10;
    spec.children = {child("w")};
    spec.children[0].max_restarts = 1;
    spec.children[0].window_ms = 60'000;
    spec.children[0].circuit_open_ms = 60'000;
    stopped_with_nothing_pending(spec, [](harness& h) {
      h.send(0, crash_atom::value); // restarted
      h.send(0, crash_atom::value); // the circuit opens for 60 s
      REQUIRE(h.state().children[0].status == child_status::circuit_open);
    });
  }
  SECTION("group restart") {
    supervisor_spec spec;
    spec.strategy = troupe::strategy::one_for_all;
    spec.children = {child("a"), child("b")};
    spec.children[0].backoff_ms = 60'000;
    spec.children[0].max_backoff_ms = 60'000;
    stopped_with_nothing_pending(spec, [](harness& h) { h.send(0, crash_atom::value); });
  }
}

TEST_CASE("terminate_child and delete_child during a supervisor's stop answer supervisor_stopping") {
  // OTP's supervisor is inside terminate/2 then and acts on no call; before, terminate_child
  // stopped "a" at once, beside the last child still shutting down, and delete_child removed
  // a child from the final state.
  harness h;
  supervisor_spec spec;
  spec.name = "closing";
  spec.children = {child("held"), child("a"), child("slow")};
  spec.children[2].start = start_stubborn(); // stopped first, killed at its 1000 ms shutdown
  spec.children[2].shutdown_ms = 1000;
  h.start(spec);
  REQUIRE(*h.rt.terminate_child(h.sup, "held")); // held: kept, not running
  auto sup = h.sup;
  auto a = h.actor_of(1);
  auto a_down_at = std::make_shared<int64_t>(-1);
  auto v = h.rt.run([sup, a, a_down_at](troupe::context& cx) -> troupe::task<std::string> {
    auto stopper = cx.spawn([sup](troupe::context& c) -> troupe::task<bool> {
      auto fin = co_await troupe::supervisor_stop(c, sup, std::chrono::milliseconds(-1));
      co_return fin && fin->status == troupe::supervisor_status::stopped;
    });
    co_await cx.sleep(1ms); // the stop has begun: "slow" has 999 ms to go
    auto t = co_await troupe::terminate_child(cx, sup, "a");
    auto d = co_await troupe::delete_child(cx, sup, "held");
    auto stopped = co_await cx.await(stopper);
    std::string out;
    out += !t && troupe::is(t.error(), errc::supervisor_stopping) ? "terminate:stopping " : "terminate:? ";
    out += !d && troupe::is(d.error(), errc::supervisor_stopping) ? "delete:stopping " : "delete:? ";
    out += stopped && *stopped ? "stopped@" : "?@";
    co_return out + std::to_string(cx.clock().now_ms());
  });
  REQUIRE(v);
  CHECK(*v == "terminate:stopping delete:stopping stopped@1000");
  h.sup.actor = nullptr;
}

TEST_CASE("an exit message with reason normal (a linked actor that ended) leaves a supervisor "
          "running") {
  // CAF hands a linked actor's normal exit to the exit handler; OTP's supervisor ignores an
  // EXIT from anyone but its parent. Before, any exit message stopped the whole tree.
  harness h;
  supervisor_spec spec;
  spec.name = "linked";
  spec.children = {child("a")};
  h.start(spec);
  auto first = h.actor_of(0);
  caf::anon_send_exit(h.sup.actor, caf::exit_reason::normal);
  h.rt.drain();
  // A helper linked to the supervisor that ends normally.
  auto sup_actor = h.sup.actor;
  auto helper = h.rt.system().spawn([sup_actor](caf::event_based_actor* self) -> caf::behavior {
    self->link_to(sup_actor);
    return {[self](int) { self->quit(); }};
  });
  h.rt.drain();
  caf::anon_send(helper, 1);
  h.rt.drain();
  auto st = h.state();
  CHECK(st.status == troupe::supervisor_status::running);
  REQUIRE(st.children.size() == 1);
  CHECK(st.children[0].actor == first); // not restarted either
  // Any other reason still stops it (its parent's user_shutdown, or anyone's).
  caf::anon_send_exit(h.sup.actor, caf::exit_reason::user_shutdown);
  auto fin = h.rt.supervisor_wait(h.sup);
  REQUIRE(fin);
  CHECK(fin->status == troupe::supervisor_status::stopped);
  h.sup.actor = nullptr;
}

TEST_CASE("escalate_to_parent forgets a temporary child that fails, as OTP's intensity 0 does") {
  harness h;
  supervisor_spec spec;
  spec.name = "strict";
  spec.strategy = troupe::strategy::escalate_to_parent;
  spec.children = {child("job", restart_mode::never), child("svc")};
  h.start(spec);
  h.send(0, crash_atom::value);
  auto st = h.state();
  CHECK(st.status == troupe::supervisor_status::running);
  REQUIRE(st.children.size() == 1);
  CHECK(st.children[0].name == "svc");
  // A permanent child's failure still escalates.
  caf::anon_send(h.actor_of(0), crash_atom::value);
  auto fin = h.rt.supervisor_wait(h.sup);
  REQUIRE(fin);
  CHECK(fin->status == troupe::supervisor_status::failed);
  h.sup.actor = nullptr;
}
