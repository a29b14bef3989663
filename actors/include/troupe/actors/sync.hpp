#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/context.hpp"
#include "troupe/messages/messaging.hpp"

namespace troupe {

/// The right to be inside a mutex, rwlock, semaphore or gate: released when it is destroyed
/// (its scope exits normally, by an exception or by a cancellation) or by `release()`. An
/// empty permit is what a timed-out acquire yields.
class permit {
 public:
  permit() = default;
  permit(caf::actor owner, uint64_t id) noexcept : owner_(std::move(owner)), id_(id) {}
  permit(permit&& other) noexcept
      : owner_(std::move(other.owner_)), id_(std::exchange(other.id_, 0)) {}
  permit& operator=(permit&& other) noexcept {
    if (this != &other) {
      release();
      owner_ = std::move(other.owner_);
      id_ = std::exchange(other.id_, 0);
    }
    return *this;
  }
  permit(const permit&) = delete;
  permit& operator=(const permit&) = delete;
  ~permit() { release(); }

  /// Returns whether this permit holds something (false after a timeout or a release).
  [[nodiscard]] explicit operator bool() const noexcept { return id_ != 0; }
  [[nodiscard]] bool held() const noexcept { return id_ != 0; }

  /// Releases now; returns true the first time, false afterwards (idempotent).
  bool release() noexcept;

 private:
  caf::actor owner_;
  uint64_t id_ = 0;
};

/// Options of an acquire.
struct acquire_options {
  /// Give up after this long on the runtime clock: the acquire yields an empty permit (not
  /// an error). Zero: only if free now.
  std::optional<clock::duration> timeout;
};

/// How an rwlock is taken.
enum class rw_mode : uint8_t { read, write };

namespace detail {

class acquire_awaiter : public parked_awaiter {
 public:
  acquire_awaiter(task_actor* self, caf::actor a, int64_t units, int64_t timeout_ns, caf::error pre)
      : parked_awaiter(self), a_(std::move(a)), units_(units), timeout_ns_(timeout_ns),
        err_(std::move(pre)) {}
  bool await_ready() noexcept { return check_cancelled() || static_cast<bool>(err_); }
  void await_suspend(std::coroutine_handle<> h);
  void on_abandon(task_actor* self) noexcept override;
  caf::expected<permit> await_resume() {
    rethrow_if_cancelled();
    if (err_) return std::move(err_);
    return permit{a_, id_};
  }

 private:
  caf::actor a_;
  int64_t units_;
  int64_t timeout_ns_;
  caf::error err_;
  uint64_t seq_ = 0;
  uint64_t id_ = 0;
};

} // namespace detail

/// A handle to one synchronisation primitive (an actor): FIFO, cancellable waits.
class sync_ref {
 public:
  sync_ref() = default;
  sync_ref(caf::actor a, sync_kind kind, std::string key, int64_t capacity)
      : a_(std::move(a)), kind_(kind), key_(std::move(key)), capacity_(capacity) {}
  [[nodiscard]] const caf::actor& actor() const noexcept { return a_; }
  [[nodiscard]] sync_kind kind() const noexcept { return kind_; }
  [[nodiscard]] const std::string& key() const noexcept { return key_; }
  [[nodiscard]] int64_t capacity() const noexcept { return capacity_; }

  /// Waits for `units` permits (a mutex, a gate and an rwlock reader take 1; an rwlock writer
  /// takes them all). `co_await` yields `caf::expected<permit>`: an empty permit on timeout;
  /// `permits_exceed_capacity`, `reentrant_acquire` (a mutex the task holds). A cancelled
  /// task leaves the queue (its `co_await` throws `task_cancelled`).
  [[nodiscard]] detail::acquire_awaiter acquire(context& cx, int64_t units = 1,
                                                acquire_options opts = {}) const;

  /// `acquire` for an rwlock: shared for `read`, exclusive for `write`.
  [[nodiscard]] detail::acquire_awaiter acquire(context& cx, rw_mode mode,
                                                acquire_options opts = {}) const;

 private:
  caf::actor a_;
  sync_kind kind_ = sync_kind::mutex;
  std::string key_;
  int64_t capacity_ = 1;
};

/// Opens the mutex `key` (one holder, not reentrant).
[[nodiscard]] task<caf::expected<sync_ref>> open_mutex(context& cx, std::string key);
/// Opens the rwlock `key` (many readers or one writer; FIFO, so a waiting writer holds back
/// later readers).
[[nodiscard]] task<caf::expected<sync_ref>> open_rwlock(context& cx, std::string key);
/// Opens the semaphore `key` with `capacity` permits (weighted acquires).
[[nodiscard]] task<caf::expected<sync_ref>> open_semaphore(context& cx, std::string key, int64_t capacity);
/// Opens the gate `key` admitting `limit` holders at once, in arrival order.
[[nodiscard]] task<caf::expected<sync_ref>> open_gate(context& cx, std::string key, int64_t limit);

/// Acquires the mutex `key`; yields `caf::expected<permit>`.
[[nodiscard]] task<caf::expected<permit>> lock(context& cx, std::string key, acquire_options opts = {});
/// Acquires the rwlock `key` for reading or writing.
[[nodiscard]] task<caf::expected<permit>> lock_rw(context& cx, std::string key, rw_mode mode,
                                   acquire_options opts = {});
/// Acquires `permits` of the semaphore `key` with `capacity` permits.
[[nodiscard]] task<caf::expected<permit>> acquire_semaphore(context& cx, std::string key, int64_t capacity,
                                      int64_t permits = 1, acquire_options opts = {});
/// Enters the gate `key` admitting `limit` at once.
[[nodiscard]] task<caf::expected<permit>> acquire_gate(context& cx, std::string key, int64_t limit,
                                 acquire_options opts = {});

// -- former names (one release): they read as types, but they acquire ------------------------

[[deprecated("renamed lock")]] inline auto mutex(context& cx, std::string key,
                                                 acquire_options opts = {}) {
  return lock(cx, std::move(key), opts);
}
[[deprecated("renamed lock_rw")]] inline auto rwlock(context& cx, std::string key, rw_mode mode,
                                                     acquire_options opts = {}) {
  return lock_rw(cx, std::move(key), mode, opts);
}
[[deprecated("renamed acquire_semaphore")]] inline auto
semaphore(context& cx, std::string key, int64_t capacity, int64_t permits = 1,
          acquire_options opts = {}) {
  return acquire_semaphore(cx, std::move(key), capacity, permits, opts);
}
[[deprecated("renamed acquire_gate")]] inline auto gate(context& cx, std::string key,
                                                        int64_t limit,
                                                        acquire_options opts = {}) {
  return acquire_gate(cx, std::move(key), limit, opts);
}

/// Yields the counters of every synchronisation primitive, or only those of `kind` and/or
/// `key`.
task<caf::expected<std::vector<sync_metrics>>>
sync_metrics_of(context& cx, std::optional<sync_kind> kind = std::nullopt,
                std::optional<std::string> key = std::nullopt);

} // namespace troupe
