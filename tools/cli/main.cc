// specula-cli: the command-line client. By default it calls a specula-server (--server HOST:PORT);
// `generate --offline` runs the engine in this process instead. Results go to stdout, statistics
// and errors to stderr.
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "tools/cli/cli_flags.h"
#include "tools/cli/offline_command.h"
#include "tools/cli/server_commands.h"
#include "tools/common/dashed_flags.h"

namespace {

constexpr char kUsage[] =
    "specula-cli COMMAND [flags]\n"
    "  generate    --prompt TEXT | --prompt_ids 1,2,3 [--max_tokens N --temperature T ...]\n"
    "              [--sparse-mode default|dense|sparse --budget-tokens N] [--session_id ID]\n"
    "              streams the completion (--offline: run the engine in-process)\n"
    "  tokenize    --prompt TEXT\n"
    "  detokenize  --prompt_ids 1,2,3\n"
    "  info        the server's model and limits\n"
    "  sessions    the sessions whose KV the server keeps\n"
    "  delete-session --session_id ID: frees a session's KV\n"
    "  health      [--service NAME]: SERVING exits 0\n"
    "Server commands take --server HOST:PORT (default 127.0.0.1:50051) and --timeout SECONDS.";

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<std::string> storage;
  std::vector<char*> args = specula::ParseDashedCommandLine(argc, argv, &storage);
  if (args.size() != 2) {
    std::cerr << kUsage << "\n";
    return 2;
  }
  const std::string command = args[1];
  const bool offline = absl::GetFlag(FLAGS_offline);
  if (command == "generate") {
    return offline ? specula::GenerateOffline() : specula::GenerateRemote();
  }
  if (offline) {
    std::cerr << "specula-cli: --offline applies to generate only\n";
    return 2;
  }
  if (command == "tokenize") return specula::TokenizeRemote();
  if (command == "detokenize") return specula::DetokenizeRemote();
  if (command == "info") return specula::InfoRemote();
  if (command == "health") return specula::HealthRemote();
  if (command == "sessions") return specula::ListSessionsRemote();
  if (command == "delete-session") return specula::DeleteSessionRemote();
  std::cerr << "specula-cli: unknown command '" << command << "'\n" << kUsage << "\n";
  return 2;
}
