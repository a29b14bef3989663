// The durable rate limiter, and the storage under a full disk, a read-only file and a lock
// another process holds.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <sqlite3.h>

#include <troupe/troupe.hpp>

#include "sqlite_support.hpp"
#include "test_support.hpp"

using namespace std::chrono_literals;
using nlohmann::json;
using troupe::context;
using troupe::errc;
using troupe::rate_bucket;
using troupe::rate_limit_request;
using troupe::rate_limit_result;
using troupe::task;
using troupe_test::fails_with;
using troupe_test::make_rt;
using troupe_test::must;
using troupe_test::temp_dir;

namespace {

rate_limit_request one(std::string key, int64_t limit, int64_t units = 1, int64_t window = 1000,
                       int64_t timeout = 0) {
  rate_limit_request req;
  req.buckets.push_back(rate_bucket{std::move(key), limit, units, window});
  req.timeout_ms = timeout;
  return req;
}

/// Runs the helper with `args`, returns its exit status and what it printed (no Catch
/// assertion inside: it also runs on plain threads).
std::pair<int, std::string> run_helper(std::vector<std::string> args) {
  int out[2];
  if (::pipe(out) != 0) return {-2, "pipe failed"};
  auto pid = ::fork();
  if (pid < 0) return {-3, "fork failed"};
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    std::vector<char*> argv{const_cast<char*>(TROUPE_CRASH_WRITER)};
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(TROUPE_CRASH_WRITER, argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  std::string text;
  char buf[65536];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;)
    text.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}

} // namespace

