// The foundation demo: spawn, await and cancel tasks on a troupe runtime, and print what
// happened. (The supervision demo replaces it as the README's main job.)
#include <chrono>
#include <cstdio>
#include <string>

#include <troupe/troupe.hpp>

using namespace std::chrono_literals;

namespace {

struct cleanup_notice {
  std::string who;
  ~cleanup_notice() { std::printf("  [cleanup] %s released its resources\n", who.c_str()); }
};

troupe::task<int> square_later(troupe::context& cx, int x) {
  co_await cx.sleep(10ms);
  co_return x* x;
}

} // namespace

int main() {
  auto rt = troupe::runtime::builder{}.threads(2).build();
  if (!rt) {
    std::fprintf(stderr, "cannot start: %s\n", troupe::render(rt.error()).c_str());
    return 1;
  }
  std::printf("troupe demo: tasks on %zu scheduler threads (%s)\n", rt->config().threads,
              std::string{troupe::to_string(rt->config().policy)}.c_str());

  auto result = rt->run([](troupe::context& cx) -> troupe::task<int> {
    std::printf("root task %s starts\n", cx.task_id().c_str());
    cx.set_local("tenant", std::string{"acme"});

    // 1. spawn three children and await them
    std::vector<troupe::task_handle<int>> squares;
    for (int i = 1; i <= 3; ++i)
      squares.push_back(cx.spawn(
          [i](troupe::context& c) -> troupe::task<int> { co_return co_await square_later(c, i); }));
    int sum = 0;
    for (auto& h : squares) {
      auto v = co_await cx.await(h);
      std::printf("  awaited %s -> %d\n", h.id().c_str(), v ? *v : -1);
      sum += v ? *v : 0;
    }

    // 2. a child that sees the parent's task-local snapshot
    auto reader = cx.spawn([](troupe::context& c) -> troupe::task<std::string> {
      auto t = c.local<std::string>("tenant");
      co_return std::string{"child "} + c.task_id() + " of " + c.parent_task_id() +
          " sees tenant=" + (t ? *t : "?");
    });
    if (auto s = co_await cx.await(reader)) std::printf("  %s\n", s->c_str());

    // 3. force-cancel a sleeper: its RAII cleanup runs
    auto sleeper = cx.spawn([](troupe::context& c) -> troupe::task<int> {
      cleanup_notice guard{"sleeper " + c.task_id()};
      co_await c.sleep(1h);
      co_return 0;
    });
    co_await cx.sleep(5ms);
    auto stopped = co_await cx.cancel(sleeper);
    std::printf("  cancel(sleeper) -> %s\n", stopped && *stopped ? "stopped it" : "no-op");
    auto after = co_await cx.await(sleeper);
    std::printf("  await(sleeper) -> %s\n",
                after ? "finished" : troupe::render(after.error()).c_str());

    // 4. graceful cancel: the child notices at its next co_await and cleans up
    auto polite = cx.spawn([](troupe::context& c) -> troupe::task<int> {
      cleanup_notice guard{"polite " + c.task_id()};
      for (int i = 0;; ++i)
        co_await c.sleep(2ms);
    });
    co_await cx.sleep(5ms);
    (void)co_await cx.cancel_graceful(polite, 100ms);
    auto polite_result = co_await cx.await(polite);
    std::printf("  await(polite) -> %s\n",
                polite_result ? "finished" : troupe::render(polite_result.error()).c_str());

    // 5. blocking work off the scheduler threads
    auto fib = co_await cx.spawn_blocking([] {
      long a = 0, b = 1;
      for (int i = 0; i < 40; ++i)
        a = std::exchange(b, a + b);
      return a;
    });
    std::printf("  spawn_blocking fib(40) -> %ld\n", fib ? *fib : -1L);

    // 6. a failing child: its error is a value
    auto failing = cx.spawn([]() -> troupe::task<int> {
      throw std::runtime_error("disk on fire");
      co_return 0;
    });
    auto failed = co_await cx.await(failing);
    std::printf("  await(failing) -> %s\n",
                failed ? "finished" : troupe::render(failed.error()).c_str());
    co_return sum;
  });
  if (result)
    std::printf("root finished: sum of squares = %d\n", *result);
  else
    std::printf("root failed: %s\n", troupe::render(result.error()).c_str());
  rt->stop();
  std::printf("runtime stopped cleanly\n");
  return result ? 0 : 1;
}
