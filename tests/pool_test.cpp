#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <troupe/actors/detail/pool_queue.hpp>
#include <troupe/troupe.hpp>

#include "test_support.hpp"

using namespace std::chrono_literals;
using nlohmann::json;
using troupe::context;
using troupe::errc;
using troupe::pool_backpressure_kind;
using troupe::pool_on_full;
using troupe::pool_queue_kind;
using troupe::pool_spec;
using troupe::pool_task_status;
using troupe::task;

namespace {

using troupe_test::fails_with;
using troupe_test::field_if_failed;
using troupe_test::make_real_rt;
using troupe_test::make_virtual_rt;

using log_t = std::shared_ptr<std::vector<int>>;

/// A body that sleeps `d` on the runtime clock, then logs `n` and returns it.
auto logged(log_t log, int n, std::chrono::milliseconds d = 1ms) {
  return [log, n, d](context& cx) -> task<int> {
    co_await cx.sleep(d);
    log->push_back(n);
    co_return n;
  };
}

pool_spec spec_of(std::string name, int64_t workers = 1) {
  pool_spec s;
  s.name = std::move(name);
  s.max_concurrent = workers;
  return s;
}

pool_spec bounded(std::string name, int64_t depth, pool_on_full on_full) {
  auto s = spec_of(std::move(name));
  s.backpressure.kind = pool_backpressure_kind::queue;
  s.backpressure.max_depth = depth;
  s.backpressure.on_full = on_full;
  return s;
}

std::vector<int> drain(troupe::detail::pool_queue& q) {
  std::vector<int> out;
  while (auto id = q.pop())
    out.push_back(static_cast<int>(*id));
  return out;
}

} // namespace

// -- the queue strategies, without an actor -------------------------------------------------

TEST_CASE("the priority strategy starts the highest priority first, FIFO among equals") {
  troupe::detail::pool_queue q{pool_queue_kind::priority};
  q.push(1, 1, 0, "", false);
  q.push(2, 2, 5, "", false);
  q.push(3, 3, 0, "", false);
  q.push(4, 4, 5, "", false);
  q.push(5, 5, -1, "", false);
  CHECK(drain(q) == std::vector<int>{2, 4, 1, 3, 5});
}

TEST_CASE("fifo starts the oldest first, lifo the newest") {
  troupe::detail::pool_queue f{pool_queue_kind::fifo};
  troupe::detail::pool_queue l{pool_queue_kind::lifo};
  for (uint64_t i = 1; i <= 4; ++i) {
    f.push(i, i, static_cast<int64_t>(i), "", false); // priority is ignored
    l.push(i, i, static_cast<int64_t>(i), "", false);
  }
  CHECK(drain(f) == std::vector<int>{1, 2, 3, 4});
  CHECK(drain(l) == std::vector<int>{4, 3, 2, 1});
}

TEST_CASE("fair_round_robin visits partitions in first-seen order, one task per visit") {
  troupe::detail::pool_queue q{pool_queue_kind::fair_round_robin};
  // a floods first, then b, then the default partition (no key), then c
  q.push(1, 1, 0, "a", true);
  q.push(2, 2, 0, "a", true);
  q.push(3, 3, 0, "a", true);
  q.push(4, 4, 0, "b", true);
  q.push(5, 5, 0, "", false);
  q.push(6, 6, 0, "a", true);
  q.push(7, 7, 0, "c", true);
  q.push(8, 8, 0, "b", true);
  CHECK(drain(q) == std::vector<int>{1, 4, 5, 7, 2, 8, 3, 6});
  // An empty key is a partition of its own, not the default one.
  q.push(9, 9, 0, "", true);
  q.push(10, 10, 0, "", false);
  CHECK(drain(q).size() == 2);
}

TEST_CASE("a removed job never starts, and oldest() names the first submitted") {
  for (auto kind : {pool_queue_kind::priority, pool_queue_kind::fifo, pool_queue_kind::lifo,
                    pool_queue_kind::fair_round_robin}) {
    troupe::detail::pool_queue q{kind};
    for (uint64_t i = 1; i <= 5; ++i)
      q.push(i, i, static_cast<int64_t>(i % 2), i % 2 ? "x" : "y", true);
    CHECK(q.oldest() == 1u);
    CHECK(q.remove(1));
    CHECK_FALSE(q.remove(1));
    CHECK(q.remove(4));
    CHECK(q.oldest() == 2u);
    CHECK(q.size() == 3);
    auto left = drain(q);
    std::sort(left.begin(), left.end());
    CHECK(left == std::vector<int>{2, 3, 5});
    CHECK(q.empty());
  }
}

// -- specs and bad input --------------------------------------------------------------------

