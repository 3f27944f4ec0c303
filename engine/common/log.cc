#include "engine/common/log.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace specula {
namespace {

std::mutex& SinkMutex() {
  static std::mutex* mu = new std::mutex;  // never destroyed: threads may log during exit
  return *mu;
}

LogSink& Sink() {
  static LogSink* sink = new LogSink;
  return *sink;
}

// logfmt leaves a value bare only when a parser cannot misread it.
bool NeedsQuotes(absl::string_view v) {
  if (v.empty()) return true;
  for (unsigned char c : v) {
    if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c == 0x7f) return true;
  }
  return false;
}

void AppendValue(absl::string_view v, std::string* out) {
  if (!NeedsQuotes(v)) {
    out->append(v.data(), v.size());
    return;
  }
  out->push_back('"');
  for (unsigned char c : v) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < ' ' || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02x", c);
          out->append(buf);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

// Keys come from code, but a stray space or '=' would make every later pair unparseable.
void AppendKey(absl::string_view key, std::string* out) {
  if (key.empty()) {
    out->append("_");
    return;
  }
  for (unsigned char c : key) {
    out->push_back(c <= ' ' || c == '"' || c == '=' || c == 0x7f ? '_' : static_cast<char>(c));
  }
}

void AppendTimestamp(std::chrono::system_clock::time_point time, std::string* out) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count();
  // Floor division so times before the epoch still print a valid millisecond field.
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  int64_t millis = ms % 1000;
  if (millis < 0) {
    millis += 1000;
    --secs;
  }
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(millis));
  out->append(buf);
}

void WriteStderr(const std::string& line) {
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // nowhere left to report a failing stderr
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// Writes one finished line (no newline yet) to the sink or stderr, under the log lock.
void WriteLine(std::string line) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  LogSink& sink = Sink();
  if (sink) {
    sink(line);
    return;
  }
  line.push_back('\n');
  WriteStderr(line);
}


}  // namespace

absl::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "unknown";
}

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warning" || lower == "warn") return LogLevel::kWarning;
  if (lower == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("invalid log level '", name, "': expected one of debug, info, warning, error"));
}

void LogField::AppendTo(std::string* out) const {
  AppendKey(key_, out);
  out->push_back('=');
  switch (kind_) {
    case Kind::kString:
      AppendValue(str_, out);
      break;
    case Kind::kBool:
      out->append(b_ ? "true" : "false");
      break;
    case Kind::kInt:
      absl::StrAppend(out, i_);
      break;
    case Kind::kUint:
      absl::StrAppend(out, u_);
      break;
    case Kind::kDouble:
      AppendValue(absl::StrCat(d_), out);
      break;
  }
}

std::string FormatLogLine(std::chrono::system_clock::time_point time, LogLevel level,
                          absl::string_view event, absl::Span<const LogField> fields) {
  std::string line;
  line.reserve(128);
  line.append("ts=");
  AppendTimestamp(time, &line);
  line.append(" level=");
  const absl::string_view name = LogLevelName(level);
  line.append(name.data(), name.size());
  line.append(" event=");
  AppendValue(event, &line);
  for (const LogField& field : fields) {
    line.push_back(' ');
    field.AppendTo(&line);
  }
  return line;
}

std::string FormatLogLine(std::chrono::system_clock::time_point time, LogLevel level,
                          absl::string_view event, std::initializer_list<LogField> fields) {
  return FormatLogLine(time, level, event, absl::MakeConstSpan(fields.begin(), fields.size()));
}

void Log(LogLevel level, absl::string_view event, std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) return;
  WriteLine(FormatLogLine(std::chrono::system_clock::now(), level, event,
                          absl::MakeConstSpan(fields.begin(), fields.size())));
}

namespace {

// The background writer of LogAsync. Created on first use and never destroyed, so lines queued
// by threads that outlive main's objects still have somewhere to go.
class AsyncLogWriter {
 public:
  static AsyncLogWriter& Get() {
    static AsyncLogWriter* writer = new AsyncLogWriter;
    return *writer;
  }

  void Post(std::string line) {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= kAsyncLogQueueLines) {
      ++dropped_;
      return;
    }
    queue_.push_back(std::move(line));
    ++posted_;
    work_.notify_one();
  }

  void Flush() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = posted_;
    done_.wait(lock, [&] { return written_ >= target; });
  }

 private:
  AsyncLogWriter() { std::thread([this] { Loop(); }).detach(); }

  void Loop() {
    std::vector<std::string> batch;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      work_.wait(lock, [&] { return !queue_.empty(); });
      batch.swap(queue_);
      const uint64_t dropped = std::exchange(dropped_, 0);
      lock.unlock();
      for (std::string& line : batch) WriteLine(std::move(line));
      if (dropped > 0) {
        WriteLine(FormatLogLine(std::chrono::system_clock::now(), LogLevel::kWarning,
                                "log_lines_dropped", {{"lines", dropped}}));
      }
      lock.lock();
      written_ += batch.size();
      batch.clear();
      done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable done_;
  std::vector<std::string> queue_;
  uint64_t dropped_ = 0;
  uint64_t posted_ = 0;
  uint64_t written_ = 0;
};

}  // namespace

void LogAsync(LogLevel level, absl::string_view event, std::initializer_list<LogField> fields) {
  LogAsync(level, event, absl::MakeConstSpan(fields.begin(), fields.size()));
}

void LogAsync(LogLevel level, absl::string_view event, absl::Span<const LogField> fields) {
  if (!LogEnabled(level)) return;
  AsyncLogWriter::Get().Post(
      FormatLogLine(std::chrono::system_clock::now(), level, event, fields));
}

void FlushAsyncLog() { AsyncLogWriter::Get().Flush(); }

void SetLogSinkForTesting(LogSink sink) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  Sink() = std::move(sink);
}

}  // namespace specula
