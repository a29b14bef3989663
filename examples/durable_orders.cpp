// Durable channels and the rate limiter in one small order service.
//
// A tenant's orders go to a durable channel with idempotency ids (a client retrying a request
// does not create a second order), each append answered with a signed receipt; a trigger
// batches orders per customer (3 at a time, or what a 300 ms window gathered); payments to a
// provider are capped at 2 per 500 ms by a durable rate limiter that waits for room. The
// database lives in a temporary directory, removed at the end.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;
using nlohmann::json;

namespace {

/// What the trigger saw, printed once the run is over (the handler runs on its own actor).
struct batches {
  std::mutex mtx;
  std::vector<std::string> lines;
};

template <class T>
T must(caf::expected<T> x) {
  if (!x) throw std::runtime_error(troupe::render(x.error()));
  return std::move(*x);
}

} // namespace

int main() {
  auto dir = std::filesystem::temp_directory_path() /
             ("troupe-durable-orders-" + std::to_string(::getpid()));
  auto rt = troupe::runtime::builder{}.threads(2).storage((dir / "state.sqlite").string()).build();
  if (!rt) {
    std::printf("cannot start: %s\n", troupe::render(rt.error()).c_str());
    return 1;
  }
  auto seen = std::make_shared<batches>();
  auto r = rt->run([seen](troupe::context& cx) -> troupe::task<int> {
    cx.set_local(std::string{troupe::tenant_local}, std::string{"acme"});
    must(co_await troupe::durable_bind(
        cx,
        {{"channel", "channel:orders.*"},
         {"batch", {{"count", 3}, {"window", 300}, {"key", "customer"}}}},
        [seen](const troupe::channel_match& m) {
          std::string ids;
          for (auto& e : m.events)
            ids += (ids.empty() ? "" : ",") + e.id;
          std::lock_guard<std::mutex> guard{seen->mtx};
          seen->lines.push_back("batch for " + m.key + " (" + m.reason + "): " + ids);
        }));
    // Orders arrive; one client retries its request for order o-2.
    const char* customers[] = {"ann", "bob", "ann", "ann", "bob"};
    troupe::channel_receipt first;
    for (int i = 1; i <= 5; ++i) {
      auto id = "o-" + std::to_string(i);
      auto rc = must(co_await troupe::durable_append(
          cx, "orders.placed", {{"customer", customers[i - 1]}, {"total", 10 * i}}, {id}));
      if (i == 1) first = rc;
      std::printf("appended %s -> %s #%lld\n", id.c_str(), rc.name_resolved.c_str(),
                  static_cast<long long>(rc.event_id));
    }
    auto retry = must(co_await troupe::durable_append(
        cx, "orders.placed", {{"customer", "bob"}, {"total", 20}}, {"o-2"}));
    std::printf("retried o-2: duplicate %s, same event %s\n", retry.duplicate ? "yes" : "no",
                retry.event_id == 2 ? "yes" : "no");
    // Receipts are signed: a changed field no longer verifies.
    auto forged = first;
    forged.emitted_at.scope_id = "globex";
    std::printf("receipt verifies: %s; forged tenant verifies: %s\n",
                must(co_await troupe::durable_verify(cx, first)) ? "yes" : "no",
                must(co_await troupe::durable_verify(cx, forged)) ? "yes" : "no");
    co_await cx.sleep(400ms); // bob's window closes with 2 orders
    // Payments: at most 2 per 500 ms at the provider, shared by every process on this file.
    auto start = cx.now();
    for (int i = 1; i <= 4; ++i) {
      auto p = must(co_await troupe::rate_limit_acquire(
          cx, json{{"buckets", {{{"key", "provider"}, {"limit", 2}, {"window_ms", 500}}}},
                   {"timeout_ms", 2000}}));
      std::printf("payment %d: %s\n", i, p.ok ? "sent" : "timed out");
    }
    auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(cx.now() - start);
    std::printf("4 payments took at least one window: %s\n", spent >= 500ms ? "yes" : "no");
    auto events = must(co_await troupe::durable_events(cx, "orders.placed"));
    auto audit = must(co_await troupe::event_read(cx, troupe::channel_audit_topic, 0, 100));
    std::printf("stored orders: %zu; audit rows: %zu\n", events.size(), audit.size());
    co_return 0;
  });
  {
    std::lock_guard<std::mutex> guard{seen->mtx};
    for (auto& line : seen->lines)
      std::printf("%s\n", line.c_str());
  }
  if (!r) std::printf("failed: %s\n", troupe::render(r.error()).c_str());
  rt->stop();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::printf("runtime stopped cleanly\n");
  return r ? *r : 1;
}
