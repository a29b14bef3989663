#include "supervisor_actor.hpp"

namespace troupe {

using detail::supervisor_actor;

caf::expected<caf::actor> spawn_supervisor(caf::actor_system& sys, troupe::clock& clk,
                                           supervisor_spec spec,
                                           std::shared_ptr<supervisor_final> final) {
  if (auto err = validate(spec)) return err;
  caf::error start_error;
  auto a = sys.spawn<supervisor_actor>(&sys, &clk, std::move(spec), std::move(final),
                                       &start_error);
  // A child that could not start: the supervisor stops the ones started and ends by itself.
  if (start_error) return start_error;
  return a;
}

start_result subtree_start::operator()(caf::actor_system& sys) const {
  auto a = spawn_supervisor(sys, *clk, spec);
  if (!a) return a.error();
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
