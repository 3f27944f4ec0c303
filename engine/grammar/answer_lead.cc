#include "engine/grammar/answer_lead.h"

#include <string_view>
#include <vector>

namespace specula::grammar {
namespace {

using B = GrammarBuilder;

// Text up to and including the first "</think>": one rule per length of the close tag matched so
// far (a Knuth-Morris-Pratt automaton; only '<' restarts a match, since no proper suffix of a
// matched part is a prefix of the tag but "<"). Each byte is a tail call, so stacks stay flat
// however long the reasoning.
int32_t ReasoningThroughClose(GrammarBuilder& b) {
  constexpr std::string_view close = kThinkClose;
  std::vector<int32_t> matched(close.size());
  for (size_t i = 0; i < close.size(); ++i) matched[i] = b.NewRule("reasoning");
  for (size_t i = 0; i < close.size(); ++i) {
    const auto next = static_cast<uint8_t>(close[i]);
    Alternative advance = {B::Bytes(ByteSet::Range(next, next))};
    if (i + 1 < close.size()) advance.push_back(B::Ref(matched[i + 1]));
    b.AddAlternative(matched[i], std::move(advance));
    if (next != '<') b.AddAlternative(matched[i], {B::Bytes(ByteSet::Of("<")), B::Ref(matched[1])});
    ByteSet other;
    for (int c = 0; c < 256; ++c) {
      if (c != '<' && c != next) other.Add(static_cast<uint8_t>(c), static_cast<uint8_t>(c));
    }
    b.AddAlternative(matched[i], {B::Bytes(other), B::Ref(matched[0])});
  }
  return matched[0];
}

}  // namespace

int32_t AddAnswerLead(GrammarBuilder& b, AnswerLead lead, int32_t answer) {
  if (lead == AnswerLead::kNone) return answer;
  const int32_t line_break = b.AddRule("line_break", {{B::Bytes(ByteSet::Of("\n"))}});
  const int32_t separator = b.Repeat("after_reasoning", line_break, 0, kMaxLineBreaks);
  Alternative after_open = {B::Ref(ReasoningThroughClose(b)), B::Ref(separator), B::Ref(answer)};
  if (lead == AnswerLead::kInReasoning) return b.AddRule("answer_lead", {std::move(after_open)});
  Alternative block = B::Literal(kThinkOpen);
  block.insert(block.end(), after_open.begin(), after_open.end());
  return b.AddRule("answer_lead", {std::move(block), {B::Ref(answer)}});
}

}  // namespace specula::grammar
