// Lanes and jobs: the catalog boot accepts or refuses, FIFO admission per lane, retries with
// the documented backoff on virtual time, timeouts, cancellation, attempt scopes and causes.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <troupe/actors/detail/test_hooks.hpp>

#include "test_support.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe_test::must;

namespace {

runtime make_lanes_rt(std::vector<lane_decl> lanes) {
  auto rt = runtime::builder{}.virtual_time().lanes(std::move(lanes)).build();
  REQUIRE(rt);
  return std::move(*rt);
}

std::vector<lane_decl> standard_lanes() {
  return {lane_decl::default_lane("default"), lane_decl::serial("db"), lane_decl::serial("mail"),
          lane_decl::concurrent("export", 2)};
}

/// What the jobs of one test observed (shared by the test and its jobs: virtual time runs
/// everything on the test's thread).
struct journal {
  std::vector<std::string> events;
  int running = 0;
  int max_running = 0;
  int attempts = 0;
  std::vector<int64_t> attempt_ms;
};

struct ok_job {
  int x = 0;
  task<caf::expected<int>> attempt(attempt_scope&) { co_return x * 2; }
};

/// Runs for `ms` on the clock, counting how many run at once.
struct timed_job {
  static constexpr std::string_view lane = "db";
  std::shared_ptr<journal> j;
  std::string name;
  int64_t ms = 10;
  task<caf::expected<std::string>> attempt(attempt_scope& s) {
    ++j->attempts;
    j->events.push_back("start " + name);
    j->max_running = std::max(j->max_running, ++j->running);
    struct leave {
      journal* j;
      ~leave() { --j->running; }
    } guard{j.get()};
    co_await s.cx().sleep(std::chrono::milliseconds{ms});
    j->events.push_back("end " + name);
    co_return name;
  }
};

/// Fails every attempt with its own error, recording when each attempt started.
struct failing_job {
  static job_policy policy() { return {.retries = 10}; }
  std::shared_ptr<journal> j;
  task<caf::expected<int>> attempt(attempt_scope& s) {
    ++j->attempts;
    j->attempt_ms.push_back( // microseconds here
        std::chrono::duration_cast<std::chrono::microseconds>(s.now().time_since_epoch()).count());
    co_return make_error(errc::not_found, "endpoint", "attempt " + std::to_string(s.attempt()));
  }
};

} // namespace

TEST_CASE("boot refuses a malformed lane catalog with an error naming the lane") {
  auto refused = [](std::vector<lane_decl> lanes, std::string field, std::string mention) {
    auto rt = runtime::builder{}.virtual_time().lanes(std::move(lanes)).build();
    REQUIRE_FALSE(rt);
    CHECK(is(rt.error(), errc::invalid_lane));
    CHECK(field_of(rt.error()) == field);
    CHECK(detail_of(rt.error()).find(mention) != std::string::npos);
  };
  refused({lane_decl::default_lane(), lane_decl::concurrent("export", 0)}, "lanes[1]", "export");
  refused({lane_decl::default_lane(), lane_decl::concurrent("export", -3)}, "lanes[1]", "export");
  refused({lane_decl::default_lane(), lane_decl::serial("")}, "lanes[1]", "name");
  refused({lane_decl::default_lane(), lane_decl::serial("db"), lane_decl::serial("db")}, "lanes[2]",
          "db");
  refused({lane_decl::serial("db")}, "lanes", "no default lane");
  refused({lane_decl::default_lane("a"), lane_decl::default_lane("b")}, "lanes[1]", "b");
  auto bounded = lane_decl::concurrent("main", 4);
  bounded.is_default = true;
  refused({bounded}, "lanes[0]", "main");
  // No catalog at all: the default lane alone.
  auto rt = troupe_test::make_virtual_rt();
  REQUIRE(rt.lanes().size() == 1);
  CHECK(rt.lanes()[0].name == "default");
  CHECK(rt.lanes()[0].kind == lane_kind::unbounded);
}

TEST_CASE("a job naming no lane runs on the default lane at once and answers its outcome") {
  auto rt = make_lanes_rt(standard_lanes());
  auto h = rt.submit(ok_job{21});
  REQUIRE(h);
  CHECK(h->lane() == "default");
  CHECK_FALSE(h->cause());
  CHECK(must(rt.await(*h)) == 42);
  auto m = must(rt.lane_metrics_of("default"));
  CHECK(m.admitted == 1);
  CHECK(m.running == 0);
  CHECK(m.queue_depth == 0);
}

TEST_CASE("a submission to an undeclared lane or with an impossible policy is refused at once") {
  auto rt = make_lanes_rt(standard_lanes());
  auto a = rt.submit(submission{ok_job{1}}.on("nope"));
  REQUIRE_FALSE(a);
  CHECK(is(a.error(), errc::unknown_lane));
  CHECK(field_of(a.error()) == "lane");
  auto b = rt.submit(submission{ok_job{1}}.under({.backoff_base = 100ms, .backoff_cap = 50ms}));
  REQUIRE_FALSE(b);
  CHECK(is(b.error(), errc::undeclarable_pacing));
  CHECK(field_of(b.error()) == "backoff_cap");
  auto c = rt.submit(submission{ok_job{1}}.under({.backoff_cap = 0ms}));
  REQUIRE_FALSE(c);
  CHECK(is(c.error(), errc::undeclarable_pacing));
  auto d = rt.submit(submission{ok_job{1}}.under({.timeout = 0ms}));
  REQUIRE_FALSE(d);
  CHECK(field_of(d.error()) == "timeout");
  auto m = rt.lane_metrics_of("nope");
  REQUIRE_FALSE(m);
  CHECK(is(m.error(), errc::unknown_lane));
}

TEST_CASE("a serial lane admits one attempt at a time in submission order") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  std::vector<job_handle<std::string>> hs;
  for (auto n : {"a", "b", "c"})
    hs.push_back(must(rt.submit(timed_job{j, n, 10})));
  rt.drain();
  auto m = must(rt.lane_metrics_of("db"));
  CHECK(m.running == 1);
  CHECK(m.queue_depth == 2);
  for (auto& h : hs)
    (void)must(rt.await(h));
  CHECK(j->events == std::vector<std::string>{"start a", "end a", "start b", "end b", "start c", "end c"});
  CHECK(j->max_running == 1);
  m = must(rt.lane_metrics_of("db"));
  CHECK(m.admitted == 3);
  CHECK(m.max_queue_depth == 2);
  CHECK(m.total_wait_ms == Approx(10.0 + 20.0)); // b waited 10 ms, c 20 ms
}

TEST_CASE("a lane's metrics count the jobs a task submits (its queued tickets) as any others") {
  // Jobs submitted from a task wait as tickets, and their grants are held apart from other
  // permits (a slot each): running, admitted, waits and the queue read the same.
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<std::string> {
    std::vector<job_handle<std::string>> hs;
    for (auto n : {"a", "b", "c", "d", "e"})
      hs.push_back(must(submit(cx, submission{timed_job{j, n, 10}}.on("export"))));
    co_await cx.sleep(5ms); // a and b run; c, d and e wait
    auto m = must(co_await lane_metrics_of(cx, "export"));
    auto seen = std::to_string(m.running) + " " + std::to_string(m.queue_depth) + " " +
                std::to_string(m.admitted);
    for (auto& h : hs)
      if (!co_await cx.await(h)) co_return "failed";
    co_return seen;
  });
  CHECK(must(std::move(r)) == "2 3 2");
  CHECK(j->max_running == 2);
  auto m = must(rt.lane_metrics_of("export"));
  CHECK(m.running == 0);
  CHECK(m.admitted == 5);
  CHECK(m.queue_depth == 0);
  CHECK(m.max_queue_depth == 3);
  CHECK(m.total_wait_ms == Approx(10.0 + 10.0 + 20.0)); // c and d waited 10 ms, e 20 ms
}

TEST_CASE("a concurrent(n) lane runs at most n attempts at once") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  std::vector<job_handle<std::string>> hs;
  for (int i = 0; i < 7; ++i)
    hs.push_back(must(rt.submit(submission{timed_job{j, std::to_string(i), 10}}.on("export"))));
  for (auto& h : hs)
    (void)must(rt.await(h));
  CHECK(j->max_running == 2);
  CHECK(j->attempts == 7);
  // The default lane never queues: 7 at once.
  auto k = std::make_shared<journal>();
  hs.clear();
  for (int i = 0; i < 7; ++i)
    hs.push_back(must(rt.submit(submission{timed_job{k, std::to_string(i), 10}}.on("default"))));
  for (auto& h : hs)
    (void)must(rt.await(h));
  CHECK(k->max_running == 7);
}

