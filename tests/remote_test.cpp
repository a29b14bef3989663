// Remote work on a cluster: bodies registered by name run on other nodes (`spawn_on`), as
// supervised children (`remote_child`) and as pool jobs (`submit_remote`); their bad inputs;
// cancellation across nodes; and, with nodes in other processes (troupe-node), what a
// `kill -9` of a node does to its remote children and pool jobs. Every wait is bounded by a
// timeout on an event (a condition variable, a line of output, an await), never a sleep.

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <caf/all.hpp>

#include <troupe/troupe.hpp>

#include "child_process.hpp"
#include "cluster_support.hpp"
#include "test_support.hpp"

namespace {

using namespace std::chrono_literals;
using troupe_test::address_of;
using troupe_test::node_config;
using troupe::context;
using troupe::errc;
using troupe::member_status;
using troupe::task;

/// What the "block" bodies of this process's runtimes did: started, ended (cancelled).
struct block_log {
  std::mutex mtx;
  std::condition_variable cv;
  int started = 0;
  int ended = 0;
  int tidied = 0; ///< "tidy" bodies that finished their cleanup after a graceful cancel
  void add(int& counter) {
    std::lock_guard<std::mutex> guard{mtx};
    ++counter;
    cv.notify_all();
  }
  bool wait(int& counter, int n, std::chrono::milliseconds within) {
    std::unique_lock<std::mutex> guard{mtx};
    return cv.wait_for(guard, within, [&] { return counter >= n; });
  }
  int now(const int& counter) {
    std::lock_guard<std::mutex> guard{mtx};
    return counter;
  }
  void reset() {
    std::lock_guard<std::mutex> guard{mtx};
    started = ended = tidied = 0;
  }
};

block_log& blocks() {
  static block_log log;
  return log;
}

struct block_guard {
  ~block_guard() { blocks().add(blocks().ended); }
};


/// A node with the test's bodies registered.
troupe::runtime make_node(troupe::cluster_config c) {
  auto name = c.node;
  troupe::runtime::builder b;
  b.threads(2).cluster(std::move(c));
  b.body("square", [](context&, int64_t x) -> task<int64_t> { co_return x * x; });
  b.body("whoami", [name](context&) -> task<std::string> { co_return name; });
  b.body("concat", [](context&, std::string s, int64_t n) -> task<std::string> {
    co_return s + std::to_string(n);
  });
  b.body("block", [](context& cx) -> task<void> {
    blocks().add(blocks().started);
    block_guard guard;
    for (;;)
      co_await cx.sleep(1h);
  });
  b.body("tidy", [](context& cx) -> task<std::string> {
    blocks().add(blocks().started);
    try {
      for (;;)
        co_await cx.sleep(1h);
    } catch (const troupe::task_cancelled&) {
    }
    co_await cx.sleep(20ms); // cleanup that awaits: allowed within the grace
    blocks().add(blocks().tidied);
    co_return std::string{"tidied"};
  });
  b.body("throws", [](context&) -> task<int64_t> {
    throw std::runtime_error("boom");
    co_return 0;
  });
  b.body("fails", [](context&, std::string why) -> task<caf::expected<int64_t>> {
    co_return troupe::make_error(errc::invalid_argument, "why", why);
  });
  auto rt = b.build();
  if (!rt) FAIL(troupe::render(rt.error()));
  REQUIRE(rt->cluster_port() != 0);
  return std::move(*rt);
}


/// Runs `body` on `node` from a task of `rt` and returns its outcome.
template <class T, class... Args>
caf::expected<T> run_remote(troupe::runtime& rt, std::string node, std::string body, Args... args) {
  auto r = rt.run([=](context& cx) -> task<caf::expected<T>> {
    co_return co_await troupe::spawn_on<T>(cx, node, body, args...);
  });
  if (!r) return r.error();
  return std::move(*r);
}

template <class T>
std::string error_code_of(const caf::expected<T>& x) {
  if (x) return "no error";
  return std::string{troupe::code_of(static_cast<errc>(x.error().code()))} + " " +
         troupe::field_of(x.error());
}

} // namespace

