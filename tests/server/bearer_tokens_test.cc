// BearerTokens (server.auth.token_file): which authorization values pass, what a token file may
// hold, and reloads that keep the tokens in use when the new file is bad.
#include "server/bearer_tokens.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

class TokenFile {
 public:
  TokenFile() {
    char path[] = "/tmp/specula_tokens_XXXXXX";
    const int fd = mkstemp(path);
    EXPECT_GE(fd, 0);
    close(fd);
    path_ = path;
  }
  ~TokenFile() { std::remove(path_.c_str()); }
  void Write(const std::string& text) { std::ofstream(path_) << text; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

constexpr char kAlice[] = "alice-0123456789abcdef";
constexpr char kBob[] = "bob-0123456789abcdef";

TEST(BearerTokensTest, OnlyAListedTokenPasses) {
  TokenFile file;
  file.Write(std::string("# agents\n") + kAlice + "\n\n  " + kBob + "  \n");
  auto tokens = BearerTokens::Load(file.path());
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ((*tokens)->size(), 2u);
  EXPECT_TRUE((*tokens)->Allows(std::string("Bearer ") + kAlice));
  EXPECT_TRUE((*tokens)->Allows(std::string("bearer ") + kBob));
  for (const std::string& wrong :
       {std::string(kAlice), std::string("Bearer"), std::string("Bearer "),
        std::string("Basic ") + kAlice, std::string("Bearer ") + kAlice + "x",
        std::string("Bearer ") + std::string(kAlice).substr(1),
        std::string("Bearer alice-0123456789abcdeF"), std::string("Bearer # agents")}) {
    EXPECT_FALSE((*tokens)->Allows(wrong)) << wrong;
  }
}

TEST(BearerTokensTest, BadFilesAreErrorsNamingTheKeyAndLine) {
  TokenFile file;
  file.Write(std::string(kAlice) + "\nshort\n");
  auto short_token = BearerTokens::Load(file.path());
  EXPECT_EQ(short_token.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(short_token.status().message()), HasSubstr("server.auth.token_file"));
  EXPECT_THAT(std::string(short_token.status().message()), HasSubstr(":2:"));
  file.Write("# nothing but comments\n\n");
  EXPECT_EQ(BearerTokens::Load(file.path()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BearerTokens::Load("/nonexistent/tokens").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(BearerTokensTest, ReloadReplacesTheTokensOrKeepsThemOnError) {
  TokenFile file;
  file.Write(std::string(kAlice) + "\n");
  auto tokens = BearerTokens::Load(file.path());
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  file.Write(std::string(kBob) + "\n");
  ASSERT_TRUE((*tokens)->Reload().ok());
  EXPECT_FALSE((*tokens)->Allows(std::string("Bearer ") + kAlice));
  EXPECT_TRUE((*tokens)->Allows(std::string("Bearer ") + kBob));
  file.Write("bad token with spaces in it\n");
  EXPECT_FALSE((*tokens)->Reload().ok());
  EXPECT_TRUE((*tokens)->Allows(std::string("Bearer ") + kBob));
}

}  // namespace
}  // namespace specula
