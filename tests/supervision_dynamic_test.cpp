// Dynamic supervisors (a child template), tasks as supervised children, and supervision
// from inside a task.

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "supervision_support.hpp"

namespace {

using troupe::context;
using troupe::task;

/// A template start function: a worker per call; counts the calls.
troupe::template_start_fn template_worker(std::shared_ptr<int> calls = nullptr) {
  return [calls](caf::actor_system& sys, const caf::message&) -> troupe::start_result {
    if (calls) ++*calls;
    return std::optional<caf::actor>{sys.spawn(worker)};
  };
}

supervisor_spec dynamic_spec(restart_mode mode = restart_mode::never) {
  supervisor_spec spec;
  spec.name = "conns";
  spec.intensity = 1000;
  troupe::child_template t;
  t.name = "conn";
  t.start = template_worker();
  t.restart = mode;
  spec.child_template = t;
  return spec;
}

} // namespace

// -- dynamic supervisors ---------------------------------------------------------------------

TEST_CASE("a dynamic supervisor starts template children with arguments and unique ids") {
  harness h;
  auto spec = dynamic_spec();
  std::vector<std::string> seen_args;
  spec.child_template->start = [&seen_args](caf::actor_system& sys,
                                            const caf::message& args) -> troupe::start_result {
    if (args.match_elements<std::string>()) seen_args.push_back(args.get_as<std::string>(0));
    return std::optional<caf::actor>{sys.spawn(worker)};
  };
  h.start(spec);
  std::set<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    auto c = h.rt.start_child(h.sup, caf::make_message("10.0.0." + std::to_string(i)));
    REQUIRE(c);
    CHECK(c->status == child_status::running);
    ids.insert(c->name);
  }
  CHECK(ids.size() == 5);
  CHECK(ids.count("conn-1") == 1);
  CHECK(seen_args.size() == 5);
  CHECK(seen_args[4] == "10.0.0.4");
  auto n = h.rt.count_children(h.sup);
  REQUIRE(n);
  CHECK(n->specs == 1); // OTP's simple_one_for_one: its one spec, the template
  CHECK(n->active == 5);
  CHECK(n->workers == 5);
  CHECK(n->supervisors == 0);
  // terminate_child removes a dynamic child (OTP's simple_one_for_one).
  REQUIRE(*h.rt.terminate_child(h.sup, "conn-2"));
  CHECK(h.rt.count_children(h.sup)->workers == 4);
  auto ghost = h.rt.terminate_child(h.sup, "conn-2");
  REQUIRE_FALSE(ghost);
  CHECK(troupe::is(ghost.error(), errc::unknown_child));
  // restart / delete do not apply; a static child spec is refused.
  auto r = h.rt.restart_child(h.sup, "conn-1");
  CHECK(troupe::is(r.error(), errc::template_child));
  auto d = h.rt.delete_child(h.sup, "conn-1");
  CHECK(troupe::is(d.error(), errc::template_child));
  auto s = h.rt.start_child(h.sup, child("static"));
  CHECK(troupe::is(s.error(), errc::invalid_spec));
  CHECK(troupe::field_of(s.error()) == "child_template");
  // Temporary children vanish when they end.
  auto kids = h.rt.which_children(h.sup);
  REQUIRE(kids);
  caf::anon_send(kids->front().actor, crash_atom::value);
  caf::anon_send(kids->back().actor, finish_atom::value);
  h.rt.drain();
  CHECK(h.rt.count_children(h.sup)->workers == 2);
}

TEST_CASE("start_child with arguments needs a template; a template needs one_for_one") {
  harness h;
  supervisor_spec plain;
  plain.children = {child("a")};
  h.start(plain);
  auto r = h.rt.start_child(h.sup, caf::make_message(1));
  REQUIRE_FALSE(r);
  CHECK(troupe::is(r.error(), errc::no_template));
  auto bad = dynamic_spec();
  bad.strategy = troupe::strategy::one_for_all;
  CHECK(troupe::field_of(troupe::validate(bad)) == "strategy");
  auto both = dynamic_spec();
  both.children = {child("x")};
  CHECK(troupe::field_of(troupe::validate(both)) == "children");
  auto nostart = dynamic_spec();
  nostart.child_template->start = nullptr;
  CHECK(troupe::field_of(troupe::validate(nostart)) == "child_template.start");
  auto neg = dynamic_spec();
  neg.child_template->window_ms = 0;
  CHECK(troupe::field_of(troupe::validate(neg)) == "child_template.window_ms");
}

