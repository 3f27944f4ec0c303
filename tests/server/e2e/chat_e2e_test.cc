// Chat requests end to end over gRPC: a model without a template
// refuses messages until model.chat_template names a file; a template the interpreter cannot run
// stops the server at startup naming the construct; Generate with messages answers as a prompt
// request with the rendered text does.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/server/e2e/test_server.h"

namespace specula::testing {
namespace {

using ::testing::HasSubstr;

std::string ModelDir(const std::string& name) {
  return std::string(SPECULA_TEST_MODELS_DIR) + "/" + name;
}

// A copy of test model `name` whose tokenizer_config.json has no chat_template (the weights
// and tokenizer.json are links to the originals).
std::string ModelWithoutTemplate(const std::string& name) {
  namespace fs = std::filesystem;
  char dir[] = "/tmp/specula_no_template_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  for (const fs::directory_entry& e : fs::directory_iterator(ModelDir(name))) {
    if (e.path().filename() != "tokenizer_config.json") {
      fs::create_symlink(e.path(), fs::path(dir) / e.path().filename());
    }
  }
  nlohmann::json config =
      nlohmann::json::parse(std::ifstream(ModelDir(name) + "/tokenizer_config.json"));
  config.erase("chat_template");
  std::ofstream(std::string(dir) + "/tokenizer_config.json") << config.dump();
  return dir;
}

std::string WriteTemplate(const std::string& text) {
  char path[] = "/tmp/specula_chat_template_XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << text;
  return path;
}

v1::GenerateRequest ChatRequest(int max_tokens) {
  v1::GenerateRequest r;
  v1::ChatMessage* m = r.add_messages();
  m->set_role("user");
  m->set_content("hello there");
  r.mutable_sampling()->set_temperature(0);
  r.mutable_stopping()->set_max_tokens(max_tokens);
  r.mutable_stopping()->set_ignore_eos(true);
  return r;
}

TEST(ChatE2eTest, AModelWithoutATemplateRefusesMessages) {
  const std::string model = ModelWithoutTemplate("llama-f32");
  auto server = StartServer([&](ServerConfig& c) { c.model.path = model; });
  auto stub = Connect(server->address());
  StreamResult r = RunGenerate(*stub, ChatRequest(4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(r.status.error_message(), HasSubstr("model.chat_template"));
  // Prompts still work.
  v1::GenerateRequest prompt;
  prompt.set_prompt("hello");
  prompt.mutable_stopping()->set_max_tokens(2);
  EXPECT_TRUE(RunGenerate(*stub, prompt).status.ok());
  std::filesystem::remove_all(model);
}

TEST(ChatE2eTest, ModelChatTemplateNamesAFile) {
  const std::string path = WriteTemplate(
      "{% for m in messages %}[{{ m.role | upper }}] {{ m.content }}\n{% endfor %}"
      "{% if add_generation_prompt %}[ASSISTANT]{% endif %}");
  const std::string model = ModelWithoutTemplate("llama-f32");
  auto server = StartServer([&](ServerConfig& c) {
    c.model.path = model;
    c.model.chat_template = path;
  });
  auto stub = Connect(server->address());
  v1::TokenizeRequest t;
  *t.mutable_messages() = ChatRequest(1).messages();
  v1::TokenizeResponse rendered;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->Tokenize(&ctx, t, &rendered).ok());
  EXPECT_EQ(rendered.prompt_text(), "[USER] hello there\n[ASSISTANT]");
  // Generate with the messages is Generate with the rendered text (no special tokens added).
  StreamResult chat = RunGenerate(*stub, ChatRequest(6));
  ASSERT_TRUE(chat.status.ok()) << chat.status.error_message();
  v1::GenerateRequest same = ChatRequest(6);
  same.clear_messages();
  same.set_prompt(rendered.prompt_text());
  same.set_add_special_tokens(false);
  StreamResult plain = RunGenerate(*stub, same);
  EXPECT_EQ(chat.tokens, plain.tokens);
  EXPECT_EQ(chat.usage.prompt_tokens(), static_cast<uint32_t>(rendered.token_ids_size()));
  std::remove(path.c_str());
  std::filesystem::remove_all(model);
}

TEST(ChatE2eTest, AnUnsupportedTemplateStopsTheServerAtStartup) {
  const std::string path = WriteTemplate("{{ messages | xmlattr }}");
  ServerConfig config;
  config.model.path = ModelDir("llama-f32");
  config.model.chat_template = path;
  config.server.listen = "127.0.0.1:0";
  config.server.metrics_listen = "";
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("model.chat_template"));
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("xmlattr"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace specula::testing
