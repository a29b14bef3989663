#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;
using troupe::errc;

namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  auto path = std::string{"/tmp/troupe-test-"} + name;
  std::ofstream{path} << text;
  return path;
}

} // namespace

TEST_CASE("build() refuses threads = 0 and names the field") {
  auto rt = troupe::runtime::builder{}.threads(0).build();
  REQUIRE_FALSE(rt);
  CHECK(troupe::is(rt.error(), errc::config_out_of_range));
  CHECK(troupe::field_of(rt.error()) == "threads");
}

TEST_CASE("a config that is not JSON is refused with TROUPE-CFG-001") {
  auto path = write_temp("bad.json", "threads = 2\n");
  auto rt = troupe::runtime::builder{}.config_file(path).build();
  REQUIRE_FALSE(rt);
  CHECK(troupe::is(rt.error(), errc::config_not_json));
  CHECK(troupe::field_of(rt.error()) == path);
  auto text = troupe::runtime::builder{}.config_json("{\"threads\": ").build();
  REQUIRE_FALSE(text);
  CHECK(troupe::is(text.error(), errc::config_not_json));
}

TEST_CASE("a config with an unknown key is refused naming the key") {
  auto rt = troupe::runtime::builder{}.config_json(R"({"threads": 2, "treads": 4})").build();
  REQUIRE_FALSE(rt);
  CHECK(troupe::is(rt.error(), errc::config_unknown_key));
  CHECK(troupe::field_of(rt.error()) == "treads");
}

TEST_CASE("a config value of the wrong type is refused naming the key") {
  SECTION("threads as a string") {
    auto rt = troupe::runtime::builder{}.config_json(R"({"threads": "two"})").build();
    REQUIRE_FALSE(rt);
    CHECK(troupe::is(rt.error(), errc::config_wrong_type));
    CHECK(troupe::field_of(rt.error()) == "threads");
  }
  SECTION("virtual_time as a number") {
    auto rt = troupe::runtime::builder{}.config_json(R"({"virtual_time": 1})").build();
    REQUIRE_FALSE(rt);
    CHECK(troupe::is(rt.error(), errc::config_wrong_type));
    CHECK(troupe::field_of(rt.error()) == "virtual_time");
  }
  SECTION("storage_fsync as a string") {
    auto rt = troupe::runtime::builder{}.config_json(R"({"storage_fsync": "yes"})").build();
    REQUIRE_FALSE(rt);
    CHECK(troupe::is(rt.error(), errc::config_wrong_type));
    CHECK(troupe::field_of(rt.error()) == "storage_fsync");
  }
  SECTION("the document is an array") {
    auto rt = troupe::runtime::builder{}.config_json("[1, 2]").build();
    REQUIRE_FALSE(rt);
    CHECK(troupe::is(rt.error(), errc::config_wrong_type));
  }
}

TEST_CASE("a config value out of range is refused naming the key") {
  for (auto text :
       {R"({"threads": 0})", R"({"threads": -3})", R"({"threads": 100000})",
        R"({"scheduler": "round-robin"})", R"({"blocking_threads": 0})", R"({"storage": ""})",
        R"({"storage_max_batch": 0})", R"({"storage_busy_timeout_ms": -1})",
        R"({"deadlock_check_ms": -5})", R"({"session_channel_capacity": 0})"}) {
    auto res = troupe::runtime_config::from_json(text);
    REQUIRE_FALSE(res);
    CHECK(troupe::is(res.error(), errc::config_out_of_range));
    CHECK_FALSE(troupe::field_of(res.error()).empty());
  }
}

TEST_CASE("a missing config file is refused with TROUPE-CFG-005") {
  auto rt = troupe::runtime::builder{}.config_file("/nonexistent/troupe.json").build();
  REQUIRE_FALSE(rt);
  CHECK(troupe::is(rt.error(), errc::config_unreadable));
}

