#include "services.hpp"

#include "troupe/messages/errc.hpp"

namespace troupe::detail {

namespace {

caf::expected<caf::actor> lookup(task_env& env, service which, const std::string& path,
                                 bool may_open) {
  auto none = [] {
    return caf::expected<caf::actor>{
        make_error(errc::storage_unavailable, "storage", "this runtime has no storage")};
  };
  switch (which) {
    case service::storage:
      return env.storage ? env.storage(may_open) : none();
    case service::storage_at:
      return env.storage_at ? env.storage_at(path, may_open) : none();
    case service::channels:
      return env.channels ? env.channels(may_open) : none();
  }
  return none();
}

} // namespace

task<caf::expected<caf::actor>> open_service(context& cx, service which, std::string path) {
  auto& env = cx.impl()->env();
  auto a = lookup(env, which, path, false);
  if (!a || *a) co_return a; // open already (or an error such as a stopped runtime)
  auto opened =
      co_await cx.spawn_blocking([&env, which, path] { return lookup(env, which, path, true); });
  if (!opened) co_return std::move(opened.error());
  co_return std::move(*opened);
}

} // namespace troupe::detail
