// CHECK macros for programmer errors (never for input a user can send). The Abseil release in
// Debian 12 predates absl/log, so the project carries this small equivalent: on failure it
// prints file, line, the condition and any streamed context, then aborts.
#pragma once

#include <cstdlib>
#include <iostream>
#include <sstream>

namespace specula::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": CHECK failed: " << condition << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::cerr << stream_.str() << std::endl;
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `CHECK(x) << "context"` compile to nothing when x holds.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace specula::internal

#define CHECK(condition)                                    \
  (condition) ? (void)0                                     \
              : ::specula::internal::Voidify() &            \
                    ::specula::internal::CheckFailure(__FILE__, __LINE__, #condition).stream()

#define SPECULA_CHECK_OP(a, op, b) CHECK((a)op(b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_EQ(a, b) SPECULA_CHECK_OP(a, ==, b)
#define CHECK_NE(a, b) SPECULA_CHECK_OP(a, !=, b)
#define CHECK_LE(a, b) SPECULA_CHECK_OP(a, <=, b)
#define CHECK_LT(a, b) SPECULA_CHECK_OP(a, <, b)
#define CHECK_GE(a, b) SPECULA_CHECK_OP(a, >=, b)
#define CHECK_GT(a, b) SPECULA_CHECK_OP(a, >, b)