TEST_CASE("permanent template children restart under their generated id") {
  harness h;
  h.start(dynamic_spec(restart_mode::always));
  auto c = h.rt.start_child(h.sup, caf::make_message());
  REQUIRE(c);
  caf::anon_send(c->actor, crash_atom::value);
  h.rt.drain();
  auto kids = h.rt.which_children(h.sup);
  REQUIRE(kids);
  REQUIRE(kids->size() == 1);
  CHECK(kids->at(0).name == c->name);
  CHECK(kids->at(0).restarts == 1);
  CHECK(kids->at(0).actor != c->actor);
}

TEST_CASE("a dynamic child whose restart answers ignore is forgotten (OTP)") {
  harness h;
  auto spec = dynamic_spec(restart_mode::always);
  auto calls = std::make_shared<int>(0);
  spec.child_template->start = [calls](caf::actor_system& sys,
                                       const caf::message&) -> troupe::start_result {
    if (++*calls > 1) return std::optional<caf::actor>{}; // the restart: ignore
    return std::optional<caf::actor>{sys.spawn(worker)};
  };
  h.start(spec);
  auto c = h.rt.start_child(h.sup, caf::make_message());
  REQUIRE(c);
  caf::anon_send(c->actor, crash_atom::value);
  h.rt.drain();
  CHECK(*calls == 2);
  auto kids = h.rt.which_children(h.sup);
  REQUIRE(kids);
  CHECK(kids->empty());
  auto n = h.rt.count_children(h.sup);
  REQUIRE(n);
  CHECK(n->workers == 0);
  CHECK(h.events("forgotten").size() == 1);
}

TEST_CASE("stopping a dynamic supervisor terminates its children concurrently, bounded") {
  harness h;
  auto spec = dynamic_spec();
  spec.child_template->start = [](caf::actor_system& sys,
                                   const caf::message&) -> troupe::start_result {
    return std::optional<caf::actor>{sys.spawn(stubborn)};
  };
  spec.child_template->shutdown_ms = 1000;
  h.start(spec);
  for (int i = 0; i < 50; ++i)
    REQUIRE(h.rt.start_child(h.sup, caf::make_message(i)));
  auto fin = h.rt.supervisor_stop(h.sup, std::chrono::milliseconds(-1));
  REQUIRE(fin);
  CHECK(fin->status == troupe::supervisor_status::stopped);
  auto killed = h.events("killed");
  CHECK(killed.size() == 50);
  for (auto& k : killed) // all at the one shutdown bound, not one after another
    CHECK(k.substr(k.find('@')) == "@1000");
  h.sup.actor = nullptr;
}

TEST_CASE("a dynamic supervisor from JSON: template keys, factories, bad input") {
  std::map<std::string, troupe::template_start_fn> tf{{"conn", template_worker()}};
  auto doc = nlohmann::json::parse(R"({
    "name": "pool", "intensity": 50, "keep_ended_temporaries": 2,
    "child_template": {"name": "conn", "start": "conn", "restart": "on_failure",
                       "shutdown": "infinity", "type": "worker", "backoff_ms": 5}
  })");
  auto spec = troupe::spec_from_json(doc, {}, tf);
  REQUIRE(spec);
  REQUIRE(spec->child_template);
  CHECK(spec->child_template->restart == restart_mode::on_failure);
  CHECK(spec->child_template->shutdown_ms == troupe::infinity);
  CHECK(spec->child_template->backoff_ms == 5);
  CHECK(spec->keep_ended_temporaries == 2);
  auto unknown = troupe::spec_from_json(
      nlohmann::json::parse(R"({"child_template": {"start": "nope"}})"), {}, tf);
  REQUIRE_FALSE(unknown);
  CHECK(troupe::field_of(unknown.error()) == "child_template.start");
  auto badtype = troupe::spec_from_json(
      nlohmann::json::parse(R"({"children": [{"name": "a", "start": "w", "type": "boss"}]})"),
      {{"w", start_worker()}});
  REQUIRE_FALSE(badtype);
  CHECK(troupe::field_of(badtype.error()) == "children[0].type");
  auto badshut = troupe::spec_from_json(
      nlohmann::json::parse(R"({"children": [{"name": "a", "start": "w", "shutdown": "soon"}]})"),
      {{"w", start_worker()}});
  CHECK(troupe::field_of(badshut.error()) == "children[0].shutdown");
  auto negkeep = troupe::spec_from_json(nlohmann::json::parse(R"({"keep_ended_temporaries": -1})"),
                                        {});
  CHECK(troupe::field_of(negkeep.error()) == "keep_ended_temporaries");
  harness h;
  h.start(*spec);
  auto c = h.rt.start_child(h.sup, caf::make_message());
  REQUIRE(c);
  CHECK(c->name == "conn-1");
}

