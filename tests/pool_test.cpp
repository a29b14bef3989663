// Worker pools: queue strategies, specs and bad input, running jobs, backpressure.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <map>
#include <random>

#include <troupe/actors/detail/record_table.hpp>

#include "pool_support.hpp"

// -- the job record table, without an actor -------------------------------------------------

TEST_CASE("the pool's record table agrees with a map through inserts, trims and reuse") {
  struct rec {
    std::string text;
    std::shared_ptr<int> held;
  };
  troupe::detail::record_table<rec> t;
  std::map<uint64_t, std::string> ref;
  std::mt19937_64 rng{7};
  uint64_t next = 1;
  auto held = std::make_shared<int>(1);
  // Sequential ids (as a pool assigns them) and scattered ones (a durable pool's reload),
  // the table kept near its fullest (31 of 64 index slots) so that probe runs form, wrap
  // around and shift back when a record in them is erased; every record is looked up after
  // every step.
  size_t lost = 0;
  for (int step = 0; step < 20000; ++step) {
    if (ref.size() < 31 && (rng() % 3 != 0 || ref.empty())) {
      auto id = rng() % 2 == 0 ? next++ : next + 1 + rng() % 1'000'000;
      if (ref.count(id) != 0) continue;
      auto& r = t[id];
      CHECK(r.text.empty()); // a reused slot comes back empty
      r.text = "job-" + std::to_string(id);
      r.held = held;
      ref[id] = r.text;
    } else {
      auto i = std::next(ref.begin(), static_cast<long>(rng() % ref.size()));
      auto* e = t.find(i->first);
      REQUIRE(e != t.end());
      CHECK(e->first == i->first);
      t.erase(e);
      ref.erase(i);
    }
    for (auto& [id, text] : ref) {
      auto* e = t.find(id);
      if (e == t.end() || e->second.text != text) ++lost;
    }
    CHECK(t.find(next + 2'000'000) == t.end());
  }
  CHECK(lost == 0);
  // Growth: 10k more records, the index doubling several times.
  for (int k = 0; k < 10000; ++k) {
    auto id = next++;
    t[id].text = "job-" + std::to_string(id);
    t[id].held = held;
    ref[id] = "job-" + std::to_string(id);
  }
  CHECK(t.size() == ref.size());
  size_t seen = 0;
  t.for_each([&](uint64_t id, rec& r) {
    ++seen;
    CHECK(ref.at(id) == r.text);
  });
  CHECK(seen == ref.size());
  for (auto& [id, text] : ref)
    CHECK(t.at(id).text == text);
  CHECK_THROWS_AS(t.at(next + 5), std::out_of_range);
  // An erased record's members are released at once, not when its slot is reused.
  CHECK(held.use_count() == static_cast<long>(ref.size()) + 1);
  t.clear();
  CHECK(t.size() == 0);
  CHECK(held.use_count() == 1);
  CHECK(t.find(1) == t.end());
}


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

TEST_CASE("priority: jobs put back go where they were among equals") {
  troupe::detail::pool_queue q{pool_queue_kind::priority};
  for (uint64_t i = 1; i <= 4; ++i)
    q.push(i, i, 0, "", false);
  q.push(5, 5, 3, "", false);
  CHECK(q.pop() == 5u);
  CHECK(q.pop() == 1u);
  CHECK(q.pop() == 2u);
  q.requeue(2, 2, 0, "", false); // in the reverse of the order they were popped
  q.requeue(1, 1, 0, "", false);
  q.requeue(5, 5, 3, "", false);
  CHECK(drain(q) == std::vector<int>{5, 1, 2, 3, 4});
}