TEST_CASE("ten retries with the default policy wait exactly the documented backoff") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto h = must(rt.submit(failing_job{j}));
  auto r = rt.await(h);
  REQUIRE_FALSE(r);
  // Exhausted retries answer the job's own last error, unwrapped.
  CHECK(is(r.error(), errc::not_found));
  CHECK(field_of(r.error()) == "endpoint");
  CHECK(detail_of(r.error()) == "attempt 10");
  REQUIRE(j->attempts == 11);
  // docs/jobs.md: 10.65, 20.2, 42.12, 86.24, 162.88, 349.44, 695.68, 1308.16, 2631.68, 5330 ms.
  const std::vector<int64_t> waits_us{10650,  20200,   42120,   86240,   162880,
                                      349440, 695680, 1308160, 2631680, 5330000};
  job_policy p{.retries = 10};
  int64_t total = 0;
  for (uint32_t i = 0; i < 10; ++i) {
    CHECK(std::chrono::duration_cast<std::chrono::microseconds>(backoff_delay(p, i)).count() ==
          waits_us[i]);
    total += waits_us[i];
  }
  CHECK(total == 10637050);
  // Attempts on virtual time: each one starts exactly one backoff after the previous.
  for (size_t i = 1; i < j->attempt_ms.size(); ++i)
    CHECK(j->attempt_ms[i] - j->attempt_ms[i - 1] == waits_us[i - 1]);
  CHECK(j->attempt_ms.back() - j->attempt_ms.front() == 10637050);
}

TEST_CASE("backoff saturates at the cap without overflow and is the same on every call") {
  job_policy p{.backoff_base = 1ms, .backoff_cap = 1h};
  CHECK(backoff_delay(p, 4000) == backoff_delay(p, 4000));
  CHECK(backoff_delay(p, 4000) >= std::chrono::hours{1});
  CHECK(backoff_delay(p, 4000) < std::chrono::hours{1} * 1.1);
  job_policy huge{.backoff_base = std::chrono::hours{1000000}, .backoff_cap = clock::duration::max()};
  CHECK(backoff_delay(huge, 200) > clock::duration::zero());
}

namespace {

struct slow_job {
  static job_policy policy() { return {.retries = 2, .timeout = 50ms}; }
  std::shared_ptr<journal> j;
  int succeed_at = -1; // attempt index that answers at once
  task<caf::expected<int>> attempt(attempt_scope& s) {
    ++j->attempts;
    j->attempt_ms.push_back(s.cx().clock().now_ms());
    if (static_cast<int>(s.attempt()) == succeed_at) co_return 7;
    co_await s.cx().sleep(1s);
    co_return 1;
  }
};

} // namespace

TEST_CASE("an attempt past its timeout is retried; a final timeout answers timed_out") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.await(must(rt.submit(slow_job{j})));
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), errc::timed_out));
  CHECK(j->attempts == 3);
  // 50 ms attempt, 10.65 ms backoff, 50 ms, 20.2 ms, then the last attempt.
  CHECK(j->attempt_ms == std::vector<int64_t>{0, 60, 130});
  auto k = std::make_shared<journal>();
  CHECK(must(rt.await(must(rt.submit(slow_job{k, 1})))) == 7);
  CHECK(k->attempts == 2);
}

TEST_CASE("cancelling a queued job removes it: its attempt never runs") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto a = must(rt.submit(timed_job{j, "a", 100}));
  auto b = must(rt.submit(timed_job{j, "b", 100}));
  rt.drain();
  CHECK(must(rt.lane_metrics_of("db")).queue_depth == 1);
  CHECK(must(rt.cancel(b)));
  auto rb = rt.await(b);
  REQUIRE_FALSE(rb);
  CHECK(is_cancellation(rb.error()));
  CHECK(must(rt.await(a)) == "a");
  CHECK(j->events == std::vector<std::string>{"start a", "end a"});
  auto m = must(rt.lane_metrics_of("db"));
  CHECK(m.withdrawn == 1);
  CHECK(m.queue_depth == 0);
  CHECK(m.running == 0);
}

TEST_CASE("cancelling a running job drops it at its await; the lane admits the next") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto a = must(rt.submit(timed_job{j, "a", 1000}));
  auto b = must(rt.submit(timed_job{j, "b", 10}));
  rt.advance(5ms);
  CHECK(must(rt.cancel(a)));
  auto ra = rt.await(a);
  REQUIRE_FALSE(ra);
  CHECK(is_cancellation(ra.error()));
  CHECK(must(rt.await(b)) == "b");
  CHECK(j->events == std::vector<std::string>{"start a", "start b", "end b"});
  CHECK(j->running == 0); // a's RAII ran
}

namespace {

/// Moves its cursor on each attempt: the job value is borrowed by one attempt at a time.
struct cursor_job {
  static job_policy policy() { return {.retries = 5}; }
  std::shared_ptr<journal> j;
  int cursor = 0;
  std::vector<std::string> endpoints{"a", "b", "c"};
  task<caf::expected<std::string>> attempt(attempt_scope&) {
    auto ep = endpoints[static_cast<size_t>(cursor)];
    j->events.push_back(ep);
    if (ep != "c") {
      ++cursor; // the next attempt tries the next endpoint
      co_return make_error(errc::not_found, "endpoint", ep);
    }
    co_return ep;
  }
};

} // namespace

TEST_CASE("a job's fields adapt across attempts: retries borrow the value one at a time") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  CHECK(must(rt.await(must(rt.submit(cursor_job{j})))) == "c");
  CHECK(j->events == std::vector<std::string>{"a", "b", "c"});
}

namespace {

struct forever_child {
  std::shared_ptr<journal> j;
  std::string name;
  task<caf::expected<int>> attempt(attempt_scope& s) {
    struct mark {
      journal* j;
      std::string name;
      ~mark() { j->events.push_back("child ended " + name); }
    } m{j.get(), name};
    j->events.push_back("child started " + name);
    co_await s.cx().sleep(1h);
    co_return 0;
  }
};

/// Submits a child that never ends, then fails (first attempt) or succeeds.
struct parent_job {
  static constexpr std::string_view lane = "mail";
  static job_policy policy() { return {.retries = 1}; }
  std::shared_ptr<journal> j;
  task<caf::expected<int>> attempt(attempt_scope& s) {
    auto child = s.submit(forever_child{j, std::to_string(s.attempt())});
    co_await s.cx().sleep(5ms);
    j->events.push_back("parent attempt " + std::to_string(s.attempt()) + " exits");
    if (s.attempt() == 0) co_return make_error(errc::not_found, "x", "first");
    co_return 1;
  }
};

} // namespace

TEST_CASE("an attempt's exit cancels and drains its children before the next attempt or the answer") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto h = must(rt.submit(parent_job{j}));
  CHECK(must(rt.await(h)) == 1);
  CHECK(j->events == std::vector<std::string>{
                         "child started 0", "parent attempt 0 exits", "child ended 0",
                         "child started 1", "parent attempt 1 exits", "child ended 1"});
}

namespace {

struct probe_job {
  std::shared_ptr<journal> j;
  task<caf::expected<int>> attempt(attempt_scope& s) {
    j->events.push_back("child on " + s.lane() + " cause " + s.cause().value_or("-"));
    co_return 1;
  }
};

/// Submits children on `child_lane`, awaiting them unless told not to.
struct lane_parent {
  std::shared_ptr<journal> j;
  std::string child_lane;
  bool await_child = true;
  task<caf::expected<int>> attempt(attempt_scope& s) {
    auto h = s.submit(submission{probe_job{j}}.on(child_lane));
    if (!await_child) co_return 5;
    auto r = co_await s.cx().await(h);
    if (!r) {
      // The refused handle still names the lane asked for and the cause it carries.
      j->events.push_back(std::string{name_of(static_cast<errc>(r.error().code()))} + " " +
                          h.lane() + " " +
                          (h.cause() == std::optional<std::string>{s.job_id()}
                               ? std::string{"parent-cause"}
                               : "cause " + h.cause().value_or("-")));
      co_return 0;
    }
    co_return *r;
  }
};

} // namespace

TEST_CASE("a child on its parent's own serial lane is refused; other lanes admit it") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  // Same serial lane: refused at once, the await answers self_lane.
  CHECK(must(rt.await(must(rt.submit(submission{lane_parent{j, "db"}}.on("db"))))) == 0);
  CHECK(j->events.back() == "self_lane db parent-cause");
  // Another serial lane: it queues there and runs.
  CHECK(must(rt.await(must(rt.submit(submission{lane_parent{j, "mail"}}.on("db"))))) == 1);
  // The same concurrent lane: admitted (width 2).
  CHECK(must(rt.await(must(rt.submit(submission{lane_parent{j, "export"}}.on("export"))))) == 1);
  // The default lane: at once.
  CHECK(must(rt.await(must(rt.submit(submission{lane_parent{j, "default"}}.on("db"))))) == 1);
  // A refused child nobody awaited fails the attempt at scope close.
  auto r = rt.await(must(rt.submit(submission{lane_parent{j, "db", false}}.on("db"))));
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), errc::self_lane));
  // An undeclared lane for a child: the same rule (the handle holds the refusal).
  auto u = rt.await(must(rt.submit(submission{lane_parent{j, "nope", false}}.on("db"))));
  REQUIRE_FALSE(u);
  CHECK(is(u.error(), errc::unknown_lane));
}

