#include "server/grpc_log_watch.h"

#include <grpc/support/log.h>

#include <mutex>

#include "absl/strings/match.h"
#include "engine/common/log.h"

namespace specula {
namespace {

std::mutex watch_mu;
std::function<void(const std::string&)>* watch = nullptr;  // guarded by watch_mu

LogLevel LevelOf(gpr_log_severity s) {
  switch (s) {
    case GPR_LOG_SEVERITY_DEBUG: return LogLevel::kDebug;
    case GPR_LOG_SEVERITY_INFO: return LogLevel::kInfo;
    case GPR_LOG_SEVERITY_ERROR: break;
  }
  return LogLevel::kError;
}

void OnGrpcLog(gpr_log_func_args* args) {
  const std::string message = args->message != nullptr ? args->message : "";
  Log(LevelOf(args->severity), "grpc_log",
      {{"file", std::string(args->file != nullptr ? args->file : "")},
       {"line", static_cast<int64_t>(args->line)},
       {"message", message}});
  // tcp_server_posix.cc: the listener's read callback ends without re-arming after "Failed
  // accept4: ..." (later versions say "Closing acceptor. Failed accept4: ...", and retry on
  // EMFILE with another message).
  if (!absl::StrContains(message, "Failed accept4")) return;
  std::function<void(const std::string&)> handler;
  {
    std::lock_guard lock(watch_mu);
    if (watch != nullptr) handler = *watch;
  }
  if (handler) handler(message);
}

}  // namespace

void WatchGrpcLogs(std::function<void(const std::string&)> on_listener_failed) {
  {
    std::lock_guard lock(watch_mu);
    delete watch;
    watch = new std::function<void(const std::string&)>(std::move(on_listener_failed));
  }
  gpr_set_log_function(&OnGrpcLog);
}

void StopWatchingGrpcLogs() {
  gpr_set_log_function(nullptr);
  std::lock_guard lock(watch_mu);
  delete watch;
  watch = nullptr;
}

}  // namespace specula
