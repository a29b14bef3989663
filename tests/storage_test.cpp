#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <sqlite3.h>

#include <troupe/messages/interfaces.hpp>
#include <troupe/persistence/storage.hpp>
#include <troupe/troupe.hpp>

#include "sqlite_support.hpp"
#include "test_support.hpp"

using namespace std::chrono_literals;
using nlohmann::json;
using troupe::context;
using troupe::errc;
using troupe::task;
using troupe_test::make_rt;
using troupe_test::must;
using troupe_test::temp_dir;

namespace {

/// Writes a schema version into `db` (creating the file) behind troupe's back.
void set_user_version(const std::string& db, int64_t v) {
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(db.c_str(), &raw) == SQLITE_OK);
  auto sql = "PRAGMA user_version=" + std::to_string(v);
  REQUIRE(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(raw);
}

int64_t user_version(const std::string& db) {
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open_v2(db.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(raw, "PRAGMA user_version", -1, &st, nullptr);
  sqlite3_step(st);
  auto v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(raw);
  return v;
}

} // namespace

namespace {

/// The runtime's storage actor, typed by its interface.
troupe::storage_actor_type typed_storage(troupe::runtime& rt) {
  auto st = rt.storage();
  REQUIRE(st);
  return caf::actor_cast<troupe::storage_actor_type>(*st);
}

} // namespace

TEST_CASE("appends are answered with increasing ids and read back oldest first") {
  temp_dir dir;
  auto rt = make_rt(dir.file("db/state.sqlite")); // the missing directory is created
  auto v = rt.run([](context& cx) -> task<std::string> {
    co_await cx.sleep(1500ms);
    std::vector<troupe::event_receipt> rs;
    for (int i = 0; i < 5; ++i) {
      auto r = co_await troupe::event_append(cx, "orders.created", json{{"i", i}});
      REQUIRE(r);
      rs.push_back(*r);
    }
    REQUIRE(co_await troupe::event_append(cx, "orders.shipped", json{{"i", 99}}));
    for (size_t i = 1; i < rs.size(); ++i)
      CHECK(rs[i].event_id > rs[i - 1].event_id);
    CHECK(rs[0].at_ms == 1500); // the runtime clock
    auto page = co_await troupe::event_read(cx, "orders.created", rs[1].event_id, 2);
    REQUIRE(page);
    std::string out;
    for (auto& e : *page)
      out += e.payload + ";";
    auto all = co_await troupe::event_read(cx, "orders.created");
    co_return out + std::to_string(all->size());
  });
  REQUIRE(v);
  CHECK(*v == R"({"i":2};{"i":3};5)");
}

TEST_CASE("concurrent appends share transactions: group commit") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  REQUIRE(rt.storage()); // open (a first open is file I/O done off the scheduler, per task)
  auto v = rt.run([](context& cx) -> task<troupe::storage_metrics> {
    auto r = co_await cx.parallel(50, [](context& c, size_t i) -> task<int64_t> {
      auto rec = co_await troupe::event_append(c, "group", json{{"i", i}});
      if (!rec) throw troupe::task_error{rec.error()};
      co_return rec->event_id;
    });
    REQUIRE(r);
    std::set<int64_t> ids(r->begin(), r->end());
    CHECK(ids.size() == 50);
    auto many =
        co_await troupe::event_append_all(cx, "group", std::vector<json>(300, json{{"x", 1}}), 256);
    REQUIRE(many);
    CHECK(many->size() == 300);
    co_return must(co_await troupe::storage_metrics_of(cx));
  });
  REQUIRE(v);
  CHECK(v->rows == 350);
  CHECK(v->transactions < 20); // one per group (12 with round-robin turns), not one per row
  CHECK(v->largest_batch >= 50);
  CHECK(v->schema_version == troupe::storage_schema_version);
}

