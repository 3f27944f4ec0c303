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
    previous = std::string_view(bytes_).substr(offsets_[offsets_.size() - 2], t.size());
    max_length_ = std::max(max_length_, t.size());
  }
}

TokenMasker::TokenMasker(const TokenTable& table) : table_(table), states_(table.max_length_ + 1) {}

int64_t TokenMasker::Compute(const GrammarMatcher& matcher, std::vector<uint32_t>* allowed) {
  allowed->assign(table_.mask_words(), 0);
  const Grammar& g = matcher.grammar();
  states_[0] = matcher.stacks();
  int64_t count = 0;
  size_t valid = 0;  // states_[0..valid] hold for the previous token's prefix
  const size_t n = table_.ids_.size();
  for (size_t i = 0; i < n;) {
    const std::string_view token(table_.bytes_.data() + table_.offsets_[i],
                                 table_.offsets_[i + 1] - table_.offsets_[i]);
    size_t d = std::min<size_t>(table_.common_[i], valid);
    while (d < token.size() &&
           Step(g, states_[d], static_cast<uint8_t>(token[d]), &states_[d + 1]) &&
           !states_[d + 1].empty()) {
      ++d;
    }
    valid = d;
    if (d == token.size()) {
      const int32_t id = table_.ids_[i];
      (*allowed)[static_cast<size_t>(id) >> 5] |= uint32_t{1} << (id & 31);
      ++count;
      ++i;
      continue;
    }
    // Byte d is refused after this prefix: so it is for every token that shares bytes 0..d.
    ++i;
    while (i < n && table_.common_[i] > d) ++i;
  }
  return count;
}

}  // namespace specula::grammar
