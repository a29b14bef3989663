// Helper processes of the persistence tests.
//   troupe_crash_writer <db>: appends to the event log as fast as it can and prints the event
//     id of every append it has seen acknowledged (one line each, flushed) until it is killed.
//   troupe_crash_writer pool <db> <first>: submits jobs (2 ms each) to the pipeline pool
//     "jobs" of pipeline "kill", with idempotency keys k<first>, k<first+1>, ..., one at a
//     time, and prints "<key> <task id>" for every submit it has seen acknowledged, until it is
//     killed (jobs queue up behind the 2 workers, so some are queued and some run).
//   troupe_crash_writer ratelimit <db> <attempts> <limit> <window_ms> <timeout_ms>: tries
//     `attempts` reservations of one unit on the shared key "shared" and prints "ok <n>".
//   troupe_crash_writer fulldisk <db> <bytes>: appends until the storage fails, with file
//     writes more than <bytes> past the largest file refused by RLIMIT_FSIZE (a full disk); prints
//     every acknowledged id, then "error <code>" for the first failure, and exits 0 (it did not
//     crash).
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <troupe/troupe.hpp>

namespace {

int crash_writer(const char* db) {
  auto rt = troupe::runtime::builder{}.threads(2).storage(db).build();
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

int rate_limiter(const char* db, int attempts, int64_t limit, int64_t window, int64_t timeout) {
  auto rt = troupe::runtime::builder{}.threads(2).storage(db).build();
  if (!rt) return 3;
  auto r = rt->run([=](troupe::context& cx) -> troupe::task<int> {
    int ok = 0;
    for (int i = 0; i < attempts; ++i) {
      troupe::rate_limit_request req;
      req.buckets.push_back(troupe::rate_bucket{"shared", limit, 1, window});
      req.timeout_ms = timeout;
      auto x = co_await troupe::rate_limit_acquire(cx, std::move(req));
      if (!x) {
        std::printf("error %s\n", troupe::render(x.error()).c_str());
        co_return -1;
      }
      ok += x->ok ? 1 : 0;
    }
    co_return ok;
  });
  if (!r) return 5;
  if (*r < 0) return 4; // the error is printed
  std::printf("ok %d\n", *r);
  return 0;
}

int full_disk(const char* db, long bytes) {
  ::signal(SIGXFSZ, SIG_IGN); // a write past the limit fails with EFBIG instead of killing
  auto rt = troupe::runtime::builder{}.threads(2).storage(db).build();
  if (!rt) return 3;
  // Opened before the limit: the database and its WAL exist, then the disk "fills".
  auto opened = rt->run([](troupe::context& cx) -> troupe::task<int> {
    auto x = co_await troupe::event_append(cx, "disk", {{"n", -1}});
    co_return x ? 0 : 1;
  });
  if (!opened || *opened != 0) return 6;
  std::error_code ec;
  auto biggest = std::max(std::filesystem::file_size(db, ec),
                          std::filesystem::file_size(std::string{db} + "-wal", ec));
  auto cap = static_cast<rlim_t>(biggest) + static_cast<rlim_t>(bytes);
  rlimit lim{cap, cap};
  if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 7;
  auto r = rt->run([](troupe::context& cx) -> troupe::task<int> {
    std::string pad(200, 'x');
    for (int64_t n = 0; n < 1000000; ++n) {
      auto x = co_await troupe::event_append(cx, "disk", {{"n", n}, {"pad", pad}});
      if (!x) {
        std::printf(
            "error %s\n",
            std::string{troupe::code_of(static_cast<troupe::errc>(x.error().code()))}.c_str());
        std::fflush(stdout);
        // Still serving: a read answers, the process goes on.
        auto rd = co_await troupe::event_read(cx, "disk", 0, 1);
        co_return rd ? 0 : 8;
      }
      std::printf("%lld %lld\n", static_cast<long long>(x->event_id), static_cast<long long>(n));
    }
    co_return 9;
  });
  std::fflush(stdout);
  return r ? *r : 5;
}

/// Opens `db` as a user who may not write it (root drops to nobody first: root writes any
/// file) and tries one append; prints "error <code>" or "ok".
int read_only(const char* db) {
  if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) return 7;
  auto rt = troupe::runtime::builder{}.threads(2).storage(db).build();
  if (!rt) return 3;
  auto r = rt->run([](troupe::context& cx) -> troupe::task<std::string> {
    auto x = co_await troupe::event_append(cx, "ro", {{"n", 1}});
    if (x) co_return "ok";
    co_return "error " + std::string{troupe::code_of(static_cast<troupe::errc>(x.error().code()))} +
        " " + troupe::render(x.error());
  });
  if (!r) return 5;
  std::printf("%s\n", r->c_str());
  return 0;
}

/// Appends to channel "orders" with idempotency id `id`; prints "<event_id> <duplicate>
/// <verified>".
int append_once(const char* db, std::string id) {
  auto rt = troupe::runtime::builder{}.threads(2).storage(db).build();
  if (!rt) return 3;
  auto r = rt->run([id](troupe::context& cx) -> troupe::task<std::string> {
    auto x = co_await troupe::durable_append(cx, "orders", {{"id", id}}, {id});
    if (!x) co_return "error " + troupe::render(x.error());
    auto ok = co_await troupe::durable_verify(cx, *x);
    co_return std::to_string(x->event_id) + (x->duplicate ? " duplicate" : " new") +
        (ok && *ok ? " verified" : " forged");
  });
  if (!r) return 5;
  std::printf("%s\n", r->c_str());
  return 0;
}

} // namespace

int pool_submitter(const char* db, long first) {
  auto rt = troupe::runtime::builder{}.threads(2).storage(db).build();
  if (!rt) return 3;
  auto r = rt->run([first](troupe::context& cx) -> troupe::task<int> {
    cx.set_local<std::string>("pipeline_id", "kill");
    troupe::pool_spec spec;
    spec.name = "jobs";
    spec.max_concurrent = 2;
    spec.scope = troupe::pool_scope::pipeline;
    auto p = co_await troupe::open_pool(cx, spec);
    if (!p) co_return 4;
    for (long n = first;; ++n) {
      auto key = "k" + std::to_string(n);
      auto h = co_await troupe::submit(
          cx, *p,
          [n](troupe::context& w) -> troupe::task<long> {
            co_await w.sleep(std::chrono::milliseconds{2});
            co_return n;
          },
          {.idempotency_key = key});
      if (!h) co_return 5;
      std::printf("%s %llu\n", key.c_str(), static_cast<unsigned long long>(h->id()));
      std::fflush(stdout);
    }
  });
  return r ? *r : 6;
}

int main(int argc, char** argv) {
  if (argc == 4 && std::string{argv[1]} == "pool") return pool_submitter(argv[2], std::atol(argv[3]));
  if (argc == 2) return crash_writer(argv[1]);
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "ratelimit" && argc == 7)
    return rate_limiter(argv[2], std::atoi(argv[3]), std::atoll(argv[4]), std::atoll(argv[5]),
                        std::atoll(argv[6]));
  if (mode == "fulldisk" && argc == 4) return full_disk(argv[2], std::atol(argv[3]));
  if (mode == "readonly" && argc == 3) return read_only(argv[2]);
  if (mode == "append-once" && argc == 4) return append_once(argv[2], argv[3]);
  return 2;
}
