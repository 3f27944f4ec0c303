// The monotonic clock in seconds: a reading (MonotonicSeconds) and the time between calls to
// Lap (Stopwatch; the first counts from construction).
#pragma once

#include <chrono>

namespace specula {

// Seconds on a monotonic clock (steady_clock), for differences between two readings.
inline double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Stopwatch {
 public:
  double Lap() {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return seconds;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace specula
