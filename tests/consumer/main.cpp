#include <cstdio>

#include <troupe/troupe.hpp>

int main() {
  auto rt = troupe::runtime::builder{}.threads(1).build();
  if (!rt) return 1;
  auto v = rt->run([](troupe::context& cx) -> troupe::task<int> {
    auto h = cx.spawn([]() -> troupe::task<int> { co_return 41; });
    auto x = co_await cx.await(h);
    co_return x ? *x + 1 : -1;
  });
  std::printf("consumer: %d\n", v ? *v : -1);
  return v && *v == 42 ? 0 : 1;
}
