// The header validator against a table of malformed files, every truncation of a valid file and
// random byte flips: each must be a clean INVALID_ARGUMENT naming the file (and the tensor when
// one is at fault), never a crash or an out-of-bounds view.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/safetensors_test_util.h"

namespace specula {
namespace {

using ::testing::HasSubstr;
using testing_util::RawFile;
using testing_util::ReadBytes;
using testing_util::ScratchDir;
using testing_util::WriteBytes;

// "a": F32 [2,3] = 24 bytes at [0,24); "b": BF16 [4] = 8 bytes at [24,32).
constexpr const char* kGoodHeader =
    R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
    R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]}})";

absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenBytes(const ScratchDir& dir,
                                                           const std::string& bytes) {
  const std::string path = dir.File("t.safetensors");
  WriteBytes(path, bytes);
  return SafetensorsFile::Open(path);
}

TEST(SafetensorsFuzzTest, GoodFileOpens) {
  ScratchDir dir;
  auto f = OpenBytes(dir, RawFile(kGoodHeader, 32));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->tensors().size(), 2u);
  EXPECT_EQ((*f)->Find("b")->nbytes, 8u);
  EXPECT_EQ((*f)->Find("b")->data - (*f)->Find("a")->data, 24);
}

TEST(SafetensorsFuzzTest, UnpaddedOddHeaderLengthIsAccepted) {
  ScratchDir dir;
  const std::string header = R"({"x":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}} )";
  ASSERT_EQ(header.size() % 2, 1u);
  auto f = OpenBytes(dir, RawFile(header, 2));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->Find("x")->nbytes, 2u);
}

struct Mutation {
  const char* name;
  std::string bytes;
  const char* expect_in_message;  // besides the file name
};

std::vector<Mutation> Mutations() {
  auto tensor = [](const std::string& a_entry) {
    return "{\"a\":" + a_entry + R"(,"b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]}})";
  };
  const std::string good = kGoodHeader;
  std::vector<Mutation> m = {
      {"empty file", "", "too small"},
      {"seven bytes", std::string(7, '\0'), "too small"},
      {"header length zero", RawFile("", 32, 0), "zero"},
      {"header length past end", RawFile(good, 32, good.size() + 33), "exceeds the file size"},
      {"header length huge", RawFile(good, 32, uint64_t{1} << 62), "exceeds"},
      {"header length one short", RawFile(good, 32, good.size() - 1), "JSON"},
      {"not json", RawFile("hello world!", 0), "JSON"},
      {"json array", RawFile("[1,2,3]", 0), "not a JSON object"},
      {"json string", RawFile("\"abc\"", 0), "not a JSON object"},
      {"deep nesting", RawFile(std::string(100000, '[') + std::string(100000, ']'), 0), "deep"},
      {"bad dtype", RawFile(tensor(R"({"dtype":"F31","shape":[2,3],"data_offsets":[0,24]})"), 32),
       "invalid dtype"},
      {"I64 dtype", RawFile(tensor(R"({"dtype":"I64","shape":[3],"data_offsets":[0,24]})"), 32),
       "unsupported dtype I64"},
      {"F64 dtype", RawFile(tensor(R"({"dtype":"F64","shape":[3],"data_offsets":[0,24]})"), 32),
       "unsupported dtype F64"},
      {"U8 dtype", RawFile(tensor(R"({"dtype":"U8","shape":[24],"data_offsets":[0,24]})"), 32),
       "unsupported dtype U8"},
      {"dtype not string",
       RawFile(tensor(R"({"dtype":1,"shape":[2,3],"data_offsets":[0,24]})"), 32), "dtype"},
      {"missing dtype", RawFile(tensor(R"({"shape":[2,3],"data_offsets":[0,24]})"), 32), "dtype"},
      {"negative dim",
       RawFile(tensor(R"({"dtype":"F32","shape":[-2,-3],"data_offsets":[0,24]})"), 32), "negative"},
      {"float dim", RawFile(tensor(R"({"dtype":"F32","shape":[2.0,3],"data_offsets":[0,24]})"), 32),
       "not an integer"},
      {"string dim",
       RawFile(tensor(R"({"dtype":"F32","shape":["2",3],"data_offsets":[0,24]})"), 32),
       "not an integer"},
      {"shape not array", RawFile(tensor(R"({"dtype":"F32","shape":6,"data_offsets":[0,24]})"), 32),
       "shape"},
      {"overflowing shape",
       RawFile(
           tensor(R"({"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,24]})"),
           32),
       "does not match shape"},
      {"huge dim",
       RawFile(tensor(R"({"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,24]})"),
               32),
       "too large"},
      {"offsets out of range",
       RawFile(tensor(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,1000]})"), 32),
       "exceed the data section"},
      {"offsets end < begin",
       RawFile(tensor(R"({"dtype":"F32","shape":[2,3],"data_offsets":[24,0]})"), 32),
       "end < begin"},
      {"offsets negative",
       RawFile(tensor(R"({"dtype":"F32","shape":[2,3],"data_offsets":[-24,0]})"), 32),
       "data_offsets"},
      {"offsets three",
       RawFile(tensor(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,24,32]})"), 32),
       "data_offsets"},
      {"offsets missing", RawFile(tensor(R"({"dtype":"F32","shape":[2,3]})"), 32), "data_offsets"},
      {"size mismatch",
       RawFile(tensor(R"({"dtype":"F32","shape":[2,2],"data_offsets":[0,24]})"), 32),
       "does not match shape"},
      {"dtype size mismatch",
       RawFile(tensor(R"({"dtype":"F16","shape":[2,3],"data_offsets":[0,24]})"), 32),
       "does not match shape"},
      {"overlap",
       RawFile(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
               R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]}})",
               24),
       "overlaps"},
      {"identical ranges",
       RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
               8),
       "overlaps"},
      {"hole",
       RawFile(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
               R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[26,34]}})",
               34),
       "gap"},
      {"trailing bytes", RawFile(good, 40), "trailing"},
      {"duplicate tensor key",
       RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
               16),
       "duplicate JSON key 'a'"},
      {"duplicate inner key",
       RawFile(R"({"a":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})", 8),
       "duplicate JSON key 'dtype'"},
      {"metadata value not string",
       RawFile(
           R"({"__metadata__":{"format":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
           8),
       "not a string"},
      {"metadata not object",
       RawFile(R"({"__metadata__":["pt"],"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
               8),
       "__metadata__"},
      {"entry not object", RawFile(tensor("[1,2]"), 32), "not a JSON object"},
      {"unknown entry key",
       RawFile(tensor(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,24],"x":1})"), 32),
       "unexpected key 'x'"},
      {"empty name", RawFile(R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
       "empty tensor name"},
      {"invalid utf8 name",
       RawFile("{\"\xff\xfe\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
       "JSON"},
  };
  return m;
}

