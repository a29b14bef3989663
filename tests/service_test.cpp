// Resident services (run_service, in troupe::actors): backoff on environmental faults, credit,
// deactivation on application faults, refills, and a stop that wakes them.

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <troupe/troupe.hpp>

#include "test_support.hpp"

using namespace std::chrono_literals;
using troupe_test::make_virtual_rt;

namespace {

struct status_log {
  std::vector<std::string> states;
  std::vector<int64_t> at_ms;
};

auto recorder(std::shared_ptr<status_log> log, troupe::clock& clk) {
  return [log, &clk](const troupe::service_status& s) {
    log->states.push_back(std::string{troupe::to_string(s.state)} + ":" + std::to_string(s.credit));
    log->at_ms.push_back(clk.now_ms());
  };
}

} // namespace

TEST_CASE("a service backs off on environmental faults, spends its credit, then deactivates") {
  auto rt = make_virtual_rt();
  auto log = std::make_shared<status_log>();
  troupe::service_policy policy;
  policy.credit = 3;
  auto v = rt.run([&](troupe::context& cx) -> troupe::task<troupe::service_status> {
    co_return co_await troupe::run_service(
        cx,
        [](troupe::service_context&) -> troupe::task<troupe::service_outcome> {
          co_return troupe::service_outcome::environmental_fault("connection refused");
        },
        policy, recorder(log, rt.clock()));
  });
  REQUIRE(v);
  CHECK(v->state == troupe::service_status::inactive);
  CHECK(v->cause == "credit exhausted: connection refused");
  CHECK(v->history.size() == 4);
  CHECK(log->states == std::vector<std::string>{"starting:3", "running:3", "backing_off:2",
                                                "running:2", "backing_off:1", "running:1",
                                                "backing_off:0", "running:0", "inactive:0"});
  // Backoff 100, 200, 400 ms on the runtime clock.
  CHECK(log->at_ms == std::vector<int64_t>{0, 0, 0, 100, 100, 300, 300, 700, 700});
}

TEST_CASE("an application fault or an uncaught exception deactivates a service at once") {
  auto rt = make_virtual_rt();
  auto attempts = std::make_shared<int>(0);
  auto app = rt.run([attempts](troupe::context& cx) -> troupe::task<troupe::service_status> {
    co_return co_await troupe::run_service(
        cx,
        [attempts](troupe::service_context&) -> troupe::task<troupe::service_outcome> {
          ++*attempts;
          co_return troupe::service_outcome::application_fault("bad config");
        },
        {}, nullptr);
  });
  REQUIRE(app);
  CHECK(app->state == troupe::service_status::inactive);
  CHECK(app->cause == "application fault: bad config");
  CHECK(*attempts == 1);
  auto thrown = rt.run([](troupe::context& cx) -> troupe::task<troupe::service_status> {
    co_return co_await troupe::run_service(
        cx,
        [](troupe::service_context&) -> troupe::task<troupe::service_outcome> {
          throw std::logic_error("null pointer");
          co_return troupe::service_outcome::done();
        },
        {}, nullptr);
  });
  REQUIRE(thrown);
  CHECK(thrown->state == troupe::service_status::inactive);
  CHECK(thrown->cause.find("null pointer") != std::string::npos);
}

TEST_CASE("sustained health refills a service's credit") {
  auto rt = make_virtual_rt();
  auto attempts = std::make_shared<int>(0);
  troupe::service_policy policy;
  policy.credit = 1;
  policy.sustained_health = std::chrono::milliseconds{1000};
  auto v = rt.run([&](troupe::context& cx) -> troupe::task<troupe::service_status> {
    co_return co_await troupe::run_service(
        cx,
        [attempts](troupe::service_context& sc) -> troupe::task<troupe::service_outcome> {
          if (++*attempts == 6) co_return troupe::service_outcome::done();
          (void)co_await sc.rest(std::chrono::seconds(2)); // healthy for 2 s, then the fault
          co_return troupe::service_outcome::environmental_fault("peer reset");
        },
        policy, nullptr);
  });
  REQUIRE(v);
  CHECK(v->state == troupe::service_status::stopped); // 5 faults with a credit of 1: refilled
  CHECK(v->history.size() == 5);
}

TEST_CASE("stopping a service wakes rest and until_stopping; it ends stopped") {
  auto rt = make_virtual_rt();
  auto v = rt.run([](troupe::context& cx) -> troupe::task<std::string> {
    auto resting = cx.spawn([](troupe::context& c) -> troupe::task<troupe::service_status> {
      co_return co_await troupe::run_service(
          c,
          [](troupe::service_context& sc) -> troupe::task<troupe::service_outcome> {
            bool woke = co_await sc.rest(std::chrono::hours(1));
            co_return woke ? troupe::service_outcome::done()
                           : troupe::service_outcome::environmental_fault("?");
          },
          {}, nullptr);
    });
    auto waiting = cx.spawn([](troupe::context& c) -> troupe::task<troupe::service_status> {
      co_return co_await troupe::run_service(
          c,
          [](troupe::service_context& sc) -> troupe::task<troupe::service_outcome> {
            auto slow = [](troupe::context& k) -> troupe::task<int> {
              co_await k.sleep(std::chrono::hours(1));
              co_return 1;
            };
            auto r = co_await sc.until_stopping(slow(sc.task()));
            co_return r ? troupe::service_outcome::environmental_fault("?")
                        : troupe::service_outcome::done();
          },
          {}, nullptr);
    });
    co_await cx.sleep(std::chrono::milliseconds(10));
    (void)co_await cx.cancel_graceful(resting, std::chrono::seconds(1));
    (void)co_await cx.cancel_graceful(waiting, std::chrono::seconds(1));
    auto a = co_await cx.await(resting);
    auto b = co_await cx.await(waiting);
    co_return std::string{a ? troupe::to_string(a->state) : "?"} + "|" +
        (b ? troupe::to_string(b->state) : "?") + "|" + std::to_string(cx.clock().now_ms());
  });
  REQUIRE(v);
  CHECK(*v == "stopped|stopped|10");
}

TEST_CASE("a service's backoff is capped without overflowing") {
  auto rt = make_virtual_rt();
  auto log = std::make_shared<status_log>();
  troupe::service_policy policy;
  policy.credit = 40;
  policy.backoff_base = std::chrono::milliseconds{10'000};
  policy.backoff_cap = std::chrono::milliseconds{20'000};
  auto v = rt.run([&](troupe::context& cx) -> troupe::task<troupe::service_status> {
    co_return co_await troupe::run_service(
        cx,
        [](troupe::service_context&) -> troupe::task<troupe::service_outcome> {
          co_return troupe::service_outcome::environmental_fault("down");
        },
        policy, recorder(log, rt.clock()));
  });
  REQUIRE(v);
  CHECK(v->state == troupe::service_status::inactive);
  // 40 backoffs: 10 s, then 20 s each (never negative, never zero).
  CHECK(log->at_ms.back() == 10'000 + 39 * 20'000);
}
