#include "services.hpp"

#include "troupe/actors/detail/task_actor.hpp"
#include "troupe/messages/errc.hpp"

namespace troupe::detail {

task<caf::expected<caf::actor>> open_service(context& cx, runtime_service which,
                                             std::string path) {
  auto stopped = [] {
    return make_error(errc::runtime_stopped, "runtime", "the runtime has been stopped");
  };
  const auto& reg = access::impl(cx)->env().registry;
  if (!reg) co_return stopped();
  auto a = co_await cx.request<caf::actor>(reg, atoms::dir_find_atom::value, which,
                                           std::move(path), true);
  if (!a) {
    // The registry ended with the runtime: the request found no receiver.
    if (a.error() == caf::sec::request_receiver_down) co_return stopped();
    co_return std::move(a.error());
  }
  if (!*a)
    co_return make_error(errc::storage_unavailable, "storage",
                         "this runtime has no " + std::string{to_string(which)});
  co_return std::move(*a);
}

task<caf::expected<storage_actor_type>> find_storage(context& cx, std::string path) {
  auto which = path.empty() ? runtime_service::storage : runtime_service::storage_at;
  auto a = co_await open_service(cx, which, std::move(path));
  if (!a) co_return std::move(a.error());
  co_return caf::actor_cast<storage_actor_type>(std::move(*a));
}

task<caf::expected<channel_hub_type>> find_hub(context& cx) {
  auto a = co_await open_service(cx, runtime_service::channel_hub);
  if (!a) co_return std::move(a.error());
  co_return caf::actor_cast<channel_hub_type>(std::move(*a));
}

} // namespace troupe::detail