namespace {

struct cause_grandchild {
  std::shared_ptr<journal> j;
  task<caf::expected<int>> attempt(attempt_scope& s) {
    j->events.push_back("grandchild " + s.cause().value_or("-"));
    co_return 1;
  }
};

struct cause_child {
  std::shared_ptr<journal> j;
  std::optional<std::string> reroot;
  task<caf::expected<int>> attempt(attempt_scope& s) {
    j->events.push_back("child " + s.cause().value_or("-"));
    auto sub = submission{cause_grandchild{j}};
    auto h = reroot ? s.submit(std::move(sub).caused_by(*reroot)) : s.submit(std::move(sub));
    co_return co_await s.cx().await(h);
  }
};

struct cause_root {
  std::shared_ptr<journal> j;
  std::optional<std::string> reroot;
  task<caf::expected<int>> attempt(attempt_scope& s) {
    j->events.push_back("root " + s.cause().value_or("-") + " id " + s.job_id());
    auto h = s.submit(cause_child{j, reroot});
    auto r = co_await s.cx().await(h);
    // A detached submit carries no cause unless named.
    auto d = must(submit_detached(s.cx(), cause_grandchild{j}));
    (void)co_await s.cx().await(d);
    co_return r;
  }
};

} // namespace

TEST_CASE("caused_by flows to children and grandchildren until re-rooted") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto h = must(rt.submit(submission{cause_root{j, std::nullopt}}.caused_by("req-7")));
  CHECK(h.cause() == "req-7");
  CHECK(must(rt.await(h)) == 1);
  CHECK(j->events == std::vector<std::string>{"root req-7 id " + h.id(), "child req-7",
                                              "grandchild req-7", "grandchild -"});
  j->events.clear();
  auto g = must(rt.submit(submission{cause_root{j, "other"}}.caused_by("req-8")));
  CHECK(must(rt.await(g)) == 1);
  CHECK(j->events[2] == "grandchild other");
  // Without a cause, children are caused by their parent job.
  j->events.clear();
  auto k = must(rt.submit(cause_root{j, std::nullopt}));
  CHECK(must(rt.await(k)) == 1);
  CHECK(j->events[1] == "child " + k.id());
}

TEST_CASE("a job handle names its lane and cause after its runtime is gone") {
  // The handle of a job without a cause shares its lane's label (made once per lane name
  // for the process); one with a cause owns a label of its own. Both outlive the runtime.
  job_handle<int> plain, caused, copy;
  {
    auto rt = make_lanes_rt(standard_lanes());
    plain = must(rt.submit(submission{ok_job{1}}.on("export")));
    caused = must(rt.submit(submission{ok_job{2}}.on("db").caused_by("order-9")));
    copy = caused;
    CHECK(must(rt.await(plain)) == 2);
    CHECK(must(rt.await(caused)) == 4);
  }
  CHECK(plain.lane() == "export");
  CHECK_FALSE(plain.cause().has_value());
  CHECK(caused.lane() == "db");
  CHECK(caused.cause() == "order-9");
  caused = job_handle<int>{};
  CHECK(copy.cause() == "order-9"); // the label lives while a handle shares it
  CHECK(copy.lane() == "db");
  CHECK(caused.lane().empty()); // an empty handle names no lane
  CHECK_FALSE(caused.cause().has_value());
  // Two runtimes declaring a lane of the same name share its label.
  auto a = make_lanes_rt(standard_lanes());
  auto b = make_lanes_rt(standard_lanes());
  auto ha = must(a.submit(submission{ok_job{1}}.on("mail")));
  auto hb = must(b.submit(submission{ok_job{1}}.on("mail")));
  CHECK(&ha.lane() == &hb.lane());
  CHECK(must(a.await(ha)) == 2);
  CHECK(must(b.await(hb)) == 2);
}

namespace {

struct app_resources {
  std::string dsn;
};

struct resource_job {
  task<caf::expected<std::string>> attempt(attempt_scope& s) {
    auto r = s.resources<app_resources>();
    if (!r) co_return std::move(r.error());
    auto wrong = s.resources<int>();
    if (wrong || !is(wrong.error(), errc::wrong_type)) co_return std::string{"type not checked"};
    co_return (*r)->dsn;
  }
};

} // namespace

TEST_CASE("an attempt borrows the resources declared at boot, typed") {
  auto rt = runtime::builder{}.virtual_time().resources(app_resources{"sqlite://x"}).build();
  REQUIRE(rt);
  CHECK(must(rt->await(must(rt->submit(resource_job{})))) == "sqlite://x");
  auto bare = troupe_test::make_virtual_rt();
  auto r = bare.await(must(bare.submit(resource_job{})));
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), errc::not_found));
  CHECK(field_of(r.error()) == "resources");
}

TEST_CASE("a job submitted from a task is owned by it") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<int> {
    auto h = must(submit(cx, timed_job{j, "owned", 1000}));
    co_await cx.sleep(1ms);
    co_return 3; // ends without awaiting: the job is cancelled
  });
  CHECK(must(std::move(r)) == 3);
  rt.drain();
  CHECK(j->events == std::vector<std::string>{"start owned"});
  CHECK(j->running == 0);
  CHECK(must(rt.lane_metrics_of("db")).running == 0);
}

namespace {

/// Real time: counts how many attempts run at once (several threads).
struct rt_counter {
  std::atomic<int> running{0};
  std::atomic<int> max_running{0};
  std::atomic<int> done{0};
  std::mutex mtx;
  std::vector<int> starts;
  /// Counts job `n` as running until the returned guard goes (also when a cancel drops the
  /// attempt at an await: its frame's locals are destroyed).
  auto enter(int n) {
    {
      std::lock_guard<std::mutex> guard{mtx};
      starts.push_back(n);
    }
    auto now = ++running;
    auto seen = max_running.load();
    while (now > seen && !max_running.compare_exchange_weak(seen, now)) {
    }
    struct leave {
      rt_counter* c;
      ~leave() { --c->running; }
    };
    return leave{this};
  }
};

struct rt_job {
  static constexpr std::string_view lane = "export";
  std::shared_ptr<rt_counter> c;
  int n = 0;
  /// Yields once instead of sleeping 200 us (an await a cancel can drop it at, and a quick
  /// turnover).
  bool yield_only = false;
  task<caf::expected<int>> attempt(attempt_scope& s) {
    {
      auto running = c->enter(n);
      if (yield_only)
        co_await s.cx().yield_now();
      else
        co_await s.cx().sleep(std::chrono::microseconds{200});
    }
    ++c->done;
    co_return n;
  }
};

/// Real time, 2 threads: the default lane and a serial lane "db".
runtime real_time_db_runtime() {
  auto rt = runtime::builder{}
                .threads(2)
                .lanes({lane_decl::default_lane(), lane_decl::serial("db")})
                .build();
  REQUIRE(rt);
  return std::move(*rt);
}

/// Submits `rt_job{s, n}` on "db" from `c` and awaits it: its outcome, or -100.
task<int> submit_on_db(context& c, std::shared_ptr<rt_counter> s, int n) {
  auto h = submit(c, submission{rt_job{std::move(s), n}}.on("db"));
  if (!h) co_return -100;
  auto v = co_await c.await(*h);
  co_return v ? *v : -100;
}

struct rt_flaky {
  static job_policy policy() { return {.retries = 3, .backoff_base = 1ms, .backoff_cap = 2ms}; }
  std::shared_ptr<std::atomic<int>> tries;
  task<caf::expected<int>> attempt(attempt_scope&) {
    if (++*tries < 3) co_return make_error(errc::not_found, "x", "flaky");
    co_return 42;
  }
};

} // namespace

TEST_CASE("real time: lanes bound concurrency and admit in submission order; retries work") {
  for (int round = 0; round < 20; ++round) {
    auto rt = runtime::builder{}
                  .threads(2)
                  .lanes({lane_decl::default_lane(), lane_decl::concurrent("export", 2),
                          lane_decl::serial("db")})
                  .build();
    REQUIRE(rt);
    auto c = std::make_shared<rt_counter>();
    auto s = std::make_shared<rt_counter>();
    auto sums = rt->run([c, s](context& cx) -> task<int> {
      std::vector<job_handle<int>> hs;
      for (int i = 0; i < 12; ++i)
        hs.push_back(must(submit(cx, rt_job{c, i})));
      for (int i = 0; i < 6; ++i)
        hs.push_back(must(submit(cx, submission{rt_job{s, i}}.on("db"))));
      int sum = 0;
      for (auto& h : hs)
        sum += must(co_await cx.await(h));
      co_return sum;
    });
    REQUIRE(sums);
    CHECK(*sums == 66 + 15);
    CHECK(c->max_running.load() <= 2);
    CHECK(c->done.load() == 12);
    CHECK(s->max_running.load() == 1);
    // FIFO in submission order, whatever threads the jobs' tasks run on: the submitter
    // reserves each job's place before the job starts.
    CHECK(s->starts == std::vector<int>{0, 1, 2, 3, 4, 5});
    auto all = c->starts;
    std::sort(all.begin(), all.end());
    CHECK(all == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
    auto tries = std::make_shared<std::atomic<int>>(0);
    CHECK(must(rt->await(must(rt->submit(rt_flaky{tries})))) == 42);
    CHECK(tries->load() == 3);
  }
}

TEST_CASE("a graceful cancel of a queued job: it never runs, and its place goes to the next") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto a = must(rt.submit(timed_job{j, "a", 100}));
  auto b = must(rt.submit(timed_job{j, "b", 100}));
  auto c = must(rt.submit(timed_job{j, "c", 10}));
  rt.advance(5ms);
  CHECK(must(rt.lane_metrics_of("db")).queue_depth == 2);
  CHECK(must(rt.cancel_graceful(b, std::chrono::seconds{1})));
  auto rb = rt.await(b);
  REQUIRE_FALSE(rb);
  CHECK(is_cancellation(rb.error()));
  CHECK(rt.clock().now().time_since_epoch() < 100ms); // at once, not when a ends
  CHECK(must(rt.await(c)) == "c");
  CHECK(must(rt.await(a)) == "a");
  CHECK(j->events == std::vector<std::string>{"start a", "end a", "start c", "end c"});
  auto m = must(rt.lane_metrics_of("db"));
  CHECK(m.withdrawn == 1);
  CHECK(m.admitted == 2);
  CHECK(m.queue_depth == 0);
}

