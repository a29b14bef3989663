#include "troupe/runtime/cluster.hpp"

#include <caf/actor_registry.hpp>
#include <caf/actor_system.hpp>

#include "troupe/messages/errc.hpp"

namespace troupe {

namespace {

using namespace troupe::atoms;

/// Returns this runtime's directory, or `cluster_unavailable`.
caf::expected<directory_actor> directory_of(context& cx) {
  auto ptr = cx.self()->home_system().registry().get(cluster_directory_key());
  if (!ptr)
    return make_error(errc::cluster_unavailable, "cluster.node",
                      "this runtime is not a cluster node (no cluster.node configured)");
  return caf::actor_cast<directory_actor>(ptr);
}

template <class T, class... Ts>
task<caf::expected<T>> ask(context& cx, Ts... xs) {
  auto dir = directory_of(cx);
  if (!dir) co_return dir.error();
  co_return co_await cx.request(*dir, std::move(xs)...);
}

} // namespace

task<caf::expected<std::vector<member_state>>> cluster_state(context& cx) {
  return ask<std::vector<member_state>>(cx, cl_state_atom::value);
}

task<caf::expected<std::vector<cluster_event>>> cluster_next_events(context& cx, uint64_t after) {
  return ask<std::vector<cluster_event>>(cx, cl_events_atom::value, after);
}

task<caf::expected<bool>> subscribe_cluster(context& cx, caf::actor who, bool replay) {
  return ask<bool>(cx, cl_subscribe_atom::value, std::move(who), replay);
}

task<caf::expected<bool>> unsubscribe_cluster(context& cx, caf::actor_addr who) {
  return ask<bool>(cx, cl_unsubscribe_atom::value, std::move(who));
}

task<caf::expected<member_state>> await_member(context& cx, std::string node,
                                               member_status status,
                                               std::optional<std::chrono::milliseconds> timeout) {
  int64_t ms = timeout ? std::max<int64_t>(0, timeout->count()) : -1;
  return ask<member_state>(cx, cl_await_atom::value, std::move(node), status, ms);
}

task<caf::expected<bool>> join_cluster(context& cx, std::string host, uint16_t port) {
  return ask<bool>(cx, cl_join_atom::value, std::move(host), port);
}

task<caf::expected<bool>> leave_cluster(context& cx) {
  return ask<bool>(cx, cl_leave_atom::value);
}

task<caf::expected<bool>> register_global(context& cx, std::string name, caf::actor actor) {
  return ask<bool>(cx, cl_register_atom::value, std::move(name), std::move(actor));
}

task<caf::expected<bool>> unregister_global(context& cx, std::string name) {
  return ask<bool>(cx, cl_unregister_atom::value, std::move(name));
}

task<caf::expected<caf::actor>> whereis(context& cx, std::string name) {
  return ask<caf::actor>(cx, cl_whereis_atom::value, std::move(name));
}

task<caf::expected<std::vector<global_name>>> global_names(context& cx) {
  return ask<std::vector<global_name>>(cx, cl_names_atom::value);
}

} // namespace troupe