TEST_CASE("a typed request to the storage actor takes its reply type from the interface") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto typed = typed_storage(rt);
  auto v = rt.run([typed](context& cx) -> task<int64_t> {
    // no reply type spelled: event_receipt, std::vector<event_record> and storage_metrics
    // come from storage_actor_type
    auto rec = co_await cx.request(typed, troupe::atoms::st_append_atom::value,
                                   std::string{"typed"}, std::string{R"({"a":1})"});
    static_assert(std::is_same_v<decltype(rec), caf::expected<troupe::event_receipt>>);
    if (!rec) co_return -1;
    auto rows = co_await cx.request(typed, troupe::atoms::st_read_atom::value,
                                    std::string{"typed"}, int64_t{0}, int64_t{10});
    static_assert(std::is_same_v<decltype(rows), caf::expected<std::vector<troupe::event_record>>>);
    auto m = co_await cx.request(typed, troupe::atoms::st_metrics_atom::value);
    if (!rows || !m || rows->size() != 1 || (*rows)[0].payload != R"({"a":1})") co_return -2;
    co_return static_cast<int64_t>(m->rows);
  });
  REQUIRE(v);
  CHECK(*v == 1);
}

TEST_CASE("a pool save with `encode` is stored as the snapshot's JSON text; text rows as given") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto typed = typed_storage(rt);
  troupe::pool_task_snapshot snap;
  snap.id = 2;
  snap.status = troupe::pool_task_status::completed;
  snap.key = "tenant \"a\"";
  snap.idempotency_key = "k-2";
  snap.result_json = json{{"n", 3}};
  troupe::pool_task_snapshot bad; // a key that is not UTF-8: replaced, never a failed group
  bad.id = 3;
  bad.status = troupe::pool_task_status::failed;
  bad.key = std::string{"caf\xe9"}; // Latin-1
  auto rows = rt.run([typed, snap, bad](context& cx) -> task<std::vector<troupe::pool_row>> {
    // An event append sent just before: its group must not fail because of the bad row.
    caf::anon_send(typed, troupe::atoms::st_append_atom::value, std::string{"side"},
                   std::string{R"({"a":1})"});
    std::vector<troupe::pool_row> save{
        {1, troupe::pool_task_status::queued, R"({"id":1})", false, {}},
        {2, troupe::pool_task_status::completed, "", true, snap},
        {3, troupe::pool_task_status::failed, "", true, bad}};
    auto n = co_await cx.request(typed, troupe::atoms::st_pool_save_atom::value,
                                 std::string{"p"}, std::move(save), int64_t{0});
    if (!n) co_return {};
    auto side = co_await cx.request(typed, troupe::atoms::st_read_atom::value,
                                    std::string{"side"}, int64_t{0}, int64_t{10});
    if (!side || side->size() != 1) co_return {};
    auto back = co_await cx.request(typed, troupe::atoms::st_pool_load_atom::value,
                                    std::string{"p"});
    co_return back ? std::move(*back) : std::vector<troupe::pool_row>{};
  });
  REQUIRE(rows);
  REQUIRE(rows->size() == 3);
  CHECK((*rows)[0].record == R"({"id":1})");
  CHECK((*rows)[2].record.find("caf\xef\xbf\xbd") != std::string::npos); // U+FFFD
  CHECK((*rows)[1].task_id == 2);
  CHECK((*rows)[1].status == troupe::pool_task_status::completed);
  CHECK((*rows)[1].record == troupe::to_json(snap).dump());
  CHECK_FALSE((*rows)[1].encode); // a loaded row carries its text only
  auto again = troupe::pool_task_snapshot_from_json(json::parse((*rows)[1].record));
  REQUIRE(again);
  CHECK(*again == snap);
}

