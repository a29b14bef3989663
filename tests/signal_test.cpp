// Real OS signals sent to a child process running the demo as a service (`--serve`): the
// stop choreography runs in order and the process exits 0 within its grace; a second
// signal while stopping ends it at once.

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "child_process.hpp"

#ifdef TROUPE_DEMO // the demo is built with the examples

namespace {

using troupe_test::child_process;

/// Returns whether `xs` appear in `text` in this order.
bool in_order(const std::string& text, const std::vector<std::string>& xs) {
  size_t at = 0;
  for (auto& x : xs) {
    auto i = text.find(x, at);
    if (i == std::string::npos) return false;
    at = i + x.size();
  }
  return true;
}

} // namespace

TEST_CASE("SIGTERM stops the demo's tree in order and the process exits 0 within its grace") {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    child_process demo{{TROUPE_DEMO, "--serve"}};
    REQUIRE(demo.read_until("ready", std::chrono::seconds{20}));
    auto t0 = std::chrono::steady_clock::now();
    demo.signal(sig);
    REQUIRE(demo.read_to_end(std::chrono::seconds{20}));
    auto status = demo.wait();
    auto took = std::chrono::steady_clock::now() - t0;
    INFO(demo.output());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(took < std::chrono::seconds{10}); // the stop timeout is 5 s; nothing overran
    // Services in reverse start order (the nested ingest tree too), then the participant,
    // then the remaining steps.
    CHECK(in_order(demo.output(),
                   {"service cache stopped", "service mailer stopped", "service sink stopped",
                    "service parser stopped", "service reader stopped", "service http stopped",
                    "participant report: flushed", "stop choreography:",
                    "1 cancel queued jobs", "2 running attempts: finished",
                    "3 services: ", "4 participant report: finished", "5 durability: flushed",
                    "6 join", "7 closed", "interrupted: yes", "runtime stopped cleanly"}));
    CHECK(demo.output().find("notice") == std::string::npos);
  }
}

TEST_CASE("a second signal while stopping ends the process at once") {
  child_process demo{{TROUPE_DEMO, "--serve", "--slow-stop"}};
  REQUIRE(demo.read_until("ready", std::chrono::seconds{20}));
  demo.signal(SIGINT);
  // The stop reaches the slow participant (30 s): the process is stopping.
  REQUIRE(demo.read_until("participant slow: takes 30 s", std::chrono::seconds{20}));
  auto t0 = std::chrono::steady_clock::now();
  demo.signal(SIGINT);
  REQUIRE(demo.read_to_end(std::chrono::seconds{10}));
  auto status = demo.wait();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds{5});
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGINT);
  CHECK(demo.output().find("runtime stopped cleanly") == std::string::npos);
}

#endif // TROUPE_DEMO
