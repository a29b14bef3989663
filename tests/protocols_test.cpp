// Every protocol payload that a remote node could need round-trips through CAF's binary
// serializer, alone and inside a message (by its registered name); local-only payloads are
// marked so; payloads from another node are checked as they load.

#include <concepts>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include <troupe/messages/abort.hpp>
#include <troupe/messages/cancel.hpp>
#include <troupe/messages/cluster.hpp>
#include <troupe/messages/directory.hpp>
#include <troupe/messages/durable.hpp>
#include <troupe/messages/lanes.hpp>
#include <troupe/messages/errc.hpp>
#include <troupe/messages/messaging.hpp>
#include <troupe/messages/outcome.hpp>
#include <troupe/messages/pool.hpp>
#include <troupe/messages/storage.hpp>
#include <troupe/messages/supervision.hpp>
#include <troupe/messages/types.hpp>
#include <troupe/supervision/spec.hpp>

using namespace troupe;

namespace {

struct protocol_system_config : caf::actor_system_config {
  protocol_system_config() {
    troupe::add_message_types(*this);
  }
};

caf::actor_system* current_system = nullptr;

/// An actor system with troupe's types registered, for one test (serialising a message
/// needs its type registry).
struct system_fixture {
  protocol_system_config cfg;
  caf::actor_system system{cfg};
  system_fixture() {
    current_system = &system;
  }
  ~system_fixture() {
    current_system = nullptr;
  }
};

caf::actor_system& sys() {
  return *current_system;
}

template <class T>
std::vector<char> save(const T& x) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys(), buf};
  auto err = sink(const_cast<T&>(x));
  REQUIRE(!err);
  return buf;
}

template <class T>
caf::error load(const std::vector<char>& buf, T& out) {
  caf::binary_deserializer source{sys(), buf};
  return source(out);
}

/// Returns `xs` serialised one after another: a payload as another node might send it.
template <class... Ts>
std::vector<char> save_fields(Ts... xs) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys(), buf};
  auto err = sink(xs...);
  REQUIRE(!err);
  return buf;
}

/// Checks `x` alone and inside a message: what arrives renders exactly as what left.
template <class T>
void round_trip(const T& x) {
  auto before = caf::deep_to_string(x);
  T y{};
  REQUIRE(!load(save(x), y));
  CHECK(caf::deep_to_string(y) == before);
  if constexpr (std::equality_comparable<T>)
    CHECK(y == x); // field by field: a field the inspector forgot arrives default
  auto msg = caf::make_message(x);
  caf::message back;
  REQUIRE(!load(save(msg), back));
  REQUIRE(back.match_elements<T>());
  CHECK(caf::deep_to_string(back.get_as<T>(0)) == before);
}

channel_event sample_event() {
  channel_event e;
  e.receipt = channel_receipt{7, "tenant:acme:orders", true,
                              emitted_at{1700000000000, "tenant", "acme", "1.2", "c2lnbmF0dXJl"}};
  e.id = "o-1";
  e.payload = R"({"sku":"a","qty":2})";
  return e;
}

