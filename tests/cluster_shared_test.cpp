// Storage across nodes: one node shares its database (`cluster.share_storage`), others use
// it as their own (`cluster.remote_storage`): the event log, durable channels, pipeline
// pools, rate limits and subscriptions work from any node; the owner's death, graceful or
// `kill -9`, answers `storage_unavailable`, never a hang. Every wait is bounded.

#include <chrono>
#include <filesystem>
#include <future>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <troupe/persistence/storage.hpp>
#include <troupe/troupe.hpp>

#include "child_process.hpp"
#include "cluster_support.hpp"
#include "test_support.hpp"

namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using troupe::context;
using troupe::errc;
using troupe::member_status;
using troupe::task;
using troupe_test::address_of;
using troupe_test::node_config;

troupe::runtime make_node(troupe::cluster_config c, const std::string& db) {
  troupe::runtime::builder b;
  b.threads(2).storage(db).cluster(std::move(c));
  auto rt = b.build();
  if (!rt) FAIL(troupe::render(rt.error()));
  return std::move(*rt);
}

troupe::cluster_config sharing(std::string node, std::string name,
                               std::vector<troupe::node_address> seeds = {}) {
  auto c = node_config(std::move(node), std::move(seeds));
  c.share_storage = std::move(name);
  return c;
}

troupe::cluster_config using_storage(std::string node, std::string name,
                                     std::vector<troupe::node_address> seeds) {
  auto c = node_config(std::move(node), std::move(seeds));
  c.remote_storage = std::move(name);
  return c;
}

bool is_unavailable(const caf::error& e) {
  return e.category() == caf::atom("troupe") &&
         static_cast<errc>(e.code()) == errc::storage_unavailable;
}

template <class T>
T must(caf::expected<T> x) {
  if (!x) FAIL(troupe::render(x.error()));
  return std::move(*x);
}

/// `rt.run` of a body yielding `caf::expected<T>`: both layers must hold.
template <class T>
T must(caf::expected<caf::expected<T>> x) {
  if (!x) FAIL(troupe::render(x.error()));
  return must(std::move(*x));
}

troupe::rate_limit_request one_bucket(int64_t limit) {
  troupe::rate_limit_request req;
  req.buckets.push_back(troupe::rate_bucket{"api", limit, 1, 60000});
  return req;
}

} // namespace