// -- tasks as supervised children ------------------------------------------------------------

TEST_CASE("task_child: a throw is a failure, a return a normal exit, both as the mode says") {
  harness h;
  auto runs = std::make_shared<int>(0);
  supervisor_spec spec;
  spec.intensity = 10;
  troupe::child_spec failing;
  failing.name = "failing";
  failing.restart = restart_mode::on_failure;
  failing.start = troupe::task_child([runs](context& cx) -> task<void> {
    ++*runs;
    co_await cx.sleep(10ms);
    if (*runs < 3) throw std::runtime_error("disk on fire");
  });
  troupe::child_spec returning;
  returning.name = "returning";
  returning.restart = restart_mode::on_failure;
  returning.start = troupe::task_child([](context& cx) -> task<caf::expected<int>> {
    co_await cx.sleep(5ms);
    co_return troupe::make_error(errc::invalid_argument, "input", "bad row");
  });
  troupe::child_spec done;
  done.name = "done";
  done.restart = restart_mode::on_failure;
  done.start = troupe::task_child([]() -> task<int> { co_return 7; });
  spec.children = {failing, returning, done};
  spec.children[1].max_restarts = 2; // then suppressed
  h.start(spec);
  h.rt.advance(100ms);
  auto st = h.state();
  CHECK(st.children[0].restarts == 2);   // failed twice, then returned normally
  CHECK(st.children[0].status == child_status::stopped);
  CHECK(st.children[0].last_error.empty());
  CHECK(st.children[1].status == child_status::suppressed); // a returned error is a failure
  CHECK(st.children[1].last_error.find("bad row") != std::string::npos);
  CHECK(st.children[2].status == child_status::stopped); // a normal exit: not restarted
  CHECK(st.children[2].restarts == 0);
  auto failures = h.events("failed");
  CHECK(failures.size() == 5); // 2 throws, 3 returned errors
}

TEST_CASE("task_child: shutdown is a graceful cancel, then a forced one after shutdown_ms") {
  harness h;
  auto cleaned = std::make_shared<int>(0);
  auto raii = std::make_shared<int>(0);
  struct guard {
    std::shared_ptr<int> n;
    ~guard() { ++*n; }
  };
  supervisor_spec spec;
  troupe::child_spec polite;
  polite.name = "polite";
  polite.start = troupe::task_child([cleaned](context& cx) -> task<void> {
    try {
      co_await cx.sleep(1h);
    } catch (troupe::task_cancelled&) {
      ++*cleaned;
    }
    co_await cx.sleep(100ms); // cleanup may still await
    ++*cleaned;
  });
  troupe::child_spec stubborn_task;
  stubborn_task.name = "stubborn";
  stubborn_task.shutdown_ms = 500;
  stubborn_task.start = troupe::task_child([raii](context& cx) -> task<void> {
    guard g{raii};
    for (;;) {
      try {
        co_await cx.sleep(1h);
      } catch (troupe::task_cancelled&) {
        // ignores the request; the supervisor forces it
      }
    }
  });
  spec.children = {polite, stubborn_task};
  h.start(spec);
  auto fin = h.rt.supervisor_stop(h.sup, 10s);
  REQUIRE(fin);
  CHECK(fin->status == troupe::supervisor_status::stopped);
  CHECK(*raii == 1);                                              // RAII ran on the force
  CHECK(h.events("killed") == std::vector<std::string>{"killed:stubborn@500"});
  CHECK(*cleaned == 2); // polite: the cancel arrived, then its cleanup ran to the end
  auto stopped = h.events("stopped");
  CHECK(stopped == std::vector<std::string>{"stopped:stubborn@500", "stopped:polite@600"});
  h.sup.actor = nullptr;
}