/// A sample of every registered type, by its registered name.
std::map<std::string, std::function<void()>> samples() {
  std::map<std::string, std::function<void()>> s;
  s["troupe.abort_reason"] = [] { round_trip(abort_reason{"lane_red", "unit tests red", 42}); };
  s["troupe.abort_state"] = [] { round_trip(abort_state{true, {"x", "y", 1}}); };
  s["troupe.cancel_mode"] = [] {
    round_trip(troupe::cancel_mode::graceful(1'500'000));
    round_trip(troupe::cancel_mode::graceful(troupe::cancel_mode::unbounded));
    round_trip(troupe::cancel_mode::force());
    round_trip(troupe::cancel_mode::join());
    round_trip(troupe::cancel_mode::wait());
  };
  s["troupe.remote_outcome"] = [] {
    round_trip(remote_outcome{caf::make_message(std::string{"done"}), {}});
    round_trip(remote_outcome{{}, make_error(errc::task_failed, "body", "3 tests failed")});
  };
  s["std::vector<caf.error>"] = [] {
    std::vector<caf::error> causes{make_error(errc::task_failed, "a", "boom"), caf::error{}};
    std::vector<caf::error> back;
    REQUIRE(!load(save(causes), back));
    CHECK(back == causes);
  };
  s["troupe.json"] = [] {
    round_trip(nlohmann::json::parse(R"({"a":[1,2.5,"x",null,true],"b":{"c":"é"}})"));
    round_trip(nlohmann::json{});
  };
  s["troupe.scope_kind"] = [] { round_trip(scope_kind::tenant); };
  s["troupe.queue_metrics"] = [] {
    round_trip(queue_metrics{"jobs", 3, 8, 10, 7, 1, false, 2, 0});
  };
  s["troupe.shared_metrics"] = [] { round_trip(shared_metrics{1, 2, 3, 4, 5, 6}); };
  s["troupe.versioned"] = [] { round_trip(versioned{nlohmann::json{{"n", 3}}, 9, true}); };
  s["troupe.sync_kind"] = [] { round_trip(sync_kind::semaphore); };
  s["troupe.sync_metrics"] = [] {
    round_trip(sync_metrics{sync_kind::gate, "g", 1, 2, 3, 4, 5, 6, 7, 1.5, 2.5});
  };
  s["troupe.lane_kind"] = [] { round_trip(lane_kind::concurrent); };
  s["troupe.lane_decl"] = [] { round_trip(lane_decl::concurrent("export", 4)); };
  s["troupe.lane_metrics"] = [] {
    round_trip(lane_metrics{"export", lane_kind::concurrent, 4, 2, 5, 4, 17, 3, 12.5});
  };
  s["troupe.value_batch"] = [] {
    value_batch b;
    b.add(10, caf::make_message(int32_t{1}));
    b.add(11, caf::make_message(std::string{"two"}));
    b.add(15, caf::make_message(nlohmann::json{{"three", 3}})); // a gap: seqs listed
    round_trip(b);
  };
  s["troupe.primitive_kind"] = [] { round_trip(primitive_kind::atomic); };
  s["troupe.supervisor_event_kind"] = [] { round_trip(supervisor_event_kind::half_open); };
  s["troupe.child_kind"] = [] { round_trip(child_kind::supervisor); };
  s["troupe.child_status"] = [] { round_trip(child_status::circuit_open); };
  auto child = [] {
    return child_state{"db", child_status::waiting, 3, "boom", 250, "backoff", {},
                       child_kind::worker};
  };
  s["troupe.child_state"] = [child] { round_trip(child()); };
  s["std::vector<troupe.child_state>"] = [child] {
    round_trip(std::vector<child_state>{child(), child()});
  };
  s["troupe.child_counts"] = [] { round_trip(child_counts{4, 3, 1, 3}); };
  s["troupe.supervisor_metrics"] = [] {
    round_trip(supervisor_metrics{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  };
  s["troupe.supervisor_status"] = [] { round_trip(supervisor_status::stopping); };
  s["troupe.supervisor_state"] = [child] {
    round_trip(supervisor_state{"app", supervisor_status::running, "", {child()}});
  };
  s["troupe.supervisor_event"] = [] { round_trip(supervisor_event{5, supervisor_event_kind::restarted, "db", "", 2}); };
  s["std::vector<troupe.supervisor_event>"] = [] {
    round_trip(std::vector<supervisor_event>{{5, supervisor_event_kind::failed, "db", "boom", 1},
                                             {6, supervisor_event_kind::restarted, "db", "", 2}});
  };
  s["troupe.runtime_service"] = [] { round_trip(runtime_service::channel_hub); };
  s["troupe.event_receipt"] = [] { round_trip(event_receipt{3, 1700}); };
  s["std::vector<troupe.event_receipt>"] = [] {
    round_trip(std::vector<event_receipt>{{3, 1700}, {4, 1701}});
  };
  s["troupe.event_record"] = [] { round_trip(event_record{3, "orders", 1700, R"({"a":1})"}); };
  s["std::vector<troupe.event_record>"] = [] {
    round_trip(std::vector<event_record>{{3, "orders", 1700, "{}"}});
  };
  s["troupe.payload_batch"] = [] {
    payload_batch b;
    b.push_back(R"({"a":1})");
    b.push_back("");
    b.push_back(R"([1,2])");
    payload_batch y;
    REQUIRE(!load(save(b), y));
    REQUIRE(y.size() == 3);
    CHECK(y[0] == R"({"a":1})");
    CHECK(y[1].empty());
    CHECK(y[2] == "[1,2]");
    auto msg = caf::make_message(b);
    caf::message back;
    REQUIRE(!load(save(msg), back));
    REQUIRE(back.match_elements<payload_batch>());
    CHECK(back.get_as<payload_batch>(0)[2] == "[1,2]");
  };
  s["troupe.storage_metrics"] = [] { round_trip(storage_metrics{1, 2, 3, 4, 2}); };
  s["troupe.emitted_at"] = [] { round_trip(sample_event().receipt.emitted_at); };
  s["troupe.channel_receipt"] = [] { round_trip(sample_event().receipt); };
  s["troupe.channel_event"] = [] { round_trip(sample_event()); };
  s["std::vector<troupe.channel_event>"] = [] {
    round_trip(std::vector<channel_event>{sample_event(), sample_event()});
  };
  s["troupe.channel_write"] = [] {
    channel_write w;
    w.name_resolved = "tenant:acme:orders";
    w.scope = "tenant";
    w.scope_id = "acme";
    w.id = "o-1";
    w.payload = "{}";
    w.emitted_by = "1.2";
    round_trip(w);
  };
  s["troupe.channel_binding"] = [] {
    channel_binding b;
    b.selector = "channel:orders*";
    b.scope = "tenant";
    b.scope_id = "acme";
    b.pattern = "orders";
    b.prefix = true;
    b.count = 3;
    b.window_ms = 500;
    b.key = "customer";
    round_trip(b);
  };
  s["troupe.channel_match"] = [] {
    round_trip(channel_match{9, 2, "ann", "count", 1700, {sample_event()}});
  };
  s["troupe.channel_metrics"] = [] { round_trip(channel_metrics{1, 2, 3, 4, 5, 6, 7, 8, 9}); };
  s["troupe.rate_bucket"] = [] { round_trip(rate_bucket{"api", 10, 2, 1000}); };
  s["std::vector<troupe.rate_bucket>"] = [] {
    round_trip(std::vector<rate_bucket>{{"api", 10, 2, 1000}, {"db", 5, 1, 60000}});
  };
  s["troupe.rate_attempt"] = [] { round_trip(rate_attempt{false, 250}); };
  s["troupe.pool_queue_kind"] = [] { round_trip(pool_queue_kind::fair_round_robin); };
  s["troupe.pool_backpressure_kind"] = [] { round_trip(pool_backpressure_kind::ring_buffer); };
  s["troupe.pool_on_full"] = [] { round_trip(pool_on_full::drop_newest); };
  s["troupe.pool_scope"] = [] { round_trip(pool_scope::pipeline); };
  s["troupe.pool_audit"] = [] { round_trip(pool_audit::receipts); };
  s["troupe.pool_task_status"] = [] { round_trip(pool_task_status::rejected); };
  s["troupe.pool_queue_spec"] = [] {
    round_trip(pool_queue_spec{pool_queue_kind::fair_round_robin, "tenant"});
  };
  s["troupe.pool_backpressure_spec"] = [] {
    round_trip(pool_backpressure_spec{pool_backpressure_kind::queue, 64,
                                      pool_on_full::fail_submitter, 0});
  };
  s["troupe.pool_spec"] = [] {
    round_trip(pool_spec{"jobs", 4, pool_scope::pipeline,
                         {pool_queue_kind::lifo, ""},
                         {pool_backpressure_kind::ring_buffer, 0, pool_on_full::block_submitter, 9},
                         500, pool_audit::receipts, {1, 6, pool_restart::temporary},
                         {{"b", "c"}, true}});
  };
  s["troupe.pool_task_snapshot"] = [] {
    pool_task_snapshot x;
    x.id = 7;
    x.status = pool_task_status::failed;
    x.submitted_at_ms = 1700;
    x.priority = -3;
    x.key = "acme";
    x.idempotency_key = "order-9";
    x.error = make_error(errc::pool_task_stale, "task", "process died");
    x.rejection_reason = "none";
    x.rejection_policy = "drop_oldest";
    x.stale = true;
    x.result_json = nlohmann::json{{"n", 1}};
    round_trip(x);
  };
  s["troupe.pool_restart"] = [] { round_trip(pool_restart::temporary); };
  s["troupe.runner_lifecycle"] = [] { round_trip(runner_lifecycle::draining); };
  s["troupe.pool_runners_spec"] = [] { round_trip(pool_runners_spec{1, 8, pool_restart::transient}); };
  s["troupe.pool_remote_spec"] = [] { round_trip(pool_remote_spec{{"b", "c"}, true}); };
  s["troupe.runner_slot_state"] = [] {
    round_trip(runner_slot_state{3, 2, runner_lifecycle::busy, 1});
  };
  s["troupe.runner_state"] = [] {
    round_trip(runner_state{"r", 2, 3, 4, 1, {{0, 1, runner_lifecycle::stopped, 0},
                                             {3, 2, runner_lifecycle::idle, 2}}});
  };
  s["troupe.pool_row"] = [] {
    round_trip(pool_row{7, pool_task_status::completed, "{}", false, {}});
    pool_task_snapshot snap; // a save that leaves the encoding to the storage actor
    snap.id = 8;
    snap.status = pool_task_status::completed;
    snap.idempotency_key = "k-8";
    snap.result_json = nlohmann::json{{"n", 3}};
    round_trip(pool_row{8, pool_task_status::completed, "", true, snap});
  };
  s["std::vector<troupe.pool_row>"] = [] {
    round_trip(std::vector<pool_row>{{1, pool_task_status::queued, "{\"id\":1}", false, {}},
                                     {2, {}, "", false, {}}});
  };
  s["troupe.pool_snapshot"] = [] {
    pool_snapshot x;
    x.name = "jobs";
    x.id = "00ff";
    x.max_concurrent = 2;
    x.active = 2;
    x.queued = 5;
    x.completed = 10;
    x.failed = 1;
    x.rejected = 3;
    x.cancelled = 1;
    x.total = 22;
    x.max_depth_seen = 8;
    x.blocked_submitters = 1;
    x.worker_restarts = 1;
    x.wait_p50_us = 5;
    x.wait_p99_us = 50;
    x.run_p50_us = 7;
    x.run_p99_us = 70;
    x.drops = {{"drop_oldest", 3}};
    x.closed = true;
    round_trip(x);
  };
  // clusters
  s["troupe.member_status"] = [] { round_trip(member_status::left); };
  s["troupe.member_info"] = [] { round_trip(member_info{"b", "127.0.0.1", 4001, 77}); };
  s["troupe.member_state"] = [] {
    round_trip(member_state{{"c", "10.0.0.3", 4002, 9}, member_status::down, false, 1000, 1200,
                            "no heartbeat for 1500 ms"});
  };
  s["troupe.cluster_event_kind"] = [] { round_trip(cluster_event_kind::name_lost); };
  s["troupe.cluster_event"] = [] {
    round_trip(cluster_event{7, 1234, cluster_event_kind::member_left, "b", "left"});
  };
  s["troupe.global_name"] = [] { round_trip(global_name{"svc", caf::actor{}, "a", 3}); };
  s["troupe.join_reply"] = [] {
    round_trip(join_reply{{"a", "h", 1, 2}, {{"b", "h", 3, 4}}, {{"x", caf::actor{}, "a", 1}}});
  };
  s["std::vector<troupe.member_info>"] = [] {
    round_trip(std::vector<member_info>{{"a", "h", 1, 2}, {"b", "h", 3, 4}});
  };
  s["std::vector<troupe.member_state>"] = [] {
    round_trip(std::vector<member_state>{{{"a", "h", 1, 2}, member_status::up, true, 5, 6, ""}});
  };
  s["std::vector<troupe.cluster_event>"] = [] {
    round_trip(std::vector<cluster_event>{{1, 2, cluster_event_kind::member_up, "b", ""}});
  };
  s["std::vector<troupe.global_name>"] = [] {
    round_trip(std::vector<global_name>{{"svc", caf::actor{}, "a", 3}});
  };
  return s;
}

} // namespace

TEST_CASE_METHOD(system_fixture, "every payload a remote node could need round-trips through the binary serializer") {
  auto all = samples();
  auto& names = remote_type_names();
  CHECK(names.size() == all.size());
  for (auto& name : names) {
    INFO("type " << name);
    auto i = all.find(name);
    REQUIRE(i != all.end()); // every registered type has a sample here
    i->second();
  }
  // ... and every sample is of a registered type
  for (auto& kvp : all)
    CHECK(std::find(names.begin(), names.end(), kvp.first) != names.end());
}

TEST_CASE_METHOD(system_fixture, "local-only payloads are marked and kept out of the remote registry") {
  STATIC_REQUIRE(is_local_only_v<outcome_box>);
  STATIC_REQUIRE(is_local_only_v<primitive_spec>);
  STATIC_REQUIRE(is_local_only_v<child_spec>);
  STATIC_REQUIRE(is_local_only_v<pool_submission>);
  STATIC_REQUIRE(is_local_only_v<pool_assignment>);
  STATIC_REQUIRE(is_local_only_v<pool_result_box>);
  STATIC_REQUIRE_FALSE(is_local_only_v<remote_outcome>);
  STATIC_REQUIRE_FALSE(is_local_only_v<value_batch>);
  for (auto& name : remote_type_names()) {
    CHECK(name != "troupe.outcome_box");
    CHECK(name != "troupe.primitive_spec");
    CHECK(name != "troupe.child_spec");
  }
}

TEST_CASE_METHOD(system_fixture, "a task outcome converts to its remote form and back") {
  outcome_box box{std::make_shared<int>(42), {}};
  auto remote = to_remote_outcome<int>(box);
  remote_outcome arrived;
  REQUIRE(!load(save(remote), arrived));
  auto local = from_remote_outcome<int>(arrived);
  REQUIRE(!local.err);
  CHECK(*static_cast<int*>(local.value.get()) == 42);
  // the wrong type: an error, never a bad cast
  auto wrong = from_remote_outcome<std::string>(arrived);
  CHECK(wrong.err == caf::sec::unexpected_response);
  CHECK(wrong.value == nullptr);
  // an error travels as itself, with its troupe code and field
  outcome_box failed{nullptr, make_error(errc::task_failed, "body", "3 tests failed")};
  auto back = from_remote_outcome<int>(to_remote_outcome<int>(failed));
  CHECK(troupe::is(back.err, errc::task_failed));
  CHECK(field_of(back.err) == "body");
  // an aggregate error travels with its causes (errors_of)
  auto all = make_error(errc::all_failed, "race", "every branch failed",
                        {make_error(errc::task_failed, "0", "a"), make_error(errc::cancelled)});
  auto agg = from_remote_outcome<int>(to_remote_outcome<int>(outcome_box{nullptr, all}));
  remote_outcome agg_arrived;
  REQUIRE(!load(save(to_remote_outcome<int>(outcome_box{nullptr, all})), agg_arrived));
  auto causes = errors_of(from_remote_outcome<int>(agg_arrived).err);
  REQUIRE(causes.size() == 2);
  CHECK(troupe::is(causes[0], errc::task_failed));
  CHECK(field_of(causes[0]) == "0");
  CHECK(troupe::is(causes[1], errc::cancelled));
  CHECK(troupe::is(agg.err, errc::all_failed));
  // void: no value either way
  auto v = from_remote_outcome<void>(to_remote_outcome<void>(outcome_box{}));
  CHECK(!v.err);
}

TEST_CASE_METHOD(system_fixture, "a payload from another node is checked as it loads") {
  SECTION("a JSON value whose text is not JSON is invalid_payload") {
    nlohmann::json x;
    auto err = load(save_fields(std::string{"{not json"}), x);
    CHECK(troupe::is(err, errc::invalid_payload));
  }
  SECTION("a JSON value nested deeper than 512 levels is invalid_payload, never a stack overflow") {
    nlohmann::json x;
    auto nested = [](size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); };
    CHECK(troupe::is(load(save_fields(nested(100'000)), x), errc::invalid_payload));
    CHECK(!load(save_fields(nested(512)), x)); // 512 levels are fine
  }
  SECTION("a payload batch whose ends run past its text is refused, not read out of bounds") {
    payload_batch b;
    CHECK(load(save_fields(std::string{"ab"}, std::vector<uint64_t>{1, 5}), b) ==
          caf::sec::invalid_argument);
  }
  SECTION("a payload batch whose ends run backwards is refused") {
    payload_batch b;
    CHECK(load(save_fields(std::string{"abcd"}, std::vector<uint64_t>{3, 1}), b) ==
          caf::sec::invalid_argument);
  }
  SECTION("a value batch whose sequence numbers do not match its values is refused") {
    value_batch b;
    CHECK(load(save_fields(uint64_t{1}, std::vector<uint64_t>{1, 2, 3},
                           std::vector<caf::message>{caf::make_message(int32_t{1})}),
               b) == caf::sec::invalid_argument);
  }
}

TEST_CASE("a cancel_mode not built by the factories is normalized") {
  using troupe::cancel_mode;
  CHECK(cancel_mode{cancel_mode::kind::graceful, -5}.normalized() == cancel_mode::graceful(0));
  CHECK(cancel_mode{static_cast<cancel_mode::kind>(9), 7}.normalized() == cancel_mode::force());
  CHECK(cancel_mode::graceful(3).normalized() == cancel_mode::graceful(3));
  CHECK(cancel_mode::wait().normalized() == cancel_mode::wait());
}
