// Token mask cache entries shared by every grammar over one vocabulary (issue 38: a string's
// first walk blocked the batch step for 50-90 ms, once per schema).
//
// A MaskCache is a grammar's own, keyed by grammar positions. But the walks that cost the most,
// those inside a JSON string (nearly every token takes its characters), see the same few rules
// in every schema (WalkSignature). Kept here by their signatures, they are walked once per process
// and vocabulary, not once per schema: a new schema's first request finds its strings classified.
//
// Thread-safe: the engine's mask worker and other maskers may share one. Entries are immutable
// once added. Bounded by their bytes: past `max_bytes`, the entry used longest ago goes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "engine/grammar/token_mask.h"

namespace specula::grammar {

class SharedMaskEntries {
 public:
  // An anchor's entry at a 128K vocabulary is ~145 KB, a plain one ~16 KB.
  explicit SharedMaskEntries(size_t max_bytes = size_t{64} << 20) : max_bytes_(max_bytes) {}

  // The entry walked for `signature`, or null.
  std::shared_ptr<const MaskEntry> Find(const std::string& signature);
  // Keeps `entry` for `signature` (one already there stays: the walks are equal).
  void Add(const std::string& signature, std::shared_ptr<const MaskEntry> entry);

  size_t size() const;
  int64_t hits() const;

 private:
  struct Slot {
    std::shared_ptr<const MaskEntry> entry;
    size_t bytes = 0;
    uint64_t last_used = 0;
  };
  void EvictPast(size_t limit);  // mu_ held

  const size_t max_bytes_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, Slot> slots_;
  size_t bytes_ = 0;
  uint64_t clock_ = 0;
  int64_t hits_ = 0;
};

}  // namespace specula::grammar
