#include "tools/common/dashed_flags.h"

#include <algorithm>

namespace specula {

std::vector<char*> ParseDashedCommandLine(int argc, char** argv,
                                          std::vector<std::string>* storage) {
  storage->clear();
  storage->reserve(argc);
  bool flags_ended = false;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") flags_ended = true;
    if (i > 0 && !flags_ended && arg.rfind("--", 0) == 0) {
      const size_t end = std::min(arg.find('='), arg.size());
      std::replace(arg.begin() + 2, arg.begin() + static_cast<std::ptrdiff_t>(end), '-', '_');
    }
    storage->push_back(std::move(arg));
  }
  std::vector<char*> args;
  for (std::string& s : *storage) args.push_back(s.data());
  return absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
}

}  // namespace specula