TEST_CASE("a node's storage shared with the cluster serves another node's event log, channels, "
          "pools and rate limits") {
  troupe_test::temp_dir dir;
  std::filesystem::create_directories(dir.path);
  auto a = make_node(sharing("sa", "main"), dir.file("a.sqlite"));
  auto b = make_node(using_storage("sb", "main", {address_of(a)}), dir.file("b.sqlite"));
  REQUIRE(b.await_member("sa", member_status::up, 10s));

  // event log: appended on b, read on a (one database)
  auto appended = must(b.run([](context& cx) -> task<caf::expected<troupe::event_receipt>> {
    co_return co_await troupe::event_append(cx, "orders", {{"n", 1}});
  }));
  auto read = must(a.run([](context& cx) -> task<caf::expected<std::vector<troupe::event_record>>> {
    co_return co_await troupe::event_read(cx, "orders");
  }));
  REQUIRE(read.size() == 1);
  CHECK(read[0].event_id == appended.event_id);
  CHECK(json::parse(read[0].payload) == json{{"n", 1}});
  CHECK_FALSE(std::filesystem::exists(dir.file("b.sqlite"))); // b never opened a file

  // durable channels: the receipt is signed on a; b verifies it by asking a (the key stays
  // there), a verifies it itself; a forged one fails on both
  auto receipt = must(b.run([](context& cx) -> task<caf::expected<troupe::channel_receipt>> {
    co_return co_await troupe::durable_append(cx, "orders", {{"n", 2}}, {"order-2"});
  }));
  CHECK(receipt.name_resolved == "tenant:default:orders");
  auto forged = receipt;
  forged.emitted_at.emitted_by = "someone else";
  for (auto* rt : {&a, &b}) {
    CHECK(must(rt->run([receipt](context& cx) -> task<caf::expected<bool>> {
      co_return co_await troupe::durable_verify(cx, receipt);
    })));
    CHECK_FALSE(must(rt->run([forged](context& cx) -> task<caf::expected<bool>> {
      co_return co_await troupe::durable_verify(cx, forged);
    })));
  }
  // the idempotency id is the database's: a repeat on a answers b's original
  auto again = must(a.run([](context& cx) -> task<caf::expected<troupe::channel_receipt>> {
    co_return co_await troupe::durable_append(cx, "orders", {{"n", 3}}, {"order-2"});
  }));
  CHECK(again.duplicate);
  CHECK(again.event_id == receipt.event_id);
  // session channels stay on their node, signed with its hub's own key
  CHECK(must(b.run([](context& cx) -> task<caf::expected<bool>> {
    auto r = co_await troupe::durable_append(cx, "session:chat", {{"hi", 1}});
    if (!r) co_return r.error();
    CHECK(r->emitted_at.scope == "session");
    co_return co_await troupe::durable_verify(cx, *r);
  })));

  // rate limits: one bucket in one database, whichever node reserves
  auto acquire = [](troupe::runtime& rt, int64_t limit) {
    return must(rt.run([limit](context& cx) -> task<caf::expected<troupe::rate_limit_result>> {
      co_return co_await troupe::rate_limit_acquire(cx, one_bucket(limit));
    }));
  };
  CHECK(acquire(b, 2).ok);
  CHECK(acquire(a, 2).ok);
  CHECK_FALSE(acquire(b, 2).ok); // full: b's reservation and a's share the window

  // pipeline pools: a submit through b is acknowledged after its record committed on a
  auto rows_on_a = [&a] {
    return must(a.run([](context& cx) -> task<caf::expected<troupe::storage_metrics>> {
      co_return co_await troupe::storage_metrics_of(cx);
    })).rows;
  };
  auto rows_before = rows_on_a();
  auto outcome = must(b.run([](context& cx) -> task<caf::expected<int>> {
    cx.set_local(std::string{troupe::pipeline_local}, std::string{"p1"});
    troupe::pool_spec s;
    s.name = "durable";
    s.scope = troupe::pool_scope::pipeline;
    auto p = co_await troupe::open_pool(cx, s);
    if (!p) co_return p.error();
    auto h = co_await troupe::submit(cx, *p, [](context&) -> task<int> { co_return 42; },
                                     {.idempotency_key = "job-1"});
    if (!h) co_return h.error();
    auto v = co_await troupe::wait_for(cx, *h);
    if (!v) co_return v.error();
    co_return v->result();
  }));
  CHECK(outcome == 42);
  CHECK(rows_on_a() > rows_before);

  // a subscription through b's link: events appended on a arrive; a's going ends it
  // (a scoped actor lives in its runtime's system: it goes before that runtime stops)
  auto sub_ptr = std::make_unique<caf::scoped_actor>(b.system());
  auto& sub = *sub_ptr;
  CHECK(must(b.run([who = caf::actor_cast<caf::actor>(sub)](context& cx) -> task<caf::expected<bool>> {
    co_return co_await troupe::event_subscribe(cx, "feed", 0, who);
  })));
  (void)must(a.run([](context& cx) -> task<caf::expected<troupe::event_receipt>> {
    co_return co_await troupe::event_append(cx, "feed", {{"k", "v"}});
  }));
  bool got_event = false;
  sub->receive(
      [&](troupe::atoms::st_event_atom, const troupe::event_record& r) {
        got_event = json::parse(r.payload) == json{{"k", "v"}};
      },
      caf::after(10s) >> [] {});
  CHECK(got_event);

  // a leaves: the subscriber hears so, b's calls answer storage_unavailable at once
  a.stop();
  bool ended = false;
  sub->receive(
      [&](troupe::atoms::st_ended_atom, const std::string& topic, const caf::error& why) {
        ended = topic == "feed" && is_unavailable(why);
      },
      caf::after(10s) >> [] {});
  CHECK(ended);
  auto after = b.run([](context& cx) -> task<caf::expected<troupe::event_receipt>> {
    co_return co_await troupe::event_append(cx, "orders", {{"n", 4}});
  });
  REQUIRE(after);
  REQUIRE_FALSE(*after);
  CHECK(is_unavailable(after->error()));
  // the link knew first ("storage"), or the lookup after it found no member sharing it
  auto field = troupe::field_of(after->error());
  CHECK((field == "storage" || field == "cluster.remote_storage"));
  auto channel = b.run([](context& cx) -> task<caf::expected<troupe::channel_receipt>> {
    co_return co_await troupe::durable_append(cx, "orders", {{"n", 5}});
  });
  REQUIRE(channel);
  REQUIRE_FALSE(*channel);
  CHECK(is_unavailable(channel->error()));

  // a comes back (same name, same file): b finds the storage again on its next use
  auto a2 = make_node(sharing("sa", "main", {address_of(b)}), dir.file("a.sqlite"));
  REQUIRE(b.await_member("sa", member_status::up, 10s));
  auto back = must(b.run([](context& cx) -> task<caf::expected<std::vector<troupe::event_record>>> {
    auto r = co_await troupe::event_append(cx, "orders", {{"n", 6}});
    if (!r) co_return r.error();
    co_return co_await troupe::event_read(cx, "orders");
  }));
  REQUIRE(back.size() == 2);
  CHECK(json::parse(back[1].payload) == json{{"n", 6}});
  sub_ptr.reset();
  b.stop();
  a2.stop();
}

