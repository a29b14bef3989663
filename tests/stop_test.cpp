// The stop choreography (one fixed order, bounded steps, notices) and interrupts (LIFO
// handlers on a task, resume, once, scoped handlers, the graceful timeout).

#include <csignal>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "test_support.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe_test::must;

namespace {

struct stop_journal {
  std::vector<std::string> events;
  int attempts = 0;
};

struct lane_job {
  static constexpr std::string_view lane = "db";
  std::shared_ptr<stop_journal> j;
  std::string name;
  int64_t ms;
  task<caf::expected<int>> attempt(attempt_scope& s) {
    ++j->attempts;
    j->events.push_back("job " + name + " started");
    co_await s.cx().sleep(std::chrono::milliseconds{ms});
    j->events.push_back("job " + name + " finished");
    co_return 1;
  }
};

child_spec recording_child(std::shared_ptr<stop_journal> j, std::string name) {
  child_spec c;
  c.name = name;
  c.start = task_child([j, name](context& cx) -> task<void> {
    struct mark {
      stop_journal* j;
      std::string name;
      ~mark() { j->events.push_back("service " + name + " stopped"); }
    } m{j.get(), name};
    co_await cx.sleep(24h);
  });
  return c;
}

runtime make_stop_rt(std::chrono::milliseconds stop_timeout = 1000ms) {
  auto rt = runtime::builder{}
                .virtual_time()
                .stop_timeout(stop_timeout)
                .lanes({lane_decl::default_lane(), lane_decl::serial("db")})
                .build();
  REQUIRE(rt);
  return std::move(*rt);
}

} // namespace

TEST_CASE("stop runs one fixed order: queued jobs, running attempts, services, participants") {
  auto rt = make_stop_rt();
  auto j = std::make_shared<stop_journal>();
  supervisor_spec spec;
  spec.name = "app";
  spec.children = {recording_child(j, "first"), recording_child(j, "second")};
  auto sup = rt.supervise(spec);
  REQUIRE(sup);
  auto running = must(rt.submit(lane_job{j, "running", 50}));
  auto queued = must(rt.submit(lane_job{j, "queued", 50}));
  rt.advance(10ms);
  REQUIRE(!rt.on_stop("flush", [j](context&) -> task<void> {
    j->events.push_back("participant flush");
    co_return;
  }));
  rt.stop();
  // The queued job never ran; the running attempt finished before the services stopped
  // (in reverse start order), then the participant ran.
  CHECK(j->events == std::vector<std::string>{"job running started", "job running finished",
                                              "service second stopped", "service first stopped",
                                              "participant flush"});
  CHECK(j->attempts == 1);
  auto log = rt.stop_log();
  REQUIRE(log.size() == 7);
  CHECK(log[0].rfind("1 cancel queued jobs", 0) == 0);
  CHECK(log[1] == "2 running attempts: finished");
  CHECK(log[2].rfind("3 services", 0) == 0);
  CHECK(log[3] == "4 participant flush: finished");
  CHECK(log[4] == "5 durability: flushed");
  CHECK(log[5] == "6 join");
  CHECK(log[6] == "7 closed");
  CHECK(rt.notices().empty());
}

TEST_CASE("a step that overruns is named in the notices and stop goes on") {
  auto rt = make_stop_rt(100ms);
  auto j = std::make_shared<stop_journal>();
  auto h = must(rt.submit(lane_job{j, "long", 3'600'000}));
  rt.drain();
  REQUIRE(!rt.on_stop("stuck", [](context& cx) -> task<void> { co_await cx.sleep(1h); }, 200ms));
  REQUIRE(!rt.on_stop("quick", [j](context&) -> task<void> {
    j->events.push_back("quick ran");
    co_return;
  }));
  rt.stop();
  CHECK(rt.stopped());
  auto ns = rt.notices();
  for (auto& n : ns)
    UNSCOPED_INFO(n.kind << " " << n.subject << ": " << n.detail);
  CHECK(j->events.back() == "quick ran");
  REQUIRE(ns.size() == 2);
  CHECK(ns[0].kind == "stop.lanes");
  CHECK(ns[0].subject == "db");
  CHECK(ns[1].kind == "stop.participant");
  CHECK(ns[1].subject == "stuck");
  CHECK(ns[1].detail.find("200 ms") != std::string::npos);
  CHECK(ns[1].detail.find("still running") != std::string::npos);
  CHECK(j->events.back() == "quick ran"); // the next participant still ran
}