TEST_CASE("a body registered by name runs on another node and answers its value or a typed error") {
  auto a = make_node(node_config("a"));
  auto b = make_node(node_config("b", {address_of(a)}));
  REQUIRE(a.await_member("b", member_status::up, 10s));
  auto sq = run_remote<int64_t>(a, "b", "square", int64_t{7});
  REQUIRE(sq);
  CHECK(*sq == 49);
  CHECK(run_remote<std::string>(a, "b", "whoami") == std::string{"b"});
  CHECK(run_remote<std::string>(b, "a", "whoami") == std::string{"a"});
  CHECK(run_remote<std::string>(a, "a", "whoami") == std::string{"a"}); // this node itself
  CHECK(run_remote<std::string>(a, "b", "concat", std::string{"x"}, int64_t{5}) ==
        std::string{"x5"});
  // Bad input: each a typed error naming what is wrong; the node goes on serving.
  auto no_body = run_remote<int64_t>(a, "b", "cube", int64_t{2});
  REQUIRE_FALSE(no_body);
  CHECK(troupe::is(no_body.error(), errc::unknown_body));
  CHECK(troupe::field_of(no_body.error()) == "body");
  auto bad_args = run_remote<int64_t>(a, "b", "square", std::string{"seven"});
  REQUIRE_FALSE(bad_args);
  CHECK(troupe::is(bad_args.error(), errc::body_type_mismatch));
  CHECK(troupe::field_of(bad_args.error()) == "args");
  auto too_many = run_remote<int64_t>(a, "b", "square", int64_t{1}, int64_t{2});
  REQUIRE_FALSE(too_many);
  CHECK(troupe::is(too_many.error(), errc::body_type_mismatch));
  auto bad_result = run_remote<std::string>(a, "b", "square", int64_t{3});
  REQUIRE_FALSE(bad_result);
  CHECK(troupe::is(bad_result.error(), errc::body_type_mismatch));
  CHECK(troupe::field_of(bad_result.error()) == "result");
  auto no_node = run_remote<int64_t>(a, "zz", "square", int64_t{3});
  REQUIRE_FALSE(no_node);
  CHECK(troupe::is(no_node.error(), errc::unknown_node));
  CHECK(troupe::field_of(no_node.error()) == "node");
  // The body's own failure crosses as it is: a throw, a returned error.
  auto thrown = run_remote<int64_t>(a, "b", "throws");
  REQUIRE_FALSE(thrown);
  CHECK(troupe::render(thrown.error()).find("boom") != std::string::npos);
  auto returned = run_remote<int64_t>(a, "b", "fails", std::string{"no reason"});
  REQUIRE_FALSE(returned);
  CHECK(troupe::is(returned.error(), errc::invalid_argument));
  CHECK(troupe::field_of(returned.error()) == "why");
  CHECK(troupe::detail_of(returned.error()) == "no reason");
  CHECK(run_remote<int64_t>(a, "b", "square", int64_t{-4}) == int64_t{16}); // still serving
  // A runtime that is no cluster node says so.
  auto lone = troupe::runtime::builder{}.threads(1).build();
  REQUIRE(lone);
  auto r = run_remote<int64_t>(*lone, "b", "square", int64_t{2});
  REQUIRE_FALSE(r);
  CHECK(troupe::is(r.error(), errc::cluster_unavailable));
  // An empty body name is refused at build.
  auto empty = troupe::runtime::builder{}
                   .threads(1)
                   .body("", [](context&) -> task<int64_t> { co_return 1; })
                   .build();
  REQUIRE_FALSE(empty);
  CHECK(troupe::is(empty.error(), errc::invalid_argument));
  CHECK(troupe::field_of(empty.error()) == "bodies");
}

