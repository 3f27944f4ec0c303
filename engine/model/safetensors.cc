#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "engine/common/bounded_file.h"
#include "engine/common/status_macros.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using Json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we, which also bounds the
// memory a hostile file can make the JSON parser allocate.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
// nlohmann's DOM is freed recursively in some paths; deep nesting has no legitimate use in a
// safetensors header (its depth is 3), so refuse it before parsing.
constexpr int kMaxJsonDepth = 16;
// An index lists one line per tensor: a few MiB for the largest models.
constexpr int64_t kMaxIndexBytes = 64 << 20;

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status FileError(const std::string& path, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", msg));
}

absl::Status TensorError(const std::string& path, const std::string& tensor,
                         absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", tensor, "': ", msg));
}

bool NestingWithin(absl::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

// Parses JSON without exceptions; duplicate keys in any object are an error (nlohmann would
// silently keep the last one, hiding a corrupt or ambiguous header).
absl::StatusOr<Json> ParseJsonStrict(absl::string_view text, const std::string& path) {
  if (!NestingWithin(text, kMaxJsonDepth)) return FileError(path, "JSON nested too deeply");
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get_ref<const std::string&>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get_ref<const std::string&>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  Json json;
  try {
    json = Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  } catch (const std::exception& e) {
    return FileError(path, absl::StrCat("invalid JSON: ", e.what()));
  }
  if (json.is_discarded()) return FileError(path, "header is not valid JSON");
  if (!duplicate.empty())
    return FileError(path, absl::StrCat("duplicate JSON key '", duplicate, "'"));
  return json;
}

// Accepted dtypes map to DType; the other dtypes of the safetensors format are recognised so
// the error can say "unsupported" rather than "invalid".
absl::StatusOr<DType> ParseDType(const std::string& name, const std::string& path,
                                 const std::string& tensor) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  static const std::set<std::string, std::less<>> kKnown = {
      "BOOL", "U8",      "I8",      "I16",     "U16",  "I32", "U32",     "I64",    "U64",
      "F64",  "F8_E4M3", "F8_E5M2", "F8_E8M0", "E8M0", "F4",  "F6_E2M3", "F6_E3M2"};
  if (kKnown.count(name)) {
    return TensorError(path, tensor,
                       absl::StrCat("unsupported dtype ", name, " (only F32, F16, BF16)"));
  }
  return TensorError(path, tensor, absl::StrCat("invalid dtype '", name, "'"));
}

struct ParsedEntry {
  TensorView view;
  uint64_t begin = 0;
  uint64_t end = 0;
};

