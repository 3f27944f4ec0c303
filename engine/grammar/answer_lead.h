// What a reasoning model (Qwen3, QwQ, DeepSeek-R1) writes before its answer: a think block. A
// constrained answer's grammar takes the block first, so the model can reason freely and the
// answer after it still follows the constraint; the grammar holds from the first token, so no
// answer can escape it (a model that skips the block answers at once, held all the same).
#pragma once

#include <cstdint>

#include "engine/grammar/grammar.h"

namespace specula::grammar {

enum class AnswerLead : uint8_t {
  kNone,               // the answer starts at once
  kOptionalReasoning,  // "<think>" reasoning "</think>", or nothing, then the answer
  kInReasoning,        // the prompt opened the block: reasoning "</think>", then the answer
};

// The reasoning text is any bytes not containing "</think>"; between the block and the answer
// come at most kMaxLineBreaks line breaks (Qwen3 writes "\n\n"), which the reasoning parser
// strips from the content: nothing else may come between them.
inline constexpr char kThinkOpen[] = "<think>";
inline constexpr char kThinkClose[] = "</think>";
inline constexpr int kMaxLineBreaks = 2;

// A rule deriving `lead` then `answer`.
int32_t AddAnswerLead(GrammarBuilder& b, AnswerLead lead, int32_t answer);

}  // namespace specula::grammar
