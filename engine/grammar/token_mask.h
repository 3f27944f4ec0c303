// Which tokens of a vocabulary a GrammarMatcher allows next: the mask applied to a step's logits
// before sampling.
//
// A token is allowed when the grammar takes all of its bytes from the matcher's state. The
// vocabulary is kept sorted by bytes, so neighbours share prefixes: the walk keeps the state
// after each byte of the previous token and restarts from the longest common prefix, and a
// rejected prefix skips every token that starts with it (a depth-first walk of the vocabulary's
// trie without building the trie).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/grammar/matcher.h"

namespace specula {
class ThreadPool;
}  // namespace specula

namespace specula::grammar {

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
  std::vector<uint32_t> common_;  // common prefix length of sorted tokens i - 1 and i
  size_t max_length_ = 0;
};

// What a stack's top frames decide alone (XGrammar's adaptive token mask cache, in specula's
// terms): the tokens taken without ever leaving those frames are allowed whatever lies below
// them; the tokens that leave them (end the frames' rules with bytes to spare) depend on the rest
// of the stack and are checked against it at each step; all others are refused. In a string,
// every token without a quote is decided here, and only the few with one are checked.
// A key whose frames leave too many tokens uncertain (whitespace before a closing brace that a
// frame further down provides) is only a pointer to a deeper key.
struct MaskEntry {
  std::vector<uint32_t> accepted;   // one bit per token id
  std::vector<uint32_t> uncertain;  // indices into the sorted vocabulary, ascending
  bool deeper = false;              // look up more frames instead
};

// The entries of one grammar over one TokenTable, by their stacks' top frames. Engine thread
// only; bounded (past max_entries, an entry is dropped for each new one).
class MaskCache {
 public:
  // Frames of a key at first, and added each time a key leaves more than kMaxUncertain tokens
  // to the whole stack. More frames decide more tokens alone but make more keys.
  static constexpr size_t kKeyFrames = 3;
  static constexpr size_t kMaxUncertain = 1024;
  // An entry holds a bit per token (16 KB at a 128K vocabulary): 256 of them are 4 MB.
  explicit MaskCache(size_t max_entries = 256) : max_entries_(max_entries) {}
  size_t size() const { return entries_.size(); }

 private:
  friend class TokenMasker;
  absl::flat_hash_map<std::vector<int32_t>, std::unique_ptr<const MaskEntry>> entries_;
  size_t max_entries_;
};

// Computes masks; holds the walks' scratch states, so one per thread.
class TokenMasker {
 public:
  // With `threads` > 1, a cache entry's walk of the whole vocabulary is split across that many
  // threads (a pool of its own, started by the first walk that uses it), in chunks of at least
  // `min_chunk_tokens`: building entries is what a step waits for.
  explicit TokenMasker(const TokenTable& table, int threads = 1, size_t min_chunk_tokens = 4096);
  ~TokenMasker();
  // Sets bit `id % 32` of word `id / 32` of `allowed` for every token `matcher` takes whole,
  // and clears the others. Returns how many are allowed. With a cache (the grammar's, built over
  // this masker's table), each stack costs its entry's bits and checks of its uncertain tokens;
  // without, a walk of the whole vocabulary.
  int64_t Compute(const GrammarMatcher& matcher, MaskCache* cache, std::vector<uint32_t>* allowed);
  int64_t Compute(const GrammarMatcher& matcher, std::vector<uint32_t>* allowed) {
    return Compute(matcher, nullptr, allowed);
  }

 private:
  // One walk's scratch: the states after each byte of the current token.
  struct Walk {
    explicit Walk(size_t max_length);
    std::vector<StackSet> states;   // states[d]: after the first d bytes of the current token
    std::vector<uint8_t> escaped;   // escaped[d]: a stack left the key's frames at byte d - 1
    std::vector<uint8_t> left;      // left[d]: one did at some byte before d
    std::vector<uint8_t> filtered;  // filtered[d]: states[d] kept only stacks taking byte d
  };

  // Walks every token from `start` (a stack, or the top frames of one when `partial`), in
  // chunks on the pool's threads if there is one.
  MaskEntry Classify(const Grammar& g, const StackSet& start, bool partial);
  // The walk of the sorted tokens [first, last): their accepted bits into `entry`, their
  // uncertain indices appended in order.
  void ClassifyRange(const Grammar& g, const StackSet& start, bool partial, size_t first,
                     size_t last, Walk& walk, MaskEntry* entry);
  // Sets the bits of the tokens at `indices` (sorted) that `start` takes whole.
  void Check(const Grammar& g, const StackSet& start, const std::vector<uint32_t>& indices,
             std::vector<uint32_t>* allowed);
  // The entry of the stack [begin, end) for its top `frames` frames, or deeper.
  const MaskEntry& Entry(const Grammar& g, const int32_t* begin, const int32_t* end, size_t frames,
                         MaskCache* cache);

  static bool StepWithin(const Grammar& g, std::string_view token, size_t d, bool* escaped,
                         Walk& walk);
  static size_t Reusable(const Walk& walk, size_t common, size_t valid);

  const TokenTable& table_;
  const int threads_;
  std::unique_ptr<ThreadPool> pool_;  // null until a walk is split
  const size_t min_chunk_tokens_;
  std::vector<Walk> walks_;  // one per chunk of a parallel walk; walks_[0] for the others
};

inline bool MaskAllows(const std::vector<uint32_t>& mask, int64_t id) {
  return (mask[static_cast<size_t>(id >> 5)] >> (id & 31)) & 1;
}

}  // namespace specula::grammar
