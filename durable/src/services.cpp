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

} // namespace troupe::detail