TEST_CASE("task_child outside a troupe runtime answers a typed start error") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto fn = troupe::task_child([]() -> task<void> { co_return; });
  auto r = fn(sys);
  REQUIRE_FALSE(r);
  CHECK(troupe::is(r.error(), errc::invalid_argument));
  CHECK(troupe::field_of(r.error()) == "system");
}

TEST_CASE("task_child_template runs a task per dynamic child with its arguments") {
  harness h;
  auto sum = std::make_shared<int>(0);
  auto spec = dynamic_spec();
  spec.child_template->start = troupe::task_child_template(
      [sum](context& cx, const caf::message& args) -> task<void> {
        co_await cx.sleep(1ms);
        *sum += args.get_as<int>(0);
      });
  h.start(spec);
  for (int i = 1; i <= 10; ++i)
    REQUIRE(h.rt.start_child(h.sup, caf::make_message(i)));
  h.rt.advance(10ms);
  CHECK(*sum == 55);
  CHECK(h.rt.count_children(h.sup)->workers == 0); // temporaries that ended: forgotten
}

// -- supervision from inside a task ----------------------------------------------------------

TEST_CASE("a task supervises: supervise, administer, subscribe and wait with a timeout") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<std::vector<std::string>> {
    std::vector<std::string> log;
    supervisor_spec spec;
    spec.name = "app";
    spec.intensity = 5;
    spec.children = {child("a")};
    auto sup = co_await troupe::supervise(cx, spec);
    if (!sup) throw troupe::task_error{sup.error()};
    auto b = co_await troupe::start_child(cx, *sup, child("b"));
    if (!b) throw troupe::task_error{b.error()};
    auto n = co_await troupe::count_children(cx, *sup);
    log.push_back("count " + std::to_string(n ? n->specs : 0));
    // Subscribe: every event from the start.
    uint64_t cursor = 0;
    auto first = co_await troupe::supervisor_next_events(cx, *sup, cursor);
    if (!first) throw troupe::task_error{first.error()};
    cursor = first->back().seq;
    log.push_back("seen " + std::to_string(first->size()));
    caf::anon_send(b->actor, crash_atom::value);
    for (bool restarted = false; !restarted;) {
      auto next = co_await troupe::supervisor_next_events(cx, *sup, cursor);
      if (!next || next->empty()) throw troupe::task_error{troupe::make_error(errc::cancelled)};
      for (auto& e : *next) {
        log.push_back(std::string{to_string(e.kind)} + ":" + e.child);
        restarted = restarted || e.kind == troupe::supervisor_event_kind::restarted;
      }
      cursor = next->back().seq;
    }
    auto w = co_await troupe::supervisor_wait(cx, *sup, 2s);
    log.push_back(troupe::is(w.error(), errc::deadline_exceeded) ? "still running" : "?");
    auto m = co_await troupe::supervisor_metrics_of(cx, *sup);
    log.push_back("restarts " + std::to_string(m ? m->restarts : 99));
    auto fin = co_await troupe::supervisor_stop(cx, *sup, 1s);
    log.push_back(fin && fin->status == troupe::supervisor_status::stopped ? "stopped" : "?");
    for (;;) { // the rest of the events, then an empty answer: it ended
      auto more = co_await troupe::supervisor_next_events(cx, *sup, cursor);
      if (!more || more->empty()) break;
      cursor = more->back().seq;
    }
    log.push_back("ended");
    auto after = co_await troupe::count_children(cx, *sup); // final counts
    log.push_back("final " + std::to_string(after ? after->specs : 99));
    co_return log;
  });
  REQUIRE(r);
  CHECK(*r == std::vector<std::string>{"count 2", "seen 2", "failed:b", "started:b",
                                       "restarted:b", "still running", "restarts 1", "stopped",
                                       "ended", "final 2"});
}

