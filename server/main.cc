// specula-server: the daemon. Configuration comes from --config (YAML) with flag overrides; with
// no model given it serves the embedded default (a tiny generated model). SIGTERM or SIGINT
// drains: health NOT_SERVING, new calls UNAVAILABLE, in-flight requests get
// server.shutdown_grace_seconds to finish; exit code 0. A second signal exits at once (code 1).
// SIGQUIT drains too; SIGHUP reloads the configuration (log level now, the rest at restart);
// SIGUSR1 and SIGUSR2 log the engine's state. A fatal condition (Server::ReportFatal) drains
// with at most 5 s of grace and exits with code 1.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <optional>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/common/log.h"
#include "engine/common/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/config.h"
#include "server/config_table.h"
#include "server/memory_trimmer.h"
#include "server/process_limits.h"
#include "server/server.h"
#include "server/status.h"
#include "tools/common/dashed_flags.h"
#include "engine/model/tiny/default_model.h"

ABSL_FLAG(std::string, config, "", "YAML configuration file (see deploy/config/specula.yaml)");
ABSL_FLAG(std::optional<std::string>, model, std::nullopt,
          "model directory (overrides model.path; \"\" or unset: the embedded tiny model)");
ABSL_FLAG(std::optional<std::string>, listen, std::nullopt,
          "gRPC address HOST:PORT (overrides server.listen; default 127.0.0.1:50051)");
ABSL_FLAG(std::optional<std::string>, metrics_listen, std::nullopt,
          "/metrics address HOST:PORT, empty to disable (overrides server.metrics_listen; "
          "default 127.0.0.1:9400)");
ABSL_FLAG(std::optional<std::string>, http_listen, std::nullopt,
          "OpenAI-compatible HTTP API address HOST:PORT, empty to disable (overrides "
          "server.http_listen; default disabled)");
ABSL_FLAG(std::optional<std::string>, device, std::nullopt,
          "cpu | cuda | auto (overrides model.device)");
ABSL_FLAG(std::optional<std::string>, log_level, std::nullopt,
          "debug | info | warning | error (overrides server.log_level)");
ABSL_FLAG(std::string, ready_file, "",
          "once serving, write {\"listen\", \"metrics_listen\", \"http_listen\", \"model\"} with "
          "the bound "
          "addresses to this file (for scripts and tests using port 0)");

namespace specula {
namespace {

// A command-line flag that overrides a configuration key.
struct FlagOverride {
  absl::Flag<std::optional<std::string>>* flag;
  absl::string_view name;  // as typed, e.g. "metrics-listen"
  absl::string_view key;
};

const std::vector<FlagOverride>& FlagOverrides() {
  static const std::vector<FlagOverride> overrides = {
      {&FLAGS_model, "model", "model.path"},
      {&FLAGS_listen, "listen", "server.listen"},
      {&FLAGS_metrics_listen, "metrics-listen", "server.metrics_listen"},
      {&FLAGS_http_listen, "http-listen", "server.http_listen"},
      {&FLAGS_device, "device", "model.device"},
      {&FLAGS_log_level, "log-level", "server.log_level"},
  };
  return overrides;
}

absl::StatusOr<ServerConfig> ResolveConfig() {
  ServerConfig config;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    absl::StatusOr<ServerConfig> loaded = LoadConfigFile(absl::GetFlag(FLAGS_config));
    if (!loaded.ok()) return loaded.status();
    config = *std::move(loaded);
  }
  for (const FlagOverride& o : FlagOverrides()) {
    if (std::optional<std::string> v = StringOverride(*o.flag)) {
      RETURN_IF_ERROR(SetConfigValue(&config, o.key, *v, absl::StrCat("--", o.name)));
    }
  }
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  if (config.model.path.empty()) {
    absl::StatusOr<std::string> dir = EnsureDefaultModel();
    if (!dir.ok()) return dir.status();
    config.model.path = *dir;
  }
  return config;
}

absl::Status WriteReadyFile(const std::string& path, const Server& server) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    const nlohmann::ordered_json ready = {{"listen", server.address()},
                                          {"metrics_listen", server.metrics_address()},
                                          {"http_listen", server.http_address()},
                                          {"model", server.served_model_name()}};
    f << ready.dump(2) << "\n";
    if (!f.good()) return absl::InternalError(absl::StrCat("--ready-file: cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("--ready-file: cannot rename to ", path));
  }
  return absl::OkStatus();
}

int signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const int saved_errno = errno;  // the interrupted code may be about to read it
  const char c = static_cast<char>(sig);
  // Non-blocking: a flood of signals that fills the pipe drops signals instead of blocking
  // whichever thread took this one.
  (void)!write(signal_pipe[1], &c, 1);
  errno = saved_errno;
}