TEST_CASE("a job submitted under a deadline waits for its lane only until the deadline") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto a = must(rt.submit(timed_job{j, "a", 100}));
  auto r = rt.run([j](context& cx) -> task<std::string> {
    auto d = co_await cx.deadline(30ms, [j](context& c) -> task<caf::expected<std::string>> {
      auto h = submit(c, timed_job{j, "b", 10});
      if (!h) co_return std::move(h.error());
      co_return co_await c.await(*h);
    });
    auto at = std::chrono::duration_cast<std::chrono::milliseconds>(
                  cx.now().time_since_epoch()).count();
    co_return std::string{d ? "value" : name_of(static_cast<errc>(d.error().code()))} + " at " +
        std::to_string(at);
  });
  REQUIRE(r);
  CHECK(*r == "deadline_exceeded at 30");
  CHECK(must(rt.await(a)) == "a");
  CHECK(j->events == std::vector<std::string>{"start a", "end a"});
  CHECK(must(rt.lane_metrics_of("db")).queue_depth == 0);
}

TEST_CASE("real time: a job submitted before a task that submits another is admitted first "
          "(50 rounds)") {
  // The submitter's ticket goes to the lane before anything else leaves it (here the
  // spawn of a deadline's body, which runs on the other thread and submits later): that
  // submission queues behind it.
  auto rt = real_time_db_runtime();
  for (int round = 0; round < 50; ++round) {
    auto s = std::make_shared<rt_counter>();
    auto r = rt.run([s](context& cx) -> task<int> {
      auto first = must(submit(cx, submission{rt_job{s, 1}}.on("db")));
      auto second = co_await cx.deadline(10s, [s](context& c) -> task<caf::expected<int>> {
        auto h = submit(c, submission{rt_job{s, 2}}.on("db"));
        if (!h) co_return std::move(h.error());
        co_return co_await c.await(*h);
      });
      auto one = co_await cx.await(first);
      co_return (one ? *one : -100) + (second && *second ? **second : -100);
    });
    REQUIRE(r);
    REQUIRE(*r == 3);
    REQUIRE(s->starts == std::vector<int>{1, 2});
  }
}

TEST_CASE("lane metrics: a job stopped before its attempt ran is withdrawn, never admitted") {
  // Cancelled right after its submission: before or after its reservation reached the lane,
  // and before or after the lane's grant reached it (`queued`: behind a running job, so the
  // reservation waits in the lane). Each was withdrawn, none ran or counts as admitted.
  for (int variant = 0; variant < 4; ++variant) {
    bool forced = variant % 2 == 0;
    bool queued = variant >= 2;
    auto rt = make_lanes_rt(standard_lanes());
    auto j = std::make_shared<journal>();
    auto r = rt.run([j, forced, queued](context& cx) -> task<int> {
      std::optional<job_handle<std::string>> blocker;
      if (queued) {
        auto b = submit(cx, timed_job{j, "blocker", 1000});
        if (!b) co_return -1;
        blocker = std::move(*b);
      }
      for (int i = 0; i < 20; ++i) {
        auto h = submit(cx, timed_job{j, "x" + std::to_string(i), 1});
        if (!h) co_return -1;
        if (forced)
          (void)co_await cx.cancel(*h);
        else
          (void)co_await cx.cancel_graceful(*h, std::chrono::seconds{1});
        if (!queued && i % 5 == 0) // and some that run between them
          if (auto ok = submit(cx, timed_job{j, "y" + std::to_string(i), 1}); ok)
            (void)co_await cx.await(*ok);
      }
      if (blocker) (void)co_await cx.await(*blocker);
      co_return 0;
    });
    REQUIRE(r);
    CHECK(*r == 0);
    auto ran = queued ? 1 : 4;
    CHECK(j->attempts == ran);
    auto m = must(rt.lane_metrics_of("db"));
    CHECK(m.admitted == static_cast<uint64_t>(ran));
    CHECK(m.withdrawn == 20);
    CHECK(m.queue_depth == 0);
    CHECK(m.running == 0);
  }
}

TEST_CASE("real time: lane metrics count only the jobs that ran as admitted") {
  // Two threads: a cancel races the reservation and the grant in every order.
  auto rt = runtime::builder{}.threads(2).lanes(standard_lanes()).build();
  REQUIRE(rt);
  auto j = std::make_shared<journal>();
  auto r = rt->run([j](context& cx) -> task<int> {
    int ran = 0;
    for (int i = 0; i < 300; ++i) {
      auto h = submit(cx, timed_job{j, "x", 0});
      if (!h) co_return -1;
      if (i % 3 == 0) {
        if (co_await cx.await(*h)) ++ran;
      } else {
        (void)co_await cx.cancel(*h);
      }
    }
    co_return ran;
  });
  REQUIRE(r);
  CHECK(*r == 100);
  auto m = must(rt->lane_metrics_of("db"));
  CHECK(m.admitted == static_cast<uint64_t>(j->attempts)); // cancelled ones may have run
  CHECK(m.admitted + m.withdrawn == 300);
  CHECK(m.queue_depth == 0);
  CHECK(m.running == 0);
}

namespace {

std::atomic<int> tickets_granted{0};
void count_grant(const std::shared_ptr<detail::job_ticket>&) noexcept { ++tickets_granted; }

/// Counts the tickets the lanes grant while it lives (the granted hook), from zero.
struct grant_counter {
  grant_counter() {
    tickets_granted = 0;
    detail::set_ticket_granted_hook(count_grant);
  }
  grant_counter(const grant_counter&) = delete;
  grant_counter& operator=(const grant_counter&) = delete;
  ~grant_counter() { detail::set_ticket_granted_hook(nullptr); }
  /// Holds the calling thread (a body that does not suspend gives no go) until `n` tickets
  /// were granted, 10 s at most; returns whether they were.
  static bool hold_until(int n) {
    auto until = std::chrono::steady_clock::now() + 10s;
    while (tickets_granted.load() < n && std::chrono::steady_clock::now() < until) {
    }
    return tickets_granted.load() >= n;
  }
};

} // namespace

TEST_CASE("real time: a long run of submissions reaches its lane before the body suspends; no "
          "job starts before the go, and one cancelled before then never runs") {
  // A body holds at most 256 tickets before they go to their lane: the lane queues them and
  // grants the first on the other thread while the body still submits. Their tasks wait
  // for the body's suspension all the same, so a cancel the body sends first wins, also
  // for the job its lane admitted already.
  grant_counter grants;
  auto rt = real_time_db_runtime();
  auto s = std::make_shared<rt_counter>();
  auto r = rt.run([s](context& cx) -> task<int> {
    std::vector<job_handle<int>> hs;
    for (int i = 0; i < 600; ++i)
      hs.push_back(must(submit(cx, submission{rt_job{s, i, true}}.on("db"))));
    // The body keeps its thread (no suspension, so no go) until the lane, on the other
    // thread, has granted the first ticket.
    bool granted = grant_counter::hold_until(1);
    // Then 50 ms more: a task spawned at the grant (the go given too early) would start
    // its attempt on the other thread meanwhile.
    bool started = false;
    for (auto more = std::chrono::steady_clock::now() + 50ms;
         !started && std::chrono::steady_clock::now() < more;) {
      std::lock_guard<std::mutex> lock{s->mtx};
      started = !s->starts.empty();
    }
    (void)co_await cx.cancel(hs[0]);   // granted (maybe admitted), no task yet: withdrawn
    (void)co_await cx.cancel(hs[300]); // queued: withdrawn
    int sum = 0;
    int cancelled = 0;
    for (auto& h : hs) {
      auto v = co_await cx.await(h);
      if (v)
        sum += *v;
      else if (is_cancellation(v.error()))
        ++cancelled;
    }
    if (!granted) co_return -1;
    if (started) co_return -2;
    co_return cancelled == 2 ? sum : -3;
  });
  REQUIRE(r);
  CHECK(*r == 599 * 600 / 2 - 300);
  std::vector<int> expected;
  for (int i = 1; i < 600; ++i)
    if (i != 300) expected.push_back(i);
  {
    std::lock_guard<std::mutex> lock{s->mtx};
    CHECK(s->starts == expected); // a serial lane: in submission order, the cancelled never
  }
  auto m = must(rt.lane_metrics_of("db"));
  CHECK(m.admitted == 598);
  CHECK(m.withdrawn == 2);
  CHECK(m.queue_depth == 0);
}

