#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <troupe/troupe.hpp>

#include "test_support.hpp"

using namespace std::chrono_literals;
using nlohmann::json;
using troupe::context;
using troupe::errc;
using troupe::task;

namespace {

using troupe_test::make_real_rt;
using troupe_test::make_virtual_rt;
using troupe_test::ms;
using troupe_test::must;

struct order {
  std::string sku;
  int qty = 0;
};

} // namespace

// -- mailboxes ------------------------------------------------------------------------------

TEST_CASE("a named mailbox carries JSON and typed messages in order") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto mb = co_await troupe::open_mailbox(cx, {.name = "inbox", .capacity = 8});
    REQUIRE(mb);
    REQUIRE(must(co_await troupe::mailbox_send(cx, *mb, json{{"op", "review"}, {"id", 7}})));
    REQUIRE(must(co_await troupe::mailbox_send(cx, *mb, order{"apple", 3})));
    REQUIRE(must(co_await troupe::mailbox_send(cx, *mb, "plain text")));
    // Another task finds it by name and reads it.
    auto reader = cx.spawn([](context& c) -> task<std::string> {
      auto found = co_await troupe::lookup_mailbox(c, {.name = "inbox"});
      REQUIRE(found);
      std::string out;
      for (int i = 0; i < 3; ++i) {
        auto m = co_await troupe::mailbox_receive(c, *found);
        REQUIRE(m);
        if (auto j = m->json())
          out += (*j)["op"].get<std::string>() + ";";
        else if (auto o = m->get_if<order>())
          out += o->sku + "x" + std::to_string(o->qty) + ";";
        else if (auto s = m->get_if<std::string>())
          out += *s + ";";
      }
      co_return out;
    });
    co_return must(co_await cx.await(reader));
  });
  REQUIRE(v);
  CHECK(*v == "review;applex3;plain text;");
}

TEST_CASE("mailbox_send answers false for an absent or closed mailbox, never an exception") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<bool> {
    auto absent = co_await troupe::mailbox_send(cx, troupe::mailbox_address{.name = "nobody"}, 1);
    REQUIRE(absent);
    CHECK(!*absent);
    auto mb = must(co_await troupe::open_mailbox(cx, {.name = "jobs", .capacity = 4}));
    REQUIRE(must(co_await troupe::mailbox_send(cx, mb, 1)));
    REQUIRE(must(co_await troupe::mailbox_send(cx, troupe::mailbox_address{.name = "jobs"}, 2)));
    CHECK(must(co_await troupe::mailbox_close(cx, mb)));
    auto after = co_await troupe::mailbox_send(cx, mb, 3);
    REQUIRE(after);
    CHECK(!*after);
    // Receives drain what was accepted, then report the close.
    CHECK(*must(co_await troupe::mailbox_receive(cx, mb)).get_if<int>() == 1);
    CHECK(*must(co_await troupe::mailbox_receive(cx, mb)).get_if<int>() == 2);
    auto end = co_await troupe::mailbox_receive(cx, mb);
    REQUIRE(!end);
    CHECK(troupe_test::fails_with(end, errc::mailbox_closed));
    auto t = co_await troupe::mailbox_try_receive(cx, mb);
    REQUIRE(t);
    CHECK(!*t);
    auto m = co_await mb.metrics(cx);
    REQUIRE(m);
    CHECK(m->capacity == 4);
    CHECK(m->sent == 2);
    CHECK(m->received == 2);
    CHECK(m->failed_sends == 1);
    CHECK(m->depth == 0);
    CHECK(m->closed);
    troupe::mailbox empty;
    CHECK(!must(co_await troupe::mailbox_send(cx, empty, 1)));
    co_return true;
  });
  REQUIRE(v);
}