TEST_CASE("bad event input answers typed errors and writes nothing") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto v = rt.run([](context& cx) -> task<bool> {
    auto not_object = co_await troupe::event_append(cx, "t", json::array({1, 2}));
    CHECK(troupe_test::fails_with(not_object, errc::invalid_payload));
    CHECK(troupe::field_of(not_object.error()) == "payload");
    for (const std::string& bad :
         std::vector<std::string>{"", "a..b", ".a", "a.", "a::b", std::string(201, 'x')}) {
      auto r = co_await troupe::event_append(cx, bad, json::object());
      CHECK(troupe_test::fails_with(r, errc::invalid_topic));
    }
    auto mixed = co_await troupe::event_append_all(cx, "t", {json::object(), 3});
    CHECK(troupe_test::fails_with(mixed, errc::invalid_payload));
    CHECK(troupe::field_of(mixed.error()) == "payloads[1]");
    auto zero = co_await troupe::event_read(cx, "t", 0, 0);
    CHECK(troupe_test::fails_with(zero, errc::invalid_argument));
    auto m = co_await troupe::storage_metrics_of(cx);
    CHECK(m->rows == 0);
    co_return true;
  });
  REQUIRE(v);
}

TEST_CASE("a database from a newer troupe is refused and left untouched") {
  temp_dir dir;
  auto db = dir.file("new.sqlite");
  {
    auto rt = make_rt(db);
    REQUIRE(rt.storage());
  }
  set_user_version(db, 99);
  auto rt = make_rt(db);
  auto s = rt.storage();
  REQUIRE(!s);
  CHECK(troupe_test::fails_with(s, errc::schema_too_new));
  CHECK(user_version(db) == 99);
  auto v = rt.run([](context& cx) -> task<bool> {
    auto r = co_await troupe::event_append(cx, "t", json::object());
    co_return troupe_test::fails_with(r, errc::schema_too_new);
  });
  CHECK(*v);
}

TEST_CASE("an unusable database path answers storage_unavailable, never a crash") {
  temp_dir dir;
  for (const std::string& bad :
       std::vector<std::string>{"/proc/troupe-nope/state.sqlite", dir.file("garbage.sqlite")}) {
    if (bad == dir.file("garbage.sqlite")) {
      std::filesystem::create_directories(dir.path);
      std::ofstream{bad} << "this is not a database, it is a file of text that SQLite rejects";
    }
    auto rt = make_rt(bad);
    auto s = rt.storage();
    REQUIRE(!s);
    CHECK(troupe_test::fails_with(s, errc::storage_unavailable));
    CHECK(troupe::field_of(s.error()) == "path");
  }
}

namespace {

struct collected {
  std::vector<troupe::event_record> events;
};

caf::behavior collector(caf::stateful_actor<collected>* self) {
  return {
      [self](troupe::atoms::st_event_atom, troupe::event_record& e) {
        self->state.events.push_back(std::move(e));
      },
      [self](troupe::atoms::st_read_atom) { return self->state.events.size(); },
  };
}

} // namespace

TEST_CASE("a subscriber gets the backlog then live events, and resumes from its cursor") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto s = rt.storage();
  REQUIRE(s);
  auto append = [&](int from, int to) {
    auto r = rt.run([from, to](context& cx) -> task<bool> {
      for (int i = from; i < to; ++i)
        if (!co_await troupe::event_append(cx, "feed", json{{"i", i}})) co_return false;
      co_return true;
    });
    REQUIRE(r);
  };
  append(0, 3);
  auto sub = rt.system().spawn(collector);
  caf::anon_send(*s, troupe::atoms::st_subscribe_atom::value, std::string{"feed"}, int64_t{0}, sub);
  rt.drain();
  append(3, 6); // live
  rt.drain();
  auto first = caf::actor_cast<caf::stateful_actor<collected>*>(sub)->state.events;
  REQUIRE(first.size() == 6);
  for (int i = 0; i < 6; ++i)
    CHECK(json::parse(first[i].payload)["i"] == i);
  // The subscriber "restarts" from the cursor of the 4th event: no gap, no duplicate.
  caf::anon_send_exit(sub, caf::exit_reason::user_shutdown);
  rt.drain();
  append(6, 8);
  auto again = rt.system().spawn(collector);
  caf::anon_send(*s, troupe::atoms::st_subscribe_atom::value, std::string{"feed"},
                 first[3].event_id, again);
  rt.drain();
  auto second = caf::actor_cast<caf::stateful_actor<collected>*>(again)->state.events;
  REQUIRE(second.size() == 4);
  for (int i = 0; i < 4; ++i)
    CHECK(json::parse(second[i].payload)["i"] == i + 4);
  caf::anon_send_exit(again, caf::exit_reason::user_shutdown);
  rt.drain();
}

