// Which tokens of a vocabulary a GrammarMatcher allows next: the mask applied to a step's logits
// before sampling.
//
// A token is allowed when the grammar takes all of its bytes from the matcher's state. The
// vocabulary is kept sorted by bytes, so neighbours share prefixes: the walk keeps the state
// after each byte of the previous token and restarts from the longest common prefix, and a
// rejected prefix jumps past every token that starts with it (a depth-first walk of the
// vocabulary's trie without building the trie).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/grammar/matcher.h"

namespace specula {
class ThreadPool;
}  // namespace specula

namespace specula::grammar {

class SharedMaskEntries;

class TokenTable {
 public:
  // `token_bytes[id]` is what token `id` decodes to; an empty string marks a token no grammar
  // allows (special and control tokens: their text is not output).
  explicit TokenTable(const std::vector<std::string>& token_bytes);

  int64_t vocab_size() const { return vocab_size_; }
  size_t mask_words() const { return static_cast<size_t>((vocab_size_ + 31) / 32); }

 private:
  friend class TokenMasker;
  // The bytes of the i-th token in sorted order.
  std::string_view sorted_bytes(size_t i) const {
    return std::string_view(bytes_).substr(offsets_[i], offsets_[i + 1] - offsets_[i]);
  }
  int64_t vocab_size_ = 0;
  std::vector<int32_t> ids_;       // tokens with bytes, sorted by their bytes
  std::vector<uint32_t> offsets_;  // ids_[i]'s bytes are bytes_[offsets_[i], offsets_[i + 1])
  std::string bytes_;
  // The first sorted token after i that starts with none of the first `prefix` bytes of token
  // i, or `last` if none before it: the tokens in between share those bytes.
  size_t PastPrefix(size_t i, size_t prefix, size_t last) const;
  std::vector<uint32_t> common_;  // common prefix length of sorted tokens i - 1 and i
  // The first sorted token after i whose common_ is below common_[i] (ids_.size() if none):
  // every token in between shares at least common_[i] bytes with i - 1.
  std::vector<uint32_t> next_shorter_;
  size_t max_length_ = 0;
  // The sorted tokens starting with byte b are [first_byte_[b], first_byte_[b + 1]).
  std::array<uint32_t, 257> first_byte_{};
};

// What a stack's top frames decide alone (XGrammar's adaptive token mask cache, in specula's
// terms): the tokens taken without ever leaving those frames are allowed whatever lies below
// them; the tokens that leave them (end the frames' rules with bytes to spare) depend on the rest
// of the stack and are checked against it at each step; all others are refused. In a string,
// every token without a quote is decided here, and only the few with one are checked.
// A key whose frames leave too many tokens uncertain (whitespace before a closing brace that a
// frame further down provides) is only a pointer to a deeper key.
//
// Inside a bounded repetition (a string's maxLength), keys differ only in how many more
// repetitions are allowed. One of them, the anchor, is walked with its stacks' needs followed
// (RepeatWatch), and the others are derived from it: a token is accepted at count k when its
// need is at most k.
struct MaskEntry {
  std::vector<uint32_t> accepted;   // one bit per token id
  std::vector<uint32_t> uncertain;  // indices into the sorted vocabulary, ascending
  bool deeper = false;              // look up more frames instead
  bool derived = false;             // from an anchor's needs, not walked
  // An anchor's, empty in other entries: for each token id, the least count at which it is
  // accepted (kNever: not at the anchor's own); and the sorted indices of the accepted tokens
  // that a stack could also take by leaving the key's frames mid-token, uncertain at the counts
  // below their need.
  std::vector<uint8_t> need;
  std::vector<uint32_t> escaping;
  static constexpr uint8_t kNever = 255;
};

// The entries of one grammar over one TokenTable, by their stacks' top frames. Engine thread
// only; bounded (past max_entries, an entry is dropped for each new one).
class MaskCache {
 public:
  // Frames of a key at first, and added each time a key leaves more than kMaxUncertain tokens
  // to the whole stack. More frames decide more tokens alone but make more keys.
  static constexpr size_t kKeyFrames = 3;
  static constexpr size_t kMaxUncertain = 1024;
  // The largest count an anchor is walked at (MaskEntry::need holds counts up to it).
  static constexpr int32_t kMaxAnchor = 254;
  // An entry holds a bit per token (16 KB at a 128K vocabulary): 256 of them are 4 MB. An
  // anchor's also holds a byte per token (128 KB), one per bounded repetition met.
  explicit MaskCache(size_t max_entries = 256) : max_entries_(std::max<size_t>(1, max_entries)) {}
  size_t size() const { return entries_.size(); }
  // Entries built by walking the vocabulary (the others were derived from an anchor or found
  // among the masker's shared entries).
  int64_t walks() const { return walks_; }
  // Entries found among the masker's shared entries (walked for another grammar, or earlier).
  int64_t shared_hits() const { return shared_hits_; }
  // Walks that were costly (TokenMasker::Costly): what Prepare is for.
  int64_t costly_walks() const { return costly_walks_; }

