// A tiny structured logger: one logfmt line per event on stderr, e.g.
//   ts=2026-11-21T16:30:00.123Z level=info event=request_finished request_id=abc status=OK
// Machines (Loki, grep, jq-like tools) parse it; people can still read it.
//
// Threading: every function may be called from any thread. Each event is formatted into one
// buffer and written with one write under a lock, so lines from different threads never
// interleave.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace specula {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// "debug", "info", "warning", "error" (the names ParseLogLevel accepts and lines carry).
absl::string_view LogLevelName(LogLevel level);

// Accepts the names above, case-insensitively, plus "warn"; INVALID_ARGUMENT otherwise.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);

namespace log_internal {
// An atomic int rather than a mutex-guarded level: LogEnabled runs on hot paths.
inline std::atomic<int> min_level{static_cast<int>(LogLevel::kInfo)};
}  // namespace log_internal

// Events below `level` are dropped. The default is kInfo.
inline void SetLogLevel(LogLevel level) {
  log_internal::min_level.store(static_cast<int>(level), std::memory_order_relaxed);
}
inline LogLevel GetLogLevel() {
  return static_cast<LogLevel>(log_internal::min_level.load(std::memory_order_relaxed));
}
// Lets callers skip computing expensive field values for events that would be dropped.
inline bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= log_internal::min_level.load(std::memory_order_relaxed);
}

// One key=value pair. Holds views of string arguments, so a LogField must not outlive the full
// expression that created it (the intended use is a braced list passed straight to Log).
class LogField {
 public:
  LogField(absl::string_view key, absl::string_view value)
      : key_(key), kind_(Kind::kString), str_(value) {}
  LogField(absl::string_view key, std::string_view value)
      : LogField(key, absl::string_view(value.data(), value.size())) {}
  LogField(absl::string_view key, const std::string& value)
      : LogField(key, absl::string_view(value)) {}
  // Without this overload a string literal would convert to bool.
  LogField(absl::string_view key, const char* value)
      : LogField(key, value == nullptr ? absl::string_view() : absl::string_view(value)) {}
  LogField(absl::string_view key, bool value) : key_(key), kind_(Kind::kBool), b_(value) {}
  LogField(absl::string_view key, double value) : key_(key), kind_(Kind::kDouble), d_(value) {}
  LogField(absl::string_view key, float value) : LogField(key, static_cast<double>(value)) {}
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  LogField(absl::string_view key, T value) : key_(key) {
    if constexpr (std::is_signed_v<T>) {
      kind_ = Kind::kInt;
      i_ = static_cast<int64_t>(value);
    } else {
      kind_ = Kind::kUint;
      u_ = static_cast<uint64_t>(value);
    }
  }

  absl::string_view key() const { return key_; }
  // Appends `key=value` to `out`, quoting and escaping the value when logfmt needs it.
  void AppendTo(std::string* out) const;

 private:
  enum class Kind { kString, kBool, kInt, kUint, kDouble };
  absl::string_view key_;
  Kind kind_;
  union {
    bool b_;
    int64_t i_;
    uint64_t u_ = 0;
    double d_;
  };
  absl::string_view str_;
};

// Writes `ts=... level=... event=<event> <fields...>` as one line, if `level` is enabled.
void Log(LogLevel level, absl::string_view event, std::initializer_list<LogField> fields = {});

// Like Log, but the caller only formats the line and queues it; a background thread writes it.
// For hot threads (the engine's) that must never wait on a slow or blocked stderr. When more
// than kAsyncLogQueueLines wait, new lines are dropped and a `log_lines_dropped` line says how
// many once the writer catches up.
void LogAsync(LogLevel level, absl::string_view event,
              std::initializer_list<LogField> fields = {});
// For lines whose fields are assembled at run time.
void LogAsync(LogLevel level, absl::string_view event, absl::Span<const LogField> fields);
inline constexpr size_t kAsyncLogQueueLines = 4096;
// Blocks until every line queued by LogAsync before the call has been written.
void FlushAsyncLog();

// The line Log would write (without the trailing newline), for a given time. Exposed so tests
// can check exact output.
std::string FormatLogLine(std::chrono::system_clock::time_point time, LogLevel level,
                          absl::string_view event, std::initializer_list<LogField> fields);
std::string FormatLogLine(std::chrono::system_clock::time_point time, LogLevel level,
                          absl::string_view event, absl::Span<const LogField> fields);

// Receives each line (without the trailing newline) instead of stderr; called under the log
// lock, so it need not be thread-safe but must not log. An empty function restores stderr.
using LogSink = std::function<void(absl::string_view line)>;
void SetLogSinkForTesting(LogSink sink);

}  // namespace specula