TEST_CASE("storage sharing: bad configurations are refused naming the field") {
  auto field_of_error = [](troupe::runtime_config cfg) -> std::string {
    auto err = cfg.validate();
    return err ? troupe::field_of(err) : std::string{"accepted"};
  };
  troupe::runtime_config cfg;
  cfg.cluster.share_storage = "main"; // not a cluster node
  CHECK(field_of_error(cfg) == "cluster.share_storage");
  cfg.cluster = node_config("n");
  cfg.cluster.share_storage = "a b";
  CHECK(field_of_error(cfg) == "cluster.share_storage");
  cfg.cluster.share_storage = "main";
  cfg.cluster.remote_storage = "main";
  CHECK(field_of_error(cfg) == "cluster.remote_storage");
  cfg.cluster.share_storage.clear();
  CHECK(field_of_error(cfg) == "accepted");
  auto parsed = troupe::runtime_config::from_json(
      R"({"cluster": {"node": "n", "insecure": true, "remote_storage": 7}})");
  REQUIRE_FALSE(parsed);
  CHECK(troupe::field_of(parsed.error()) == "cluster.remote_storage");
  parsed = troupe::runtime_config::from_json(
      R"({"cluster": {"node": "n", "insecure": true, "share_storage": "orders"}})");
  REQUIRE(parsed);
  CHECK(parsed->cluster.share_storage == "orders");

  // a node using a storage nobody shares: storage_unavailable on use, naming the setting
  troupe_test::temp_dir dir;
  auto lone = make_node(using_storage("lone", "nobody", {}), dir.file("x.sqlite"));
  auto r = lone.run([](context& cx) -> task<caf::expected<troupe::event_receipt>> {
    co_return co_await troupe::event_append(cx, "t", {{"n", 1}});
  });
  REQUIRE(r);
  REQUIRE_FALSE(*r);
  CHECK(is_unavailable(r->error()));
  CHECK(troupe::field_of(r->error()) == "cluster.remote_storage");
  lone.stop();
}

