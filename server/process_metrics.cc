#include "server/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace specula {
namespace {

absl::StatusOr<std::string> ReadProc(const char* path) {
  std::ifstream in(path);
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The system's boot time (seconds since the epoch): /proc/stat's btime.
absl::StatusOr<double> BootTime() {
  absl::StatusOr<std::string> stat = ReadProc("/proc/stat");
  if (!stat.ok()) return stat.status();
  for (absl::string_view line : absl::StrSplit(*stat, '\n')) {
    if (absl::ConsumePrefix(&line, "btime ")) return std::stod(std::string(line));
  }
  return absl::UnavailableError("/proc/stat has no btime");
}

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type,
                                double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(m);
  return f;
}

}  // namespace

absl::StatusOr<ProcessStats> ReadProcessStats() {
  absl::StatusOr<std::string> stat = ReadProc("/proc/self/stat");
  if (!stat.ok()) return stat.status();
  // The fields after the command name, which is in parentheses and may hold spaces.
  const size_t close = stat->rfind(')');
  if (close == std::string::npos) return absl::UnavailableError("/proc/self/stat is malformed");
  const std::vector<std::string> f = absl::StrSplit(stat->substr(close + 2), ' ');
  // proc(5) numbers the fields from 1 with the pid; here field 3 (state) is f[0].
  auto field = [&f](size_t n) { return n - 3 < f.size() ? std::stod(f[n - 3]) : 0.0; };
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  absl::StatusOr<double> boot = BootTime();
  if (!boot.ok()) return boot.status();
  ProcessStats s;
  s.cpu_seconds = (field(14) + field(15)) / ticks;
  s.start_time_seconds = *boot + field(22) / ticks;
  s.virtual_bytes = field(23);
  s.resident_bytes = field(24) * page;
  std::error_code error;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++s.open_fds;
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) s.max_fds = static_cast<double>(limit.rlim_cur);
  return s;
}

std::vector<prometheus::MetricFamily> ProcessMetrics::Collect() const {
  absl::StatusOr<ProcessStats> s = ReadProcessStats();
  if (!s.ok()) return {};
  using prometheus::MetricType;
  return {
      Family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
             MetricType::Counter, s->cpu_seconds),
      Family("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge,
             s->resident_bytes),
      Family("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge,
             s->virtual_bytes),
      Family("process_open_fds", "Number of open file descriptors.", MetricType::Gauge,
             s->open_fds),
      Family("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge,
             s->max_fds),
      Family("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
             MetricType::Gauge, s->start_time_seconds),
  };
}

}  // namespace specula