TEST_CASE("mailbox_receive waits for a message and a cancel ends the wait") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto mb = must(co_await troupe::open_mailbox(cx, {.name = "q", .capacity = 4}));
    auto waiter = cx.spawn([mb](context& c) -> task<int> {
      auto m = co_await troupe::mailbox_receive(c, mb);
      co_return *m->get_if<int>();
    });
    co_await cx.sleep(5ms);
    auto m = co_await mb.metrics(cx);
    CHECK(m->waiting_receivers == 1);
    REQUIRE(co_await cx.cancel(waiter));
    // The cancelled receiver took nothing: the next message is there for the next reader.
    REQUIRE(must(co_await troupe::mailbox_send(cx, mb, 42)));
    auto got = co_await troupe::mailbox_receive(cx, mb);
    co_return std::to_string(*got->get_if<int>()) + "@" + std::to_string(ms(cx));
  });
  REQUIRE(v);
  CHECK(*v == "42@5");
}

TEST_CASE("a closed mailbox is drained only once values a receiver holds unconsumed came back") {
  // Real threads: a receiver that took a batch (it keeps 1, holds 2 and 3 unconsumed) and
  // then blocks its thread without parking. Another receiver asking meanwhile waits for
  // those values instead of hearing `mailbox_closed`; when the holder ends they come back.
  auto rt = make_real_rt();
  auto holding = std::make_shared<std::atomic<bool>>(false);
  auto asked = std::make_shared<std::atomic<bool>>(false);
  auto r = rt.run([holding, asked](context& cx) -> task<std::vector<std::string>> {
    auto mb = must(co_await troupe::open_mailbox(cx, {.name = "held", .capacity = 8}));
    for (int i = 1; i <= 3; ++i)
      must(co_await troupe::mailbox_send(cx, mb, i));
    must(co_await troupe::mailbox_close(cx, mb));
    auto holder = cx.spawn([mb, holding, asked](context& c) -> task<int> {
      auto m = must(co_await troupe::mailbox_receive(c, mb)); // takes 1, 2, 3; keeps 2, 3
      holding->store(true);
      // Blocks this thread (no park: the values stay held) until the other receive was
      // sent, and a while after it, so that it reaches the mailbox first.
      while (!asked->load())
        std::this_thread::sleep_for(std::chrono::milliseconds{1});
      std::this_thread::sleep_for(std::chrono::milliseconds{50});
      co_return *m.get_if<int>(); // ends: 2 and 3 go back
    });
    while (!holding->load())
      co_await cx.sleep(1ms);
    std::vector<std::string> out;
    asked->store(true);
    auto got = co_await troupe::mailbox_receive(cx, mb);
    out.push_back(got ? std::to_string(*got->get_if<int>()) : troupe::render(got.error()));
    auto next = co_await troupe::mailbox_receive(cx, mb);
    out.push_back(next ? std::to_string(*next->get_if<int>()) : troupe::render(next.error()));
    auto last = co_await troupe::mailbox_receive(cx, mb);
    out.push_back(last ? std::to_string(*last->get_if<int>()) : "closed");
    out.push_back(std::to_string(must(co_await cx.await(holder))));
    co_return out;
  });
  REQUIRE(r);
  // Was: "mailbox_closed" first, while 2 and 3 came back later into a closed mailbox.
  CHECK(*r == std::vector<std::string>{"2", "3", "closed", "1"});
}

TEST_CASE("a typed receive of another type answers wrong_type and leaves the message") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto mb = must(co_await troupe::open_mailbox(cx, {.name = "typed", .capacity = 4}));
    REQUIRE(must(co_await troupe::mailbox_send(cx, mb, json{{"k", 1}})));
    auto wrong = co_await troupe::mailbox_receive_as<int>(cx, mb);
    REQUIRE(!wrong);
    CHECK(troupe_test::fails_with(wrong, errc::wrong_type));
    auto right = co_await troupe::mailbox_receive_as<json>(cx, mb);
    REQUIRE(right);
    co_return right->dump();
  });
  REQUIRE(v);
  CHECK(*v == R"({"k":1})");
}

