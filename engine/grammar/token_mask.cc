#include "engine/grammar/token_mask.h"

#include <algorithm>
#include <numeric>
#include <string_view>

#include "engine/common/thread_pool.h"

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

TokenMasker::Walk::Walk(size_t max_length)
    : states(max_length + 1),
      escaped(max_length + 1),
      left(max_length + 1),
      filtered(max_length + 1) {}

namespace {

// Chunks of a parallel walk per thread: a few, so a thread whose chunk is cheap takes another.
constexpr int kChunksPerThread = 4;

}  // namespace

TokenMasker::TokenMasker(const TokenTable& table, int threads, size_t min_chunk_tokens)
    : table_(table),
      threads_(std::max(1, threads)),
      min_chunk_tokens_(std::max<size_t>(1, min_chunk_tokens)) {
  const size_t chunks = threads_ > 1 ? static_cast<size_t>(threads_) * kChunksPerThread : 1;
  walks_.reserve(chunks);
  for (size_t i = 0; i < chunks; ++i) walks_.emplace_back(table.max_length_);
}

TokenMasker::~TokenMasker() = default;

namespace {

void SetBit(std::vector<uint32_t>& bits, int32_t id) {
  bits[static_cast<size_t>(id) >> 5] |= uint32_t{1} << (id & 31);
}

}  // namespace

// walk.states[d + 1] from walk.states[d] and byte d of `token`, keeping only the stacks that
// take the token's next byte (all of them after its last byte).
bool TokenMasker::StepWithin(const Grammar& g, std::string_view token, size_t d, bool* escaped,
                             Walk& walk) {
  const int next = d + 1 < token.size() ? static_cast<uint8_t>(token[d + 1]) : -1;
  walk.filtered[d + 1] = next >= 0;
  return Step(g, walk.states[d], static_cast<uint8_t>(token[d]), &walk.states[d + 1], escaped,
              next);
}

// How many bytes of the previous token's states a token sharing `common` bytes with it can reuse:
// states[common] was kept only for the previous token's next byte, which differs, unless it was
// that token's end.
size_t TokenMasker::Reusable(const Walk& walk, size_t common, size_t valid) {
  const size_t d = std::min(common, valid);
  return d > 0 && walk.filtered[d] ? d - 1 : d;
}

void TokenMasker::ClassifyRange(const Grammar& g, const StackSet& start, bool partial, size_t first,
                                size_t last, Walk& walk, MaskEntry* entry) {
  walk.states[0] = start;
  walk.escaped[0] = walk.left[0] = walk.filtered[0] = 0;
  size_t valid = 0;  // states[0..valid] hold for the previous token's prefix
  for (size_t i = first; i < last; ++i) {
    const std::string_view token = table_.sorted_bytes(i);
    const size_t length = token.size();
    size_t d = i == first ? 0 : Reusable(walk, table_.common_[i], valid);
    for (; d < length && !walk.states[d].empty(); ++d) {
      bool escaped = false;
      if (!StepWithin(g, token, d, partial ? &escaped : nullptr, walk)) {
        // Too ambiguous here: undecided, so the whole stack decides (as the matcher would,
        // refusing it if it overflows there too); never accepted on a partial view.
        walk.states[d + 1].Clear();
        walk.escaped[d + 1] = false;
        walk.left[d + 1] = true;
        continue;
      }
      walk.escaped[d + 1] = escaped;
      walk.left[d + 1] = walk.left[d] || escaped;
    }
    valid = d;
    if (d == length && (!walk.states[d].empty() || walk.escaped[d])) {
      SetBit(entry->accepted, table_.ids_[i]);
    } else if (walk.left[std::min(d, length - 1)]) {
      entry->uncertain.push_back(static_cast<uint32_t>(i));
    }
  }
}

MaskEntry TokenMasker::Classify(const Grammar& g, const StackSet& start, bool partial) {
  const size_t n = table_.ids_.size();
  const size_t chunks = std::min(walks_.size(), std::max<size_t>(1, n / min_chunk_tokens_));
  MaskEntry entry;
  entry.accepted.assign(table_.mask_words(), 0);
  if (chunks <= 1) {
    ClassifyRange(g, start, partial, 0, n, walks_[0], &entry);
    return entry;
  }
  if (pool_ == nullptr) pool_ = std::make_unique<ThreadPool>(threads_);
  std::vector<MaskEntry> parts(chunks);
  pool_->ParallelFor(static_cast<int64_t>(chunks), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      MaskEntry& part = parts[static_cast<size_t>(c)];
      part.accepted.assign(table_.mask_words(), 0);
      ClassifyRange(g, start, partial, n * c / chunks, n * (c + 1) / chunks,
                    walks_[static_cast<size_t>(c)], &part);
    }
  });
  for (const MaskEntry& part : parts) {
    for (size_t w = 0; w < entry.accepted.size(); ++w) entry.accepted[w] |= part.accepted[w];
    entry.uncertain.insert(entry.uncertain.end(), part.uncertain.begin(), part.uncertain.end());
  }
  return entry;
}

void TokenMasker::Check(const Grammar& g, const StackSet& start,
                        const std::vector<uint32_t>& indices, std::vector<uint32_t>* allowed) {
  Walk& walk = walks_[0];
  walk.states[0] = start;
  walk.filtered[0] = 0;
  size_t valid = 0;
  std::string_view previous;
  for (const uint32_t i : indices) {
    const std::string_view token = table_.sorted_bytes(i);
    const size_t common = static_cast<size_t>(
        std::mismatch(previous.begin(), previous.end(), token.begin(), token.end()).first -
        previous.begin());
    previous = token;
    size_t d = Reusable(walk, common, valid);
    for (; d < token.size() && !walk.states[d].empty(); ++d) {
      if (!StepWithin(g, token, d, nullptr, walk)) {
        walk.states[d + 1].Clear();  // narrows, never widens (StackSet::kMaxStacks)
      }
    }
    valid = d;
    if (d == token.size() && !walk.states[d].empty()) SetBit(*allowed, table_.ids_[i]);
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