TEST_CASE("a storage link answers the calls in flight when its owner goes: actor ended or node "
          "reported down") {
  troupe_test::temp_dir dir;
  auto built = troupe::runtime::builder{}.threads(2).storage(dir.file("unused.sqlite")).build();
  REQUIRE(built);
  auto& rt = *built;
  auto& sys = rt.system();
  // A stand-in for another node's storage: reads wait forever, metrics fail typed.
  auto fake = [&sys] {
    return sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
      auto parked = std::make_shared<std::vector<caf::response_promise>>();
      return {[self, parked](troupe::atoms::st_read_atom, const std::string&, int64_t,
                             int64_t) -> caf::result<std::vector<troupe::event_record>> {
                parked->push_back(self->make_response_promise());
                return caf::delegated<std::vector<troupe::event_record>>{};
              },
              [](troupe::atoms::st_metrics_atom) -> caf::result<troupe::storage_metrics> {
                return troupe::make_error(errc::invalid_topic, "topic", "from the owner");
              }};
    });
  };
  auto read = [](caf::scoped_actor& self, const caf::actor& link) {
    self->send(link, troupe::atoms::st_read_atom::value, std::string{"t"}, int64_t{0},
               int64_t{10});
  };
  auto answer = [](caf::scoped_actor& self) {
    caf::error out = caf::sec::request_timeout;
    self->receive([&](caf::error& e) { out = std::move(e); },
                  [&](std::vector<troupe::event_record>&) { out = caf::sec::unexpected_response; },
                  caf::after(10s) >> [] {});
    return out;
  };
  auto self_ptr = std::make_unique<caf::scoped_actor>(sys);
  auto& self = *self_ptr;

  SECTION("the owner's actor ends (its node killed, its connection broken)") {
    auto owner = fake();
    auto gone = std::make_shared<std::atomic<bool>>(false);
    auto link = troupe::spawn_storage_link(sys, {owner, "main", "far", {}, gone});
    // the owner's own errors pass unchanged
    caf::error metrics_err;
    self->request(link, 10s, troupe::atoms::st_metrics_atom::value)
        .receive([](troupe::storage_metrics&) {}, [&](caf::error& e) { metrics_err = e; });
    CHECK(static_cast<errc>(metrics_err.code()) == errc::invalid_topic);
    read(self, link);
    read(self, link);
    caf::anon_send_exit(owner, caf::exit_reason::kill);
    for (int i = 0; i < 2; ++i) {
      auto e = answer(self);
      CHECK(is_unavailable(e));
      CHECK(troupe::field_of(e) == "storage");
    }
    CHECK(gone->load());
    read(self, link); // and later calls, at once
    CHECK(is_unavailable(answer(self)));
    caf::anon_send_exit(link, caf::exit_reason::user_shutdown);
  }

  SECTION("the owner's node is reported down while its actor still looks alive (a partition)") {
    auto owner = fake();
    auto link = troupe::spawn_storage_link(sys, {owner, "main", "far", {}, nullptr});
    read(self, link);
    troupe::cluster_event other{1, 0, troupe::cluster_event_kind::member_down, "elsewhere", "", 1};
    caf::anon_send(link, other); // another node: no effect
    troupe::cluster_event down{2, 0, troupe::cluster_event_kind::member_down, "far",
                               "no heartbeat for 1000 ms", 1};
    caf::anon_send(link, down);
    auto e = answer(self);
    CHECK(is_unavailable(e));
    CHECK(troupe::render(e).find("no heartbeat") != std::string::npos);
    caf::anon_send_exit(owner, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(link, caf::exit_reason::user_shutdown);
  }
  self_ptr.reset();
  rt.stop();
}

