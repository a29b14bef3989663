// troupe-bench: each scenario runs troupe and the equivalent raw-CAF code in the same
// process, under the same scheduler settings, and prints the ratio troupe/CAF.
//
//   troupe-bench [--json] [--scenario NAME] [--threads N] [--scheduler sharing|stealing]
//                [--max-throughput N] [--n N]
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <malloc.h>
#include <mutex>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>

#include <troupe/troupe.hpp>

#include "bench_support.hpp"

namespace {

using namespace troupe_bench;

// -- spawn_await: spawn N trivial tasks, then await each ------------------------------------

using go_atom = caf::atom_constant<caf::atom("go")>;

double troupe_spawn_await(long n) {
  auto rt = make_runtime();
  auto t0 = clk::now();
  auto r = rt.run([n](context& cx) -> task<long> {
    std::vector<troupe::task_handle<int>> hs;
    hs.reserve(n);
    for (long i = 0; i < n; ++i)
      hs.push_back(cx.spawn([]() -> task<int> { co_return 1; }));
    long sum = 0;
    for (auto& h : hs)
      if (auto v = co_await cx.await(h)) sum += *v;
    co_return sum;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "spawn_await: wrong result\n");
  return s;
}

struct spawner_state {
  std::vector<caf::actor> kids;
  size_t next = 0;
  long sum = 0;
  caf::response_promise done;
};

void caf_await_next(caf::stateful_actor<spawner_state>* self) {
  auto& st = self->state;
  if (st.next == st.kids.size()) {
    st.kids.clear();
    st.done.deliver(st.sum);
    return;
  }
  auto k = st.kids[st.next++];
  self->request(k, caf::infinite, caf::get_atom::value).then([self](int v) {
    self->state.sum += v;
    caf_await_next(self);
  });
}

double caf_spawn_await(long n) {
  caf_env env;
  auto driver = env.sys->spawn([n](caf::stateful_actor<spawner_state>* self) -> caf::behavior {
    return {[self, n](go_atom) {
      self->state.done = self->make_response_promise();
      self->state.kids.reserve(n);
      for (long i = 0; i < n; ++i)
        self->state.kids.push_back(self->spawn([](caf::event_based_actor* kid) -> caf::behavior {
          return {[kid](caf::get_atom) {
            kid->quit();
            return 1;
          }};
        }));
      caf_await_next(self);
      return self->state.done;
    }};
  });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  self->request(driver, caf::infinite, go_atom::value)
      .receive([](long) {}, [](caf::error&) { std::fprintf(stderr, "caf spawn_await failed\n"); });
  auto s = seconds_since(t0);
  self->send_exit(driver, caf::exit_reason::user_shutdown);
  return s;
}

// -- sequential_await: N co_awaited requests from one task ---------------------------------

caf::behavior adder() {
  return {[](int x, int y) { return x + y; }};
}

double troupe_sequential_await(long n) {
  auto rt = make_runtime();
  auto a = rt.system().spawn(adder);
  auto t0 = clk::now();
  auto r = rt.run([n, a](context& cx) -> task<long> {
    long sum = 0;
    for (long i = 0; i < n; ++i)
      if (auto v = co_await cx.request<int>(a, 1, 0)) sum += *v;
    co_return sum;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "sequential_await: wrong result\n");
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  return s;
}

struct chain_state {
  long left = 0;
  long sum = 0;
  caf::actor target;
  caf::response_promise done;
};

void caf_chain_next(caf::stateful_actor<chain_state>* self) {
  if (self->state.left-- == 0) {
    self->state.done.deliver(self->state.sum);
    return;
  }
  self->request(self->state.target, caf::infinite, 1, 0).then([self](int v) {
    self->state.sum += v;
    caf_chain_next(self);
  });
}

double caf_sequential_await(long n) {
  caf_env env;
  auto a = env.sys->spawn(adder);
  auto driver = env.sys->spawn([n, a](caf::stateful_actor<chain_state>* self) -> caf::behavior {
    return {[self, n, a](go_atom) {
      self->state.left = n;
      self->state.target = a;
      self->state.done = self->make_response_promise();
      caf_chain_next(self);
      return self->state.done;
    }};
  });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  self->request(driver, caf::infinite, go_atom::value)
      .receive([](long) {}, [](caf::error&) { std::fprintf(stderr, "caf chain failed\n"); });
  auto s = seconds_since(t0);
  self->send_exit(driver, caf::exit_reason::user_shutdown);
  self->send_exit(a, caf::exit_reason::user_shutdown);
  return s;
}

// -- parked_rss: memory of N tasks suspended on a never-answered await ----------------------

void parked_rss(long n) {
  // Raw CAF first: N bare actors with a one-handler behavior.
  long caf_bytes = 0;
  {
    caf_env env;
    std::vector<caf::actor> actors;
    actors.reserve(n);
    auto before = rss_kib();
    for (long i = 0; i < n; ++i)
      actors.push_back(env.sys->spawn([]() -> caf::behavior { return {[](int) {}}; }));
    caf::scoped_actor self{*env.sys};
    for (auto& a : actors) // make sure every actor has been initialized
      self->request(a, caf::infinite, 0).receive([] {}, [](caf::error&) {});
    caf_bytes = (rss_kib() - before) * 1024;
    for (auto& a : actors)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
  auto rt = make_runtime();
  auto received = std::make_shared<std::atomic<long>>(0);
  auto silent = rt.system().spawn([received](caf::event_based_actor*) -> caf::behavior {
    return {[received](int) -> caf::result<int> {
      ++*received;
      return caf::delegated<int>{};
    }};
  });
  auto heap = std::make_shared<long>(0);
  auto r = rt.run([n, silent, received, heap](context& cx) -> task<long> {
    std::vector<troupe::task_handle<int>> hs;
    hs.reserve(n);
    auto before = rss_kib();
    auto heap_before = static_cast<long>(mallinfo2().uordblks);
    for (long i = 0; i < n; ++i)
      hs.push_back(cx.spawn([silent](context& c) -> task<int> {
        auto v = co_await c.request<int>(silent, 1);
        co_return v ? *v : 0;
      }));
    while (received->load() < n) // every task is parked on its await
      co_await cx.yield_now();
    *heap = static_cast<long>(mallinfo2().uordblks) - heap_before;
    co_return (rss_kib() - before) * 1024;
  }); // the root ends: its parked children are cancelled and joined
  caf::anon_send_exit(silent, caf::exit_reason::user_shutdown);
  long troupe_bytes = r ? *r : -1;
  if (opts.json)
    std::printf("{\"scenario\": \"parked_rss\", \"n\": %ld, \"troupe_bytes_per_task\": %.0f, "
                "\"troupe_heap_bytes_per_task\": %.0f, \"caf_bytes_per_actor\": %.0f, "
                "\"target_bytes\": 2048}\n",
                n, double(troupe_bytes) / n, double(*heap) / n, double(caf_bytes) / n);
  else
    std::printf("%-18s n=%-8ld troupe %8.0f B/parked task (heap %.0f B)   caf %8.0f B/bare actor\n",
                "parked_rss", n, double(troupe_bytes) / n, double(*heap) / n,
                double(caf_bytes) / n);
  std::fflush(stdout);
}

// -- parallel_each: N trivial items, a window of `window` in flight ---------------------------

long window_arg = 64;

double troupe_parallel_each(long n) {
  auto rt = make_runtime();
  auto t0 = clk::now();
  auto r = rt.run([n](context& cx) -> task<long> {
    std::vector<int> items(n, 1);
    auto out = co_await cx.parallel_each(std::move(items),
                                         [](context&, const int& x) -> task<int> { co_return x; },
                                         {.max_concurrent = window_arg});
    long sum = 0;
    if (out)
      for (auto x : *out)
        sum += x;
    co_return sum;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "parallel_each: wrong result\n");
  return s;
}

struct dispatcher_state {
  long total = 0;
  long started = 0;
  long done = 0;
  long sum = 0;
  caf::response_promise finished;
};

void dispatch_one(caf::stateful_actor<dispatcher_state>* self) {
  auto w = self->spawn([](caf::event_based_actor* me) -> caf::behavior {
    return {[me](int x) {
      me->quit();
      return x;
    }};
  });
  ++self->state.started;
  self->request(w, caf::infinite, 1).then([self](int v) {
    auto& st = self->state;
    st.sum += v;
    if (++st.done == st.total) {
      st.finished.deliver(st.sum);
      return;
    }
    if (st.started < st.total) dispatch_one(self);
  });
}

double caf_parallel_each(long n) {
  caf_env env;
  long window = window_arg <= 0 ? n : std::min(window_arg, n);
  auto driver =
      env.sys->spawn([n, window](caf::stateful_actor<dispatcher_state>* self) -> caf::behavior {
        return {[self, n, window](go_atom) {
          self->state.total = n;
          self->state.finished = self->make_response_promise();
          for (long i = 0; i < window; ++i)
            dispatch_one(self);
          return self->state.finished;
        }};
      });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  self->request(driver, caf::infinite, go_atom::value)
      .receive([](long) {}, [](caf::error&) { std::fprintf(stderr, "caf dispatcher failed\n"); });
  auto s = seconds_since(t0);
  self->send_exit(driver, caf::exit_reason::user_shutdown);
  return s;
}

// -- scope_fanout: a scope spawns N trivial children and joins them -------------------------

double troupe_scope_fanout(long n) {
  auto rt = make_runtime();
  auto t0 = clk::now();
  auto r = rt.run([n](context& cx) -> task<int> {
    auto out = co_await cx.scope(
        [n](context& s) -> task<int> {
          for (long i = 0; i < n; ++i)
            (void)s.spawn([]() -> task<int> { co_return 1; });
          co_return 0;
        },
        {.on_return = troupe::scope_exit::join});
    co_return out ? *out : -1;
  });
  auto s = seconds_since(t0);
  if (!r || *r != 0) std::fprintf(stderr, "scope_fanout: wrong result\n");
  return s;
}

struct fanout_state {
  long left = 0;
  caf::response_promise finished;
};

double caf_scope_fanout(long n) {
  caf_env env;
  auto driver = env.sys->spawn([n](caf::stateful_actor<fanout_state>* self) -> caf::behavior {
    self->set_down_handler([self](caf::down_msg&) {
      if (--self->state.left == 0) self->state.finished.deliver(true);
    });
    return {[self, n](go_atom) {
      self->state.left = n;
      self->state.finished = self->make_response_promise();
      for (long i = 0; i < n; ++i)
        self->spawn<caf::monitored>([](caf::event_based_actor* kid) -> caf::behavior {
          kid->quit();
          return {};
        });
      return self->state.finished;
    }};
  });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  self->request(driver, caf::infinite, go_atom::value)
      .receive([](bool) {}, [](caf::error&) { std::fprintf(stderr, "caf fanout failed\n"); });
  auto s = seconds_since(t0);
  self->send_exit(driver, caf::exit_reason::user_shutdown);
  return s;
}

// -- supervisor_restart: a child that fails at once, restarted N times -----------------------

caf::behavior crash_at_once(caf::event_based_actor* self) {
  self->quit(caf::sec::runtime_error);
  return {};
}

caf::behavior stay(caf::event_based_actor*) {
  return {[](int) {}};
}

double troupe_supervisor_restart(long n) {
  auto rt = make_runtime();
  struct done_flag {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
  };
  auto flag = std::make_shared<done_flag>();
  auto starts = std::make_shared<long>(0);
  troupe::supervisor_spec spec;
  spec.name = "bench";
  spec.intensity = 1'000'000'000;
  spec.period_ms = 1000;
  troupe::child_spec c;
  c.name = "crasher";
  c.start = [n, flag, starts](caf::actor_system& sys) -> troupe::start_result {
    if (++*starts > n) { // the last start: stays up and says so
      {
        std::lock_guard<std::mutex> g{flag->m};
        flag->done = true;
      }
      flag->cv.notify_all();
      return std::optional<caf::actor>{sys.spawn(stay)};
    }
    return std::optional<caf::actor>{sys.spawn(crash_at_once)};
  };
  spec.children = {c};
  auto t0 = clk::now();
  auto sup = rt.supervise(spec);
  if (!sup) {
    std::fprintf(stderr, "supervise: %s\n", troupe::render(sup.error()).c_str());
    return 1;
  }
  {
    std::unique_lock<std::mutex> lock{flag->m};
    flag->cv.wait(lock, [&] { return flag->done; });
  }
  auto s = seconds_since(t0);
  (void)rt.supervisor_stop(*sup, std::chrono::seconds(5));
  return s;
}

struct respawn_state {
  long left = 0;
  caf::response_promise done;
};

double caf_supervisor_restart(long n) {
  caf_env env;
  auto driver = env.sys->spawn([](caf::stateful_actor<respawn_state>* self) -> caf::behavior {
    self->set_down_handler([self](caf::down_msg&) {
      if (--self->state.left == 0) {
        self->state.done.deliver(true);
        return;
      }
      self->spawn<caf::monitored>(crash_at_once);
    });
    return {[self](go_atom, long count) {
      self->state.left = count;
      self->state.done = self->make_response_promise();
      self->spawn<caf::monitored>(crash_at_once);
      return self->state.done;
    }};
  });
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  self->request(driver, caf::infinite, go_atom::value, n)
      .receive([](bool) {}, [](caf::error&) { std::fprintf(stderr, "caf respawn failed\n"); });
  auto s = seconds_since(t0);
  self->send_exit(driver, caf::exit_reason::user_shutdown);
  return s;
}

// -- channel_pingpong: N values each way between two tasks over two channels -----------------

double troupe_channel_pingpong(long n) {
  auto rt = make_runtime();
  auto t0 = clk::now();
  auto r = rt.run([n](context& cx) -> task<long> {
    auto ping = co_await troupe::open_channel<long>(cx, "", 64);
    auto pong = co_await troupe::open_channel<long>(cx, "", 64);
    if (!ping || !pong) co_return -1;
    auto a = *ping;
    auto b = *pong;
    auto echo = cx.spawn([a, b, n](context& c) -> task<void> {
      for (long i = 0; i < n; ++i) {
        auto v = co_await a.receive(c);
        if (!v || !co_await b.send(c, *v)) co_return;
      }
    });
    long sum = 0;
    for (long i = 0; i < n; ++i) {
      if (!co_await a.send(cx, i)) co_return -1;
      auto v = co_await b.receive(cx);
      if (!v) co_return -1;
      sum += *v;
    }
    (void)co_await cx.await(echo);
    co_return sum;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n * (n - 1) / 2) std::fprintf(stderr, "channel_pingpong: wrong result\n");
  return s;
}

double caf_channel_pingpong(long n) {
  caf_env env;
  caf::scoped_actor self{*env.sys};
  auto pong = env.sys->spawn(
      [](caf::event_based_actor*) -> caf::behavior { return {[](long i) { return i; }}; });
  auto t0 = clk::now();
  auto ping = env.sys->spawn(
      [n, pong](caf::event_based_actor* s, caf::actor done) -> caf::behavior {
        s->send(pong, long{0});
        return {[=](long i) {
          if (i + 1 == n)
            s->send(done, true);
          else
            s->send(pong, i + 1);
        }};
      },
      caf::actor_cast<caf::actor>(self));
  self->receive([](bool) {});
  auto s = seconds_since(t0);
  self->send_exit(ping, caf::exit_reason::user_shutdown);
  self->send_exit(pong, caf::exit_reason::user_shutdown);
  return s;
}

// -- mailbox_throughput: N sends to a mailbox drained by one receiver ------------------------

double troupe_mailbox_throughput(long n) {
  auto rt = make_runtime();
  auto t0 = clk::now();
  auto r = rt.run([n](context& cx) -> task<long> {
    auto mb = co_await troupe::open_mailbox(cx, {.name = "bench", .capacity = 1024});
    if (!mb) co_return -1;
    auto box = *mb;
    auto sender = cx.spawn([box, n](context& c) -> task<void> {
      for (long i = 0; i < n; ++i)
        if (!*(co_await troupe::mailbox_send(c, box, i))) co_return;
    });
    long count = 0;
    for (long i = 0; i < n; ++i) {
      auto m = co_await troupe::mailbox_receive_as<long>(cx, box);
      if (!m) co_return -1;
      ++count;
    }
    (void)co_await cx.await(sender);
    co_return count;
  });
  auto s = seconds_since(t0);
  if (!r || *r != n) std::fprintf(stderr, "mailbox_throughput: wrong result\n");
  return s;
}

double caf_mailbox_throughput(long n) {
  caf_env env;
  caf::scoped_actor self{*env.sys};
  auto t0 = clk::now();
  auto recv = env.sys->spawn(
      [n](caf::event_based_actor* s, caf::actor done) -> caf::behavior {
        auto count = std::make_shared<long>(0);
        return {[=](long) {
          if (++*count == n) s->send(done, true);
        }};
      },
      caf::actor_cast<caf::actor>(self));
  env.sys->spawn([n, recv](caf::event_based_actor* s) {
    for (long i = 0; i < n; ++i)
      s->send(recv, i);
  });
  self->receive([](bool) {});
  auto s = seconds_since(t0);
  self->send_exit(recv, caf::exit_reason::user_shutdown);
  return s;
}

// -- semaphore_contention: 8 tasks x N/8 acquire/release on one semaphore of 2 ---------------

void semaphore_contention(long n) {
  auto rt = make_runtime();
  constexpr int tasks = 8;
  long per = n / tasks;
  auto t0 = clk::now();
  auto r = rt.run([per](context& cx) -> task<long> {
    auto done = co_await cx.parallel(tasks, [per](context& c, size_t) -> task<long> {
      auto sem = co_await troupe::open_semaphore(c, "bench", 2);
      if (!sem) co_return 0;
      long got = 0;
      for (long i = 0; i < per; ++i) {
        auto p = co_await sem->acquire(c);
        if (p && *p) ++got;
      }
      co_return got;
    });
    if (!done) co_return -1;
    long sum = 0;
    for (auto x : *done)
      sum += x;
    co_return sum;
  });
  auto s = seconds_since(t0);
  long total = per * tasks;
  if (!r || *r != total) std::fprintf(stderr, "semaphore_contention: wrong result\n");
  if (opts.json)
    std::printf("{\"scenario\": \"semaphore_contention\", \"n\": %ld, \"troupe_per_s\": %.0f, "
                "\"caf_per_s\": null, \"ratio\": null, \"tasks\": %d, \"permits\": 2, "
                "\"threads\": %zu}\n",
                total, total / s, tasks, opts.threads);
  else
    std::printf("%-18s n=%-8ld troupe %12.0f acquisitions/s (8 tasks, 2 permits; no CAF "
                "equivalent)\n",
                "semaphore_contention", total, total / s);
  std::fflush(stdout);
}

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

struct scenario {
  const char* name;
  long default_n;
  std::function<void(long)> run;
};

void compare(const char* name, long n, double (*t)(long), double (*c)(long)) {
  auto ts = t(n);
  auto cs = c(n);
  report(name, n, ts, cs);
}

} // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json")
      opts.json = true;
    else if (a == "--scenario")
      opts.scenario = next();
    else if (a == "--threads")
      opts.threads = std::stoul(next());
    else if (a == "--max-throughput")
      opts.max_throughput = std::stoul(next());
    else if (a == "--n")
      opts.n = std::stol(next());
    else if (a == "--scheduler") {
      auto p = next();
      if (p != "sharing" && p != "stealing") {
        std::fprintf(stderr, "--scheduler: sharing or stealing\n");
        return 2;
      }
      opts.policy =
          p == "sharing" ? troupe::scheduler_policy::sharing : troupe::scheduler_policy::stealing;
    } else {
      std::fprintf(stderr, "usage: troupe-bench [--json] [--scenario NAME] [--threads N] "
                           "[--scheduler sharing|stealing] [--max-throughput N] [--n N]\n");
      return 2;
    }
  }
  std::vector<scenario> all{
      {"parked_rss", 10'000, [](long n) { parked_rss(n); }},
      {"spawn_await", 100'000,
       [](long n) { compare("spawn_await", n, troupe_spawn_await, caf_spawn_await); }},
      {"sequential_await", 1'000'000,
       [](long n) {
         compare("sequential_await", n, troupe_sequential_await, caf_sequential_await);
       }},
      {"parallel_each", 100'000,
       [](long n) {
         window_arg = 64;
         compare("parallel_each", n, troupe_parallel_each, caf_parallel_each);
       }},
      {"parallel_each_unlimited", 100'000,
       [](long n) {
         window_arg = 0;
         compare("parallel_each_unlimited", n, troupe_parallel_each, caf_parallel_each);
       }},
      {"scope_fanout", 100'000,
       [](long n) { compare("scope_fanout", n, troupe_scope_fanout, caf_scope_fanout); }},
      {"channel_pingpong", 1'000'000,
       [](long n) {
         compare("channel_pingpong", n, troupe_channel_pingpong, caf_channel_pingpong);
       }},
      {"mailbox_throughput", 1'000'000,
       [](long n) {
         compare("mailbox_throughput", n, troupe_mailbox_throughput, caf_mailbox_throughput);
       }},
      {"semaphore_contention", 400'000, [](long n) { semaphore_contention(n); }},
      {"durable_append", 200'000, [](long n) { durable_append(n, 1, "durable_append"); }},
      {"durable_append_ceiling", 200'000,
       [](long n) { durable_append(n, 1000, "durable_append_ceiling"); }},
      {"supervisor_restart", 100'000,
       [](long n) {
         compare("supervisor_restart", n, troupe_supervisor_restart, caf_supervisor_restart);
       }},
      {"supervisor_scale", 100'000, [](long n) { supervisor_scale(n); }},
      {"dynamic_start_stop", 100'000, [](long n) { dynamic_start_stop(n); }},
  };
  bool any = false;
  for (auto& s : all) {
    if (!opts.scenario.empty() && opts.scenario != s.name) continue;
    any = true;
    s.run(opts.n > 0 ? opts.n : s.default_n);
  }
  if (!any) {
    std::fprintf(stderr, "unknown scenario: %s\n", opts.scenario.c_str());
    return 2;
  }
}
