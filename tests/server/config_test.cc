#include "server/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config_table.h"
#include "yaml-cpp/yaml.h"

namespace specula {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

void ExpectDefaults(const ServerConfig& c) {
  const ServerConfig d;
  EXPECT_EQ(c.server.listen, d.server.listen);
  EXPECT_EQ(c.server.metrics_listen, d.server.metrics_listen);
  EXPECT_EQ(c.server.max_receive_message_bytes, d.server.max_receive_message_bytes);
  EXPECT_EQ(c.server.shutdown_grace_seconds, d.server.shutdown_grace_seconds);
  EXPECT_EQ(c.server.log_level, d.server.log_level);
  EXPECT_EQ(c.server.send_priority, d.server.send_priority);
  EXPECT_EQ(c.model.path, d.model.path);
  EXPECT_EQ(c.model.device, d.model.device);
  EXPECT_EQ(c.scheduler.max_running_requests, d.scheduler.max_running_requests);
  EXPECT_EQ(c.scheduler.max_waiting_requests, d.scheduler.max_waiting_requests);
  EXPECT_EQ(c.scheduler.prefill_chunk_tokens, d.scheduler.prefill_chunk_tokens);
  EXPECT_EQ(c.scheduler.solo_prefill_chunk_tokens, d.scheduler.solo_prefill_chunk_tokens);
  EXPECT_EQ(c.scheduler.default_max_tokens, d.scheduler.default_max_tokens);
  EXPECT_EQ(c.scheduler.threads, d.scheduler.threads);
  EXPECT_EQ(c.scheduler.max_tokenizing_requests, d.scheduler.max_tokenizing_requests);
  EXPECT_EQ(c.scheduler.max_overtakes, d.scheduler.max_overtakes);
  EXPECT_EQ(c.kv_cache.page_size, d.kv_cache.page_size);
  EXPECT_EQ(c.kv_cache.capacity_tokens, d.kv_cache.capacity_tokens);
  EXPECT_EQ(c.kv_cache.dtype, d.kv_cache.dtype);
  EXPECT_EQ(c.kv_cache.prefix_cache, d.kv_cache.prefix_cache);
  EXPECT_EQ(c.kv_cache.session_ttl_seconds, d.kv_cache.session_ttl_seconds);
  const SparseOptions& s = c.sparse.options;
  const SparseOptions& ds = d.sparse.options;
  EXPECT_EQ(s.enabled, ds.enabled);
  EXPECT_EQ(s.budget_tokens, ds.budget_tokens);
  EXPECT_EQ(s.sink_tokens, ds.sink_tokens);
  EXPECT_EQ(s.recent_tokens, ds.recent_tokens);
  EXPECT_EQ(s.selector, ds.selector);
  EXPECT_EQ(s.speculation, ds.speculation);
  EXPECT_EQ(s.miss_policy, ds.miss_policy);
  EXPECT_EQ(s.miss_correction, ds.miss_correction);
  EXPECT_EQ(s.min_context_tokens, ds.min_context_tokens);
  EXPECT_EQ(s.prefetch_threads, ds.prefetch_threads);
  EXPECT_EQ(s.prefetch_extra_tokens, ds.prefetch_extra_tokens);
  EXPECT_EQ(c.kv_cache.host_capacity_tokens, d.kv_cache.host_capacity_tokens);
  EXPECT_EQ(c.sparse.host_capacity_tokens, d.sparse.host_capacity_tokens);
  EXPECT_EQ(c.sparse.page_size, d.sparse.page_size);
}

absl::Status ParseError(const std::string& yaml) {
  absl::StatusOr<ServerConfig> c = ParseConfigYaml(yaml, "test.yaml");
  return c.ok() ? absl::OkStatus() : c.status();
}

TEST(ConfigTest, DefaultsAreTheDocumentedOnes) {
  const ServerConfig c;
  EXPECT_EQ(c.server.listen, "127.0.0.1:50051");
  EXPECT_EQ(c.server.metrics_listen, "127.0.0.1:9400");
  EXPECT_EQ(c.server.max_receive_message_bytes, 4194304);
  EXPECT_EQ(c.server.shutdown_grace_seconds, 30.0);
  EXPECT_EQ(c.server.log_level, LogLevel::kInfo);
  EXPECT_EQ(c.server.send_priority, SendPriority::kIdle);
  EXPECT_FALSE(c.server.tls());
  EXPECT_EQ(c.server.tls_client_ca_file, "");
  EXPECT_EQ(c.server.tls_reload_seconds, 60);
  EXPECT_EQ(c.server.stall_seconds, 120);
  EXPECT_EQ(c.server.grpc_max_idle_seconds, 3600);
  EXPECT_EQ(c.server.grpc_handshake_seconds, 10);
  EXPECT_EQ(c.server.http_idle_seconds, 10);
  EXPECT_EQ(c.server.min_ping_interval_seconds, 10);
  EXPECT_EQ(c.server.max_ping_strikes, 2);
  EXPECT_TRUE(c.server.ping_without_calls);
  EXPECT_EQ(c.model.path, "");
  EXPECT_EQ(c.model.device, DeviceKind::kAuto);
  EXPECT_TRUE(c.model.cuda_graphs);
  EXPECT_TRUE(c.model.dependent_launches);
  EXPECT_EQ(c.scheduler.max_running_requests, 64);
  EXPECT_EQ(c.scheduler.max_waiting_requests, 1024);
  EXPECT_EQ(c.scheduler.prefill_chunk_tokens, 512);
  EXPECT_EQ(c.scheduler.solo_prefill_chunk_tokens, 4096);
  EXPECT_EQ(c.scheduler.default_max_tokens, 0);
  EXPECT_EQ(c.scheduler.threads, 0);
  EXPECT_EQ(c.kv_cache.page_size, 16);
  EXPECT_EQ(c.kv_cache.capacity_tokens, 65536);
  EXPECT_EQ(c.kv_cache.dtype, "auto");
  EXPECT_FALSE(c.sparse.options.enabled);
  EXPECT_EQ(c.sparse.options.budget_tokens, 2048);
  EXPECT_EQ(c.sparse.options.sink_tokens, 16);
  EXPECT_EQ(c.sparse.options.recent_tokens, 256);
  EXPECT_EQ(c.sparse.options.selector, "quest");
  EXPECT_EQ(c.sparse.options.speculation, SpeculationMode::kCrossStep);
  EXPECT_EQ(c.sparse.options.miss_policy, MissPolicy::kAuto);
  EXPECT_EQ(c.sparse.options.miss_correction, 0.75);
  EXPECT_EQ(c.sparse.options.min_context_tokens, -1);
  EXPECT_EQ(c.sparse.options.prefetch_threads, 1);
  EXPECT_EQ(c.sparse.options.prefetch_extra_tokens, -1);
  EXPECT_EQ(c.kv_cache.host_capacity_tokens, -1);
  EXPECT_FALSE(c.sparse.host_capacity_tokens.has_value());
  EXPECT_EQ(HostCapacityTokens(c), -1);
  EXPECT_FALSE(c.sparse.page_size.has_value());
  EXPECT_TRUE(ValidateConfig(c).ok());
}

TEST(ConfigTest, EmptyDocumentsMeanDefaults) {
  for (const char* yaml : {"", "\n", "# only a comment\n", "---\n", "server:\nscheduler:\n"}) {
    absl::StatusOr<ServerConfig> c = ParseConfigYaml(yaml, "empty.yaml");
    ASSERT_TRUE(c.ok()) << "'" << yaml << "': " << c.status();
    ExpectDefaults(*c);
  }
}

TEST(ConfigTest, ShippedDeployFileIsExactlyTheDefaults) {
  absl::StatusOr<ServerConfig> c = LoadConfigFile(SPECULA_SOURCE_DIR "/deploy/config/specula.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectDefaults(*c);
}

TEST(ConfigTest, EveryKeyCanBeOverridden) {
  absl::StatusOr<ServerConfig> c = ParseConfigYaml(R"(
server:
  listen: "[::1]:6000"
  metrics_listen: ""
  max_receive_message_bytes: 1024
  shutdown_grace_seconds: 2.5
  stall_seconds: 0
  log_level: debug
  send_priority: normal
  reflection: true
  connections:
    grpc_max_idle_seconds: 0
    grpc_handshake_seconds: 2.5
    http_idle_seconds: 30
    http_max_connections: 64
    min_ping_interval_seconds: 0.5
    max_ping_strikes: 0
    ping_without_calls: false
  tls:
    cert_file: /etc/specula/server.pem
    key_file: /etc/specula/server.key
    client_ca_file: /etc/specula/clients.pem
    reload_seconds: 5
  limits:
    max_prompt_tokens: 1000
    max_tokens: 200
    max_requests_per_client: 4
model:
  path: /models/qwen3
  device: cpu
  cuda_graphs: false
  dependent_launches: false
scheduler:
  max_running_requests: 8
  max_waiting_requests: 0
  prefill_chunk_tokens: 1
  solo_prefill_chunk_tokens: 0
  default_max_tokens: 4096
  threads: 3
  max_tokenizing_requests: 2
  max_overtakes: 0
kv_cache:
  page_size: 1024
  capacity_tokens: 1024
  dtype: bf16
  prefix_cache: false
  session_ttl_seconds: 30.5
  max_sessions: 7
  host_capacity_tokens: 1048576
sparse:
  enabled: true
  budget_tokens: 4096
  sink_tokens: 0
  recent_tokens: 64
  selector: exact
  speculation: both
  miss_policy: fetch
  miss_correction: 0.5
  min_context_tokens: 0
  prefetch_threads: 4
  prefetch_extra_tokens: 0
  page_size: 1024
)",
                                                   "all.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server.listen, "[::1]:6000");
  EXPECT_EQ(c->server.metrics_listen, "");
  EXPECT_EQ(c->server.max_receive_message_bytes, 1024);
  EXPECT_EQ(c->server.shutdown_grace_seconds, 2.5);
  EXPECT_EQ(c->server.stall_seconds, 0);
  EXPECT_EQ(c->server.log_level, LogLevel::kDebug);
  EXPECT_EQ(c->server.send_priority, SendPriority::kNormal);
  EXPECT_TRUE(c->server.reflection);
  EXPECT_EQ(c->server.grpc_max_idle_seconds, 0);
  EXPECT_EQ(c->server.grpc_handshake_seconds, 2.5);
  EXPECT_EQ(c->server.http_idle_seconds, 30);
  EXPECT_EQ(c->server.http_max_connections, 64);
  EXPECT_EQ(c->server.min_ping_interval_seconds, 0.5);
  EXPECT_EQ(c->server.max_ping_strikes, 0);
  EXPECT_FALSE(c->server.ping_without_calls);
  EXPECT_EQ(c->server.tls_cert_file, "/etc/specula/server.pem");
  EXPECT_EQ(c->server.tls_key_file, "/etc/specula/server.key");
  EXPECT_EQ(c->server.tls_client_ca_file, "/etc/specula/clients.pem");
  EXPECT_EQ(c->server.tls_reload_seconds, 5);
  EXPECT_EQ(c->server.max_prompt_tokens, 1000);
  EXPECT_EQ(c->server.max_output_tokens, 200);
  EXPECT_EQ(c->server.max_requests_per_client, 4);
  EXPECT_EQ(c->model.path, "/models/qwen3");
  EXPECT_EQ(c->model.device, DeviceKind::kCpu);
  EXPECT_FALSE(c->model.cuda_graphs);
  EXPECT_FALSE(c->model.dependent_launches);
  EXPECT_EQ(c->scheduler.max_running_requests, 8);
  EXPECT_EQ(c->scheduler.max_waiting_requests, 0);
  EXPECT_EQ(c->scheduler.prefill_chunk_tokens, 1);
  EXPECT_EQ(c->scheduler.solo_prefill_chunk_tokens, 0);
  EXPECT_EQ(c->scheduler.default_max_tokens, 4096);
  EXPECT_EQ(c->scheduler.threads, 3);
  EXPECT_EQ(c->scheduler.max_tokenizing_requests, 2);
  EXPECT_EQ(c->scheduler.max_overtakes, 0);
  EXPECT_EQ(c->kv_cache.page_size, 1024);
  EXPECT_EQ(c->kv_cache.capacity_tokens, 1024);
  EXPECT_EQ(c->kv_cache.dtype, "bf16");
  EXPECT_FALSE(c->kv_cache.prefix_cache);
  EXPECT_EQ(c->kv_cache.session_ttl_seconds, 30.5);
  EXPECT_EQ(c->kv_cache.max_sessions, 7);
  const SparseOptions& s = c->sparse.options;
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.budget_tokens, 4096);
  EXPECT_EQ(s.sink_tokens, 0);
  EXPECT_EQ(s.recent_tokens, 64);
  EXPECT_EQ(s.selector, "exact");
  EXPECT_EQ(s.speculation, SpeculationMode::kBoth);
  EXPECT_EQ(s.miss_policy, MissPolicy::kFetch);
  EXPECT_EQ(s.miss_correction, 0.5);
  EXPECT_EQ(s.min_context_tokens, 0);
  EXPECT_EQ(s.prefetch_threads, 4);
  EXPECT_EQ(s.prefetch_extra_tokens, 0);
  EXPECT_EQ(c->kv_cache.host_capacity_tokens, 1048576);
  EXPECT_EQ(c->sparse.page_size, 1024);
}

TEST(ConfigTest, SparseEnumsTakeEveryName) {
  for (const char* mode : {"none", "cross_step", "cross_layer", "both"}) {
    absl::StatusOr<ServerConfig> c =
        ParseConfigYaml(absl::StrCat("sparse:\n  speculation: ", mode, "\n"), "s.yaml");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_STREQ(SpeculationModeName(c->sparse.options.speculation), mode);
  }
  for (const char* policy : {"auto", "defer", "fetch"}) {
    absl::StatusOr<ServerConfig> c =
        ParseConfigYaml(absl::StrCat("sparse:\n  miss_policy: ", policy, "\n"), "s.yaml");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_STREQ(MissPolicyName(c->sparse.options.miss_policy), policy);
  }
  // sparse.page_size may restate kv_cache.page_size, including its default.
  absl::StatusOr<ServerConfig> c = ParseConfigYaml("sparse:\n  page_size: 16\n", "s.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sparse.page_size, 16);
}

TEST(ConfigTest, PartialSectionsKeepOtherDefaults) {
  absl::StatusOr<ServerConfig> c =
      ParseConfigYaml("scheduler:\n  threads: 2\nmodel: {device: cuda}\n", "p.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduler.threads, 2);
  EXPECT_EQ(c->model.device, DeviceKind::kCuda);
  EXPECT_EQ(c->scheduler.max_running_requests, 64);
  EXPECT_EQ(c->server.listen, "127.0.0.1:50051");
}

struct BadCase {
  std::string yaml;
  std::string message;  // must appear in the error, after "test.yaml:<line>: "
  int line;
};

// Every rejected value names its key path, the file and the key's line.
TEST(ConfigTest, InvalidValuesNameTheirKeyAndLine) {
  const BadCase cases[] = {
      {"server:\n  listen: nohost\n", "server.listen: invalid address 'nohost'", 2},
      {"server:\n  listen: \"\"\n", "server.listen: invalid address ''", 2},
      {"server:\n  metrics_listen: localhost:70000\n",
       "server.metrics_listen: invalid address 'localhost:70000'", 2},
      {"server:\n  metrics_listen: 127.0.0.1:50051\n",
       "server.metrics_listen: must differ from server.listen", 2},
      {"server:\n  max_receive_message_bytes: 1023\n",
       "server.max_receive_message_bytes: must be >= 1024, got 1023", 2},
      {"server:\n  max_receive_message_bytes: 4294967296\n",
       "server.max_receive_message_bytes: must be <= 2147483647, got 4294967296", 2},
      {"server:\n  shutdown_grace_seconds: -1\n",
       "server.shutdown_grace_seconds: must be a finite number >= 0, got -1", 2},
      {"server:\n  shutdown_grace_seconds: .inf\n", "server.shutdown_grace_seconds: must be", 2},
      {"server:\n  shutdown_grace_seconds: .nan\n", "server.shutdown_grace_seconds: must be", 2},
      {"server:\n  log_level: loud\n", "server.log_level: invalid log level 'loud'", 2},
      {"server:\n  stall_seconds: -1\n", "server.stall_seconds: must be in [0, 86400], got -1", 2},
      {"server:\n  stall_seconds: .nan\n", "server.stall_seconds: must be in [0, 86400]", 2},
      {"server:\n  limits:\n    max_requests_per_client: -1\n",
       "server.limits.max_requests_per_client: must be >= 0, got -1", 3},
      {"server:\n  connections:\n    grpc_max_idle_seconds: -1\n",
       "server.connections.grpc_max_idle_seconds: must be in [0, 2147483], got -1", 3},
      {"server:\n  connections:\n    grpc_handshake_seconds: 0\n",
       "server.connections.grpc_handshake_seconds: must be in [0.1, 3600], got 0", 3},
      {"server:\n  connections:\n    http_idle_seconds: 0\n",
       "server.connections.http_idle_seconds: must be >= 1, got 0", 3},
      {"server:\n  connections:\n    http_max_connections: 65537\n",
       "server.connections.http_max_connections: must be <= 65536, got 65537", 3},
      {"server:\n  connections:\n    min_ping_interval_seconds: 0\n",
       "server.connections.min_ping_interval_seconds: must be in [0.001, 86400], got 0", 3},
      {"server:\n  connections:\n    max_ping_strikes: 1001\n",
       "server.connections.max_ping_strikes: must be <= 1000, got 1001", 3},
      {"server:\n  tls:\n    cert_file: a.pem\n",
       "server.tls.cert_file: server.tls.cert_file and server.tls.key_file go together", 3},
      {"server:\n  tls:\n    key_file: a.key\n",
       "server.tls.key_file: server.tls.cert_file and server.tls.key_file go together", 3},
      {"server:\n  tls:\n    client_ca_file: ca.pem\n",
       "server.tls.client_ca_file: requires server.tls.cert_file", 3},
      {"server:\n  tls:\n    cert_file: a.pem\n    key_file: a.key\n    reload_seconds: 0.5\n",
       "server.tls.reload_seconds: must be in [1, 86400], got 0.5", 5},
      {"server:\n  limits:\n    max_prompt_tokens: -1\n",
       "server.limits.max_prompt_tokens: must be >= 0, got -1", 3},
      {"server:\n  limits:\n    max_tokens: 2147483648\n",
       "server.limits.max_tokens: must be <= 2147483647, got 2147483648", 3},
      {"server:\n  send_priority: high\n",
       "server.send_priority: must be one of idle, normal, got 'high'", 2},
      {"model:\n  device: gpu\n", "model.device: must be one of cpu, cuda, auto, got 'gpu'", 2},
      {"scheduler:\n  max_running_requests: 0\n",
       "scheduler.max_running_requests: must be >= 1, got 0", 2},
      {"scheduler:\n  max_waiting_requests: -1\n",
       "scheduler.max_waiting_requests: must be >= 0, got -1", 2},
      {"scheduler:\n  prefill_chunk_tokens: 0\n",
       "scheduler.prefill_chunk_tokens: must be >= 1, got 0", 2},
      {"scheduler:\n  default_max_tokens: -1\n",
       "scheduler.default_max_tokens: must be >= 0, got -1", 2},
      {"scheduler:\n  threads: -2\n", "scheduler.threads: must be >= 0, got -2", 2},
      {"scheduler:\n  threads: 3000000000\n",
       "scheduler.threads: must be <= 2147483647, got 3000000000", 2},
      // Every size-like key has an upper bound, one past it is refused (it once started 100000
      // threads, or overflowed buffer sizes).
      {"scheduler:\n  threads: 1025\n", "scheduler.threads: must be <= 1024, got 1025", 2},
      {"scheduler:\n  max_tokenizing_requests: 0\n",
       "scheduler.max_tokenizing_requests: must be >= 1, got 0", 2},
      {"scheduler:\n  max_tokenizing_requests: 1025\n",
       "scheduler.max_tokenizing_requests: must be <= 1024, got 1025", 2},
      {"scheduler:\n  threads: 100000\n", "scheduler.threads: must be <= 1024, got 100000", 2},
      {"scheduler:\n  max_running_requests: 4097\n",
       "scheduler.max_running_requests: must be <= 4096, got 4097", 2},
      {"scheduler:\n  max_running_requests: 2147483647\n",
       "scheduler.max_running_requests: must be <= 4096, got 2147483647", 2},
      {"scheduler:\n  max_waiting_requests: 1048577\n",
       "scheduler.max_waiting_requests: must be <= 1048576, got 1048577", 2},
      {"scheduler:\n  prefill_chunk_tokens: 65537\n",
       "scheduler.prefill_chunk_tokens: must be <= 65536, got 65537", 2},
      {"scheduler:\n  solo_prefill_chunk_tokens: -1\n",
       "scheduler.solo_prefill_chunk_tokens: must be >= 0, got -1", 2},
      {"scheduler:\n  solo_prefill_chunk_tokens: 65537\n",
       "scheduler.solo_prefill_chunk_tokens: must be <= 65536, got 65537", 2},
      {"scheduler:\n  default_max_tokens: 1073741825\n",
       "scheduler.default_max_tokens: must be <= 1073741824, got 1073741825", 2},
      {"kv_cache:\n  capacity_tokens: 2147483648\n",
       "kv_cache.capacity_tokens: must be <= 2147483647, got 2147483648", 2},
      {"kv_cache:\n  capacity_tokens: 17179869184\n",
       "kv_cache.capacity_tokens: must be <= 2147483647, got 17179869184", 2},
      {"kv_cache:\n  dtype: fp8\n",
       "kv_cache.dtype: unknown KV cache dtype 'fp8' (accepted: auto, bf16, f16, f32)", 2},
      {"kv_cache:\n  dtype: BF16\n", "kv_cache.dtype: unknown KV cache dtype 'BF16'", 2},
      {"scheduler:\n  max_overtakes: -1\n", "scheduler.max_overtakes: must be >= 0, got -1", 2},
      {"kv_cache:\n  session_ttl_seconds: 0\n",
       "kv_cache.session_ttl_seconds: must be in (0, 2592000], got 0", 2},
      {"kv_cache:\n  session_ttl_seconds: 2592001\n",
       "kv_cache.session_ttl_seconds: must be in (0, 2592000]", 2},
      {"kv_cache:\n  session_ttl_seconds: .nan\n",
       "kv_cache.session_ttl_seconds: must be in (0, 2592000], got nan", 2},
      {"kv_cache:\n  prefix_cache: maybe\n", "kv_cache.prefix_cache:", 2},
      {"kv_cache:\n  max_sessions: 0\n", "kv_cache.max_sessions: must be >= 1, got 0", 2},
      {"kv_cache:\n  max_sessions: 1000001\n", "kv_cache.max_sessions: must be <= 1000000", 2},
      {"kv_cache:\n  page_size: 0\n",
       "kv_cache.page_size: must be a power of two in [1, 1024], got 0", 2},
      {"kv_cache:\n  page_size: 24\n", "kv_cache.page_size: must be a power of two", 2},
      {"kv_cache:\n  page_size: 2048\n", "kv_cache.page_size: must be a power of two", 2},
      {"kv_cache:\n  page_size: 64\n  capacity_tokens: 32\n",
       "kv_cache.capacity_tokens: must be >= kv_cache.page_size (64), got 32", 3},
      // The error points at the offending key even when the rule involves another one.
      {"kv_cache:\n  capacity_tokens: 8\n", "kv_cache.capacity_tokens: must be >=", 2},
      // Names the parser knows; the value rules of sparse are SparseValuesAreTheEnginesRules'.
      {"sparse:\n  speculation: always\n",
       "sparse.speculation: unknown speculation mode 'always' (none|cross_step|cross_layer|both)",
       2},
      {"sparse:\n  miss_policy: wait\n",
       "sparse.miss_policy: unknown miss policy 'wait' (auto|defer|fetch)", 2},
      {"sparse:\n  miss_policy: skip\n",
       "sparse.miss_policy: miss policy 'skip' was replaced by 'defer' (deterministic: it waits "
       "for "
       "late copies instead of leaving them out)",
       2},
      {"sparse:\n  sink_tokens: 3000000000\n",
       "sparse.sink_tokens: must be <= 2147483647, got 3000000000", 2},
      // Sparse pages are KV cache pages: a different page size is a mistake, named with both keys.
      {"kv_cache:\n  page_size: 32\nsparse:\n  page_size: 16\n",
       "sparse.page_size: must equal kv_cache.page_size (32", 4},
      {"sparse:\n  page_size: 0\n", "sparse.page_size: must equal kv_cache.page_size (16", 2},
  };
  for (const BadCase& c : cases) {
    absl::Status s = ParseError(c.yaml);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_THAT(std::string(s.message()), StartsWith(absl::StrCat("test.yaml:", c.line, ": ")))
        << c.yaml;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.yaml;
  }
}

// Sparse values are checked by the engine's ValidateSparseOptions (one rule book for the server and
// the engine), whose "sparse.<key> = <value>: <rule>" the config error restates in this file's
// "file:line: sparse.<key>: <rule>, got <value>" form.
TEST(ConfigTest, SparseValuesAreTheEnginesRules) {
  struct Case {
    std::string key;
    std::string value;  // as YAML and as the engine prints it
    std::function<void(SparseOptions&)> set;
  };
  const Case cases[] = {
      {"budget_tokens", "0", [](SparseOptions& o) { o.budget_tokens = 0; }},
      {"budget_tokens", "-8", [](SparseOptions& o) { o.budget_tokens = -8; }},
      {"sink_tokens", "-1", [](SparseOptions& o) { o.sink_tokens = -1; }},
      {"recent_tokens", "-1", [](SparseOptions& o) { o.recent_tokens = -1; }},
      {"min_context_tokens", "-2", [](SparseOptions& o) { o.min_context_tokens = -2; }},
      {"prefetch_threads", "0", [](SparseOptions& o) { o.prefetch_threads = 0; }},
      {"prefetch_threads", "65", [](SparseOptions& o) { o.prefetch_threads = 65; }},
      {"prefetch_extra_tokens", "-2", [](SparseOptions& o) { o.prefetch_extra_tokens = -2; }},
      {"selector", "'magic'", [](SparseOptions& o) { o.selector = "magic"; }},
      {"miss_correction", "1.5", [](SparseOptions& o) { o.miss_correction = 1.5; }},
      {"miss_correction", "-0.25", [](SparseOptions& o) { o.miss_correction = -0.25; }},
  };
  for (const Case& c : cases) {
    SparseOptions options;
    c.set(options);
    const absl::Status engine = ValidateSparseOptions(options);
    ASSERT_FALSE(engine.ok()) << c.key << " = " << c.value;
    const std::string prefix = absl::StrCat("sparse.", c.key, " = ", c.value, ": ");
    ASSERT_THAT(std::string(engine.message()), StartsWith(prefix))
        << "ValidateSparseOptions changed its message format; update SparseViolation";
    const std::string rule = std::string(engine.message()).substr(prefix.size());

    const std::string yaml = absl::StrCat(
        "kv_cache:\n  page_size: 16\nsparse:\n  enabled: true\n  ", c.key, ": ", c.value, "\n");
    absl::Status s = ParseError(yaml);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << yaml;
    EXPECT_EQ(s.message(),
              absl::StrCat("test.yaml:5: sparse.", c.key, ": ", rule, ", got ", c.value))
        << yaml;
  }
}

// kv_cache.host_capacity_tokens took over sparse.host_capacity_tokens: the old name is still
// read, alone and with sparse.enabled; both, disagreeing, is an error; sparse.enabled without a
// host store is one too.
TEST(ConfigTest, HostCapacityHasOneNameAndAnOldOne) {
  absl::StatusOr<ServerConfig> old =
      ParseConfigYaml("sparse:\n  enabled: true\n  host_capacity_tokens: 4096\n", "t");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(HostCapacityTokens(*old), 4096);
  // With the sparse cache off the old key sized nothing, and still does.
  absl::StatusOr<ServerConfig> off_old =
      ParseConfigYaml("sparse:\n  enabled: false\n  host_capacity_tokens: 262144\n", "t");
  ASSERT_TRUE(off_old.ok()) << off_old.status();
  EXPECT_EQ(HostCapacityTokens(*off_old), -1);
  absl::StatusOr<ServerConfig> both = ParseConfigYaml(
      "kv_cache:\n  host_capacity_tokens: 4096\nsparse:\n  host_capacity_tokens: 4096\n", "t");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(HostCapacityTokens(*both), 4096);
  absl::StatusOr<ServerConfig> off = ParseConfigYaml("kv_cache:\n  host_capacity_tokens: 0\n", "t");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(HostCapacityTokens(*off), 0);

  EXPECT_THAT(std::string(ParseError("kv_cache:\n  host_capacity_tokens: 4096\nsparse:\n"
                                     "  host_capacity_tokens: 8192\n")
                              .message()),
              HasSubstr("sparse.host_capacity_tokens: is the old name of "
                        "kv_cache.host_capacity_tokens, which is 4096"));
  EXPECT_THAT(std::string(ParseError("kv_cache:\n  host_capacity_tokens: 0\nsparse:\n"
                                     "  enabled: true\n")
                              .message()),
              HasSubstr("kv_cache.host_capacity_tokens: must be > 0 (or -1) with sparse.enabled"));
  EXPECT_THAT(std::string(ParseError("kv_cache:\n  host_capacity_tokens: -2\n").message()),
              HasSubstr("kv_cache.host_capacity_tokens: must be >= -1, got -2"));
  EXPECT_THAT(std::string(ParseError("sparse:\n  host_capacity_tokens: 0\n").message()),
              HasSubstr("sparse.host_capacity_tokens: must be >= 1, got 0"));
}

TEST(ConfigTest, WrongTypesNameTheirKey) {
  const BadCase cases[] = {
      {"scheduler:\n  threads: many\n", "scheduler.threads: expected an integer, got 'many'", 2},
      {"scheduler:\n  threads: 1.5\n", "scheduler.threads: expected an integer", 2},
      {"scheduler:\n  threads: \"4\"\n",
       "scheduler.threads: expected an integer, got the string \"4\"", 2},
      {"scheduler:\n  threads: true\n", "scheduler.threads: expected an integer", 2},
      {"scheduler:\n  threads: [1, 2]\n", "scheduler.threads: expected an integer, got a sequence",
       2},
      {"scheduler:\n  threads:\n", "scheduler.threads: expected an integer, got null", 2},
      {"server:\n  shutdown_grace_seconds: soon\n",
       "server.shutdown_grace_seconds: expected a number, got 'soon'", 2},
      {"server:\n  listen: {host: x}\n", "server.listen: expected a string", 2},
      {"server:\n  listen:\n", "server.listen: expected a string (write \"\" for an empty one)", 2},
      {"model:\n  path: ~\n", "model.path: expected a string", 2},
      {"sparse:\n  enabled: maybe\n", "sparse.enabled: expected true or false, got 'maybe'", 2},
      {"sparse:\n  enabled: \"true\"\n",
       "sparse.enabled: expected true or false, got the string \"true\"", 2},
      {"sparse:\n  enabled: 1\n", "sparse.enabled: expected true or false", 2},
      {"sparse:\n  budget_tokens: lots\n", "sparse.budget_tokens: expected an integer", 2},
      {"sparse:\n  speculation: [a]\n", "sparse.speculation: expected a string, got a sequence", 2},
      {"sparse:\n  page_size: 16.0\n", "sparse.page_size: expected an integer", 2},
      {"\n\nmodel: cpu\n", "model: expected a mapping, got 'cpu'", 3},
      {"scheduler: [1]\n", "scheduler: expected a mapping, got a sequence", 1},
      {"- a\n- b\n", "the document must be a mapping of sections, got a sequence", 1},
      {"just text\n", "the document must be a mapping of sections", 1},
  };
  for (const BadCase& c : cases) {
    absl::Status s = ParseError(c.yaml);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_THAT(std::string(s.message()), StartsWith(absl::StrCat("test.yaml:", c.line, ": ")))
        << c.yaml << " -> " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.yaml;
  }
}

TEST(ConfigTest, UnknownKeysNameTheirFullPath) {
  const BadCase cases[] = {
      {"scheduler:\n  max_batch: 4\n", "unknown key 'scheduler.max_batch'", 2},
      {"server:\n  listen: 127.0.0.1:1\n  tls:\n    cert: a.pem\n", "unknown key 'server.tls.cert'",
       4},
      {"kv_cache:\n  page_size: 16\n  pagesize: 16\n", "unknown key 'kv_cache.pagesize'", 3},
      {"sparse:\n  enable: true\n", "unknown key 'sparse.enable'", 2},
      {"Server:\n  listen: 127.0.0.1:1\n", "unknown key 'Server'", 1},
      {"scheduler:\n  threads: 1\n  threads: 2\n", "duplicate key 'scheduler.threads'", 3},
  };
  for (const BadCase& c : cases) {
    absl::Status s = ParseError(c.yaml);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_THAT(std::string(s.message()), StartsWith(absl::StrCat("test.yaml:", c.line, ": ")))
        << c.yaml << " -> " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.yaml;
  }
  // The message lists what is known, to make the typo obvious.
  EXPECT_THAT(std::string(ParseError("scheduler:\n  max_batch: 4\n").message()),
              HasSubstr("max_running_requests"));
}

TEST(ConfigTest, MalformedYamlNamesSourceAndLine) {
  const BadCase cases[] = {
      {"server: {listen: a\n", "invalid YAML: end of map flow not found", 2},
      {"server:\n  listen: a\n   bad: indent\n", "invalid YAML: illegal map value", 3},
      {"model:\n  path: *nowhere\n", "invalid YAML: the referenced anchor is not defined", 2},
      {"server: {}\n---\nmodel: {}\n", "expected one YAML document, found several", 3},
  };
  for (const BadCase& c : cases) {
    absl::Status s = ParseError(c.yaml);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_EQ(s.message(), absl::StrCat("test.yaml:", c.line, ": ", c.message)) << c.yaml;
  }
}

// Found by fuzz_config_yaml: yaml-cpp's LoadAll never returns on these (it makes empty documents
// forever without reading on). They must be errors, at once.
TEST(ConfigTest, TextThatHangsYamlCppsLoadAllIsAnError) {
  for (const std::string& yaml :
       {std::string(","), std::string(", x"), std::string(",\t&"),
        std::string("\0\0\0,\0\0\0\t&", 9), std::string("server:\n  listen: 127.0.0.1:1\n,\n")}) {
    const absl::Status s = ParseError(yaml);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << testing::PrintToString(yaml);
  }
}

TEST(ConfigTest, ValidateConfigChecksOverriddenValues) {
  ServerConfig c;
  c.scheduler.max_running_requests = 0;
  absl::Status s = ValidateConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "scheduler.max_running_requests: must be >= 1, got 0");

  c = ServerConfig();
  c.server.listen = "0.0.0.0";
  s = ValidateConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("server.listen: invalid address '0.0.0.0'"));

  c = ServerConfig();
  c.sparse.options.budget_tokens = 0;
  s = ValidateConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("sparse.budget_tokens: "));
  EXPECT_THAT(std::string(s.message()), ::testing::EndsWith(", got 0"));

