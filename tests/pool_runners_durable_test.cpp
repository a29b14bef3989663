// Worker pools: runner pools, durable (pipeline) pools, and a real-time stress run.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "pool_support.hpp"
#include "sqlite_support.hpp"

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
      more.push_back(must(co_await troupe::submit(cx, *p, logged(log, 10 + i, 2ms))));
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
    REQUIRE(co_await troupe::wait_for(cx, must(co_await troupe::submit(cx, *p, crash))));
    co_await cx.sleep(1ms);
    auto st = co_await troupe::runners_of(cx, *p);
    CHECK(st->online == 2); // 3 -> 2: not replaced
    REQUIRE(co_await troupe::wait_for(cx, must(co_await troupe::submit(cx, *p, crash))));
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
  std::string first_id;
  {
    auto rt = troupe_test::make_rt(db);
    auto r = rt.run([&](context& cx) -> task<void> {
      cx.set_local<std::string>("pipeline_id", "p7");
      auto p = co_await troupe::open_pool(cx, pipeline_spec("durable"));
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
        co_return fails_with(co_await troupe::open_pool(c2, pipeline_spec("x")),
                             errc::no_scope_context);
      });
      CHECK(must(co_await cx.await(none)));
    });
    REQUIRE(r);
    rt.stop();
  }
  auto rt = troupe_test::make_rt(db);
  auto r = rt.run([&](context& cx) -> task<void> {
    cx.set_local<std::string>("pipeline_id", "p7");
    auto p = co_await troupe::open_pool(cx, pipeline_spec("durable"));
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

namespace {

/// How many pool records `db` holds (read behind troupe's back).
int64_t pool_rows(const std::string& db) {
  return troupe_test::select_int(db, "SELECT count(*) FROM pool_tasks");
}

} // namespace

TEST_CASE("a pipeline pool answers a repeat submit only after a commit of its record") {
  // A save that failed (storage fault): the submitter got storage_failed, and a repeat with
  // the same key saves the record again and is answered after that commit, never at once.
  troupe_test::temp_dir dir;
  auto db = dir.file("fault.sqlite");
  troupe::simulation sim{3, troupe::runtime::builder{}.storage(db)};
  REQUIRE(sim.ok());
  auto open = [](context& cx) {
    cx.set_local<std::string>("pipeline_id", "f1");
    return troupe::open_pool(cx, pipeline_spec("faulty"));
  };
  auto rows = [&] { return pool_rows(db); };
  sim.faults({.storage_write = 1.0});
  auto first = sim->run([&](context& cx) -> task<bool> {
    auto p = must(co_await open(cx));
    auto a = co_await troupe::submit(cx, p, [](context& w) -> task<int> {
      co_await w.sleep(1h);
      co_return 1;
    }, {.idempotency_key = "k"});
    co_return fails_with(a, errc::storage_failed);
  });
  REQUIRE(first);
  CHECK(*first);
  CHECK(rows() == 0);
  sim.faults({});
  auto second = sim->run([&](context& cx) -> task<int64_t> {
    auto p = must(co_await open(cx));
    auto a = must(co_await troupe::submit(cx, p, [](context&) -> task<int> { co_return 2; },
                                          {.idempotency_key = "k"}));
    CHECK(a.status() == pool_task_status::running); // the first submit's job
    co_return rows(); // read as the acknowledgement arrives
  });
  REQUIRE(second);
  CHECK(*second == 1);
}

TEST_CASE("a pipeline pool answers a blocked repeat submit only after the commit") {
  // Two blocked submits with one key: the first is admitted when room opens and answered
  // after its record's commit; the second (a repeat) is answered with it, not before. The
  // commit fails here (a storage fault), so both must answer storage_failed.
  troupe_test::temp_dir dir;
  auto db = dir.file("blocked.sqlite");
  troupe::simulation sim{4, troupe::runtime::builder{}.storage(db)};
  REQUIRE(sim.ok());
  auto open = [](context& cx) {
    cx.set_local<std::string>("pipeline_id", "b1");
    auto spec = pipeline_spec("blocking");
    spec.backpressure.kind = pool_backpressure_kind::queue;
    spec.backpressure.max_depth = 1;
    spec.backpressure.on_full = pool_on_full::block_submitter;
    return troupe::open_pool(cx, spec);
  };
  auto filled = sim->run([&](context& cx) -> task<bool> {
    auto p = must(co_await open(cx));
    auto slow = [](context& w) -> task<int> {
      co_await w.sleep(10ms);
      co_return 0;
    };
    must(co_await troupe::submit(cx, p, slow)); // runs until 10 ms
    must(co_await troupe::submit(cx, p, slow)); // queued: the pool is full
    co_return true;
  });
  REQUIRE(filled);
  auto answers = std::make_shared<std::vector<std::string>>();
  for (int i = 0; i < 2; ++i)
    REQUIRE(sim->spawn([&open, answers](context& c) -> task<void> {
      auto p = must(co_await open(c));
      auto a = co_await troupe::submit(c, p, [](context&) -> task<int> { co_return 1; },
                                       {.idempotency_key = "k"});
      answers->push_back(a ? "acknowledged" : troupe::render(a.error()));
    }));
  sim.run_for(1ms); // both blocked
  CHECK(answers->empty());
  sim.faults({.storage_write = 1.0});
  sim.run_for(50ms); // room at 10 ms: "k" is admitted, its save fails
  REQUIRE(answers->size() == 2);
  for (auto& a : *answers)
    CHECK(a.find("storage_failed") != std::string::npos);
  CHECK(pool_rows(db) == 2); // the two slow
}

TEST_CASE("a pipeline pool answers a submit whose record was trimmed before its commit") {
  // keep_terminal 1: two rejected submits in one turn of the pool; the second one's end
  // trims the first record while its save (and its submitter) still wait for the commit.
  troupe_test::temp_dir dir;
  auto db = dir.file("trim.sqlite");
  auto rt = troupe::runtime::builder{}.virtual_time().storage(db).build();
  REQUIRE(rt);
  auto answers = std::make_shared<std::vector<std::string>>();
  auto r = rt->run([answers](context& cx) -> task<void> {
    cx.set_local<std::string>("pipeline_id", "t1");
    auto spec = pipeline_spec("trim", 1);
    spec.backpressure = {pool_backpressure_kind::queue, 1, pool_on_full::drop_newest};
    auto p = must(co_await troupe::open_pool(cx, spec));
    auto slow = [](context& w) -> task<int> {
      co_await w.sleep(1h);
      co_return 0;
    };
    must(co_await troupe::submit(cx, p, slow)); // runs
    must(co_await troupe::submit(cx, p, slow)); // queued: the pool is full
    std::vector<troupe::task_handle<void>> hs;
    for (int i = 0; i < 2; ++i) // both submits reach the pool before it runs
      hs.push_back(cx.spawn([p, answers](context& c) -> task<void> {
        auto a = co_await troupe::submit(c, p, [](context&) -> task<int> { co_return 1; });
        answers->push_back(!a ? troupe::render(a.error())
                              : std::string{troupe::to_string(a->status())});
      }));
    for (auto& h : hs)
      co_await cx.await(h);
  });
  CHECK(r);
  // Both were rejected and their records committed (was: the first answered not_found).
  CHECK(*answers == std::vector<std::string>{"rejected", "rejected"});
}

TEST_CASE("a pipeline pool compacts terminal records past keep_terminal") {
  troupe_test::temp_dir dir;
  auto db = dir.file("compact.sqlite");
  auto rt = troupe_test::make_rt(db);
  auto r = rt.run([&](context& cx) -> task<void> {
    cx.set_local<std::string>("pipeline_id", "c1");
    auto p = co_await troupe::open_pool(cx, pipeline_spec("small", 10));
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
    auto p = co_await troupe::open_pool(cx, pipeline_spec("small", 10));
    REQUIRE(p);
    co_return (co_await troupe::tasks_of(cx, *p))->size();
  });
  REQUIRE(r2);
  CHECK(*r2 >= 10);
  CHECK(*r2 < 300); // compacted every 256 terminal saves
}

TEST_CASE("a pipeline pool with a large keep_terminal compacts every keep_terminal / 4 saves") {
  // keep 2000: compactions after 500, 1000, ... terminal saves (at the first flush past each).
  // 2750 jobs: the last compaction, at ~2500 saves, keeps ids ~501..2500; the 250 saved
  // since are on top: ~2250 records. Every 256 saves would have left 2000 + 2750 - 2560 =
  // 2190.
  troupe_test::temp_dir dir;
  auto db = dir.file("compact_large.sqlite");
  {
    auto rt = troupe_test::make_rt(db);
    auto r = rt.run([&](context& cx) -> task<void> {
      cx.set_local<std::string>("pipeline_id", "c2");
      auto p = co_await troupe::open_pool(cx, pipeline_spec("large", 2000));
      REQUIRE(p);
      for (int i = 0; i < 2750; ++i)
        REQUIRE(co_await troupe::submit(cx, *p, [](context&) -> task<int> { co_return 1; }));
      REQUIRE(co_await troupe::wait_idle(cx, *p));
    });
    REQUIRE(r);
    rt.stop();
  }
  auto rt2 = troupe_test::make_rt(db);
  auto r2 = rt2.run([&](context& cx) -> task<std::vector<uint64_t>> {
    cx.set_local<std::string>("pipeline_id", "c2");
    auto p = co_await troupe::open_pool(cx, pipeline_spec("large", 2000));
    REQUIRE(p);
    auto all = co_await troupe::tasks_of(cx, *p);
    REQUIRE(all);
    std::vector<uint64_t> ids;
    for (auto& t : *all)
      ids.push_back(t.id);
    std::sort(ids.begin(), ids.end());
    co_return ids;
  });
  REQUIRE(r2);
  CHECK(r2->size() >= 2200);
  CHECK(r2->size() <= 2250);
  if (!r2->empty()) {
    CHECK(r2->front() >= 501); // the oldest 500 were compacted away
    CHECK(r2->back() == 2750);
  }
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
