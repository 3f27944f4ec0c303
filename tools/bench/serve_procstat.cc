#include "tools/bench/serve_procstat.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace specula {

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto tv = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return tv(u.ru_utime) + tv(u.ru_stime);
}

absl::StatusOr<std::map<std::string, double>> ThreadCpuByName(int pid) {
  namespace fs = std::filesystem;
  const fs::path tasks = absl::StrCat("/proc/", pid, "/task");
  std::error_code ec;
  fs::directory_iterator it(tasks, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("--server-pid: no process ", pid));
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  std::map<std::string, double> out;
  for (const fs::directory_entry& task : it) {
    std::ifstream f(task.path() / "stat");
    std::string line;
    if (!std::getline(f, line)) continue;  // the thread just ended
    // "tid (comm) state ppid ...": comm may hold spaces and parentheses, so cut at the last ')'.
    const size_t open = line.find('(');
    const size_t close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close + 2 > line.size()) {
      continue;
    }
    std::istringstream rest(line.substr(close + 2));
    std::vector<std::string> fields;
    for (std::string x; rest >> x;) fields.push_back(x);
    // After comm: state is field 0, utime field 11, stime field 12.
    if (fields.size() < 13) continue;
    out[line.substr(open + 1, close - open - 1)] +=
        (std::stod(fields[11]) + std::stod(fields[12])) / tick;
  }
  return out;
}

std::map<std::string, double> CpuDelta(const std::map<std::string, double>& before,
                                       const std::map<std::string, double>& after,
                                       double min_seconds) {
  std::map<std::string, double> out;
  for (const auto& [name, t] : after) {
    auto b = before.find(name);
    const double d = t - (b == before.end() ? 0 : b->second);
    if (d >= min_seconds) out[name] = d;
  }
  return out;
}

}  // namespace specula
