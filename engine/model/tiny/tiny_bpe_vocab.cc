#include "engine/model/tiny/tiny_bpe_vocab.h"

#include <cctype>
#include <map>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace specula {
namespace {

// Original prose, written for this tool; varied enough to learn a few hundred merges.
constexpr const char* kCorpus =
    R"(The harbor town wakes before the sun. Fishing boats leave the quay one by one,
their engines coughing in the cold air, and the gulls follow them out past the lighthouse.
By seven o'clock the bakery on the corner has opened its shutters, and the smell of bread
drifts down the hill toward the water. Children walk to school in pairs, carrying bags that
are too heavy for them, and the old men who sit by the fountain argue about the weather.

It rained for three days last week. The river rose until it touched the lowest step of the
stone bridge, and the mayor said that the town would need a new wall before the winter.
Nobody agreed about the cost. Some people wanted to build the wall from concrete, others
wanted stone from the quarry in the north, and a few said that the river had always risen
and always fallen again, so there was nothing to worry about at all.

In the evening the square fills with music. A woman plays the violin near the library, and
a young man sells roasted chestnuts from a small cart. The lights of the cafes come on, one
after another, and the tables spill out onto the street. People talk about their work, their
children, their plans for the summer, and the price of everything in the market.

The teacher at the school asked her students to write about the sea. One boy wrote that the
sea was a large blue animal that breathed twice a day. A girl wrote that the sea was the
place where the rivers went to rest. Another student counted the waves for an hour and wrote
down the number: 1042. The teacher read every story aloud, and the class laughed and clapped.

Computers in the town hall keep the records of births, marriages, and the height of the tide.
The clerk who maintains them is careful and patient. She checks each entry twice, because a
single mistake in a date can travel through the years and confuse the people who read the
records long after she has retired. "Accuracy is a kind of kindness," she likes to say.

When the fishing boats return in the afternoon, the market becomes loud and busy. Buyers
inspect the catch, sellers call out their prices, and the ice in the crates melts slowly in
the sun. Cats wait patiently under the tables for anything that falls. By five o'clock the
stalls are washed, the boats are tied, and the town settles into the quiet of the evening.

Travelers who visit the town often say that it seems unchanged, as if time had stopped here.
That is not true. The town changes every day, but slowly, the way a river changes its bed:
a new shop opens, an old tree falls, a family moves away and another arrives. The people who
live here notice these changes, and they remember them, and they tell the stories to their
children, who will tell them again in their own time.
)";

// A rough ASCII stand-in for the Llama 3 pre-tokenizer: an optional non-letter followed by
// letters (" word", "'s"), digit runs of up to three, " punctuation", whitespace runs. Only the
// training split uses it; any split yields valid merges, this one yields useful ones.
std::vector<std::string> PreTokenize(const std::string& text) {
  auto cls = [&](size_t k) -> int {
    const unsigned char c = static_cast<unsigned char>(text[k]);
    if (std::isalpha(c)) return 0;
    if (std::isdigit(c)) return 1;
    if (std::isspace(c)) return 2;
    return 3;
  };
  std::vector<std::string> words;
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    const bool lead = text[i] != '\n' && cls(i) != 0 && cls(i) != 1 && i + 1 < n;
    if (lead && cls(i + 1) == 0) {
      for (++i; i < n && cls(i) == 0; ++i) {
      }
    } else if (lead && text[i] == ' ' && cls(i + 1) == 3) {
      for (++i; i < n && cls(i) == 3; ++i) {
      }
    } else {
      const int c = cls(i);
      const size_t limit = c == 1 ? i + 3 : n;
      for (++i; i < n && i < limit && cls(i) == c; ++i) {
      }
    }
    words.push_back(text.substr(start, i - start));
  }
  return words;
}

}  // namespace

const std::string& TinyCorpus() {
  static const std::string* corpus = new std::string(kCorpus);
  return *corpus;
}

std::string ByteToUnicode(uint8_t b) {
  // GPT-2: printable Latin-1 bytes map to themselves, the rest to U+0100.. in byte order.
  auto printable = [](int x) {
    return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
  };
  int cp = b;
  if (!printable(b)) {
    int k = 0;
    for (int x = 0; x < b; ++x) k += printable(x) ? 0 : 1;
    cp = 256 + k;
  }
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

int64_t TinyBpeVocab::SpecialId(const std::string& content) const {
  for (size_t i = 0; i < special_tokens.size(); ++i) {
    if (special_tokens[i] == content) {
      return static_cast<int64_t>(tokens.size() - special_tokens.size() + i);
    }
  }
  return -1;
}

absl::StatusOr<TinyBpeVocab> BuildTinyBpeVocab(const std::vector<std::string>& special_tokens,
                                               int64_t vocab_size) {
  TinyBpeVocab vocab;
  vocab.special_tokens = special_tokens;
  const int64_t base = 256 + static_cast<int64_t>(special_tokens.size());
  if (vocab_size < base) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer vocab size ", vocab_size, " is below the minimum ", base));
  }
  // GPT-2 orders the byte tokens printable-first (id 0 is "!"); follow it.
  std::vector<int> order;
  for (int pass = 0; pass < 2; ++pass) {
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      if (printable == (pass == 0)) order.push_back(b);
    }
  }
  std::set<std::string> known;
  for (int b : order) {
    vocab.tokens.push_back(ByteToUnicode(static_cast<uint8_t>(b)));
    known.insert(vocab.tokens.back());
  }

  std::map<std::vector<std::string>, int64_t> words;
  for (const std::string& w : PreTokenize(TinyCorpus())) {
    std::vector<std::string> symbols;
    for (unsigned char c : w) symbols.push_back(ByteToUnicode(c));
    ++words[symbols];
  }
  const int64_t target_merged = vocab_size - static_cast<int64_t>(special_tokens.size());
  while (static_cast<int64_t>(vocab.tokens.size()) < target_merged) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const auto& [symbols, count] : words) {
      for (size_t i = 0; i + 1 < symbols.size(); ++i) pairs[{symbols[i], symbols[i + 1]}] += count;
    }
    if (pairs.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("corpus too small for a vocab of ", vocab_size));
    }
    auto best = pairs.begin();
    for (auto it = pairs.begin(); it != pairs.end(); ++it) {
      if (it->second > best->second) best = it;  // strict: the first (smallest) pair wins ties
    }
    const auto [left, right] = best->first;
    const std::string merged = left + right;
    vocab.merges.emplace_back(left, right);
    if (known.insert(merged).second) vocab.tokens.push_back(merged);
    std::map<std::vector<std::string>, int64_t> next;
    for (const auto& [symbols, count] : words) {
      std::vector<std::string> out;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(symbols[i]);
        }
      }
      next[out] += count;
    }
    words = std::move(next);
  }
  for (const std::string& s : special_tokens) vocab.tokens.push_back(s);
  return vocab;
}

}  // namespace specula