#ifdef TROUPE_NODE
TEST_CASE("kill -9 of the node that shares the storage: the other nodes' calls answer "
          "storage_unavailable, none hangs") {
  troupe_test::temp_dir dir;
  std::filesystem::create_directories(dir.path);
  auto b = make_node(node_config("kb"), dir.file("unused.sqlite"));
  auto json_cfg = R"({"threads": 2, "stop_timeout_ms": 2000, "storage": ")" +
                  dir.file("owner.sqlite") +
                  R"(", "cluster": {"node": "kowner", "share_storage": "main", "seeds": ["127.0.0.1:)" +
                  std::to_string(b.cluster_port()) +
                  R"("], "heartbeat_ms": 50, "failure_timeout_ms": 1000, "insecure": true}})";
  troupe_test::child_process owner{{TROUPE_NODE, "--json", json_cfg}};
  REQUIRE_FALSE(owner.read_line_after("troupe-node kowner listening on ", 10s).empty());
  REQUIRE(b.await_member("kowner", member_status::up, 10s));
  // a third node, in this process, uses it
  auto c = make_node(using_storage("kc", "main", {address_of(b)}), dir.file("c.sqlite"));
  REQUIRE(c.await_member("kowner", member_status::up, 10s));
  auto append = [&c] {
    return c.run([](context& cx) -> task<caf::expected<troupe::event_receipt>> {
      co_return co_await troupe::event_append(cx, "t", {{"n", 1}});
    });
  };
  auto ok = append();
  REQUIRE(ok);
  INFO(owner.output());
  REQUIRE(*ok);
  auto sub_ptr = std::make_unique<caf::scoped_actor>(c.system());
  auto& sub = *sub_ptr;
  CHECK(must(c.run([who = caf::actor_cast<caf::actor>(sub)](context& cx) -> task<caf::expected<bool>> {
    co_return co_await troupe::event_subscribe(cx, "t", 1, who);
  })));
  owner.kill_now();
  bool ended = false;
  sub->receive(
      [&](troupe::atoms::st_ended_atom, const std::string&, const caf::error& why) {
        ended = is_unavailable(why);
      },
      caf::after(10s) >> [] {});
  CHECK(ended);
  auto after = append();
  REQUIRE(after);
  REQUIRE_FALSE(*after);
  INFO(troupe::render(after->error()));
  CHECK(is_unavailable(after->error()));
  sub_ptr.reset();
  c.stop();
  b.stop();
}
#endif

// -- channels and mailboxes by cluster name ---------------------------------------------------

namespace {

template <class T>
bool fails(const caf::expected<T>& x, errc e) {
  return !x && troupe::is(x.error(), e);
}

/// Two plain nodes: `second` joins `first` and sees it up.
std::pair<troupe::runtime, troupe::runtime> two_nodes(const troupe_test::temp_dir& dir,
                                                      const std::string& first,
                                                      const std::string& second) {
  auto a = make_node(node_config(first), dir.file(first + ".sqlite"));
  auto b = make_node(node_config(second, {address_of(a)}), dir.file(second + ".sqlite"));
  REQUIRE(b.await_member(first, member_status::up, 10s));
  return {std::move(a), std::move(b)};
}

} // namespace