TEST_CASE("a pool spec reads from JSON and bad fields are named") {
  auto s = troupe::pool_spec_from_json(json::parse(R"({
    "name": "jobs", "max_concurrent": 3,
    "queue": {"strategy": "fair_round_robin", "key": "tenant"},
    "backpressure": {"policy": "queue", "max_depth": 64, "on_full": "drop_oldest"}})"));
  REQUIRE(s);
  CHECK(s->max_concurrent == 3);
  CHECK(s->queue.kind == pool_queue_kind::fair_round_robin);
  CHECK(s->queue.key == "tenant");
  CHECK(s->backpressure.on_full == pool_on_full::drop_oldest);
  CHECK(troupe::pool_spec_from_json(troupe::to_json(*s)) == s);
  auto bad = [](const char* text) { return troupe::pool_spec_from_json(json::parse(text)); };
  CHECK(field_if_failed(bad(R"({"name":"p","max_concurrent":0})")) == "max_concurrent");
  CHECK(field_if_failed(bad(R"({"name":"p","queue":"shortest"})")) == "queue.strategy");
  CHECK(field_if_failed(bad(R"({"name":"p","queue":{"strategy":"fair_round_robin"}})")) ==
        "queue.key");
  CHECK(field_if_failed(bad(R"({"name":"p","backpressure":"drop_all"})")) ==
        "backpressure.policy");
  CHECK(field_if_failed(bad(R"({"name":"p","backpressure":{"policy":"queue","max_depth":0}})")) ==
        "backpressure.max_depth");
  CHECK(field_if_failed(bad(
            R"({"name":"p","backpressure":{"policy":"queue","max_depth":2,"on_full":"x"}})")) ==
        "backpressure.on_full");
  CHECK(field_if_failed(bad(R"({"name":"p","backpressure":{"policy":"ring_buffer"}})")) ==
        "backpressure.capacity");
  CHECK(field_if_failed(bad(R"({"name":"p","max_concurrent":"2"})")) == "max_concurrent");
  CHECK(field_if_failed(bad(R"({"name":"p","workers":2})")) == "workers");
  CHECK(field_if_failed(bad(R"({"name":"","max_concurrent":2})")) == "name");
  CHECK(fails_with(bad(R"({"name":"p","scope":"galaxy"})"), errc::invalid_pool_spec));
  CHECK(fails_with(bad(R"([1])"), errc::invalid_pool_spec));
}

TEST_CASE("submit options read priorities from JSON: \"7\" is 7, 1.5 and \"high\" are refused") {
  auto o = troupe::submit_options_from_json(json{{"priority", "7"}, {"key", "acme"}});
  REQUIRE(o);
  CHECK(o->priority == 7);
  CHECK(o->key == std::optional<std::string>{"acme"});
  CHECK(field_if_failed(troupe::submit_options_from_json(json{{"priority", 1.5}})) == "priority");
  CHECK(field_if_failed(troupe::submit_options_from_json(json{{"priority", "high"}})) ==
        "priority");
  CHECK(field_if_failed(troupe::submit_options_from_json(json{{"priority", "7x"}})) ==
        "priority");
  CHECK(field_if_failed(troupe::submit_options_from_json(json{{"key", 3}})) == "key");
}

TEST_CASE("opening a pool refuses bad specs, host scopes and a second spec for one name") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto s = spec_of("p");
    s.max_concurrent = 0;
    auto a = co_await troupe::open_pool(cx, s);
    CHECK(fails_with(a, errc::invalid_pool_spec));
    CHECK(field_if_failed(a) == "max_concurrent");
    auto b = co_await troupe::open_pool(cx, json{{"name", "p"}, {"queue", "random"}});
    CHECK(field_if_failed(b) == "queue.strategy");
    auto t = spec_of("p");
    t.scope = troupe::pool_scope::tenant;
    CHECK(fails_with(co_await troupe::open_pool(cx, t), errc::pool_scope_unsupported));
    t.scope = troupe::pool_scope::org;
    CHECK(fails_with(co_await troupe::open_pool(cx, t), errc::pool_scope_unsupported));
    auto p = co_await troupe::open_pool(cx, spec_of("p", 2));
    REQUIRE(p);
    auto again = co_await troupe::open_pool(cx, spec_of("p", 2));
    REQUIRE(again);
    CHECK(again->actor() == p->actor());
    CHECK(again->id() == p->id());
    auto other = co_await troupe::open_pool(cx, spec_of("p", 3));
    CHECK(fails_with(other, errc::sync_conflict));
    CHECK(field_if_failed(other) == "spec");
    auto missing = co_await troupe::lookup_pool(cx, "nope");
    CHECK(fails_with(missing, errc::unknown_pool));
    CHECK(field_if_failed(missing) == "name");
    CHECK(fails_with(co_await troupe::find_pool(cx, "0000000000000000"), errc::unknown_pool));
    // An empty body and an empty handle.
    std::function<task<int>(context&)> none;
    auto e = co_await troupe::submit(cx, *p, none);
    CHECK(fails_with(e, errc::invalid_pool_spec));
    CHECK(field_if_failed(e) == "body");
    CHECK(fails_with(co_await troupe::submit(cx, troupe::pool{}, logged(nullptr, 1)),
                     errc::unknown_pool));
  });
  CHECK(r);
}

TEST_CASE("pools are found by name and by deterministic id, and listed") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto a = co_await troupe::open_pool(cx, spec_of("alpha"));
    auto b = co_await troupe::open_pool(cx, spec_of("beta", 2));
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->id().size() == 16);
    CHECK(a->id() != b->id());
    auto by_name = co_await troupe::lookup_pool(cx, "beta");
    REQUIRE(by_name);
    CHECK(by_name->actor() == b->actor());
    auto by_id = co_await troupe::find_pool(cx, a->id());
    REQUIRE(by_id);
    CHECK(by_id->actor() == a->actor());
    auto all = co_await troupe::list_pools(cx);
    REQUIRE(all);
    REQUIRE(all->size() == 2);
    CHECK((*all)[0].name == "alpha");
    CHECK((*all)[1].max_concurrent == 2);
  });
  CHECK(r);
  // The id is a pure function of scope, scope id and name.
  CHECK(troupe::pool_id_of(troupe::pool_scope::session, "s1", "jobs") ==
        troupe::pool_id_of(troupe::pool_scope::session, "s1", "jobs"));
  CHECK(troupe::pool_id_of(troupe::pool_scope::session, "s1", "jobs") !=
        troupe::pool_id_of(troupe::pool_scope::pipeline, "s1", "jobs"));
  CHECK(troupe::pool_id_of(troupe::pool_scope::session, "s1", "jobs") !=
        troupe::pool_id_of(troupe::pool_scope::session, "s2", "jobs"));
}

// -- running jobs ---------------------------------------------------------------------------

