#pragma once

// Remote work on a cluster: closures cannot cross a node, so a body another node may run is
// registered by name on every node (`builder::body(name, f)`), and its arguments and result
// travel as serialisable values. Three ways to use one:
//
// - `spawn_on<T>(cx, node, body, args...)`: run it on that node and await its outcome;
// - `remote_child(body, args, placement)`: a supervisor's child that runs on another node
//   and is restarted on a surviving one when its node goes down;
// - `submit_remote<T>(cx, pool, body, args...)`: a pool job that runs on the pool's nodes
//   (`pool_spec::remote`).
//
// Every value that crosses (arguments, results) must be a CAF built-in type or registered
// on every node (`builder::message_type<T>(name)`). See docs/cluster.md.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <caf/deep_to_string.hpp>
#include <caf/expected.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>

#include "troupe/actors/context.hpp"
#include "troupe/actors/pool.hpp"
#include "troupe/actors/task.hpp"
#include "troupe/messages/errc.hpp"
#include "troupe/messages/outcome.hpp"
#include "troupe/messages/remote.hpp"
#include "troupe/messages/supervision.hpp"

namespace troupe {

/// Where remote work may run: the members named in `nodes`, in order of preference (a
/// remote child starts on the first one that is up; a cluster pool takes them round robin),
/// or, when `nodes` is empty, every member that is up (this node included), round robin.
struct placement {
  std::vector<std::string> nodes;
};

namespace detail {

/// A registered body with its types erased: runs with the arguments in a message and
/// yields its outcome in the form that crosses nodes (the value in a message, or the error).
/// A body that throws propagates the exception to the caller of the returned task.
using remote_body_fn = std::function<task<remote_outcome>(context&, caf::message)>;

/// The bodies a runtime may run for other nodes, by name. Filled before the runtime
/// starts (`builder::body`), read-only after: no lock.
class body_registry {
 public:
  void add(std::string name, remote_body_fn f) { bodies_[std::move(name)] = std::move(f); }
  [[nodiscard]] const remote_body_fn* find(const std::string& name) const {
    auto i = bodies_.find(name);
    return i == bodies_.end() ? nullptr : &i->second;
  }
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (auto& kvp : bodies_)
      out.push_back(kvp.first);
    return out;
  }
  [[nodiscard]] bool empty() const noexcept { return bodies_.empty(); }