  c = ServerConfig();
  c.kv_cache.page_size = 64;
  c.sparse.page_size = 16;
  s = ValidateConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              StartsWith("sparse.page_size: must equal kv_cache.page_size (64"));

  c = ServerConfig();
  c.server.metrics_listen = "";  // disabled
  c.server.listen = "[::]:0";
  EXPECT_TRUE(ValidateConfig(c).ok());
}

TEST(ConfigTest, ParseHostPortAcceptsValidForms) {
  struct Good {
    const char* text;
    const char* host;
    int port;
  };
  for (const Good& g :
       {Good{"127.0.0.1:50051", "127.0.0.1", 50051}, Good{"0.0.0.0:0", "0.0.0.0", 0},
        Good{"localhost:65535", "localhost", 65535},
        Good{"my-host.example.com:80", "my-host.example.com", 80},
        Good{"[::1]:50051", "::1", 50051}, Good{"[::]:9400", "::", 9400},
        Good{"[fe80::1%eth0]:1", "fe80::1%eth0", 1},
        Good{"[::ffff:10.0.0.1]:7", "::ffff:10.0.0.1", 7}}) {
    std::string host;
    int port = -1;
    absl::Status s = ParseHostPort(g.text, &host, &port);
    ASSERT_TRUE(s.ok()) << g.text << ": " << s;
    EXPECT_EQ(host, g.host);
    EXPECT_EQ(port, g.port);
  }
  EXPECT_TRUE(ParseHostPort("127.0.0.1:1").ok());  // outputs are optional
}