TEST_CASE("submitted jobs run and their handles give terminal snapshots with the results") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto p = co_await troupe::open_pool(cx, spec_of("work", 2));
    REQUIRE(p);
    auto log = std::make_shared<std::vector<int>>();
    std::vector<troupe::pool_task<int>> hs;
    for (int i = 0; i < 5; ++i) {
      auto h = co_await troupe::submit(cx, *p, logged(log, i, 10ms),
                                       {.priority = i, .key = "k" + std::to_string(i)});
      REQUIRE(h);
      CHECK(h->priority() == i);
      CHECK(h->key() == "k" + std::to_string(i));
      hs.push_back(*h);
    }
    CHECK(hs[4].status() == pool_task_status::queued);
    co_await cx.sleep(1ms);
    CHECK(troupe::is_terminal(pool_task_status::completed));
    CHECK((co_await troupe::status_of(cx, hs[0]))->status == pool_task_status::running);
    CHECK((co_await troupe::status_of(cx, hs[4]))->status == pool_task_status::queued);
    auto snap = co_await troupe::snapshot_of(cx, *p);
    REQUIRE(snap);
    CHECK(snap->active == 2);
    CHECK(snap->queued == 3);
    CHECK(snap->size() == 5);
    CHECK(snap->total == 5);
    auto outs = co_await troupe::wait_for_all(cx, hs);
    REQUIRE(outs);
    for (int i = 0; i < 5; ++i) {
      CHECK((*outs)[i].status() == pool_task_status::completed);
      CHECK((*outs)[i].result() == i);
    }
    // Two waiters on one handle both get the result.
    auto again = co_await troupe::wait_for(cx, hs[3]);
    REQUIRE(again);
    CHECK(again->result() == 3);
    snap = co_await troupe::snapshot_of(cx, *p);
    CHECK(snap->completed == 5);
    CHECK(snap->size() == 0);
    CHECK(snap->run_p50_us == 10000); // virtual time: exactly the sleep
    CHECK(snap->wait_p99_us > 0);
    CHECK(snap->max_depth_seen == 3);
  });
  CHECK(r);
}

TEST_CASE("a failing job fails its handle with its error and the worker goes on") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto p = co_await troupe::open_pool(cx, spec_of("f"));
    REQUIRE(p);
    auto bad = co_await troupe::submit(cx, *p, [](context&) -> task<int> {
      throw troupe::task_error{troupe::make_error(errc::invalid_argument, "x", "no")};
      co_return 0;
    });
    auto good = co_await troupe::submit(cx, *p, [](context&) -> task<int> { co_return 5; });
    auto b = co_await troupe::wait_for(cx, *bad);
    REQUIRE(b);
    CHECK(b->status() == pool_task_status::failed);
    CHECK(fails_with(b->result(), errc::invalid_argument));
    auto g = co_await troupe::wait_for(cx, *good);
    CHECK(g->result() == 5);
    auto snap = co_await troupe::snapshot_of(cx, *p);
    CHECK(snap->failed == 1);
    CHECK(snap->worker_restarts == 0); // a failure is a value, not a crash
  });
  CHECK(r);
}

TEST_CASE("queue strategies decide the start order in a running pool") {
  auto order_of = [](pool_spec s, std::vector<std::pair<int, std::string>> jobs) {
    auto rt = make_virtual_rt();
    auto log = std::make_shared<std::vector<int>>();
    auto r = rt.run([&](context& cx) -> task<void> {
      auto p = co_await troupe::open_pool(cx, s);
      REQUIRE(p);
      // A blocker holds the only worker while the others queue.
      auto blocker = co_await troupe::submit(cx, *p, logged(log, -1, 5ms));
      REQUIRE(blocker);
      for (size_t i = 0; i < jobs.size(); ++i) {
        troupe::submit_options o;
        o.priority = jobs[i].first;
        if (!jobs[i].second.empty()) o.key = jobs[i].second;
        REQUIRE(co_await troupe::submit(cx, *p, logged(log, static_cast<int>(i)), o));
      }
      REQUIRE(co_await troupe::wait_idle(cx, *p));
    });
    REQUIRE(r);
    log->erase(log->begin());
    return *log;
  };
  std::vector<std::pair<int, std::string>> jobs{{0, "a"}, {9, "a"}, {0, "b"}, {9, "a"}, {1, "c"}};
  auto s = spec_of("q");
  CHECK(order_of(s, jobs) == std::vector<int>{1, 3, 4, 0, 2});
  s.queue.kind = pool_queue_kind::fifo;
  CHECK(order_of(s, jobs) == std::vector<int>{0, 1, 2, 3, 4});
  s.queue.kind = pool_queue_kind::lifo;
  CHECK(order_of(s, jobs) == std::vector<int>{4, 3, 2, 1, 0});
  s.queue = {pool_queue_kind::fair_round_robin, "key"};
  CHECK(order_of(s, jobs) == std::vector<int>{0, 2, 4, 1, 3});
}

TEST_CASE("fair_round_robin can partition by a task-local value of the submitter") {
  auto rt = make_virtual_rt();
  auto log = std::make_shared<std::vector<int>>();
  auto r = rt.run([&](context& cx) -> task<void> {
    auto s = spec_of("tenants");
    s.queue = {pool_queue_kind::fair_round_robin, "tenant_id"};
    auto p = co_await troupe::open_pool(cx, s);
    REQUIRE(p);
    REQUIRE(co_await troupe::submit(cx, *p, logged(log, -1, 5ms)));
    cx.set_local<std::string>("tenant_id", "acme");
    for (int i = 0; i < 3; ++i)
      REQUIRE(co_await troupe::submit(cx, *p, logged(log, 10 + i)));
    cx.set_local<std::string>("tenant_id", "beta");
    for (int i = 0; i < 2; ++i)
      REQUIRE(co_await troupe::submit(cx, *p, logged(log, 20 + i)));
    REQUIRE(co_await troupe::wait_idle(cx, *p));
  });
  REQUIRE(r);
  CHECK(*log == std::vector<int>{-1, 10, 20, 11, 21, 12});
}

