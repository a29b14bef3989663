#include "troupe/runtime/supervision.hpp"

#include <mutex>

#include "troupe/messages/errc.hpp"

namespace troupe {

namespace {

using namespace troupe::atoms;

/// Returns the final slot's answer when the supervisor has ended, else nothing.
template <class T, class Get>
std::optional<T> from_final(const supervisor_ref& sup, Get get) {
  if (!sup.final) return std::nullopt;
  std::lock_guard<std::mutex> guard{sup.final->mtx};
  if (!sup.final->state) return std::nullopt;
  return get(*sup.final);
}

/// Asks the supervisor; once it has ended, answers from its final state.
caf::error empty_ref() {
  return make_error(errc::invalid_argument, "sup", "an empty supervisor_ref");
}

template <class T, class Get, class... Ts>
task<caf::expected<T>> ask_or_final(context& cx, supervisor_ref sup, Get get, Ts... xs) {
  if (!sup.actor) {
    if (auto f = from_final<T>(sup, get)) co_return std::move(*f);
    co_return empty_ref();
  }
  auto r = co_await cx.request<T>(caf::actor_cast<supervisor_type>(sup.actor), xs...);
  if (r) co_return r;
  if (auto f = from_final<T>(sup, get)) co_return std::move(*f);
  co_return r;
}

/// Asks the supervisor (no final-state fallback: an administration call). Once it has
/// ended (by itself, by a stop, failing, escalating, killed from outside: each records a
/// final state), the answer is `supervisor_stopping` (as during its stop), not CAF's
/// `request_receiver_down`.
template <class T, class... Ts>
task<caf::expected<T>> ask(context& cx, supervisor_ref sup, Ts... xs) {
  if (!sup.actor) co_return empty_ref();
  auto r =
      co_await cx.request<T>(caf::actor_cast<supervisor_type>(sup.actor), std::move(xs)...);
  if (r || r.error() != caf::sec::request_receiver_down) co_return r;
  // Its name and final status only (not a copy of every child's state).
  auto ended = from_final<std::pair<std::string, supervisor_status>>(
      sup, [](supervisor_final& f) { return std::make_pair(f.state->name, f.state->status); });
  if (ended)
    co_return make_error(errc::supervisor_stopping, "supervisor",
                         "supervisor \"" + ended->first + "\" has ended (" +
                             std::string{to_string(ended->second)} + ")");
  co_return r;
}

} // namespace

task<caf::expected<supervisor_ref>> supervise(context& cx, supervisor_spec spec) {
  supervisor_ref ref;
  ref.final = std::make_shared<supervisor_final>();
  auto name = spec.name;
  caf::actor stopping;
  auto sup = detail::spawn_supervisor_or_stopping(cx.self()->home_system(), cx.clock(),
                                                  std::move(spec), ref.final, stopping);
  if (!sup) {
    // OTP's start_link: the answer comes once the children started before the failure
    // have stopped (each per its shutdown). The supervisor answers a wait as it ends;
    // one that has ended already bounces it: either way it is over.
    auto err = std::move(sup.error());
    if (stopping) (void)co_await cx.request<supervisor_state>(stopping, sup_wait_atom::value);
    co_return err;
  }
  ref.actor = *sup;
  if (auto* env = detail::env_of(cx.self()->home_system()); env && env->owner != nullptr)
    env->owner->adopt_supervisor(ref.actor, name);
  co_return ref;
}

task<caf::expected<supervisor_state>> supervisor_state_of(context& cx, supervisor_ref sup) {
  co_return co_await ask_or_final<supervisor_state>(
      cx, sup, [](supervisor_final& f) { return *f.state; }, sup_state_atom::value);
}

task<caf::expected<supervisor_state>>
supervisor_wait(context& cx, supervisor_ref sup, std::optional<std::chrono::milliseconds> timeout) {
  auto get = [](supervisor_final& f) { return *f.state; };
  if (!timeout)
    co_return co_await ask_or_final<supervisor_state>(cx, sup, get, sup_wait_atom::value);
  auto r = co_await cx.deadline(*timeout, [sup, get](context& c) -> task<caf::expected<supervisor_state>> {
    co_return co_await ask_or_final<supervisor_state>(c, sup, get, sup_wait_atom::value);
  });
  if (!r) co_return r.error();
  co_return std::move(*r);
}

task<caf::expected<supervisor_state>> supervisor_stop(context& cx, supervisor_ref sup,
                                                      std::chrono::milliseconds timeout) {
  co_return co_await ask_or_final<supervisor_state>(
      cx, sup, [](supervisor_final& f) { return *f.state; }, sup_stop_atom::value,
      static_cast<int64_t>(timeout.count()));
}

task<caf::expected<supervisor_metrics>> supervisor_metrics_of(context& cx, supervisor_ref sup) {
  co_return co_await ask_or_final<supervisor_metrics>(
      cx, sup, [](supervisor_final& f) { return f.metrics; }, sup_metrics_atom::value);
}

task<caf::expected<std::vector<supervisor_event>>> supervisor_events(context& cx,
                                                                    supervisor_ref sup) {
  co_return co_await ask_or_final<std::vector<supervisor_event>>(
      cx, sup, [](supervisor_final& f) { return f.events; }, sup_events_atom::value);
}

task<caf::expected<std::vector<supervisor_event>>>
supervisor_next_events(context& cx, supervisor_ref sup, uint64_t after) {
  co_return co_await ask_or_final<std::vector<supervisor_event>>(
      cx, sup,
      [after](supervisor_final& f) {
        std::vector<supervisor_event> out;
        for (auto& e : f.events)
          if (e.seq > after) out.push_back(e);
        return out;
      },
      sup_events_atom::value, after);
}

task<caf::expected<child_state>> start_child(context& cx, supervisor_ref sup, child_spec child) {
  co_return co_await ask<child_state>(cx, std::move(sup), sup_add_atom::value, std::move(child));
}

task<caf::expected<child_state>> start_child(context& cx, supervisor_ref sup, caf::message args) {
  co_return co_await ask<child_state>(cx, std::move(sup), sup_add_atom::value, std::move(args));
}

task<caf::expected<bool>> terminate_child(context& cx, supervisor_ref sup, std::string name) {
  co_return co_await ask<bool>(cx, std::move(sup), sup_term_atom::value, std::move(name));
}

task<caf::expected<child_state>> restart_child(context& cx, supervisor_ref sup, std::string name) {
  co_return co_await ask<child_state>(cx, std::move(sup), sup_restart_atom::value, std::move(name));
}

task<caf::expected<bool>> delete_child(context& cx, supervisor_ref sup, std::string name) {
  co_return co_await ask<bool>(cx, std::move(sup), sup_delete_atom::value, std::move(name));
}

task<caf::expected<std::vector<child_state>>> which_children(context& cx, supervisor_ref sup) {
  auto st = co_await supervisor_state_of(cx, std::move(sup));
  if (!st) co_return st.error();
  co_return std::move(st->children);
}

task<caf::expected<child_counts>> count_children(context& cx, supervisor_ref sup) {
  co_return co_await ask_or_final<child_counts>(
      cx, sup, [](supervisor_final& f) { return f.counts; }, sup_count_atom::value);
}

} // namespace troupe
