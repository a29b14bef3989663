#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/messages/interfaces.hpp"
#include "troupe/messages/messaging.hpp"

namespace troupe {

/// Names a shared cell, map or atomic: scope, tenant (tenant scope) and name, as for
/// mailboxes (`mailbox_address`).
struct shared_spec {
  std::string scope = "process";
  std::string tenant_id;
  std::string name;
  /// The value a new cell, map or atomic starts with, set atomically with the creation:
  /// the first opener's wins, later openers see the current value. A map's must be a JSON
  /// object, an atomic's an integer (else `invalid_argument`, field `initial`).
  std::optional<nlohmann::json> initial;
};

/// A shared JSON value (an actor): last write wins, and every write gets a new version, so
/// a compare-and-set against a snapshot detects a stale read. Open it with
/// `open_cell`. Every operation is awaited and yields a `caf::expected`.
class shared_cell {
 public:
  shared_cell() = default;
  explicit shared_cell(caf::actor a) : a_(std::move(a)) {}
  [[nodiscard]] const caf::actor& actor() const noexcept { return a_; }

  /// Yields the value (null when never set).
  [[nodiscard]] task<caf::expected<nlohmann::json>> get(context& cx) const;
  /// Sets the value; yields the previous one (null when none).
  [[nodiscard]] task<caf::expected<nlohmann::json>> set(context& cx, nlohmann::json value) const;
  /// Yields the value with its version (0 when never set).
  [[nodiscard]] auto snapshot(context& cx) const {
    return cx.request<versioned>(typed(), atoms::sh_get_atom::value, std::string{});
  }
  /// Sets `value` if the cell holds `expected` (null: never set); yields whether it did.
  [[nodiscard]] auto cas(context& cx, nlohmann::json expected, nlohmann::json value) const {
    return cx.request<bool>(typed(), atoms::sh_cas_atom::value, std::string{}, std::move(expected),
                            uint64_t{0}, false, std::move(value));
  }
  /// Sets `value` if nothing was written since `snap` was read (its version still holds);
  /// yields whether it did. A failure counts as a stale read.
  [[nodiscard]] auto cas(context& cx, const versioned& snap, nlohmann::json value) const {
    return cx.request<bool>(typed(), atoms::sh_cas_atom::value, std::string{}, snap.value, snap.version,
                            true, std::move(value));
  }
  /// Yields the counters (`shared_metrics`).
  [[nodiscard]] auto metrics(context& cx) const {
    return cx.request<shared_metrics>(typed(), atoms::sh_metrics_atom::value);
  }

 private:
  /// The actor through its interface (requests checked at compile time).
  [[nodiscard]] shared_actor_type typed() const { return caf::actor_cast<shared_actor_type>(a_); }

  caf::actor a_;
};

/// A shared map of JSON values with per-key versions (see `shared_cell`).
class shared_map {
 public:
  shared_map() = default;
  explicit shared_map(caf::actor a) : a_(std::move(a)) {}
  [[nodiscard]] const caf::actor& actor() const noexcept { return a_; }

