#pragma once

#include <cstdint>
#include <limits>
#include <string_view>

#include <caf/meta/type_name.hpp>

namespace troupe {

/// How a cancel asks a task to stop: the payload of `(cancel_atom, cancel_mode)` and of a
/// remote run's `(rs_cancel_atom, key, cancel_mode)`.
struct cancel_mode {
  enum class kind : uint8_t {
    /// Ask: the body sees the cancel at its next await; the task forces the stop after
    /// `grace_ns` (never by itself when the grace is `unbounded`: whoever asked forces it).
    graceful,
    /// Stop now.
    force,
    /// The owner releases the task: stop it if it runs, discard its result, answer once it
    /// and its children are gone.
    join,
    /// Do not stop the task: answer once it has ended by itself, then release it as `join`
    /// does (a scope that joins on return waits for its children so).
    wait,
  };

  /// A graceful cancel without a force timer (a supervisor's shutdown: it kills).
  static constexpr int64_t unbounded = std::numeric_limits<int64_t>::max();

  kind how = kind::force;
  /// `graceful`: nanoseconds before the stop is forced (>= 0), or `unbounded`; `join`: the
  /// same grace before the join forces (0: at once; never `unbounded`, normalized to 0).
  int64_t grace_ns = 0;

  [[nodiscard]] static constexpr cancel_mode graceful(int64_t ns) noexcept {
    return {kind::graceful, ns < 0 ? 0 : ns};
  }
  [[nodiscard]] static constexpr cancel_mode force() noexcept { return {kind::force, 0}; }
  [[nodiscard]] static constexpr cancel_mode join() noexcept { return {kind::join, 0}; }
  /// `join` with a grace: the task is asked to stop (a graceful cancel of `ns`, forced
  /// after it), and the answer comes once it has ended. An owner under a graceful cancel
  /// joins its children so: they keep the grace it got.
  [[nodiscard]] static constexpr cancel_mode join(int64_t ns) noexcept {
    return {kind::join, ns < 0 || ns == unbounded ? 0 : ns};
  }
  [[nodiscard]] static constexpr cancel_mode wait() noexcept { return {kind::wait, 0}; }

  /// Returns this mode made safe when it was not built by the factories above (it came
  /// from another node): a negative grace is no grace, an unknown kind is `force`.
  [[nodiscard]] constexpr cancel_mode normalized() const noexcept {
    if (how > kind::wait) return force();
    if (how == kind::graceful && grace_ns < 0) return graceful(0);
    if (how == kind::join) return join(grace_ns);
    return *this;
  }

  [[nodiscard]] constexpr bool is_graceful() const noexcept { return how == kind::graceful; }
  /// Returns whether the grace period is bounded (a graceful cancel the task forces itself).
  [[nodiscard]] constexpr bool is_bounded_grace() const noexcept {
    return how == kind::graceful && grace_ns != unbounded;
  }
  /// Returns whether the owner releases the task with this cancel (`join` or `wait`).
  [[nodiscard]] constexpr bool releases() const noexcept {
    return how == kind::join || how == kind::wait;
  }

  friend constexpr bool operator==(const cancel_mode&, const cancel_mode&) noexcept = default;
};

/// Returns the kind's name ("graceful", "force", "join", "wait").
[[nodiscard]] constexpr std::string_view to_string(cancel_mode::kind k) noexcept {
  switch (k) {
    case cancel_mode::kind::graceful:
      return "graceful";
    case cancel_mode::kind::force:
      return "force";
    case cancel_mode::kind::join:
      return "join";
    case cancel_mode::kind::wait:
      return "wait";
  }
  return "?";
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cancel_mode& x) {
  return f(caf::meta::type_name("troupe.cancel_mode"), x.how, x.grace_ns);
}

} // namespace troupe
