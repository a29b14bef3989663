#pragma once

// Helpers shared by the test suites.

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

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

/// A fresh directory under the system's temp dir, removed at scope exit.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    static int n = 0;
    path = std::filesystem::temp_directory_path() /
           ("troupe-test-" + std::to_string(::getpid()) + "-" + std::to_string(++n));
    std::filesystem::remove_all(path);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

/// Returns a runtime on virtual time whose database is `db`.
inline troupe::runtime make_rt(const std::string& db) {
  auto rt = troupe::runtime::builder{}.virtual_time().storage(db).build();
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

/// Returns the value or throws when there is none (a stream that ended).
template <class T>
T must(std::optional<T> x) {
  if (!x) throw std::runtime_error("no value");
  return std::move(*x);
}

/// Returns whether `x` failed with `e` (false, not undefined behaviour, when it succeeded).
template <class T>
bool fails_with(const caf::expected<T>& x, troupe::errc e) {
  return !x && troupe::is(x.error(), e);
}

/// Returns the field `x` failed on, or "<succeeded>".
template <class T>
std::string field_if_failed(const caf::expected<T>& x) {
  return x ? std::string{"<succeeded>"} : troupe::field_of(x.error());
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

/// Waits `after`, cancels `h` gracefully (1 s of grace) and awaits it: its value, or its
/// error rendered. (`h` by reference: the caller's handle outlives this sub-routine.)
inline troupe::task<std::string> graceful_cancel_and_await(troupe::context& cx,
                                                          troupe::task_handle<std::string>& h,
                                                          std::chrono::milliseconds after) {
  co_await cx.sleep(after);
  (void)co_await cx.cancel_graceful(h, std::chrono::seconds{1});
  auto r = co_await cx.await(h);
  co_return r ? *r : troupe::render(r.error());
}

} // namespace troupe_test
