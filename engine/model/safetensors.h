// Reading and writing Hugging Face safetensors files.
//
// Files are mmapped read-only; tensor views point into the mapping and stay valid as long as the
// owning SafetensorsFile / WeightFiles object lives. Every header is validated strictly before
// any tensor is exposed (header length, JSON, dtype, shape, byte size, offsets inside the data
// section, no overlap), so a corrupt or truncated file is an error naming the file and the tensor,
// never a crash. Thread-safety: immutable after Open, safe to read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/common/dtype.h"

namespace specula {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // points into the file mapping
  size_t nbytes = 0;
  std::string file;  // path of the file holding it, for error messages

  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps and validates one .safetensors file. Dtypes other than F32/F16/BF16 are
  // INVALID_ARGUMENT naming the tensor and the dtype.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorView* Find(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All weight files of a model directory: `model.safetensors`, or the shards listed in
// `model.safetensors.index.json` (every shard must exist, every tensor of the index must be in
// the shard the index names, and no tensor may appear twice).
class WeightFiles {
 public:
  static absl::StatusOr<std::unique_ptr<WeightFiles>> OpenDirectory(const std::string& dir);

  const TensorView* Find(const std::string& name) const;
  std::vector<std::string> Names() const;  // sorted
  // A tensor that must exist with exactly `shape`: NOT_FOUND / INVALID_ARGUMENT naming the file,
  // the tensor, the expected and the actual shape otherwise.
  absl::StatusOr<const TensorView*> Require(const std::string& name,
                                            absl::Span<const int64_t> shape) const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;  // numel * DTypeSize(dtype) bytes, little endian
};

// Writes a valid safetensors file (tensors in the given order, 8-byte aligned data section).
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace specula
