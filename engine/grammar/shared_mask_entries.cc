#include "engine/grammar/shared_mask_entries.h"

#include <algorithm>
#include <utility>

namespace specula::grammar {
namespace {

size_t BytesOf(const std::string& signature, const MaskEntry& e) {
  return signature.size() + e.accepted.size() * sizeof(uint32_t) +
         e.uncertain.size() * sizeof(uint32_t) + e.need.size() +
         e.escaping.size() * sizeof(uint32_t);
}

}  // namespace

std::shared_ptr<const MaskEntry> SharedMaskEntries::Find(const std::string& signature) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = slots_.find(signature);
  if (it == slots_.end()) return nullptr;
  it->second.last_used = ++clock_;
  ++hits_;
  return it->second.entry;
}

void SharedMaskEntries::Add(const std::string& signature, std::shared_ptr<const MaskEntry> entry) {
  const size_t bytes = BytesOf(signature, *entry);
  if (bytes > max_bytes_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (slots_.contains(signature)) return;
  EvictPast(max_bytes_ - bytes);
  slots_.emplace(signature, Slot{std::move(entry), bytes, ++clock_});
  bytes_ += bytes;
}

void SharedMaskEntries::EvictPast(size_t limit) {
  while (bytes_ > limit && !slots_.empty()) {
    const auto oldest = std::min_element(
        slots_.begin(), slots_.end(),
        [](const auto& a, const auto& b) { return a.second.last_used < b.second.last_used; });
    bytes_ -= oldest->second.bytes;
    slots_.erase(oldest);
  }
}

size_t SharedMaskEntries::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.size();
}

int64_t SharedMaskEntries::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

}  // namespace specula::grammar
