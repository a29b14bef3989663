// instrument_service: a resident service reading an instrument. The serial link drops
// (environmental faults: back off, spend credit), a long healthy run refills the credit,
// and finally the instrument answers garbage (an application fault: deactivate at once).
// Virtual time: an exact timeline, instantly.
#include <cstdio>
#include <memory>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;

int main() {
  auto rt = troupe::runtime::builder{}.virtual_time().build();
  if (!rt) return 1;
  auto attempt_no = std::make_shared<int>(0);
  troupe::service_policy policy;
  policy.credit = 2;
  policy.sustained_health = 5000ms;
  policy.backoff_base = 250ms;
  auto& clk = rt->clock();
  auto result = rt->run([&](troupe::context& cx) -> troupe::task<troupe::service_status> {
    co_return co_await troupe::run_service(
        cx,
        [attempt_no](troupe::service_context& sc) -> troupe::task<troupe::service_outcome> {
          auto n = ++*attempt_no;
          switch (n) {
            case 1:
            case 2: // the link drops twice quickly
              (void)co_await sc.rest(100ms);
              co_return troupe::service_outcome::environmental_fault("serial link dropped");
            case 3: // then reads fine for a minute before dropping again: credit refilled
              (void)co_await sc.rest(60s);
              co_return troupe::service_outcome::environmental_fault("serial link dropped");
            default: // the instrument answers garbage: our parser cannot go on
              (void)co_await sc.rest(1s);
              co_return troupe::service_outcome::application_fault("checksum mismatch in frame 7");
          }
        },
        policy,
        [&clk](const troupe::service_status& s) {
          std::printf("  %7.3fs  %-12s credit=%d %s\n", double(clk.now_ms()) / 1000,
                      troupe::to_string(s.state), s.credit, s.cause.c_str());
        });
  });
  if (!result) return 1;
  std::printf("\nfinal: %s (%s)\nfault history:\n", troupe::to_string(result->state),
              result->cause.c_str());
  for (auto& h : result->history)
    std::printf("  - %s\n", h.c_str());
  rt->stop();
  return result->state == troupe::service_status::inactive ? 0 : 1;
}