TEST_CASE(
    "the same name in two tenants is two mailboxes; a reader in the wrong scope sees nothing") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<bool> {
    auto a = must(co_await troupe::open_mailbox(
        cx, {.scope = "tenant", .tenant_id = "acme", .name = "jobs", .capacity = 4}));
    auto b = must(co_await troupe::open_mailbox(
        cx, {.scope = "tenant", .tenant_id = "globex", .name = "jobs", .capacity = 4}));
    REQUIRE(must(co_await troupe::mailbox_send(cx, a, std::string{"for acme"})));
    auto in_b = co_await troupe::mailbox_try_receive(cx, b);
    CHECK(!*in_b); // globex sees nothing of acme's
    auto in_a = co_await troupe::mailbox_try_receive(cx, a);
    CHECK(*(*in_a)->get_if<std::string>() == "for acme");
    // Process scope is a third mailbox of the same name.
    auto p = co_await troupe::lookup_mailbox(cx, {.name = "jobs"});
    CHECK(troupe_test::fails_with(p, errc::not_found));
    // The tenant may come from the task-local "tenant_id".
    cx.set_local("tenant_id", std::string{"acme"});
    auto via_local = co_await troupe::lookup_mailbox(cx, {.scope = "tenant", .name = "jobs"});
    REQUIRE(via_local);
    CHECK(via_local->actor() == a.actor());
    // Task scope: private to the task that opened it.
    auto mine = must(co_await troupe::open_mailbox(cx, {.scope = "task", .name = "private"}));
    auto other = cx.spawn([](context& c) -> task<bool> {
      auto r = co_await troupe::lookup_mailbox(c, {.scope = "task", .name = "private"});
      co_return !r && troupe_test::fails_with(r, errc::not_found);
    });
    CHECK(must(co_await cx.await(other)));
    auto again = co_await troupe::lookup_mailbox(cx, {.scope = "task", .name = "private"});
    CHECK(again->actor() == mine.actor());
    co_return true;
  });
  REQUIRE(v);
}

TEST_CASE("a task-scoped mailbox closes when its task ends") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<bool> {
    auto child = cx.spawn([](context& c) -> task<troupe::mailbox> {
      co_return must(co_await troupe::open_mailbox(c, {.scope = "task", .name = "scratch"}));
    });
    auto mb = must(co_await cx.await(child));
    co_await cx.sleep(1ms);
    auto sent = co_await troupe::mailbox_send(cx, mb, 1);
    co_return !*sent;
  });
  REQUIRE(v);
  CHECK(*v);
}

TEST_CASE("bad mailbox specs answer typed errors naming the field") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<bool> {
    auto check = [](const caf::expected<troupe::mailbox>& r, errc code, std::string field) {
      REQUIRE(!r);
      CHECK(troupe::is(r.error(), code));
      CHECK(troupe::field_of(r.error()) == field);
    };
    check(co_await troupe::open_mailbox(cx, {.name = "x", .capacity = 0}), errc::invalid_capacity,
          "capacity");
    check(co_await troupe::open_mailbox(cx, {.name = "x", .capacity = -3}), errc::invalid_capacity,
          "capacity");
    check(co_await troupe::open_mailbox(cx, {.scope = "galaxy", .name = "x"}), errc::invalid_scope,
          "scope");
    check(co_await troupe::open_mailbox(cx, {.scope = "tenant", .name = "x"}), errc::invalid_scope,
          "tenant_id");
    check(co_await troupe::open_mailbox(cx, {.name = ""}), errc::invalid_name, "name");
    check(co_await troupe::lookup_mailbox(cx, {.name = "never-opened"}), errc::not_found, "name");
    // Every call on an empty handle answers invalid_handle naming the mailbox.
    // (A send to it answers false, as to a closed mailbox: tested above.)
    troupe::mailbox empty;
    auto r = co_await troupe::mailbox_receive(cx, empty);
    CHECK(troupe_test::fails_with(r, errc::invalid_handle));
    CHECK(troupe_test::field_if_failed(r) == "mailbox");
    auto t = co_await troupe::mailbox_try_receive(cx, empty);
    CHECK(troupe_test::fails_with(t, errc::invalid_handle));
    auto cl = co_await troupe::mailbox_close(cx, empty);
    CHECK(troupe_test::fails_with(cl, errc::invalid_handle));
    CHECK(troupe_test::field_if_failed(cl) == "mailbox");
    auto me = co_await empty.metrics(cx);
    CHECK(troupe_test::fails_with(me, errc::invalid_handle));
    CHECK(troupe_test::field_if_failed(me) == "mailbox");
    co_return true;
  });
  REQUIRE(v);
}