TEST(ConfigTest, ParseHostPortRejectsBadForms) {
  for (const char* bad :
       {"", "50051", ":50051", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1",
        "127.0.0.1:99999999", "127.0.0.1:5x", "::1:50051", "[::1]", "[::1]50051", "[::1:50051",
        "[]:1", "[localhost]:1", "host name:1", "http://host:1", "[::1]:", " 127.0.0.1:1"}) {
    absl::Status s = ParseHostPort(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
    EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("'", bad, "'")));
  }
}

TEST(ConfigTest, MissingFileIsNotFoundAndNamesThePath) {
  const std::string path = "/nonexistent/dir/specula.yaml";
  absl::StatusOr<ServerConfig> c = LoadConfigFile(path);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(path));
}

TEST(ConfigTest, DirectoryIsInvalidArgument) {
  absl::StatusOr<ServerConfig> c = LoadConfigFile(SPECULA_SOURCE_DIR "/deploy/config");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("deploy/config"));
}

TEST(ConfigTest, NonRegularFilesAreRefused) {
  // /dev/zero was once read until memory ran out; a FIFO would block startup.
  for (const char* path : {"/dev/zero", "/dev/null", "/dev/urandom"}) {
    absl::StatusOr<ServerConfig> c = LoadConfigFile(path);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("not a regular file")) << path;
  }
  const std::string fifo = ::testing::TempDir() + "/specula_config_fifo";
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<ServerConfig> c = LoadConfigFile(fifo);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("not a regular file"));
  std::remove(fifo.c_str());
}

