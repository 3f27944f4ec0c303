// Round trips, sharded model directories and Require.
#include "engine/model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/safetensors_test_util.h"

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::F32Tensor;
using testing_util::ReadBytes;
using testing_util::ScratchDir;
using testing_util::WriteBytes;

TensorToWrite HalfTensor(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  TensorToWrite t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  for (int64_t i = 0; i < n; ++i) {
    const float v = 0.5f * static_cast<float>(i) - 3.0f;
    const uint16_t h = dtype == DType::kF16 ? FloatToF16(v) : FloatToBf16(v);
    t.data.push_back(static_cast<std::byte>(h & 0xff));
    t.data.push_back(static_cast<std::byte>(h >> 8));
  }
  return t;
}

TEST(SafetensorsTest, RoundTripAllDtypes) {
  ScratchDir dir;
  const std::string path = dir.File("rt.safetensors");
  std::vector<TensorToWrite> tensors = {
      F32Tensor("f32", {2, 3}, 1.0f), HalfTensor("f16", DType::kF16, {5}),
      HalfTensor("bf16", DType::kBF16, {3, 1, 3}), F32Tensor("scalar", {}, 7.0f),
      F32Tensor("empty", {0, 4}, 0.0f)};
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}, {"note", "hi"}}).ok());

  // The data section starts 8-byte aligned and the header is padded with spaces.
  const std::string raw = ReadBytes(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(raw[8], '{');

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->path(), path);
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ((*file)->metadata().at("note"), "hi");
  ASSERT_EQ((*file)->tensors().size(), tensors.size());
  for (const TensorToWrite& t : tensors) {
    const TensorView* v = (*file)->Find(t.name);
    ASSERT_NE(v, nullptr) << t.name;
    EXPECT_EQ(v->name, t.name);
    EXPECT_EQ(v->dtype, t.dtype) << t.name;
    EXPECT_EQ(v->shape, t.shape) << t.name;
    EXPECT_EQ(v->file, path);
    ASSERT_EQ(v->nbytes, t.data.size()) << t.name;
    EXPECT_TRUE(std::equal(t.data.begin(), t.data.end(), v->data)) << t.name;
  }
  EXPECT_EQ((*file)->Find("scalar")->numel(), 1);
  EXPECT_EQ((*file)->Find("empty")->numel(), 0);
  EXPECT_EQ((*file)->Find("missing"), nullptr);
  float f;
  std::memcpy(&f, (*file)->Find("f32")->data + 4 * 5, 4);
  EXPECT_EQ(f, 6.0f);
  EXPECT_EQ(Bf16ToFloat(static_cast<uint16_t>((*file)->Find("bf16")->data[0]) |
                        static_cast<uint16_t>((*file)->Find("bf16")->data[1]) << 8),
            -3.0f);
}

TEST(SafetensorsTest, WriteRejectsBadTensors) {
  ScratchDir dir;
  TensorToWrite short_data = F32Tensor("x", {4}, 0.0f);
  short_data.data.pop_back();
  absl::Status s = WriteSafetensors(dir.File("a.safetensors"), {short_data});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'x'"));

  s = WriteSafetensors(dir.File("b.safetensors"),
                       {F32Tensor("dup", {1}, 0.0f), F32Tensor("dup", {1}, 0.0f)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dup"));

  s = WriteSafetensors(dir.File("c.safetensors"), {F32Tensor("__metadata__", {1}, 0.0f)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);

  s = WriteSafetensors(dir.File("no/such/dir/d.safetensors"), {F32Tensor("x", {1}, 0.0f)});
  EXPECT_FALSE(s.ok());
}

TEST(SafetensorsTest, OpenMissingOrNonRegularFile) {
  ScratchDir dir;
  auto missing = SafetensorsFile::Open(dir.File("nope.safetensors"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.safetensors"));
  auto directory = SafetensorsFile::Open(dir.str());
  EXPECT_FALSE(directory.ok());
}

// Two shards: a,b in the first, c in the second.
class SafetensorsShardedDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(WriteSafetensors(dir_.File("model-00001-of-00002.safetensors"),
                                 {F32Tensor("a", {2}, 0.f), F32Tensor("b", {3, 2}, 10.f)})
                    .ok());
    ASSERT_TRUE(
        WriteSafetensors(dir_.File("model-00002-of-00002.safetensors"), {F32Tensor("c", {4}, 20.f)})
            .ok());
  }
  void WriteIndex(const std::string& weight_map) {
    WriteBytes(dir_.File("model.safetensors.index.json"),
               R"({"metadata": {"total_size": 48}, "weight_map": )" + weight_map + "}");
  }
  static constexpr const char* kGoodMap =
      R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
          "c": "model-00002-of-00002.safetensors"})";
  ScratchDir dir_;
};

TEST_F(SafetensorsShardedDirTest, OpensAllShards) {
  WriteIndex(kGoodMap);
  auto files = WeightFiles::OpenDirectory(dir_.str());
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT((*files)->Names(), ElementsAre("a", "b", "c"));
  ASSERT_NE((*files)->Find("c"), nullptr);
  EXPECT_THAT((*files)->Find("c")->file, HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_THAT((*files)->Find("b")->file, HasSubstr("model-00001-of-00002.safetensors"));
  float v;
  std::memcpy(&v, (*files)->Find("c")->data + 4, 4);
  EXPECT_EQ(v, 21.f);
  EXPECT_EQ((*files)->Find("zzz"), nullptr);
}

TEST_F(SafetensorsShardedDirTest, MissingShard) {
  WriteIndex(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors", "d": "model-00003-of-00003.safetensors"})");
  auto files = WeightFiles::OpenDirectory(dir_.str());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(files.status().message(), HasSubstr("model-00003-of-00003.safetensors"));
}

TEST_F(SafetensorsShardedDirTest, TensorInWrongShard) {
  WriteIndex(R"({"a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors"})");
  auto files = WeightFiles::OpenDirectory(dir_.str());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(), HasSubstr("'a'"));
  EXPECT_THAT(files.status().message(), HasSubstr("model-00002-of-00002.safetensors"));
}

TEST_F(SafetensorsShardedDirTest, IndexedTensorMissingEverywhere) {
  WriteIndex(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors", "x": "model-00002-of-00002.safetensors"})");
  auto files = WeightFiles::OpenDirectory(dir_.str());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(), HasSubstr("'x'"));
}

