// Chat content that cannot forge control tokens (issue 38 item 3; docs/CHAT.md, "The template").
// A rendered chat prompt is tokenized with its control tokens (the tokenizer's special added
// tokens: "<|im_start|>", "<|eot_id|>", ...) recognised only where the template itself wrote them;
// where the client's text put them (message content, tool schemas, chat_template_kwargs) they are
// ordinary text. The content's places are found by rendering the conversation a second time with
// each control string in the client's text replaced by a filler of the same length: where the two
// renderings differ is the client's. Content without control strings is rendered once and gives
// exactly the ids it always did.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/request_json.h"

namespace specula {

class ControlTokenGuard {
 public:
  using Ranges = std::vector<std::pair<size_t, size_t>>;

  // Reads the tokenizer's control strings (its special added tokens).
  explicit ControlTokenGuard(const Tokenizer& tokenizer);

  // Replaces each control string in every string of `value` (recursively) with the filler;
  // whether anything was replaced.
  // Object keys included.
  bool Neutralize(OrderedJson* value) const;
  // Whether any string of `value` (keys included) holds a control string: Neutralize would
  // change it. Reads only, so a conversation without control text is never copied.
  bool Holds(const OrderedJson& value) const;

  // The byte ranges of `rendered` where a control string came from the client: `neutral` is the
  // same template's rendering of the neutralized conversation. INVALID_ARGUMENT when the two
  // differ anywhere else (the template treated the control text specially: the content's
  // places cannot be told apart).
  absl::StatusOr<Ranges> ClientRanges(std::string_view rendered, std::string_view neutral) const;

  const std::vector<std::string>& control_strings() const { return controls_; }

 private:
  bool NeutralizeText(std::string* text) const;
  bool HoldsText(std::string_view text) const;

  std::vector<std::string> controls_;
  char filler_ = '#';
};

}  // namespace specula