// Written to the signal pipe by the server's fatal handler: not a signal number.
constexpr char kFatalWake = 0;
// The most a failing server waits for in-flight requests before it exits.
constexpr absl::Duration kFatalGrace = absl::Seconds(5);
// Held from startup and released by the fatal handler, for the exit of a server out of them.
constexpr int kFatalPathDescriptors = 16;
// How often freed heap pages go back to the kernel (server/memory_trimmer.h).
constexpr absl::Duration kMemoryTrimPeriod = absl::Seconds(10);

int WaitForSignal() {
  char c = 0;
  while (read(signal_pipe[0], &c, 1) != 1) {
  }
  return c;
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev == nullptr ? absl::StrCat("signal ", sig) : absl::StrCat("SIG", abbrev);
}

// SIGHUP: reads the configuration again (file and flags). server.log_level takes effect at once;
// other changes wait for a restart, and the log names their sections. A configuration that does
// not load changes nothing. `running` is what is in effect.
void Reload(ServerConfig* running) {
  absl::StatusOr<ServerConfig> fresh = ResolveConfig();
  if (!fresh.ok()) {
    Log(LogLevel::kWarning, "config_reload_failed",
        {{"status", StatusCodeName(fresh.status().code())},
         {"error", fresh.status().message()},
         {"action", "keeping the running configuration"}});
    return;
  }
  ServerConfig unapplied = *fresh;
  unapplied.server.log_level = running->server.log_level;
  std::vector<std::string> restart;
  if (!(unapplied.server == running->server)) restart.push_back("server");
  if (!(unapplied.model == running->model)) restart.push_back("model");
  if (!(unapplied.scheduler == running->scheduler)) restart.push_back("scheduler");
  if (!(unapplied.kv_cache == running->kv_cache)) restart.push_back("kv_cache");
  if (!(unapplied.sparse == running->sparse)) restart.push_back("sparse");
  running->server.log_level = fresh->server.log_level;
  SetLogLevel(running->server.log_level);
  Log(restart.empty() ? LogLevel::kInfo : LogLevel::kWarning, "config_reloaded",
      {{"log_level", LogLevelName(running->server.log_level)},
       {"needs_restart", restart.empty() ? "none" : absl::StrJoin(restart, ",")}});
}

// SIGUSR1/SIGUSR2: what the engine holds, for an operator wondering what it is doing.
void LogState(Server& server) {
  const EngineLoad load = server.engine().load();
  Log(LogLevel::kWarning, "state",
      {{"running", load.running},
       {"waiting", load.waiting},
       {"kv_blocks_used", load.kv_blocks_used},
       {"kv_blocks_total", load.kv_blocks_total},
       {"host_pages_used", load.host_pages_used},
       {"host_pages_capacity", load.host_pages_capacity},
       {"device_slots_used", load.device_slots_used}});
}

bool IsStopSignal(int sig) { return sig == SIGTERM || sig == SIGINT || sig == SIGQUIT; }

// A handler rather than a blocked mask: threads started before main (OpenBLAS starts its workers
// from a library constructor) would otherwise take SIGTERM with the default action. The handler
// only writes the signal number to a pipe; a signal during startup waits there. TERM, INT and
// QUIT drain; HUP reloads; USR1 and USR2 log the state: none may end the process with its
// default action and drop the streams in flight.
absl::Status InstallSignalHandlers() {
  if (pipe2(signal_pipe, O_CLOEXEC) != 0 || fcntl(signal_pipe[1], F_SETFL, O_NONBLOCK) != 0) {
    return absl::InternalError("cannot create the signal pipe");
  }
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2}) {
    sigaction(sig, &action, nullptr);
  }
  signal(SIGPIPE, SIG_IGN);  // a write to a closed socket is an error to handle, not an exit
  return absl::OkStatus();
}

