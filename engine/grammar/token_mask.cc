#include "engine/grammar/token_mask.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <iterator>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>

#include "engine/common/thread_pool.h"
#include "engine/grammar/shared_mask_entries.h"
#include "engine/grammar/stack_keys.h"
#include "engine/grammar/walk_signature.h"

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
  // Sorted by unsigned bytes (char_traits<char>::lt), so each first byte's tokens are a range.
  first_byte_.fill(static_cast<uint32_t>(ids_.size()));
  for (size_t i = ids_.size(); i-- > 0;) {
    first_byte_[static_cast<uint8_t>(bytes_[offsets_[i]])] = static_cast<uint32_t>(i);
  }
  for (int b = 255; b >= 0; --b) first_byte_[b] = std::min(first_byte_[b], first_byte_[b + 1]);
  // Next smaller element, from the right: `later` holds the candidates, common_ ascending from
  // its bottom.
  next_shorter_.assign(ids_.size(), static_cast<uint32_t>(ids_.size()));
  std::vector<uint32_t> later;
  for (size_t i = ids_.size(); i-- > 0;) {
    while (!later.empty() && common_[later.back()] >= common_[i]) later.pop_back();
    if (!later.empty()) next_shorter_[i] = later.back();
    later.push_back(static_cast<uint32_t>(i));
  }
}

size_t TokenTable::PastPrefix(size_t i, size_t prefix, size_t last) const {
  // Token m shares `prefix` bytes with i exactly when every common_ in (i, m] is at least
  // `prefix`; a run of common_ at or above common_[m] ends at next_shorter_[m]. Each jump lowers
  // common_, so there are at most as many jumps as token i + 1 is long, not one per token. The
  // token returned shares exactly its common_ bytes with i (the least common_ of the range), so
  // the walk's reuse of i's states stays right.
  size_t m = i + 1;
  while (m < last && common_[m] >= prefix) m = next_shorter_[m];
  return std::min(m, last);
}

TokenMasker::Walk::Walk(size_t max_length)
    : states(max_length + 1),
      escaped(max_length + 1),
      left(max_length + 1),
      filtered(max_length + 1),
      escape_need(max_length + 1) {}

namespace {

// Chunks of a parallel walk per thread: a few, so a thread whose chunk is cheap takes another.
constexpr int kChunksPerThread = 4;

TokenMaskerOptions Checked(TokenMaskerOptions o) {
  o.threads = std::max(1, o.threads);
  o.min_chunk_tokens = std::max<size_t>(1, o.min_chunk_tokens);
  o.costly_fraction = std::max<size_t>(1, o.costly_fraction);
  return o;
}

}  // namespace

TokenMasker::TokenMasker(const TokenTable& table, TokenMaskerOptions options)
    : table_(table), options_(Checked(options)) {
  const size_t chunks =
      options_.threads > 1 ? static_cast<size_t>(options_.threads) * kChunksPerThread : 1;
  walks_.reserve(chunks);
  for (size_t i = 0; i < chunks; ++i) walks_.emplace_back(table.max_length_);
}

TokenMasker::~TokenMasker() = default;

namespace {

void SetBit(std::vector<uint32_t>& bits, int32_t id) {
  bits[static_cast<size_t>(id) >> 5] |= uint32_t{1} << (id & 31);
}

// Bit b set where need[b] <= count, for 32 needs: a derived entry's words (TokenMasker::Derive
// runs it over the whole vocabulary at each count a repetition meets).
uint32_t AtMost(const uint8_t* need, uint8_t count) {
#if defined(__SSE2__)
  const __m128i limit = _mm_set1_epi8(static_cast<char>(count));
  uint32_t bits = 0;
  for (int half = 0; half < 2; ++half) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(need + 16 * half));
    // Unsigned v <= count exactly when max(v, count) == count.
    const __m128i at_most = _mm_cmpeq_epi8(_mm_max_epu8(v, limit), limit);
    bits |= static_cast<uint32_t>(_mm_movemask_epi8(at_most) & 0xFFFF) << (16 * half);
  }
  return bits;
#else
  uint32_t bits = 0;
  for (int b = 0; b < 32; ++b) bits |= static_cast<uint32_t>(need[b] <= count) << b;
  return bits;
