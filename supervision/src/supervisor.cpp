#include "supervisor_actor.hpp"

namespace troupe {

using detail::supervisor_actor;

namespace detail {

namespace {
/// Where a subtree that failed to start leaves its stopping supervisor: set by a parent
/// while it starts its children (in its constructor, on its own thread), so that the
/// parent ends only after the subtree's started children have stopped too.
thread_local caf::actor* failed_subtree_sink = nullptr;
} // namespace

caf::expected<caf::actor> spawn_supervisor_or_stopping(caf::actor_system& sys, troupe::clock& clk,
                                                       supervisor_spec spec,
                                                       std::shared_ptr<supervisor_final> final,
                                                       caf::actor& stopping) {
  if (auto err = validate(spec)) return err;
  caf::error start_error;
  auto a = sys.spawn<supervisor_actor>(&sys, &clk, std::move(spec), std::move(final),
                                       &start_error);
  // A child that could not start: the supervisor stops the ones started and ends by itself.
  if (start_error) {
    stopping = std::move(a);
    return start_error;
  }
  return a;
}

subtree_sink_scope::subtree_sink_scope(caf::actor* sink) noexcept
    : previous_(std::exchange(failed_subtree_sink, sink)) {
}

subtree_sink_scope::~subtree_sink_scope() {
  failed_subtree_sink = previous_;
}

} // namespace detail

caf::expected<caf::actor> spawn_supervisor(caf::actor_system& sys, troupe::clock& clk,
                                           supervisor_spec spec,
                                           std::shared_ptr<supervisor_final> final) {
  caf::actor stopping;
  return detail::spawn_supervisor_or_stopping(sys, clk, std::move(spec), std::move(final),
                                              stopping);
}

start_result subtree_start::operator()(caf::actor_system& sys) const {
  caf::actor stopping;
  auto a = detail::spawn_supervisor_or_stopping(sys, *clk, spec, nullptr, stopping);
  if (!a) {
    if (stopping && detail::failed_subtree_sink != nullptr)
      *detail::failed_subtree_sink = std::move(stopping);
    return a.error();
  }
  return std::optional<caf::actor>{std::move(*a)};
}

start_fn supervisor_child(troupe::clock& clk, supervisor_spec spec) {
  return subtree_start{&clk, std::move(spec)};
}

child_spec supervisor_child_spec(std::string name, troupe::clock& clk, supervisor_spec spec) {
  child_spec c;
  c.name = std::move(name);
  c.start = supervisor_child(clk, std::move(spec));
  c.kind = child_kind::supervisor;
  c.shutdown_ms = infinity;
  return c;
}

} // namespace troupe
