// Appends to the event log as fast as it can and prints the event id of every append it
// has seen acknowledged (one line each, flushed) until it is killed. Used by the crash test.
#include <cstdio>
#include <string>

#include <troupe/troupe.hpp>

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  auto rt = troupe::runtime::builder{}.threads(2).storage(argv[1]).build();
  if (!rt) return 3;
  auto r = rt->run([](troupe::context& cx) -> troupe::task<int> {
    for (int64_t n = 0;; n += 64) {
      std::vector<nlohmann::json> batch;
      for (int64_t i = 0; i < 64; ++i)
        batch.push_back({{"n", n + i}, {"pad", "0123456789abcdef0123456789abcdef"}});
      auto rs = co_await troupe::event_append_all(cx, "crash.test", std::move(batch), 64);
      if (!rs) co_return 4;
      for (size_t i = 0; i < rs->size(); ++i)
        std::printf("%lld %lld\n", static_cast<long long>((*rs)[i].event_id),
                    static_cast<long long>(n + static_cast<int64_t>(i)));
      std::fflush(stdout);
    }
  });
  return r ? *r : 5;
}
