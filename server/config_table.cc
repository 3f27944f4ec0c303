#include "server/config_table.h"

#include <cmath>
#include <limits>
#include <string_view>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/common/log.h"
#include "engine/kv/kv_dtype.h"
#include "engine/kv/sparse_options.h"

namespace specula {
namespace {

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
// KV pages are counted in int32, and a page may hold one token.
constexpr int64_t kMaxKvCacheTokens = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxHostTokens = int64_t{1} << 30;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMaxSessionTtlSeconds = 30 * 24 * 3600;  // 30 days
// "Checked by the engine's ValidateSparseOptions": one rule book for the server and the engine.
constexpr char kEngineRule[] = "checked by the engine (docs/SPARSE_KV.md)";

// A NamedField over an enum with a parse function (StatusOr<E>(string_view)) and a name
// function (E -> something printable).
template <typename E, typename Parse, typename Name>
NamedField Named(E* field, Parse parse, Name name) {
  return NamedField{[field, parse](absl::string_view text) -> absl::Status {
                      // The engine's parsers take either string_view (Debian's absl has its own).
                      auto parsed = [&] {
                        if constexpr (std::is_invocable_v<Parse, absl::string_view>)
                          return parse(text);
                        else
                          return parse(std::string_view(text.data(), text.size()));
                      }();
                      if (!parsed.ok()) return parsed.status();
                      *field = *parsed;
                      return absl::OkStatus();
                    },
                    [field, name] { return std::string(name(*field)); }};
}

absl::StatusOr<SendPriority> ParseSendPriority(absl::string_view name) {
  if (name == "idle") return SendPriority::kIdle;
  if (name == "normal") return SendPriority::kNormal;
  return absl::InvalidArgumentError(absl::StrCat("must be one of idle, normal, got '", name, "'"));
}

const char* SendPriorityName(SendPriority p) {
  return p == SendPriority::kNormal ? "normal" : "idle";
}

// The table proper. Each row: path, field, rule, allowed names, doc line. Upper bounds of
// size-like keys are far beyond any sensible setting and low enough that a typo is refused at
// load instead of starting 100000 threads or sizing buffers by 2^31.
std::vector<ConfigKey> ServerKeys() {
  using C = ServerConfig&;
  return {
      {"server.listen", [](C c) -> ConfigField { return &c.server.listen; }, AddressRule{false}, "",
       "gRPC API address HOST:PORT ([::1]:P for IPv6, port 0 = any free port)"},
      {"server.metrics_listen", [](C c) -> ConfigField { return &c.server.metrics_listen; },
       AddressRule{true}, "", "Prometheus /metrics address HOST:PORT; \"\" disables it"},
      {"server.http_listen", [](C c) -> ConfigField { return &c.server.http_listen; },
       AddressRule{true}, "", "OpenAI-compatible HTTP API address HOST:PORT; \"\" disables it"},
      {"server.http_max_body_bytes",
       [](C c) -> ConfigField { return &c.server.http_max_body_bytes; }, IntRange{1024, kIntMax},
       "", "largest HTTP request body, bytes (413 beyond)"},
      {"server.max_receive_message_bytes",
       [](C c) -> ConfigField { return &c.server.max_receive_message_bytes; },
       IntRange{1024, kIntMax}, "", "largest gRPC request message, bytes"},
      {"server.shutdown_grace_seconds",
       [](C c) -> ConfigField { return &c.server.shutdown_grace_seconds; }, RealRange{0, kInf}, "",
       "on SIGTERM, how long in-flight requests may still run"},
      {"server.stall_seconds", [](C c) -> ConfigField { return &c.server.stall_seconds; },
       RealRange{0, 86400}, "", "watchdog: no engine progress this long turns health off; 0 = off"},
      {"server.log_level",
       [](C c) -> ConfigField { return Named(&c.server.log_level, ParseLogLevel, LogLevelName); },
       NoRule{}, "debug | info | warning | error", "least severity of the log lines written"},
      {"server.send_priority",
       [](C c) -> ConfigField {
         return Named(&c.server.send_priority, ParseSendPriority, SendPriorityName);
       },
       NoRule{}, "idle | normal", "scheduling of the thread sending tokens to clients"},
      {"server.auth.token_file", [](C c) -> ConfigField { return &c.server.auth_token_file; },
       NoRule{}, "", "bearer tokens, one per line; \"\" = no authentication"},
  };
}

std::vector<ConfigKey> ConnectionKeys() {
  using C = ServerConfig&;
  return {
      // gRPC takes milliseconds as an int: at most 2147483 s (24.8 days).
      {"server.connections.grpc_max_idle_seconds",
       [](C c) -> ConfigField { return &c.server.grpc_max_idle_seconds; }, RealRange{0, 2147483},
       "", "a gRPC connection with no call this long gets GOAWAY; 0 = never"},
      {"server.connections.grpc_handshake_seconds",
       [](C c) -> ConfigField { return &c.server.grpc_handshake_seconds; }, RealRange{0.1, 3600},
       "", "a TLS handshake unfinished this long is closed"},
      {"server.connections.grpc_max_connections",
       [](C c) -> ConfigField { return &c.server.grpc_max_connections; }, IntRange{1, 1048576},
       "", "gRPC connections open at once (plaintext; with TLS gRPC's listener has no cap)"},
      {"server.connections.http_idle_seconds",
       [](C c) -> ConfigField { return &c.server.http_idle_seconds; }, IntRange{1, 3600}, "",
       "an HTTP connection with no traffic this long is closed"},
      {"server.connections.http_stream_stall_seconds",
       [](C c) -> ConfigField { return &c.server.http_stream_stall_seconds; }, IntRange{0, 86400},
       "", "a streamed answer whose client reads nothing this long is closed; 0 = never"},
      {"server.connections.http_max_connections",
       [](C c) -> ConfigField { return &c.server.http_max_connections; }, IntRange{1, 65536}, "",
       "HTTP connections held at once, per listener"},
      {"server.connections.http_request_read_seconds",
       [](C c) -> ConfigField { return &c.server.http_request_read_seconds; }, RealRange{0.1, 3600},
       "", "time to deliver a whole HTTP request (slowloris bound)"},
      {"server.connections.http_max_connections_per_ip",
       [](C c) -> ConfigField { return &c.server.http_max_connections_per_ip; }, IntRange{0, 65536},
       "", "HTTP connections from one address; 0 = no limit"},
      {"server.connections.min_ping_interval_seconds",
       [](C c) -> ConfigField { return &c.server.min_ping_interval_seconds; },
       RealRange{0.001, 86400}, "", "client pings closer than this are strikes"},
      {"server.connections.max_ping_strikes",
       [](C c) -> ConfigField { return &c.server.max_ping_strikes; }, IntRange{0, 1000}, "",
       "strikes before GOAWAY too_many_pings; 0 = no limit"},
      {"server.connections.ping_without_calls",
       [](C c) -> ConfigField { return &c.server.ping_without_calls; }, NoRule{}, "",
       "accept keepalive pings on connections with no call"},
      {"server.tls.cert_file", [](C c) -> ConfigField { return &c.server.tls_cert_file; }, NoRule{},
       "", "PEM certificate chain; with key_file turns TLS on for gRPC and HTTP"},
      {"server.tls.key_file", [](C c) -> ConfigField { return &c.server.tls_key_file; }, NoRule{},
       "", "PEM private key of cert_file"},
      {"server.tls.client_ca_file", [](C c) -> ConfigField { return &c.server.tls_client_ca_file; },
       NoRule{}, "", "PEM CA: clients must present a certificate it signed (mTLS)"},
      {"server.tls.reload_seconds", [](C c) -> ConfigField { return &c.server.tls_reload_seconds; },
       RealRange{1, 86400}, "", "how often the TLS files are checked for changes"},
      {"server.reflection", [](C c) -> ConfigField { return &c.server.reflection; }, NoRule{}, "",
       "serve gRPC reflection (the schema, without a token)"},
      {"server.limits.max_prompt_tokens",
       [](C c) -> ConfigField { return &c.server.max_prompt_tokens; }, IntRange{0, kIntMax}, "",
       "longest prompt a request may send; 0 = the model's context"},
      {"server.limits.max_tokens", [](C c) -> ConfigField { return &c.server.max_output_tokens; },
       IntRange{0, kIntMax}, "", "cap on a request's max_tokens; 0 = none"},
      {"server.limits.max_requests_per_client",
       [](C c) -> ConfigField { return &c.server.max_requests_per_client; }, IntRange{0, kIntMax},
       "", "requests one client may have in flight; 0 = no limit"},
      {"server.responses.max_stored",
       [](C c) -> ConfigField { return &c.server.responses_max_stored; }, IntRange{1, 10000000},
       "", "Responses API responses kept for previous_response_id and GET"},
      {"server.responses.ttl_seconds",
       [](C c) -> ConfigField { return &c.server.responses_ttl_seconds; },
       RealRange{1, 31536000}, "", "a stored response unused this long is dropped"},
  };
}

std::vector<ConfigKey> ModelAndSchedulerKeys() {
  using C = ServerConfig&;
  return {
      {"model.path", [](C c) -> ConfigField { return &c.model.path; }, NoRule{}, "",
       "model directory; \"\" = the embedded tiny model"},
      {"model.name", [](C c) -> ConfigField { return &c.model.name; }, NoRule{}, "",
       "the OpenAI API's model id; \"\" = the directory's name"},
      {"model.device",
       [](C c) -> ConfigField { return Named(&c.model.device, ParseDeviceKind, DeviceKindName); },
       NoRule{}, "cpu | cuda | auto", "where the model runs; auto = a visible GPU, else the CPU"},
      {"model.cuda_graphs", [](C c) -> ConfigField { return &c.model.cuda_graphs; }, NoRule{}, "",
       "replay decode steps as CUDA graphs; false = launch each kernel"},
      {"model.dependent_launches", [](C c) -> ConfigField { return &c.model.dependent_launches; },
       NoRule{}, "", "launch each kernel while the one ahead runs (sm_90); false = after it"},
      {"model.chat_template", [](C c) -> ConfigField { return &c.model.chat_template; }, NoRule{},
       "", "a Jinja chat template file; \"\" = the tokenizer's"},
      {"model.tool_call_parser", [](C c) -> ConfigField { return &c.model.tool_call_parser; },
       OneOf{{"auto", "none", "hermes", "llama3_json"}}, "",
       "how tool calls are read off the output"},
      {"scheduler.max_running_requests",
       [](C c) -> ConfigField { return &c.scheduler.max_running_requests; }, IntRange{1, 4096}, "",
       "most sequences in one forward pass"},
      {"scheduler.max_waiting_requests",
       [](C c) -> ConfigField { return &c.scheduler.max_waiting_requests; }, IntRange{0, 1 << 20},
       "", "queued requests; more are RESOURCE_EXHAUSTED"},
      {"scheduler.prefill_chunk_tokens",
       [](C c) -> ConfigField { return &c.scheduler.prefill_chunk_tokens; }, IntRange{1, 65536}, "",
       "most prompt tokens per step while sequences decode"},
      {"scheduler.solo_prefill_chunk_tokens",
       [](C c) -> ConfigField { return &c.scheduler.solo_prefill_chunk_tokens; },
       IntRange{0, 65536}, "", "most prompt tokens per step with nothing decoding; 0 = the above"},
      {"scheduler.default_max_tokens",
       [](C c) -> ConfigField { return &c.scheduler.default_max_tokens; }, IntRange{0, 1 << 30}, "",
       "max_tokens of a request that sends none; 0 = the context"},
      {"scheduler.threads", [](C c) -> ConfigField { return &c.scheduler.threads; },
       IntRange{0, 1024}, "", "CPU threads of the engine; 0 = all cores"},
      {"scheduler.max_tokenizing_requests",
       [](C c) -> ConfigField { return &c.scheduler.max_tokenizing_requests; }, IntRange{1, 1024},
       "", "long text prompts waiting to be tokenized"},
      {"scheduler.max_overtakes", [](C c) -> ConfigField { return &c.scheduler.max_overtakes; },
       IntRange{0, 1 << 20}, "", "later requests that may start ahead of a waiting one"},
  };
}

std::vector<ConfigKey> KvCacheKeys() {
  using C = ServerConfig&;
  return {
      {"kv_cache.page_size", [](C c) -> ConfigField { return &c.kv_cache.page_size; },
       PowerOfTwoRange{1, 1024}, "", "tokens per KV page"},
      {"kv_cache.capacity_tokens", [](C c) -> ConfigField { return &c.kv_cache.capacity_tokens; },
       IntRange{1, kMaxKvCacheTokens}, "", "the device KV pool, in token positions (>= page_size)"},
      {"kv_cache.dtype", [](C c) -> ConfigField { return &c.kv_cache.dtype; },
       TextRule{[](absl::string_view t) {
         return ResolveKvDtype({t.data(), t.size()}, DType::kF32).status();
       }},
       "auto | bf16 | f16 | f32", "KV element type; auto = the backend's"},
      {"kv_cache.prefix_cache", [](C c) -> ConfigField { return &c.kv_cache.prefix_cache; },
       NoRule{}, "", "reuse KV across requests without a session too"},
      {"kv_cache.session_ttl_seconds",
       [](C c) -> ConfigField { return &c.kv_cache.session_ttl_seconds; },
       RealRange{0, kMaxSessionTtlSeconds, true}, "", "an idle session's KV is freed after this"},
      {"kv_cache.max_sessions", [](C c) -> ConfigField { return &c.kv_cache.max_sessions; },
       IntRange{1, 1000000}, "", "sessions kept; beyond it the least recently used idle one goes"},
      {"kv_cache.host_capacity_tokens",
       [](C c) -> ConfigField { return &c.kv_cache.host_capacity_tokens; },
       IntRange{-1, kMaxHostTokens}, "",
       "host KV store, token positions per layer and KV head; -1 = 262144 with sparse, else 0"},
  };
}

std::vector<ConfigKey> SparseKeys() {
  using C = ServerConfig&;
  return {
      {"sparse.enabled", [](C c) -> ConfigField { return &c.sparse.options.enabled; }, NoRule{}, "",
       "sparse KV cache with host backing for long requests"},
      {"sparse.budget_tokens", [](C c) -> ConfigField { return &c.sparse.options.budget_tokens; },
       NoRule{}, kEngineRule, "selected tokens per layer and KV head"},
      {"sparse.sink_tokens", [](C c) -> ConfigField { return &c.sparse.options.sink_tokens; },
       NoRule{}, kEngineRule, "first tokens, always attended"},
      {"sparse.recent_tokens", [](C c) -> ConfigField { return &c.sparse.options.recent_tokens; },
       NoRule{}, kEngineRule, "last tokens, always attended"},
      {"sparse.selector", [](C c) -> ConfigField { return &c.sparse.options.selector; }, NoRule{},
       "quest | exact", "how pages are ranked"},
      {"sparse.speculation",
       [](C c) -> ConfigField {
         return Named(&c.sparse.options.speculation, ParseSpeculationMode, SpeculationModeName);
       },
       NoRule{}, "none | cross_step | cross_layer | both", "what predicts the next working set"},
      {"sparse.miss_policy",
       [](C c) -> ConfigField {
         return Named(&c.sparse.options.miss_policy, ParseMissPolicy, MissPolicyName);
       },
       NoRule{}, "auto | defer | fetch", "what a selected page that is not resident does"},
      {"sparse.miss_correction",
       [](C c) -> ConfigField { return &c.sparse.options.miss_correction; }, NoRule{}, kEngineRule,
       "defer: the best-ranked share of a selection whose misses are read at once"},
      {"sparse.min_context_tokens",
       [](C c) -> ConfigField { return &c.sparse.options.min_context_tokens; }, NoRule{},
       kEngineRule, "shorter requests stay dense; -1 = twice the budget"},
      {"sparse.prefetch_threads",
       [](C c) -> ConfigField { return &c.sparse.options.prefetch_threads; }, NoRule{}, kEngineRule,
       "threads of the prefetch executor"},
      {"sparse.prefetch_extra_tokens",
       [](C c) -> ConfigField { return &c.sparse.options.prefetch_extra_tokens; }, NoRule{},
       kEngineRule, "tokens staged beyond the budget; -1 = half the budget"},
      {"sparse.host_capacity_tokens",
       [](C c) -> ConfigField { return &c.sparse.host_capacity_tokens; },
       IntRange{1, kMaxHostTokens}, "", "old name of kv_cache.host_capacity_tokens"},
      {"sparse.page_size", [](C c) -> ConfigField { return &c.sparse.page_size; }, NoRule{},
       "kv_cache.page_size", "restates kv_cache.page_size, must equal it"},
  };
}

std::vector<ConfigKey> AllKeys() {
  std::vector<ConfigKey> keys;
  for (auto part : {ServerKeys, ConnectionKeys, ModelAndSchedulerKeys, KvCacheKeys, SparseKeys}) {
    for (ConfigKey& key : part()) keys.push_back(std::move(key));
  }
  return keys;
}

// %.10g: bounds up to 2147483 print whole (StrCat would print 2.14748e+06).
std::string Real(double x) { return absl::StrFormat("%.10g", x); }

std::optional<std::string> IntViolation(const IntRange& r, int64_t v) {
  if (v < r.min) return absl::StrCat("must be >= ", r.min, ", got ", v);
  if (v > r.max) return absl::StrCat("must be <= ", r.max, ", got ", v);
  return std::nullopt;
}

std::optional<std::string> RealViolation(const RealRange& r, double v) {
  if (std::isinf(r.max)) {
    if (v >= r.min && std::isfinite(v)) return std::nullopt;
    return absl::StrCat("must be a finite number >= ", Real(r.min), ", got ", v);
  }
  // NaN fails both comparisons.
  if ((r.min_open ? v > r.min : v >= r.min) && v <= r.max) return std::nullopt;
  return absl::StrCat("must be in ", r.min_open ? "(" : "[", Real(r.min), ", ", Real(r.max),
                      "], got ", v);
}

// The value of an integer field (unset optionals have none).
std::optional<int64_t> IntValue(const ConfigField& field) {
  if (auto* p = std::get_if<int*>(&field)) return **p;
  if (auto* p = std::get_if<int64_t*>(&field)) return **p;
  if (auto* p = std::get_if<std::optional<int>*>(&field)) {
    return **p ? std::optional<int64_t>(***p) : std::nullopt;
  }
  if (auto* p = std::get_if<std::optional<int64_t>*>(&field)) return **p;
  return std::nullopt;
}

}  // namespace

const std::vector<ConfigKey>& ConfigKeys() {
  static const std::vector<ConfigKey>* keys = new std::vector<ConfigKey>(AllKeys());
  return *keys;
}

const ConfigKey* FindConfigKey(absl::string_view path) {
  for (const ConfigKey& key : ConfigKeys()) {
    if (key.path == path) return &key;
  }
  return nullptr;
}

std::string FormatConfigValue(const ConfigField& field) {
  if (auto* p = std::get_if<std::string*>(&field)) return **p;
  if (auto* p = std::get_if<bool*>(&field)) return **p ? "true" : "false";
  if (auto* p = std::get_if<double*>(&field)) return Real(**p);
  if (auto* p = std::get_if<NamedField>(&field)) return p->name();
  std::optional<int64_t> v = IntValue(field);
  return v ? absl::StrCat(*v) : "";
}

bool HasDefault(const ConfigKey& key) {
  ServerConfig defaults;
  const ConfigField field = key.field(defaults);
  return !std::holds_alternative<std::optional<int>*>(field) &&
         !std::holds_alternative<std::optional<int64_t>*>(field);
}

std::optional<std::string> RuleViolation(const ConfigKey& key, ServerConfig& config) {
  const ConfigField field = key.field(config);
  if (const auto* r = std::get_if<IntRange>(&key.rule)) {
    std::optional<int64_t> v = IntValue(field);
    return v ? IntViolation(*r, *v) : std::nullopt;
  }
  if (const auto* r = std::get_if<PowerOfTwoRange>(&key.rule)) {
    const int64_t v = IntValue(field).value_or(r->min);
    if (v >= r->min && v <= r->max && (v & (v - 1)) == 0) return std::nullopt;
    return absl::StrCat("must be a power of two in [", r->min, ", ", r->max, "], got ", v);
  }
  if (const auto* r = std::get_if<RealRange>(&key.rule)) {
    return RealViolation(*r, *std::get<double*>(field));
  }
  if (const auto* r = std::get_if<AddressRule>(&key.rule)) {
    const std::string& address = *std::get<std::string*>(field);
    if (r->may_be_empty && address.empty()) return std::nullopt;
    absl::Status status = ParseHostPort(address);
    if (!status.ok()) return std::string(status.message());
  }
  if (const auto* r = std::get_if<OneOf>(&key.rule)) {
    const std::string& text = *std::get<std::string*>(field);
    for (const std::string& name : r->names) {
      if (name == text) return std::nullopt;
    }
    return absl::StrCat("must be one of ", absl::StrJoin(r->names, ", "), ", got '", text, "'");
  }
  if (const auto* r = std::get_if<TextRule>(&key.rule)) {
    absl::Status status = r->check(*std::get<std::string*>(field));
    if (!status.ok()) return std::string(status.message());
  }
  return std::nullopt;
}

std::string DescribeRule(const ConfigKey& key) {
  if (!key.allowed.empty()) return key.allowed;
  if (const auto* r = std::get_if<IntRange>(&key.rule)) {
    return absl::StrCat("[", r->min, ", ", r->max, "]");
  }
  if (const auto* r = std::get_if<PowerOfTwoRange>(&key.rule)) {
    return absl::StrCat("power of two in [", r->min, ", ", r->max, "]");
  }
  if (const auto* r = std::get_if<RealRange>(&key.rule)) {
    if (std::isinf(r->max)) return absl::StrCat(">= ", Real(r->min));
    return absl::StrCat(r->min_open ? "(" : "[", Real(r->min), ", ", Real(r->max), "]");
  }
  if (const auto* r = std::get_if<AddressRule>(&key.rule)) {
    return r->may_be_empty ? "HOST:PORT or \"\"" : "HOST:PORT";
  }
  if (const auto* r = std::get_if<OneOf>(&key.rule)) return absl::StrJoin(r->names, " | ");
  return "";
}

std::string ConfigKeysHelp() {
  std::string out =
      "Configuration keys (YAML file given by --config; every key documented in "
      "deploy/config/specula.yaml):\n";
  ServerConfig defaults;
  for (const ConfigKey& key : ConfigKeys()) {
    const std::string rule = DescribeRule(key);
    const std::string value =
        HasDefault(key) ? absl::StrCat("default \"", FormatConfigValue(key.field(defaults)), "\"")
                        : "unset by default";
    absl::StrAppend(&out, "  ", key.path, "  (", value, rule.empty() ? "" : "; ", rule, ")\n      ",
                    key.doc, "\n");
  }
  return out;
}

}  // namespace specula
