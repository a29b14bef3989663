// Worker pools: pool_dispatch (trivial jobs) and pool_dispatch_10us (10 µs of CPU each)
// through a pool of 2 workers bounded at 64 queued with block_submitter, against a raw CAF
// dispatcher keeping 64 requests in flight over 2 worker actors.

#include <vector>

#include <sqlite3.h>

#include "bench_support.hpp"

namespace troupe_bench {

namespace {

using go_atom = caf::atom_constant<caf::atom("b_pgo")>;

/// Spins the CPU for `us` microseconds (the job's work; 0: none).
inline void spin(long us) {
  if (us <= 0) return;
  auto end = clk::now() + std::chrono::microseconds{us};
  while (clk::now() < end) {
  }
}

struct pool_dispatcher_state {
  long total = 0;
  long sent = 0;
  long done = 0;
  long sum = 0;
  std::vector<caf::actor> workers;
  caf::response_promise finished;
};

void send_next(caf::stateful_actor<pool_dispatcher_state>* self) {
  auto& st = self->state;
  auto w = st.workers[static_cast<size_t>(st.sent % static_cast<long>(st.workers.size()))];
  ++st.sent;
  self->request(w, caf::infinite, int{1}).then([self](int v) {
    auto& s = self->state;
    s.sum += v;
    if (++s.done == s.total) {
      s.finished.deliver(s.sum);
      return;
    }
    if (s.sent < s.total) send_next(self);
  });
}

} // namespace

double troupe_pool_dispatch(long n, long work_us) {
  auto rt = make_runtime();
  auto t0 = clk::now();
  auto r = rt.run([n, work_us](context& cx) -> task<long> {
    troupe::pool_spec spec;
    spec.name = "bench";
    spec.max_concurrent = 2;
    spec.backpressure.kind = troupe::pool_backpressure_kind::queue;
    spec.backpressure.max_depth = 64;
    spec.backpressure.on_full = troupe::pool_on_full::block_submitter;
    auto p = co_await troupe::open_pool(cx, spec);
    if (!p) co_return -1;
    for (long i = 0; i < n; ++i) {
      auto h = co_await troupe::submit(cx, *p, [work_us](context&) -> task<int> {
        spin(work_us);
        co_return 1;
      });
      if (!h) co_return -2;
    }
    auto snap = co_await troupe::wait_idle(cx, *p);
    co_return snap ? static_cast<long>(snap->completed) : -3;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "pool_dispatch: wrong result\n");
  return s;
}

double caf_pool_dispatch(long n, long work_us) {
  caf_env env;
  std::vector<caf::actor> workers;
  for (int i = 0; i < 2; ++i)
    workers.push_back(env.sys->spawn([work_us]() -> caf::behavior {
      return {[work_us](int x) {
        spin(work_us);
        return x;
      }};
    }));
  auto driver = env.sys->spawn(
      [n, workers](caf::stateful_actor<pool_dispatcher_state>* self) -> caf::behavior {
        return {[self, n, workers](go_atom) {
          self->state.total = n;
          self->state.workers = workers;
          self->state.finished = self->make_response_promise();
          for (long i = 0; i < std::min(64L, n); ++i)
            send_next(self);
          return self->state.finished;
        }};
      });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  self->request(driver, caf::infinite, go_atom::value)
      .receive([](long) {}, [](caf::error&) { std::fprintf(stderr, "caf dispatcher failed\n"); });
  auto s = seconds_since(t0);
  self->send_exit(driver, caf::exit_reason::user_shutdown);
  for (auto& w : workers)
    self->send_exit(w, caf::exit_reason::user_shutdown);
  return s;
}

// -- pool_durable_submit: pipeline-pool submits, each acknowledged after its commit --------

namespace {

constexpr long durable_submitters = 512;

double troupe_pool_durable_submit(long n) {
  auto path = bench_db("troupe");
  auto rt = troupe::runtime::builder{}
                .threads(opts.threads)
                .scheduler(opts.policy)
                .max_throughput(opts.max_throughput)
                .storage(path)
                .build();
  if (!rt) std::exit(2);
  auto t0 = clk::now();
  auto r = rt->run([n](context& cx) -> task<long> {
    cx.set_local<std::string>("pipeline_id", "bench");
    troupe::pool_spec spec;
    spec.name = "durable";
    spec.max_concurrent = 2;
    spec.scope = troupe::pool_scope::pipeline;
    auto p = co_await troupe::open_pool(cx, spec);
    if (!p) co_return -1;
    long per = n / durable_submitters;
    auto pool = *p;
    auto ok = co_await cx.parallel(durable_submitters, [pool, per](context& c, size_t w) -> task<long> {
      for (long i = 0; i < per; ++i) {
        auto h = co_await troupe::submit(
            c, pool, [](context&) -> task<int> { co_return 1; },
            {.idempotency_key = "w" + std::to_string(w) + "-" + std::to_string(i)});
        if (!h) co_return -1;
      }
      co_return per;
    });
    if (!ok) co_return -2;
    auto snap = co_await troupe::wait_idle(cx, pool);
    co_return snap ? static_cast<long>(snap->completed) : -3;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "pool_durable_submit: wrong result %ld\n", r ? *r : -9);
  rt->stop();
  drop_db(path);
  return s;
}

/// The same records by hand: per job, its submit row and its terminal row, 1000 rows per
/// transaction, into the same table (WAL, synchronous NORMAL, as troupe's storage).
double raw_pool_durable_submit(long n) {
  auto path = bench_db("raw");
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  sqlite3_exec(db,
               "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
               "CREATE TABLE pool_tasks(pool_id TEXT NOT NULL, task_id INTEGER NOT NULL,"
               " status INTEGER NOT NULL, record TEXT NOT NULL, PRIMARY KEY(pool_id, task_id))"
               " WITHOUT ROWID;",
               nullptr, nullptr, nullptr);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db,
                     "INSERT INTO pool_tasks(pool_id, task_id, status, record) VALUES(?, ?, ?, ?)"
                     " ON CONFLICT(pool_id, task_id) DO UPDATE SET status = excluded.status,"
                     " record = excluded.record",
                     -1, &st, nullptr);
  std::string pool_id = troupe::pool_id_of(troupe::pool_scope::pipeline, "bench", "durable");
  auto t0 = clk::now();
  long rows = 0;
  sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
  for (long i = 0; i < n; ++i) {
    troupe::pool_task_snapshot snap;
    snap.id = static_cast<uint64_t>(i + 1);
    snap.idempotency_key = "w" + std::to_string(i % durable_submitters) + "-" + std::to_string(i);
    for (auto status : {troupe::pool_task_status::queued, troupe::pool_task_status::completed}) {
      snap.status = status;
      auto text = troupe::to_json(snap).dump();
      sqlite3_bind_text(st, 1, pool_id.data(), static_cast<int>(pool_id.size()), SQLITE_STATIC);
      sqlite3_bind_int64(st, 2, static_cast<int64_t>(snap.id));
      sqlite3_bind_int64(st, 3, static_cast<int64_t>(status));
      sqlite3_bind_text(st, 4, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
      if (sqlite3_step(st) != SQLITE_DONE) std::fprintf(stderr, "raw sqlite: upsert failed\n");
      sqlite3_reset(st);
      if (++rows % 1000 == 0) {
        sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
        sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
      }
    }
  }
  sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
  auto s = seconds_since(t0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  drop_db(path);
  return s;
}

} // namespace

void pool_durable_submit(long n) {
  n = (n / durable_submitters) * durable_submitters;
  report_rounds("pool_durable_submit", n, [n] { return troupe_pool_durable_submit(n); },
                [n] { return raw_pool_durable_submit(n); });
}

} // namespace troupe_bench
