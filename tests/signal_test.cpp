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

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TROUPE_TEST_TSAN 1
#endif
#endif
#ifndef TROUPE_TEST_TSAN
#define TROUPE_TEST_TSAN 0
#endif

namespace {

using troupe_test::child_process;

/// Sends `sig` and waits up to `within` for `sign` in the output (the demo's first line
/// after taking it). Under ThreadSanitizer a process signal is now and then never handed to
/// the demo's handler: TSan's runtime takes it, no byte reaches troupe's signal pipe,
/// nothing is pending, and every thread waits (seen in 2 of 25 runs of the test, at this
/// change and at the commit before it alike). There, and only there, a signal with no sign
/// of it is sent again, once, with a warning; a demo that took the first would end at once
/// on the second (128 + sig), which the test's checks then catch. `sent` is when the signal
/// the demo took was sent.
bool send_and_see(child_process& demo, int sig, const std::string& sign,
                  std::chrono::seconds within, std::chrono::steady_clock::time_point& sent) {
  sent = std::chrono::steady_clock::now();
  demo.signal(sig);
  if (demo.read_until(sign, within)) return true;
  if (!TROUPE_TEST_TSAN) return false;
  WARN("no sign of signal " << sig << " within " << within.count()
                            << " s under ThreadSanitizer: sent again");
  sent = std::chrono::steady_clock::now();
  demo.signal(sig);
  return demo.read_until(sign, within);
}

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
    std::chrono::steady_clock::time_point t0;
    REQUIRE(send_and_see(demo, sig, "stopped", std::chrono::seconds{8}, t0));
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
  // The stop reaches the slow participant (30 s): the process is stopping.
  std::chrono::steady_clock::time_point t0;
  REQUIRE(send_and_see(demo, SIGINT, "participant slow: takes 30 s", std::chrono::seconds{20},
                       t0));
  t0 = std::chrono::steady_clock::now();
  demo.signal(SIGINT);
  bool ended = demo.read_to_end(std::chrono::seconds{10});
  if (!ended && TROUPE_TEST_TSAN) { // (see send_and_see)
    WARN("the second SIGINT did not end the demo under ThreadSanitizer: sent again");
    t0 = std::chrono::steady_clock::now();
    demo.signal(SIGINT);
    ended = demo.read_to_end(std::chrono::seconds{10});
  }
  REQUIRE(ended);
  auto status = demo.wait();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds{5});
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGINT);
  CHECK(demo.output().find("runtime stopped cleanly") == std::string::npos);
}

#endif // TROUPE_DEMO
