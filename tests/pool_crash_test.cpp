// A durable (pipeline) pool whose process is killed with SIGKILL while jobs are queued and
// running, 20 times: every acknowledged submit is found after the restart exactly once, as
// completed or as a stale failure, and nothing else appears.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include <troupe/troupe.hpp>

#include "test_support.hpp"

using troupe::context;
using troupe::task;

TEST_CASE("a pipeline pool killed 20 times keeps every acknowledged submit exactly once") {
  troupe_test::temp_dir dir;
  std::filesystem::create_directories(dir.path);
  auto db = dir.file("pool-crash.sqlite");
  std::mt19937 rng{std::random_device{}()};
  std::uniform_int_distribution<int> delay_ms{5, 120};
  std::map<std::string, uint64_t> acked_all; // key -> task id, over every round
  long last_tried = -1;                      // the highest key index any round could submit
  for (int round = 0; round < 20; ++round) {
    long first = round * 100000L;
    int out[2];
    REQUIRE(::pipe(out) == 0);
    auto pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::close(out[0]);
      ::close(out[1]);
      auto arg = std::to_string(first);
      ::execl(TROUPE_CRASH_WRITER, TROUPE_CRASH_WRITER, "pool", db.c_str(), arg.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    std::string acked;
    std::mutex mtx;
    std::condition_variable cv;
    bool first_ack = false;
    std::thread reader{[&, fd = out[0]] {
      char buf[65536];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) {
        std::lock_guard<std::mutex> guard{mtx};
        acked.append(buf, static_cast<size_t>(n));
        if (!first_ack && acked.find('\n') != std::string::npos) {
          first_ack = true;
          cv.notify_one();
        }
      }
      std::lock_guard<std::mutex> guard{mtx};
      first_ack = true;
      cv.notify_one();
    }};
    {
      std::unique_lock<std::mutex> lock{mtx};
      CHECK(cv.wait_for(lock, std::chrono::seconds{30}, [&] { return first_ack; }));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds{delay_ms(rng)});
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    INFO("round " << round << ": the submitter " << (WIFSIGNALED(status) ? "was killed" : "exited")
                  << " (code " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1) << ")");
    CHECK(WIFSIGNALED(status));
    reader.join();
    ::close(out[0]);
    // Complete lines only: "<key> <id>".
    std::istringstream in{acked.substr(0, acked.rfind('\n') + 1)};
    std::string key;
    uint64_t id = 0;
    long highest = first - 1;
    while (in >> key >> id) {
      acked_all[key] = id;
      highest = std::max(highest, std::stol(key.substr(1)));
    }
    // The submitter waits for each answer: at most one submit past the last it printed.
    last_tried = highest + 1;
    // Restart: reopen the pool and look at what it holds.
    auto rt = troupe_test::make_rt(db);
    auto seen = rt.run([](context& cx) -> task<std::vector<troupe::pool_task_snapshot>> {
      cx.set_local<std::string>("pipeline_id", "kill");
      troupe::pool_spec spec;
      spec.name = "jobs";
      spec.max_concurrent = 2;
      spec.scope = troupe::pool_scope::pipeline;
      auto p = troupe_test::must(co_await troupe::open_pool(cx, spec));
      co_return troupe_test::must(co_await troupe::tasks_of(cx, p));
    });
    REQUIRE(seen);
    rt.stop();
    std::map<std::string, int> count;
    for (auto& s : *seen) {
      INFO("round " << round << ", record " << s.id << " " << s.idempotency_key);
      ++count[s.idempotency_key];
      // Nothing else: every record is a submit some round made.
      REQUIRE(s.idempotency_key.size() > 1);
      auto n = std::stol(s.idempotency_key.substr(1));
      auto r = n / 100000L;
      CHECK(r <= round);
      if (r == round) CHECK(n <= last_tried);
      // Finished, or a stale failure (its closure died with the process).
      CHECK((s.status == troupe::pool_task_status::completed ||
             (s.status == troupe::pool_task_status::failed && s.stale &&
              troupe::is(s.error, troupe::errc::pool_task_stale))));
    }
    for (auto& [k, n] : count) {
      INFO("round " << round << ", key " << k);
      CHECK(n == 1);
    }
    for (auto& [k, tid] : acked_all) {
      INFO("round " << round << ", acknowledged " << k << " (task " << tid << ")");
      CHECK(count[k] == 1);
    }
  }
  CHECK(acked_all.size() >= 20);
}
