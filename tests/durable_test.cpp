// Durable channels: name resolution, signed receipts, idempotency across restarts, scopes,
// triggers with batch aggregation, the audit topic.
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <sqlite3.h>

#include <troupe/troupe.hpp>

#include "sqlite_support.hpp"
#include "test_support.hpp"

using namespace std::chrono_literals;
using nlohmann::json;
using troupe::channel_event;
using troupe::channel_match;
using troupe::channel_receipt;
using troupe::context;
using troupe::errc;
using troupe::task;
using troupe_test::fails_with;
using troupe_test::field_if_failed;
using troupe_test::make_rt;
using troupe_test::must;
using troupe_test::temp_dir;

namespace {

troupe::channel_scope scope_of(std::string tenant = {}, std::string pipeline = {}) {
  return troupe::channel_scope{"s1", std::move(tenant), std::move(pipeline)};
}

std::string resolved(std::string_view name, const troupe::channel_scope& sc,
                     bool selector = false) {
  auto n = troupe::resolve_channel_name(name, sc, selector);
  REQUIRE(n);
  return n->resolved();
}

errc error_of(std::string_view name, const troupe::channel_scope& sc, bool selector = false) {
  auto n = troupe::resolve_channel_name(name, sc, selector);
  REQUIRE_FALSE(n);
  for (auto e : {errc::invalid_channel_name, errc::scope_reserved, errc::scope_conflict,
                 errc::no_scope_context})
    if (troupe::is(n.error(), e)) return e;
  FAIL("unexpected error " << troupe::render(n.error()));
  return errc::invalid_argument;
}

/// Collects what a callable trigger handler receives.
struct collected {
  std::vector<channel_match> matches;
  size_t events() const {
    size_t n = 0;
    for (auto& m : matches)
      n += m.events.size();
    return n;
  }
};

} // namespace

TEST_CASE("channel names resolve to <scope>:<scope_id>:<name> by the documented rules") {
  auto none = scope_of();
  auto acme = scope_of("acme");
  auto piped = scope_of("acme", "p7");
  CHECK(resolved("orders", none) == "tenant:default:orders");
  CHECK(resolved("orders", acme) == "tenant:acme:orders");
  CHECK(resolved("tenant:orders", acme) == "tenant:acme:orders");
  CHECK(resolved("tenant:acme:orders", acme) == "tenant:acme:orders");
  CHECK(resolved("tenant:beta:orders", none) == "tenant:beta:orders"); // no active tenant
  CHECK(resolved("session:clicks", none) == "session:s1:clicks");
  CHECK(resolved("session:s1:clicks", none) == "session:s1:clicks");
  CHECK(resolved("pipeline:steps", piped) == "pipeline:p7:steps");
  CHECK(resolved("pipeline:p7:steps", piped) == "pipeline:p7:steps");
  CHECK(resolved("orders.created", acme) == "tenant:acme:orders.created");
  // explicit ids that conflict with the active context are refused, never overridden
  CHECK(error_of("tenant:beta:orders", acme) == errc::scope_conflict);
  CHECK(error_of("session:other:clicks", none) == errc::scope_conflict);
  CHECK(error_of("pipeline:p8:steps", piped) == errc::scope_conflict);
  CHECK(error_of("pipeline:steps", acme) == errc::no_scope_context);
  CHECK(error_of("pipeline:p7:steps", acme) == errc::no_scope_context); // explicit id too
  CHECK(error_of("org:all", none) == errc::scope_reserved);
  CHECK(error_of("org:acme:all", none) == errc::scope_reserved);
  for (auto bad : {"", ":", "orders:", ":orders", "tenant::orders", "tenant:", "tenant", "a:b",
                   "tenant:a:b:c", "bad\nname", "orders*", "a..b", ".x", "x.", "tenant:acme:x.",
                   "bad\xffname", "over\xc0\xaflong", "caf\xc3"})
    CHECK(error_of(bad, acme) == errc::invalid_channel_name);
  CHECK(error_of(std::string(121, 'n'), none) == errc::invalid_channel_name);
  CHECK(resolved(std::string(120, 'n'), none).size() == 15 + 120);
  CHECK(error_of("tenant:" + std::string(65, 'i') + ":x", none) == errc::invalid_channel_name);
  // selectors: a trailing * is a prefix
  auto sel = troupe::resolve_channel_name("orders.*", acme, true);
  REQUIRE(sel);
  CHECK(sel->prefix);
  CHECK(sel->name == "orders.");
  CHECK(error_of("ord*ers", acme, true) == errc::invalid_channel_name);
  CHECK(resolved("caf\xc3\xa9.menu", acme) == "tenant:acme:caf\xc3\xa9.menu"); // UTF-8 is fine
  // an active id that cannot be part of a name is refused, naming the task-local
  auto colon = troupe::resolve_channel_name("orders", scope_of("a:b"));
  REQUIRE_FALSE(colon);
  CHECK(troupe_test::fails_with(colon, errc::invalid_channel_name));
  CHECK(troupe::field_of(colon.error()) == "tenant_id");
}

