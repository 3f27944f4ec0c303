#include "server/control_token_guard.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace specula {

ControlTokenGuard::ControlTokenGuard(const Tokenizer& tokenizer) {
  for (TokenId id = 0; id < tokenizer.vocab_size(); ++id) {
    if (!tokenizer.IsSpecial(id)) continue;
    std::string text = tokenizer.IdToToken(id);
    if (!text.empty()) controls_.push_back(std::move(text));
  }
  // A filler that is in no control string cannot make one.
  for (const char c : std::string_view("#~_=*")) {
    if (std::none_of(controls_.begin(), controls_.end(),
                     [c](const std::string& s) { return s.find(c) != std::string::npos; })) {
      filler_ = c;
      break;
    }
  }
}

bool ControlTokenGuard::NeutralizeText(std::string* text) const {
  bool changed = false;
  for (const std::string& control : controls_) {
    for (size_t at = text->find(control); at != std::string::npos;
         at = text->find(control, at + control.size())) {
      text->replace(at, control.size(), control.size(), filler_);
      changed = true;
    }
  }
  return changed;
}

bool ControlTokenGuard::HoldsText(std::string_view text) const {
  return std::any_of(controls_.begin(), controls_.end(), [text](const std::string& control) {
    return text.find(control) != std::string_view::npos;
  });
}

bool ControlTokenGuard::Holds(const OrderedJson& value) const {
  if (value.is_string()) return HoldsText(value.get_ref<const std::string&>());
  if (value.is_array()) {
    return std::any_of(value.begin(), value.end(),
                       [this](const OrderedJson& item) { return Holds(item); });
  }
  if (value.is_object()) {
    for (const auto& [key, item] : value.items()) {
      if (HoldsText(key) || Holds(item)) return true;
    }
  }
  return false;
}

bool ControlTokenGuard::Neutralize(OrderedJson* value) const {
  bool changed = false;
  if (value->is_string()) return NeutralizeText(&value->get_ref<std::string&>());
  if (value->is_array()) {
    for (auto& item : *value) changed |= Neutralize(&item);
  } else if (value->is_object()) {
    // Keys too (tool-call arguments and schemas are rendered with tojson, keys included): the
    // object is rebuilt in its order with the neutralized keys.
    OrderedJson rebuilt = OrderedJson::object();
    for (auto& [key, item] : value->items()) {
      std::string k = key;
      changed |= NeutralizeText(&k);
      changed |= Neutralize(&item);
      rebuilt[k] = std::move(item);
    }
    *value = std::move(rebuilt);
  }
  return changed;
}

absl::StatusOr<ControlTokenGuard::Ranges> ControlTokenGuard::ClientRanges(
    std::string_view rendered, std::string_view neutral) const {
  const auto refuse = [] {
    return absl::InvalidArgumentError(
        "the conversation holds control-token text (e.g. an end-of-turn marker) that this "
        "model's chat template treats specially, so it cannot be kept apart from the template's "
        "own: remove it, or set control_tokens_in_content to tokenize it as control tokens");
  };
  if (rendered.size() != neutral.size()) return refuse();
  Ranges ranges;
  for (const std::string& control : controls_) {
    for (size_t at = rendered.find(control); at != std::string_view::npos;
         at = rendered.find(control, at + 1)) {
      const std::string_view there = neutral.substr(at, control.size());
      if (there == control) continue;  // the template's own
      if (there.find_first_not_of(filler_) != std::string_view::npos) return refuse();
      ranges.push_back({at, at + control.size()});
    }
  }
  std::sort(ranges.begin(), ranges.end());
  Ranges merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  // Every difference must be one of those places.
  auto next = merged.begin();
  for (size_t i = 0; i < rendered.size(); ++i) {
    while (next != merged.end() && next->second <= i) ++next;
    const bool inside = next != merged.end() && next->first <= i;
    if (rendered[i] != neutral[i] && !inside) return refuse();
  }
  return merged;
}

}  // namespace specula