TEST_CASE("a full mailbox holds its sender back") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto mb = must(co_await troupe::open_mailbox(cx, {.name = "small", .capacity = 2}));
    auto sent = std::make_shared<int>(0);
    auto producer = cx.spawn([mb, sent](context& c) -> task<void> {
      for (int i = 0; i < 5; ++i) {
        REQUIRE(must(co_await troupe::mailbox_send(c, mb, i)));
        ++*sent;
      }
    });
    co_await cx.sleep(10ms);
    auto before = *sent;
    for (int i = 0; i < 5; ++i)
      REQUIRE(co_await troupe::mailbox_receive(cx, mb));
    REQUIRE(co_await cx.await(producer));
    co_return std::to_string(before) + "/" + std::to_string(*sent);
  });
  REQUIRE(v);
  CHECK(*v == "2/5");
}

// -- shared state ---------------------------------------------------------------------------

TEST_CASE("a shared cell: last write wins, set returns the previous value, versions grow") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<bool> {
    auto cell = must(co_await troupe::open_cell(cx, {.name = "config"}));
    CHECK((co_await cell.get(cx))->is_null());
    CHECK((co_await cell.set(cx, json{{"v", 1}}))->is_null());
    CHECK(must(co_await cell.set(cx, json{{"v", 2}})) == json{{"v", 1}});
    auto snap = must(co_await cell.snapshot(cx));
    CHECK(snap.value == json{{"v", 2}});
    CHECK(snap.version == 2);
    // Compare-and-set by value.
    CHECK(!must(co_await cell.cas(cx, json{{"v", 1}}, json{{"v", 3}})));
    CHECK(must(co_await cell.cas(cx, json{{"v", 2}}, json{{"v", 3}})));
    // Compare-and-set by snapshot: a write since the snapshot makes it stale.
    CHECK(!must(co_await cell.cas(cx, snap, json{{"v", 4}})));
    auto fresh = must(co_await cell.snapshot(cx));
    CHECK(must(co_await cell.cas(cx, fresh, json{{"v", 4}})));
    auto m = must(co_await cell.metrics(cx));
    CHECK(m.writes == 4);
    CHECK(m.cas_successes == 2);
    CHECK(m.cas_failures == 2);
    CHECK(m.stale_reads == 1);
    CHECK(m.version == 4);
    CHECK(m.reads >= 3);
    co_return true;
  });
  REQUIRE(v);
}

TEST_CASE("10 parallel tasks incrementing one cell with a CAS loop always reach exactly 10") {
  auto rt = make_real_rt();
  for (int round = 0; round < 20; ++round) {
    auto v = rt.run([round](context& cx) -> task<int64_t> {
      auto name = "counter-" + std::to_string(round);
      auto cell = must(co_await troupe::open_cell(cx, {.name = name}));
      must(co_await cell.set(cx, 0));
      auto r = co_await cx.parallel(10, [name](context& c, size_t) -> task<int> {
        auto me = must(co_await troupe::open_cell(c, {.name = name}));
        for (int attempts = 1;; ++attempts) {
          auto snap = must(co_await me.snapshot(c));
          if (must(co_await me.cas(c, snap, snap.value.get<int64_t>() + 1))) co_return attempts;
        }
      });
      must(std::move(r));
      auto m = must(co_await cell.metrics(cx));
      if (m.cas_successes != 10) throw std::runtime_error("successes != 10");
      co_return must(co_await cell.get(cx)).get<int64_t>();
    });
    REQUIRE(v);
    CHECK(*v == 10);
  }
  rt.stop();
}