TEST_CASE("a subscriber gets one group's rows in row order, whichever write made them") {
  // A channel append writes its audit row into lifecycle.channel.audit; a direct append to
  // that topic in the same group comes after it. Live pushes follow the rows' ids.
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto s = rt.storage();
  REQUIRE(s);
  auto sub = rt.system().spawn(collector);
  caf::anon_send(*s, troupe::atoms::st_subscribe_atom::value,
                 std::string{troupe::channel_audit_topic}, int64_t{0}, sub);
  rt.drain();
  troupe::channel_write w{"session:s1:orders", "session", "s1", "", "test", R"({"n":1})"};
  caf::anon_send(*s, troupe::atoms::st_chan_append_atom::value, w);
  caf::anon_send(*s, troupe::atoms::st_append_atom::value,
                 std::string{troupe::channel_audit_topic}, std::string{R"({"kind":"direct"})"});
  w.payload = R"({"n":2})";
  caf::anon_send(*s, troupe::atoms::st_chan_append_atom::value, w);
  rt.drain();
  auto events = caf::actor_cast<caf::stateful_actor<collected>*>(sub)->state.events;
  REQUIRE(events.size() == 3);
  CHECK(events[0].event_id < events[1].event_id);
  CHECK(events[1].event_id < events[2].event_id);
  CHECK(json::parse(events[1].payload)["kind"] == "direct");
  auto metrics = rt.run([](context& cx) -> task<troupe::storage_metrics> {
    co_return must(co_await troupe::storage_metrics_of(cx));
  });
  REQUIRE(metrics);
  CHECK(metrics->transactions == 1); // the three writes were one group
  caf::anon_send_exit(sub, caf::exit_reason::user_shutdown);
  rt.drain();
}

TEST_CASE("event_subscribe from a task: backlog then live; unsubscribe stops delivery") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto sub = rt.system().spawn(collector);
  auto r = rt.run([sub](context& cx) -> task<int> {
    must(co_await troupe::event_append(cx, "feed", json{{"i", 0}}));
    CHECK(must(co_await troupe::event_subscribe(cx, "feed", 0, sub)));
    must(co_await troupe::event_append(cx, "feed", json{{"i", 1}}));
    CHECK(must(co_await troupe::event_unsubscribe(cx, "feed", sub)));
    CHECK_FALSE(must(co_await troupe::event_unsubscribe(cx, "feed", sub)));
    must(co_await troupe::event_append(cx, "feed", json{{"i", 2}}));
    auto bad = co_await troupe::event_subscribe(cx, "feed", 0, caf::actor{});
    CHECK(troupe_test::fails_with(bad, errc::invalid_argument));
    auto bad_topic = co_await troupe::event_subscribe(cx, "a..b", 0, sub);
    CHECK(troupe_test::fails_with(bad_topic, errc::invalid_topic));
    co_return 0;
  });
  REQUIRE(r);
  rt.drain();
  auto got = caf::actor_cast<caf::stateful_actor<collected>*>(sub)->state.events;
  REQUIRE(got.size() == 2);
  CHECK(json::parse(got[0].payload)["i"] == 0);
  CHECK(json::parse(got[1].payload)["i"] == 1);
  caf::anon_send_exit(sub, caf::exit_reason::user_shutdown);
  rt.drain();
}

