// Helpers shared by the safetensors tests: scratch directories and raw file construction.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"
#include "gtest/gtest.h"

namespace specula::testing_util {

// A fresh directory under the test temp dir, removed at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::path(::testing::TempDir()) /
            ("specula_mio_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return (path_ / name).string(); }
  const std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// 8-byte little-endian length + header + `data_bytes` bytes of data (a repeating pattern).
inline std::string RawFile(const std::string& header, size_t data_bytes, uint64_t header_len) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(header_len >> (8 * i));
  out += header;
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i * 7 + 1));
  return out;
}
inline std::string RawFile(const std::string& header, size_t data_bytes) {
  return RawFile(header, data_bytes, header.size());
}

inline TensorToWrite F32Tensor(const std::string& name, std::vector<int64_t> shape, float start) {
  TensorToWrite t;
  t.name = name;
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.data.resize(static_cast<size_t>(n) * 4);
  for (int64_t i = 0; i < n; ++i) {
    const float v = start + static_cast<float>(i);
    std::memcpy(t.data.data() + 4 * i, &v, 4);
  }
  return t;
}

}  // namespace specula::testing_util