TEST_CASE("a pooled job sees the submitter's task-local values as of the submit") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<std::string> {
    auto p = co_await troupe::open_pool(cx, spec_of("locals"));
    REQUIRE(p);
    cx.set_local<std::string>("request_id", "r-1");
    auto h = co_await troupe::submit(cx, *p, [](context& c) -> task<std::string> {
      co_await c.sleep(1ms);
      co_return c.local<std::string>("request_id").value_or("none");
    });
    cx.set_local<std::string>("request_id", "r-2"); // after the submit: not seen
    auto out = co_await troupe::wait_for(cx, *h);
    co_return *out->result();
  });
  REQUIRE(r);
  CHECK(*r == "r-1");
}

TEST_CASE("a job runs under its submitter's deadline: queued or running, it ends at it") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto p = co_await troupe::open_pool(cx, spec_of("dl"));
    REQUIRE(p);
    auto seen = std::make_shared<bool>(false);
    auto ran_late = std::make_shared<bool>(false);
    auto hs = co_await cx.deadline(20ms, [p, seen, ran_late](context& c)
                                             -> task<std::vector<troupe::pool_task<int>>> {
      std::vector<troupe::pool_task<int>> out;
      out.push_back(*co_await troupe::submit(c, *p, [seen](context& w) -> task<int> {
        *seen = w.current_deadline().has_value();
        co_await w.sleep(50ms); // outlives the deadline
        co_return 1;
      }));
      out.push_back(*co_await troupe::submit(c, *p, [ran_late](context&) -> task<int> {
        *ran_late = true; // queued behind the first: its deadline passes first
        co_return 2;
      }));
      co_return out;
    });
    REQUIRE(hs);
    auto a = co_await troupe::wait_for(cx, (*hs)[0]);
    auto b = co_await troupe::wait_for(cx, (*hs)[1]);
    CHECK(*seen);
    CHECK(a->status() == pool_task_status::failed);
    CHECK(fails_with(a->result(), errc::deadline_exceeded));
    CHECK(fails_with(b->result(), errc::deadline_exceeded));
    CHECK_FALSE(*ran_late);
    CHECK(cx.now().time_since_epoch() < std::chrono::nanoseconds{50ms});
  });
  CHECK(r);
}

TEST_CASE("cancelling a queued job removes it; cancelling a running one stops it") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto p = co_await troupe::open_pool(cx, spec_of("c"));
    REQUIRE(p);
    auto cleaned = std::make_shared<bool>(false);
    auto queued_ran = std::make_shared<bool>(false);
    struct guard {
      std::shared_ptr<bool> flag;
      ~guard() { *flag = true; }
    };
    auto running = co_await troupe::submit(cx, *p, [cleaned](context& c) -> task<int> {
      guard g{cleaned};
      co_await c.sleep(1h);
      co_return 1;
    });
    auto queued = co_await troupe::submit(cx, *p, [queued_ran](context&) -> task<int> {
      *queued_ran = true;
      co_return 2;
    });
    auto after = co_await troupe::submit(cx, *p, [](context&) -> task<int> { co_return 3; });
    co_await cx.sleep(1ms);
    CHECK(*co_await troupe::cancel_pooled(cx, *queued));
    CHECK(*co_await troupe::cancel_pooled(cx, *running));
    CHECK(*cleaned); // answered once the worker is gone: its RAII cleanup ran
    CHECK_FALSE(*co_await troupe::cancel_pooled(cx, *running)); // terminal already
    auto a = co_await troupe::wait_for(cx, *running);
    auto b = co_await troupe::wait_for(cx, *queued);
    auto c = co_await troupe::wait_for(cx, *after);
    CHECK(a->status() == pool_task_status::cancelled);
    CHECK(b->status() == pool_task_status::cancelled);
    CHECK(troupe::is_cancellation(b->result().error()));
    CHECK(c->result() == 3); // the replaced worker runs the rest
    CHECK_FALSE(*queued_ran);
    auto snap = co_await troupe::snapshot_of(cx, *p);
    CHECK(snap->cancelled == 2);
    CHECK(snap->completed == 1);
  });
  CHECK(r);
}

TEST_CASE("a worker that crashes fails its job with the crash, is replaced, and the queue goes on") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto p = co_await troupe::open_pool(cx, spec_of("crash"));
    REQUIRE(p);
    auto boom = co_await troupe::submit(cx, *p, [](context& c) -> task<int> {
      // Kill the worker actor itself (what CAF's actor_pool would lose the message to).
      caf::anon_send_exit(caf::actor_cast<caf::actor>(c.self()), caf::exit_reason::kill);
      co_await c.sleep(1ms);
      co_return 0;
    });
    std::vector<troupe::pool_task<int>> rest;
    for (int i = 0; i < 3; ++i)
      rest.push_back(*co_await troupe::submit(cx, *p, [i](context&) -> task<int> { co_return i; }));
    auto b = co_await troupe::wait_for(cx, *boom);
    REQUIRE(b);
    CHECK(b->status() == pool_task_status::failed);
    CHECK(b->snapshot.error == caf::make_error(caf::exit_reason::kill));
    auto outs = co_await troupe::wait_for_all(cx, rest);
    REQUIRE(outs);
    for (int i = 0; i < 3; ++i)
      CHECK((*outs)[i].result() == i);
    auto snap = co_await troupe::snapshot_of(cx, *p);
    CHECK(snap->worker_restarts == 1);
    CHECK(snap->failed == 1);
    CHECK(snap->completed == 3);
  });
  CHECK(r);
}

