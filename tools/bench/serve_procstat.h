// CPU time of a local process per thread name, from /proc (Linux): `specula-bench serve
// --server-pid` uses it to split a co-located server's CPU between its engine threads and gRPC's.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace specula {

using BenchClock = std::chrono::steady_clock;

inline double Seconds(BenchClock::time_point from, BenchClock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// User + system CPU seconds of this process so far.
double ProcessCpuSeconds();

// Seconds of user + system time so far, summed over the live threads of each name.
absl::StatusOr<std::map<std::string, double>> ThreadCpuByName(int pid);

// after - before per name (threads that ended in between are lost; names absent before count
// from 0), dropping names under `min_seconds`.
std::map<std::string, double> CpuDelta(const std::map<std::string, double>& before,
                                       const std::map<std::string, double>& after,
                                       double min_seconds);

}  // namespace specula
