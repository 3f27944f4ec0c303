// The metric families the sparse KV cache adds (issue 4) and their types: what both the metrics
// unit test and the sparse end-to-end test expect /metrics to expose.
#pragma once

#include <map>
#include <string>

namespace specula::testing {

inline const std::map<std::string, std::string>& SparseMetricFamilies() {
  static const std::map<std::string, std::string> families = {
      {"specula_prefetch_hits_total", "counter"},
      {"specula_prefetch_misses_total", "counter"},
      {"specula_prefetch_late_total", "counter"},
      {"specula_prefetch_hit_ratio", "gauge"},
      {"specula_prefetch_bytes_total", "counter"},
      {"specula_prefetch_latency_seconds", "histogram"},
      {"specula_decode_stall_seconds_total", "counter"},
      {"specula_decode_fetch_bytes_total", "counter"},
      {"specula_kv_host_pages_used", "gauge"},
      {"specula_kv_host_pages_capacity", "gauge"},
      {"specula_kv_device_slots_used", "gauge"},
  };
  return families;
}

}  // namespace specula::testing
