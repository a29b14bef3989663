#pragma once

// Helpers shared by the test suites.

#include <memory>
#include <stdexcept>

#include <catch2/catch.hpp>

#include <troupe/troupe.hpp>

namespace troupe_test {

/// Returns a runtime on virtual time (deterministic scheduler, virtual clock).
inline troupe::runtime make_virtual_rt() {
  auto rt = troupe::runtime::builder{}.virtual_time().build();
  REQUIRE(rt);
  return std::move(*rt);
}

/// Returns a runtime on real time with two scheduler threads (stress tests).
inline troupe::runtime make_real_rt() {
  auto rt = troupe::runtime::builder{}.threads(2).build();
  REQUIRE(rt);
  return std::move(*rt);
}

/// Returns the value or throws: Catch's assertions are not thread-safe, so bodies that run
/// on several threads fail their task instead.
template <class T>
T must(caf::expected<T> x) {
  if (!x) throw std::runtime_error(troupe::render(x.error()));
  return std::move(*x);
}

inline void must(caf::expected<void> x) {
  if (!x) throw std::runtime_error(troupe::render(x.error()));
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
