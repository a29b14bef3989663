#pragma once

// The vocabulary of structured concurrency: options and outcome types of the combinators
// that `troupe::context` offers (scope, parallel, parallel_each, as_stream, parallel_settle,
// parallel_race, settle_with_abort, deadline, retry).

#include <cstdint>
#include <functional>
#include <optional>
#include <type_traits>
#include <vector>

#include <caf/actor.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "troupe/actors/task.hpp"
#include "troupe/messages/abort.hpp"
#include "troupe/messages/clock.hpp"
#include "troupe/messages/errc.hpp"

namespace troupe {

class context;

/// What a scope does with the children still running when its body returns.
enum class scope_exit : uint8_t {
  /// Cancel them and join them (the default: the body's exit ends the scope).
  cancel,
  /// Wait for them to finish by themselves (a nursery); a failure among them still fails
  /// the scope and cancels the others.
  join,
};

/// Options of `context::scope`.
struct scope_options {
  scope_exit on_return = scope_exit::cancel;
};

/// Options of `parallel`, `parallel_each`, `as_stream`, `parallel_settle`, `parallel_race`.
struct parallel_options {
  /// Branches running at once; 0 or negative = unlimited; more than the items = all.
  int64_t max_concurrent = 0;
};

/// What `parallel_settle` returns: every branch's value or error, in index order.
/// A branch that *returns* an error as a value (say, a `caf::expected` holding one) has
/// succeeded: it produced a value. Only a thrown failure (or a cancellation) fails a branch.
template <class R>
struct settle_result {
  std::vector<caf::expected<R>> results;
  size_t succeeded = 0;
  size_t failed = 0;
};

/// The winner of `parallel_race`.
template <class R>
struct race_winner {
  size_t index = 0;
  R value;
};

/// One result of `as_stream`, in completion order.
template <class R>
struct indexed {
  size_t index = 0;
  R value;
};

/// A first-writer-wins abort flag shared by branches (an actor; copies share it).
struct abort_token {
  caf::actor actor;
  [[nodiscard]] bool valid() const noexcept { return static_cast<bool>(actor); }
};

/// Options of `settle_with_abort`.
struct abort_options {
  /// Branches running at once; 0 or negative = unlimited.
  int64_t max_concurrent = 0;
  /// Trip the token once this many branches have failed; must be >= 1 when set.
  std::optional<int64_t> max_failures;
  /// Called for each failure (error, index); a returned reason trips the token.
  std::function<std::optional<abort_reason>(const caf::error&, size_t)> abort_on;
};

namespace detail {

template <class T>
struct is_expected : std::false_type {};
template <class T>
struct is_expected<caf::expected<T>> : std::true_type {};

/// The result type of a branch returning `R`: `expected<U>` stays `expected<U>` (its error
/// is a failure), anything else `R` becomes `expected<R>`.
template <class R>
struct flat_expected {
  using type = caf::expected<R>;
};
template <class U>
struct flat_expected<caf::expected<U>> {
  using type = caf::expected<U>;
};

} // namespace detail

/// What `settle_with_abort` returns.
template <class R>
struct abort_outcome {
  /// Each branch's value or error in index order; a branch returning `expected<U>` is
  /// flattened, so its error is a failure. Abandoned branches hold an `abandoned` error.
  std::vector<typename detail::flat_expected<R>::type> results;
  size_t succeeded = 0;
  size_t failed = 0;
  size_t abandoned = 0;
  bool aborted = false;
  std::optional<abort_reason> reason;
  std::vector<size_t> abandoned_indexes;
};

/// Returns the first failure, in index order, that is not an abandonment; nothing when no
/// branch failed on its own.
template <class R>
std::optional<caf::error> decisive_error(const abort_outcome<R>& x) {
  for (auto& r : x.results)
    if (!r && !is(r.error(), errc::abandoned)) return r.error();
  return std::nullopt;
}

/// Options of `retry`.
struct retry_options {
  /// Pause between attempts, on the runtime clock.
  clock::duration delay{0};
};

} // namespace troupe
