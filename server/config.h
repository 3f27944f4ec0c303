// The daemon's configuration: one YAML file (every key documented in deploy/config/specula.yaml)
// parsed into typed structs whose member initializers are the defaults. The keys, their ranges
// and their documentation lines are the table of server/config_table.h. Flags may override
// fields afterwards (SetConfigValue); call ValidateConfig again then.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/common/device_kind.h"
#include "engine/common/log.h"
#include "engine/kv/sparse_options.h"
#include "server/send_priority.h"

namespace specula {

// Each member is the key of the same name (server/config_table.cc: its range, doc line and
// path); the initializers are the defaults.
struct ServerSection {
  std::string listen = "127.0.0.1:50051";         // gRPC address, HOST:PORT
  std::string metrics_listen = "127.0.0.1:9400";  // /metrics address; "" disables it
  std::string http_listen;                        // OpenAI-compatible HTTP API; "" = off
  int64_t http_max_body_bytes = 4194304;          // largest HTTP request body
  int64_t max_receive_message_bytes = 4194304;    // largest gRPC request message
  double shutdown_grace_seconds = 30;
  double stall_seconds = 120;  // no engine progress with work queued; 0 = no watchdog
  LogLevel log_level = LogLevel::kInfo;
  SendPriority send_priority = SendPriority::kIdle;  // server/send_executor.h
  std::string auth_token_file;  // server.auth.token_file: bearer tokens; "" = no auth
  bool reflection = false;      // serve gRPC reflection (schema listing without a token)
  // server.tls: PEM files; cert_file and key_file turn TLS on for the gRPC and HTTP listeners,
  // client_ca_file also requires client certificates signed by it (mTLS). Re-read when they
  // change, checked every reload_seconds.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  double tls_reload_seconds = 60;
  bool tls() const { return !tls_cert_file.empty(); }
  // server.connections: what a connection may do before it is closed.
  double grpc_max_idle_seconds = 3600;    // no call for this long; 0 = never
  double grpc_handshake_seconds = 10;     // TLS handshake unfinished this long
  int grpc_max_connections = 2048;        // plaintext gRPC connections open at once
  int http_idle_seconds = 10;             // an HTTP connection with no traffic
  int http_stream_stall_seconds = 300;    // a streamed answer its client does not read; 0 = never
  int http_max_connections = 1024;        // open HTTP connections at once
  double http_request_read_seconds = 10;  // to complete a request head (and handshake)
  int http_max_connections_per_ip = 0;    // from one client address; 0 = no limit
  double min_ping_interval_seconds = 10;  // client pings closer are strikes
  int max_ping_strikes = 2;               // then GOAWAY too_many_pings; 0 = no limit
  bool ping_without_calls = true;         // keepalive pings on connections with no call
  // server.limits: what one request may ask, 0 = no limit beyond the model's context.
  int64_t max_prompt_tokens = 0;    // limits.max_prompt_tokens
  int64_t max_output_tokens = 0;    // limits.max_tokens: cap on max_tokens
  int max_requests_per_client = 0;  // limits.max_requests_per_client, 0 = none
  // server.responses: the Responses API's stored responses (previous_response_id, GET).
  int64_t responses_max_stored = 10000;    // responses.max_stored: the least recently used go
  double responses_ttl_seconds = 3600;     // responses.ttl_seconds: unused this long, dropped
  bool operator==(const ServerSection&) const = default;
};

struct ModelSection {
  std::string path;  // "" = the embedded default tiny model
  std::string name;  // the OpenAI API's model id; "" = the directory's name
  DeviceKind device = DeviceKind::kAuto;
  bool cuda_graphs = true;  // decode steps replayed as CUDA graphs (GPU only)
  bool dependent_launches = true;         // kernels launched while the one ahead runs (GPU only)
  std::string chat_template;              // a Jinja template file; "" = tokenizer_config.json's
  std::string tool_call_parser = "auto";  // auto | none | hermes | llama3_json
  bool operator==(const ModelSection&) const = default;
};

struct SchedulerSection {
  int max_running_requests = 64;
  int max_waiting_requests = 1024;
  int prefill_chunk_tokens = 512;
  int solo_prefill_chunk_tokens = 4096;  // 0 = prefill_chunk_tokens
  int default_max_tokens = 0;            // 0 = up to the remaining context
  int threads = 0;                       // 0 = all cores
  int max_tokenizing_requests = 16;      // long text prompts waiting to be tokenized
  int max_overtakes = 16;                // later requests may start ahead of a waiting one
  bool operator==(const SchedulerSection&) const = default;
};

struct KvCacheSection {
  int page_size = 16;
  int64_t capacity_tokens = 65536;
  std::string dtype = "auto";        // auto | bf16 | f16 | f32 (engine's ResolveKvDtype)
  bool prefix_cache = true;          // reuse KV across requests without a session too
  double session_ttl_seconds = 900;  // an idle session's KV is freed after this
  int64_t max_sessions = 10000;      // beyond it a new session drops the LRU idle one
  // The host KV store (sparse requests and sessions), token positions per layer and KV head;
  // -1 = 262144 with sparse.enabled, else none (GeneratorOptions).
  int64_t host_capacity_tokens = -1;
  bool operator==(const KvCacheSection&) const = default;
};

// The sparse KV cache (docs/ARCHITECTURE.md §4). The keys are SparseOptions' members under the same
// names; their values are checked by the engine's ValidateSparseOptions, so server and engine
// cannot disagree on what is valid.
struct SparseSection {
  SparseOptions options;
  // Tokens per page. Sparse pages are KV cache pages, so this only restates kv_cache.page_size:
  // when given it must equal it (a config written for another page size fails loudly instead of
  // running with a budget the operator did not size).
  std::optional<int> page_size;
  // The old name of kv_cache.host_capacity_tokens, still read (HostCapacityTokens).
  std::optional<int64_t> host_capacity_tokens;
  bool operator==(const SparseSection&) const = default;
};

struct ServerConfig {
  ServerSection server;
  ModelSection model;
  SchedulerSection scheduler;
  KvCacheSection kv_cache;
  SparseSection sparse;
  bool operator==(const ServerConfig&) const = default;
};

// Parses a YAML document; an empty document means all defaults. Unknown keys, wrong types and
// invalid values are INVALID_ARGUMENT naming `source_name`, the line (when known) and the full
// key path, e.g. "specula.yaml:7: scheduler.max_running_requests: must be >= 1, got 0".
// The result has passed ValidateConfig.
absl::StatusOr<ServerConfig> ParseConfigYaml(absl::string_view yaml_text,
                                             absl::string_view source_name);

// Reads and parses the file at `path`. NOT_FOUND when it does not exist, PERMISSION_DENIED when
// it cannot be read, INVALID_ARGUMENT for a directory, anything but a regular file (/dev/zero, a
// FIFO), a file over 1 MiB or bad content; messages name the path.
absl::StatusOr<ServerConfig> LoadConfigFile(const std::string& path);

// kv_cache.host_capacity_tokens, or its old name sparse.host_capacity_tokens when only that is
// set and sparse.enabled (the old key sized the sparse cache's store only); -1 otherwise.
int64_t HostCapacityTokens(const ServerConfig& config);

// Checks every value and the relations between them; INVALID_ARGUMENT names the key path.
absl::Status ValidateConfig(const ServerConfig& config);

// Sets the key at `path` ("model.device") from `text` as if the YAML file had it (a flag's
// override). INVALID_ARGUMENT "<source>: <path>: <why>" for an unknown key or a value of the
// wrong type or name; ranges are ValidateConfig's.
absl::Status SetConfigValue(ServerConfig* config, absl::string_view path, absl::string_view text,
                            absl::string_view source);

// Checks "HOST:PORT" (IPv6 hosts in brackets: "[::1]:50051"; port 0..65535, 0 = ephemeral).
// On success fills `host` (without brackets) and `port` when they are non-null.
absl::Status ParseHostPort(absl::string_view host_port, std::string* host = nullptr,
                           int* port = nullptr);

}  // namespace specula
