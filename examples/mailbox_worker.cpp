// mailbox_worker: a review service. Producers (a parallel group) submit pull requests as
// JSON to the tenant's "reviews" mailbox; a reviewer task reads them one by one and checks
// each in a child task that calls a slow "connector" (a linter API). A semaphore caps the
// connector at two calls at once, whatever the reviewer starts. Verdicts go to a shared
// map, a counter counts them, and the metrics of every primitive are printed at the end.
//
// Runs on virtual time: the timeline is exact and the example takes milliseconds.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;
using nlohmann::json;
using troupe::context;
using troupe::task;

namespace {

constexpr int producers = 3;
constexpr int per_producer = 4;

struct watch {
  int inside = 0;
  int peak = 0;
};

/// The connector call: 40 ms of virtual time, at most two at once (the semaphore).
task<std::string> lint(context& cx, json pr, std::shared_ptr<watch> w) {
  auto permit = co_await troupe::acquire_semaphore(cx, "connector", 2);
  if (!permit) throw troupe::task_error{permit.error()};
  w->peak = std::max(w->peak, ++w->inside);
  co_await cx.sleep(40ms);
  --w->inside;
  co_return pr["lines"].get<int>() > 300 ? "changes requested" : "approved";
}

} // namespace

int main() {
  auto rt = troupe::runtime::builder{}.virtual_time().build();
  if (!rt) {
    std::fprintf(stderr, "cannot start: %s\n", troupe::render(rt.error()).c_str());
    return 1;
  }
  auto w = std::make_shared<watch>();
  auto out = rt->run([w](context& cx) -> task<std::string> {
    cx.set_local("tenant_id", std::string{"acme"}); // tenant scope without naming it each time
    auto inbox = co_await troupe::open_mailbox(cx, {.scope = "tenant", .name = "reviews",
                                                    .capacity = 8});
    if (!inbox) co_return troupe::render(inbox.error());
    auto mb = *inbox;

    // The reviewer: reads until the mailbox is closed and drained; checks each PR in a
    // child task (several at once), the semaphore keeps the connector at two calls.
    auto reviewer = cx.spawn(
        [mb, w](context& r) -> task<int> {
          auto verdicts = co_await troupe::open_map(r, {.scope = "tenant",
                                                               .name = "verdicts"});
          auto reviewed = co_await troupe::open_atomic(r, {.scope = "tenant",
                                                           .name = "reviewed"});
          if (!verdicts || !reviewed) co_return -1;
          auto v = *verdicts;
          auto n = *reviewed;
          auto s = co_await r.scope(
              [mb, w, v, n](context& sc) -> task<int> {
                int started = 0;
                for (;;) {
                  auto m = co_await troupe::mailbox_receive(sc, mb);
                  if (!m) break; // mailbox_closed: drained
                  auto* body = m->json(); // null when the message is not JSON
                  if (!body) continue;
                  auto pr = *body;
                  (void)sc.spawn([pr, w, v, n](context& c) -> task<void> {
                    auto verdict = co_await lint(c, pr, w);
                    (void)co_await v.set(c, pr["id"].get<std::string>(), verdict);
                    (void)co_await n.add(c, 1);
                  });
                  ++started;
                }
                co_return started;
              },
              {.on_return = troupe::scope_exit::join});
          co_return s ? *s : -1;
        },
        {.name = "reviewer"});

    // Producers: a parallel group, each submitting its pull requests.
    auto sent = co_await cx.parallel(producers, [mb](context& p, size_t who) -> task<int> {
      int ok = 0;
      for (int i = 0; i < per_producer; ++i) {
        co_await p.sleep(5ms);
        json pr{{"id", "pr-" + std::to_string(who) + "-" + std::to_string(i)},
                {"author", "dev" + std::to_string(who)},
                {"lines", 100 * (i + 1) + 10 * static_cast<int>(who)}};
        auto delivered = co_await troupe::mailbox_send(p, mb, pr);
        if (!delivered) throw troupe::task_error{delivered.error()};
        if (*delivered) ++ok;
      }
      co_return ok;
    });
    if (!sent) co_return troupe::render(sent.error());
    (void)co_await troupe::mailbox_close(cx, mb);
    auto started = co_await cx.await(reviewer);
    if (!started) co_return troupe::render(started.error());

    auto m = co_await mb.metrics(cx);
    if (!m) co_return troupe::render(m.error());
    auto sync = co_await troupe::sync_metrics_of(cx, troupe::sync_kind::semaphore, "connector");
    if (!sync) co_return troupe::render(sync.error());
    auto v = co_await troupe::open_map(cx, {.scope = "tenant", .name = "verdicts"});
    auto n = co_await troupe::open_atomic(cx, {.scope = "tenant", .name = "reviewed"});
    if (!v || !n) co_return troupe::render(v ? n.error() : v.error());
    auto entries = co_await v->entries(cx);
    auto count = co_await n->get(cx);
    if (!entries || !count) co_return troupe::render(entries ? count.error() : entries.error());
    int approved = 0;
    for (auto& kv : entries->items())
      approved += kv.value() == "approved" ? 1 : 0;
    std::printf("mailbox acme/reviews: sent %llu, received %llu, failed sends %llu, depth %lld, "
                "closed %s\n",
                static_cast<unsigned long long>(m->sent),
                static_cast<unsigned long long>(m->received),
                static_cast<unsigned long long>(m->failed_sends), static_cast<long long>(m->depth),
                m->closed ? "yes" : "no");
    for (auto& s : *sync)
      std::printf("semaphore %s: acquisitions %llu, max queue %lld, held now %lld, wait %.0f ms, "
                  "held %.0f ms\n",
                  s.key.c_str(), static_cast<unsigned long long>(s.acquisitions),
                  static_cast<long long>(s.max_queue_depth), static_cast<long long>(s.held_now),
                  s.total_wait_ms, s.total_held_ms);
    std::printf("reviews started %d, verdicts %lld (approved %d), peak connector calls %d\n",
                *started, static_cast<long long>(*count), approved, w->peak);
    co_return "done at " + std::to_string(cx.clock().now_ms()) + " ms";
  });
  if (!out) {
    std::fprintf(stderr, "failed: %s\n", troupe::render(out.error()).c_str());
    return 1;
  }
  std::printf("%s\n", out->c_str());
  rt->stop();
  std::printf("runtime stopped cleanly\n");
}
