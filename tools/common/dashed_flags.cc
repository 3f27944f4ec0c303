#include "tools/common/dashed_flags.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "engine/common/build_info.h"

namespace specula {
namespace {

bool IsHelp(std::string_view arg) { return arg == "--help" || arg == "-h" || arg == "-help"; }
bool IsVersion(std::string_view arg) { return arg == "--version" || arg == "-version"; }

// Names of the flags given on the command line (underscored), as ParseDashedCommandLine saw them.
absl::flat_hash_set<std::string>& GivenFlags() {
  static auto* given = new absl::flat_hash_set<std::string>();
  return *given;
}

}  // namespace

std::string DashedFlagsHelp() {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    // The binary's own flags; Abseil's (--flagfile, --helpfull, ...) stay in --helpfull.
    if (!absl::StrContains(flag->Filename(), "absl/")) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string out = absl::StrCat(absl::ProgramUsageMessage(), "\n\nFlags:\n");
  for (const absl::CommandLineFlag* f : flags) {
    const std::string def = f->DefaultValue();
    absl::StrAppend(&out, "  --", absl::StrReplaceAll(f->Name(), {{"_", "-"}}), "\n      ",
                    f->Help(), def.empty() ? "" : absl::StrCat(" (default: ", def, ")"), "\n");
  }
  absl::StrAppend(&out,
                  "\nFlags may be written with dashes or underscores, as --flag=value or "
                  "--flag value.\n");
  return out;
}

std::vector<char*> ParseDashedCommandLine(int argc, char** argv,
                                          std::vector<std::string>* storage) {
  storage->clear();
  storage->reserve(argc);
  bool flags_ended = false;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") flags_ended = true;
    if (i > 0 && !flags_ended && IsHelp(arg)) {
      // Abseil's --help lists only flags of a file named like the program (none of ours).
      std::fputs(DashedFlagsHelp().c_str(), stdout);
      std::exit(0);
    }
    if (i > 0 && !flags_ended && IsVersion(arg)) {
      // Abseil's own --version would say "Debug build (NDEBUG not #defined)" whatever the build.
      const absl::string_view program = argv[0];
      std::puts(VersionLine(program.substr(program.rfind('/') + 1)).c_str());
      std::exit(0);
    }
    if (i > 0 && !flags_ended && arg.rfind("--", 0) == 0) {
      const size_t end = std::min(arg.find('='), arg.size());
      std::replace(arg.begin() + 2, arg.begin() + static_cast<std::ptrdiff_t>(end), '-', '_');
      GivenFlags().insert(arg.substr(2, end - 2));
    }
    storage->push_back(std::move(arg));
  }
  std::vector<char*> args;
  for (std::string& s : *storage) args.push_back(s.data());
  return absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
}

std::optional<std::string> StringOverride(const absl::Flag<std::optional<std::string>>& flag) {
  if (std::optional<std::string> v = absl::GetFlag(flag)) return v;
  // Abseil parses an empty value of an optional flag as "not set"; on the command line it means
  // the empty string (e.g. --metrics-listen "" turns the endpoint off).
  if (GivenFlags().contains(absl::GetFlagReflectionHandle(flag).Name())) return std::string();
  return std::nullopt;
}

}  // namespace specula