TEST_CASE("real time: a body that returns without awaiting its jobs withdraws them, also the "
          "ones its lane admitted already") {
  // 600 jobs on the unbounded default lane: their tickets reach it while the body still
  // submits, and it admits each as it comes. The body returns without suspending: the jobs
  // get no go, so none runs; each is withdrawn and its permit goes back unused.
  grant_counter grants;
  auto rt = real_time_db_runtime();
  auto s = std::make_shared<rt_counter>();
  auto r = rt.run([s](context& cx) -> task<int> {
    for (int i = 0; i < 600; ++i)
      (void)must(submit(cx, submission{rt_job{s, i, true}}.on("default")));
    co_return grant_counter::hold_until(256) ? 0 : -1;
  });
  REQUIRE(r);
  CHECK(*r == 0); // the lane had admitted the first batch before the body returned
  {
    std::lock_guard<std::mutex> lock{s->mtx};
    CHECK(s->starts.empty());
  }
  auto m = must(rt.lane_metrics_of("default"));
  CHECK(m.admitted == 0);
  CHECK(m.withdrawn == 600);
  CHECK(m.running == 0);
}

TEST_CASE("a queued job submitted from a task is a record, not an actor, until its lane admits it") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto& sys = rt.system();
  auto before = sys.registry().running();
  auto r = rt.run([j, &sys, before](context& cx) -> task<std::string> {
    std::vector<job_handle<std::string>> hs;
    for (int i = 0; i < 1000; ++i)
      hs.push_back(must(submit(cx, timed_job{j, "q" + std::to_string(i), 1})));
    CHECK_FALSE(hs.front().actor()); // its task does not exist yet
    co_await cx.sleep(0ms);          // the go: the first job's task is spawned now
    // One job runs on the serial lane; 999 wait as records: a handful of actors, not 1000.
    auto live = sys.registry().running() - before;
    auto m = must(co_await lane_metrics_of(cx, "db"));
    CHECK(m.queue_depth == 999);
    CHECK(m.running == 1);
    std::string out;
    for (auto& h : hs) {
      auto v = co_await cx.await(h);
      if (!v) co_return "failed";
    }
    co_return std::to_string(live);
  });
  REQUIRE(r);
  CHECK(std::stoi(*r) <= 5);
  CHECK(j->attempts == 1000);
  auto m = must(rt.lane_metrics_of("db"));
  CHECK(m.admitted == 1000);
  CHECK(m.queue_depth == 0);
  CHECK(j->events[0] == "start q0");
  CHECK(j->events[1998] == "start q999"); // FIFO
}

TEST_CASE("a queued job cancelled through a handle another task holds never runs") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<std::string> {
    auto a = must(submit(cx, timed_job{j, "a", 50}));
    auto b = must(submit(cx, timed_job{j, "b", 10}));
    auto c = must(submit(cx, timed_job{j, "c", 10}));
    // Another task cancels b (queued behind a): withdrawn at once, its awaiter answered.
    auto killer = cx.spawn([b](context& k) -> task<bool> {
      auto x = co_await k.cancel(b);
      co_return x && *x;
    });
    auto k = co_await cx.await(killer);
    auto rb = co_await cx.await(b);
    auto rc = co_await cx.await(c);
    auto ra = co_await cx.await(a);
    auto again = co_await cx.cancel(b); // stopped before: nothing left to stop
    co_return std::string{k && *k ? "stopped" : "not stopped"} + " " +
        (rb ? std::string{"ran"} : std::string{name_of(static_cast<errc>(rb.error().code()))}) +
        " " + (rc ? *rc : "-") +
        " " + (ra ? *ra : "-") + " " + (again && !*again ? "false" : "?");
  });
  REQUIRE(r);
  CHECK(*r == "stopped cancelled c a false");
  CHECK(j->events == std::vector<std::string>{"start a", "end a", "start c", "end c"});
  auto m = must(rt.lane_metrics_of("db"));
  CHECK(m.admitted == 2);
  CHECK(m.withdrawn == 1);
  CHECK(m.queue_depth == 0);
}

namespace {

/// The "db" lane after a test: `withdrawn` jobs left without running, none queued or running.
void check_db_settled(runtime& rt, uint64_t withdrawn) {
  auto m = must(rt.lane_metrics_of("db"));
  CHECK(m.withdrawn == withdrawn);
  CHECK(m.queue_depth == 0);
  CHECK(m.running == 0);
}

/// The same, and `admitted` jobs ran.
void check_db_settled(runtime& rt, uint64_t withdrawn, uint64_t admitted) {
  check_db_settled(rt, withdrawn);
  CHECK(must(rt.lane_metrics_of("db")).admitted == admitted);
}

} // namespace

TEST_CASE("a task that ends withdraws its queued jobs and joins its running one") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<int> {
    for (int i = 0; i < 50; ++i)
      (void)must(submit(cx, timed_job{j, "w" + std::to_string(i), 100}));
    co_await cx.sleep(10ms);
    co_return 1; // 1 running (cancelled at its await), 49 queued (withdrawn: never run)
  });
  CHECK(must(std::move(r)) == 1);
  rt.drain();
  CHECK(j->events == std::vector<std::string>{"start w0"});
  CHECK(j->running == 0);
  check_db_settled(rt, 49);
}

TEST_CASE("jobs withdrawn before their lane saw them never count in its queue depth") {
  // The task submits 10 jobs and fails in the same activation: every ticket is withdrawn
  // while its message to the lane is still on its way.
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<int> {
    for (int i = 0; i < 10; ++i)
      (void)must(submit(cx, timed_job{j, "x" + std::to_string(i), 100}));
    throw task_error{make_error(errc::not_found, "body", "gone before any job was queued")};
  });
  CHECK_FALSE(r);
  rt.drain();
  CHECK(j->events.empty());
  auto m = must(rt.lane_metrics_of("db"));
  CHECK(m.max_queue_depth == 0);
  CHECK(m.admitted == 0);
  check_db_settled(rt, 10);
}

TEST_CASE("a job submitted by a destructor at its submitter's end is settled, never stranded") {
  // The body's frame is destroyed at the task's end; an object in it submits a job then.
  // The ticket is withdrawn with the task's other jobs (an owned job not awaited is
  // cancelled at its owner's end): it never waits forever on the lane.
  for (bool fail : {false, true}) {
    auto rt = make_lanes_rt(standard_lanes());
    auto j = std::make_shared<journal>();
    auto handle = std::make_shared<std::optional<troupe::job_handle<std::string>>>();
    auto r = rt.run([j, handle, fail](context& cx) -> task<int> {
      struct submit_at_end {
        context& cx;
        std::shared_ptr<journal> j;
        std::shared_ptr<std::optional<troupe::job_handle<std::string>>> out;
        ~submit_at_end() {
          auto h = submit(cx, timed_job{j, "late", 5});
          if (h) *out = std::move(*h);
        }
      } late{cx, j, handle};
      (void)must(submit(cx, timed_job{j, "first", 5}));
      co_await cx.sleep(1ms);
      if (fail) throw task_error{make_error(errc::not_found, "body", "ends with an error")};
      co_return 1;
    });
    CHECK(static_cast<bool>(r) == !fail);
    rt.drain();
    REQUIRE(handle->has_value());
    // Owned by a task that ended: withdrawn, answering cancelled.
    auto outcome = rt.run([h = **handle](context& cx) -> task<std::string> {
      auto v = co_await cx.await(h);
      co_return v ? "ran " + *v : std::string{name_of(static_cast<errc>(v.error().code()))};
    });
    REQUIRE(outcome);
    CHECK(*outcome == "cancelled"); // an owned job not awaited is cancelled at the owner's end
    CHECK(j->events == std::vector<std::string>{"start first"}); // cancelled at its sleep
    auto m = must(rt.lane_metrics_of("db"));
    CHECK(m.withdrawn == 1);
    CHECK(m.queue_depth == 0);
    CHECK(m.running == 0);
    CHECK(j->running == 0);
  }
}

TEST_CASE("jobs submitted in a scope: queued ones are withdrawn when the scope fails") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<std::string> {
    auto s = co_await cx.scope([j](context& sc) -> task<int> {
      for (int i = 0; i < 5; ++i)
        (void)must(submit(sc, timed_job{j, "s" + std::to_string(i), 100}));
      co_await sc.sleep(5ms);
      throw task_error{make_error(errc::not_found, "scope", "boom")};
    });
    co_return s ? std::string{"value"} : name_of(static_cast<errc>(s.error().code()));
  });
  REQUIRE(r);
  CHECK(*r == "not_found");
  rt.drain();
  CHECK(j->events == std::vector<std::string>{"start s0"});
  check_db_settled(rt, 4);
}

TEST_CASE("a joining scope waits for its queued jobs to run") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<int> {
    auto s = co_await cx.scope(
        [j](context& sc) -> task<int> {
          for (int i = 0; i < 3; ++i)
            (void)must(submit(sc, timed_job{j, "z" + std::to_string(i), 10}));
          co_return 7; // returns at once: the scope joins its three jobs
        },
        {.on_return = scope_exit::join});
    co_return s ? *s : -1;
  });
  CHECK(must(std::move(r)) == 7);
  CHECK(j->attempts == 3);
  CHECK(j->running == 0);
  CHECK(rt.clock().now().time_since_epoch() >= 30ms);
}