TEST(ConfigTest, FilesOverOneMebibyteAreRefused) {
  const std::string path = ::testing::TempDir() + "/specula_config_big.yaml";
  {
    // Valid YAML all the way (comments), so only the size can be the reason.
    std::ofstream out(path);
    out << "scheduler:\n  threads: 2\n";
    out << std::string(1 << 20, '#') << "\n";
  }
  absl::StatusOr<ServerConfig> c = LoadConfigFile(path);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("more than the limit of 1048576"));
  {
    std::ofstream out(path, std::ios::trunc);
    out << "scheduler:\n  threads: 2\n" << std::string((1 << 20) - 100, '#') << "\n";
  }
  c = LoadConfigFile(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduler.threads, 2);
  std::remove(path.c_str());
}

TEST(ConfigTest, FileErrorsNameThePathAndLine) {
  const std::string path = ::testing::TempDir() + "/specula_config_test.yaml";
  {
    std::ofstream out(path);
    out << "# comment\nscheduler:\n  threads: 2\n  max_running_requests: 0\n";
  }
  absl::StatusOr<ServerConfig> c = LoadConfigFile(path);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(),
            absl::StrCat(path, ":4: scheduler.max_running_requests: must be >= 1, got 0"));
  std::remove(path.c_str());
}

std::string Trimmed(const std::string& line) {
  return std::string(absl::StripLeadingAsciiWhitespace(line));
}

