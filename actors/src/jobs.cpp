#include "troupe/actors/jobs.hpp"

#include <deque>
#include <limits>
#include <mutex>

#include <caf/all.hpp>

#include "primitive_actors.hpp"
#include "troupe/messages/interfaces.hpp"

namespace troupe {

namespace detail {

const job_label& lane_label(std::string_view name) {
  // Never freed: handles may outlive every runtime. Bounded by the lane names declared in
  // the process's catalogs (a deque: a label's address stays fixed as others are added).
  static auto* mtx = new std::mutex;
  static auto* labels = new std::deque<job_label>;
  std::lock_guard<std::mutex> guard{*mtx};
  for (auto& l : *labels)
    if (l.lane == name) return l;
  return labels->emplace_back(job_label{std::string{name}, std::nullopt});
}

caf::expected<std::shared_ptr<const lane_catalog>>
open_lanes(caf::actor_system& sys, troupe::clock* clock, std::vector<lane_decl> lanes) {
  if (auto err = validate_lanes(lanes)) return err;
  if (lanes.empty()) lanes.push_back(lane_decl::default_lane());
  std::vector<lane_catalog::entry> xs;
  xs.reserve(lanes.size());
  for (auto& l : lanes) {
    // A lane is a FIFO gate of its width; an unbounded one never makes anybody wait.
    auto width = l.kind == lane_kind::unbounded ? std::numeric_limits<int64_t>::max() / 4 : l.width;
    auto a = spawn_sync(sys, sync_config{sync_kind::gate, "lane:" + l.name, width, clock, true,
                                         nullptr}); // no graph: not part of deadlock detection
    auto* label = &lane_label(l.name);
    xs.push_back({l, std::move(a), label});
  }
  return std::make_shared<const lane_catalog>(std::move(xs));
}

} // namespace detail

task<caf::error> attempt_scope::close() {
  // Cancelling a child that already ended answers false and leaves its result awaitable.
  for (auto& st : children_)
    (void)co_await cx_.cancel(task_handle<int>{st});
  children_.clear();
  caf::error first;
  for (auto& [st, err] : refused_) {
    bool awaited = st->awaited.load();
    (void)co_await cx_.cancel(task_handle<int>{st});
    if (!awaited && !first) first = err;
  }
  refused_.clear();
  co_return first;
}

namespace {

lane_metrics to_lane_metrics(const lane_decl& d, const sync_metrics& m) {
  lane_metrics out;
  out.name = d.name;
  out.kind = d.kind;
  out.width = d.width;
  out.queue_depth = m.queue_depth;
  out.max_queue_depth = m.max_queue_depth;
  out.running = m.held_now;
  out.admitted = m.acquisitions;
  out.withdrawn = m.cancellations;
  out.total_wait_ms = m.total_wait_ms;
  return out;
}

} // namespace

task<caf::expected<lane_metrics>> lane_metrics_of(context& cx, std::string name) {
  auto& env = detail::access::impl(cx)->env();
  const detail::lane_catalog::entry* e = env.lanes ? env.lanes->find(name) : nullptr;
  if (e == nullptr)
    co_return make_error(errc::unknown_lane, "lane", "no lane \"" + name + "\" is declared");
  auto m = co_await cx.request(caf::actor_cast<sync_actor_type>(e->actor), atoms::sy_metrics_atom::value);
  if (!m) co_return std::move(m.error());
  co_return to_lane_metrics(e->decl, *m);
}

task<caf::expected<std::vector<lane_metrics>>> lane_metrics_of(context& cx) {
  auto& env = detail::access::impl(cx)->env();
  std::vector<lane_metrics> out;
  if (!env.lanes) co_return out;
  for (auto& e : env.lanes->entries()) {
    auto m = co_await cx.request(caf::actor_cast<sync_actor_type>(e.actor), atoms::sy_metrics_atom::value);
    if (!m) co_return std::move(m.error());
    out.push_back(to_lane_metrics(e.decl, *m));
  }
  co_return out;
}

} // namespace troupe