TEST_CASE("a scope's jobs follow the scope's await rule: an unawaited job's failure fails the "
          "scope, an awaited one's is the await's value, ended jobs nobody awaits change nothing") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto once = [](failing_job f) { return submission{std::move(f)}.under({.retries = 0}); };
  auto r = rt.run([j, once](context& cx) -> task<std::string> {
    // Jobs that succeed, unawaited, in a joining scope: the scope's own value.
    auto quiet = co_await cx.scope(
        [](context& sc) -> task<int> {
          for (int i = 0; i < 3; ++i)
            (void)must(submit(sc, ok_job{i}));
          co_await sc.sleep(5ms); // they end before the body returns
          co_return 7;
        },
        {.on_return = scope_exit::join});
    // A failing job the body awaits: its error is the await's value, not the scope's.
    auto awaited = co_await cx.scope([j, once](context& sc) -> task<int> {
      auto h = must(submit(sc, once(failing_job{j})));
      auto v = co_await sc.await(h);
      co_return v ? -1 : static_cast<int>(v.error().code());
    });
    // A failing job nobody awaits: it fails the scope with its own error.
    auto unawaited = co_await cx.scope([j, once](context& sc) -> task<int> {
      (void)must(submit(sc, once(failing_job{j})));
      co_await sc.sleep(1s);
      co_return 5;
    });
    co_return std::to_string(quiet ? *quiet : -1) + "|" +
              std::to_string(awaited ? *awaited : -1) + "|" +
              (unawaited ? std::to_string(*unawaited)
                         : std::string{name_of(static_cast<errc>(unawaited.error().code()))});
  });
  CHECK(must(std::move(r)) ==
        "7|" + std::to_string(static_cast<int>(errc::not_found)) + "|not_found");
  CHECK(j->attempts == 2);
}

TEST_CASE("stopping the runtime fails the jobs still queued as records") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto seen = std::make_shared<std::vector<std::string>>();
  auto owner = rt.spawn([j, seen](context& cx) -> task<int> {
    std::vector<job_handle<std::string>> hs;
    for (int i = 0; i < 3; ++i)
      hs.push_back(must(submit(cx, timed_job{j, "t" + std::to_string(i), 50})));
    for (auto& h : hs) {
      auto v = co_await cx.await(h);
      seen->push_back(v ? *v : std::string{name_of(static_cast<errc>(v.error().code()))} + " " +
                                   field_of(v.error()));
    }
    co_return 0;
  });
  REQUIRE(owner);
  rt.advance(10ms);
  rt.stop();
  // The running job finished within its deadline; the queued ones never ran: the closed
  // lane failed them as it fails a waiting acquire.
  CHECK(j->events == std::vector<std::string>{"start t0", "end t0"});
  CHECK(*seen == std::vector<std::string>{"t0", "cancelled lane", "cancelled lane"});
}

TEST_CASE("a job whose owner ends just as its lane admits it counts as withdrawn, not admitted") {
  // a's end releases the lane, which admits b at once (b's task is spawned holding the
  // permit); a's owner then returns without awaiting b, and its end stops b before b's body
  // ran: the permit goes back unused.
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<int> {
    auto a = must(submit(cx, timed_job{j, "a", 10}));
    auto b = must(submit(cx, timed_job{j, "b", 10}));
    (void)co_await cx.await(a);
    co_return 0; // b is not awaited: the owner's end cancels it
  });
  REQUIRE(r);
  rt.drain();
  CHECK(j->attempts == 1);
  check_db_settled(rt, 1, 1);
}

TEST_CASE("a job submitted under a deadline and stopped before its body ran on a free lane "
          "counts as withdrawn, not admitted") {
  // Under a deadline the job's task reserves its place (the free lane grants it at once and
  // keeps the permit for the task's acquire); the cancel comes before the task's first run,
  // so the acquire never comes: the kept permit goes back unused.
  for (bool graceful : {false, true}) {
    auto rt = make_lanes_rt(standard_lanes());
    auto j = std::make_shared<journal>();
    auto r = rt.run([j, graceful](context& cx) -> task<bool> {
      auto d = co_await cx.deadline(1s, [j, graceful](context& c) -> task<caf::expected<bool>> {
        auto h = must(submit(c, timed_job{j, "x", 10}));
        auto k = graceful ? co_await c.cancel_graceful(h, std::chrono::seconds{1})
                          : co_await c.cancel(h);
        auto v = co_await c.await(h);
        co_return k && *k && !v && is_cancellation(v.error());
      });
      co_return d && *d;
    });
    REQUIRE(r);
    CHECK(*r);
    rt.drain();
    CHECK(j->attempts == 0);
    check_db_settled(rt, 1, 0);
    // The lane is whole: the next job runs.
    CHECK(must(rt.await(must(rt.submit(timed_job{j, "y", 1})))) == "y");
    CHECK(must(rt.lane_metrics_of("db")).admitted == 1);
  }
}

TEST_CASE("a job that never waits for its lane does not count in the lane's maximum queue "
          "depth") {
  auto rt = make_lanes_rt(standard_lanes());
  CHECK(must(rt.await(must(rt.submit(ok_job{21})))) == 42);
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<int> {
    auto a = must(submit(cx, timed_job{j, "a", 1})); // the db lane is free: no wait
    co_return (co_await cx.await(a)) ? 0 : 1;
  });
  CHECK(must(std::move(r)) == 0);
  CHECK(must(rt.lane_metrics_of("default")).max_queue_depth == 0);
  auto m = must(rt.lane_metrics_of("db"));
  CHECK(m.max_queue_depth == 0);
  CHECK(m.admitted == 1);
}

TEST_CASE("a job cancelled after its lane spawned its task but before that task ran never runs") {
  // The yield lets the lane admit the ticket (its task is spawned then, the go being in)
  // before the owner cancels: the cancel reaches the task ahead of its first activation.
  for (bool graceful : {false, true}) {
    auto rt = make_lanes_rt(standard_lanes());
    auto j = std::make_shared<journal>();
    auto r = rt.run([j, graceful](context& cx) -> task<bool> {
      auto h = must(submit(cx, timed_job{j, "x", 10}));
      co_await cx.yield_now();
      auto c = graceful ? co_await cx.cancel_graceful(h, std::chrono::seconds{1})
                        : co_await cx.cancel(h);
      auto v = co_await cx.await(h);
      co_return c && *c && !v && is_cancellation(v.error());
    });
    REQUIRE(r);
    CHECK(*r);
    CHECK(j->attempts == 0);
    rt.drain();
    check_db_settled(rt, 1, 0);
  }
}

namespace {

struct slow_detached {
  static job_policy policy() { return {.timeout = std::chrono::seconds{30}}; }
  std::shared_ptr<journal> j;
  task<caf::expected<int>> attempt(attempt_scope& s) {
    j->events.push_back("slow start");
    co_await s.cx().sleep(std::chrono::seconds{5});
    j->events.push_back("slow end");
    co_return 1;
  }
};

struct detaching_job {
  static job_policy policy() { return {.timeout = std::chrono::seconds{2}}; }
  std::shared_ptr<journal> j;
  task<caf::expected<int>> attempt(attempt_scope& s) {
    auto d = submit_detached(s.cx(), slow_detached{j});
    if (!d) co_return d.error();
    co_return 0;
  }
};

} // namespace

TEST_CASE("a detached job is not bounded by its submitter's deadline (the runtime owns it)") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<std::string> {
    must(co_await cx.await(must(submit(cx, detaching_job{j}))));
    co_await cx.sleep(std::chrono::seconds{10});
    std::string out;
    for (auto& e : j->events)
      out += e + ";";
    co_return out;
  });
  REQUIRE(r);
  CHECK(*r == "slow start;slow end;"); // before: cancelled at 2 s, timed_out
}

namespace {

/// An attempt that absorbs a cancellation (it catches it) and fails.
struct absorbing_job {
  static job_policy policy() { return {.retries = 3}; }
  std::shared_ptr<journal> j;
  task<caf::expected<int>> attempt(attempt_scope& s) {
    ++j->attempts;
    try {
      co_await s.cx().sleep(std::chrono::hours{1});
    } catch (const troupe::task_cancelled&) {
      co_return make_error(errc::not_found, "x", "interrupted");
    }
    co_return 1;
  }
};

} // namespace

TEST_CASE("a graceful cancel that an attempt absorbs stops the job: no backoff, no retry") {
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<std::string> {
    auto h = must(submit(cx, absorbing_job{j}));
    co_await cx.sleep(1ms);
    co_await cx.cancel_graceful(h, std::chrono::hours{2});
    auto v = co_await cx.await(h);
    co_return std::string{v ? "value" : is_cancellation(v.error()) ? "cancelled" : "error"} +
        " " + std::to_string(j->attempts) + " at " + std::to_string(troupe_test::ms(cx));
  });
  REQUIRE(r);
  CHECK(*r == "cancelled 1 at 1"); // before: a second attempt ran until the grace forced it
}

namespace {

/// An attempt that absorbs a cancellation and still returns a value.
template <bool Timeout>
struct absorbing_value_job {
  static job_policy policy() {
    return Timeout ? job_policy{.timeout = std::chrono::hours{10}} : job_policy{};
  }
  task<caf::expected<int>> attempt(attempt_scope& s) {
    try {
      co_await s.cx().sleep(std::chrono::hours{1});
    } catch (const troupe::task_cancelled&) {
      co_return 7;
    }
    co_return 1;
  }
};

template <bool Timeout>
std::string absorbed_value_outcome() {
  auto rt = make_lanes_rt(standard_lanes());
  auto r = rt.run([](context& cx) -> task<std::string> {
    auto h = must(submit(cx, absorbing_value_job<Timeout>{}));
    co_await cx.sleep(1ms);
    co_await cx.cancel_graceful(h, std::chrono::hours{2});
    auto v = co_await cx.await(h);
    co_return v ? std::to_string(*v) : is_cancellation(v.error()) ? "cancelled" : "error";
  });
  REQUIRE(r);
  return *r;
}

} // namespace