TEST_CASE("an idempotent repeat returns the same task, running or finished") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto p = co_await troupe::open_pool(cx, spec_of("idem"));
    REQUIRE(p);
    auto runs = std::make_shared<int>(0);
    auto body = [runs](context& c) -> task<int> {
      co_await c.sleep(1ms);
      co_return ++*runs;
    };
    auto a = co_await troupe::submit(cx, *p, body, {.idempotency_key = "order-7"});
    auto b = co_await troupe::submit(cx, *p, body, {.idempotency_key = "order-7"});
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->id() == b->id());
    REQUIRE(co_await troupe::wait_for(cx, *a));
    auto c = co_await troupe::submit(cx, *p, body, {.idempotency_key = "order-7"});
    CHECK(c->id() == a->id());
    CHECK(c->status() == pool_task_status::completed);
    auto d = co_await troupe::submit(cx, *p, body, {.idempotency_key = "order-8"});
    CHECK(d->id() != a->id());
    REQUIRE(co_await troupe::wait_for(cx, *d));
    CHECK(*runs == 2);
    auto snap = co_await troupe::snapshot_of(cx, *p);
    CHECK(snap->total == 2);
  });
  CHECK(r);
}

// -- backpressure ---------------------------------------------------------------------------

TEST_CASE("block_submitter suspends the submitting task until there is room, FIFO") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto p = co_await troupe::open_pool(cx, bounded("bs", 1, pool_on_full::block_submitter));
    REQUIRE(p);
    auto log = std::make_shared<std::vector<int>>();
    REQUIRE(co_await troupe::submit(cx, *p, logged(log, 0, 10ms))); // runs
    REQUIRE(co_await troupe::submit(cx, *p, logged(log, 1, 1ms)));  // queued: full now
    auto admitted = std::make_shared<std::vector<int>>();
    auto blocked = [p, log, admitted](int n) {
      return [p, log, admitted, n](context& c) -> task<void> {
        auto h = co_await troupe::submit(c, *p, logged(log, n, 1ms));
        REQUIRE(h);
        admitted->push_back(n);
      };
    };
    auto s1 = cx.spawn(blocked(2));
    co_await cx.sleep(1ms);
    auto s2 = cx.spawn(blocked(3));
    co_await cx.sleep(1ms);
    auto snap = co_await troupe::snapshot_of(cx, *p);
    CHECK(snap->blocked_submitters == 2);
    CHECK(admitted->empty()); // both submitters wait, suspended
    CHECK(snap->queued == 1);
    REQUIRE(co_await cx.await(s1));
    REQUIRE(co_await cx.await(s2));
    REQUIRE(co_await troupe::wait_idle(cx, *p));
    CHECK(*admitted == std::vector<int>{2, 3});
    CHECK(*log == std::vector<int>{0, 1, 2, 3});
    snap = co_await troupe::snapshot_of(cx, *p);
    CHECK(snap->max_depth_seen == 1);
    CHECK(snap->rejected == 0);
  });
  CHECK(r);
}

TEST_CASE("drop_oldest rejects the oldest queued job, drop_newest the new one") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto log = std::make_shared<std::vector<int>>();
    auto old = co_await troupe::open_pool(cx, bounded("old", 2, pool_on_full::drop_oldest));
    REQUIRE(old);
    std::vector<troupe::pool_task<int>> hs;
    for (int i = 0; i < 5; ++i)
      hs.push_back(*co_await troupe::submit(cx, *old, logged(log, i, 2ms)));
    // 0 runs; 1 and 2 queued; 3 evicts 1, 4 evicts 2.
    auto r1 = co_await troupe::wait_for(cx, hs[1]);
    CHECK(r1->status() == pool_task_status::rejected);
    CHECK(r1->snapshot.rejection_policy == "drop_oldest");
    CHECK(fails_with(r1->result(), errc::pool_task_rejected));
    REQUIRE(co_await troupe::wait_idle(cx, *old));
    CHECK(*log == std::vector<int>{0, 3, 4});
    auto snap = co_await troupe::snapshot_of(cx, *old);
    CHECK(snap->rejected == 2);
    CHECK(snap->drops == std::vector<std::pair<std::string, uint64_t>>{{"drop_oldest", 2}});

    log->clear();
    auto nw = co_await troupe::open_pool(cx, bounded("new", 1, pool_on_full::drop_newest));
    REQUIRE(nw);
    auto a = co_await troupe::submit(cx, *nw, logged(log, 0, 2ms));
    auto b = co_await troupe::submit(cx, *nw, logged(log, 1, 2ms));
    auto c = co_await troupe::submit(cx, *nw, logged(log, 2, 2ms)); // full: dropped
    REQUIRE(c); // a rejection is not an error of the submit
    CHECK(c->status() == pool_task_status::rejected);
    CHECK(c->at_submit().rejection_policy == "drop_newest");
    REQUIRE(co_await troupe::wait_idle(cx, *nw));
    CHECK(*log == std::vector<int>{0, 1});
  });
  CHECK(r);
}