  /// Yields the value under `key` (null when absent).
  [[nodiscard]] task<caf::expected<nlohmann::json>> get(context& cx, std::string key) const;
  /// Sets `key`; yields the previous value (null when absent).
  [[nodiscard]] task<caf::expected<nlohmann::json>> set(context& cx, std::string key,
                                                        nlohmann::json value) const;
  /// Deletes `key`; yields whether it existed.
  [[nodiscard]] auto del(context& cx, std::string key) const {
    return cx.request<bool>(typed(), atoms::sh_del_atom::value, std::move(key));
  }
  /// Yields every entry as a JSON object.
  [[nodiscard]] auto entries(context& cx) const {
    return cx.request<nlohmann::json>(typed(), atoms::sh_entries_atom::value);
  }
  /// Yields the value under `key` with its version (0 when absent).
  [[nodiscard]] auto snapshot(context& cx, std::string key) const {
    return cx.request<versioned>(typed(), atoms::sh_get_atom::value, std::move(key));
  }
  /// Sets `key` to `value` if it holds `expected` (null: absent); yields whether it did.
  [[nodiscard]] auto cas(context& cx, std::string key, nlohmann::json expected,
                         nlohmann::json value) const {
    return cx.request<bool>(typed(), atoms::sh_cas_atom::value, std::move(key), std::move(expected),
                            uint64_t{0}, false, std::move(value));
  }
  /// Sets `key` to `value` if it was not written since `snap`; yields whether it did.
  [[nodiscard]] auto cas(context& cx, std::string key, const versioned& snap,
                         nlohmann::json value) const {
    return cx.request<bool>(typed(), atoms::sh_cas_atom::value, std::move(key), snap.value, snap.version,
                            true, std::move(value));
  }
  [[nodiscard]] auto metrics(context& cx) const {
    return cx.request<shared_metrics>(typed(), atoms::sh_metrics_atom::value);
  }

 private:
  /// The actor through its interface (requests checked at compile time).
  [[nodiscard]] shared_actor_type typed() const { return caf::actor_cast<shared_actor_type>(a_); }

  caf::actor a_;
};

/// A shared integer counter: every operation yields the previous value.
class atomic_counter {
 public:
  atomic_counter() = default;
  explicit atomic_counter(caf::actor a) : a_(std::move(a)) {}
  [[nodiscard]] const caf::actor& actor() const noexcept { return a_; }

  /// Yields the value (0 when never set).
  [[nodiscard]] task<caf::expected<int64_t>> get(context& cx) const;
  /// Adds `delta`; yields the previous value.
  [[nodiscard]] auto add(context& cx, int64_t delta) const {
    return cx.request<int64_t>(typed(), atoms::sh_add_atom::value, std::string{}, delta);
  }
  /// Sets the value; yields the previous one.
  [[nodiscard]] task<caf::expected<int64_t>> set(context& cx, int64_t value) const;
  /// Sets the value to `desired` if it is `expected` (never set counts as 0); yields whether
  /// it did. Counted in the metrics' `cas_successes` / `cas_failures`.
  [[nodiscard]] auto cas(context& cx, int64_t expected, int64_t desired) const {
    return cx.request<bool>(typed(), atoms::sh_cas_int_atom::value, std::string{}, expected, desired);
  }
  [[nodiscard]] auto metrics(context& cx) const {
    return cx.request<shared_metrics>(typed(), atoms::sh_metrics_atom::value);
  }

 private:
  /// The actor through its interface (requests checked at compile time).
  [[nodiscard]] shared_actor_type typed() const { return caf::actor_cast<shared_actor_type>(a_); }

  caf::actor a_;
};

/// Opens (finds or creates) a shared cell; `invalid_scope` / `invalid_name` for a bad spec.
[[nodiscard]] task<caf::expected<shared_cell>> open_cell(context& cx, shared_spec spec);
/// Opens (finds or creates) a shared map.
[[nodiscard]] task<caf::expected<shared_map>> open_map(context& cx, shared_spec spec);
/// Opens (finds or creates) an atomic counter.
[[nodiscard]] task<caf::expected<atomic_counter>> open_atomic(context& cx, shared_spec spec);

// -- former names (one release) -------------------------------------------------------------

[[deprecated("renamed open_cell")]] inline auto shared_cell_open(context& cx, shared_spec spec) {
  return open_cell(cx, std::move(spec));
}
[[deprecated("renamed open_map")]] inline auto shared_map_open(context& cx, shared_spec spec) {
  return open_map(cx, std::move(spec));
}
[[deprecated("renamed open_atomic")]] inline auto atomic_open(context& cx, shared_spec spec) {
  return open_atomic(cx, std::move(spec));
}

} // namespace troupe