TEST_CASE("on_stop refuses a bad registration with a typed error") {
  auto rt = make_stop_rt();
  auto body = [](context&) -> task<void> { co_return; };
  CHECK(is(rt.on_stop("", body), errc::invalid_argument));
  CHECK(field_of(rt.on_stop("", body)) == "name");
  CHECK(is(rt.on_stop("x", stop_body{}), errc::invalid_argument));
  CHECK(field_of(rt.on_stop("x", body, -1ms)) == "grace");
  REQUIRE(!rt.on_stop("x", body));
  CHECK(field_of(rt.on_stop("x", body)) == "name");
  rt.stop();
  CHECK(is(rt.on_stop("y", body), errc::runtime_stopped));
  rt.stop(); // idempotent
  // A signal delivered to a stopped runtime runs no stop: interrupt answers false (it
  // answered true before 2026-12-05), and interrupted() records it.
  CHECK_FALSE(rt.interrupt(SIGTERM));
  CHECK(rt.interrupted());
}

TEST_CASE("interrupt handlers run in LIFO order on a task, then the stop") {
  auto rt = make_stop_rt();
  auto j = std::make_shared<stop_journal>();
  auto handler = [j](std::string name) {
    return [j, name](context& cx, int sig) -> task<interrupt_action> {
      co_await cx.sleep(1ms); // a task: it may await
      j->events.push_back(name + " " + std::to_string(sig));
      co_return interrupt_action::stop;
    };
  };
  rt.on_interrupt(handler("first"));
  rt.on_interrupt(handler("second"));
  rt.on_interrupt(handler("hup only"), {.signals = on_sighup});
  CHECK_FALSE(rt.interrupted());
  CHECK(rt.interrupt(SIGTERM));
  CHECK(rt.interrupted());
  CHECK(rt.stopped());
  CHECK(j->events == std::vector<std::string>{"second " + std::to_string(SIGTERM),
                                              "first " + std::to_string(SIGTERM)});
}

TEST_CASE("no handler: a signal starts the stop; a resuming handler absorbs it") {
  {
    auto rt = make_stop_rt();
    CHECK(rt.interrupt(SIGINT));
    CHECK(rt.stopped());
  }
  auto rt = make_stop_rt();
  int runs = 0;
  rt.on_interrupt(
      [&runs](context&, int) -> task<interrupt_action> {
        ++runs;
        co_return interrupt_action::resume;
      },
      {.signals = on_sighup, .once = true});
  CHECK_FALSE(rt.interrupt(SIGHUP)); // reloaded, keeps running
  CHECK_FALSE(rt.stopped());
  CHECK(rt.interrupted()); // stays true
  CHECK(runs == 1);
  CHECK(rt.interrupt(SIGHUP)); // `once`: gone, so the signal stops the runtime
  CHECK(runs == 1);
  CHECK(rt.stopped());
}

TEST_CASE("a handler past its graceful timeout is cancelled, named, and the stop follows") {
  auto rt = make_stop_rt();
  rt.on_interrupt([](context& cx, int) -> task<interrupt_action> {
    co_await cx.sleep(1h);
    co_return interrupt_action::resume;
  }, {.graceful_timeout = 50ms});
  CHECK(rt.interrupt(SIGTERM));
  CHECK(rt.stopped());
  auto ns = rt.notices();
  REQUIRE_FALSE(ns.empty());
  CHECK(ns[0].kind == "interrupt.handler");
  CHECK(ns[0].detail.find("50 ms") != std::string::npos);
}

