#include "engine/tokenizer/bpe_model.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/pipeline.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace specula::tokenizer_internal {
namespace {

using json = nlohmann::json;

absl::Status Malformed(const std::string& file, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": malformed BPE model: ", what));
}

// Optional string field that may be null or absent; "" counts as unset.
std::string StringOr(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return "";
  return it->get<std::string>();
}

}  // namespace

absl::StatusOr<BpeModel> BpeModel::FromJson(const json& model, const std::string& file,
                                            int64_t max_vocab_size) {
  if (!model.is_object()) return Malformed(file, "\"model\" is not an object");
  const std::string type = StringOr(model, "type");
  if (type != "BPE" && !(type.empty() && model.contains("merges"))) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": unsupported model type \"", type, "\" (only BPE is supported)"));
  }
  if (auto it = model.find("dropout");
      it != model.end() && !it->is_null() && it->get<double>() != 0.0) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": unsupported BPE dropout"));
  }
  if (!StringOr(model, "continuing_subword_prefix").empty() ||
      !StringOr(model, "end_of_word_suffix").empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": unsupported BPE continuing_subword_prefix/end_of_word_suffix"));
  }
  BpeModel m;
  m.fuse_unk_ = model.value("fuse_unk", false);
  m.byte_fallback_ = model.value("byte_fallback", false);
  m.ignore_merges_ = model.value("ignore_merges", false);

  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) return Malformed(file, "missing \"vocab\"");
  m.vocab_.reserve(vocab->size());
  TokenId max_id = -1;
  for (const auto& [token, id_json] : vocab->items()) {
    if (!id_json.is_number_integer()) return Malformed(file, "vocab id is not an integer");
    const int64_t id = id_json.get<int64_t>();
    RETURN_IF_ERROR(CheckVocabularyId(file, "token", token, id, max_vocab_size));
    m.vocab_[token] = static_cast<TokenId>(id);
    max_id = std::max<TokenId>(max_id, static_cast<TokenId>(id));
  }
  m.id_to_token_.resize(max_id + 1);
  std::vector<bool> taken(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : m.vocab_) {
    // Two tokens under one id would decode that id as either of them.
    if (taken[id]) {
      const auto& [first, second] = std::minmax(m.id_to_token_[id], token);
      return Malformed(file, absl::StrCat("vocab tokens \"", first, "\" and \"", second,
                                          "\" share id ", id));
    }
    taken[id] = true;
    m.id_to_token_[id] = token;
  }

  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) return Malformed(file, "missing \"merges\"");
  m.merges_.reserve(merges->size());
  std::string left, right;
  int32_t rank = 0;
  for (const auto& merge : *merges) {
    if (merge.is_string()) {
      // Legacy "a b" form; byte-level and "▁" vocabularies never contain a literal space.
      const auto& s = merge.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return Malformed(file, absl::StrCat("merge \"", s, "\" is not two tokens"));
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return Malformed(file, absl::StrCat("merge #", rank, " is neither \"a b\" nor [a, b]"));
    }
    const auto a = m.vocab_.find(left), b = m.vocab_.find(right);
    const auto ab = m.vocab_.find(left + right);
    if (a == m.vocab_.end() || b == m.vocab_.end() || ab == m.vocab_.end()) {
      return Malformed(file, absl::StrCat("merge \"", left, " ", right,
                                          "\" uses a token that is "
                                          "not in the vocabulary"));
    }
    // The first occurrence of a pair wins, as in Hugging Face.
    m.merges_.try_emplace(PairKey(a->second, b->second), Merge{rank, ab->second});
    ++rank;
  }

  if (const std::string unk = StringOr(model, "unk_token"); !unk.empty()) {
    const auto it = m.vocab_.find(unk);
    if (it == m.vocab_.end())
      return Malformed(file, absl::StrCat("unk_token \"", unk, "\" unknown"));
    m.unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const auto it = m.vocab_.find(name);
    m.byte_ids_[b] = it == m.vocab_.end() ? -1 : it->second;
  }
  return m;
}

std::optional<TokenId> BpeModel::Find(std::string_view token) const {
  const auto it = vocab_.find(AsAbsl(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

bool BpeModel::KeepsEveryCharacter(bool byte_level) const {
  bool all_bytes = true;
  for (TokenId id : byte_ids_) all_bytes = all_bytes && id >= 0;
  if (byte_fallback_ && all_bytes) return true;  // an unknown character becomes its bytes
  if (byte_level) {
    bool alphabet = true;  // then no character is unknown
    for (int b = 0; b < 256; ++b) alphabet = alphabet && vocab_.contains(ByteToUnicode(b));
    if (alphabet) return true;
  }
  return unk_id_.has_value() && !fuse_unk_;  // one unk per unknown character
}

void BpeModel::InitialSymbols(std::string_view word, std::vector<TokenId>* symbols) const {
  bool last_was_unk = false;
  for (size_t i = 0; i < word.size();) {
    const size_t len = Utf8CharLen(static_cast<unsigned char>(word[i]));
    const std::string_view ch = word.substr(i, len);
    i += len;
    if (const auto it = vocab_.find(AsAbsl(ch)); it != vocab_.end()) {
      symbols->push_back(it->second);
      last_was_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : ch) symbols->push_back(byte_ids_[static_cast<unsigned char>(c)]);
        last_was_unk = false;
        continue;
      }
    }
    // Without an unk token the character is dropped, as Hugging Face does.
    if (!unk_id_) continue;
    if (!(fuse_unk_ && last_was_unk)) symbols->push_back(*unk_id_);
    last_was_unk = true;
  }
}

void BpeModel::Tokenize(std::string_view word, std::vector<TokenId>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto it = vocab_.find(AsAbsl(word)); it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  std::vector<TokenId> ids;
  InitialSymbols(word, &ids);
  const int n = static_cast<int>(ids.size());
  if (n <= 1) {
    out->insert(out->end(), ids.begin(), ids.end());
    return;
  }
  // Doubly linked list of symbols; a merge folds the right symbol into the left one.
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    TokenId left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    const int r = next[pos];
    const auto it = merges_.find(PairKey(ids[pos], ids[r]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, ids[pos], ids[r]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int r = next[c.pos];
    // Stale entries: the left symbol was merged away or changed, or its neighbour did.
    if (ids[c.pos] != c.left || r < 0 || ids[r] != c.right) continue;
    ids[c.pos] = merges_.find(PairKey(c.left, c.right))->second.merged;
    ids[r] = -1;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    if (prev[c.pos] >= 0) push(prev[c.pos]);
    push(c.pos);
  }
  for (int i = 0; i >= 0; i = next[i]) out->push_back(ids[i]);
}

}  // namespace specula::tokenizer_internal