// Every key of the table appears in the shipped file with its default (optional keys, which
// have none, commented out), under a comment documenting it; the file has no key the table lacks.
TEST(ConfigTest, DeployFileDocumentsEveryKeyOfTheTableWithItsDefault) {
  const std::string path = SPECULA_SOURCE_DIR "/deploy/config/specula.yaml";
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_GT(lines.size(), 100u);
  std::map<std::string, std::string> leaves;  // path -> scalar
  std::function<void(const YAML::Node&, const std::string&)> flatten =
      [&](const YAML::Node& node, const std::string& prefix) {
        for (const auto& entry : node) {
          const std::string key = prefix + entry.first.Scalar();
          if (entry.second.IsMap()) {
            flatten(entry.second, key + ".");
            continue;
          }
          leaves[key] = entry.second.Scalar();
          // A comment documents the key: the one just above it, or, for keys that share one
          // (consecutive lines), the comment above the group, which names it.
          int above = entry.first.Mark().line - 1;
          while (above >= 0 && !absl::StartsWith(Trimmed(lines[above]), "#")) --above;
          std::string comment;
          for (int i = above; i >= 0 && absl::StartsWith(Trimmed(lines[i]), "#"); --i) {
            comment = lines[i] + "\n" + comment;
          }
          const std::string leaf = entry.first.Scalar();
          EXPECT_TRUE(above == entry.first.Mark().line - 1 || absl::StrContains(comment, leaf))
              << key << " has no comment above it, nor is it named in the one above its group";
        }
      };
  flatten(YAML::LoadFile(path), "");
  const ServerConfig defaults;
  std::set<std::string> table;
  for (const ConfigKey& key : ConfigKeys()) {
    table.insert(key.path);
    ServerConfig copy = defaults;
    if (!HasDefault(key)) {
      EXPECT_FALSE(leaves.contains(key.path)) << key.path << " has no default to show";
      const std::string leaf = key.path.substr(key.path.rfind('.') + 1);
      EXPECT_THAT(absl::StrJoin(lines, "\n"), HasSubstr(absl::StrCat("# ", leaf, ": ")))
          << key.path << " is not documented (commented out) in " << path;
      continue;
    }
    ASSERT_TRUE(leaves.contains(key.path)) << key.path << " is missing from " << path;
    EXPECT_EQ(leaves[key.path], FormatConfigValue(key.field(copy))) << key.path;
  }
  for (const auto& [leaf, value] : leaves) {
    EXPECT_TRUE(table.contains(leaf)) << leaf << " is in " << path << " but not in the table";
  }
}

