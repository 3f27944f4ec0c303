#include "engine/common/inline_function.h"

#include <array>
#include <cstdint>

#include "gtest/gtest.h"

namespace specula {
namespace {

TEST(InlineFunctionTest, RunsTheCallableWithItsCaptures) {
  int64_t sum = 0;
  const std::array<int64_t, 4> values = {1, 2, 3, 4};
  const int64_t* data = values.data();
  InlineFunction f = [&sum, data, n = values.size()] {
    for (size_t i = 0; i < n; ++i) sum += data[i];
  };
  ASSERT_TRUE(f);
  f();
  EXPECT_EQ(sum, 10);
  f();
  EXPECT_EQ(sum, 20);
}

TEST(InlineFunctionTest, ACopyRunsTheSameCallable) {
  int calls = 0;
  InlineFunction original = [&calls] { ++calls; };
  InlineFunction copy = original;
  InlineFunction assigned;
  EXPECT_FALSE(assigned);
  assigned = copy;
  copy();
  assigned();
  EXPECT_EQ(calls, 2);
}

TEST(InlineFunctionTest, CallingAnEmptyOneIsCaught) {
  const InlineFunction empty;
  EXPECT_DEATH(empty(), "empty InlineFunction");
}

TEST(InlineFunctionTest, HoldsCapturesUpToItsSize) {
  // Seven 8-byte captures and a pointer: the whole inline storage, each capture intact.
  std::array<int64_t, 7> seen{};
  int64_t a = 1, b = 2, c = 3, d = 4, e = 5, f = 6, g = 7;
  int64_t* out = seen.data();
  InlineFunction fn = [a, b, c, d, e, f, g, out] {
    const int64_t all[] = {a, b, c, d, e, f, g};
    for (int i = 0; i < 7; ++i) out[i] = all[i];
  };
  fn();
  EXPECT_EQ(seen, (std::array<int64_t, 7>{1, 2, 3, 4, 5, 6, 7}));
}

}  // namespace
}  // namespace specula
