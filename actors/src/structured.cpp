#include "troupe/actors/context.hpp"

#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>

namespace troupe {

namespace {

struct abort_token_state {
  abort_state st;
  static inline const char* name = "troupe.abort_token";
};

/// The abort token: first writer wins; polls answer the state.
caf::behavior abort_token_actor(caf::stateful_actor<abort_token_state>* self, troupe::clock* clk) {
  return {
      [self, clk](atoms::abort_atom, abort_reason& reason) -> bool {
        auto& st = self->state.st;
        if (st.requested) return false;
        reason.at_ms = clk->now_ms();
        st.requested = true;
        st.reason = std::move(reason);
        return true;
      },
      [self](atoms::abort_poll_atom) -> abort_state { return self->state.st; },
  };
}

} // namespace

namespace detail {

caf::error abandoned_error(const abort_reason& reason, bool started) {
  std::string detail = started ? "stopped: the abort token tripped"
                               : "never started: the abort "
                                 "token tripped";
  if (!reason.code.empty())
    detail += " (" + reason.code + (reason.message.empty() ? "" : ": " + reason.message) + ")";
  return make_error(errc::abandoned, "token", std::move(detail));
}

} // namespace detail

std::optional<clock::time_point> context::current_deadline() const noexcept {
  return self_->deadline();
}

abort_token context::make_abort_token() {
  return abort_token{self_->home_system().spawn(abort_token_actor, self_->env().clock)};
}

task<caf::expected<bool>> context::request_abort(abort_token token, abort_reason reason) {
  if (reason.code.empty())
    co_return make_error(errc::invalid_argument, "reason.code", "an abort reason needs a code");
  if (!token.valid())
    co_return make_error(errc::invalid_handle, "token", "the abort token is empty");
  co_return co_await request<bool>(token.actor, atoms::abort_atom::value, std::move(reason));
}

task<std::optional<abort_reason>> context::abort_requested(abort_token token) {
  if (!token.valid()) co_return std::nullopt;
  auto r = co_await request<abort_state>(token.actor, atoms::abort_poll_atom::value);
  if (r && r->requested) co_return std::move(r->reason);
  co_return std::nullopt;
}

task<void> context::check_abort(abort_token token) {
  if (auto reason = co_await abort_requested(std::move(token)))
    throw task_error{detail::abandoned_error(*reason, true)};
}

} // namespace troupe
