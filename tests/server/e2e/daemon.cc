#include "tests/server/e2e/daemon.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "gtest/gtest.h"

namespace specula::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The value of "key": "..." in the ready file's one-line JSON.
std::string JsonString(const std::string& json, const std::string& key) {
  const std::string prefix = "\"" + key + "\": \"";
  const size_t at = json.find(prefix);
  if (at == std::string::npos) return "";
  const size_t begin = at + prefix.size();
  return json.substr(begin, json.find('"', begin) - begin);
}

}  // namespace

std::unique_ptr<Daemon> Daemon::Start(const std::vector<std::string>& args,
                                      int open_file_limit) {
  static int counter = 0;
  std::unique_ptr<Daemon> d(new Daemon());
  const std::string stem = ::testing::TempDir() + "/specula-daemon-" + std::to_string(getpid()) +
                           "-" + std::to_string(counter++);
  d->ready_file_ = stem + ".ready";
  d->log_file_ = stem + ".log";
  std::filesystem::remove(d->ready_file_);
  const std::string binary = std::string(SPECULA_BINARY_DIR) + "/server/specula-server";
  std::vector<std::string> argv_storage = {binary, "--ready-file=" + d->ready_file_};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  d->pid_ = fork();
  if (d->pid_ == 0) {
    const int log = open(d->log_file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log >= 0) {
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
    }
    if (open_file_limit > 0) {
      const rlimit limit{static_cast<rlim_t>(open_file_limit), static_cast<rlim_t>(open_file_limit)};
      if (setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(126);
    }
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline && d->Running()) {
    const std::string json = ReadAll(d->ready_file_);
    if (!json.empty()) {
      d->address_ = JsonString(json, "listen");
      d->metrics_address_ = JsonString(json, "metrics_listen");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return d;
}

Daemon::~Daemon() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::filesystem::remove(ready_file_);
  std::filesystem::remove(log_file_);
}

int Daemon::Wait() {
  // A daemon that should have exited but hangs fails the test instead of hanging it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (Running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "specula-server did not exit within 60 s; killed";
      kill(pid_, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return exit_code_;
}

bool Daemon::Running() {
  if (reaped_) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == 0) return true;
  reaped_ = true;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return false;
}

std::string Daemon::Log() const { return ReadAll(log_file_); }

bool Daemon::WaitForLogLine(const std::string& line) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Log().find(line) == std::string::npos) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace specula::testing
