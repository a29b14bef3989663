#pragma once

// Workers and a harness shared by the supervision suites.

#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <troupe/troupe.hpp>

#include "test_support.hpp"

using namespace std::chrono_literals;
using troupe::child_status;
using troupe::errc;
using troupe::restart_mode;
using troupe::supervisor_spec;

namespace sup_test {

using crash_atom = caf::atom_constant<caf::atom("crash")>;
using finish_atom = caf::atom_constant<caf::atom("finish")>;
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
using shutdown_ctx_atom = caf::atom_constant<caf::atom("shut_ctx")>;

/// A child that crashes or finishes when told.
inline caf::behavior worker(caf::event_based_actor* self) {
  return {
      [self](crash_atom) { self->quit(caf::sec::runtime_error); },
      [self](finish_atom) { self->quit(); },
      // OTP's `shutdown` and `{shutdown, Context}`: clean ends, not failures.
      [self](shutdown_atom) { self->quit(caf::exit_reason::user_shutdown); },
      [self](shutdown_ctx_atom) {
        self->quit(caf::error{static_cast<uint8_t>(caf::exit_reason::user_shutdown),
                              caf::atom("exit"), caf::make_message(std::string{"draining"})});
      },
  };
}

/// A child that ignores exit requests (it must be killed).
inline caf::behavior stubborn(caf::event_based_actor* self) {
  self->set_exit_handler([](caf::exit_msg&) {});
  return {[](int) {}};
}

inline troupe::start_fn start_stubborn() {
  return [](caf::actor_system& sys) -> troupe::start_result {
    return std::optional<caf::actor>{sys.spawn(stubborn)};
  };
}

/// Asks `sup` to terminate child `name` from a task of its own (the caller goes on): the
/// handle's await answers once the child has stopped, killed or not.
inline auto terminate_in_task(troupe::context& cx, const caf::actor& sup, std::string name) {
  return cx.spawn([sup, name](troupe::context& c) -> troupe::task<caf::expected<bool>> {
    co_return co_await c.request<bool>(sup, troupe::atoms::sup_term_atom::value, name);
  });
}

inline troupe::start_fn start_worker() {
  return [](caf::actor_system& sys) -> troupe::start_result {
    return std::optional<caf::actor>{sys.spawn(worker)};
  };
}

inline troupe::child_spec child(std::string name, restart_mode mode = restart_mode::always) {
  troupe::child_spec c;
  c.name = std::move(name);
  c.start = start_worker();
  c.restart = mode;
  return c;
}

using troupe_test::make_virtual_rt;

struct harness {
  troupe::runtime rt = make_virtual_rt();
  troupe::supervisor_ref sup;

  void start(supervisor_spec spec) {
    auto s = rt.supervise(std::move(spec));
    REQUIRE(s);
    sup = *s;
  }
  troupe::supervisor_state state() {
    auto st = rt.supervisor_state_of(sup);
    REQUIRE(st);
    return *st;
  }
  caf::actor actor_of(size_t i) { return state().children.at(i).actor; }
  void send(size_t i, caf::atom_value what) {
    auto a = actor_of(i);
    REQUIRE(a);
    if (what == crash_atom::value)
      caf::anon_send(a, crash_atom::value);
    else if (what == shutdown_atom::value)
      caf::anon_send(a, shutdown_atom::value);
    else if (what == shutdown_ctx_atom::value)
      caf::anon_send(a, shutdown_ctx_atom::value);
    else
      caf::anon_send(a, finish_atom::value);
    rt.drain();
  }
  /// Returns "kind:child@ms" for every event (optionally of one kind).
  std::vector<std::string> events(const std::string& only = "") {
    auto ev = rt.supervisor_events(sup);
    REQUIRE(ev);
    std::vector<std::string> out;
    for (auto& e : *ev)
      if (only.empty() || to_string(e.kind) == only)
        out.push_back(std::string{to_string(e.kind)} + ":" + e.child + "@" + std::to_string(e.at_ms));
    return out;
  }
  ~harness() {
    if (sup.actor && !rt.stopped()) (void)rt.supervisor_stop(sup, 1s);
  }
};

} // namespace sup_test

using namespace sup_test;