TEST_CASE("a supervisor started from a task is stopped by the runtime's stop()") {
  auto rt = make_virtual_rt();
  auto sup = rt.run([](context& cx) -> task<caf::expected<troupe::supervisor_ref>> {
    supervisor_spec spec;
    spec.children = {child("a")};
    co_return co_await troupe::supervise(cx, spec);
  });
  REQUIRE(sup);
  REQUIRE(*sup);
  rt.stop();
  std::lock_guard<std::mutex> guard{(*sup)->final->mtx};
  CHECK((*sup)->final->state.has_value());
}

TEST_CASE("task children from a JSON spec through named factories") {
  harness h;
  auto runs = std::make_shared<int>(0);
  std::map<std::string, troupe::start_fn> factories{
      {"flaky", troupe::task_child([runs](context& cx) -> task<void> {
         co_await cx.sleep(10ms);
         if (++*runs < 3) throw std::runtime_error("boom");
       })}};
  auto spec = troupe::spec_from_json(nlohmann::json::parse(R"({
    "name": "from_json", "intensity": 5,
    "children": [{"name": "job", "start": "flaky", "restart": "on_failure", "shutdown_ms": 100}]
  })"),
                                     factories);
  REQUIRE(spec);
  h.start(*spec);
  h.rt.advance(100ms);
  auto st = h.state();
  CHECK(*runs == 3);
  CHECK(st.children[0].restarts == 2);
  CHECK(st.children[0].status == child_status::stopped); // the third run returned
}

TEST_CASE("kill deadlines: 300 children that stop in time leave one stubborn child's deadline "
          "on time (the kill queue compacts its stale entries)") {
  harness h;
  auto spec = dynamic_spec();
  auto calls = std::make_shared<int>(0);
  spec.child_template->start = [calls](caf::actor_system& sys,
                                        const caf::message&) -> troupe::start_result {
    // The first child ignores exit requests; the others stop when asked.
    return std::optional<caf::actor>{++*calls == 1 ? sys.spawn(stubborn) : sys.spawn(worker)};
  };
  spec.child_template->shutdown_ms = 1000;
  h.start(spec);
  auto v = h.rt.run([&](troupe::context& cx) -> troupe::task<std::string> {
    auto first = co_await troupe::start_child(cx, h.sup, caf::message{});
    if (!first) co_return "no first child";
    auto name = first->name;
    auto stubborn_term = cx.spawn([&, name](troupe::context& c) -> troupe::task<bool> {
      auto r = co_await troupe::terminate_child(c, h.sup, name);
      co_return r && *r;
    });
    co_await cx.sleep(std::chrono::milliseconds(10));
    int ok = 0;
    for (int i = 0; i < 300; ++i) {
      auto c = co_await troupe::start_child(cx, h.sup, caf::message{});
      if (!c) co_return "start " + std::to_string(i);
      auto t = co_await troupe::terminate_child(cx, h.sup, c->name);
      ok += t && *t ? 1 : 0;
    }
    auto t = co_await cx.await(stubborn_term);
    co_return std::to_string(ok) + (t && *t ? " ok" : " ?") + "@" +
        std::to_string(cx.clock().now_ms());
  });
  REQUIRE(v);
  CHECK(*v == "300 ok@1000");
  auto killed = h.events("killed");
  REQUIRE(killed.size() == 1);
  CHECK(killed[0].substr(killed[0].find('@')) == "@1000");
}

TEST_CASE("a dynamic child its own budget keeps down is forgotten, as one that ends for good") {
  // Before, it stayed listed as suppressed for ever: restart_child and delete_child refuse a
  // dynamic child, and count_children kept counting it.
  harness h;
  auto spec = dynamic_spec(restart_mode::always);
  spec.child_template->max_restarts = 1;
  h.start(spec);
  auto c = h.rt.start_child(h.sup, caf::make_message(std::string{"x"}));
  REQUIRE(c);
  h.send(0, crash_atom::value); // restarted: 1 of its 1
  REQUIRE(h.state().children.size() == 1);
  h.send(0, crash_atom::value); // its budget is spent: it stays down, and is forgotten
  auto st = h.state();
  CHECK(st.children.empty());
  CHECK(st.status == troupe::supervisor_status::running);
  auto n = h.rt.count_children(h.sup);
  REQUIRE(n);
  CHECK(n->workers == 0);
}