absl::StatusOr<ParsedEntry> ParseTensorEntry(const std::string& path, const std::string& name,
                                             const Json& entry, uint64_t data_size) {
  if (name.empty()) return FileError(path, "empty tensor name");
  if (!entry.is_object()) return TensorError(path, name, "entry is not a JSON object");
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return TensorError(path, name, absl::StrCat("unexpected key '", key, "'"));
    }
  }
  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return TensorError(path, name, "missing or non-string 'dtype'");
  }
  ParsedEntry out;
  out.view.name = name;
  out.view.file = path;
  ASSIGN_OR_RETURN(out.view.dtype, ParseDType(dtype_it->get<std::string>(), path, name));

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return TensorError(path, name, "missing or non-array 'shape'");
  }
  // Numel is bounded by the data section size, so checking against it at every step keeps the
  // product from overflowing.
  uint64_t numel = 1;
  for (const Json& dim : *shape_it) {
    if (!dim.is_number_integer()) return TensorError(path, name, "shape entry is not an integer");
    if (!dim.is_number_unsigned() && dim.get<int64_t>() < 0) {
      return TensorError(path, name, "negative dimension in shape");
    }
    const uint64_t d = dim.get<uint64_t>();
    if (d > static_cast<uint64_t>(INT64_MAX)) return TensorError(path, name, "dimension too large");
    out.view.shape.push_back(static_cast<int64_t>(d));
    if (d != 0 && numel > data_size / d)
      numel = data_size + 1;  // saturate: cannot fit anyway
    else
      numel *= d;
  }
  const uint64_t elem = DTypeSize(out.view.dtype);
  const bool too_big = numel > data_size / elem;
  const uint64_t nbytes = too_big ? 0 : numel * elem;

  auto off_it = entry.find("data_offsets");
  if (off_it == entry.end() || !off_it->is_array() || off_it->size() != 2 ||
      !(*off_it)[0].is_number_unsigned() || !(*off_it)[1].is_number_unsigned()) {
    return TensorError(path, name, "'data_offsets' must be two non-negative integers");
  }
  out.begin = (*off_it)[0].get<uint64_t>();
  out.end = (*off_it)[1].get<uint64_t>();
  if (out.end < out.begin) return TensorError(path, name, "data_offsets end < begin");
  if (out.end > data_size) {
    return TensorError(path, name,
                       absl::StrCat("data_offsets [", out.begin, ", ", out.end,
                                    "] exceed the data section (", data_size, " bytes)"));
  }
  if (too_big || out.end - out.begin != nbytes) {
    return TensorError(
        path, name,
        absl::StrCat("byte size ", out.end - out.begin, " does not match shape ",
                     ShapeString(out.view.shape), " of ", std::string(DTypeName(out.view.dtype))));
  }
  out.view.nbytes = nbytes;
  return out;
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return FileError(path, "not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return FileError(path, absl::StrCat("file too small (", size, " bytes) for a header"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED)
    return FileError(path, absl::StrCat("mmap failed: ", std::strerror(errno)));
  file->mapping_ = map;
  file->mapping_size_ = size;
  const auto* bytes = static_cast<const unsigned char*>(map);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len == 0) return FileError(path, "header length is zero");
  if (header_len > kMaxHeaderBytes) {
    return FileError(path, absl::StrCat("header length ", header_len, " exceeds the 100 MB limit"));
  }
  if (header_len > size - 8) {
    return FileError(path, absl::StrCat("header length ", header_len, " exceeds the file size ",
                                        size, " (truncated file?)"));
  }
  const absl::string_view header(reinterpret_cast<const char*>(bytes + 8), header_len);
  ASSIGN_OR_RETURN(Json json, ParseJsonStrict(header, path));
  if (!json.is_object()) return FileError(path, "header is not a JSON object");

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;
  std::vector<ParsedEntry> entries;
  for (const auto& [key, value] : json.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return FileError(path, "__metadata__ is not a JSON object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return FileError(path, absl::StrCat("__metadata__ value of '", mk, "' is not a string"));
        }
        file->metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    ASSIGN_OR_RETURN(ParsedEntry entry, ParseTensorEntry(path, key, value, data_size));
    entry.view.data = reinterpret_cast<const std::byte*>(bytes + data_start + entry.begin);
    entries.push_back(std::move(entry));
  }

  // Like the reference implementation, the tensors must tile the data section exactly: no
  // overlap (two names aliasing the same bytes), no gaps, no trailing bytes.
  std::vector<const ParsedEntry*> order;
  for (const auto& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const ParsedEntry* a, const ParsedEntry* b) {
    return std::tie(a->begin, a->end, a->view.name) < std::tie(b->begin, b->end, b->view.name);
  });
  uint64_t cursor = 0;
  const ParsedEntry* prev = nullptr;
  for (const ParsedEntry* e : order) {
    if (e->begin < cursor) {
      return TensorError(path, e->view.name,
                         absl::StrCat("data overlaps tensor '", prev->view.name, "'"));
    }
    if (e->begin > cursor) {
      return TensorError(path, e->view.name,
                         absl::StrCat("gap of ", e->begin - cursor, " bytes before its data"));
    }
    cursor = e->end;
    prev = e;
  }
  if (cursor != data_size) {
    return FileError(
        path, absl::StrCat(data_size - cursor, " trailing bytes after the last tensor's data"));
  }
  for (auto& e : entries) file->tensors_.emplace(e.view.name, std::move(e.view));
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

