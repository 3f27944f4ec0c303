// First stage of the output parser: separates a leading <think>…</think> block (reasoning) from
// what follows it (content, which the tool-call stage then reads). docs/CHAT_OUTPUT.md §Reasoning.
#pragma once

#include <string>
#include <string_view>

namespace specula::chat_output_internal {

inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningSplitter {
 public:
  // enabled=false: everything is content, unchanged. starts_in_reasoning: the output begins
  // inside the think block (an opening tag the model writes anyway is dropped).
  ReasoningSplitter(bool enabled, bool starts_in_reasoning);

  ReasoningDelta Push(std::string_view text);
  ReasoningDelta Finish();

 private:
  enum class State {
    kStart,      // undecided: only whitespace or a prefix of "<think>" seen so far
    kReasoning,  // inside the think block
    kContent,    // after it (or there was none): everything is content
  };

  // kStart: decides, once the first non-space text is known, whether a think block opens.
  void ResolveStart();
  // kReasoning: emits the reasoning that can no longer be trailing newlines or "</think>".
  void ScanReasoning(ReasoningDelta& out);
  // kContent: emits all held text (after the leading newlines that follow "</think>").
  void FlushContent(ReasoningDelta& out);
  void EnterReasoning();
  // Drops '\n's at the front of held_ while strip_leading_newlines_ is set; the flag clears at
  // the first other character.
  void StripHeldLeadingNewlines();

  State state_;
  bool starts_in_reasoning_;
  std::string held_;  // text received but not yet emitted
  bool strip_leading_newlines_ = false;
};

}  // namespace specula::chat_output_internal
