#include "engine/grammar/token_mask.h"

#include <algorithm>
#include <numeric>
#include <string_view>

namespace specula::grammar {

TokenTable::TokenTable(const std::vector<std::string>& token_bytes)
    : vocab_size_(static_cast<int64_t>(token_bytes.size())) {
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    if (!token_bytes[id].empty()) ids_.push_back(static_cast<int32_t>(id));
  }
  std::sort(ids_.begin(), ids_.end(),
            [&](int32_t a, int32_t b) { return token_bytes[a] < token_bytes[b]; });
  offsets_.push_back(0);
  common_.reserve(ids_.size());
  std::string_view previous;
  for (const int32_t id : ids_) {
    const std::string& t = token_bytes[id];
    const auto mismatch = std::mismatch(previous.begin(), previous.end(), t.begin(), t.end());
    common_.push_back(static_cast<uint32_t>(mismatch.first - previous.begin()));
    bytes_ += t;
    offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
    previous = sorted_bytes(common_.size() - 1);  // the token just added
    max_length_ = std::max(max_length_, t.size());
  }
}

TokenMasker::TokenMasker(const TokenTable& table)
    : table_(table),
      states_(table.max_length_ + 1),
      escaped_(table.max_length_ + 1),
      left_(table.max_length_ + 1),
      filtered_(table.max_length_ + 1) {}

namespace {

void SetBit(std::vector<uint32_t>& bits, int32_t id) {
  bits[static_cast<size_t>(id) >> 5] |= uint32_t{1} << (id & 31);
}

}  // namespace

// states_[d + 1] from states_[d] and byte d of `token`, keeping only the stacks that take the
// token's next byte (all of them after its last byte).
bool TokenMasker::StepWithin(const Grammar& g, std::string_view token, size_t d, bool* escaped) {
  const int next = d + 1 < token.size() ? static_cast<uint8_t>(token[d + 1]) : -1;
  filtered_[d + 1] = next >= 0;
  return Step(g, states_[d], static_cast<uint8_t>(token[d]), &states_[d + 1], escaped, next);
}

// How many bytes of the previous token's states a token sharing `common` bytes with it can reuse:
// states_[common] was kept only for the previous token's next byte, which differs, unless it was
// that token's end.
size_t TokenMasker::Reusable(size_t common, size_t valid) const {
  const size_t d = std::min(common, valid);
  return d > 0 && filtered_[d] ? d - 1 : d;
}

MaskEntry TokenMasker::Classify(const Grammar& g, const StackSet& start, bool partial) {
  MaskEntry entry;
  entry.accepted.assign(table_.mask_words(), 0);
  states_[0] = start;
  escaped_[0] = left_[0] = filtered_[0] = 0;
  size_t valid = 0;  // states_[0..valid] hold for the previous token's prefix
  for (size_t i = 0; i < table_.ids_.size(); ++i) {
    const std::string_view token = table_.sorted_bytes(i);
    const size_t length = token.size();
    size_t d = Reusable(table_.common_[i], valid);
    for (; d < length && !states_[d].empty(); ++d) {
      bool escaped = false;
      if (!StepWithin(g, token, d, partial ? &escaped : nullptr)) {
        // Too ambiguous here: undecided, so the whole stack decides (as the matcher would,
        // refusing it if it overflows there too); never accepted on a partial view.
        states_[d + 1].Clear();
        escaped_[d + 1] = false;
        left_[d + 1] = true;
        continue;
      }
      escaped_[d + 1] = escaped;
      left_[d + 1] = left_[d] || escaped;
    }
    valid = d;
    if (d == length && (!states_[d].empty() || escaped_[d])) {
      SetBit(entry.accepted, table_.ids_[i]);
    } else if (left_[std::min(d, length - 1)]) {
      entry.uncertain.push_back(static_cast<uint32_t>(i));
    }
  }
  return entry;
}

void TokenMasker::Check(const Grammar& g, const StackSet& start,
                        const std::vector<uint32_t>& indices, std::vector<uint32_t>* allowed) {
  states_[0] = start;
  filtered_[0] = 0;
  size_t valid = 0;
  std::string_view previous;
  for (const uint32_t i : indices) {
    const std::string_view token = table_.sorted_bytes(i);
    const size_t common = static_cast<size_t>(
        std::mismatch(previous.begin(), previous.end(), token.begin(), token.end()).first -
        previous.begin());
    previous = token;
    size_t d = Reusable(common, valid);
    for (; d < token.size() && !states_[d].empty(); ++d) {
      if (!StepWithin(g, token, d, nullptr)) {
        states_[d + 1].Clear();  // narrows, never widens (StackSet::kMaxStacks)
      }
    }
    valid = d;
    if (d == token.size() && !states_[d].empty()) SetBit(*allowed, table_.ids_[i]);
  }
}

const MaskEntry& TokenMasker::Entry(const Grammar& g, const int32_t* begin, const int32_t* end,
                                    size_t frames, MaskCache* cache) {
  const bool partial = static_cast<size_t>(end - begin) > frames;
  std::vector<int32_t> key(partial ? end - frames : begin, end);
  if (!partial) key.push_back(-1);  // the whole stack: ending it ends the output
  auto it = cache->entries_.find(key);
  if (it == cache->entries_.end()) {
    StackSet start;
    start.Add(absl::MakeConstSpan(key).first(key.size() - (partial ? 0 : 1)));
    MaskEntry entry = Classify(g, start, partial);
    if (partial && entry.uncertain.size() > MaskCache::kMaxUncertain) entry = {{}, {}, true};
    // Full: drop an entry (any: it is rebuilt if needed again), so that a schema with many keys
    // keeps a working cache rather than walking the vocabulary at every step.
    if (cache->entries_.size() >= cache->max_entries_) {
      cache->entries_.erase(cache->entries_.begin());
    }
    it = cache->entries_.emplace(std::move(key), std::make_unique<MaskEntry>(std::move(entry)))
             .first;
  }
  if (it->second->deeper) return Entry(g, begin, end, frames + MaskCache::kKeyFrames, cache);
  return *it->second;
}

int64_t TokenMasker::Compute(const GrammarMatcher& matcher, MaskCache* cache,
                             std::vector<uint32_t>* allowed) {
  allowed->assign(table_.mask_words(), 0);
  const Grammar& g = matcher.grammar();
  const StackSet& stacks = matcher.stacks();
  if (cache == nullptr) {
    *allowed = Classify(g, stacks, /*partial=*/false).accepted;
  } else {
    StackSet whole;
    for (size_t s = 0; s < stacks.size(); ++s) {
      if (stacks.begin(s) == stacks.end(s)) continue;  // complete: only end tokens follow
      const MaskEntry& entry =
          Entry(g, stacks.begin(s), stacks.end(s), MaskCache::kKeyFrames, cache);
      for (size_t w = 0; w < allowed->size(); ++w) (*allowed)[w] |= entry.accepted[w];
      if (entry.uncertain.empty()) continue;
      whole.Clear();
      whole.Add(absl::MakeConstSpan(stacks.begin(s), stacks.end(s)));
      Check(g, whole, entry.uncertain, allowed);
    }
  }
  int64_t count = 0;
  for (const uint32_t w : *allowed) count += __builtin_popcount(w);
  return count;
}

}  // namespace specula::grammar