TEST_CASE("a shared map: get, set, delete, entries, per-key snapshot and cas") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<bool> {
    auto map = must(co_await troupe::open_map(cx, {.name = "routes"}));
    CHECK((co_await map.set(cx, "a", 1))->is_null());
    CHECK(must(co_await map.set(cx, "a", 2)) == 1);
    REQUIRE(co_await map.set(cx, "b", "x"));
    CHECK(must(co_await map.get(cx, "a")) == 2);
    CHECK((co_await map.get(cx, "zzz"))->is_null());
    CHECK(must(co_await map.entries(cx)) == json{{"a", 2}, {"b", "x"}});
    auto sa = must(co_await map.snapshot(cx, "a"));
    REQUIRE(co_await map.set(cx, "b", "y")); // another key: a's snapshot stays valid
    CHECK(must(co_await map.cas(cx, "a", sa, 3)));
    CHECK(!must(co_await map.cas(cx, "a", sa, 4)));       // stale now
    CHECK(must(co_await map.cas(cx, "new", nullptr, 1))); // null expected: absent
    CHECK(must(co_await map.del(cx, "a")));
    CHECK(!must(co_await map.del(cx, "a")));
    CHECK(must(co_await map.entries(cx)) == json{{"b", "y"}, {"new", 1}});
    auto absent = must(co_await map.snapshot(cx, "a"));
    CHECK(!absent.present);
    CHECK(absent.version > 0); // the delete's version (a tombstone)
    auto never = must(co_await map.snapshot(cx, "never-written"));
    CHECK(never.version == 0);
    co_return true;
  });
  REQUIRE(v);
}

TEST_CASE("atomic counters return the previous value and count every parallel add") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<bool> {
    auto n = must(co_await troupe::open_atomic(cx, {.name = "hits"}));
    CHECK(must(co_await n.get(cx)) == 0);
    CHECK(must(co_await n.add(cx, 5)) == 0);
    CHECK(must(co_await n.set(cx, 100)) == 5);
    auto r = co_await cx.parallel(100, [](context& c, size_t) -> task<int64_t> {
      auto me = must(co_await troupe::open_atomic(c, {.name = "hits"}));
      co_return must(co_await me.add(c, 1));
    });
    REQUIRE(r);
    CHECK(must(co_await n.get(cx)) == 200);
    // Shared values are scoped like mailboxes.
    auto t1 =
        must(co_await troupe::open_atomic(cx, {.scope = "tenant", .tenant_id = "a", .name = "hits"}));
    CHECK(must(co_await t1.get(cx)) == 0);
    auto bad = co_await troupe::open_atomic(cx, {.scope = "tenant", .name = "hits"});
    CHECK(troupe_test::fails_with(bad, errc::invalid_scope));
    // Each kind has its own names: a cell called "hits" is another object.
    auto cell = co_await troupe::open_cell(cx, {.name = "hits"});
    REQUIRE(cell);
    CHECK((co_await cell->get(cx))->is_null());
    co_return true;
  });
  REQUIRE(v);
}

TEST_CASE("a task_group mailbox is shared by the siblings of one group and no one else") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto r = co_await cx.parallel(2, [](context& c, size_t i) -> task<std::string> {
      auto mb = must(co_await troupe::open_mailbox(c, {.scope = "task_group", .name = "g"}));
      if (i == 0) {
        REQUIRE(must(co_await troupe::mailbox_send(c, mb, std::string{"hi sibling"})));
        co_return "sent";
      }
      auto m = co_await troupe::mailbox_receive(c, mb);
      if (!m) co_return troupe::render(m.error());
      co_return *m->get_if<std::string>();
    });
    REQUIRE(r);
    auto outsider = co_await troupe::lookup_mailbox(cx, {.scope = "task_group", .name = "g"});
    co_return (*r)[1] + "," +
        (outsider ? "seen" : std::string{troupe::name_of(errc(outsider.error().code()))});
  });
  REQUIRE(v);
  CHECK(*v == "hi sibling,not_found");
}

TEST_CASE("a typed receive that hits another type leaves the next receive its message") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto mb = must(co_await troupe::open_mailbox(cx, {.name = "mixed", .capacity = 8}));
    REQUIRE(must(co_await troupe::mailbox_send(cx, mb, 1)));
    REQUIRE(must(co_await troupe::mailbox_send(cx, mb, std::string{"x"})));
    auto n = co_await troupe::mailbox_receive_as<int>(cx, mb);
    REQUIRE(n);
    auto again = co_await troupe::mailbox_receive_as<int>(cx, mb);
    CHECK(troupe_test::fails_with(again, errc::wrong_type));
    auto m = co_await troupe::mailbox_receive(cx, mb);
    REQUIRE(m);
    co_return std::to_string(*n) + *m->get_if<std::string>();
  });
  REQUIRE(v);
  CHECK(*v == "1x");
}