 private:
  friend class TokenMasker;
  int64_t walks_ = 0;
  int64_t costly_walks_ = 0;
  int64_t shared_hits_ = 0;
  absl::flat_hash_map<std::vector<int32_t>, std::shared_ptr<const MaskEntry>> entries_;
  size_t max_entries_;
};

struct TokenMaskerOptions {
  // With threads > 1, a cache entry's walk of the vocabulary is split across that many threads
  // (a pool of its own, started by the first walk that uses it), in chunks of at least
  // min_chunk_tokens: building entries is what a step waits for.
  int threads = 1;
  size_t min_chunk_tokens = 4096;
  // With `shared` (over the same table), the costly walks are looked up there by signature
  // before walking, and kept there.
  SharedMaskEntries* shared = nullptr;
  // A walk may be costly when its key's stacks take the first bytes of at least
  // 1/costly_fraction of the vocabulary (such keys are prepared and looked up among the shared
  // entries), and is costly when it accepts as many tokens, each followed to its last byte (it
  // is kept there). At a 128K vocabulary, 1/64 is 2,000 tokens: a string's characters, and the
  // multi-byte characters and escapes beside them (2-5 ms each); whitespace keys visit as many
  // but accept few.
  size_t costly_fraction = 64;
};

// Computes masks; holds the walks' scratch states, so one per thread.
class TokenMasker {
 public:
  explicit TokenMasker(const TokenTable& table, TokenMaskerOptions options = {});
  ~TokenMasker();
  // Sets bit `id % 32` of word `id / 32` of `allowed` for every token `matcher` takes whole,
  // and clears the others. Returns how many are allowed. With a cache (the grammar's, built over
  // this masker's table), each stack costs its entry's bits and checks of its uncertain tokens;
  // without, a walk of the vocabulary (the tokens whose first byte a stack takes).
  int64_t Compute(const GrammarMatcher& matcher, MaskCache* cache, std::vector<uint32_t>* allowed);
  int64_t Compute(const GrammarMatcher& matcher, std::vector<uint32_t>* allowed) {
    return Compute(matcher, nullptr, allowed);
  }
  // Builds into `cache`, before the grammar's first step, the entries a step would otherwise
  // wait for: those of the keys its stacks can present (StackKeys) whose top takes the first
  // bytes of at least 1/costly_fraction of the vocabulary (a string's characters, whitespace),
  // widest first, bounded repetitions at their anchor. Stops at `deadline` or after
  // kMaxPreparedKeys keys (half the cache: room for the counts derived at the steps), or once
  // `cancel` is set. Returns the keys looked up that the cache did not hold.
  int Prepare(const Grammar& g, MaskCache* cache, std::chrono::steady_clock::time_point deadline,
              const std::atomic<bool>* cancel = nullptr);
  static constexpr size_t kMaxPreparedKeys = 128;

 private:
  // One walk's scratch: the states after each byte of the current token.
  struct Walk {
    explicit Walk(size_t max_length);
    std::vector<StackSet> states;       // states[d]: after the first d bytes of the current token
    std::vector<uint8_t> escaped;       // escaped[d]: a stack left the key's frames at byte d - 1
    std::vector<uint8_t> left;          // left[d]: one did at some byte before d
    std::vector<uint8_t> filtered;      // filtered[d]: states[d] kept only stacks taking byte d
    std::vector<uint16_t> escape_need;  // an anchor's walk: the least need of escaped[d]
  };