TEST_CASE("a rate limit admits up to its limit per window, then answers at once or waits") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto r = rt.run([](context& cx) -> task<int> {
    for (int i = 0; i < 3; ++i) {
      auto x = must(co_await troupe::rate_limit_acquire(cx, one("api", 3)));
      CHECK(x.ok);
      CHECK(x.waited_ms == 0);
    }
    auto full = must(co_await troupe::rate_limit_acquire(cx, one("api", 3)));
    CHECK_FALSE(full.ok);
    CHECK(full.timed_out);
    CHECK(full.waited_ms == 0); // timeout 0: answered at once
    co_await cx.sleep(300ms);
    // the oldest reservation frees at 1000 ms: a 500 ms timeout is not enough
    auto short_wait = must(co_await troupe::rate_limit_acquire(cx, one("api", 3, 1, 1000, 500)));
    CHECK_FALSE(short_wait.ok);
    CHECK(short_wait.timed_out);
    CHECK(short_wait.waited_ms == 500);
    // at 800 ms: waits the remaining 200 ms, then is admitted
    auto waited = must(co_await troupe::rate_limit_acquire(cx, one("api", 3, 1, 1000, 5000)));
    CHECK(waited.ok);
    CHECK_FALSE(waited.timed_out);
    CHECK(waited.waited_ms == 200);
    // another key has its own quota
    CHECK(must(co_await troupe::rate_limit_acquire(cx, one("other", 1))).ok);
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("a multi-bucket reservation takes every bucket or none") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto r = rt.run([](context& cx) -> task<int> {
    rate_limit_request both;
    both.buckets = {rate_bucket{"a", 5, 1, 1000}, rate_bucket{"b", 1, 1, 1000}};
    CHECK(must(co_await troupe::rate_limit_acquire(cx, both)).ok);
    CHECK_FALSE(must(co_await troupe::rate_limit_acquire(cx, both)).ok); // b is full
    // a was not charged by the refused attempt: 4 units are still free in a
    CHECK(must(co_await troupe::rate_limit_acquire(cx, one("a", 5, 4))).ok);
    CHECK_FALSE(must(co_await troupe::rate_limit_acquire(cx, one("a", 5))).ok);
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("a reservation larger than its limit is one full-window charge on an empty bucket") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto r = rt.run([](context& cx) -> task<int> {
    CHECK(must(co_await troupe::rate_limit_acquire(cx, one("big", 3, 10))).ok);
    CHECK_FALSE(must(co_await troupe::rate_limit_acquire(cx, one("big", 3, 1))).ok);
    co_await cx.sleep(1000ms); // the window passed
    CHECK(must(co_await troupe::rate_limit_acquire(cx, one("big", 3, 1))).ok);
    // not empty: the oversized one waits for the bucket to empty
    auto x = must(co_await troupe::rate_limit_acquire(cx, one("big", 3, 10, 1000, 5000)));
    CHECK(x.ok);
    CHECK(x.waited_ms == 1000);
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("malformed rate-limit requests answer invalid_rate_limit naming the field") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto r = rt.run([](context& cx) -> task<int> {
    auto field = [&](json spec) -> task<std::string> {
      auto x = co_await troupe::rate_limit_acquire(cx, std::move(spec));
      REQUIRE_FALSE(x);
      CHECK(troupe_test::fails_with(x, errc::invalid_rate_limit));
      co_return troupe::field_of(x.error());
    };
    json b = {{"key", "k"}, {"limit", 2}};
    CHECK(co_await field({{"buckets", json::array()}, {"timeout_ms", 0}}) == "buckets");
    CHECK(co_await field({{"buckets", {b}}}) == "timeout_ms");
    CHECK(co_await field({{"buckets", {b}}, {"timeout_ms", -1}}) == "timeout_ms");
    CHECK(co_await field({{"buckets", {b}}, {"timeout_ms", "1"}}) == "timeout_ms");
    CHECK(co_await field({{"buckets", {b, b}}, {"timeout_ms", 0}}) == "buckets[1].key");
    CHECK(co_await field({{"buckets", {{{"limit", 2}}}}, {"timeout_ms", 0}}) == "buckets[0].key");
    CHECK(co_await field({{"buckets", {{{"key", "k"}}}}, {"timeout_ms", 0}}) == "buckets[0].limit");
    CHECK(co_await field({{"buckets", {{{"key", "k"}, {"limit", 0}}}}, {"timeout_ms", 0}}) ==
          "buckets[0].limit");
    CHECK(co_await field({{"buckets", {{{"key", "k"}, {"limit", 1}, {"units", 0}}}},
                          {"timeout_ms", 0}}) == "buckets[0].units");
    CHECK(co_await field({{"buckets", {{{"key", "k"}, {"limit", 1}, {"window_ms", 0}}}},
                          {"timeout_ms", 0}}) == "buckets[0].window_ms");
    CHECK(co_await field({{"buckets", {{{"key", ""}, {"limit", 1}}}}, {"timeout_ms", 0}}) ==
          "buckets[0].key");
    CHECK(co_await field({{"buckets", {b}}, {"timeout_ms", 0}, {"burst", 1}}) == "burst");
    CHECK(co_await field(json::array()) == "spec");
    CHECK(co_await field(
              {{"buckets", {{{"key", "k"}, {"limit", 1}, {"window_ms", int64_t{1} << 60}}}},
               {"timeout_ms", 0}}) == "buckets[0].window_ms");
    CHECK(co_await field({{"buckets", {{{"key", "k"}, {"limit", int64_t{1} << 62}}}},
                          {"timeout_ms", 0}}) == "buckets[0].limit");
    CHECK(co_await field({{"buckets", {b}}, {"timeout_ms", int64_t{1} << 62}}) == "timeout_ms");
    // defaults: units 1, window 60 s
    auto ok = must(co_await troupe::rate_limit_acquire(
        cx, json{{"buckets", {{{"key", "d"}, {"limit", 1}}}}, {"timeout_ms", 0}}));
    CHECK(ok.ok);
    co_await cx.sleep(59999ms);
    CHECK_FALSE(must(co_await troupe::rate_limit_acquire(cx, one("d", 1, 1, 60000))).ok);
    co_await cx.sleep(1ms);
    CHECK(must(co_await troupe::rate_limit_acquire(cx, one("d", 1, 1, 60000))).ok);
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("a state_path keeps the reservations in a file of its own") {
  temp_dir dir;
  auto main_db = dir.file("state.sqlite");
  auto other = dir.file("limits/rates.sqlite");
  auto rt = make_rt(main_db);
  auto r = rt.run([other](context& cx) -> task<int> {
    auto req = one("k", 1);
    req.state_path = other;
    CHECK(must(co_await troupe::rate_limit_acquire(cx, req)).ok);
    CHECK_FALSE(must(co_await troupe::rate_limit_acquire(cx, req)).ok);
    CHECK(must(co_await troupe::rate_limit_acquire(cx, one("k", 1))).ok); // the main database
    co_return 0;
  });
  REQUIRE(r);
  rt.stop();
  CHECK(std::filesystem::exists(other));
}

TEST_CASE("processes sharing one state_path share the quota (real processes)") {
  temp_dir dir;
  std::filesystem::create_directories(dir.path);
  auto db = dir.file("shared.sqlite");
  // Three processes at once, 10 attempts each without waiting, on a limit of 10 per minute:
  // exactly 10 are admitted in all, whatever the interleaving.
  std::vector<std::thread> runners;
  std::vector<std::pair<int, std::string>> results(3);
  for (size_t i = 0; i < 3; ++i)
    runners.emplace_back([&, i] {
      results[i] = run_helper({"ratelimit", db, "10", "10", "60000", "0"});
    });
  for (auto& t : runners)
    t.join();
  int admitted = 0;
  for (auto& [status, text] : results) {
    INFO(text);
    CHECK(status == 0);
    int n = -1;
    CHECK(std::sscanf(text.c_str(), "ok %d", &n) == 1);
    admitted += n;
  }
  CHECK(admitted == 10);
  // Waiting across processes: 3 x 4 reservations on 4 per 200 ms all get through, and take
  // at least two more windows (they would not if each process had a quota of its own).
  auto db2 = dir.file("shared2.sqlite");
  runners.clear();
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < 3; ++i)
    runners.emplace_back([&, i] {
      results[i] = run_helper({"ratelimit", db2, "4", "4", "200", "20000"});
    });
  for (auto& t : runners)
    t.join();
  auto elapsed = std::chrono::steady_clock::now() - t0;
  for (auto& [status, text] : results) {
    INFO(text);
    CHECK(status == 0);
    CHECK(text == "ok 4\n");
  }
  CHECK(elapsed >= 400ms);
}

TEST_CASE("a full disk is a typed error, not a crash, and loses nothing acknowledged") {
  temp_dir dir;
  std::filesystem::create_directories(dir.path);
  auto db = dir.file("full.sqlite");
  auto [status, text] = run_helper({"fulldisk", db, "1048576"});
  INFO(text.substr(text.size() > 400 ? text.size() - 400 : 0));
  CHECK(status == 0); // it ended by itself after the error, still serving reads
  auto err = text.find("error ");
  REQUIRE(err != std::string::npos);
  CHECK(text.substr(err, 20) == "error TROUPE-STO-003"); // storage_failed
  auto acked = troupe_test::parse_acks(text);
  CHECK(acked.size() >= 20); // the disk filled after real work
  CHECK(troupe_test::integrity_of(db) == "ok");
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(db.c_str(), &raw) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  size_t missing = 0;
  REQUIRE(sqlite3_prepare_v2(raw, "SELECT payload FROM events WHERE id = ?", -1, &st, nullptr) ==
          SQLITE_OK);
  for (auto& [id, n] : acked) {
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, id);
    if (sqlite3_step(st) != SQLITE_ROW ||
        json::parse(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)))["n"] != n)
      ++missing;
  }
  sqlite3_finalize(st);
  sqlite3_close(raw);
  CHECK(missing == 0);
}

TEST_CASE("a read-only database file is a typed error, not a crash") {
  temp_dir dir;
  std::filesystem::create_directories(dir.path);
  auto db = dir.file("ro.sqlite");
  {
    auto rt = make_rt(db);
    auto r = rt.run([](context& cx) -> task<int> {
      must(co_await troupe::event_append(cx, "ro", {{"n", 0}}));
      co_return 0;
    });
    REQUIRE(r);
    rt.stop();
  }
  std::filesystem::permissions(db, std::filesystem::perms::owner_read |
                                       std::filesystem::perms::group_read |
                                       std::filesystem::perms::others_read);
  auto [status, text] = run_helper({"readonly", db});
  INFO(text);
  CHECK(status == 0);
  CHECK(text.rfind("error TROUPE-STO-001", 0) == 0); // storage_unavailable
}

TEST_CASE("a lock held by another connection is waited for within the bound, then busy") {
  temp_dir dir;
  auto db = dir.file("busy.sqlite");
  auto rt = troupe::runtime::builder{}
                .virtual_time()
                .storage(db)
                .config_json(R"({"storage_busy_timeout_ms": 1500})")
                .build();
  REQUIRE(rt);
  REQUIRE(rt->storage());
  sqlite3* other = nullptr;
  REQUIRE(sqlite3_open(db.c_str(), &other) == SQLITE_OK);
  REQUIRE(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) == SQLITE_OK);
  // Held past the bound: the append answers storage_busy (SQLite's busy handler waited
  // 1.5 s of real time, as another process would make it).
  auto busy = rt->run([](context& cx) -> task<caf::expected<troupe::event_receipt>> {
    co_return co_await troupe::event_append(cx, "busy", {{"n", 1}});
  });
  REQUIRE(busy);
  CHECK(fails_with(*busy, errc::storage_busy));
  // Released while the append waits: it goes through.
  std::thread releaser{[other] {
    std::this_thread::sleep_for(100ms); // the other process's transaction, 100 ms long
    sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr);
  }};
  auto ok = rt->run([](context& cx) -> task<caf::expected<troupe::event_receipt>> {
    co_return co_await troupe::event_append(cx, "busy", {{"n", 2}});
  });
  releaser.join();
  sqlite3_close(other);
  REQUIRE(ok);
  CHECK(*ok);
  // The storage still serves: nothing of the refused append was written.
  auto rows = rt->run([](context& cx) -> task<size_t> {
    co_return must(co_await troupe::event_read(cx, "busy", 0, 10)).size();
  });
  REQUIRE(rows);
  CHECK(*rows == 1);
}

TEST_CASE("an idempotency id is a duplicate in the next process too, and its receipt verifies") {
  temp_dir dir;
  std::filesystem::create_directories(dir.path);
  auto db = dir.file("ids.sqlite");
  auto [s1, first] = run_helper({"append-once", db, "order-7"});
  auto [s2, second] = run_helper({"append-once", db, "order-7"});
  auto [s3, other] = run_helper({"append-once", db, "order-8"});
  CHECK(s1 == 0);
  CHECK(s2 == 0);
  CHECK(s3 == 0);
  CHECK(first == "1 new verified\n");
  CHECK(second == "1 duplicate verified\n"); // another process: same event, same key
  CHECK(other == "2 new verified\n");
}