TEST_CASE("a config file sets the runtime and explicit builder calls override it") {
  auto path = write_temp("good.json", R"({"threads": 1, "scheduler": "stealing",
    "max_throughput": 50, "blocking_threads": 2, "storage": "/tmp/x.sqlite",
    "stop_timeout_ms": 250, "deadlock_check_ms": 0, "storage_fsync": true,
    "storage_busy_timeout_ms": 750, "storage_max_batch": 64})");
  auto cfg = troupe::runtime::builder{}.config_file(path).resolve();
  REQUIRE(cfg);
  CHECK(cfg->threads == 1);
  CHECK(cfg->policy == troupe::scheduler_policy::stealing);
  CHECK(cfg->max_throughput == 50);
  CHECK(cfg->blocking_threads == 2);
  CHECK(cfg->storage == "/tmp/x.sqlite");
  CHECK(cfg->stop_timeout == 250ms);
  CHECK(cfg->deadlock_check == 0ms);
  CHECK(cfg->storage_fsync);
  CHECK(cfg->storage_busy_timeout == 750ms);
  CHECK(cfg->storage_max_batch == 64);
  auto rt = troupe::runtime::builder{}.config_file(path).threads(2).build();
  REQUIRE(rt);
  CHECK(rt->config().threads == 2);
  CHECK(rt->config().policy == troupe::scheduler_policy::stealing);
  CHECK(rt->system().scheduler().num_workers() == 2);
}

TEST_CASE("the default runtime uses the measured scheduler defaults") {
  auto rt = troupe::runtime::builder{}.build();
  REQUIRE(rt);
  troupe::runtime_config defaults;
  CHECK(rt->config().threads == defaults.threads);
  CHECK(defaults.threads == std::max(1u, std::thread::hardware_concurrency()));
  CHECK(rt->config().policy == troupe::scheduler_policy::troupe);
  CHECK(rt->config().max_throughput == 100);
  CHECK(rt->system().scheduler().num_workers() == defaults.threads);
  CHECK(rt->config().storage == ".troupe/state.sqlite");
  CHECK(rt->virtual_time() == nullptr);
}

TEST_CASE("after stop, run and spawn answer runtime_stopped") {
  auto rt = troupe::runtime::builder{}.threads(1).build();
  REQUIRE(rt);
  rt->stop();
  CHECK(rt->stopped());
  auto r = rt->run([]() -> troupe::task<int> { co_return 1; });
  REQUIRE_FALSE(r);
  CHECK(troupe::is(r.error(), errc::runtime_stopped));
  auto h = rt->spawn([]() -> troupe::task<int> { co_return 1; });
  REQUIRE_FALSE(h);
  CHECK(troupe::is(h.error(), errc::runtime_stopped));
  rt->stop(); // idempotent
}

TEST_CASE("stop cancels the tasks the runtime owns and their cleanup runs") {
  auto cleaned = std::make_shared<std::atomic<int>>(0);
  struct guard {
    std::shared_ptr<std::atomic<int>> n;
    ~guard() { ++*n; }
  };
  auto rt = troupe::runtime::builder{}.threads(2).build();
  REQUIRE(rt);
  auto h = rt->spawn([cleaned](troupe::context& cx) -> troupe::task<int> {
    guard g{cleaned};
    // A child that sleeps too: stopping the root stops it first.
    auto child = cx.spawn([cleaned](troupe::context& c) -> troupe::task<int> {
      guard g2{cleaned};
      co_await c.sleep(1h);
      co_return 1;
    });
    co_await cx.sleep(1h);
    co_return 0;
  });
  REQUIRE(h);
  // Wait (without sleeping) until both tasks are suspended on their timers.
  auto probe = rt->run([](troupe::context& cx) -> troupe::task<void> {
    while (cx.clock().pending() < 2)
      co_await cx.yield_now();
  });
  REQUIRE(probe);
  rt->stop();
  CHECK(*cleaned == 2);
}

TEST_CASE("troupe's error category is registered with the actor system's renderer") {
  auto rt = troupe::runtime::builder{}.threads(1).build();
  REQUIRE(rt);
  auto e = troupe::make_error(errc::config_unknown_key, "treads", "unknown key");
  CHECK(rt->system().render(e) == troupe::render(e));
}

TEST_CASE("every runtime of a process has its own session id, 16 hex digits") {
  // `session:` channels resolve to it: two runtimes sharing one would share those channels.
  std::vector<std::string> ids;
  for (int i = 0; i < 64; ++i) {
    auto rt = troupe::runtime::builder{}.threads(1).build();
    REQUIRE(rt);
    ids.push_back(rt->session_id());
  }
  for (auto& id : ids) {
    CHECK(id.size() == 16);
    CHECK(id.find_first_not_of("0123456789abcdef") == std::string::npos);
  }
  std::sort(ids.begin(), ids.end());
  CHECK(std::adjacent_find(ids.begin(), ids.end()) == ids.end());
}