TEST_CASE("cancelling the task that awaits a remote run cancels the run on its node") {
  blocks().reset();
  auto a = make_node(node_config("a"));
  auto b = make_node(node_config("b", {address_of(a)}));
  REQUIRE(a.await_member("b", member_status::up, 10s));
  auto actors_on_b = b.system().registry().running();
  auto h = a.spawn([](context& cx) -> task<std::string> {
    auto r = co_await troupe::spawn_on<void>(cx, "b", "block");
    co_return r ? std::string{"returned"} : troupe::render(r.error());
  });
  REQUIRE(h);
  REQUIRE(blocks().wait(blocks().started, 1, 10s));
  auto cancelled = a.cancel(*h);
  REQUIRE(cancelled);
  CHECK(*cancelled);
  // The run on b is cancelled: its frame unwinds there (the guard counts it), and, being
  // structured, before the cancelled task's end is reported: no waiting here.
  CHECK(blocks().now(blocks().ended) == 1);
  // ... and the run's task actor on b is gone by then (not kept by b's spawner).
  CHECK(b.system().registry().running() == actors_on_b);
  auto out = a.await(*h);
  REQUIRE_FALSE(out);
  CHECK(troupe::is_cancellation(out.error()));
  // A graceful cancel passes on as one, with its grace: the run on b sees it at its await,
  // cleans up (awaiting) and ends; a forced cancel would have destroyed it at the await.
  auto g = a.spawn([](context& cx) -> task<void> {
    (void)co_await troupe::spawn_on<std::string>(cx, "b", "tidy");
  });
  REQUIRE(g);
  REQUIRE(blocks().wait(blocks().started, 2, 10s));
  auto asked = a.run([g = *g](context& cx) -> task<caf::expected<bool>> {
    co_return co_await cx.cancel_graceful(g, 5s);
  });
  REQUIRE(asked);
  CHECK((*asked && **asked));
  // The caller ends once the run has ended (within the grace): its cleanup is done by then.
  auto gone = a.await(*g);
  CHECK_FALSE(gone);
  CHECK(blocks().now(blocks().tidied) == 1);
  // A run whose caller's runtime stops is cancelled as well.
  auto h2 = a.spawn([](context& cx) -> task<void> { (void)co_await troupe::spawn_on<void>(cx, "b", "block"); });
  REQUIRE(h2);
  REQUIRE(blocks().wait(blocks().started, 3, 10s));
  a.stop();
  CHECK(blocks().wait(blocks().ended, 2, 10s));
  CHECK(run_remote<int64_t>(b, "b", "square", int64_t{5}) == int64_t{25});
}

TEST_CASE("a remote child runs on its placement's node and stops with its supervisor") {
  blocks().reset();
  auto a = make_node(node_config("a"));
  auto b = make_node(node_config("b", {address_of(a)}));
  REQUIRE(a.await_member("b", member_status::up, 10s));
  troupe::supervisor_spec spec;
  spec.name = "remote";
  troupe::child_spec c;
  c.name = "svc";
  c.start = troupe::remote_child("block", {}, troupe::placement{{"zz", "b", "a"}});
  c.shutdown_ms = 2000;
  spec.children.push_back(c);
  auto sup = a.supervise(spec);
  REQUIRE(sup);
  REQUIRE(blocks().wait(blocks().started, 1, 10s));
  auto kids = a.which_children(*sup);
  REQUIRE(kids);
  REQUIRE(kids->size() == 1);
  REQUIRE(kids->front().actor);
  CHECK(kids->front().actor->node() == b.system().node()); // zz is no member: b comes next
  CHECK(kids->front().status == troupe::child_status::running);
  auto st = a.supervisor_stop(*sup, 5s);
  REQUIRE(st);
  CHECK(blocks().wait(blocks().ended, 1, 10s)); // the child on b was stopped
  // Bad input: no member of the placement is up; a body no node has.
  troupe::supervisor_spec none;
  none.name = "nowhere";
  troupe::child_spec n;
  n.name = "svc";
  n.start = troupe::remote_child("block", {}, troupe::placement{{"zz"}});
  none.children.push_back(n);
  auto failed = a.supervise(none);
  REQUIRE_FALSE(failed);
  CHECK(troupe::is(failed.error(), errc::start_failed));
  CHECK(troupe::render(failed.error()).find("no_node_available") != std::string::npos);
  troupe::supervisor_spec nobody;
  nobody.name = "nobody";
  n.start = troupe::remote_child("no-such-body", {}, troupe::placement{{"b"}});
  nobody.children.push_back(n);
  auto unknown = a.supervise(nobody);
  REQUIRE_FALSE(unknown);
  CHECK(troupe::render(unknown.error()).find("unknown_body") != std::string::npos);
}

