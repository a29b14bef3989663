// release_gate: the CI-lanes story. A release fans out over eight lanes on four runners
// with settle_with_abort. One lane goes red; the lanes
// still running stop at their next poll; the lanes still queued never start. The outcome
// names the decisive error and the abandoned lanes.
//
// Runs on virtual time, so the timeline is exact and the example takes milliseconds.
#include <cstdio>
#include <string>
#include <vector>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;

namespace {

struct lane {
  std::string name;
  int steps;         // each step takes 10 ms
  int fails_at_step; // -1: the lane passes
};

} // namespace

int main() {
  auto rt = troupe::runtime::builder{}.virtual_time().build();
  if (!rt) {
    std::fprintf(stderr, "cannot start: %s\n", troupe::render(rt.error()).c_str());
    return 1;
  }
  std::vector<lane> lanes{
      {"build", 3, -1}, {"unit-tests", 8, -1}, {"integration", 12, 4}, {"lint", 2, -1},
      {"docs", 6, -1},  {"packaging", 5, -1},  {"e2e", 10, -1},        {"perf", 10, -1},
  };
  auto result = rt->run([lanes](troupe::context& cx) -> troupe::task<int> {
    troupe::abort_options opts;
    opts.max_concurrent = 4; // four runners
    opts.abort_on = [](const caf::error& e, size_t) -> std::optional<troupe::abort_reason> {
      return troupe::abort_reason{"lane_red", troupe::detail_of(e)};
    };
    std::printf("release gate: %zu lanes on 4 runners\n", lanes.size());
    auto out = co_await cx.settle_with_abort(
        lanes,
        [](troupe::context& c, const lane& l,
           troupe::abort_token gate) -> troupe::task<caf::expected<int>> {
          std::printf("  %4lld ms  %-12s starts\n", static_cast<long long>(c.clock().now_ms()),
                      l.name.c_str());
          for (int step = 0; step < l.steps; ++step) {
            try {
              co_await c.check_abort(gate); // the poll between steps
            } catch (const troupe::task_error&) {
              std::printf("  %4lld ms  %-12s stops: the gate is closed\n",
                          static_cast<long long>(c.clock().now_ms()), l.name.c_str());
              throw;
            }
            co_await c.sleep(10ms);
            if (step == l.fails_at_step) {
              std::printf("  %4lld ms  %-12s RED at step %d\n",
                          static_cast<long long>(c.clock().now_ms()), l.name.c_str(), step);
              co_return troupe::make_error(troupe::errc::task_failed, l.name,
                                           "3 integration tests failed");
            }
          }
          std::printf("  %4lld ms  %-12s green\n", static_cast<long long>(c.clock().now_ms()),
                      l.name.c_str());
          co_return l.steps;
        },
        opts);
    if (!out) {
      std::printf("gate error: %s\n", troupe::render(out.error()).c_str());
      co_return 2;
    }
    std::printf("\noutcome: %zu green, %zu red, %zu abandoned; aborted: %s\n", out->succeeded,
                out->failed, out->abandoned,
                out->aborted && out->reason
                    ? (out->reason->code + " at " + std::to_string(out->reason->at_ms) + " ms (" +
                       out->reason->message + ")")
                          .c_str()
                    : "no");
    std::string abandoned;
    for (auto i : out->abandoned_indexes)
      abandoned += (abandoned.empty() ? "" : ", ") + lanes[i].name;
    std::printf("abandoned lanes: %s\n", abandoned.empty() ? "none" : abandoned.c_str());
    for (size_t i = 0; i < out->results.size(); ++i) {
      auto& r = out->results[i];
      std::printf("  %-12s %s\n", lanes[i].name.c_str(),
                  r ? "green" : troupe::render(r.error()).c_str());
    }
    if (auto decisive = troupe::decisive_error(*out)) {
      std::printf("decisive error: %s\n", troupe::render(*decisive).c_str());
      co_return 1;
    }
    std::printf("release approved\n");
    co_return 0;
  });
  rt->stop();
  return result ? (*result == 1 ? 0 : *result) : 1; // a red gate is the expected story
}