  // Walks the tokens from `start` (a stack, or the top frames of one when `partial`), in chunks
  // on the pool's threads if there is one. With `anchor` (an anchor's walk: the repetition it
  // follows), the entry keeps the needs.
  MaskEntry Classify(const Grammar& g, const StackSet& start, bool partial,
                     const RepeatWatch* anchor = nullptr);
  // The walk of the sorted tokens [first, last) whose first byte a stack of `start` takes: their
  // accepted bits into `entry`, their uncertain (and with `anchor`, escaping) indices appended
  // in order, their needs into `need` (sized by the caller, shared by the chunks: each writes
  // its own tokens').
  void ClassifyRange(const Grammar& g, const StackSet& start, bool partial,
                     const RepeatWatch* anchor, size_t first, size_t last, Walk& walk,
                     MaskEntry* entry, std::vector<uint8_t>* need);
  // ClassifyRange's walk of the sorted tokens [first, last), from walk.states[0]; `watch` is
  // the chunk's own copy of the anchor's.
  void ClassifyTokens(const Grammar& g, bool partial, size_t first, size_t last, Walk& walk,
                      RepeatWatch* watch, MaskEntry* entry, std::vector<uint8_t>* need);
  // The least need of the stacks in `s` and of an escape with `escape_need`.
  static uint16_t NeedOf(const Grammar& g, const RepeatWatch& watch, const StackSet& s,
                         bool escaped, uint16_t escape_need);
  // The entry of `key` (the top frames of a stack, or the whole stack and -1), walked (or found
  // among the shared entries).
  std::shared_ptr<const MaskEntry> Walked(const Grammar& g, const std::vector<int32_t>& key,
                                          bool partial, const RepeatWatch* anchor,
                                          MaskCache* cache);
  // The key's signature among the shared entries, for a walk that may be costly: one that visits
  // at least 1/costly_fraction of the vocabulary, from a part of the grammar of at most
  // kMaxSharedPositions positions. nullopt for the others.
  std::optional<std::string> SharedSignature(const Grammar& g, const StackSet& start,
                                             absl::Span<const int32_t> frames, bool partial,
                                             const RepeatWatch* anchor) const;
  // Whether a walked entry was costly, and so worth its room among the shared entries: it
  // accepts at least 1/costly_fraction of the vocabulary, each token followed to its last byte (a
  // string's). Whitespace keys visit as many tokens but refuse nearly all at their second byte.
  bool Costly(const MaskEntry& entry) const;
  // Whether a walk visiting `visits` tokens may be costly.
  bool MayBeCostly(size_t visits) const;
  static constexpr size_t kMaxSharedPositions = 4096;
  // The tokens whose first byte a stack of `start` takes: those its walk visits; their number.
  ByteSet FirstBytes(const Grammar& g, const StackSet& start) const;
  size_t Visits(const Grammar& g, const StackSet& start) const;
  size_t Visits(const ByteSet& firsts) const;
  // The count a bounded repetition's anchor is walked at (FromAnchor).
  int32_t AnchorCount(const Grammar& g, int32_t repeat) const;
  int32_t NoTokenLonger() const { return static_cast<int32_t>(table_.max_length_) + 1; }
  // The entry of `key` derived from its anchor's, when one of its frames is in a bounded
  // repetition; null otherwise.
  std::shared_ptr<const MaskEntry> FromAnchor(const Grammar& g, const std::vector<int32_t>& key,
                                              bool partial, MaskCache* cache);
  // `anchor`'s tokens at count `count`, below the anchor's own.
  MaskEntry Derive(const MaskEntry& anchor, int32_t count) const;
  static const MaskEntry& Insert(MaskCache* cache, std::vector<int32_t> key,
                                 std::shared_ptr<const MaskEntry> entry);
  // Sets the bits of the tokens at `indices` (sorted) that `start` takes whole.
  void Check(const Grammar& g, const StackSet& start, const std::vector<uint32_t>& indices,
             std::vector<uint32_t>* allowed);
  // The entry of `key` (FromAnchor's when `first_frames`, a stack's first key), built if new.
  const MaskEntry& Lookup(const Grammar& g, std::vector<int32_t> key, bool partial,
                          bool first_frames, MaskCache* cache);
  // The entry of the stack [begin, end) for its top `frames` frames, or deeper.
  const MaskEntry& Entry(const Grammar& g, const int32_t* begin, const int32_t* end, size_t frames,
                         MaskCache* cache);

  static bool StepWithin(const Grammar& g, std::string_view token, size_t d, bool* escaped,
                         Walk& walk, RepeatWatch* watch = nullptr);
  static size_t Reusable(const Walk& walk, size_t common, size_t valid);

  const TokenTable& table_;
  const TokenMaskerOptions options_;
  std::unique_ptr<ThreadPool> pool_;  // null until a walk is split
  std::vector<Walk> walks_;  // one per chunk of a parallel walk; walks_[0] for the others
};

inline bool MaskAllows(const std::vector<uint32_t>& mask, int64_t id) {
  return (mask[static_cast<size_t>(id >> 5)] >> (id & 31)) & 1;
}

}  // namespace specula::grammar