TEST_CASE("a cluster pool spreads jobs round robin over its nodes; bad placements fail the job") {
  auto a = make_node(node_config("a"));
  auto b = make_node(node_config("b", {address_of(a)}));
  REQUIRE(a.await_member("b", member_status::up, 10s));
  auto r = a.run([](context& cx) -> task<std::map<std::string, int>> {
    std::map<std::string, int> seen;
    troupe::pool_spec spec;
    spec.name = "spread";
    spec.max_concurrent = 4; // remote.nodes empty: every member that is up
    auto p = co_await troupe::open_pool(cx, spec);
    if (!p) co_return seen;
    std::vector<troupe::pool_task<std::string>> hs;
    for (int i = 0; i < 10; ++i) {
      auto h = co_await troupe::submit_remote<std::string>(cx, *p, "whoami");
      if (h) hs.push_back(*h);
    }
    auto outs = co_await troupe::wait_for_all(cx, hs);
    if (!outs) co_return seen;
    for (auto& o : *outs) {
      auto v = o.result();
      ++seen[v ? *v : troupe::render(v.error())];
    }
    co_return seen;
  });
  REQUIRE(r);
  CHECK(*r == std::map<std::string, int>{{"a", 5}, {"b", 5}});
  // A placement no member of which is up, and a body no node has: each job fails, typed.
  auto bad = a.run([](context& cx) -> task<std::vector<std::string>> {
    std::vector<std::string> out;
    troupe::pool_spec spec;
    spec.name = "nowhere";
    spec.remote.nodes = {"zz"};
    auto p = co_await troupe::open_pool(cx, spec);
    auto any = co_await troupe::open_pool(cx, troupe::pool_spec{.name = "anywhere"});
    if (!p || !any) co_return out;
    auto h1 = co_await troupe::submit_remote<int64_t>(cx, *p, "square", int64_t{2});
    auto h2 = co_await troupe::submit_remote<int64_t>(cx, *any, "cube", int64_t{2});
    auto h3 = co_await troupe::submit_remote<int64_t>(cx, *any, "square", int64_t{9});
    for (auto* h : {&h1, &h2, &h3}) {
      if (!*h) continue;
      auto o = co_await troupe::wait_for(cx, **h);
      auto v = o ? o->result() : caf::expected<int64_t>{o.error()};
      out.push_back(v ? std::to_string(*v) : error_code_of(v));
    }
    co_return out;
  });
  REQUIRE(bad);
  CHECK(*bad == std::vector<std::string>{"TROUPE-CLU-011 placement", "TROUPE-CLU-008 body", "81"});
}

// -- nodes in other processes ---------------------------------------------------------------

#ifdef TROUPE_NODE

using troupe_test::start_node;

namespace {

/// Submits `n` jobs of demo.work(ms) to a new pool `name` on b and c, and waits for all.
task<std::vector<std::string>> pool_round(context& cx, std::string name, bool retry, int n,
                                          int64_t ms) {
  std::vector<std::string> out;
  troupe::pool_spec spec;
  spec.name = name;
  spec.max_concurrent = 4;
  spec.remote.nodes = {"b", "c"};
  spec.remote.retry_on_node_down = retry;
  auto p = co_await troupe::open_pool(cx, spec);
  if (!p) co_return std::vector<std::string>{troupe::render(p.error())};
  std::vector<troupe::pool_task<std::string>> hs;
  for (int i = 0; i < n; ++i) {
    auto h = co_await troupe::submit_remote<std::string>(cx, *p, "demo.work", ms);
    if (!h) co_return std::vector<std::string>{troupe::render(h.error())};
    hs.push_back(*h);
  }
  auto outs = co_await troupe::wait_for_all(cx, hs);
  if (!outs) co_return std::vector<std::string>{troupe::render(outs.error())};
  for (auto& o : *outs) {
    auto v = o.result();
    out.push_back(v ? *v : error_code_of(v));
  }
  co_return out;
}

} // namespace