TEST_CASE("priority: removed jobs in a bucket never reached do not pile up") {
  // A low-priority job starves while high-priority ones pass; low-priority jobs submitted
  // and cancelled meanwhile are dropped from its bucket, not kept until it is reached.
  troupe::detail::pool_queue q{pool_queue_kind::priority};
  q.push(1, 1, -1, "", false);
  uint64_t next = 2;
  size_t worst = 0;
  for (int i = 0; i < 10'000; ++i) {
    auto hi = next++;
    q.push(hi, hi, 5, "", false);
    auto lo = next++;
    q.push(lo, lo, -1, "", false);
    REQUIRE(q.remove(lo, lo));
    REQUIRE(q.pop() == hi);
    worst = std::max(worst, q.bucket_places());
  }
  CHECK(worst <= 2 * q.size() + 64 + 2);
  CHECK(q.size() == 1);
  CHECK(drain(q) == std::vector<int>{1});
  CHECK(q.bucket_places() <= 1);
  // Removals first, then the queue shrinks by pops: the bound holds as it shrinks too.
  troupe::detail::pool_queue p{pool_queue_kind::priority};
  for (uint64_t i = 1; i <= 100; ++i) {
    p.push(i, i, 0, "", false);
    p.push(100 + i, 100 + i, 5, "", false);
  }
  for (uint64_t i = 1; i <= 100; ++i)
    REQUIRE(p.remove(i, i));
  for (int i = 0; i < 99; ++i)
    REQUIRE(p.pop().has_value());
  CHECK(p.size() == 1);
  CHECK(p.bucket_places() <= 2 * p.size() + 64);
  CHECK(p.pop() == 200u);
}