#endif
}

}  // namespace

// walk.states[d + 1] from walk.states[d] and byte d of `token`, keeping only the stacks that
// take the token's next byte (all of them after its last byte).
bool TokenMasker::StepWithin(const Grammar& g, std::string_view token, size_t d, bool* escaped,
                             Walk& walk, RepeatWatch* watch) {
  const int next = d + 1 < token.size() ? static_cast<uint8_t>(token[d + 1]) : -1;
  walk.filtered[d + 1] = next >= 0;
  const bool ok = Step(g, walk.states[d], static_cast<uint8_t>(token[d]), &walk.states[d + 1],
                       escaped, next, watch);
  if (watch != nullptr) walk.escape_need[d + 1] = watch->escape_need;
  return ok;
}

// How many bytes of the previous token's states a token sharing `common` bytes with it can reuse:
// states[common] was kept only for the previous token's next byte, which differs, unless it was
// that token's end.
size_t TokenMasker::Reusable(const Walk& walk, size_t common, size_t valid) {
  const size_t d = std::min(common, valid);
  return d > 0 && walk.filtered[d] ? d - 1 : d;
}

void TokenMasker::ClassifyRange(const Grammar& g, const StackSet& start, bool partial,
                                const RepeatWatch* anchor, size_t first, size_t last, Walk& walk,
                                MaskEntry* entry, std::vector<uint8_t>* need) {
  std::optional<RepeatWatch> watch;  // this chunk's: Step writes its escape_need
  if (anchor != nullptr) watch = *anchor;
  walk.states[0] = start;
  walk.escaped[0] = walk.left[0] = walk.filtered[0] = 0;
  // Only the tokens whose first byte some stack takes: a key inside a literal (a property name)
  // walks a few hundred tokens, not the vocabulary.
  const ByteSet firsts = FirstBytes(g, start);
  for (int b = 0; b < 256; ++b) {
    if (!firsts.Contains(static_cast<uint8_t>(b))) continue;
    const size_t lo = std::max(first, static_cast<size_t>(table_.first_byte_[b]));
    const size_t hi = std::min(last, static_cast<size_t>(table_.first_byte_[b + 1]));
    if (lo < hi) ClassifyTokens(g, partial, lo, hi, walk, watch ? &*watch : nullptr, entry, need);
  }
}

size_t TokenMasker::Visits(const Grammar& g, const StackSet& start) const {
  return Visits(FirstBytes(g, start));
}

size_t TokenMasker::Visits(const ByteSet& firsts) const {
  size_t visits = 0;
  for (int b = 0; b < 256; ++b) {
    if (firsts.Contains(static_cast<uint8_t>(b))) {
      visits += table_.first_byte_[b + 1] - table_.first_byte_[b];
    }
  }
  return visits;
}

ByteSet TokenMasker::FirstBytes(const Grammar& g, const StackSet& start) const {
  ByteSet firsts;
  for (size_t s = 0; s < start.size(); ++s) {
    if (start.begin(s) != start.end(s)) firsts |= g.bytes(*(start.end(s) - 1));
  }
  return firsts;
}