// --help shows every key with its default and rule, from the table.
TEST(ConfigTest, HelpListsEveryKeyWithItsDefaultAndRule) {
  const std::string help = ConfigKeysHelp();
  for (const ConfigKey& key : ConfigKeys()) {
    EXPECT_THAT(help, HasSubstr(absl::StrCat("  ", key.path, "  ("))) << key.path;
    EXPECT_THAT(help, HasSubstr(key.doc)) << key.path;
  }
  EXPECT_THAT(help, HasSubstr("scheduler.max_running_requests  (default \"64\"; [1, 4096])"));
  EXPECT_THAT(help, HasSubstr("model.device  (default \"auto\"; cpu | cuda | auto)"));
  EXPECT_THAT(help, HasSubstr("kv_cache.session_ttl_seconds  (default \"900\"; (0, 2592000])"));
  EXPECT_THAT(help, HasSubstr("sparse.page_size  (unset by default; kv_cache.page_size)"));
}

// Each integer range of the table is enforced at both ends, whichever key it is.
TEST(ConfigTest, EveryIntegerRangeIsEnforcedAtBothEnds) {
  int ranges = 0;
  for (const ConfigKey& key : ConfigKeys()) {
    const auto* range = std::get_if<IntRange>(&key.rule);
    if (range == nullptr) continue;
    for (const int64_t bad : {range->min - 1, range->max + 1}) {
      ServerConfig c;
      const ConfigField field = key.field(c);
      if (auto* p = std::get_if<int*>(&field)) {
        if (bad < std::numeric_limits<int>::min() || bad > std::numeric_limits<int>::max()) {
          continue;  // the reader refuses it for its type (ConfigTest.InvalidValues...)
        }
        **p = static_cast<int>(bad);
      } else if (auto* p = std::get_if<int64_t*>(&field)) {
        **p = bad;
      } else if (auto* p = std::get_if<std::optional<int64_t>*>(&field)) {
        **p = bad;
      } else {
        ADD_FAILURE() << key.path << ": an IntRange on a field that is not an integer";
        continue;
      }
      const absl::Status s = ValidateConfig(c);
      EXPECT_EQ(s.message(),
                absl::StrCat(key.path, ": must be ", bad < range->min ? ">= " : "<= ",
                             bad < range->min ? range->min : range->max, ", got ", bad));
      ++ranges;
    }
  }
  EXPECT_GE(ranges, 30);
}