TEST_CASE("a writer killed at a random moment loses nothing it saw acknowledged (x25)") {
  temp_dir dir;
  std::filesystem::create_directories(dir.path);
  std::mt19937 rng{std::random_device{}()};
  std::uniform_int_distribution<int> delay_ms{0, 300};
  int rounds_with_acks = 0;
  size_t total_acked = 0;
  // Rounds 0-19 kill the writer while it appends (after its first acknowledgement); rounds
  // 20-24 at a random moment from its start (while it boots, creates or migrates the schema).
  for (int round = 0; round < 25; ++round) {
    bool early = round >= 20;
    auto db = dir.file("crash-" + std::to_string(round) + ".sqlite");
    int out[2];
    REQUIRE(::pipe(out) == 0);
    auto pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::close(out[0]);
      ::close(out[1]);
      ::execl(TROUPE_CRASH_WRITER, TROUPE_CRASH_WRITER, db.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    // The acknowledgements are read while the writer runs: a full pipe must never pause it.
    std::string acked;
    std::mutex mtx;
    std::condition_variable cv;
    bool first_ack = false;
    std::thread reader{[&, fd = out[0]] {
      char buf[65536];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) {
        std::lock_guard<std::mutex> guard{mtx};
        acked.append(buf, static_cast<size_t>(n));
        if (!first_ack && acked.find('\n') != std::string::npos) {
          first_ack = true;
          cv.notify_one();
        }
      }
      std::lock_guard<std::mutex> guard{mtx};
      first_ack = true; // EOF: the writer ended (it should not, before the kill)
      cv.notify_one();
    }};
    // The writer is busy once it has seen its first acknowledgement (however slow its start,
    // under sanitizers on a loaded machine); then it is killed at a random moment: that
    // wait is the point of the test.
    if (!early) {
      std::unique_lock<std::mutex> lock{mtx};
      CHECK(cv.wait_for(lock, std::chrono::seconds{30}, [&] { return first_ack; }));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds{delay_ms(rng)});
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status));
    reader.join(); // ends at EOF: the writer's end of the pipe closed with it
    ::close(out[0]);
    // Every complete line is an acknowledgement the writer saw: "<event_id> <n>".
    auto want = troupe_test::parse_acks(acked);
    if (!std::filesystem::exists(db)) { // killed before it created the file
      CHECK(early);
      CHECK(want.empty());
      continue;
    }
    CHECK(troupe_test::integrity_of(db, true) == "ok");
    sqlite3* raw = nullptr;
    REQUIRE(sqlite3_open(db.c_str(), &raw) == SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    std::map<int64_t, int64_t> have; // id -> n, and every n once
    std::map<int64_t, int> seen_n;
    if (sqlite3_prepare_v2(raw, "SELECT id, payload FROM events", -1, &st, nullptr) != SQLITE_OK) {
      // Killed before its schema was committed (an early round): then it cannot have seen an
      // acknowledgement, and nothing is lost.
      INFO("round " << round << ": " << sqlite3_errmsg(raw));
      CHECK(std::string{sqlite3_errmsg(raw)}.find("no such table") != std::string::npos);
      CHECK(early);
      CHECK(want.empty());
      sqlite3_close(raw);
      continue;
    }
    while (sqlite3_step(st) == SQLITE_ROW) {
      auto n = json::parse(reinterpret_cast<const char*>(sqlite3_column_text(st, 1)))["n"]
                   .get<int64_t>();
      have[sqlite3_column_int64(st, 0)] = n;
      ++seen_n[n];
    }
    sqlite3_finalize(st);
    sqlite3_close(raw);
    size_t missing = 0;
    size_t twice = 0;
    for (auto& kv : want) {
      auto i = have.find(kv.first);
      if (i == have.end() || i->second != kv.second) ++missing;
    }
    for (auto& kv : seen_n)
      if (kv.second > 1) ++twice;
    INFO("round " << round << ": " << want.size() << " acknowledged, " << have.size() << " stored");
    CHECK(missing == 0);
    CHECK(twice == 0);
    if (!early) rounds_with_acks += want.empty() ? 0 : 1;
    total_acked += want.size();
  }
  // The kills land while the writer is busy (after its first acknowledgement), or the test
  // would prove nothing.
  INFO(total_acked << " acknowledged appends in all");
  CHECK(rounds_with_acks == 20);
}