 private:
  std::map<std::string, remote_body_fn> bodies_;
};

/// The argument types of a body `task<R>(context&, A...)` (a lambda without `auto`
/// parameters, a function object or a function pointer).
template <class F>
struct remote_signature : remote_signature<decltype(&F::operator())> {};
template <class C, class R, class... A>
struct remote_signature<R (C::*)(context&, A...) const> {
  using result = R;
  using args = std::tuple<std::decay_t<A>...>;
};
template <class C, class R, class... A>
struct remote_signature<R (C::*)(context&, A...)> {
  using result = R;
  using args = std::tuple<std::decay_t<A>...>;
};
template <class R, class... A>
struct remote_signature<R (*)(context&, A...)> {
  using result = R;
  using args = std::tuple<std::decay_t<A>...>;
};

/// What travels back for a body returning `task<V>`: `V`, or `U` for `V = expected<U>` (a
/// returned error is the run's failure: error-as-value results fail, as everywhere).
template <class V>
struct remote_value {
  using type = V;
};
template <class U>
struct remote_value<caf::expected<U>> {
  using type = U;
};
template <>
struct remote_value<caf::expected<void>> {
  using type = void;
};

template <class T>
struct is_caf_expected : std::false_type {};
template <class T>
struct is_caf_expected<caf::expected<T>> : std::true_type {};

template <class F, class... A, size_t... I>
task<remote_outcome> run_registered(F f, std::string name, context& cx, caf::message args,
                                    std::index_sequence<I...>) {
  remote_outcome out;
  if (!args.template match_elements<A...>()) {
    out.err = make_error(errc::body_type_mismatch, "args",
                         "body \"" + name + "\" takes " + std::to_string(sizeof...(A)) +
                             " argument(s) of its registered types, got " + caf::to_string(args));
    co_return out;
  }
  using V = typename std::invoke_result_t<F&, context&, const A&...>::value_type;
  if constexpr (std::is_void_v<V>) {
    co_await std::invoke(f, cx, args.template get_as<A>(I)...);
  } else if constexpr (is_caf_expected<V>::value) {
    auto v = co_await std::invoke(f, cx, args.template get_as<A>(I)...);
    if (!v) {
      out.err = v.error();
    } else if constexpr (!std::is_void_v<typename remote_value<V>::type>) {
      out.value = caf::make_message(std::move(*v));
    }
  } else {
    out.value = caf::make_message(co_await std::invoke(f, cx, args.template get_as<A>(I)...));
  }
  co_return out;
}

template <class F, class... A>
remote_body_fn erase_body(F f, std::string name, std::tuple<A...>*) {
  return [f = std::move(f), name = std::move(name)](context& cx, caf::message args) {
    // A plain function calling a coroutine that takes everything by value: the body and
    // its arguments live in the coroutine frame, not in this (copied) closure.
    return run_registered<F, A...>(f, name, cx, std::move(args), std::index_sequence_for<A...>{});
  };
}

/// Returns `f` with its types erased for the registry.
template <class F>
remote_body_fn make_remote_body(F f, std::string name) {
  using args = typename remote_signature<std::decay_t<F>>::args;
  return erase_body(std::move(f), std::move(name), static_cast<args*>(nullptr));
}

/// Runs `body` on `node` through its spawner and yields the outcome (errors inside it:
/// `cluster_unavailable`, `unknown_node`, `node_down`, `unknown_body`, `body_type_mismatch`,
/// the body's failure, `cancelled`). Cancelling the calling task cancels the remote run.
task<remote_outcome> run_on_node(context& cx, std::string node, std::string body,
                                 caf::message args);

/// Picks the node for the next remote job of `where` among the members that are up,
/// skipping `exclude`; `no_node_available` (field `placement`) when none is.
task<caf::expected<std::string>> pick_node(context& cx, placement where, uint64_t turn,
                                           std::vector<std::string> exclude);

/// Returns the `T` inside a remote outcome, or its error (`body_type_mismatch`, field
/// `result`, when the value is not a `T`).
template <class T>
caf::expected<T> remote_result(remote_outcome& out, const std::string& body) {
  if (out.err) return std::move(out.err);
  if constexpr (std::is_void_v<T>) {
    return caf::expected<void>{};
  } else {
    if (!out.value.template match_elements<T>())
      return make_error(errc::body_type_mismatch, "result",
                        "body \"" + body + "\" answered " + caf::to_string(out.value) +
                            ", not the type asked for");
    return std::move(out.value.template get_mutable_as<T>(0));
  }
}

template <class T>
task<caf::expected<T>> spawn_on_impl(context& cx, std::string node, std::string body,
                                     caf::message args) {
  auto out = co_await run_on_node(cx, std::move(node), body, std::move(args));
  co_return remote_result<T>(out, body);
}

/// Waits (at most the node's failure timeout) until this node's directory no longer sees
/// `node` up, after a run there failed with `node_down`.
task<void> settle_node_down(context& cx, std::string node);

/// A pool job that runs a registered body on the pool's nodes (`pool_spec::remote`).
template <class T>
class remote_pool_body final : public pool_body {
 public:
  remote_pool_body(std::string body, caf::message args)
      : body_(std::move(body)), args_(std::move(args)) {}
  void bind(const pool_spec& spec, uint64_t id) override {
    where_ = spec.remote;
    turn_ = id;
  }
  task<outcome_box> run(context& cx) override { return run_job(cx, body_, args_, where_, turn_); }

