// The specula-server binary as a child process, for the tests that need the real daemon: signals,
// exit codes, startup errors. Its stdout and stderr go to a file the test can read.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace specula::testing {

class Daemon {
 public:
  // Starts specula-server with `args` and --ready-file; returns once the ready file names the
  // bound addresses, or once the process exited (then address() is empty). Gives up after 30 s.
  // `open_file_limit` > 0 sets RLIMIT_NOFILE (soft and hard) for the process.
  static std::unique_ptr<Daemon> Start(const std::vector<std::string>& args,
                                       int open_file_limit = 0);
  // Kills the process if it is still running.
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  pid_t pid() const { return pid_; }

  // Waits for the process to end; its exit code, or 128 + the signal that killed it. After 60 s
  // the test fails and the process is killed.
  int Wait();
  // Whether the process is still running (not reaped, not a zombie).
  bool Running();
  // Everything it wrote to stderr so far.
  std::string Log() const;
  // Polls the log for up to 10 s until it has `line`.
  bool WaitForLogLine(const std::string& line) const;

 private:
  Daemon() = default;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_code_ = -1;
  std::string ready_file_;
  std::string log_file_;
  std::string address_;
  std::string metrics_address_;
};

}  // namespace specula::testing