TEST_CASE("a real-time runtime with storage appends and stops (the storage thread ends)") {
  temp_dir dir;
  auto rt = troupe::runtime::builder{}.threads(2).storage(dir.file("rt.sqlite")).build();
  REQUIRE(rt);
  auto v = rt->run([](context& cx) -> task<int64_t> {
    auto r = co_await troupe::event_append(cx, "real", json{{"ok", true}});
    if (!r) throw troupe::task_error{r.error()};
    co_return r->event_id;
  });
  REQUIRE(v);
  CHECK(*v == 1);
  rt->stop(); // must return: nothing may keep the storage actor alive (ctest's timeout would)
}

TEST_CASE("runtime::storage() from another thread racing stop() opens fully or answers runtime_stopped (x30)") {
  temp_dir dir;
  std::filesystem::create_directories(dir.path);
  for (int round = 0; round < 30; ++round) {
    auto rt = troupe::runtime::builder{}
                  .threads(2)
                  .storage(dir.file("race-" + std::to_string(round) + ".sqlite"))
                  .build();
    REQUIRE(rt);
    std::atomic<bool> started{false};
    caf::error last;
    size_t opened = 0;
    std::thread opener{[&] {
      started = true;
      for (;;) { // the first call opens the file, later ones find it, until the stop
        auto a = rt->storage();
        if (!a) {
          last = a.error();
          return;
        }
        ++opened;
      }
    }};
    while (!started) std::this_thread::yield();
    rt->stop(); // waits for an open in progress before the actor system goes
    opener.join();
    CHECK(troupe::is(last, errc::runtime_stopped));
    INFO("round " << round << ": " << opened << " lookups before the stop");
  }
}

TEST_CASE("a resubscription replaces the earlier one: each event arrives once") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto s = rt.storage();
  REQUIRE(s);
  auto sub = rt.system().spawn(collector);
  for (int i = 0; i < 2; ++i)
    caf::anon_send(*s, troupe::atoms::st_subscribe_atom::value, std::string{"dup"}, int64_t{0},
                   sub);
  rt.drain();
  auto r = rt.run([](context& cx) -> task<bool> {
    co_return static_cast<bool>(co_await troupe::event_append(cx, "dup", json{{"x", 1}}));
  });
  REQUIRE(r);
  rt.drain();
  CHECK(caf::actor_cast<caf::stateful_actor<collected>*>(sub)->state.events.size() == 1);
  caf::anon_send_exit(sub, caf::exit_reason::user_shutdown);
  rt.drain();
}