// Answers HUP, USR1 and USR2 until a stop signal arrives (false) or the server reports a fatal
// condition (true).
bool ServeUntilStopOrFatal(Server& server, ServerConfig running) {
  int sig = 0;
  while (!IsStopSignal(sig = WaitForSignal())) {
    if (sig == kFatalWake) return true;
    Log(LogLevel::kInfo, "signal", {{"signal", SignalName(sig)}});
    if (sig == SIGHUP) {
      Reload(&running);
      if (absl::Status s = server.ReloadAuthTokens(); !s.ok()) {
        Log(LogLevel::kWarning, "auth_reload_failed",
            {{"error", s.message()}, {"action", "keeping the tokens in use"}});
      } else if (!running.server.auth_token_file.empty()) {
        Log(LogLevel::kInfo, "auth_reloaded", {{"file", running.server.auth_token_file}});
      }
    } else {
      LogState(server);
    }
  }
  Log(LogLevel::kInfo, "signal", {{"signal", SignalName(sig)}, {"action", "drain"}});
  return false;
}

// A second stop signal while draining means "now". The thread that honours it starts before
// serving and waits on the returned semaphore until the drain begins: a failing server (out of
// descriptors or threads) must not need a new thread then. No Log in the thread: its lock may be
// held by a writer stuck on a blocked stderr, which is one reason an operator sends the second
// signal.
std::binary_semaphore& StartSecondSignalWatcher() {
  static std::binary_semaphore draining{0};
  std::thread([] {
    draining.acquire();
    while (!IsStopSignal(WaitForSignal())) {
    }
    static constexpr char kMessage[] = "specula-server: second signal, exiting now\n";
    (void)!write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    _exit(1);
  }).detach();
  return draining;
}

int Fail(const absl::Status& s) {
  Log(LogLevel::kError, "startup_failed",
      {{"status", StatusCodeName(s.code())}, {"error", s.message()}});
  return 1;
}

int Run(int argc, char** argv) {
  absl::SetProgramUsageMessage(absl::StrCat(
      "specula-server [--config FILE] [--model DIR] [--listen HOST:PORT] "
      "[--metrics-listen HOST:PORT] [--http-listen HOST:PORT] [--device cpu|cuda|auto] "
      "[--log-level LEVEL] [--ready-file FILE] [--version]\n\n",
      ConfigKeysHelp()));
  std::vector<std::string> storage;
  std::vector<char*> rest = ParseDashedCommandLine(argc, argv, &storage);
  if (rest.size() > 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("unexpected argument: ", rest[1])));
  }

  const OpenFileLimits files = RaiseOpenFileLimit();
  if (absl::Status s = InstallSignalHandlers(); !s.ok()) return Fail(s);
  absl::StatusOr<ServerConfig> config = ResolveConfig();
  if (!config.ok()) return Fail(config.status());
  SetLogLevel(config->server.log_level);
  Log(LogLevel::kInfo, "open_file_limit",
      {{"soft_before", static_cast<int64_t>(files.soft_before)},
       {"soft", static_cast<int64_t>(files.soft)},
       {"hard", static_cast<int64_t>(files.hard)}});
  static DescriptorReserve reserve(kFatalPathDescriptors);  // before any listener takes them

  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(*config);
  if (!server.ok()) return Fail(server.status());
  if (!absl::GetFlag(FLAGS_ready_file).empty()) {
    if (absl::Status s = WriteReadyFile(absl::GetFlag(FLAGS_ready_file), **server); !s.ok()) {
      (*server)->Shutdown(absl::ZeroDuration());
      return Fail(s);
    }
  }

  (*server)->SetFatalHandler([] {
    reserve.Release();
    const char c = kFatalWake;
    (void)!write(signal_pipe[1], &c, 1);
  });
  std::binary_semaphore& draining = StartSecondSignalWatcher();
  MemoryTrimmer trimmer(kMemoryTrimPeriod);
  const bool fatal = ServeUntilStopOrFatal(**server, *config);
  draining.release();
  // A failing server gives in-flight requests a short grace only: it is to be restarted.
  const absl::Duration grace = absl::Seconds(config->server.shutdown_grace_seconds);
  (*server)->Shutdown(fatal ? std::min(grace, kFatalGrace) : grace);
  server->reset();
  FlushAsyncLog();
  return fatal ? 1 : 0;
}

}  // namespace
}  // namespace specula

int main(int argc, char** argv) { return specula::Run(argc, argv); }
