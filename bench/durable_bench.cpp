// Durable work: durable_append (troupe's group commit against raw SQLite).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <malloc.h>
#include <mutex>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include <troupe/troupe.hpp>

#include "bench_support.hpp"

#include <sqlite3.h>
#include <unistd.h>

namespace troupe_bench {

// -- durable_append: 8 writers x 256 in flight, each append acknowledged after its commit ------

std::string bench_db(const char* tag) {
  auto dir = std::filesystem::temp_directory_path() /
             ("troupe-bench-" + std::to_string(::getpid()) + "-" + tag);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return (dir / "state.sqlite").string();
}

void drop_db(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(std::filesystem::path{path}.parent_path(), ec);
}

nlohmann::json bench_payload(long writer, long i) {
  return {{"writer", writer}, {"seq", i}, {"data", "0123456789abcdef0123456789abcdef0123456789"}};
}

double troupe_durable_append(long n) {
  auto path = bench_db("troupe");
  auto rt = troupe::runtime::builder{}
                .threads(opts.threads)
                .scheduler(opts.policy)
                .max_throughput(opts.max_throughput)
                .storage(path)
                .build();
  if (!rt || !rt->storage()) {
    std::fprintf(stderr, "durable_append: no storage\n");
    std::exit(2);
  }
  constexpr long writers = 8;
  long per = n / writers;
  // The payloads exist before the clock starts (both sides serialise them while timed).
  auto payloads = std::make_shared<std::vector<std::vector<nlohmann::json>>>(writers);
  for (long w = 0; w < writers; ++w)
    for (long i = 0; i < per; ++i)
      (*payloads)[w].push_back(bench_payload(w, i));
  auto t0 = clk::now();
  auto r = rt->run([payloads](context& cx) -> task<long> {
    auto done = co_await cx.parallel(writers, [payloads](context& c, size_t w) -> task<long> {
      auto rs =
          co_await troupe::event_append_all(c, "bench.append", std::move((*payloads)[w]), 256);
      co_return rs ? static_cast<long>(rs->size()) : -1;
    });
    long sum = 0;
    if (done)
      for (auto x : *done)
        sum += x;
    co_return sum;
  });
  auto s = seconds_since(t0);
  if (!r || *r != per * writers) std::fprintf(stderr, "durable_append: wrong result\n");
  if (std::getenv("TROUPE_BENCH_VERBOSE") != nullptr) {
    auto m = rt->run([](context& cx) -> task<troupe::storage_metrics> {
      co_return *(co_await troupe::storage_metrics_of(cx));
    });
    if (m)
      std::fprintf(stderr, "durable_append: %llu transactions, %.0f rows each, largest %llu\n",
                   static_cast<unsigned long long>(m->transactions),
                   static_cast<double>(m->rows) / static_cast<double>(m->transactions),
                   static_cast<unsigned long long>(m->largest_batch));
  }
  rt->stop();
  drop_db(path);
  return s;
}

/// Raw SQLite: `rows_per_txn` rows per transaction, WAL, synchronous=NORMAL, into the same
/// schema as troupe's event log (the table and its index by topic), or without the index.
double raw_sqlite_append(long n, long rows_per_txn, bool with_index = true) {
  auto path = bench_db("raw");
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  sqlite3_exec(db,
               "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
               "CREATE TABLE events(id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL,"
               " at_ms INTEGER NOT NULL, payload TEXT NOT NULL);",
               nullptr, nullptr, nullptr);
  // the same index as troupe's event log (its reads by topic need it)
  if (with_index)
    sqlite3_exec(db, "CREATE INDEX events_by_topic ON events(topic, id);", nullptr, nullptr,
                 nullptr);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "INSERT INTO events(topic, at_ms, payload) VALUES(?, ?, ?)", -1, &st,
                     nullptr);
  std::string topic = "bench.append";
  std::vector<nlohmann::json> payloads;
  payloads.reserve(n);
  for (long i = 0; i < n; ++i)
    payloads.push_back(bench_payload(i % 8, i));
  auto t0 = clk::now();
  for (long i = 0; i < n;) {
    sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
    for (long k = 0; k < rows_per_txn && i < n; ++k, ++i) {
      auto text = payloads[i].dump();
      sqlite3_bind_text(st, 1, topic.data(), static_cast<int>(topic.size()), SQLITE_STATIC);
      sqlite3_bind_int64(st, 2, 0);
      sqlite3_bind_text(st, 3, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
      if (sqlite3_step(st) != SQLITE_DONE) std::fprintf(stderr, "raw sqlite: insert failed\n");
      sqlite3_reset(st);
    }
    sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
  }
  auto s = seconds_since(t0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  drop_db(path);
  return s;
}

void durable_append(long n, long rows_per_txn, const char* name) {
  auto ts = troupe_durable_append(n);
  // The one-row-per-transaction loop is slow: it runs a tenth of the rows (a rate is a rate).
  long raw_n = rows_per_txn == 1 ? std::max(n / 10, 1000L) : n;
  auto rs = raw_sqlite_append(raw_n, rows_per_txn);
  // Also against a table without the topic index (less work than troupe's schema does).
  auto rs_bare = raw_sqlite_append(raw_n, rows_per_txn, false);
  double t = n / ts;
  double c = raw_n / rs;
  double bare = raw_n / rs_bare;
  if (opts.json)
    std::printf("{\"scenario\": \"%s\", \"n\": %ld, \"troupe_per_s\": %.0f, \"caf_per_s\": %.0f, "
                "\"ratio\": %.3f, \"baseline\": \"raw SQLite, %ld row(s) per transaction, same "
                "table and index\", \"raw_no_index_per_s\": %.0f, \"ratio_no_index\": %.3f, "
                "\"writers\": 8, \"in_flight\": 256, \"threads\": %zu}\n",
                name, n, t, c, t / c, rows_per_txn, bare, t / bare, opts.threads);
  else
    std::printf("%-18s n=%-8ld troupe %12.0f/s   raw SQLite (%ld/txn) %10.0f/s   ratio %.3f"
                "   (no index: %.0f/s, ratio %.3f)\n",
                name, n, t, rows_per_txn, c, t / c, bare, t / bare);
  std::fflush(stdout);
}

} // namespace troupe_bench
