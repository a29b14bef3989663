// Real OS signals sent to a child process running the demo as a service (`--serve`): the
// stop choreography runs in order and the process exits 0 within its grace; a second
// signal while stopping ends it at once.

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#ifdef TROUPE_DEMO // the demo is built with the examples

namespace {

/// A child process whose stdout is read through a pipe, line by line, with bounded waits.
class child_process {
 public:
  explicit child_process(std::vector<std::string> args) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      std::vector<char*> argv;
      for (auto& a : args)
        argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  ~child_process() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }

  /// Reads until `needle` appears in the output or `within` passes; returns whether it did.
  bool read_until(const std::string& needle, std::chrono::milliseconds within) {
    auto deadline = std::chrono::steady_clock::now() + within;
    while (out_.find(needle) == std::string::npos) {
      if (!read_some(deadline)) return out_.find(needle) != std::string::npos;
    }
    return true;
  }

  /// Reads to the end of the output (the child closed it) or until `within` passes.
  bool read_to_end(std::chrono::milliseconds within) {
    auto deadline = std::chrono::steady_clock::now() + within;
    while (!eof_)
      if (!read_some(deadline)) return eof_;
    return true;
  }

  /// Waits for the child to exit (after its output ended); returns its wait status.
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return status;
  }

  void signal(int sig) { ::kill(pid_, sig); }
  [[nodiscard]] const std::string& output() const { return out_; }

 private:
  bool read_some(std::chrono::steady_clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || eof_) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[4096];
    auto n = ::read(fd_, buf, sizeof(buf));
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    out_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  bool eof_ = false;
  bool reaped_ = false;
  std::string out_;
};

/// Returns whether `xs` appear in `text` in this order.
bool in_order(const std::string& text, const std::vector<std::string>& xs) {
  size_t at = 0;
  for (auto& x : xs) {
    auto i = text.find(x, at);
    if (i == std::string::npos) return false;
    at = i + x.size();
  }
  return true;
}

} // namespace

TEST_CASE("SIGTERM stops the demo's tree in order and the process exits 0 within its grace") {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    child_process demo{{TROUPE_DEMO, "--serve"}};
    REQUIRE(demo.read_until("ready", std::chrono::seconds{20}));
    auto t0 = std::chrono::steady_clock::now();
    demo.signal(sig);
    REQUIRE(demo.read_to_end(std::chrono::seconds{20}));
    auto status = demo.wait();
    auto took = std::chrono::steady_clock::now() - t0;
    INFO(demo.output());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(took < std::chrono::seconds{10}); // the stop timeout is 5 s; nothing overran
    // Services in reverse start order (the nested ingest tree too), then the participant,
    // then the remaining steps.
    CHECK(in_order(demo.output(),
                   {"service cache stopped", "service mailer stopped", "service sink stopped",
                    "service parser stopped", "service reader stopped", "service http stopped",
                    "participant report: flushed", "stop choreography:",
                    "1 cancel queued jobs", "2 running attempts: finished",
                    "3 services: ", "4 participant report: finished", "5 durability: flushed",
                    "6 join", "7 closed", "interrupted: yes", "runtime stopped cleanly"}));
    CHECK(demo.output().find("notice") == std::string::npos);
  }
}

TEST_CASE("a second signal while stopping ends the process at once") {
  child_process demo{{TROUPE_DEMO, "--serve", "--slow-stop"}};
  REQUIRE(demo.read_until("ready", std::chrono::seconds{20}));
  demo.signal(SIGINT);
  // The stop reaches the slow participant (30 s): the process is stopping.
  REQUIRE(demo.read_until("participant slow: takes 30 s", std::chrono::seconds{20}));
  auto t0 = std::chrono::steady_clock::now();
  demo.signal(SIGINT);
  REQUIRE(demo.read_to_end(std::chrono::seconds{10}));
  auto status = demo.wait();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds{5});
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGINT);
  CHECK(demo.output().find("runtime stopped cleanly") == std::string::npos);
}

#endif // TROUPE_DEMO
