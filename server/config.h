// The daemon's configuration: one YAML file (every key documented in deploy/config/specula.yaml)
// parsed into typed structs whose member initializers are the defaults. Flags may override
// fields afterwards; call ValidateConfig again then.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/kv/sparse_options.h"

namespace specula {

struct ServerSection {
  std::string listen = "127.0.0.1:50051";         // gRPC address, HOST:PORT
  std::string metrics_listen = "127.0.0.1:9400";  // /metrics address; "" disables it
  std::string http_listen;                        // OpenAI-compatible HTTP API; "" = off
  int64_t http_max_body_bytes = 4194304;          // [1024, 2^31-1]: largest HTTP request body
  int64_t max_receive_message_bytes = 4194304;    // >= 1024, fits in int
  double shutdown_grace_seconds = 30;             // >= 0
  double stall_seconds = 120;  // [0, 86400]: no engine progress with work queued; 0 = no watchdog
  std::string log_level = "info";                 // as accepted by ParseLogLevel
  std::string send_priority = "idle";             // idle | normal (server/send_executor.h)
  std::string auth_token_file;  // server.auth.token_file: bearer tokens; "" = no auth
  bool reflection = false;       // serve gRPC reflection (schema listing without a token)
  // server.tls: PEM files; cert_file and key_file turn TLS on for the gRPC and HTTP listeners,
  // client_ca_file also requires client certificates signed by it (mTLS). Re-read when they
  // change, checked every reload_seconds.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  double tls_reload_seconds = 60;  // [1, 86400]
  bool tls() const { return !tls_cert_file.empty(); }
  // server.connections: what a connection may do before it is closed.
  double grpc_max_idle_seconds = 3600;    // [0, 2147483]: no call for this long; 0 = never
  double grpc_handshake_seconds = 10;     // [0.1, 3600]: TLS handshake unfinished this long
  int http_idle_seconds = 10;             // [1, 3600]: an HTTP connection with no traffic
  int http_max_connections = 1024;        // [1, 65536]: open HTTP connections at once
  double http_request_read_seconds = 10;  // [0.1, 3600]: to complete a request head (and handshake)
  int http_max_connections_per_ip = 0;    // [0, 65536]: from one client address; 0 = no limit
  double min_ping_interval_seconds = 10;  // [0.001, 86400]: client pings closer are strikes
  int max_ping_strikes = 2;               // [0, 1000]: then GOAWAY too_many_pings; 0 = no limit
  bool ping_without_calls = true;         // keepalive pings on connections with no call
  // server.limits: what one request may ask, 0 = no limit beyond the model's context.
  int64_t max_prompt_tokens = 0;  // limits.max_prompt_tokens: [0, 2^31-1]
  int64_t max_output_tokens = 0;  // limits.max_tokens: cap on max_tokens, [0, 2^31-1]
  int max_requests_per_client = 0;  // limits.max_requests_per_client: [0, 2^31-1], 0 = none
  bool operator==(const ServerSection&) const = default;
};

struct ModelSection {
  std::string path;             // "" = the embedded default tiny model
  std::string name;             // the OpenAI API's model id; "" = the directory's name
  std::string device = "auto";  // cpu | cuda | auto
  std::string chat_template;    // a Jinja template file; "" = tokenizer_config.json's
  std::string tool_call_parser = "auto";  // auto | none | hermes | llama3_json
  bool operator==(const ModelSection&) const = default;
};

struct SchedulerSection {
  int max_running_requests = 64;    // >= 1
  int max_waiting_requests = 1024;  // >= 0
  int prefill_chunk_tokens = 512;   // >= 1
  int solo_prefill_chunk_tokens = 4096;  // 0 (= prefill_chunk_tokens) or >= 1
  int default_max_tokens = 0;       // 0 = up to the remaining context; else a cap, >= 1
  int threads = 0;                  // 0 = all cores
  int max_tokenizing_requests = 16;  // 1..1024: long text prompts waiting to be tokenized
  int max_overtakes = 16;           // 0..1048576: later requests may start ahead of a waiting one
  bool operator==(const SchedulerSection&) const = default;
};

struct KvCacheSection {
  int page_size = 16;               // power of two in [1, 1024]
  int64_t capacity_tokens = 65536;  // >= page_size
  std::string dtype = "auto";       // auto | bf16 | f16 | f32 (engine's ResolveKvDtype)
  bool prefix_cache = true;         // reuse KV across requests without a session too
  double session_ttl_seconds = 900;  // (0, 30 days]: an idle session's KV is freed after this
  int64_t max_sessions = 10000;  // [1, 1000000]: beyond it a new session drops the LRU idle one
  // The host KV store (sparse requests and sessions), token positions per layer and KV head;
  // [0, 2^30], or -1 = 262144 with sparse.enabled, else none (GeneratorOptions).
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

// Checks "HOST:PORT" (IPv6 hosts in brackets: "[::1]:50051"; port 0..65535, 0 = ephemeral).
// On success fills `host` (without brackets) and `port` when they are non-null.
absl::Status ParseHostPort(absl::string_view host_port, std::string* host = nullptr,
                           int* port = nullptr);

}  // namespace specula
