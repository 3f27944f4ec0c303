#include "engine/chat/output/reasoning_splitter.h"

#include "engine/chat/output/text_scan.h"

namespace specula::chat_output_internal {

ReasoningSplitter::ReasoningSplitter(bool enabled, bool starts_in_reasoning)
    : state_(enabled ? State::kStart : State::kContent),
      starts_in_reasoning_(enabled && starts_in_reasoning) {}

ReasoningDelta ReasoningSplitter::Push(std::string_view text) {
  ReasoningDelta out;
  held_.append(text);
  // Each step may move to the next state, whose step then sees the rest of the text.
  if (state_ == State::kStart) ResolveStart();
  if (state_ == State::kReasoning) ScanReasoning(out);
  if (state_ == State::kContent) FlushContent(out);
  return out;
}

ReasoningDelta ReasoningSplitter::Finish() {
  ReasoningDelta out;
  if (state_ == State::kStart) {
    // Never saw a whole "<think>": the held whitespace / tag prefix is what it would have been
    // had the text been decided the other way.
    if (starts_in_reasoning_) {
      EnterReasoning();
    } else {
      state_ = State::kContent;
    }
  }
  if (state_ == State::kReasoning) {
    // Unterminated think block (max_tokens hit): what came is reasoning.
    StripHeldLeadingNewlines();
    out.reasoning.append(StripTrailingNewlines(held_));
    held_.clear();
  }
  if (state_ == State::kContent) FlushContent(out);
  return out;
}

void ReasoningSplitter::ResolveStart() {
  const size_t first = SkipSpace(held_, 0);
  const std::string_view rest = std::string_view(held_).substr(first);
  if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
    held_.erase(0, first + kThinkOpen.size());
    EnterReasoning();
    return;
  }
  if (kThinkOpen.substr(0, rest.size()) == rest) return;  // "", "<", "<thi": undecided
  // No think block at the start; a "<think>" later on is content.
  if (starts_in_reasoning_) {
    EnterReasoning();
  } else {
    state_ = State::kContent;
  }
}

void ReasoningSplitter::EnterReasoning() {
  state_ = State::kReasoning;
  strip_leading_newlines_ = true;
}

void ReasoningSplitter::ScanReasoning(ReasoningDelta& out) {
  StripHeldLeadingNewlines();
  const size_t close = held_.find(kThinkClose);
  if (close != std::string::npos) {
    out.reasoning.append(StripTrailingNewlines(std::string_view(held_).substr(0, close)));
    held_.erase(0, close + kThinkClose.size());
    state_ = State::kContent;
    strip_leading_newlines_ = true;  // "</think>\n\n" then the answer
    return;
  }
  // Hold back a possible start of "</think>" and the newlines before it: if the tag follows,
  // those newlines are the block's trailing ones, which are stripped.
  size_t emit = held_.size() - PartialTagLength(held_, kThinkClose);
  while (emit > 0 && held_[emit - 1] == '\n') --emit;
  out.reasoning.append(held_, 0, emit);
  held_.erase(0, emit);
}

void ReasoningSplitter::FlushContent(ReasoningDelta& out) {
  StripHeldLeadingNewlines();
  out.content.append(held_);
  held_.clear();
}

void ReasoningSplitter::StripHeldLeadingNewlines() {
  if (!strip_leading_newlines_) return;
  const size_t first = held_.find_first_not_of('\n');
  if (first == std::string::npos) {
    held_.clear();
    return;
  }
  held_.erase(0, first);
  strip_leading_newlines_ = false;
}

}  // namespace specula::chat_output_internal