TEST_CASE("an append answers a signed receipt; the same id answers the original, duplicate") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto r = rt.run([](context& cx) -> task<int> {
    auto a = must(co_await troupe::durable_append(cx, "orders", {{"n", 1}}, {"order-1"}));
    CHECK(a.name_resolved == "tenant:default:orders");
    CHECK_FALSE(a.duplicate);
    CHECK(a.event_id > 0);
    CHECK(a.emitted_at.scope == "tenant");
    CHECK(a.emitted_at.scope_id == "default");
    CHECK(a.emitted_at.emitted_by == "task:" + cx.task_id());
    CHECK(a.emitted_at.sig.size() == 64);
    auto b = must(co_await troupe::durable_append(cx, "orders", {{"n", 2}}, {"order-1"}));
    CHECK(b.duplicate);
    CHECK(b.event_id == a.event_id);
    CHECK(b.emitted_at.at_ms == a.emitted_at.at_ms);
    CHECK(b.emitted_at.sig == a.emitted_at.sig);
    // no id: never a duplicate
    auto c = must(co_await troupe::durable_append(cx, "orders", {{"n", 3}}));
    auto d = must(co_await troupe::durable_append(cx, "orders", {{"n", 3}}));
    CHECK(c.event_id != d.event_id);
    CHECK_FALSE(d.duplicate);
    // the same id in another channel is another event
    auto e = must(co_await troupe::durable_append(cx, "refunds", {{"n", 1}}, {"order-1"}));
    CHECK_FALSE(e.duplicate);
    auto evs = must(co_await troupe::durable_events(cx, "orders"));
    REQUIRE(evs.size() == 3); // the duplicate was not stored
    CHECK(json::parse(evs[0].payload) == json{{"n", 1}});
    CHECK(evs[0].id == "order-1");
    CHECK(evs[0].receipt.event_id == a.event_id);
    CHECK(evs[0].receipt.emitted_at.sig == a.emitted_at.sig);
    CHECK(evs[1].receipt.event_id == c.event_id);
    CHECK(evs[2].receipt.event_id == d.event_id);
    auto page = must(co_await troupe::durable_events(cx, "orders", {a.event_id, 1}));
    REQUIRE(page.size() == 1);
    CHECK(page[0].receipt.event_id == c.event_id);
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("verify detects a change to any signed field of a receipt") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto r = rt.run([](context& cx) -> task<int> {
    auto a = must(co_await troupe::durable_append(cx, "tenant:acme:orders", {{"n", 1}}));
    CHECK(must(co_await troupe::durable_verify(cx, a)));
    auto s = must(co_await troupe::durable_append(cx, "session:clicks", {{"n", 1}}));
    CHECK(must(co_await troupe::durable_verify(cx, s)));
    std::vector<std::function<void(channel_receipt&)>> tamper{
        [](channel_receipt& x) { ++x.event_id; },
        [](channel_receipt& x) { x.name_resolved = "tenant:acme:refunds"; },
        [](channel_receipt& x) { x.emitted_at.at_ms += 1; },
        [](channel_receipt& x) { x.emitted_at.scope = "pipeline"; },
        [](channel_receipt& x) { x.emitted_at.scope_id = "beta"; },
        [](channel_receipt& x) { x.emitted_at.emitted_by = "task:9"; },
        [](channel_receipt& x) { x.emitted_at.sig[5] = x.emitted_at.sig[5] == 'a' ? 'b' : 'a'; },
        [](channel_receipt& x) { x.emitted_at.sig.clear(); },
    };
    for (auto& f : tamper) {
      auto copy = a;
      f(copy);
      CHECK_FALSE(must(co_await troupe::durable_verify(cx, copy)));
    }
    // the JSON form round-trips and still verifies
    json j = a;
    CHECK(must(co_await troupe::durable_verify(cx, j.get<channel_receipt>())));
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("idempotency ids and the signing key survive a restart; session events do not") {
  temp_dir dir;
  auto db = dir.file("state.sqlite");
  channel_receipt first;
  channel_receipt session;
  {
    auto rt = make_rt(db);
    auto r = rt.run([&](context& cx) -> task<int> {
      first = must(co_await troupe::durable_append(cx, "orders", {{"n", 1}}, {"k1"}));
      session = must(co_await troupe::durable_append(cx, "session:tmp", {{"n", 1}}, {"k1"}));
      auto again = must(co_await troupe::durable_append(cx, "session:tmp", {{"n", 2}}, {"k1"}));
      CHECK(again.duplicate);
      CHECK(again.event_id == session.event_id);
      CHECK(must(co_await troupe::durable_events(cx, "session:tmp")).size() == 1);
      co_return 0;
    });
    REQUIRE(r);
    rt.stop();
  }
  CHECK(troupe_test::select_int(db, "SELECT count(*) FROM channel_events") ==
        1); // session: memory only
  auto rt = make_rt(db);
  auto r = rt.run([&](context& cx) -> task<int> {
    auto again = must(co_await troupe::durable_append(cx, "orders", {{"n", 9}}, {"k1"}));
    CHECK(again.duplicate);
    CHECK(again.event_id == first.event_id);
    CHECK(again.emitted_at.sig == first.emitted_at.sig);
    CHECK(must(co_await troupe::durable_verify(cx, first))); // the key was kept
    CHECK(must(co_await troupe::durable_verify(cx, session)));
    CHECK(must(co_await troupe::durable_events(cx, "session:tmp")).empty()); // a new session
    auto old = co_await troupe::durable_events(cx, session.name_resolved);
    CHECK(fails_with(old, errc::scope_conflict)); // another session's name
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("distinct scope ids never see each other's events") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto r = rt.run([](context& cx) -> task<int> {
    cx.set_local(std::string{troupe::tenant_local}, std::string{"acme"});
    must(co_await troupe::durable_append(cx, "orders", {{"t", "acme"}}));
    auto other = co_await troupe::durable_append(cx, "tenant:beta:orders", {{"t", "beta"}});
    CHECK(fails_with(other, errc::scope_conflict));
    cx.erase_local(troupe::tenant_local);
    must(co_await troupe::durable_append(cx, "tenant:beta:orders", {{"t", "beta"}}));
    must(co_await troupe::durable_append(cx, "orders", {{"t", "default"}}));
    auto acme = must(co_await troupe::durable_events(cx, "tenant:acme:orders"));
    auto beta = must(co_await troupe::durable_events(cx, "tenant:beta:orders"));
    auto dflt = must(co_await troupe::durable_events(cx, "orders"));
    REQUIRE(acme.size() == 1);
    REQUIRE(beta.size() == 1);
    REQUIRE(dflt.size() == 1);
    CHECK(json::parse(acme[0].payload)["t"] == "acme");
    CHECK(json::parse(beta[0].payload)["t"] == "beta");
    CHECK(json::parse(dflt[0].payload)["t"] == "default");
    // pipeline scope: durable, needs an active pipeline
    auto none = co_await troupe::durable_append(cx, "pipeline:steps", {{"s", 1}});
    CHECK(fails_with(none, errc::no_scope_context));
    cx.set_local(std::string{troupe::pipeline_local}, std::string{"run-1"});
    auto p = must(co_await troupe::durable_append(cx, "pipeline:steps", {{"s", 1}}));
    CHECK(p.name_resolved == "pipeline:run-1:steps");
    cx.set_local(std::string{troupe::pipeline_local}, std::string{"run-2"});
    CHECK(must(co_await troupe::durable_events(cx, "pipeline:steps")).empty());
    auto other_run = co_await troupe::durable_events(cx, "pipeline:run-1:steps");
    CHECK(fails_with(other_run, errc::scope_conflict)); // not while run-2 is active
    cx.erase_local(troupe::pipeline_local);
    auto outside = co_await troupe::durable_events(cx, "pipeline:run-1:steps");
    CHECK(fails_with(outside, errc::no_scope_context)); // nor from outside a pipeline
    cx.set_local(std::string{troupe::pipeline_local}, std::string{"run-1"});
    CHECK(must(co_await troupe::durable_events(cx, "pipeline:steps")).size() == 1);
    // a tenant given as a C string counts; one of another type is refused, not defaulted
    cx.set_local(std::string{troupe::tenant_local}, "beta");
    CHECK(must(co_await troupe::durable_events(cx, "orders")).size() == 1);
    cx.set_local(std::string{troupe::tenant_local}, 42);
    auto mistyped = co_await troupe::durable_append(cx, "orders", {{"t", "?"}});
    CHECK(fails_with(mistyped, errc::invalid_scope));
    CHECK(field_if_failed(mistyped) == "tenant_id");
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("bad channel input answers typed errors naming the field and stores nothing") {
  temp_dir dir;
  auto db = dir.file("state.sqlite");
  auto rt = make_rt(db);
  auto r = rt.run([](context& cx) -> task<int> {
    auto arr = co_await troupe::durable_append(cx, "orders", json::array({1, 2}));
    CHECK(fails_with(arr, errc::invalid_payload));
    CHECK(field_if_failed(arr) == "payload");
    auto str = co_await troupe::durable_append(cx, "orders", "text");
    CHECK(fails_with(str, errc::invalid_payload));
    auto utf = co_await troupe::durable_append(cx, "orders", {{"s", std::string{"\xff\xfe"}}});
    CHECK(fails_with(utf, errc::invalid_payload));
    auto long_id =
        co_await troupe::durable_append(cx, "orders", {{"n", 1}}, {std::string(257, 'x')});
    CHECK(fails_with(long_id, errc::invalid_event_id));
    CHECK(field_if_failed(long_id) == "id");
    auto ok_id = co_await troupe::durable_append(cx, "orders", {{"n", 1}}, {std::string(256, 'x')});
    CHECK(ok_id);
    auto empty_seg = co_await troupe::durable_append(cx, "tenant::orders", {{"n", 1}});
    CHECK(fails_with(empty_seg, errc::invalid_channel_name));
    CHECK(field_if_failed(empty_seg) == "name");
    auto org = co_await troupe::durable_append(cx, "org:x", {{"n", 1}});
    CHECK(fails_with(org, errc::scope_reserved));
    auto utf_name = co_await troupe::durable_append(cx, "orders\xff", {{"n", 1}});
    CHECK(fails_with(utf_name, errc::invalid_channel_name));
    auto dots = co_await troupe::durable_append(cx, "orders..x", {{"n", 1}});
    CHECK(fails_with(dots, errc::invalid_channel_name));
    auto lim = co_await troupe::durable_events(cx, "orders", {0, 0});
    CHECK(fails_with(lim, errc::invalid_argument));
    co_return 0;
  });
  REQUIRE(r);
  rt.stop();
  CHECK(troupe_test::select_int(db, "SELECT count(*) FROM channel_events") == 1);
}

TEST_CASE("a trigger receives every matching append once, with its match receipt") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto seen = std::make_shared<collected>();
  auto r = rt.run([seen](context& cx) -> task<int> {
    auto id = must(co_await troupe::durable_bind(
        cx, {{"channel", "channel:orders.*"}},
        [seen](const channel_match& m) { seen->matches.push_back(m); }));
    CHECK(id > 0);
    auto a = must(co_await troupe::durable_append(cx, "orders.created", {{"n", 1}}, {"a"}));
    must(co_await troupe::durable_append(cx, "orders.created", {{"n", 1}}, {"a"})); // duplicate
    must(co_await troupe::durable_append(cx, "orders.paid", {{"n", 2}}));
    must(co_await troupe::durable_append(cx, "refunds", {{"n", 3}}));              // no match
    must(co_await troupe::durable_append(cx, "tenant:beta:orders.x", {{"n", 4}})); // other id
    must(co_await troupe::durable_append(cx, "session:orders.x", {{"n", 5}}));     // other scope
    must(co_await troupe::durable_flush(cx));
    co_await cx.yield_now();
    REQUIRE(seen->matches.size() == 2);
    auto& m = seen->matches[0];
    CHECK(m.binding == id);
    CHECK(m.reason == "append");
    REQUIRE(m.events.size() == 1);
    CHECK(m.events[0].receipt.event_id == a.event_id);
    CHECK(m.events[0].receipt.emitted_at.sig == a.emitted_at.sig);
    CHECK(m.events[0].id == "a");
    CHECK(json::parse(m.events[0].payload)["n"] == 1);
    CHECK(seen->matches[1].match_id > m.match_id);
    CHECK(json::parse(seen->matches[1].events[0].payload)["n"] == 2);
    // a session binding sees session appends
    must(co_await troupe::durable_bind(
        cx, {{"channel", "channel:session:*"}},
        [seen](const channel_match& x) { seen->matches.push_back(x); }));
    must(co_await troupe::durable_append(cx, "session:clicks", {{"n", 6}}));
    CHECK(must(co_await troupe::durable_unbind(cx, id)));
    CHECK_FALSE(must(co_await troupe::durable_unbind(cx, id)));
    must(co_await troupe::durable_append(cx, "orders.created", {{"n", 7}})); // unbound
    must(co_await troupe::durable_flush(cx));
    co_await cx.yield_now();
    REQUIRE(seen->matches.size() == 3);
    CHECK(json::parse(seen->matches[2].events[0].payload)["n"] == 6);
    auto metrics = must(co_await troupe::durable_metrics_of(cx));
    CHECK(metrics.matches == 3);
    CHECK(metrics.duplicates == 1);
    CHECK(metrics.bindings == 1);
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("batch aggregation fires per key at count, and at window expiry") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto seen = std::make_shared<collected>();
  auto r = rt.run([seen](context& cx) -> task<int> {
    auto keep = [seen](const channel_match& m) { seen->matches.push_back(m); };
    auto id = must(co_await troupe::durable_bind(
        cx,
        {{"channel", "channel:orders"},
         {"batch", {{"count", 3}, {"window", 1000}, {"key", "customer"}}}},
        keep));
    for (int i = 0; i < 4; ++i) {
      must(co_await troupe::durable_append(cx, "orders", {{"customer", "ann"}, {"i", i}}));
      must(co_await troupe::durable_append(cx, "orders", {{"customer", "bob"}, {"i", i}}));
    }
    must(co_await troupe::durable_append(cx, "orders", {{"i", 99}})); // no key: partition ""
    co_await cx.yield_now();
    REQUIRE(seen->matches.size() == 2); // ann and bob reached 3
    for (auto& m : seen->matches) {
      CHECK(m.reason == "count");
      CHECK(m.binding == id);
      REQUIRE(m.events.size() == 3);
      for (size_t i = 0; i < 3; ++i) {
        auto p = json::parse(m.events[i].payload);
        CHECK(p["customer"] == m.key);
        CHECK(p["i"] == i); // in order
      }
    }
    CHECK(seen->matches[0].key == "ann");
    CHECK(seen->matches[1].key == "bob");
    co_await cx.sleep(999ms);
    CHECK(seen->matches.size() == 2);
    co_await cx.sleep(2ms); // the windows expire: fire_partial (the default)
    co_await cx.yield_now();
    REQUIRE(seen->matches.size() == 5);
    size_t partial = 0;
    for (size_t i = 2; i < 5; ++i) {
      CHECK(seen->matches[i].reason == "window");
      partial += seen->matches[i].events.size();
    }
    CHECK(partial == 3); // ann's 4th, bob's 4th, the keyless one
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("stop flushes open trigger windows, and a stop participant may still append") {
  temp_dir dir;
  auto db = dir.file("state.sqlite");
  auto seen = std::make_shared<collected>();
  caf::error participant_error;
  {
    auto rt = make_rt(db);
    REQUIRE(rt.run([seen](context& cx) -> task<int> {
      auto keep = [seen](const channel_match& m) { seen->matches.push_back(m); };
      must(co_await troupe::durable_bind(
          cx, {{"channel", "channel:orders"}, {"batch", {{"count", 10}, {"window", 60000}}}},
          keep));
      must(co_await troupe::durable_append(cx, "orders", {{"n", 1}}));
      co_return 0;
    }));
    REQUIRE(!rt.on_stop("checkpoint", [&participant_error](context& cx) -> task<void> {
      auto r = co_await troupe::durable_append(cx, "orders", {{"n", 2}});
      if (!r) participant_error = r.error(); // was: runtime_stopped
    }));
    rt.stop();
    for (auto& n : rt.notices())
      UNSCOPED_INFO(n.kind << " " << n.subject << ": " << n.detail);
    CHECK(rt.notices().empty());
  }
  CHECK(!participant_error);
  // Step 5 flushed the open window (was: never flushed, the window's events dropped).
  REQUIRE(seen->matches.size() == 1);
  CHECK(seen->matches[0].reason == "flush");
  CHECK(seen->events() == 2);
  CHECK(troupe_test::select_int(db, "SELECT count(*) FROM channel_events") == 2);
  // Its match row reached the audit topic before the storage closed.
  CHECK(troupe_test::select_int(db, "SELECT count(*) FROM events WHERE topic = "
                                    "'lifecycle.channel.audit' AND payload LIKE '%\"match\"%'") ==
        1);
}

TEST_CASE("discard drops expired windows; full buffers drop the oldest with a warning") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto seen = std::make_shared<collected>();
  auto r = rt.run([seen](context& cx) -> task<int> {
    auto keep = [seen](const channel_match& m) { seen->matches.push_back(m); };
    must(co_await troupe::durable_bind(
        cx,
        {{"channel", "channel:session:clicks"},
         {"batch", {{"count", 5}, {"window", 100}, {"expire_action", "discard"}}}},
        keep));
    for (int i = 0; i < 3; ++i)
      must(co_await troupe::durable_append(cx, "session:clicks", {{"i", i}}));
    co_await cx.sleep(200ms);
    co_await cx.yield_now();
    CHECK(seen->matches.empty());
    auto m1 = must(co_await troupe::durable_metrics_of(cx));
    CHECK(m1.discarded == 3);
    CHECK(m1.buffered == 0);
    // a batch larger than a partition's buffer: the oldest events go, each with a warning
    must(co_await troupe::durable_bind(
        cx, {{"channel", "channel:session:bulk"}, {"batch", {{"count", 2000}}}}, keep));
    for (int i = 0; i < 1030; ++i)
      must(co_await troupe::durable_append(cx, "session:bulk", {{"i", i}}));
    auto m2 = must(co_await troupe::durable_metrics_of(cx));
    CHECK(m2.dropped == 6);
    CHECK(m2.buffered == 1024);
    CHECK(must(co_await troupe::durable_flush(cx)) == 1); // flush fires what is buffered
    co_await cx.yield_now();
    REQUIRE(seen->matches.size() == 1);
    auto& m = seen->matches[0];
    CHECK(m.reason == "flush");
    REQUIRE(m.events.size() == 1024);
    CHECK(json::parse(m.events.front().payload)["i"] == 6); // 0..5 were dropped
    CHECK(json::parse(m.events.back().payload)["i"] == 1029);
    auto warnings = must(co_await troupe::event_read(cx, troupe::channel_warning_topic, 0, 100));
    REQUIRE(warnings.size() == 6);
    CHECK(json::parse(warnings[0].payload)["kind"] == "buffer_overflow");
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("a malformed binding is refused with a typed error naming the field") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto r = rt.run([](context& cx) -> task<int> {
    auto nop = [](const channel_match&) {};
    auto field = [&](json b) -> task<std::string> {
      auto x = co_await troupe::durable_bind(cx, std::move(b), nop);
      REQUIRE_FALSE(x);
      CHECK(fails_with(x, errc::invalid_binding));
      co_return field_if_failed(x);
    };
    CHECK(co_await field(json::object()) == "channel");
    CHECK(co_await field(json::array()) == "binding");
    CHECK(co_await field({{"channel", 5}}) == "channel");
    CHECK(co_await field({{"channel", "orders"}}) == "channel"); // no channel: prefix
    CHECK(co_await field({{"channel", "channel:x"}, {"extra", 1}}) == "extra");
    CHECK(co_await field({{"channel", "channel:x"}, {"batch", 3}}) == "batch");
    CHECK(co_await field({{"channel", "channel:x"}, {"batch", json::object()}}) == "batch.count");
    CHECK(co_await field({{"channel", "channel:x"}, {"batch", {{"count", 0}}}}) == "batch.count");
    CHECK(co_await field({{"channel", "channel:x"}, {"batch", {{"count", -2}}}}) == "batch.count");
    CHECK(co_await field({{"channel", "channel:x"}, {"batch", {{"count", "3"}}}}) == "batch.count");
    CHECK(co_await field(
              {{"channel", "channel:x"}, {"batch", {{"count", 2}, {"expire_action", "later"}}}}) ==
          "batch.expire_action");
    CHECK(co_await field({{"channel", "channel:x"}, {"batch", {{"count", 2}, {"key", 7}}}}) ==
          "batch.key");
    CHECK(co_await field({{"channel", "channel:x"}, {"batch", {{"count", 2}, {"window", 0}}}}) ==
          "batch.window");
    auto no_handler = co_await troupe::durable_bind(cx, {{"channel", "channel:x"}},
                                                    std::function<void(const channel_match&)>{});
    CHECK(fails_with(no_handler, errc::invalid_binding));
    auto org = co_await troupe::durable_bind(cx, {{"channel", "channel:org:x"}}, nop);
    CHECK(fails_with(org, errc::scope_reserved));
    CHECK(must(co_await troupe::durable_metrics_of(cx)).bindings == 0);
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("lifecycle.channel.audit receives one receipt per append and one per match") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto r = rt.run([](context& cx) -> task<int> {
    must(co_await troupe::durable_bind(cx, {{"channel", "channel:orders"}},
                                       [](const channel_match&) {}));
    auto a = must(co_await troupe::durable_append(cx, "orders", {{"n", 1}}, {"x"}));
    must(co_await troupe::durable_append(cx, "orders", {{"n", 1}}, {"x"})); // duplicate
    must(co_await troupe::durable_append(cx, "other", {{"n", 2}}));
    must(co_await troupe::durable_append(cx, "session:s", {{"n", 3}}));
    must(co_await troupe::durable_flush(cx));
    co_await cx.yield_now();
    auto rows = must(co_await troupe::event_read(cx, troupe::channel_audit_topic, 0, 100));
    size_t appends = 0;
    size_t matches = 0;
    size_t duplicates = 0;
    for (auto& row : rows) {
      auto j = json::parse(row.payload);
      if (j["kind"] == "append") {
        ++appends;
        if (j["duplicate"] == true) ++duplicates;
        auto rc = j.get<channel_receipt>();
        CHECK(must(co_await troupe::durable_verify(cx, rc)));
      } else if (j["kind"] == "match") {
        ++matches;
        CHECK(j["event_ids"] == json::array({a.event_id}));
        CHECK(j["selector"] == "channel:orders");
      }
    }
    CHECK(appends == 4);
    CHECK(duplicates == 1);
    CHECK(matches == 1);
    CHECK(rows.size() == 5);
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("a binding made while an append is in flight gets its payload and id") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto seen = std::make_shared<collected>();
  auto r = rt.run([seen](context& cx) -> task<int> {
    must(co_await troupe::durable_metrics_of(cx)); // the hub is open
    // Branch 0 appends, branch 1 binds: the bind reaches the hub before the storage answers.
    auto done = co_await cx.parallel(2, [seen](context& c, size_t i) -> task<int> {
      if (i == 0) {
        must(co_await troupe::durable_append(c, "orders", {{"n", 1}}, {"first"}));
      } else {
        must(co_await troupe::durable_bind(
            c, {{"channel", "channel:orders"}},
            [seen](const channel_match& m) { seen->matches.push_back(m); }));
      }
      co_return 0;
    });
    CHECK(done);
    must(co_await troupe::durable_flush(cx));
    co_await cx.yield_now();
    co_return 0;
  });
  REQUIRE(r);
  REQUIRE(seen->matches.size() == 1); // the ordering this test needs did happen
  REQUIRE(seen->matches[0].events.size() == 1);
  CHECK(seen->matches[0].events[0].id == "first");
  CHECK(json::parse(seen->matches[0].events[0].payload) == json{{"n", 1}});
}

TEST_CASE("a storage actor that ended is opened again, and the hub with it") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto r1 = rt.run([](context& cx) -> task<int> {
    must(co_await troupe::durable_append(cx, "orders", {{"n", 1}}, {"a"}));
    co_return 0;
  });
  REQUIRE(r1);
  auto old = rt.storage();
  REQUIRE(old);
  caf::anon_send_exit(*old, caf::exit_reason::kill);
  auto r2 = rt.run([](context& cx) -> task<int> {
    co_await cx.yield_now();
    // a new storage actor on the same file: the id is still known, the hub works again
    auto again = must(co_await troupe::durable_append(cx, "orders", {{"n", 2}}, {"a"}));
    CHECK(again.duplicate);
    must(co_await troupe::event_append(cx, "log", {{"n", 1}}));
    CHECK(must(co_await troupe::durable_events(cx, "orders")).size() == 1);
    co_return 0;
  });
  REQUIRE(r2);
  auto now = rt.storage();
  REQUIRE(now);
  CHECK(*now != *old);
  // Reopened by the event log first: the live hub moves to the new storage and keeps its
  // bindings.
  auto seen = std::make_shared<collected>();
  auto r3 = rt.run([seen](context& cx) -> task<int> {
    must(co_await troupe::durable_bind(
        cx, {{"channel", "channel:orders"}},
        [seen](const channel_match& m) { seen->matches.push_back(m); }));
    co_return 0;
  });
  REQUIRE(r3);
  caf::anon_send_exit(*now, caf::exit_reason::kill);
  auto r4 = rt.run([](context& cx) -> task<int> {
    co_await cx.yield_now();
    must(co_await troupe::event_append(cx, "log", {{"n", 2}})); // opens the storage again
    must(co_await troupe::durable_append(cx, "orders", {{"n", 3}}, {"b"}));
    must(co_await troupe::durable_flush(cx));
    co_await cx.yield_now();
    co_return 0;
  });
  REQUIRE(r4);
  REQUIRE(seen->matches.size() == 1);
  CHECK(seen->matches[0].events.at(0).id == "b");
}

TEST_CASE("a real-time runtime with channels, a trigger and a rate limit stops cleanly") {
  temp_dir dir;
  auto rt = troupe::runtime::builder{}.threads(2).storage(dir.file("rt.sqlite")).build();
  REQUIRE(rt);
  auto fired = std::make_shared<std::atomic<int>>(0);
  auto r = rt->run([fired](context& cx) -> task<int> {
    must(co_await troupe::durable_bind(cx, {{"channel", "channel:jobs"}},
                                       [fired](const channel_match&) { ++*fired; }));
    for (int i = 0; i < 20; ++i)
      must(co_await troupe::durable_append(cx, "jobs", {{"i", i}}, {std::to_string(i % 10)}));
    must(co_await troupe::rate_limit_acquire(
        cx, json{{"buckets", {{{"key", "k"}, {"limit", 5}}}}, {"timeout_ms", 0}}));
    must(co_await troupe::durable_flush(cx));
    co_return static_cast<int>(must(co_await troupe::durable_events(cx, "jobs")).size());
  });
  REQUIRE(r);
  CHECK(*r == 10); // ids 0..9, each once
  rt->stop();      // returns: no handle keeps the storage thread alive
  CHECK(fired->load() == 10);
}

TEST_CASE("a session channel keeps its newest events up to its capacity") {
  temp_dir dir;
  auto rt2 = troupe::runtime::builder{}
                 .virtual_time()
                 .storage(dir.file("state.sqlite"))
                 .config_json(R"({"session_channel_capacity": 3})")
                 .build();
  REQUIRE(rt2);
  auto r = rt2->run([](context& cx) -> task<int> {
    std::vector<int64_t> ids;
    for (int i = 0; i < 5; ++i)
      ids.push_back(must(co_await troupe::durable_append(cx, "session:s", {{"i", i}},
                                                         {"id" + std::to_string(i)}))
                        .event_id);
    auto evs = must(co_await troupe::durable_events(cx, "session:s"));
    REQUIRE(evs.size() == 3);
    CHECK(json::parse(evs.front().payload)["i"] == 2);
    CHECK(json::parse(evs.back().payload)["i"] == 4);
    // a kept id is still a duplicate; an evicted one is new again
    auto kept = must(co_await troupe::durable_append(cx, "session:s", {{"i", 9}}, {"id3"}));
    CHECK(kept.duplicate);
    CHECK(kept.event_id == ids[3]);
    auto gone = must(co_await troupe::durable_append(cx, "session:s", {{"i", 9}}, {"id0"}));
    CHECK_FALSE(gone.duplicate);
    CHECK(must(co_await troupe::durable_metrics_of(cx)).session_evicted == 3);
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("a trigger handler can be a plain actor receiving (ch_trigger, channel_match)") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto seen = std::make_shared<collected>();
  auto handler = rt.system().spawn([seen]() -> caf::behavior {
    return {[seen](troupe::atoms::ch_trigger_atom, const channel_match& m) {
      seen->matches.push_back(m);
    }};
  });
  auto r = rt.run([handler](context& cx) -> task<int> {
    must(co_await troupe::durable_bind(cx, {{"channel", "channel:orders"}}, handler));
    must(co_await troupe::durable_append(cx, "orders", {{"n", 1}}, {"x"}));
    must(co_await troupe::durable_flush(cx));
    auto none = co_await troupe::durable_bind(cx, {{"channel", "channel:orders"}}, caf::actor{});
    CHECK(fails_with(none, errc::invalid_binding));
    co_return 0;
  });
  REQUIRE(r);
  rt.drain();
  REQUIRE(seen->matches.size() == 1);
  CHECK(seen->matches[0].events.at(0).id == "x");
  caf::anon_send_exit(handler, caf::exit_reason::user_shutdown);
  rt.drain();
}

// -- triggers into pools --------------------------------------------------------------------

TEST_CASE("a trigger binding routes matched events into a named pool, with priority and key") {
  temp_dir dir;
  auto rt = make_rt(dir.file("state.sqlite"));
  auto r = rt.run([](context& cx) -> task<int> {
    troupe::pool_spec spec;
    spec.name = "orders";
    spec.backpressure = {troupe::pool_backpressure_kind::queue, 1, troupe::pool_on_full::drop_newest};
    auto p = must(co_await troupe::open_pool(cx, spec));
    auto seen = std::make_shared<std::vector<int>>();
    troupe::spawn_to_pool target;
    target.pool = "orders";
    target.priority_from = "meta.priority";
    target.key_from = "$.tenant";
    target.task_factory = [seen](context& w, const troupe::channel_event& ev) -> task<void> {
      co_await w.sleep(std::chrono::milliseconds{1});
      seen->push_back(json::parse(ev.payload)["n"].get<int>());
    };
    auto id = must(co_await troupe::durable_bind_to_pool(cx, {{"channel", "channel:orders.*"}}, target));
    CHECK(id > 0);
    must(co_await troupe::durable_append(cx, "orders.new", {{"n", 1}, {"meta", {{"priority", "7"}}}, {"tenant", "acme"}}));
    must(co_await troupe::durable_append(cx, "orders.new", {{"n", 2}}));
    // 1 runs, 2 is queued: the queue (max depth 1) is full, so 3 is dropped (drop_newest):
    // audited by the pool, not an error of the dispatch.
    must(co_await troupe::durable_append(cx, "orders.new", {{"n", 3}, {"meta", {{"priority", 9}}}}));
    must(co_await troupe::durable_flush(cx));
    for (int i = 0; i < 100 && seen->size() < 2; ++i)
      co_await cx.sleep(std::chrono::milliseconds{1});
    (void)must(co_await troupe::wait_idle(cx, p));
    CHECK(*seen == std::vector<int>{1, 2});
    auto tasks = must(co_await troupe::tasks_of(cx, p));
    REQUIRE(tasks.size() == 3);
    CHECK(tasks[0].priority == 7);
    CHECK(tasks[0].key == "acme");
    CHECK(tasks[1].priority == 0); // missing: priority 0, no key
    CHECK(tasks[1].key.empty());
    CHECK(tasks[2].priority == 9);
    CHECK(tasks[2].status == troupe::pool_task_status::rejected);
    CHECK(tasks[2].rejection_policy == "drop_newest");
    auto drops = must(co_await troupe::event_read(cx, "pool.audit", 0, 10));
    REQUIRE(drops.size() == 1);
    CHECK(json::parse(drops[0].payload)["policy"] == "drop_newest");
    // An event for a pool that does not exist goes to the dead letters.
    troupe::spawn_to_pool missing = target;
    missing.pool = "nope";
    must(co_await troupe::durable_bind_to_pool(cx, {{"channel", "channel:refunds"}}, missing));
    auto rec = must(co_await troupe::durable_append(cx, "refunds", {{"n", 4}}));
    must(co_await troupe::durable_flush(cx));
    std::vector<troupe::event_record> dead;
    for (int i = 0; i < 100 && dead.empty(); ++i) {
      co_await cx.sleep(std::chrono::milliseconds{1});
      dead = must(co_await troupe::event_read(cx, "pool.dead_letter", 0, 10));
    }
    REQUIRE(dead.size() == 1);
    auto d = json::parse(dead[0].payload);
    CHECK(d["pool"] == "nope");
    CHECK(d["event"]["event_id"] == rec.event_id);
    CHECK(d["event"]["payload"]["n"] == 4);
    CHECK(d["error"].get<std::string>().find("TROUPE-POL-005") != std::string::npos);
    CHECK(seen->size() == 2);
    // Bad input: no pool, no factory.
    auto bad = target;
    bad.pool.clear();
    auto e1 = co_await troupe::durable_bind_to_pool(cx, {{"channel", "channel:x"}}, bad);
    CHECK(troupe_test::field_if_failed(e1) == "pool");
    bad = target;
    bad.task_factory = nullptr;
    auto e2 = co_await troupe::durable_bind_to_pool(cx, {{"channel", "channel:x"}}, bad);
    CHECK(troupe_test::field_if_failed(e2) == "task_factory");
    co_return 0;
  });
  REQUIRE(r);
}

TEST_CASE("json paths and priorities of spawn_to_pool read what the issue says") {
  auto j = json::parse(R"({"a":{"b":"7"},"p":3,"s":"x7","f":1.5})");
  CHECK(troupe::priority_from_json(troupe::json_at(j, "a.b")) == 7);
  CHECK(troupe::priority_from_json(troupe::json_at(j, "$.a.b")) == 7);
  CHECK(troupe::priority_from_json(troupe::json_at(j, "/a/b")) == 7);
  CHECK(troupe::priority_from_json(troupe::json_at(j, "p")) == 3);
  CHECK(troupe::priority_from_json(troupe::json_at(j, "s")) == 0);
  CHECK(troupe::priority_from_json(troupe::json_at(j, "f")) == 0);
  CHECK(troupe::json_at(j, "missing.x") == nullptr);
  CHECK(troupe::json_at(j, "/nope") == nullptr);
  CHECK(troupe::priority_from_json(nullptr) == 0);
}