TEST_CASE("a channel shared by cluster name: FIFO sends with backpressure, receives, close and "
          "bad values from another node") {
  troupe_test::temp_dir dir;
  auto nodes = two_nodes(dir, "qa", "qb");
  auto& a = nodes.first;
  auto& b = nodes.second;
  CHECK(must(a.run([](context& cx) -> task<caf::expected<bool>> {
    auto ch = co_await troupe::open_channel<json>(cx, "jobs", 2);
    if (!ch) co_return ch.error();
    co_return co_await troupe::share_channel(cx, *ch, "jobs");
  })));
  auto local = [&a](auto body) { return a.run(std::move(body)); };

  CHECK(must(b.run([](context& cx) -> task<caf::expected<bool>> {
    auto rc = co_await troupe::open_remote_channel<int>(cx, "jobs");
    if (!rc) co_return rc.error();
    CHECK(rc->node() == "qa");
    CHECK_FALSE(rc->is_mailbox());
    if (auto r = co_await rc->send(cx, 1); !r) co_return r.error();
    if (auto r = co_await rc->send(cx, 2); !r) co_return r.error();
    // full: a third send waits (here until its deadline), and its cancelled wait leaves
    // nothing behind on the owner
    auto third = co_await cx.deadline(300ms, [rc = *rc](context& c) -> task<caf::expected<void>> {
      co_return co_await rc.send(c, 3);
    });
    CHECK(fails(third, errc::deadline_exceeded));
    auto m = co_await rc->metrics(cx);
    if (!m) co_return m.error();
    CHECK(m->depth == 2);
    CHECK(m->waiting_senders == 0);
    auto v1 = co_await rc->receive(cx);
    auto v2 = co_await rc->receive(cx);
    CHECK((v1 && *v1 == 1));
    CHECK((v2 && *v2 == 2));
    auto none = co_await rc->try_receive(cx);
    CHECK((none && !*none));
    co_return true;
  })));
  // an empty channel: a receive waits on the owner (whose deadlock detector, 100 ms, does
  // not count a wait another node will end) until the receiver's own deadline
  CHECK(must(a.run([](context& cx) -> task<caf::expected<bool>> {
    auto ch = co_await troupe::open_channel<json>(cx, "idle", 1);
    if (!ch) co_return ch.error();
    co_return co_await troupe::share_channel(cx, *ch, "idle");
  })));
  CHECK(must(b.run([](context& cx) -> task<caf::expected<bool>> {
    auto rc = co_await troupe::open_remote_channel<int>(cx, "idle");
    if (!rc) co_return rc.error();
    auto waited = co_await cx.deadline(400ms, [rc = *rc](context& c) -> task<caf::expected<int>> {
      co_return co_await rc.receive(c);
    });
    CHECK(fails(waited, errc::deadline_exceeded));
    co_return true;
  })));
  // what the owner sends locally, another node receives; a value that does not convert
  // to the receiver's type is `wrong_type` naming `value`
  (void)must(local([](context& cx) -> task<caf::expected<bool>> {
    auto ch = co_await troupe::open_channel<json>(cx, "jobs", 2);
    if (!ch) co_return ch.error();
    if (auto r = co_await ch->send(cx, json{{"id", 7}}); !r) co_return r.error();
    if (auto r = co_await ch->send(cx, json("text")); !r) co_return r.error();
    co_return true;
  }));
  CHECK(must(b.run([](context& cx) -> task<caf::expected<bool>> {
    auto any = co_await troupe::open_remote_channel(cx, "jobs");
    auto typed = co_await troupe::open_remote_channel<int>(cx, "jobs");
    if (!any || !typed) co_return make_error(errc::not_found, "jobs", "not opened");
    auto first = co_await any->receive(cx);
    if (!first) co_return first.error();
    CHECK(*first == json{{"id", 7}});
    auto bad = co_await typed->receive(cx);
    CHECK(fails(bad, errc::wrong_type));
    CHECK((!bad && troupe::field_of(bad.error()) == "value"));
    // close from afar: sends fail, receives fail once drained
    auto closed = co_await typed->close(cx);
    CHECK((closed && *closed));
    CHECK(fails(co_await typed->send(cx, 4), errc::channel_closed));
    CHECK(fails(co_await typed->receive(cx), errc::channel_closed));
    // names nobody shares
    CHECK(fails(co_await troupe::open_remote_channel(cx, "nobody"), errc::unknown_name));
    CHECK(fails(co_await troupe::open_remote_mailbox(cx, "jobs"), errc::unknown_name));
    co_return true;
  })));
  CHECK(must(local([](context& cx) -> task<caf::expected<bool>> {
    auto ch = co_await troupe::open_channel<json>(cx, "jobs", 2);
    if (!ch) co_return ch.error();
    co_return fails(co_await ch->send(cx, json(1)), errc::channel_closed);
  })));
  b.stop();
  a.stop();
}