// Flags override keys through the table: the same types, names and messages as the file.
TEST(ConfigTest, SetConfigValueReadsTextAsTheFileWould) {
  ServerConfig c;
  ASSERT_TRUE(SetConfigValue(&c, "model.device", "cpu", "--device").ok());
  EXPECT_EQ(c.model.device, DeviceKind::kCpu);
  ASSERT_TRUE(SetConfigValue(&c, "server.log_level", "warning", "--log-level").ok());
  EXPECT_EQ(c.server.log_level, LogLevel::kWarning);
  ASSERT_TRUE(SetConfigValue(&c, "server.metrics_listen", "", "--metrics-listen").ok());
  EXPECT_EQ(c.server.metrics_listen, "");
  ASSERT_TRUE(SetConfigValue(&c, "scheduler.threads", "3", "--threads").ok());
  EXPECT_EQ(c.scheduler.threads, 3);

  absl::Status s = SetConfigValue(&c, "model.device", "gpu", "--device");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--device: model.device: must be one of cpu, cuda, auto, got 'gpu'");
  EXPECT_EQ(c.model.device, DeviceKind::kCpu);  // unchanged
  s = SetConfigValue(&c, "scheduler.threads", "many", "--threads");
  EXPECT_EQ(s.message(), "--threads: scheduler.threads: expected an integer, got 'many'");
  s = SetConfigValue(&c, "scheduler.thread", "1", "--x");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown key 'scheduler.thread'"));
}

}  // namespace
}  // namespace specula