TEST_CASE("the queue finds jobs by seq in a window that stays dense") {
  // A low-priority job starves while 10k high-priority ones pass: the window of slots
  // indexed by seq would span all 10k; it moves the starving job aside instead.
  troupe::detail::pool_queue q{pool_queue_kind::priority};
  q.push(1, 1, -1, "", false);
  size_t worst = 0;
  for (uint64_t s = 2; s <= 10'001; ++s) {
    q.push(s, s, 5, "", false);
    worst = std::max(worst, q.window_span()); // two queued: at most 2 * 2 + 64 slots
    REQUIRE(q.pop() == s);
  }
  CHECK(worst <= 2 * 2 + 64);
  CHECK(q.oldest() == std::pair<uint64_t, uint64_t>{1, 1}); // found aside, by its seq
  CHECK_FALSE(q.remove(1, 2));
  CHECK(q.ids() == std::vector<uint64_t>{1});
  // Put back behind the window (its worker ended): found, ordered, removable.
  q.push(10'002, 10'002, 0, "", false);
  q.push(10'003, 10'003, 0, "", false);
  q.requeue(500, 500, 5, "", false);
  CHECK(q.ids() == std::vector<uint64_t>{1, 500, 10'002, 10'003});
  CHECK(q.size() == 4);
  CHECK(q.remove(10'002, 10'002)); // a hole in the window, skipped when reached
  CHECK(q.oldest() == std::pair<uint64_t, uint64_t>{1, 1});
  CHECK(drain(q) == std::vector<int>{500, 10'003, 1});
  CHECK(q.empty());
  CHECK(q.window_span() == 0);
  // Ids need not follow seqs (a credited post's id is reserved before its seq).
  troupe::detail::pool_queue f{pool_queue_kind::fifo};
  f.push(7, 1, 0, "", false);
  f.push(3, 2, 0, "", false);
  f.push(9, 3, 0, "", false);
  CHECK_FALSE(f.remove(3, 3));
  CHECK(f.remove(3, 2));
  CHECK(f.oldest() == std::pair<uint64_t, uint64_t>{7, 1});
  CHECK(drain(f) == std::vector<int>{7, 9});
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

TEST_CASE("fifo: jobs put back by two workers start oldest first, whichever went back first") {
  troupe::detail::pool_queue q{pool_queue_kind::fifo};
  push_range(q, 1, 8);
  pop_n(q, 6);                // worker A took 1..3, worker B 4..6; 7, 8 still queued
  requeue_all(q, {3, 2, 1}); // A ended first: its batch goes back in reverse
  requeue_all(q, {6, 5, 4}); // then B's
  q.push(9, 9, 0, "", false);
  CHECK(drain(q) == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9}); // was 4,5,6,1,2,3,7,8,9
  // B's batch (3) going back before A's (1, then 2): the same order.
  push_range(q, 1, 4);
  pop_n(q, 3);
  requeue_all(q, {3, 1, 2});
  CHECK(drain(q) == std::vector<int>{1, 2, 3, 4});
}

TEST_CASE("fair_round_robin: a job put back keeps its place in its partition and its turn") {
  troupe::detail::pool_queue q{pool_queue_kind::fair_round_robin};
  q.push(1, 1, 0, "a", true);
  q.push(2, 2, 0, "a", true);
  q.push(3, 3, 0, "b", true);
  q.push(4, 4, 0, "a", true);
  q.push(5, 5, 0, "c", true);
  CHECK(q.pop() == 1u); // a
  CHECK(q.pop() == 3u); // b, which runs empty and leaves the rotation
  CHECK(q.pop() == 5u); // c, likewise
  CHECK(q.pop() == 2u); // a again
  // The worker that held 1 and 3 ends: both go back (in reverse of their pops).
  q.requeue(3, 3, 0, "b", true);
  q.requeue(1, 1, 0, "a", true);
  // a: 1 goes before 4 (was behind it); b rejoins at the next turn, not after c's place.
  q.push(6, 6, 0, "b", true);
  CHECK(drain(q) == std::vector<int>{3, 1, 6, 4}); // was 1 first for a, b at the end: 1,3,4,6
  // Two workers' batches of one partition, the first batch put back first.
  push_range(q, 1, 4, "a");
  pop_n(q, 4);
  requeue_all(q, {2, 1, 4, 3}, "a");
  CHECK(drain(q) == std::vector<int>{1, 2, 3, 4}); // was 3,4,1,2
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

TEST_CASE("fair_round_robin forgets a partition once it runs empty") {
  troupe::detail::pool_queue q{pool_queue_kind::fair_round_robin};
  for (uint64_t i = 1; i <= 1000; ++i) // a key per request
    q.push(i, i, 0, "req-" + std::to_string(i), true);
  CHECK(q.partitions() == 1000);
  CHECK(drain(q).size() == 1000);
  CHECK(q.partitions() == 0);
  // A key seen again joins at the end of the rotation.
  q.push(1, 1, 0, "a", true);
  q.push(2, 2, 0, "b", true);
  q.push(3, 3, 0, "a", true);
  CHECK(q.pop() == 1u); // a, then b
  CHECK(q.pop() == 2u); // b runs empty and leaves
  q.push(4, 4, 0, "b", true); // b again: after a
  q.push(5, 5, 0, "c", true);
  CHECK(drain(q) == std::vector<int>{3, 4, 5});
  // Removed jobs do not keep a partition alive.
  q.push(6, 6, 0, "x", true);
  q.push(7, 7, 0, "y", true);
  CHECK(q.remove(6, 6));
  CHECK(q.pop() == 7u);
  CHECK(q.partitions() == 0);
}

TEST_CASE("a removed job never starts, and oldest() names the first submitted") {
  for (auto kind : {pool_queue_kind::priority, pool_queue_kind::fifo, pool_queue_kind::lifo,
                    pool_queue_kind::fair_round_robin}) {
    troupe::detail::pool_queue q{kind};
    for (uint64_t i = 1; i <= 5; ++i)
      q.push(i, i, static_cast<int64_t>(i % 2), i % 2 ? "x" : "y", true);
    CHECK(q.oldest() == std::pair<uint64_t, uint64_t>{1, 1});
    CHECK_FALSE(q.remove(1, 2)); // not queued as that
    CHECK(q.remove(1, 1));
    CHECK_FALSE(q.remove(1, 1));
    CHECK(q.remove(4, 4));
    CHECK(q.oldest() == std::pair<uint64_t, uint64_t>{2, 2});
    CHECK(q.size() == 3);
    auto left = drain(q);
    std::sort(left.begin(), left.end());
    CHECK(left == std::vector<int>{2, 3, 5});
    CHECK(q.empty());
  }
}

// -- specs and bad input --------------------------------------------------------------------

TEST_CASE("queued and running are the only live statuses, and every status has its name") {
  CHECK_FALSE(troupe::is_terminal(pool_task_status::queued));
  CHECK_FALSE(troupe::is_terminal(pool_task_status::running));
  for (auto s : {pool_task_status::completed, pool_task_status::failed, pool_task_status::rejected,
                 pool_task_status::cancelled})
    CHECK(troupe::is_terminal(s));
  CHECK(troupe::to_string(pool_task_status::cancelled) == "cancelled");
  CHECK(troupe::to_string(troupe::runner_lifecycle::draining) == "draining");
  CHECK(troupe::to_string(troupe::pool_restart::temporary) == "temporary");
}

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
  // a cluster pool's placement
  auto r = troupe::pool_spec_from_json(json::parse(
      R"({"name":"p","remote":{"nodes":["b","c"],"retry_on_node_down":true}})"));
  REQUIRE(r);
  CHECK(r->remote.nodes == std::vector<std::string>{"b", "c"});
  CHECK(r->remote.retry_on_node_down);
  CHECK(troupe::pool_spec_from_json(troupe::to_json(*r)) == r);
  CHECK(field_if_failed(bad(R"({"name":"p","remote":{"nodes":"b"}})")) == "remote.nodes");
  CHECK(field_if_failed(bad(R"({"name":"p","remote":{"nodes":["b",""]}})")) == "remote.nodes[1]");
  CHECK(field_if_failed(bad(R"({"name":"p","remote":{"nodes":[3]}})")) == "remote.nodes[0]");
  CHECK(field_if_failed(bad(R"({"name":"p","remote":{"retry_on_node_down":1}})")) ==
        "remote.retry_on_node_down");
  CHECK(field_if_failed(bad(R"({"name":"p","remote":{"placement":"all"}})")) == "remote.placement");
  CHECK(field_if_failed(bad(R"({"name":"p","remote":[]})")) == "remote");
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
    // A handle and its copies share the snapshot of the submit; an empty one is invalid.
    auto copy = hs[2];
    CHECK(&copy.at_submit() == &hs[2].at_submit());
    CHECK(copy.id() == hs[2].id());
    troupe::pool_task<int> none;
    CHECK_FALSE(none.valid());
    CHECK(none.id() == 0);
    CHECK(none.status() == pool_task_status::queued);
    CHECK(none.key().empty());
    auto w = co_await troupe::wait_for(cx, none);
    REQUIRE_FALSE(w);
    CHECK(troupe::is(w.error(), troupe::errc::invalid_handle));
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
      out.push_back(must(co_await troupe::submit(c, *p, [seen](context& w) -> task<int> {
        *seen = w.current_deadline().has_value();
        co_await w.sleep(50ms); // outlives the deadline
        co_return 1;
      })));
      out.push_back(must(co_await troupe::submit(c, *p, [ran_late](context&) -> task<int> {
        *ran_late = true; // queued behind the first: its deadline passes first
        co_return 2;
      })));
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
    CHECK(must(co_await troupe::cancel_pooled(cx, *queued)));
    CHECK(must(co_await troupe::cancel_pooled(cx, *running)));
    CHECK(*cleaned); // answered once the worker is gone: its RAII cleanup ran
    CHECK_FALSE(must(co_await troupe::cancel_pooled(cx, *running))); // terminal already
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
      rest.push_back(must(co_await troupe::submit(cx, *p, [i](context&) -> task<int> { co_return i; })));
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

TEST_CASE("a blocked submitter that is cancelled withdraws its submit: it never runs") {
  for (bool graceful : {false, true}) {
    CAPTURE(graceful);
    auto rt = make_virtual_rt();
    auto r = rt.run([graceful](context& cx) -> task<void> {
      auto p = co_await troupe::open_pool(cx, bounded("wd", 1, pool_on_full::block_submitter));
      REQUIRE(p);
      auto log = std::make_shared<std::vector<int>>();
      REQUIRE(co_await troupe::submit(cx, *p, logged(log, 0, 10ms))); // runs
      REQUIRE(co_await troupe::submit(cx, *p, logged(log, 1, 1ms)));  // queued: full now
      auto threw = std::make_shared<bool>(false);
      auto s3 = cx.spawn([p, log, threw](context& c) -> task<void> {
        try {
          (void)co_await troupe::submit(c, *p, logged(log, 3, 1ms)); // blocked
        } catch (const troupe::task_cancelled&) {
          *threw = true;
          throw;
        }
      });
      auto s4 = cx.spawn([p, log](context& c) -> task<void> { // blocked behind s3
        co_await c.sleep(1ms);
        REQUIRE(co_await troupe::submit(c, *p, logged(log, 4, 1ms)));
      });
      co_await cx.sleep(2ms);
      CHECK(must(co_await troupe::snapshot_of(cx, *p)).blocked_submitters == 2);
      if (graceful)
        (void)co_await cx.cancel_graceful(s3, 1s);
      else
        (void)co_await cx.cancel(s3);
      (void)co_await cx.await(s3);
      CHECK(*threw == graceful); // a forced cancel destroys the frame: no handler runs
      co_await cx.sleep(1ms);
      CHECK(must(co_await troupe::snapshot_of(cx, *p)).blocked_submitters == 1);
      REQUIRE(co_await cx.await(s4));
      REQUIRE(co_await troupe::wait_idle(cx, *p));
      CHECK(*log == std::vector<int>{0, 1, 4}); // 3 never ran
      auto snap = must(co_await troupe::snapshot_of(cx, *p));
      CHECK(snap.total == 3);
      CHECK(snap.blocked_submitters == 0);
    });
    CHECK(r);
  }
}

TEST_CASE("a blocked submitter is admitted when a worker frees, even while room is reserved") {
  // A holds a credit (reserved room) and waits for its own job; B is blocked. When the
  // worker frees, B's job must run: a free worker with an empty queue is room.
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto p = co_await troupe::open_pool(cx, bounded("reserve", 1, pool_on_full::block_submitter));
    REQUIRE(p);
    auto log = std::make_shared<std::vector<int>>();
    auto a = co_await troupe::submit(cx, *p, logged(log, 1, 5ms));
    REQUIRE(a);
    auto b = cx.spawn([p, log](context& c) -> task<bool> {
      auto h = co_await troupe::submit(c, *p, logged(log, 2, 1ms));
      if (!h) co_return false;
      co_return static_cast<bool>(co_await troupe::wait_for(c, *h));
    });
    REQUIRE(co_await troupe::wait_for(cx, *a));
    CHECK(must(co_await cx.await(b))); // before the fix: B waited for A's credit, A for idle
    REQUIRE(co_await troupe::wait_idle(cx, *p));
    CHECK(*log == std::vector<int>{1, 2});
  });
  CHECK(r);
}

TEST_CASE("cancelling a running job in a batch takes the rest of the batch back to the queue") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto p = co_await troupe::open_pool(cx, spec_of("batch"));
    REQUIRE(p);
    auto log = std::make_shared<std::vector<int>>();
    REQUIRE(co_await troupe::submit(cx, *p, logged(log, 0, 5ms))); // holds the worker
    auto j = co_await troupe::submit(cx, *p, logged(log, 1, 10ms));
    auto k = co_await troupe::submit(cx, *p, logged(log, 2, 1ms));
    co_await cx.sleep(7ms); // the worker took [j, k] at 5 ms and runs j
    CHECK((co_await troupe::status_of(cx, *j))->status == pool_task_status::running);
    CHECK((co_await troupe::status_of(cx, *k))->status == pool_task_status::queued);
    CHECK(must(co_await troupe::cancel_pooled(cx, *j)));
    auto kk = co_await troupe::wait_for(cx, *k);
    REQUIRE(kk);
    CHECK(kk->result() == 2); // k was not hit by j's stop: it ran on the replacement
    CHECK((co_await troupe::wait_for(cx, *j))->status() == pool_task_status::cancelled);
    CHECK(*log == std::vector<int>{0, 2});
  });
  CHECK(r);
}