TEST_CASE("a gracefully cancelled job answers cancelled with a timeout or without") {
  CHECK(absorbed_value_outcome<true>() == "cancelled");
  CHECK(absorbed_value_outcome<false>() == "cancelled"); // before: 7
}

TEST_CASE("submissions made without suspending are admitted in submission order on each lane") {
  // 300 jobs on two serial lanes, interleaved, with a detached job (reserved on its own
  // path, not as a ticket) in the middle, all in one activation: each lane admits in
  // submission order.
  auto rt = make_lanes_rt(standard_lanes());
  auto db = std::make_shared<journal>();
  auto mail = std::make_shared<journal>();
  auto r = rt.run([db, mail](context& cx) -> task<int> {
    std::vector<job_handle<std::string>> hs;
    for (int i = 0; i < 300; ++i) {
      auto n = std::to_string(i);
      if (i == 150) {
        auto d = submit_detached(cx, timed_job{db, "detached", 1});
        if (!d) co_return -1;
        hs.push_back(std::move(*d));
      }
      auto a = submit(cx, timed_job{db, "d" + n, 1});
      auto b = submit(cx, submission{timed_job{mail, "m" + n, 1}}.on("mail"));
      if (!a || !b) co_return -1;
      hs.push_back(std::move(*a));
      hs.push_back(std::move(*b));
    }
    for (auto& h : hs)
      if (!co_await cx.await(h)) co_return -2;
    co_return 0;
  });
  CHECK(must(std::move(r)) == 0);
  std::vector<std::string> want_db, want_mail;
  for (int i = 0; i < 300; ++i) {
    if (i == 150) want_db.push_back("start detached");
    want_db.push_back("start d" + std::to_string(i));
    want_mail.push_back("start m" + std::to_string(i));
  }
  auto starts = [](const journal& j) {
    std::vector<std::string> xs;
    for (auto& e : j.events)
      if (e.rfind("start ", 0) == 0) xs.push_back(e);
    return xs;
  };
  CHECK(starts(*db) == want_db);
  CHECK(starts(*mail) == want_mail);
  auto m = must(rt.lane_metrics_of("db"));
  CHECK(m.admitted == 301);
  CHECK(m.max_queue_depth == 300); // the first ran at once
  CHECK(m.queue_depth == 0);
}

TEST_CASE("tickets of one run go to their lane together, ahead of what the submitter does next") {
  // 100 jobs on one serial lane in one activation (one sy_ticket message), a detached job
  // (its own reservation, sent at once), 100 more: the detached job's reservation must not
  // overtake the first 100 tickets, which the submitter still holds when it submits it.
  auto rt = make_lanes_rt(standard_lanes());
  auto db = std::make_shared<journal>();
  auto r = rt.run([db](context& cx) -> task<int> {
    std::vector<job_handle<std::string>> hs;
    for (int i = 0; i < 200; ++i) {
      if (i == 100) {
        auto d = submit_detached(cx, timed_job{db, "detached", 1});
        if (!d) co_return -1;
        hs.push_back(std::move(*d));
      }
      auto a = submit(cx, timed_job{db, "d" + std::to_string(i), 1});
      if (!a) co_return -1;
      hs.push_back(std::move(*a));
    }
    // Two cancels in the same turn (a queued ticket is withdrawn without suspending): their
    // sy_ticket_gone reaches the lane before the tickets; each is counted once and never
    // enters the queue depth.
    if (!must(co_await cx.cancel(hs[150])) || !must(co_await cx.cancel(hs[160]))) co_return -3;
    int cancelled = 0;
    for (auto& h : hs) {
      auto v = co_await cx.await(h);
      if (!v) {
        if (!is_cancellation(v.error())) co_return -2;
        ++cancelled;
      }
    }
    co_return cancelled;
  });
  CHECK(must(std::move(r)) == 2);
  std::vector<std::string> want;
  for (int i = 0; i < 200; ++i) {
    if (i == 100) want.push_back("start detached");
    if (i != 149 && i != 159) want.push_back("start d" + std::to_string(i));
  }
  std::vector<std::string> starts;
  for (auto& e : db->events)
    if (e.rfind("start ", 0) == 0) starts.push_back(e);
  CHECK(starts == want);
  auto m = must(rt.lane_metrics_of("db"));
  CHECK(m.admitted == 199);
  CHECK(m.withdrawn == 2);
  CHECK(m.queue_depth == 0);
  CHECK(m.max_queue_depth == 198); // the first ran at once; the two withdrawn never queued
}

TEST_CASE("real time: what a submitter starts or wakes after its submits queues behind them "
          "(50 rounds)") {
  // In one activation the task submits 3 jobs, then wakes a waiting task through a channel,
  // and it has spawned a child before the submits; both submit a job of their own on the
  // same serial lane once they run (on the other thread). The 3 tickets travel together when
  // the submitter suspends or hands the value over: both later jobs queue behind them.
  auto rt = real_time_db_runtime();
  for (int round = 0; round < 50; ++round) {
    auto s = std::make_shared<rt_counter>();
    auto r = rt.run([s](context& cx) -> task<int> {
      auto ch = must(co_await open_channel<int>(cx, "", 1));
      auto woken = cx.spawn([s, ch](context& c) -> task<int> {
        auto x = co_await ch.receive(c);
        if (!x) co_return -100;
        co_return co_await submit_on_db(c, s, *x);
      });
      (void)co_await cx.sleep(std::chrono::microseconds{100}); // the receiver waits
      auto child = cx.spawn([s](context& c) -> task<int> { return submit_on_db(c, s, 5); });
      std::vector<job_handle<int>> hs;
      for (int i = 1; i <= 3; ++i)
        hs.push_back(must(submit(cx, submission{rt_job{s, i}}.on("db"))));
      if (!co_await ch.send(cx, 4)) co_return -1;
      int sum = 0;
      for (auto& h : hs)
        if (auto v = co_await cx.await(h)) sum += *v;
      for (auto* t : {&woken, &child})
        if (auto v = co_await cx.await(*t)) sum += *v;
      co_return sum;
    });
    REQUIRE(r);
    CHECK(*r == 1 + 2 + 3 + 4 + 5);
    std::lock_guard<std::mutex> guard{s->mtx};
    REQUIRE(s->starts.size() == 5);
    CHECK(std::vector<int>(s->starts.begin(), s->starts.begin() + 3) == std::vector<int>{1, 2, 3});
  }
}

TEST_CASE("a job's end admits what waits behind it in order: a ticket, a job under a deadline") {
  // a's end gives its lane's grant back on a's own thread; the head of the queue then is b,
  // submitted under a deadline (it claims its place with an acquire, not a ticket), which the
  // lane's own turn must grant; c, a ticket again, follows b's release.
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<std::string> {
    auto a = must(submit(cx, timed_job{j, "a", 10}));
    auto b = cx.spawn([j](context& c) -> task<std::string> {
      auto d = co_await c.deadline(1s, [j](context& dc) -> task<caf::expected<std::string>> {
        auto h = submit(dc, timed_job{j, "b", 10});
        if (!h) co_return std::move(h.error());
        co_return co_await dc.await(*h);
      });
      co_return d && *d ? **d : std::string{"failed"};
    });
    co_await cx.sleep(1ms); // b's place is taken before c's
    auto c = must(submit(cx, timed_job{j, "c", 10}));
    std::string out;
    for (auto* h : {&a, &c}) {
      auto v = co_await cx.await(*h);
      out += v ? *v : std::string{"x"};
    }
    auto vb = co_await cx.await(b);
    co_return out + (vb ? *vb : std::string{"x"});
  });
  REQUIRE(r);
  CHECK(*r == "acb");
  CHECK(j->events ==
        std::vector<std::string>{"start a", "end a", "start b", "end b", "start c", "end c"});
  CHECK(j->max_running == 1);
  auto m = must(rt.lane_metrics_of("db"));
  CHECK(m.admitted == 3);
  CHECK(m.running == 0);
  CHECK(m.queue_depth == 0);
}

namespace {

/// Real time, 2 threads: the default lane and "export", concurrent(3).
runtime two_thread_export_rt() {
  auto rt = runtime::builder{}
                .threads(2)
                .lanes({lane_decl::default_lane(), lane_decl::concurrent("export", 3)})
                .build();
  REQUIRE(rt);
  return std::move(*rt);
}

/// What every run on "export" leaves: no job started twice, never more than 3 at once, and
/// the lane settled. Returns the lane's metrics, and how many jobs started.
std::pair<lane_metrics, size_t> check_export_settled(runtime& rt, rt_counter& c) {
  CHECK(c.max_running.load() <= 3);
  auto all = c.starts;
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end()); // none started twice
  // A job gives its lane's grant back just after its outcome is out (whoever awaits it is
  // woken first: jobs.md), on its own thread: the last one may still be on its way when
  // the run returns. Awaited here, bounded; a grant never given back fails the check.
  auto m = must(rt.lane_metrics_of("export"));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (m.running != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
    m = must(rt.lane_metrics_of("export"));
  }
  CHECK(m.running == 0);
  CHECK(m.queue_depth == 0);
  return {m, all.size()};
}

} // namespace