TEST_CASE("fail_submitter answers POL-001, fail_fast POL-002, ring_buffer keeps the newest") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto log = std::make_shared<std::vector<int>>();
    auto fs = co_await troupe::open_pool(cx, bounded("fs", 1, pool_on_full::fail_submitter));
    REQUIRE(fs);
    REQUIRE(co_await troupe::submit(cx, *fs, logged(log, 0, 2ms)));
    REQUIRE(co_await troupe::submit(cx, *fs, logged(log, 1, 2ms)));
    auto full = co_await troupe::submit(cx, *fs, logged(log, 2, 2ms));
    CHECK(fails_with(full, errc::pool_queue_full));
    CHECK(troupe::code_of(errc::pool_queue_full) == "TROUPE-POL-001");

    auto ff_spec = spec_of("ff");
    ff_spec.backpressure.kind = pool_backpressure_kind::fail_fast;
    auto ff = co_await troupe::open_pool(cx, ff_spec);
    REQUIRE(ff);
    REQUIRE(co_await troupe::submit(cx, *ff, logged(log, 10, 2ms)));
    auto busy = co_await troupe::submit(cx, *ff, logged(log, 11, 2ms));
    CHECK(fails_with(busy, errc::pool_no_worker));
    CHECK(troupe::code_of(errc::pool_no_worker) == "TROUPE-POL-002");
    REQUIRE(co_await troupe::wait_idle(cx, *ff));
    REQUIRE(co_await troupe::submit(cx, *ff, logged(log, 12, 2ms))); // free again
    REQUIRE(co_await troupe::wait_idle(cx, *ff));
    REQUIRE(co_await troupe::wait_idle(cx, *fs));

    auto rb_spec = spec_of("rb");
    rb_spec.backpressure.kind = pool_backpressure_kind::ring_buffer;
    rb_spec.backpressure.capacity = 2;
    auto rb = co_await troupe::open_pool(cx, rb_spec);
    REQUIRE(rb);
    log->clear();
    for (int i = 0; i < 6; ++i)
      REQUIRE(co_await troupe::submit(cx, *rb, logged(log, i, 2ms)));
    REQUIRE(co_await troupe::wait_idle(cx, *rb));
    CHECK(*log == std::vector<int>{0, 4, 5}); // 0 ran at once; the newest 2 of the rest kept
    auto snap = co_await troupe::snapshot_of(cx, *rb);
    CHECK(snap->drops == std::vector<std::pair<std::string, uint64_t>>{{"ring_buffer", 3}});
  });
  CHECK(r);
}

TEST_CASE("a closed pool refuses submits and answers its blocked submitters") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto p = co_await troupe::open_pool(cx, bounded("cl", 1, pool_on_full::block_submitter));
    REQUIRE(p);
    auto log = std::make_shared<std::vector<int>>();
    auto running = co_await troupe::submit(cx, *p, logged(log, 0, 5ms));
    REQUIRE(co_await troupe::submit(cx, *p, logged(log, 1, 1ms)));
    auto blocked = cx.spawn([p, log](context& c) -> task<bool> {
      auto h = co_await troupe::submit(c, *p, logged(log, 2));
      co_return fails_with(h, errc::pool_closed);
    });
    co_await cx.sleep(1ms);
    CHECK(*co_await troupe::close_pool(cx, *p));
    CHECK_FALSE(*co_await troupe::close_pool(cx, *p));
    CHECK(*co_await cx.await(blocked));
    auto late = co_await troupe::submit(cx, *p, logged(log, 3));
    CHECK(fails_with(late, errc::pool_closed));
    CHECK(field_if_failed(late) == "pool");
    REQUIRE(co_await troupe::wait_idle(cx, *p));
    CHECK(*log == std::vector<int>{0, 1}); // accepted work still finishes
  });
  CHECK(r);
}

TEST_CASE("drops, submits and dequeues are audited on the event log when storage is present") {
  troupe_test::temp_dir dir;
  auto rt = troupe_test::make_rt(dir.file("audit.sqlite"));
  auto r = rt.run([](context& cx) -> task<void> {
    auto spec = bounded("aud", 1, pool_on_full::drop_oldest);
    spec.audit = troupe::pool_audit::receipts;
    auto p = co_await troupe::open_pool(cx, spec);
    REQUIRE(p);
    co_await cx.sleep(1ms); // the pool finds the storage
    auto log = std::make_shared<std::vector<int>>();
    for (int i = 0; i < 3; ++i)
      REQUIRE(co_await troupe::submit(cx, *p, logged(log, i, 1ms)));
    REQUIRE(co_await troupe::wait_idle(cx, *p));
    std::vector<json> events;
    for (int tries = 0; tries < 100 && events.size() < 7; ++tries) {
      co_await cx.sleep(1ms);
      auto rs = co_await troupe::event_read(cx, "pool.audit", 0, 100);
      REQUIRE(rs);
      events.clear();
      for (auto& e : *rs)
        events.push_back(json::parse(e.payload));
    }
    int submits = 0, dequeues = 0, drops = 0;
    for (auto& e : events) {
      auto kind = e["event"].get<std::string>();
      submits += kind == "submit";
      dequeues += kind == "dequeue";
      if (kind == "drop") {
        ++drops;
        CHECK(e["pool"] == "aud");
        CHECK(e["task"] == 2);
        CHECK(e["policy"] == "drop_oldest");
        CHECK(e["max_depth"] == 1);
      }
    }
    CHECK(submits == 3);
    CHECK(dequeues == 2);
    CHECK(drops == 1);
  });
  CHECK(r);
}

// -- runner pools ---------------------------------------------------------------------------

