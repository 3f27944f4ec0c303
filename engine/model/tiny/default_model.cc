#include "engine/model/tiny/default_model.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "engine/model/tiny/tiny_model_writer.h"

namespace specula {
namespace {

// Bump when the writer's output changes, so stale caches are not reused.
constexpr char kDefaultModelName[] = "tiny-llama3-v1";

std::filesystem::path CacheRoot() {
  if (const char* d = std::getenv("SPECULA_CACHE_DIR"); d != nullptr && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d != nullptr && *d) {
    return std::filesystem::path(d) / "specula";
  }
  if (const char* d = std::getenv("HOME"); d != nullptr && *d) {
    return std::filesystem::path(d) / ".cache" / "specula";
  }
  return std::filesystem::temp_directory_path() / "specula";
}

}  // namespace

absl::StatusOr<std::string> EnsureDefaultModel() {
  namespace fs = std::filesystem;
  const fs::path dir = CacheRoot() / "models" / kDefaultModelName;
  std::error_code ec;
  if (fs::exists(dir / "config.json", ec)) return dir.string();
  fs::create_directories(dir.parent_path(), ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create model cache ", dir.parent_path().string(), ": ", ec.message()));
  }
  const fs::path tmp = dir.parent_path() / absl::StrCat(".", kDefaultModelName, ".", getpid());
  TinyModelOptions options;
  options.out_dir = tmp.string();
  options.arch = TinyArch::kLlama3;
  if (absl::Status s = WriteTinyModel(options); !s.ok()) {
    fs::remove_all(tmp, ec);
    return s;
  }
  fs::rename(tmp, dir, ec);
  if (ec) {
    fs::remove_all(tmp, ec);  // another process won the race; its copy is identical
    if (!fs::exists(dir / "config.json")) {
      return absl::UnavailableError(absl::StrCat("cannot install the default model in ", dir.string()));
    }
  }
  return dir.string();
}

}  // namespace specula