TEST_CASE("real time: jobs ending on two threads admit the next ones within the lane's width") {
  // Every job's end gives its lane's grant back on the thread it ran on, racing the lane's
  // own turns (tickets arriving, deadline-bound jobs claiming their places) and the other
  // thread's ends: the width holds, every job runs once, and the lane ends settled.
  auto rt = two_thread_export_rt();
  auto c = std::make_shared<rt_counter>();
  auto submitter = [c](int base) {
    return [c, base](context& cx) -> task<int> {
      std::vector<task_handle<int>> hs;
      for (int i = 0; i < 400; ++i) {
        if (i % 40 == 0) { // a job under a deadline: an acquire in the lane's queue
          hs.push_back(cx.spawn([c, n = base + i](context& sc) -> task<int> {
            auto d = co_await sc.deadline(30s, [c, n](context& dc) -> task<caf::expected<int>> {
              auto h = submit(dc, rt_job{c, n});
              if (!h) co_return std::move(h.error());
              co_return co_await dc.await(*h);
            });
            co_return d && *d ? **d : -1;
          }));
        } else {
          auto h = submit(cx, rt_job{c, base + i});
          if (!h) co_return -1;
          hs.push_back(std::move(*h));
        }
        if (i % 100 == 99) co_await cx.yield_now();
      }
      int bad = 0;
      for (auto& h : hs)
        if (auto v = co_await cx.await(h); !v || *v < 0) ++bad;
      co_return bad;
    };
  };
  auto r = rt.run([submitter](context& cx) -> task<int> {
    auto x = cx.spawn(submitter(0));
    auto y = cx.spawn(submitter(1000));
    auto bx = co_await cx.await(x);
    auto by = co_await cx.await(y);
    co_return (bx ? *bx : 1000) + (by ? *by : 1000);
  });
  REQUIRE(r);
  CHECK(*r == 0);
  CHECK(c->done.load() == 800);
  auto [m, started] = check_export_settled(rt, *c);
  CHECK(started == 800);
  CHECK(m.admitted == 800);
}

namespace {

/// Fails its first attempt on "db", then succeeds; backs off 50 ms between.
struct flaky_db_job {
  static constexpr std::string_view lane = "db";
  static job_policy policy() { return {.retries = 1, .backoff_base = 50ms, .backoff_cap = 50ms}; }
  std::shared_ptr<journal> j;
  task<caf::expected<std::string>> attempt(attempt_scope& s) {
    j->events.push_back("flaky " + std::to_string(s.attempt()));
    if (s.attempt() == 0) co_return make_error(errc::not_found, "endpoint", "first attempt");
    co_return std::string{"flaky"};
  }
};

} // namespace

TEST_CASE("a job admitted from its ticket gives its place back for its backoff") {
  // The flaky job's first admission is the lane's grant of its ticket, held by its task;
  // its failure gives it back before the backoff, so the job queued behind it runs then,
  // and the retry queues again at the back.
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<std::string> {
    auto a = must(submit(cx, flaky_db_job{j}));
    auto b = must(submit(cx, timed_job{j, "b", 10}));
    auto va = co_await cx.await(a);
    auto vb = co_await cx.await(b);
    co_return (va ? *va : std::string{"x"}) + (vb ? *vb : std::string{"x"});
  });
  REQUIRE(r);
  CHECK(*r == "flakyb");
  CHECK(j->events == std::vector<std::string>{"flaky 0", "start b", "end b", "flaky 1"});
  auto m = must(rt.lane_metrics_of("db"));
  CHECK(m.running == 0);
  CHECK(m.queue_depth == 0);
}

namespace {

/// The ids of the tickets the granted hook withdraws (a hook is a plain function).
std::set<std::string> withdraw_at_grant; // NOLINT: read by the hook only while a test sets it
int withdrawn_at_grant = 0;

/// Withdraws, between its grant and its admission, every ticket named in withdraw_at_grant.
void withdraw_named(const std::shared_ptr<detail::job_ticket>& t) noexcept {
  if (withdraw_at_grant.count(t->info.id) == 0) return;
  ++withdrawn_at_grant;
  caf::actor running;
  detail::ticket_stop(t, running, make_error(errc::cancelled, "", "cancelled at its grant"));
}

/// Installs withdraw_named for one test.
struct withdraw_hook {
  withdraw_hook() {
    withdraw_at_grant.clear();
    withdrawn_at_grant = 0;
    detail::set_ticket_granted_hook(withdraw_named);
  }
  withdraw_hook(const withdraw_hook&) = delete;
  withdraw_hook& operator=(const withdraw_hook&) = delete;
  ~withdraw_hook() {
    detail::set_ticket_granted_hook(nullptr);
    withdraw_at_grant.clear();
  }
};

} // namespace

TEST_CASE("a job cancelled between its lane's grant and its admission never runs; the next one "
          "is admitted") {
  // A lane grants under its lock and spawns the granted jobs once the lock is let go: a
  // cancel landing in between finds the ticket out of the queue. Its permit comes back
  // unused (no admission), the cancel counts once, and the permit goes to the next job.
  withdraw_hook hook;
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<std::string> {
    auto a = must(submit(cx, timed_job{j, "a", 10}));
    auto b = must(submit(cx, timed_job{j, "b", 10}));
    auto c = must(submit(cx, timed_job{j, "c", 10}));
    withdraw_at_grant.insert(b.id());
    auto rb = co_await cx.await(b);
    auto rc = co_await cx.await(c);
    auto ra = co_await cx.await(a);
    co_return (ra ? *ra : "?") + " " + (rb ? *rb : is_cancellation(rb.error()) ? "cancelled" : "?") +
        " " + (rc ? *rc : "?");
  });
  CHECK(must(std::move(r)) == "a cancelled c");
  CHECK(withdrawn_at_grant == 1);
  CHECK(j->events == std::vector<std::string>{"start a", "end a", "start c", "end c"});
  rt.drain();
  check_db_settled(rt, 1, 2);
}

TEST_CASE("real time: cancels race the admissions that job ends make on two threads") {
  // Jobs end on both workers and admit the next ones there (granted under the lane's lock,
  // spawned after it), while a second task cancels every other job: some queued, some
  // between their grant and their spawn, some running. Each job runs at most once and
  // answers its value or `cancelled`, the width holds, and the lane's counts add up.
  auto rt = two_thread_export_rt();
  auto c = std::make_shared<rt_counter>();
  constexpr int n = 600;
  auto r = rt.run([c](context& cx) -> task<int> {
    std::vector<job_handle<int>> hs;
    for (int i = 0; i < n; ++i) {
      auto h = submit(cx, rt_job{c, i, true});
      if (!h) co_return -1;
      hs.push_back(std::move(*h));
    }
    auto killer = cx.spawn([hs](context& k) -> task<int> {
      int stopped = 0;
      for (size_t i = 1; i < hs.size(); i += 2) {
        if (auto x = co_await k.cancel(hs[i]); x && *x) ++stopped;
        if (i % 8 == 1) co_await k.yield_now();
      }
      co_return stopped;
    });
    int ran = 0, bad = 0;
    for (int i = 0; i < n; ++i) {
      auto v = co_await cx.await(hs[static_cast<size_t>(i)]);
      if (v && *v == i)
        ++ran;
      else if (v || !is_cancellation(v.error()) || i % 2 == 0) // the even ones are never cancelled
        ++bad;
    }
    (void)co_await cx.await(killer);
    co_return bad == 0 ? ran : -1;
  });
  REQUIRE(r);
  CHECK(*r >= n / 2);
  auto [m, started] = check_export_settled(rt, *c);
  CHECK(m.admitted == started);
  CHECK(m.admitted + m.withdrawn == static_cast<uint64_t>(n));
}

TEST_CASE("a long run of jobs cancelled between their grants and their admissions passes "
          "the place on in a loop") {
  // 100k queued jobs on a serial lane are each withdrawn between their grant and their
  // spawn: each permit comes back and goes to the next, in a loop (not a recursion per
  // job: that version died here of a stack overflow), and the job behind them runs.
  withdraw_hook hook;
  constexpr int n = 100000;
  auto rt = make_lanes_rt(standard_lanes());
  auto j = std::make_shared<journal>();
  auto r = rt.run([j](context& cx) -> task<int> {
    auto a = must(submit(cx, timed_job{j, "a", 10}));
    std::vector<job_handle<std::string>> ws;
    for (int i = 0; i < n; ++i) {
      ws.push_back(must(submit(cx, timed_job{j, "w", 10})));
      withdraw_at_grant.insert(ws.back().id());
    }
    auto z = must(submit(cx, timed_job{j, "z", 10}));
    int cancelled = 0;
    for (auto& w : ws)
      if (auto v = co_await cx.await(w); !v && is_cancellation(v.error())) ++cancelled;
    auto rz = co_await cx.await(z);
    auto ra = co_await cx.await(a);
    co_return ra && rz ? cancelled : -1;
  });
  CHECK(must(std::move(r)) == n);
  CHECK(withdrawn_at_grant == n);
  CHECK(j->events == std::vector<std::string>{"start a", "end a", "start z", "end z"});
  rt.drain();
  check_db_settled(rt, n, 2);
}