TEST_CASE("a runner pool scales by generations: the old one drains and stops, it is not extended") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto s = spec_of("runners", 2);
    s.runners = {1, 4, troupe::pool_restart::permanent};
    auto p = co_await troupe::open_pool(cx, s);
    REQUIRE(p);
    co_await cx.sleep(1ms);
    auto st = co_await troupe::runners_of(cx, *p);
    REQUIRE(st);
    CHECK(st->generation == 1);
    CHECK(st->desired == 2);
    CHECK(st->online == 2);
    CHECK(st->busy == 0);
    REQUIRE(st->slots.size() == 2);
    CHECK(st->slots[0].lifecycle == troupe::runner_lifecycle::idle);
    auto log = std::make_shared<std::vector<int>>();
    // Two long jobs keep generation 1 busy; then scale to 3.
    auto a = co_await troupe::submit(cx, *p, logged(log, 1, 10ms));
    auto b = co_await troupe::submit(cx, *p, logged(log, 2, 10ms));
    co_await cx.sleep(1ms);
    st = co_await troupe::runners_of(cx, *p);
    CHECK(st->busy == 2);
    auto scaled = co_await troupe::scale_pool(cx, *p, 3);
    REQUIRE(scaled);
    CHECK(scaled->generation == 2);
    CHECK(scaled->desired == 3);
    CHECK(scaled->slots.size() == 5); // 2 draining + 3 new: the old generation is not reused
    CHECK(scaled->slots[0].lifecycle == troupe::runner_lifecycle::draining);
    CHECK(scaled->slots[0].generation == 1);
    CHECK(scaled->slots[4].generation == 2);
    // New work goes to generation 2 while generation 1 finishes its jobs.
    std::vector<troupe::pool_task<int>> more;
    for (int i = 0; i < 3; ++i)
      more.push_back(*co_await troupe::submit(cx, *p, logged(log, 10 + i, 2ms)));
    co_await cx.sleep(3ms);
    CHECK(log->size() == 3); // the three new ones ran beside the two old ones
    REQUIRE(co_await troupe::wait_for(cx, *a));
    REQUIRE(co_await troupe::wait_for(cx, *b));
    co_await cx.sleep(1ms);
    st = co_await troupe::runners_of(cx, *p);
    CHECK(st->online == 3);
    CHECK(st->slots[0].lifecycle == troupe::runner_lifecycle::stopped);
    CHECK(st->slots[1].lifecycle == troupe::runner_lifecycle::stopped);
    CHECK(st->slots[2].lifecycle == troupe::runner_lifecycle::idle);
    auto snap = co_await troupe::snapshot_of(cx, *p);
    CHECK(snap->max_concurrent == 3);
    CHECK(snap->completed == 5);
    // Bad input: outside [min, max], or a fixed pool.
    auto over = co_await troupe::scale_pool(cx, *p, 5);
    CHECK(fails_with(over, errc::invalid_pool_spec));
    CHECK(field_if_failed(over) == "n");
    CHECK(fails_with(co_await troupe::scale_pool(cx, *p, 0), errc::invalid_pool_spec));
    auto fixed = co_await troupe::open_pool(cx, spec_of("fixed"));
    CHECK(field_if_failed(co_await troupe::scale_pool(cx, *fixed, 2)) == "n");
  });
  CHECK(r);
}

TEST_CASE("runner restart modes: temporary runners are not replaced above min") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto s = spec_of("temp", 3);
    s.runners = {2, 3, troupe::pool_restart::temporary};
    auto p = co_await troupe::open_pool(cx, s);
    REQUIRE(p);
    auto crash = [](context& c) -> task<int> {
      caf::anon_send_exit(caf::actor_cast<caf::actor>(c.self()), caf::exit_reason::kill);
      co_await c.sleep(1ms);
      co_return 0;
    };
    REQUIRE(co_await troupe::wait_for(cx, *co_await troupe::submit(cx, *p, crash)));
    co_await cx.sleep(1ms);
    auto st = co_await troupe::runners_of(cx, *p);
    CHECK(st->online == 2); // 3 -> 2: not replaced
    REQUIRE(co_await troupe::wait_for(cx, *co_await troupe::submit(cx, *p, crash)));
    co_await cx.sleep(1ms);
    st = co_await troupe::runners_of(cx, *p);
    CHECK(st->online == 2); // at min: replaced
    uint64_t restarts = 0;
    for (auto& slot : st->slots)
      restarts += slot.restarts;
    CHECK(restarts == 1);
    // Bad specs: min < 1, max < min, initial outside [min, max], unknown restart (JSON).
    auto bad = spec_of("b", 5);
    bad.runners = {1, 4, troupe::pool_restart::permanent};
    CHECK(field_if_failed(co_await troupe::open_pool(cx, bad)) == "max_concurrent");
    bad.runners = {3, 2, troupe::pool_restart::permanent};
    CHECK(field_if_failed(co_await troupe::open_pool(cx, bad)) == "runners.max");
    bad.runners = {0, 2, troupe::pool_restart::permanent};
    CHECK(field_if_failed(co_await troupe::open_pool(cx, bad)) == "runners.min");
    auto j = co_await troupe::open_pool(
        cx, json{{"name", "j"}, {"runners", {{"min", 1}, {"max", 2}, {"restart", "sometimes"}}}});
    CHECK(field_if_failed(j) == "runners.restart");
    auto ok = troupe::pool_spec_from_json(
        json{{"name", "j"}, {"runners", {{"min", 1}, {"max", 4}, {"initial", 2}}}});
    REQUIRE(ok);
    CHECK(ok->max_concurrent == 2);
    CHECK(ok->runners.max == 4);
  });
  CHECK(r);
}

// -- durable (pipeline) pools -----------------------------------------------------------------