TEST_CASE("a typed receive parked on an empty mailbox answers wrong_type when another type "
          "arrives, and leaves it for the next receive") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<std::string> {
    auto mb = must(co_await troupe::open_mailbox(cx, {.name = "late", .capacity = 4}));
    auto sender = cx.spawn([mb](context& c) -> task<void> {
      co_await c.sleep(5ms);
      must(co_await troupe::mailbox_send(c, mb, std::string{"x"}));
      must(co_await troupe::mailbox_send(c, mb, 7));
    });
    auto wrong = co_await troupe::mailbox_receive_as<int>(cx, mb); // parks: nothing yet
    std::string out = troupe_test::fails_with(wrong, errc::wrong_type) ? "wrong_type" : "?";
    auto m = co_await troupe::mailbox_receive(cx, mb);
    REQUIRE(m);
    auto n = co_await troupe::mailbox_receive_as<int>(cx, mb);
    REQUIRE(n);
    must(co_await cx.await(sender));
    co_return out + "," + *m->get_if<std::string>() + "," + std::to_string(*n);
  });
  REQUIRE(v);
  CHECK(*v == "wrong_type,x,7");
}

TEST_CASE("a deleted key's tombstone keeps an older snapshot stale") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](context& cx) -> task<bool> {
    auto map = must(co_await troupe::open_map(cx, {.name = "tomb"}));
    auto before = must(co_await map.snapshot(cx, "k")); // absent, version 0
    REQUIRE(co_await map.set(cx, "k", 1));
    CHECK(must(co_await map.del(cx, "k")));
    CHECK(!must(co_await map.cas(cx, "k", before, 2))); // written since: stale
    auto now = must(co_await map.snapshot(cx, "k"));
    CHECK(!now.present);
    CHECK(must(co_await map.cas(cx, "k", now, 3)));
    CHECK(must(co_await map.entries(cx)) == json{{"k", 3}});
    co_return true;
  });
  REQUIRE(v);
}

TEST_CASE("an atomic counter's cas: set only from the expected value, counted in the metrics") {
  auto rt = troupe_test::make_virtual_rt();
  auto r = rt.run([](troupe::context& cx) -> troupe::task<std::vector<std::string>> {
    std::vector<std::string> out;
    auto n = co_await troupe::open_atomic(cx, {.name = "seats"});
    if (!n) throw troupe::task_error{n.error()};
    auto yes = [](const caf::expected<bool>& b) { return b && *b ? "yes" : "no"; };
    out.push_back(yes(co_await n->cas(cx, 0, 5))); // never set counts as 0
    out.push_back(yes(co_await n->cas(cx, 0, 9))); // it is 5 now
    out.push_back(yes(co_await n->cas(cx, 5, 4)));
    auto v = co_await n->get(cx);
    out.push_back(std::to_string(v ? *v : -1));
    auto m = co_await n->metrics(cx);
    out.push_back(m ? std::to_string(m->cas_successes) + "/" + std::to_string(m->cas_failures)
                    : "?");
    co_return out;
  });
  REQUIRE(r);
  CHECK(*r == std::vector<std::string>{"yes", "no", "yes", "4", "2/1"});
}

TEST_CASE("tenant scopes stay apart whatever characters their ids and names hold") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<bool> {
    // Both keys were "mailbox|tenant|acme|eu|jobs": tenant "acme|eu" read tenant "acme"'s.
    auto a = must(co_await troupe::open_mailbox(
        cx, {.scope = "tenant", .tenant_id = "acme", .name = "eu|jobs", .capacity = 4}));
    auto b = must(co_await troupe::open_mailbox(
        cx, {.scope = "tenant", .tenant_id = "acme|eu", .name = "jobs", .capacity = 4}));
    CHECK(a.actor() != b.actor());
    auto c1 = must(co_await troupe::open_atomic(cx, {.scope = "tenant", .tenant_id = "x", .name = "y|n"}));
    auto c2 = must(co_await troupe::open_atomic(cx, {.scope = "tenant", .tenant_id = "x|y", .name = "n"}));
    must(co_await c1.add(cx, 5));
    CHECK(must(co_await c2.get(cx)) == 0); // was 5
    co_return true;
  });
  REQUIRE(r);
}

