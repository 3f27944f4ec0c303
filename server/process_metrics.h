// The standard process_* metrics every Prometheus client library exports (prometheus-cpp 1.0 has
// no collector for them): CPU seconds, resident and virtual memory, open and maximum file
// descriptors, start time. Read from /proc at each scrape, so they cost nothing in between.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace specula {

struct ProcessStats {
  double cpu_seconds = 0;  // user + system
  double resident_bytes = 0;
  double virtual_bytes = 0;
  double open_fds = 0;
  double max_fds = 0;             // the soft limit
  double start_time_seconds = 0;  // since the Unix epoch
};

// This process's figures; UNAVAILABLE naming the file when /proc cannot be read.
absl::StatusOr<ProcessStats> ReadProcessStats();

class ProcessMetrics : public prometheus::Collectable {
 public:
  // process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
  // process_open_fds, process_max_fds, process_start_time_seconds; nothing when /proc cannot
  // be read.
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace specula