TEST_CASE("a mailbox shared by cluster name: JSON mail crosses, typed mail stays, a pending "
          "receive answers node_down when the owner goes") {
  troupe_test::temp_dir dir;
  auto nodes = two_nodes(dir, "ma", "mb");
  auto& a = nodes.first;
  auto& b = nodes.second;
  auto spec = [] {
    troupe::mailbox_spec s;
    s.name = "inbox";
    s.capacity = 8;
    return s;
  };
  CHECK(must(a.run([&](context& cx) -> task<caf::expected<bool>> {
    auto mb = co_await troupe::open_mailbox(cx, spec());
    if (!mb) co_return mb.error();
    auto shared = co_await troupe::share_mailbox(cx, *mb, "inbox");
    if (!shared) co_return shared.error();
    (void)co_await troupe::mailbox_send(cx, *mb, json{{"hello", "world"}});
    (void)co_await troupe::mailbox_send(cx, *mb, 5); // a typed C++ value: local only
    co_return true;
  })));
  CHECK(must(b.run([](context& cx) -> task<caf::expected<bool>> {
    auto mb = co_await troupe::open_remote_mailbox(cx, "inbox");
    if (!mb) co_return mb.error();
    CHECK(mb->is_mailbox());
    auto first = co_await mb->receive(cx);
    CHECK((first && *first == json{{"hello", "world"}}));
    CHECK(fails(co_await mb->receive(cx), errc::wrong_type)); // the typed mail stays
    if (auto r = co_await mb->send(cx, json{{"from", "mb"}}); !r) co_return r.error();
    co_return true;
  })));
  CHECK(must(a.run([&](context& cx) -> task<caf::expected<bool>> {
    auto mb = co_await troupe::open_mailbox(cx, spec());
    if (!mb) co_return mb.error();
    auto typed = co_await troupe::mailbox_receive_as<int>(cx, *mb);
    CHECK((typed && *typed == 5));
    auto from_b = co_await troupe::mailbox_receive(cx, *mb);
    CHECK((from_b && from_b->json() && *from_b->json() == json{{"from", "mb"}}));
    co_return true;
  })));
  // a receive parked on the owner when the owner goes
  std::promise<caf::expected<caf::expected<json>>> outcome;
  std::thread receiver{[&] {
    outcome.set_value(b.run([](context& cx) -> task<caf::expected<json>> {
      auto mb = co_await troupe::open_remote_mailbox(cx, "inbox");
      if (!mb) co_return mb.error();
      co_return co_await mb->receive(cx);
    }));
  }};
  bool parked = false;
  for (int i = 0; i < 2000 && !parked; ++i) // until the owner sees the receive waiting
    parked = must(a.run([&](context& cx) -> task<caf::expected<bool>> {
      auto mb = co_await troupe::open_mailbox(cx, spec());
      if (!mb) co_return mb.error();
      auto m = co_await mb->metrics(cx);
      if (!m) co_return m.error();
      if (m->waiting_receivers == 0) co_await cx.sleep(1ms);
      co_return m->waiting_receivers > 0;
    }));
  REQUIRE(parked);
  a.stop();
  auto fut = outcome.get_future();
  REQUIRE(fut.wait_for(10s) == std::future_status::ready);
  receiver.join();
  auto r = fut.get();
  REQUIRE(r);
  INFO((*r ? std::string{"a value"} : troupe::render(r->error())));
  CHECK(fails(*r, errc::node_down));
  b.stop();
}

TEST_CASE("channels by cluster name on a runtime that is not a cluster node: cluster_unavailable") {
  auto rt = troupe::runtime::builder{}.virtual_time().build();
  REQUIRE(rt);
  auto r = rt->run([](context& cx) -> task<bool> {
    auto ch = co_await troupe::open_channel<json>(cx, "x", 1);
    REQUIRE(ch);
    CHECK(fails(co_await troupe::share_channel(cx, *ch, "x"), errc::cluster_unavailable));
    CHECK(fails(co_await troupe::open_remote_channel(cx, "x"), errc::cluster_unavailable));
    co_return true;
  });
  CHECK((r && *r));
  rt->stop();
}
