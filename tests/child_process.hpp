#pragma once

// A child process for tests that run other programs (the demo as a service, troupe-node):
// its stdout is read through a pipe, line by line, with bounded waits.

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace troupe_test {

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
  /// Reads until a line starting with `prefix` is complete; returns its rest ("" when
  /// none came within `within`).
  std::string read_line_after(const std::string& prefix, std::chrono::milliseconds within) {
    auto deadline = std::chrono::steady_clock::now() + within;
    for (;;) {
      auto i = out_.find(prefix, scanned_);
      if (i != std::string::npos) {
        auto end = out_.find('\n', i);
        if (end != std::string::npos) {
          scanned_ = end + 1;
          return out_.substr(i + prefix.size(), end - i - prefix.size());
        }
      }
      if (!read_some(deadline)) return {};
    }
  }
  /// Kills the child at once (SIGKILL) and reaps it.
  void kill_now() {
    if (pid_ <= 0 || reaped_) return;
    ::kill(pid_, SIGKILL);
    wait();
  }
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
  size_t scanned_ = 0;
};

} // namespace troupe_test