TEST_CASE("a payload that cannot be serialised and a negative schema version are typed errors") {
  temp_dir dir;
  auto db = dir.file("neg.sqlite");
  std::filesystem::create_directories(dir.path);
  set_user_version(db, -1);
  auto neg = make_rt(db);
  auto s = neg.storage();
  REQUIRE(!s);
  CHECK(troupe_test::fails_with(s, errc::storage_unavailable));
  auto rt = make_rt(dir.file("ok.sqlite"));
  auto v = rt.run([](context& cx) -> task<bool> {
    auto bad = co_await troupe::event_append(cx, "t", json{{"s", std::string{"\xff\xfe"}}});
    CHECK(troupe_test::fails_with(bad, errc::invalid_payload));
    // in a window of appends, far past the first chunk: refused before anything is written
    std::vector<json> many(200, json{{"ok", 1}});
    many[150] = json{{"nested", {{"list", {"fine", std::string{"\xc0\xaf"}}}}}};
    auto window = co_await troupe::event_append_all(cx, "t", std::move(many), 64);
    CHECK(troupe_test::fails_with(window, errc::invalid_payload));
    CHECK(troupe_test::field_if_failed(window) == "payloads[150]");
    std::vector<json> bad_key(3, json{{"ok", 1}});
    bad_key[2] = json{{std::string{"k\xff"}, 1}};
    auto keyed = co_await troupe::event_append_all(cx, "t", std::move(bad_key));
    CHECK(troupe_test::field_if_failed(keyed) == "payloads[2]");
    co_return must(co_await troupe::event_read(cx, "t", 0, 10)).empty();
  });
  REQUIRE(v);
  CHECK(*v);
}

TEST_CASE("a group larger than max_batch is split; writes pending at exit are committed") {
  temp_dir dir;
  auto db = dir.file("batch.sqlite");
  auto rt = make_rt(dir.file("unused.sqlite"));
  troupe::storage_config sc;
  sc.path = db;
  sc.max_batch = 4;
  sc.detached = false; // on the deterministic scheduler
  auto s = troupe::spawn_storage(rt.system(), sc);
  REQUIRE(s);
  auto storage = *s;
  auto v = rt.run([storage](context& cx) -> task<troupe::storage_metrics> {
    auto r = co_await cx.parallel(10, [storage](context& c, size_t i) -> task<int64_t> {
      auto rec = co_await c.request<troupe::event_receipt>(
          storage, troupe::atoms::st_append_atom::value, std::string{"b"}, json{{"i", i}}.dump());
      if (!rec) throw troupe::task_error{rec.error()};
      co_return rec->event_id;
    });
    REQUIRE(r);
    co_return must(co_await cx.request<troupe::storage_metrics>(
        storage, troupe::atoms::st_metrics_atom::value));
  });
  REQUIRE(v);
  CHECK(v->rows == 10);
  CHECK(v->largest_batch <= 4);
  CHECK(v->transactions >= 3);
  // Three appends queued, then the actor is stopped before its commit marker comes: they are
  // committed on the way out and their writers answered.
  auto answered = std::make_shared<int>(0);
  auto writer = rt.system().spawn([storage, answered](caf::event_based_actor* self) {
    for (int i = 0; i < 3; ++i)
      self->request(storage, caf::infinite, troupe::atoms::st_append_atom::value,
                    std::string{"exit"}, json{{"i", i}}.dump())
          .then([answered](troupe::event_receipt&) { ++*answered; }, [](caf::error&) {});
    caf::anon_send_exit(storage, caf::exit_reason::user_shutdown);
  });
  rt.drain();
  CHECK(*answered == 3);
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(db.c_str(), &raw) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  REQUIRE(sqlite3_prepare_v2(raw, "SELECT count(*) FROM events WHERE topic = 'exit'", -1, &st,
                             nullptr) == SQLITE_OK);
  REQUIRE(sqlite3_step(st) == SQLITE_ROW);
  CHECK(sqlite3_column_int64(st, 0) == 3);
  sqlite3_finalize(st);
  sqlite3_close(raw);
  caf::anon_send_exit(writer, caf::exit_reason::user_shutdown);
  rt.drain();
}