TEST_CASE("with_interrupt scopes a handler to its body") {
  auto rt = troupe_test::make_real_rt();
  std::promise<void> entered;
  auto ready = entered.get_future();
  std::thread signaller{[&] {
    ready.wait();
    rt.interrupt(SIGHUP); // handled while the body runs: the handler wakes it
  }};
  auto r = rt.with_interrupt(
      [](context& cx, int) -> task<interrupt_action> {
        auto ch = co_await open_channel<int>(cx, "hup", 1);
        if (ch) (void)co_await ch->send(cx, 1);
        co_return interrupt_action::resume;
      },
      [&entered](context& cx) -> task<int> {
        auto ch = co_await open_channel<int>(cx, "hup", 1);
        if (!ch) co_return -1;
        entered.set_value();
        auto v = co_await ch->receive(cx);
        co_return v ? *v : -2;
      });
  signaller.join();
  CHECK(must(std::move(r)) == 1);
  CHECK_FALSE(rt.stopped());
  // The body ended: its handler is gone, so the next signal stops the runtime.
  CHECK(rt.interrupt(SIGHUP));
  CHECK(rt.stopped());
}

TEST_CASE("stop is bounded whatever the user spawned: plain actors left alive are named") {
  for (bool virtual_time : {true, false}) {
    caf::actor plain;
    auto rt = runtime::builder{}
                  .virtual_time(virtual_time)
                  .threads(2)
                  .stop_timeout(100ms)
                  .build();
    REQUIRE(rt);
    // A plain CAF actor troupe does not own; the handle keeps it alive.
    plain = rt->system().spawn([]() -> caf::behavior { return {[](int x) { return x; }}; });
    rt->stop(); // returns within its bound instead of waiting for `plain` forever
    auto ns = rt->notices();
    REQUIRE(ns.size() == 1);
    CHECK(ns[0].kind == "stop.close");
    CHECK(ns[0].detail.rfind("1 actors not owned by troupe", 0) == 0);
    CHECK(rt->stop_log().back() == "7 closed (the actor system left running)");
    // Without one, the system closes as usual.
    auto clean = runtime::builder{}.virtual_time(virtual_time).threads(2).build();
    REQUIRE(clean);
    clean->stop();
    CHECK(clean->notices().empty());
    CHECK(clean->stop_log().back() == "7 closed");
  }
}

TEST_CASE("stop() from inside the runtime starts the stop and does not wait for its caller") {
  SECTION("a stop participant calling stop() (virtual time): it returns, the stop goes on") {
    auto rt = make_stop_rt();
    auto j = std::make_shared<stop_journal>();
    REQUIRE(!rt.on_stop("nested", [&rt, j](context&) -> task<void> {
      rt.stop(); // was: waited for the stop that runs it, for ever
      j->events.push_back("nested returned");
      co_return;
    }));
    // On this thread (CAF closes its system on a thread that used it); before the fix this
    // call never returned (the suite's timeout fails it).
    rt.stop();
    CHECK(j->events == std::vector<std::string>{"nested returned"});
    CHECK(rt.stopped());
    CHECK(rt.stop_log().back() == "7 closed");
    CHECK(rt.notices().empty());
  }
  SECTION("a task's body calling stop() (virtual time): run answers, the runtime is stopped") {
    auto rt = make_stop_rt();
    auto j = std::make_shared<stop_journal>();
    auto r = rt.run([&rt, j](context& cx) -> task<int> {
      rt.stop(); // was: waited inside the drive for the root task that called it, for ever
      j->events.push_back("stop returned");
      co_await cx.sleep(1h); // cancelled by the stop's step 3
      j->events.push_back("slept");
      co_return 1;
    });
    CHECK(troupe_test::fails_with(r, errc::cancelled));
    CHECK(j->events == std::vector<std::string>{"stop returned"});
    CHECK(rt.stopped());
    CHECK(rt.stop_log().back() == "7 closed");
    CHECK(rt.notices().empty()); // the caller ended at step 3, within its bound
  }
  SECTION("a task's body calling stop() (real time): the worker is not blocked for the stop") {
    auto rt = runtime::builder{}.threads(2).stop_timeout(5s).build();
    REQUIRE(rt);
    auto started = std::chrono::steady_clock::now();
    auto r = rt->run([&rt](context& cx) -> task<int> {
      rt->stop();
      co_await cx.sleep(1h);
      co_return 1;
    });
    CHECK(troupe_test::fails_with(r, errc::cancelled));
    rt->wait_stopped();
    rt->stop(); // closes on this thread (the stop ran on the request_stop thread)
    CHECK(rt->stop_log().back() == "7 closed");
    CHECK(rt->notices().empty()); // was: the root task overran step 3 and the system leaked
    CHECK(std::chrono::steady_clock::now() - started < 5s);
  }
}