TEST_CASE("kill -9 of a node: its remote child restarts on a survivor, its pool jobs fail or retry as declared") {
  auto a = make_node(node_config("a"));
  auto b = start_node("b", a.cluster_port());
  auto c = start_node("c", a.cluster_port());
  REQUIRE(a.await_member("b", member_status::up, 10s));
  REQUIRE(a.await_member("c", member_status::up, 10s));
  // Remote tasks in other processes.
  CHECK(run_remote<int64_t>(a, "b", "demo.square", int64_t{9}) == int64_t{81});
  CHECK(run_remote<std::string>(a, "c", "demo.whoami") == std::string{"c"});
  auto failed = run_remote<int64_t>(a, "c", "demo.fail", std::string{"on purpose"});
  REQUIRE_FALSE(failed);
  CHECK(troupe::is(failed.error(), errc::task_failed));
  CHECK(troupe::detail_of(failed.error()) == "on purpose");
  // A remote child, preferring b then c.
  troupe::supervisor_spec spec;
  spec.name = "remote";
  spec.intensity = 3;
  troupe::child_spec svc;
  svc.name = "svc";
  svc.start = troupe::remote_child("demo.service", {}, troupe::placement{{"b", "c"}});
  spec.children.push_back(svc);
  auto sup = a.supervise(spec);
  REQUIRE(sup);
  REQUIRE(b->read_until("demo.service running on b", 10s));
  // Two cluster pools of 4 workers on b and c, 8 jobs of 3 s each; job k runs on
  // [b, c][k % 2] while both are up: jobs 1-4 run first, 2 and 4 of them on b.
  auto no_retry = a.spawn([](context& cx) { return pool_round(cx, "at-most-once", false, 8, 3000); });
  auto retry = a.spawn([](context& cx) { return pool_round(cx, "at-least-once", true, 8, 3000); });
  REQUIRE(no_retry);
  REQUIRE(retry);
  // Wait (bounded) until both pools run 4 jobs each.
  auto running = a.run([](context& cx) -> task<bool> {
    for (int i = 0; i < 500; ++i) {
      auto p1 = co_await troupe::lookup_pool(cx, "at-most-once");
      auto p2 = co_await troupe::lookup_pool(cx, "at-least-once");
      if (p1 && p2) {
        auto s1 = co_await troupe::snapshot_of(cx, *p1);
        auto s2 = co_await troupe::snapshot_of(cx, *p2);
        if (s1 && s2 && s1->active == 4 && s2->active == 4) co_return true;
      }
      co_await cx.sleep(10ms);
    }
    co_return false;
  });
  REQUIRE(running);
  REQUIRE(*running);
  b->kill_now();
  // The child restarts on c: its node's death was a failure (node_down).
  REQUIRE(c->read_until("demo.service running on c", 10s));
  auto kids = a.which_children(*sup);
  REQUIRE(kids);
  REQUIRE(kids->size() == 1);
  CHECK(kids->front().restarts == 1);
  CHECK(kids->front().last_error.find("node_down") != std::string::npos);
  CHECK(kids->front().status == troupe::child_status::running);
  // At most once: the two jobs that ran on b failed with node_down, the rest ran on c.
  auto r1 = a.await(*no_retry);
  REQUIRE(r1);
  CHECK(*r1 == std::vector<std::string>{"c", "TROUPE-CLU-007 actor", "c", "TROUPE-CLU-007 actor",
                                        "c", "c", "c", "c"});
  // At least once: they ran again on c.
  auto r2 = a.await(*retry);
  REQUIRE(r2);
  CHECK(*r2 == std::vector<std::string>(8, "c"));
  // The supervisor's node leaves: the child on c does not outlive it.
  a.stop();
  CHECK(c->read_until("demo.service stopped on c", 10s));
  c->signal(SIGTERM);
  CHECK(c->read_to_end(10s));
}

#endif