TEST_CASE("supervisor events go to supervisor.lifecycle while the storage is open") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  REQUIRE(rt.storage());
  troupe::supervisor_spec spec;
  spec.name = "api";
  spec.intensity = 5;
  troupe::child_spec c;
  c.name = "db";
  c.start = [](caf::actor_system& sys) -> troupe::start_result {
    return std::optional<caf::actor>{sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
      return {[self](int) { self->quit(caf::sec::runtime_error); }};
    })};
  };
  spec.children = {c};
  auto sup = rt.supervise(spec);
  REQUIRE(sup);
  auto st = rt.supervisor_state_of(*sup);
  REQUIRE(st);
  caf::anon_send(st->children.at(0).actor, 1); // the child crashes and is restarted
  rt.drain();
  auto rows = rt.run([](context& cx) -> task<std::vector<troupe::event_record>> {
    co_return must(co_await troupe::event_read(cx, troupe::supervisor_lifecycle_topic, 0, 100));
  });
  REQUIRE(rows);
  std::vector<std::string> kinds;
  for (auto& e : *rows) {
    auto j = json::parse(e.payload);
    CHECK(j["supervisor"] == "api");
    kinds.push_back(j["kind"].get<std::string>() + ":" + j["child"].get<std::string>());
  }
  // the start (replayed from the log: it happened before the forwarder subscribed), then live
  REQUIRE(kinds.size() >= 3);
  CHECK(kinds[0] == "started:db");
  CHECK(std::find(kinds.begin(), kinds.end(), "failed:db") != kinds.end());
  CHECK(std::find(kinds.begin(), kinds.end(), "restarted:db") != kinds.end());
  // A supervisor started before the storage opens: nothing is written (no database is
  // created for it); when the storage opens, its log so far is replayed.
  spec.name = "late";
  temp_dir dir2;
  auto rt2 = make_rt(dir2.file("state.sqlite"));
  auto late = rt2.supervise(spec);
  REQUIRE(late);
  rt2.drain();
  CHECK_FALSE(std::filesystem::exists(dir2.path));
  REQUIRE(rt2.storage());
  rt2.drain();
  auto rows2 = rt2.run([](context& cx) -> task<std::vector<troupe::event_record>> {
    co_return must(co_await troupe::event_read(cx, troupe::supervisor_lifecycle_topic, 0, 100));
  });
  REQUIRE(rows2);
  REQUIRE_FALSE(rows2->empty());
  auto first = json::parse(rows2->front().payload);
  CHECK(first["supervisor"] == "late");
  CHECK(first["kind"] == "started");
  rt2.stop();
  rt.stop();
}

TEST_CASE("a crash three levels down reaches supervisor.lifecycle with its path, on one clock") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  REQUIRE(rt.storage());
  auto crashing = [](caf::actor_system& sys) -> troupe::start_result {
    return std::optional<caf::actor>{sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
      return {[self](int) { self->quit(caf::sec::runtime_error); }};
    })};
  };
  troupe::supervisor_spec parsers;
  parsers.name = "parsers";
  parsers.intensity = 5;
  troupe::child_spec leaf;
  leaf.name = "parser-3";
  leaf.start = crashing;
  parsers.children = {leaf};
  troupe::supervisor_spec app;
  app.name = "app";
  app.children = {troupe::supervisor_child_spec("parsers", rt.clock(), parsers)};
  auto sup = rt.supervise(app);
  REQUIRE(sup);
  rt.advance(std::chrono::milliseconds(777));
  auto st = rt.supervisor_state_of(*sup);
  REQUIRE(st);
  auto inner = rt.supervisor_state_of(st->children.at(0).actor);
  REQUIRE(inner);
  caf::anon_send(inner->children.at(0).actor, 1);
  rt.drain();
  auto rows = rt.run([](context& cx) -> task<std::vector<troupe::event_record>> {
    co_return must(co_await troupe::event_read(cx, troupe::supervisor_lifecycle_topic, 0, 100));
  });
  REQUIRE(rows);
  bool seen = false;
  for (auto& e : *rows) {
    auto j = json::parse(e.payload);
    if (j["kind"] == "failed" && j["path"] == "app/parsers/parser-3") {
      seen = true;
      CHECK(j["at_ms"] == 777);   // the event's time ...
      CHECK(e.at_ms == 777);      // ... and the row's: one clock
    }
  }
  CHECK(seen);
  rt.stop();
}