TEST_CASE("a task of one runtime stopping another stops it in place") {
  // Only a task of the runtime itself takes the request path (it would wait for itself);
  // for another runtime the call is like any thread's: stopped when it returns.
  auto a = make_stop_rt();
  auto b = make_stop_rt();
  auto r = a.run([&b](context&) -> task<std::string> {
    b.stop();
    co_return b.stop_log().empty() ? std::string{"not stopped"} : b.stop_log().back();
  });
  REQUIRE(r);
  CHECK(*r == "7 closed"); // was: only requested, and b's virtual time never ran it
  CHECK(b.stopped());
}

TEST_CASE("after stop, drain and advance answer 0 and touch nothing") {
  auto rt = make_stop_rt();
  rt.stop();
  CHECK(rt.drain() == 0); // was: read the destroyed test coordinator (a use after free)
  CHECK(rt.advance(1s) == 0);
}

TEST_CASE("a grace or stop_timeout too long for the clock is no bound, not an overflow") {
  // Real time: the steady clock is far from zero, so `now + max` wrapped into the past.
  auto rt = runtime::builder{}
                .threads(2)
                .stop_timeout(std::chrono::milliseconds::max()) // was: -1 ms once in ns
                .build();
  REQUIRE(rt);
  auto j = std::make_shared<stop_journal>();
  REQUIRE(!rt->on_stop("slow", [j](context& cx) -> task<void> {
    co_await cx.sleep(10ms);
    j->events.push_back("slow finished");
  }, clock::duration::max())); // was: a deadline in the past, cancelled at once
  rt->stop();
  for (auto& n : rt->notices())
    UNSCOPED_INFO(n.kind << " " << n.subject << ": " << n.detail);
  CHECK(rt->notices().empty());
  CHECK(j->events == std::vector<std::string>{"slow finished"});
}

TEST_CASE("several threads calling stop() at once: one closes, none crashes") {
  for (int round = 0; round < 20; ++round) {
    auto rt = runtime::builder{}.threads(2).stop_timeout(1s).build();
    REQUIRE(rt);
    rt->request_stop(); // the stop runs on the stopper thread; the callers wait, then finish
    std::vector<std::thread> callers;
    for (int i = 0; i < 3; ++i)
      callers.emplace_back([&rt] { rt->stop(); });
    for (auto& t : callers)
      t.join();
    CHECK(rt->stopped());
    CHECK(rt->stop_log().back() == "7 closed");
  }
}

TEST_CASE("signal handling is installed while a runtime listens, and the previous actions come back") {
  auto action = [](int sig) {
    struct sigaction sa {};
    ::sigaction(sig, nullptr, &sa);
    return sa.sa_handler;
  };
  auto before_term = action(SIGTERM); // the test framework's own handler
  auto before_hup = action(SIGHUP);
  {
    auto rt = runtime::builder{}.threads(2).signals().build();
    REQUIRE(rt);
    CHECK(action(SIGTERM) != before_term);
    CHECK(action(SIGHUP) != before_hup);
    rt->stop();
  }
  CHECK(action(SIGTERM) == before_term);
  CHECK(action(SIGHUP) == before_hup);
}
