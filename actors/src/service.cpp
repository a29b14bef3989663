#include "troupe/actors/service.hpp"

#include <algorithm>

namespace troupe {

const char* to_string(service_status::state_t x) noexcept {
  switch (x) {
    case service_status::starting:
      return "starting";
    case service_status::running:
      return "running";
    case service_status::backing_off:
      return "backing_off";
    case service_status::stopped:
      return "stopped";
    case service_status::inactive:
      return "inactive";
  }
  return "?";
}

troupe::task<bool> service_context::rest(clock::duration d) {
  try {
    co_await cx_.sleep(d);
    co_return false;
  } catch (const task_cancelled&) {
    co_return true;
  }
}

troupe::task<service_status> run_service(context& cx, service_attempt attempt,
                                         service_policy policy,
                                         std::function<void(const service_status&)> on_status) {
  service_status st;
  auto publish = [&](service_status::state_t s) {
    st.state = s;
    if (on_status) on_status(st);
  };
  st.credit = policy.credit;
  publish(service_status::starting);
  service_context sc{cx};
  int consecutive = 0;
  for (;;) {
    publish(service_status::running);
    auto began = cx.now();
    service_outcome out;
    try {
      out = co_await attempt(sc);
    } catch (const task_cancelled&) {
      publish(service_status::stopped);
      co_return st;
    } catch (const std::exception& e) {
      out = service_outcome::application_fault(std::string{"uncaught exception: "} + e.what());
    } catch (...) {
      out = service_outcome::application_fault("uncaught non-standard exception");
    }
    if (out.kind == service_outcome::completed || cx.is_cancelled()) {
      publish(service_status::stopped);
      co_return st;
    }
    if (out.kind == service_outcome::application) {
      st.history.push_back("application: " + out.reason);
      st.cause = "application fault: " + out.reason;
      publish(service_status::inactive);
      co_return st;
    }
    // An environmental fault: sustained health refills the credit first.
    st.history.push_back("environmental: " + out.reason);
    if (cx.now() - began >= policy.sustained_health) {
      st.credit = policy.credit;
      consecutive = 0;
    }
    if (st.credit <= 0) {
      st.cause = "credit exhausted: " + out.reason;
      publish(service_status::inactive);
      co_return st;
    }
    --st.credit;
    ++consecutive;
    // Doubling, capped before it can overflow.
    auto wait = std::min(policy.backoff_base, policy.backoff_cap);
    for (int n = 1; n < consecutive && wait < policy.backoff_cap; ++n)
      wait = std::min(wait * 2, policy.backoff_cap);
    publish(service_status::backing_off);
    if (co_await sc.rest(wait)) { // shutdown during the backoff
      publish(service_status::stopped);
      co_return st;
    }
  }
}

} // namespace troupe