TEST(SafetensorsFuzzTest, MutationTable) {
  ScratchDir dir;
  const std::string path = dir.File("t.safetensors");
  for (const Mutation& m : Mutations()) {
    auto f = OpenBytes(dir, m.bytes);
    ASSERT_FALSE(f.ok()) << m.name;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument)
        << m.name << ": " << f.status();
    EXPECT_THAT(f.status().message(), HasSubstr(path)) << m.name;
    EXPECT_THAT(f.status().message(), HasSubstr(m.expect_in_message)) << m.name;
  }
}

TEST(SafetensorsFuzzTest, TensorErrorsNameTheTensor) {
  ScratchDir dir;
  for (const char* entry : {R"({"dtype":"I64","shape":[3],"data_offsets":[0,24]})",
                            R"({"dtype":"F32","shape":[-1],"data_offsets":[0,24]})",
                            R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,99]})"}) {
    auto f = OpenBytes(dir, RawFile(std::string(R"({"layers.0.wq":)") + entry + "}", 24));
    ASSERT_FALSE(f.ok()) << entry;
    EXPECT_THAT(f.status().message(), HasSubstr("'layers.0.wq'")) << entry;
  }
}

TEST(SafetensorsFuzzTest, EveryTruncationIsAnError) {
  ScratchDir dir;
  const std::string full = RawFile(kGoodHeader, 32);
  for (size_t len = 0; len < full.size(); ++len) {
    auto f = OpenBytes(dir, full.substr(0, len));
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << "length " << len;
  }
}

// Deterministic xorshift so failures reproduce.
uint64_t NextRand(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

TEST(SafetensorsFuzzTest, RandomHeaderByteFlipsNeverCrash) {
  ScratchDir dir;
  const std::string path = dir.File("t.safetensors");
  const std::string full = RawFile(kGoodHeader, 32);
  const size_t header_end = 8 + std::string(kGoodHeader).size();
  uint64_t state = 0x1234567890abcdefull;
  int ok_count = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string bytes = full;
    const int flips = 1 + static_cast<int>(NextRand(state) % 3);
    for (int k = 0; k < flips; ++k) {
      const size_t pos = NextRand(state) % header_end;
      const int mode = static_cast<int>(NextRand(state) % 3);
      if (mode == 0) {
        bytes[pos] = static_cast<char>(bytes[pos] ^ (1 << (NextRand(state) % 8)));
      } else if (mode == 1) {
        bytes[pos] = "{}[]\",:0123456789-. eE"[NextRand(state) % 22];
      } else {
        bytes[pos] = static_cast<char>(NextRand(state) & 0xff);
      }
    }
    WriteBytes(path, bytes);
    auto f = SafetensorsFile::Open(path);
    if (!f.ok()) {
      EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
      EXPECT_THAT(f.status().message(), HasSubstr(path));
      continue;
    }
    ++ok_count;
    // An accepted header must describe views inside the file: sizes add up to the data section.
    size_t total = 0;
    for (const auto& [name, view] : (*f)->tensors()) {
      EXPECT_EQ(view.nbytes, static_cast<size_t>(view.numel()) * DTypeSize(view.dtype));
      volatile unsigned sum = 0;
      for (size_t i = 0; i < view.nbytes; ++i) sum = sum + static_cast<unsigned>(view.data[i]);
      total += view.nbytes;
    }
    EXPECT_LE(total, bytes.size());
  }
  // Flips inside names or padding keep a file valid; the test must see both outcomes.
  EXPECT_GT(ok_count, 0);
  EXPECT_LT(ok_count, 3000);
}

}  // namespace
}  // namespace specula