TEST_CASE("a mailbox's address names the tenant it was opened for, also from the task-local") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<bool> {
    cx.set_local<std::string>("tenant_id", "acme");
    auto mb = must(co_await troupe::open_mailbox(cx, {.scope = "tenant", .name = "in", .capacity = 4}));
    CHECK(mb.address().tenant_id == "acme"); // was empty
    // A task of another tenant sends to the address: it reaches acme's mailbox.
    auto addr = mb.address();
    auto h = cx.spawn([addr](context& c) -> task<bool> {
      c.set_local<std::string>("tenant_id", "globex");
      co_return must(co_await troupe::mailbox_send(c, addr, json{{"n", 1}}));
    });
    auto sent = co_await cx.await(h);
    CHECK(sent);
    CHECK(*sent);
    auto got = must(co_await troupe::mailbox_receive(cx, mb));
    REQUIRE(got.json());
    CHECK(*got.json() == json{{"n", 1}});
    co_return true;
  });
  REQUIRE(r);
}

TEST_CASE("an atomic refuses an add that overflows, and an initial value above int64") {
  auto rt = make_virtual_rt();
  auto r = rt.run([](context& cx) -> task<bool> {
    auto n = must(co_await troupe::open_atomic(cx, {.name = "big"}));
    must(co_await n.set(cx, INT64_MAX));
    auto over = co_await n.add(cx, 1); // was: wrapped to INT64_MIN (undefined behaviour)
    CHECK(troupe_test::fails_with(over, errc::invalid_argument));
    CHECK(troupe::field_of(over.error()) == "delta");
    CHECK(must(co_await n.get(cx)) == INT64_MAX); // unchanged
    must(co_await n.set(cx, INT64_MIN));
    CHECK(troupe_test::fails_with(co_await n.add(cx, -1), errc::invalid_argument));
    CHECK(must(co_await n.add(cx, 1)) == INT64_MIN);
    auto huge = co_await troupe::open_atomic(cx, {.name = "u", .initial = json(UINT64_MAX)});
    CHECK(troupe_test::fails_with(huge, errc::invalid_argument)); // was: opened, read as -1
    CHECK(troupe::field_of(huge.error()) == "initial");
    co_return true;
  });
  REQUIRE(r);
}

TEST_CASE("a shared cell, map or atomic may start with an initial value: the first opener wins") {
  auto rt = troupe_test::make_virtual_rt();
  auto r = rt.run([](troupe::context& cx) -> troupe::task<std::vector<std::string>> {
    std::vector<std::string> out;
    auto c1 = co_await troupe::open_cell(cx, {.name = "cfg", .initial = json{{"v", 1}}});
    auto c2 = co_await troupe::open_cell(cx, {.name = "cfg", .initial = json{{"v", 2}}});
    if (!c1 || !c2) throw troupe::task_error{troupe::make_error(errc::not_found)};
    auto v = co_await c2->get(cx);
    out.push_back(v ? v->dump() : "?");
    auto m = co_await troupe::open_map(cx, {.name = "m", .initial = json{{"a", 1}, {"b", 2}}});
    if (!m) throw troupe::task_error{m.error()};
    auto b = co_await m->get(cx, "b");
    out.push_back(b ? b->dump() : "?");
    auto n = co_await troupe::open_atomic(cx, {.name = "n", .initial = json(41)});
    if (!n) throw troupe::task_error{n.error()};
    auto prev = co_await n->add(cx, 1);
    out.push_back(std::to_string(prev ? *prev : -1));
    auto bad = co_await troupe::open_atomic(cx, {.name = "x", .initial = json("many")});
    out.push_back(!bad && troupe::field_of(bad.error()) == "initial" ? "refused" : "?");
    auto badmap = co_await troupe::open_map(cx, {.name = "y", .initial = json(3)});
    out.push_back(!badmap && troupe::is(badmap.error(), errc::invalid_argument) ? "refused" : "?");
    co_return out;
  });
  REQUIRE(r);
  CHECK(*r == std::vector<std::string>{"{\"v\":1}", "2", "41", "refused", "refused"});
}