TEST_F(SafetensorsShardedDirTest, TensorInTwoShards) {
  ASSERT_TRUE(WriteSafetensors(dir_.File("model-00002-of-00002.safetensors"),
                               {F32Tensor("a", {2}, 0.f), F32Tensor("c", {4}, 20.f)})
                  .ok());
  WriteIndex(kGoodMap);
  auto files = WeightFiles::OpenDirectory(dir_.str());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(), HasSubstr("'a'"));
  EXPECT_THAT(files.status().message(), HasSubstr("also present"));
}

TEST_F(SafetensorsShardedDirTest, ShardTensorNotInIndex) {
  WriteIndex(
      R"({"a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"})");
  auto files = WeightFiles::OpenDirectory(dir_.str());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(), HasSubstr("'b'"));
}

TEST_F(SafetensorsShardedDirTest, MalformedIndexes) {
  for (const char* bad : {"not json", "[1, 2]", R"({"metadata": {}})", R"({"weight_map": []})",
                          R"({"weight_map": {}})", R"({"weight_map": {"a": 3}})",
                          R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})",
                          R"({"weight_map": {"a": "/etc/passwd"}})"}) {
    WriteBytes(dir_.File("model.safetensors.index.json"), bad);
    auto files = WeightFiles::OpenDirectory(dir_.str());
    EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(files.status().message(), HasSubstr("model.safetensors.index.json")) << bad;
  }
}

TEST_F(SafetensorsShardedDirTest, CorruptShardIsNamed) {
  WriteIndex(kGoodMap);
  WriteBytes(dir_.File("model-00002-of-00002.safetensors"), "garbage!garbage!");
  auto files = WeightFiles::OpenDirectory(dir_.str());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(), HasSubstr("model-00002-of-00002.safetensors"));
}

TEST(SafetensorsWeightFilesTest, SingleFileAndEmptyDirectory) {
  ScratchDir dir;
  auto none = WeightFiles::OpenDirectory(dir.str());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr(dir.str()));

  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"),
                               {F32Tensor("w", {2, 3}, 0.f), F32Tensor("v", {3}, 0.f)})
                  .ok());
  auto files = WeightFiles::OpenDirectory(dir.str());
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT((*files)->Names(), ElementsAre("v", "w"));

  const int64_t good[] = {2, 3};
  auto ok = (*files)->Require("w", good);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->name, "w");

  const int64_t wrong[] = {3, 2};
  auto mismatch = (*files)->Require("w", wrong);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.status().message(), HasSubstr("'w'"));
  EXPECT_THAT(mismatch.status().message(), HasSubstr("[3, 2]"));
  EXPECT_THAT(mismatch.status().message(), HasSubstr("[2, 3]"));
  EXPECT_THAT(mismatch.status().message(), HasSubstr("model.safetensors"));

  const int64_t rank1[] = {6};
  EXPECT_EQ((*files)->Require("w", rank1).status().code(), absl::StatusCode::kInvalidArgument);

  auto missing = (*files)->Require("u", good);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'u'"));
}

TEST(SafetensorsWeightFilesTest, SingleFileTakesPrecedenceOverIndex) {
  ScratchDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), {F32Tensor("w", {1}, 0.f)}).ok());
  WriteBytes(dir.File("model.safetensors.index.json"), "broken");
  auto files = WeightFiles::OpenDirectory(dir.str());
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT((*files)->Names(), ElementsAre("w"));
}

}  // namespace
}  // namespace specula
