#pragma once

// Helpers shared by the test suites.

#include <memory>

#include <catch2/catch.hpp>

#include <troupe/troupe.hpp>

namespace troupe_test {

/// Returns a runtime on virtual time (deterministic scheduler, virtual clock).
inline troupe::runtime make_virtual_rt() {
  auto rt = troupe::runtime::builder{}.virtual_time().build();
  REQUIRE(rt);
  return std::move(*rt);
}

/// Counts destructions: proves that a cancelled body's RAII cleanup ran.
struct guard {
  std::shared_ptr<int> n;
  ~guard() { ++*n; }
};

/// Returns the runtime clock's milliseconds as seen from a task.
inline int64_t ms(troupe::context& cx) {
  return cx.clock().now_ms();
}

} // namespace troupe_test