const TensorView* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::unique_ptr<WeightFiles>> WeightFiles::OpenDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  auto files = std::unique_ptr<WeightFiles>(new WeightFiles());
  files->dir_ = dir;
  std::error_code ec;
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  // Same precedence as transformers: a single file wins over an index.
  if (fs::exists(single, ec)) {
    ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(single));
    for (const auto& [name, view] : f->tensors()) files->index_[name] = &view;
    files->files_.push_back(std::move(f));
    return files;
  }
  if (!fs::exists(index_path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": neither model.safetensors nor model.safetensors.index.json exists"));
  }
  ASSIGN_OR_RETURN(const std::string text,
                   ReadBoundedFile(index_path, kMaxIndexBytes, "safetensors index"));
  ASSIGN_OR_RETURN(Json index, ParseJsonStrict(text, index_path));
  if (!index.is_object()) return FileError(index_path, "not a JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) {
    return FileError(index_path, "missing or non-object 'weight_map'");
  }
  std::map<std::string, std::string> tensor_to_shard;
  std::map<std::string, size_t> shard_slot;
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) {
      return TensorError(index_path, tensor, "weight_map value is not a file name");
    }
    const std::string shard_name = shard.get<std::string>();
    // Shard names are plain file names inside the model directory, never paths out of it.
    if (shard_name.empty() || shard_name.find('/') != std::string::npos || shard_name == "." ||
        shard_name == "..") {
      return TensorError(index_path, tensor,
                         absl::StrCat("invalid shard file name '", shard_name, "'"));
    }
    tensor_to_shard[tensor] = shard_name;
    shard_slot.emplace(shard_name, 0);
  }
  if (shard_slot.empty()) return FileError(index_path, "weight_map is empty");
  for (auto& [shard_name, slot] : shard_slot) {
    ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open((fs::path(dir) / shard_name).string()));
    slot = files->files_.size();
    files->files_.push_back(std::move(f));
  }
  for (const auto& file : files->files_) {
    for (const auto& [name, view] : file->tensors()) {
      auto [it, inserted] = files->index_.emplace(name, &view);
      if (!inserted) {
        return TensorError(file->path(), name, absl::StrCat("also present in ", it->second->file));
      }
      if (!tensor_to_shard.count(name)) {
        return TensorError(file->path(), name, absl::StrCat("not listed in ", index_path));
      }
    }
  }
  for (const auto& [tensor, shard_name] : tensor_to_shard) {
    const SafetensorsFile& shard = *files->files_[shard_slot[shard_name]];
    if (shard.Find(tensor) == nullptr) {
      auto it = files->index_.find(tensor);
      return TensorError(index_path, tensor,
                         absl::StrCat("listed in shard ", shard_name, " but not found there",
                                      it == files->index_.end()
                                          ? std::string()
                                          : absl::StrCat(" (found in ", it->second->file, ")")));
    }
  }
  return files;
}

const TensorView* WeightFiles::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> WeightFiles::Names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, view] : index_) names.push_back(name);
  return names;
}

absl::StatusOr<const TensorView*> WeightFiles::Require(const std::string& name,
                                                       absl::Span<const int64_t> shape) const {
  const TensorView* view = Find(name);
  if (view == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        dir_, ": tensor '", name, "' not found (expected shape ", ShapeString(shape), ")"));
  }
  if (!std::equal(view->shape.begin(), view->shape.end(), shape.begin(), shape.end())) {
    return TensorError(
        view->file, name,
        absl::StrCat("expected shape ", ShapeString(shape), ", got ", ShapeString(view->shape)));
  }
  return view;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::string header;
  try {
    nlohmann::ordered_json json = nlohmann::ordered_json::object();
    if (!metadata.empty()) {
      nlohmann::ordered_json meta = nlohmann::ordered_json::object();
      for (const auto& [k, v] : metadata) meta[k] = v;
      json["__metadata__"] = std::move(meta);
    }
    uint64_t offset = 0;
    for (const TensorToWrite& t : tensors) {
      if (t.name.empty() || t.name == "__metadata__" || json.contains(t.name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor '", t.name, "': empty, reserved or duplicate name"));
      }
      uint64_t numel = 1;
      for (int64_t d : t.shape) {
        if (d < 0) return TensorError(path, t.name, "negative dimension");
        numel *= static_cast<uint64_t>(d);
      }
      if (numel * DTypeSize(t.dtype) != t.data.size()) {
        return TensorError(
            path, t.name,
            absl::StrCat("data has ", t.data.size(), " bytes, shape ", ShapeString(t.shape), " of ",
                         std::string(DTypeName(t.dtype)), " needs ", numel * DTypeSize(t.dtype)));
      }
      json[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
      offset += t.data.size();
    }
    header = json.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::strict);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot encode header: ", e.what()));
  }
  // Padding the header keeps the data section 8-byte aligned in the mapping.
  header.append((8 - header.size() % 8) % 8, ' ');
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  }
  unsigned char len_bytes[8];
  uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(len >> (8 * i));
  bool ok = std::fwrite(len_bytes, 1, 8, f) == 8 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (const TensorToWrite& t : tensors) {
    if (!ok) break;
    ok = t.data.empty() || std::fwrite(t.data.data(), 1, t.data.size(), f) == t.data.size();
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return absl::InternalError(absl::StrCat(path, ": write failed: ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace specula