void TokenMasker::ClassifyTokens(const Grammar& g, bool partial, size_t first, size_t last,
                                 Walk& walk, RepeatWatch* watch, MaskEntry* entry,
                                 std::vector<uint8_t>* need) {
  size_t valid = 0;  // states[0..valid] hold for the previous token's prefix
  for (size_t i = first; i < last; ++i) {
    const std::string_view token = table_.sorted_bytes(i);
    const size_t length = token.size();
    size_t d = i == first ? 0 : Reusable(walk, table_.common_[i], valid);
    for (; d < length && !walk.states[d].empty(); ++d) {
      bool escaped = false;
      if (!StepWithin(g, token, d, partial ? &escaped : nullptr, walk, watch)) {
        // Too ambiguous here: undecided, so the whole stack decides at each step (Check refuses
        // it if it overflows there too, as a walk without cache does); never accepted here. An
        // anchor's walk follows more stacks than a smaller count's (one per count still inside):
        // where it overflows, the count's own stack may not.
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
      if (watch == nullptr) continue;
      (*need)[table_.ids_[i]] = static_cast<uint8_t>(
          NeedOf(g, *watch, walk.states[d], walk.escaped[d], walk.escape_need[d]));
      if (walk.left[length - 1]) entry->escaping.push_back(static_cast<uint32_t>(i));
    } else if (walk.left[d]) {  // after the last byte, only an overflow sets it
      entry->uncertain.push_back(static_cast<uint32_t>(i));
    } else {
      // Refused, and nothing left the frames: no stack takes its first d bytes (its first d + 1
      // when states[d] kept only the stacks taking byte d). Every following token starting with
      // them would stop at the same empty state: jump past them all (a whitespace key walks the
      // ~50K tokens starting with a space, which this reduces to their distinct second bytes).
      i = table_.PastPrefix(i, d + (walk.filtered[d] ? 1 : 0), last) - 1;
    }
  }
}

// A stack that left the repetition carries its need; one still inside has it from its frame at
// the watched depth. Accepted tokens' needs are at most the anchor's count
// (MaskCache::kMaxAnchor), below MaskEntry::kNever.
uint16_t TokenMasker::NeedOf(const Grammar& g, const RepeatWatch& watch, const StackSet& s,
                             bool escaped, uint16_t escape_need) {
  uint16_t need = escaped ? escape_need : RepeatWatch::kNone;
  for (size_t i = 0; i < s.size(); ++i) {
    const uint16_t tag = s.tag(i);
    need = std::min(
        need, tag != StackSet::kNoTag ? tag : watch.NeedInside(g, *(s.begin(i) + watch.depth)));
  }
  return std::min<uint16_t>(need, static_cast<uint16_t>(watch.anchor));
}

MaskEntry TokenMasker::Classify(const Grammar& g, const StackSet& start, bool partial,
                                const RepeatWatch* anchor) {
  const size_t n = table_.ids_.size();
  const size_t chunks = std::min(walks_.size(), std::max<size_t>(1, n / options_.min_chunk_tokens));
  MaskEntry entry;
  entry.accepted.assign(table_.mask_words(), 0);
  if (anchor != nullptr)
    entry.need.assign(static_cast<size_t>(table_.vocab_size()), MaskEntry::kNever);
  if (chunks <= 1) {
    ClassifyRange(g, start, partial, anchor, 0, n, walks_[0], &entry, &entry.need);
    return entry;
  }
  if (pool_ == nullptr) pool_ = std::make_unique<ThreadPool>(options_.threads);
  std::vector<MaskEntry> parts(chunks);
  pool_->ParallelFor(static_cast<int64_t>(chunks), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      MaskEntry& part = parts[static_cast<size_t>(c)];
      part.accepted.assign(table_.mask_words(), 0);
      ClassifyRange(g, start, partial, anchor, n * c / chunks, n * (c + 1) / chunks,
                    walks_[static_cast<size_t>(c)], &part, &entry.need);
    }
  });
  for (const MaskEntry& part : parts) {
    for (size_t w = 0; w < entry.accepted.size(); ++w) entry.accepted[w] |= part.accepted[w];
    entry.uncertain.insert(entry.uncertain.end(), part.uncertain.begin(), part.uncertain.end());
    entry.escaping.insert(entry.escaping.end(), part.escaping.begin(), part.escaping.end());
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

namespace {

// An entry that leaves too many tokens uncertain: a pointer to a key with more frames.
MaskEntry Deeper() {
  MaskEntry entry;
  entry.deeper = true;
  return entry;
}

// `entry`, or Deeper() where a partial key leaves more than MaskCache::kMaxUncertain tokens to
// the whole stack (checking them at every step would cost more than more keys).
MaskEntry DeeperIfTooUncertain(MaskEntry entry, bool partial) {
  if (partial && entry.uncertain.size() > MaskCache::kMaxUncertain) return Deeper();
  return entry;
}

}  // namespace

const MaskEntry& TokenMasker::Insert(MaskCache* cache, std::vector<int32_t> key,
                                     std::shared_ptr<const MaskEntry> entry) {
  // Full: drop an entry, so that a schema with many keys keeps a working cache rather than
  // walking the vocabulary at every step. A derived one if there is one (rebuilding it takes a
  // pass over an anchor's needs, not a walk), else one that is not an anchor (the anchor just
  // built is what the entry being added came from), else any.
  if (cache->entries_.size() >= cache->max_entries_) {
    auto& entries = cache->entries_;
    auto victim = std::find_if(entries.begin(), entries.end(),
                               [](const auto& e) { return e.second->derived; });
    if (victim == entries.end()) {
      victim = std::find_if(entries.begin(), entries.end(),
                            [](const auto& e) { return e.second->need.empty(); });
    }
    entries.erase(victim != entries.end() ? victim : entries.begin());
  }
  return *cache->entries_.emplace(std::move(key), std::move(entry)).first->second;
}

std::optional<std::string> TokenMasker::SharedSignature(const Grammar& g, const StackSet& start,
                                                        absl::Span<const int32_t> frames,
                                                        bool partial,
                                                        const RepeatWatch* anchor) const {
  if (options_.shared == nullptr || !MayBeCostly(Visits(g, start))) return std::nullopt;
  return WalkSignature(g, frames, partial, anchor, kMaxSharedPositions);
}

bool TokenMasker::Costly(const MaskEntry& entry) const {
  size_t accepted = 0;
  for (const uint32_t w : entry.accepted) accepted += static_cast<size_t>(__builtin_popcount(w));
  return MayBeCostly(accepted);
}

bool TokenMasker::MayBeCostly(size_t visits) const {
  return visits * options_.costly_fraction >= table_.ids_.size();
}

std::shared_ptr<const MaskEntry> TokenMasker::Walked(const Grammar& g,
                                                     const std::vector<int32_t>& key, bool partial,
                                                     const RepeatWatch* anchor, MaskCache* cache) {
  const auto frames = absl::MakeConstSpan(key).first(key.size() - (partial ? 0 : 1));
  StackSet start;
  start.Add(frames);
  const std::optional<std::string> signature = SharedSignature(g, start, frames, partial, anchor);
  if (signature) {
    if (std::shared_ptr<const MaskEntry> found = options_.shared->Find(*signature)) {
      ++cache->shared_hits_;
      return found;
    }
  }
  auto entry = std::make_shared<const MaskEntry>(
      DeeperIfTooUncertain(Classify(g, start, partial, anchor), partial));
  ++cache->walks_;
  if (!Costly(*entry)) return entry;
  ++cache->costly_walks_;
  if (signature) options_.shared->Add(*signature, entry);
  return entry;
}

int32_t TokenMasker::AnchorCount(const Grammar& g, int32_t repeat) const {
  // Counts past the longest token's bytes (one repetition takes a byte at least) allow the same
  // tokens: the anchor stands for them all. A longer token can need any count below.
  return std::min({g.repeat_max(repeat), NoTokenLonger(), MaskCache::kMaxAnchor});
}

std::shared_ptr<const MaskEntry> TokenMasker::FromAnchor(const Grammar& g,
                                                         const std::vector<int32_t>& key,
                                                         bool partial, MaskCache* cache) {
  // The one frame of the key inside a bounded repetition (keys with two keep their own walks).
  const size_t frames = key.size() - (partial ? 0 : 1);
  std::optional<size_t> depth;
  for (size_t f = 0; f < frames; ++f) {
    if (g.kind(key[f]) != PositionKind::kRule || g.counted(key[f]).repeat < 0) continue;
    if (depth) return nullptr;
    depth = f;
  }
  if (!depth) return nullptr;
  const CountedPosition at = g.counted(key[*depth]);
  const int32_t anchor_count = AnchorCount(g, at.repeat);
  if (at.count > anchor_count && anchor_count < NoTokenLonger()) return nullptr;
  const RepeatWatch anchor{*depth, anchor_count};
  if (at.count == anchor_count) return Walked(g, key, partial, &anchor, cache);
  std::vector<int32_t> anchor_key = key;
  anchor_key[*depth] = g.body_ref(at.repeat, anchor_count);
  auto it = cache->entries_.find(anchor_key);
  const MaskEntry& a =
      it != cache->entries_.end()
          ? *it->second
          : Insert(cache, anchor_key, Walked(g, anchor_key, partial, &anchor, cache));
  if (a.deeper) return std::make_shared<const MaskEntry>(Deeper());
  if (a.need.empty()) return nullptr;  // not an anchor's (cannot happen: one key, one kind)
  if (at.count > anchor_count) {
    MaskEntry same;
    same.derived = true;
    same.accepted = a.accepted;
    same.uncertain = a.uncertain;
    return std::make_shared<const MaskEntry>(std::move(same));
  }
  return std::make_shared<const MaskEntry>(DeeperIfTooUncertain(Derive(a, at.count), partial));
}

MaskEntry TokenMasker::Derive(const MaskEntry& anchor, int32_t count) const {
  MaskEntry entry;
  entry.derived = true;
  entry.accepted.assign(table_.mask_words(), 0);
  const auto vocab = static_cast<size_t>(table_.vocab_size());
  const size_t whole_words = vocab / 32;
  for (size_t w = 0; w < whole_words; ++w) {
    entry.accepted[w] = AtMost(anchor.need.data() + w * 32, static_cast<uint8_t>(count));
  }
  for (size_t id = whole_words * 32; id < vocab; ++id) {
    if (anchor.need[id] <= count) SetBit(entry.accepted, static_cast<int32_t>(id));
  }
  // What only leaving the frames mid-token could still take is for the whole stack to decide.
  std::vector<uint32_t> escaping;
  for (const uint32_t i : anchor.escaping) {
    if (anchor.need[static_cast<size_t>(table_.ids_[i])] > count) escaping.push_back(i);
  }
  entry.uncertain.reserve(anchor.uncertain.size() + escaping.size());
  std::merge(anchor.uncertain.begin(), anchor.uncertain.end(), escaping.begin(), escaping.end(),
             std::back_inserter(entry.uncertain));
  return entry;
}

const MaskEntry& TokenMasker::Lookup(const Grammar& g, std::vector<int32_t> key, bool partial,
                                     bool first_frames, MaskCache* cache) {
  if (auto it = cache->entries_.find(key); it != cache->entries_.end()) return *it->second;
  std::shared_ptr<const MaskEntry> built;
  if (first_frames) built = FromAnchor(g, key, partial, cache);
  if (built == nullptr) built = Walked(g, key, partial, nullptr, cache);
  return Insert(cache, std::move(key), std::move(built));
}

const MaskEntry& TokenMasker::Entry(const Grammar& g, const int32_t* begin, const int32_t* end,
                                    size_t frames, MaskCache* cache) {
  const bool partial = static_cast<size_t>(end - begin) > frames;
  std::vector<int32_t> key(partial ? end - frames : begin, end);
  if (!partial) key.push_back(-1);  // the whole stack: ending it ends the output
  const MaskEntry& entry =
      Lookup(g, std::move(key), partial, frames == MaskCache::kKeyFrames, cache);
  if (entry.deeper) return Entry(g, begin, end, frames + MaskCache::kKeyFrames, cache);
  return entry;
}

int TokenMasker::Prepare(const Grammar& g, MaskCache* cache,
                         std::chrono::steady_clock::time_point deadline,
                         const std::atomic<bool>* cancel) {
  // The byte positions whose walks visit the most tokens, the most first.
  std::vector<std::pair<size_t, int32_t>> visits;
  for (int32_t pos = 0; pos < g.num_positions(); ++pos) {
    if (g.kind(pos) != PositionKind::kBytes) continue;
    const size_t n = Visits(g.bytes(pos));
    if (MayBeCostly(n)) visits.emplace_back(n, pos);
  }
  std::stable_sort(visits.begin(), visits.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<int32_t> tops;
  for (const auto& [n, pos] : visits) tops.push_back(pos);
  const auto anchor = [&](int32_t repeat) { return AnchorCount(g, repeat); };
  int built = 0;
  for (StackKey& key : StackKeys(g, MaskCache::kKeyFrames, tops, anchor, kMaxPreparedKeys)) {
    if (std::chrono::steady_clock::now() >= deadline || (cancel != nullptr && *cancel)) break;
    if (key.whole) key.frames.push_back(-1);
    if (cache->entries_.contains(key.frames)) continue;
    Lookup(g, std::move(key.frames), !key.whole, /*first_frames=*/true, cache);
    ++built;
  }
  return built;
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