TEST_CASE("a job that ended inside a batch counts as completed, not active, in the pool's views") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<void> {
    auto p = must(co_await troupe::open_pool(cx, spec_of("views")));
    auto log = std::make_shared<std::vector<int>>();
    must(co_await troupe::submit(cx, p, logged(log, 0, 5ms))); // holds the worker
    auto quick = must(co_await troupe::submit(cx, p, [](context&) -> task<int> { co_return 2; }));
    must(co_await troupe::submit(cx, p, logged(log, 1, 1h)));
    co_await cx.sleep(6ms); // at 5 ms the worker took [quick, long]: quick ended, long runs
    auto s = must(co_await troupe::snapshot_of(cx, p));
    CHECK(s.active == 1); // was 2, above max_concurrent 1, until the long job ended
    CHECK(s.completed == 2);
    CHECK(s.queued == 0);
    auto all = must(co_await troupe::tasks_of(cx, p));
    REQUIRE(all.size() == 3);
    CHECK(all[1].id == quick.id());
    CHECK(all[1].status == pool_task_status::completed); // was running
    CHECK(all[2].status == pool_task_status::running);
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
      hs.push_back(must(co_await troupe::submit(cx, *old, logged(log, i, 2ms))));
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
    CHECK(must(co_await troupe::close_pool(cx, *p)));
    CHECK_FALSE(must(co_await troupe::close_pool(cx, *p)));
    CHECK(must(co_await cx.await(blocked)));
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