 private:
  static task<outcome_box> run_job(context& cx, std::string body, caf::message args,
                                   pool_remote_spec where, uint64_t turn) {
    std::vector<std::string> failed; // nodes that went down under this job
    for (;;) {
      auto node = co_await pick_node(cx, placement{where.nodes}, turn, failed);
      if (!node) co_return outcome_box{nullptr, node.error()};
      auto out = co_await run_on_node(cx, *node, body, args);
      if (is(out.err, errc::node_down)) {
        // Before this worker takes another job, this node's directory knows the node is
        // gone: the next pick does not choose it again.
        co_await settle_node_down(cx, *node);
        if (where.retry_on_node_down) {
          failed.push_back(std::move(*node));
          continue; // at least once: it may have run there in part
        }
      }
      auto r = remote_result<T>(out, body);
      if (!r) co_return outcome_box{nullptr, std::move(r.error())};
      if constexpr (std::is_void_v<T>)
        co_return outcome_box{};
      else
        co_return outcome_box{std::make_shared<T>(std::move(*r)), caf::error{}};
    }
  }

  std::string body_;
  caf::message args_;
  pool_remote_spec where_;
  uint64_t turn_ = 0;
};

} // namespace detail

/// Runs the body registered as `body` on member `node` with `args` and awaits its outcome:
/// `co_await` yields `caf::expected<T>`, `T` being what the body returns (`U` for a body
/// returning `expected<U>`). Errors: `cluster_unavailable`, `unknown_node` (no such member,
/// field `node`), `node_down` (it is down or went down before answering), `unknown_body`
/// (field `body`), `body_type_mismatch` (field `args` or `result`), the body's own failure,
/// `cancelled`. Cancelling the awaiting task cancels the remote run, and the task ends only
/// once that run has ended (at most its grace plus 5 s when the node does not answer); the
/// remote run is also cancelled when the awaiting task ends or its node goes away.
template <class T, class... Args>
[[nodiscard]] auto spawn_on(context& cx, std::string node, std::string body, Args&&... args) {
  return detail::spawn_on_impl<T>(cx, std::move(node), std::move(body),
                                  caf::make_message(std::forward<Args>(args)...));
}

/// Submits a job to `p` that runs the body registered as `body` with `args` on the pool's
/// nodes (`pool_spec::remote`): each job runs on the next member that is up, round robin.
/// A job whose node goes down fails with `node_down`, or runs again on another member
/// when the pool says `retry_on_node_down`; a job that finds no member up fails with
/// `no_node_available`. Queue, backpressure, deadlines and cancellation are the pool's.
template <class T, class... Args>
[[nodiscard]] auto submit_remote(context& cx, const pool& p, std::string body, Args&&... args) {
  std::shared_ptr<detail::pool_body> b = std::make_shared<detail::remote_pool_body<T>>(
      std::move(body), caf::make_message(std::forward<Args>(args)...));
  return detail::pool_submit_impl<T>(cx, p.actor(), std::move(b), submit_options{});
}

/// Options of a remote child.
struct remote_child_options {
  /// The task's name on its node; the body's name when empty.
  std::string name;
  /// How long the start waits for the chosen node's answer before it tries the next one.
  int64_t start_timeout_ms = 5000;
};

/// Returns a start function that runs the body registered as `body` with `args` as a
/// supervised child on a member chosen by `where` (the first one that is up in `nodes`;
/// round robin over the members that are up when `nodes` is empty). Each (re)start chooses
/// again, so a child whose node went down restarts on a surviving one. The child's end
/// means what it means for `task_child`; its node going down (or its connection breaking)
/// is a failure with `node_down`, charged to the budgets like any other. A child never
/// outlives its supervisor's node: when that node goes down or leaves, the child's node
/// cancels it. Starting blocks the supervisor for the chosen node's answer (bounded by
/// `start_timeout_ms`), as OTP's `start_link` does. Errors of a start: `cluster_unavailable`,
/// `no_node_available` (field `placement`), `unknown_body`, `body_type_mismatch`.
start_fn remote_child(std::string body, caf::message args = {}, placement where = {},
                      remote_child_options opts = {});

} // namespace troupe