TEST_CASE("a pipeline pool reloads terminal records and the idempotency index after a restart") {
  troupe_test::temp_dir dir;
  auto db = dir.file("pools.sqlite");
  auto pipeline_spec = [] {
    auto s = spec_of("durable");
    s.scope = troupe::pool_scope::pipeline;
    return s;
  };
  std::string first_id;
  {
    auto rt = troupe_test::make_rt(db);
    auto r = rt.run([&](context& cx) -> task<void> {
      cx.set_local<std::string>("pipeline_id", "p7");
      auto p = co_await troupe::open_pool(cx, pipeline_spec());
      REQUIRE(p);
      first_id = p->id();
      auto a = co_await troupe::submit(cx, *p, [](context&) -> task<json> {
        co_return json{{"answer", 42}};
      }, {.idempotency_key = "a"});
      REQUIRE(a);
      REQUIRE(co_await troupe::wait_for(cx, *a));
      auto b = co_await troupe::submit(cx, *p, [](context&) -> task<int> { co_return 7; },
                                       {.idempotency_key = "b"});
      REQUIRE(b);
      REQUIRE(co_await troupe::wait_for(cx, *b));
      // Still running and still queued when the runtime goes: both come back stale.
      auto c = co_await troupe::submit(cx, *p, [](context& w) -> task<int> {
        co_await w.sleep(1h);
        co_return 1;
      }, {.idempotency_key = "c"});
      REQUIRE(c);
      auto d = co_await troupe::submit(cx, *p, [](context&) -> task<int> { co_return 2; },
                                       {.idempotency_key = "d"});
      REQUIRE(d);
      co_await cx.sleep(1ms);
      // Without an active pipeline it is refused; tenant scope needs a host.
      auto none = cx.spawn([](context& c2) -> task<bool> {
        (void)c2.erase_local("pipeline_id");
        auto s = spec_of("x");
        s.scope = troupe::pool_scope::pipeline;
        co_return fails_with(co_await troupe::open_pool(c2, s), errc::no_scope_context);
      });
      CHECK(*co_await cx.await(none));
    });
    REQUIRE(r);
    rt.stop();
  }
  auto rt = troupe_test::make_rt(db);
  auto r = rt.run([&](context& cx) -> task<void> {
    cx.set_local<std::string>("pipeline_id", "p7");
    auto p = co_await troupe::open_pool(cx, pipeline_spec());
    REQUIRE(p);
    CHECK(p->id() == first_id); // deterministic: scope, pipeline id, name
    auto all = co_await troupe::tasks_of(cx, *p);
    REQUIRE(all);
    REQUIRE(all->size() == 4);
    CHECK((*all)[0].status == pool_task_status::completed);
    CHECK((*all)[1].status == pool_task_status::completed);
    for (int i = 2; i < 4; ++i) {
      CHECK((*all)[i].status == pool_task_status::failed);
      CHECK((*all)[i].stale);
      CHECK(troupe::is((*all)[i].error, errc::pool_task_stale));
    }
    // An idempotent repeat of a finished task answers it, with its result from the store.
    auto a = co_await troupe::submit(cx, *p, [](context&) -> task<json> { co_return json{}; },
                                     {.idempotency_key = "a"});
    REQUIRE(a);
    CHECK(a->id() == (*all)[0].id);
    CHECK(a->status() == pool_task_status::completed);
    auto ra = co_await troupe::wait_for(cx, *a);
    REQUIRE(ra);
    CHECK(ra->result() == json{{"answer", 42}});
    auto b = co_await troupe::submit(cx, *p, [](context&) -> task<int> { co_return 0; },
                                     {.idempotency_key = "b"});
    auto rb = co_await troupe::wait_for(cx, *b);
    CHECK(rb->result() == 7);
    // A stale one's key runs fresh.
    auto c = co_await troupe::submit(cx, *p, [](context&) -> task<int> { co_return 3; },
                                     {.idempotency_key = "c"});
    REQUIRE(c);
    CHECK(c->id() > (*all)[3].id);
    auto rc = co_await troupe::wait_for(cx, *c);
    CHECK(rc->result() == 3);
  });
  CHECK(r);
}

TEST_CASE("a pipeline pool compacts terminal records past keep_terminal") {
  troupe_test::temp_dir dir;
  auto db = dir.file("compact.sqlite");
  auto rt = troupe_test::make_rt(db);
  auto r = rt.run([&](context& cx) -> task<void> {
    cx.set_local<std::string>("pipeline_id", "c1");
    auto s = spec_of("small");
    s.scope = troupe::pool_scope::pipeline;
    s.keep_terminal = 10;
    auto p = co_await troupe::open_pool(cx, s);
    REQUIRE(p);
    for (int i = 0; i < 600; ++i)
      REQUIRE(co_await troupe::submit(cx, *p, [](context&) -> task<int> { co_return 1; }));
    REQUIRE(co_await troupe::wait_idle(cx, *p));
    auto mine = co_await troupe::tasks_of(cx, *p);
    REQUIRE(mine);
    CHECK(mine->size() == 10); // in memory
  });
  REQUIRE(r);
  rt.stop();
  auto rt2 = troupe_test::make_rt(db);
  auto r2 = rt2.run([&](context& cx) -> task<size_t> {
    cx.set_local<std::string>("pipeline_id", "c1");
    auto s = spec_of("small");
    s.scope = troupe::pool_scope::pipeline;
    s.keep_terminal = 10;
    auto p = co_await troupe::open_pool(cx, s);
    REQUIRE(p);
    co_return (co_await troupe::tasks_of(cx, *p))->size();
  });
  REQUIRE(r2);
  CHECK(*r2 >= 10);
  CHECK(*r2 < 300); // compacted every 256 terminal saves
}

// -- real time ------------------------------------------------------------------------------

TEST_CASE("on real threads, 20k jobs from 4 submitters through a bounded pool all complete") {
  auto rt = make_real_rt();
  auto r = rt.run([](context& cx) -> task<uint64_t> {
    auto p = co_await troupe::open_pool(cx, bounded("rt", 8, pool_on_full::block_submitter));
    auto spec = bounded("rt2", 8, pool_on_full::block_submitter);
    spec.max_concurrent = 2;
    auto q = troupe_test::must(co_await troupe::open_pool(cx, spec));
    (void)p;
    auto sum = std::make_shared<std::atomic<int64_t>>(0);
    auto res = co_await cx.parallel(4, [q, sum](context& c, size_t k) -> task<int> {
      for (int i = 0; i < 5000; ++i)
        troupe_test::must(co_await troupe::submit(c, q, [sum, i, k](context&) -> task<void> {
          sum->fetch_add(static_cast<int64_t>(k) * 5000 + i);
          co_return;
        }));
      co_return 0;
    });
    troupe_test::must(res);
    auto snap = troupe_test::must(co_await troupe::wait_idle(cx, q));
    if (sum->load() != int64_t{20000} * 19999 / 2) throw std::runtime_error("lost a job");
    if (snap.max_depth_seen > 8) throw std::runtime_error("bound exceeded");
    co_return snap.completed;
  });
  REQUIRE(r);
  CHECK(*r == 20000);
}
