#include "engine/kv/page_selector.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/kv/exact_selector.h"
#include "engine/kv/quest_selector.h"

namespace specula {

absl::StatusOr<std::unique_ptr<PageSelector>> MakePageSelector(std::string_view name,
                                                               const HostKvStore& store) {
  if (name == "quest") return std::make_unique<QuestSelector>(store);
  if (name == "exact") return std::make_unique<ExactSelector>(store);
  return absl::InvalidArgumentError(absl::StrCat("unknown page selector \"",
                                                 absl::string_view(name.data(), name.size()),
                                                 "\"; accepted: quest, exact"));
}

}  // namespace specula
