#include "server/config.h"

#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/common/bounded_file.h"
#include "engine/common/log.h"
#include "engine/common/status_macros.h"
#include "engine/kv/kv_dtype.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace specula {
namespace {

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
// Upper bounds of the size-like keys (documented in deploy/config/specula.yaml). Each is far
// beyond any sensible setting, and low enough that a typo is refused at load instead of
// starting 100000 threads or sizing buffers by 2^31.
constexpr int kMaxRunningRequests = 4096;
constexpr int kMaxWaitingRequests = 1 << 20;
constexpr int kMaxPrefillChunkTokens = 65536;
constexpr int kMaxDefaultMaxTokens = 1 << 30;
constexpr int kMaxThreads = 1024;
constexpr int kMaxTokenizingRequests = 1024;
// KV pages are counted in int32, and a page may hold one token.
constexpr int64_t kMaxKvCacheTokens = std::numeric_limits<int32_t>::max();
constexpr double kMaxSessionTtlSeconds = 30 * 24 * 3600;  // 30 days
constexpr int64_t kMaxSessions = 1000000;
// A config file is a page of YAML; anything bigger is a mistake (or /dev/zero).
constexpr int64_t kMaxConfigFileBytes = 1 << 20;

// A value that failed validation: the full key path and what is wrong with it.
struct Violation {
  std::string key;
  std::string message;
};

template <typename T>
std::optional<Violation> CheckRange(absl::string_view key, T value, T min, T max) {
  if (value < min) {
    return Violation{std::string(key), absl::StrCat("must be >= ", min, ", got ", value)};
  }
  if (value > max) {
    return Violation{std::string(key), absl::StrCat("must be <= ", max, ", got ", value)};
  }
  return std::nullopt;
}

// A duration or other real in [min, max]; NaN is outside.
std::optional<Violation> CheckSeconds(absl::string_view key, double value, double min,
                                      double max) {
  if (value >= min && value <= max) return std::nullopt;
  // %.10g: bounds up to 2147483 print whole (StrCat would print 2.14748e+06); the value prints
  // as the other checks print theirs.
  const std::string range = absl::StrFormat("must be in [%.10g, %.10g]", min, max);
  return Violation{std::string(key), absl::StrCat(range, ", got ", value)};
}

// ValidateSparseOptions says "sparse.<key> = <value>: <what is wanted>"; restated in this file's
// "<key>: <what is wanted>, got <value>" form so the parser can add the key's line.
Violation SparseViolation(absl::string_view message) {
  const size_t eq = message.find(" = ");
  const size_t colon = eq == absl::string_view::npos ? eq : message.find(": ", eq + 3);
  if (!absl::StartsWith(message, "sparse.") || colon == absl::string_view::npos) {
    return Violation{"sparse", std::string(message)};
  }
  return Violation{
      std::string(message.substr(0, eq)),
      absl::StrCat(message.substr(colon + 2), ", got ", message.substr(eq + 3, colon - eq - 3))};
}

std::optional<Violation> CheckAddress(absl::string_view key, absl::string_view value) {
  absl::Status status = ParseHostPort(value);
  if (status.ok()) return std::nullopt;
  return Violation{std::string(key), std::string(status.message())};
}

// server.http_listen: "" or an address on no other listener's port.
std::optional<Violation> CheckHttpListen(const ServerSection& s) {
  if (s.http_listen.empty()) return std::nullopt;
  if (std::optional<Violation> v = CheckAddress("server.http_listen", s.http_listen)) return v;
  std::string http_host;
  int http_port = 0;
  (void)ParseHostPort(s.http_listen, &http_host, &http_port);
  for (const auto& [key, other] :
       {std::pair<const char*, const std::string*>{"server.listen", &s.listen},
        {"server.metrics_listen", &s.metrics_listen}}) {
    std::string host;
    int port = 0;
    if (other->empty() || !ParseHostPort(*other, &host, &port).ok()) continue;
    if (http_port != 0 && http_port == port && http_host == host) {
      return Violation{"server.http_listen",
                       absl::StrCat("must differ from ", key, ", both are '", *other, "'")};
    }
  }
  return std::nullopt;
}

std::optional<Violation> CheckConnections(const ServerSection& s) {
  std::optional<Violation> v;
  // gRPC takes milliseconds as an int: at most 2147483 s (24.8 days).
  if ((v = CheckSeconds("server.connections.grpc_max_idle_seconds", s.grpc_max_idle_seconds, 0,
                        2147483))) {
    return v;
  }
  if ((v = CheckSeconds("server.connections.grpc_handshake_seconds", s.grpc_handshake_seconds,
                        0.1, 3600))) {
    return v;
  }
  if ((v = CheckRange<int64_t>("server.connections.http_idle_seconds", s.http_idle_seconds, 1,
                               3600))) {
    return v;
  }
  if ((v = CheckRange<int64_t>("server.connections.http_max_connections", s.http_max_connections,
                               1, 65536))) {
    return v;
  }
  if ((v = CheckSeconds("server.connections.http_request_read_seconds",
                        s.http_request_read_seconds, 0.1, 3600))) {
    return v;
  }
  if ((v = CheckRange<int64_t>("server.connections.http_max_connections_per_ip",
                               s.http_max_connections_per_ip, 0, 65536))) {
    return v;
  }
  if ((v = CheckSeconds("server.connections.min_ping_interval_seconds",
                        s.min_ping_interval_seconds, 0.001, 86400))) {
    return v;
  }
  return CheckRange<int64_t>("server.connections.max_ping_strikes", s.max_ping_strikes, 0, 1000);
}

std::optional<Violation> CheckTls(const ServerSection& s) {
  if (s.tls_cert_file.empty() != s.tls_key_file.empty()) {
    // Named after the key that is there, so the error points at its line.
    return Violation{s.tls_cert_file.empty() ? "server.tls.key_file" : "server.tls.cert_file",
                     "server.tls.cert_file and server.tls.key_file go together: set both or "
                     "neither"};
  }
  if (!s.tls_client_ca_file.empty() && s.tls_cert_file.empty()) {
    return Violation{"server.tls.client_ca_file",
                     "requires server.tls.cert_file and key_file (client certificates are "
                     "checked only over TLS)"};
  }
  return CheckSeconds("server.tls.reload_seconds", s.tls_reload_seconds, 1, 86400);
}

// The one list of value rules, shared by the parser (which adds file and line) and
// ValidateConfig (which runs again after flag overrides).
// kv_cache.host_capacity_tokens and its old name.
std::optional<Violation> HostCapacityViolation(const ServerConfig& c) {
  constexpr int64_t kMaxHostTokens = int64_t{1} << 30;
  const int64_t kv = c.kv_cache.host_capacity_tokens;
  if (auto v = CheckRange<int64_t>("kv_cache.host_capacity_tokens", kv, -1, kMaxHostTokens)) {
    return v;
  }
  if (const std::optional<int64_t>& old = c.sparse.host_capacity_tokens) {
    if (auto v = CheckRange<int64_t>("sparse.host_capacity_tokens", *old, 1, kMaxHostTokens)) {
      return v;
    }
    if (kv >= 0 && kv != *old) {
      return Violation{"sparse.host_capacity_tokens",
                       absl::StrCat("is the old name of kv_cache.host_capacity_tokens, which is ",
                                    kv, "; set only kv_cache.host_capacity_tokens")};
    }
  }
  if (c.sparse.options.enabled && HostCapacityTokens(c) == 0) {
    return Violation{"kv_cache.host_capacity_tokens",
                     "must be > 0 (or -1) with sparse.enabled: sparse requests keep their KV in "
                     "the host store"};
  }
  return std::nullopt;
}

std::optional<Violation> FindViolation(const ServerConfig& c) {
  std::optional<Violation> v;
  const ServerSection& s = c.server;
  if ((v = CheckAddress("server.listen", s.listen))) return v;
  if (!s.metrics_listen.empty()) {
    if ((v = CheckAddress("server.metrics_listen", s.metrics_listen))) return v;
    std::string host, metrics_host;
    int port = 0, metrics_port = 0;
    (void)ParseHostPort(s.listen, &host, &port);
    (void)ParseHostPort(s.metrics_listen, &metrics_host, &metrics_port);
    if (port != 0 && port == metrics_port && host == metrics_host) {
      return Violation{"server.metrics_listen",
                       absl::StrCat("must differ from server.listen, both are '", s.listen, "'")};
    }
  }
  if ((v = CheckRange<int64_t>("server.max_receive_message_bytes", s.max_receive_message_bytes,
                               1024, kIntMax))) {
    return v;
  }
  if ((v = CheckRange<int64_t>("server.limits.max_prompt_tokens", s.max_prompt_tokens, 0,
                               kIntMax))) {
    return v;
  }
  if ((v = CheckRange<int64_t>("server.limits.max_tokens", s.max_output_tokens, 0, kIntMax))) {
    return v;
  }
  if ((v = CheckRange<int64_t>("server.limits.max_requests_per_client",
                               s.max_requests_per_client, 0, kIntMax))) {
    return v;
  }
  if (!(s.shutdown_grace_seconds >= 0) || !std::isfinite(s.shutdown_grace_seconds)) {
    return Violation{"server.shutdown_grace_seconds",
                     absl::StrCat("must be a finite number >= 0, got ", s.shutdown_grace_seconds)};
  }
  if (absl::StatusOr<LogLevel> level = ParseLogLevel(s.log_level); !level.ok()) {
    return Violation{"server.log_level", std::string(level.status().message())};
  }
  if (s.send_priority != "idle" && s.send_priority != "normal") {
    return Violation{"server.send_priority",
                     absl::StrCat("must be one of idle, normal, got '", s.send_priority, "'")};
  }
  if ((v = CheckHttpListen(s))) return v;
  if ((v = CheckTls(s))) return v;
  if ((v = CheckConnections(s))) return v;
  if ((v = CheckSeconds("server.stall_seconds", s.stall_seconds, 0, 86400))) return v;
  if ((v = CheckRange<int64_t>("server.http_max_body_bytes", s.http_max_body_bytes, 1024,
                               kIntMax))) {
    return v;
  }
  const std::string& parser = c.model.tool_call_parser;
  if (parser != "auto" && parser != "none" && parser != "hermes" && parser != "llama3_json") {
    return Violation{
        "model.tool_call_parser",
        absl::StrCat("must be one of auto, none, hermes, llama3_json, got '", parser, "'")};
  }
  const std::string& device = c.model.device;
  if (device != "cpu" && device != "cuda" && device != "auto") {
    return Violation{"model.device",
                     absl::StrCat("must be one of cpu, cuda, auto, got '", device, "'")};
  }
  const SchedulerSection& sc = c.scheduler;
  if ((v = CheckRange<int>("scheduler.max_running_requests", sc.max_running_requests, 1,
                           kMaxRunningRequests)) ||
      (v = CheckRange<int>("scheduler.max_waiting_requests", sc.max_waiting_requests, 0,
                           kMaxWaitingRequests)) ||
      (v = CheckRange<int>("scheduler.prefill_chunk_tokens", sc.prefill_chunk_tokens, 1,
                           kMaxPrefillChunkTokens)) ||
      (v = CheckRange<int>("scheduler.solo_prefill_chunk_tokens", sc.solo_prefill_chunk_tokens,
                           0, kMaxPrefillChunkTokens)) ||
      (v = CheckRange<int>("scheduler.default_max_tokens", sc.default_max_tokens, 0,
                           kMaxDefaultMaxTokens)) ||
      (v = CheckRange<int>("scheduler.threads", sc.threads, 0, kMaxThreads)) ||
      (v = CheckRange<int>("scheduler.max_tokenizing_requests", sc.max_tokenizing_requests, 1,
                           kMaxTokenizingRequests)) ||
      (v = CheckRange<int>("scheduler.max_overtakes", sc.max_overtakes, 0, 1 << 20))) {
    return v;
  }
  const KvCacheSection& kv = c.kv_cache;
  if (kv.page_size < 1 || kv.page_size > 1024 || (kv.page_size & (kv.page_size - 1)) != 0) {
    return Violation{"kv_cache.page_size",
                     absl::StrCat("must be a power of two in [1, 1024], got ", kv.page_size)};
  }
  if (kv.capacity_tokens < kv.page_size) {
    return Violation{"kv_cache.capacity_tokens",
                     absl::StrCat("must be >= kv_cache.page_size (", kv.page_size, "), got ",
                                  kv.capacity_tokens)};
  }
  if (kv.capacity_tokens > kMaxKvCacheTokens) {
    return Violation{"kv_cache.capacity_tokens",
                     absl::StrCat("must be <= ", kMaxKvCacheTokens, ", got ", kv.capacity_tokens)};
  }
  if (absl::StatusOr<DType> t = ResolveKvDtype(kv.dtype, DType::kF32); !t.ok()) {
    return Violation{"kv_cache.dtype", std::string(t.status().message())};
  }
  // NaN fails both comparisons.
  if (!(kv.session_ttl_seconds > 0 && kv.session_ttl_seconds <= kMaxSessionTtlSeconds)) {
    return Violation{"kv_cache.session_ttl_seconds",
                     absl::StrFormat("must be in (0, %.0f], got %.15g", kMaxSessionTtlSeconds,
                                     kv.session_ttl_seconds)};
  }
  if (auto v = CheckRange<int64_t>("kv_cache.max_sessions", kv.max_sessions, 1, kMaxSessions)) {
    return v;
  }
  if (auto v = HostCapacityViolation(c)) return v;
  // Checked whether or not sparse.enabled: a bad value should not wait for the day it is switched
  // on to be noticed.
  if (absl::Status st = ValidateSparseOptions(c.sparse.options); !st.ok()) {
    return SparseViolation(st.message());
  }
  if (c.sparse.page_size.has_value() && *c.sparse.page_size != kv.page_size) {
    return Violation{"sparse.page_size",
                     absl::StrCat("must equal kv_cache.page_size (", kv.page_size,
                                  ": sparse pages are KV cache pages), got ", *c.sparse.page_size)};
  }
  return std::nullopt;
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      // Quoted scalars carry the non-specific tag "!"; show the quotes so "5" vs 5 is clear.
      return node.Tag() == "!" ? absl::StrCat("the string \"", node.Scalar(), "\"")
                               : absl::StrCat("'", node.Scalar(), "'");
    default:
      return "an undefined value";
  }
}

// Turns a YAML tree into a ServerConfig, remembering on which line each key stood.
class ConfigReader {
 public:
  explicit ConfigReader(absl::string_view source)
      : source_(source.empty() ? "<config>" : std::string(source)) {}

  absl::Status Error(int line, absl::string_view key, absl::string_view message) const {
    std::string where = line > 0 ? absl::StrCat(source_, ":", line) : source_;
    if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", message));
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", key, ": ", message));
  }

  int LineOf(const std::string& key) const {
    auto it = lines_.find(key);
    return it == lines_.end() ? 0 : it->second;
  }

  absl::Status Read(const YAML::Node& root, ServerConfig* c);

 private:
  using Handler = std::function<absl::Status(const YAML::Node& value, const std::string& path)>;
  struct Field {
    absl::string_view key;
    Handler read;
  };

  // Dispatches each key of the mapping `node` (at `path`, "" for the root) to its field.
  absl::Status ReadMapping(const YAML::Node& node, const std::string& path,
                           const std::vector<Field>& fields);

  absl::Status TypeError(const std::string& path, absl::string_view expected,
                         const YAML::Node& value) const {
    return Error(LineOf(path), path,
                 absl::StrCat("expected ", expected, ", got ", Describe(value)));
  }

  Handler String(std::string* out) {
    return [this, out](const YAML::Node& v, const std::string& path) -> absl::Status {
      // A bare `key:` is null; insisting on "" avoids guessing what the operator meant.
      if (!v.IsScalar()) return TypeError(path, "a string (write \"\" for an empty one)", v);
      *out = v.Scalar();
      return absl::OkStatus();
    };
  }

  template <typename T>
  Handler Int(T* out) {
    return [this, out](const YAML::Node& v, const std::string& path) -> absl::Status {
      int64_t x = 0;
      if (!v.IsScalar() || v.Tag() == "!" || !YAML::convert<int64_t>::decode(v, x)) {
        return TypeError(path, "an integer", v);
      }
      // Out of the field's type; the value rules proper are FindViolation's.
      if (std::optional<Violation> r = CheckRange<int64_t>(path, x, std::numeric_limits<T>::min(),
                                                           std::numeric_limits<T>::max())) {
        return Error(LineOf(path), path, r->message);
      }
      *out = static_cast<T>(x);
      return absl::OkStatus();
    };
  }

  template <typename T>
  Handler OptionalInt(std::optional<T>* out) {
    return [this, out](const YAML::Node& v, const std::string& path) -> absl::Status {
      T x{};
      if (absl::Status s = Int(&x)(v, path); !s.ok()) return s;
      *out = x;
      return absl::OkStatus();
    };
  }

  Handler Bool(bool* out) {
    return [this, out](const YAML::Node& v, const std::string& path) -> absl::Status {
      bool x = false;
      if (!v.IsScalar() || v.Tag() == "!" || !YAML::convert<bool>::decode(v, x)) {
        return TypeError(path, "true or false", v);
      }
      *out = x;
      return absl::OkStatus();
    };
  }

  // A string naming an enum value, turned into it by `parse` (whose error message is kept).
  template <typename T, typename Parse>
  Handler Enum(T* out, Parse parse) {
    return [this, out, parse](const YAML::Node& v, const std::string& path) -> absl::Status {
      if (!v.IsScalar()) return TypeError(path, "a string", v);
      absl::StatusOr<T> x = parse(v.Scalar());
      if (!x.ok()) return Error(LineOf(path), path, x.status().message());
      *out = *x;
      return absl::OkStatus();
    };
  }

  Handler Double(double* out) {
    return [this, out](const YAML::Node& v, const std::string& path) -> absl::Status {
      double x = 0;
      if (!v.IsScalar() || v.Tag() == "!" || !YAML::convert<double>::decode(v, x)) {
        return TypeError(path, "a number", v);
      }
      *out = x;
      return absl::OkStatus();
    };
  }

  Handler Section(std::vector<Field> fields) {
    return [this, fields = std::move(fields)](const YAML::Node& v,
                                              const std::string& path) -> absl::Status {
      if (v.IsNull()) return absl::OkStatus();  // a header with every key commented out
      if (!v.IsMap()) return TypeError(path, "a mapping", v);
      return ReadMapping(v, path, fields);
    };
  }

  std::string source_;
  absl::flat_hash_map<std::string, int> lines_;
};

absl::Status ConfigReader::ReadMapping(const YAML::Node& node, const std::string& path,
                                       const std::vector<Field>& fields) {
  absl::flat_hash_set<std::string> seen;
  // Copies, not references: yaml-cpp's iterators hand out temporary proxies.
  for (const auto& entry : node) {
    const YAML::Node key = entry.first;
    const YAML::Node value = entry.second;
    const int line = key.Mark().line >= 0 ? key.Mark().line + 1 : 0;
    if (!key.IsScalar()) {
      return Error(line, path, absl::StrCat("keys must be plain names, got ", Describe(key)));
    }
    const std::string full = path.empty() ? key.Scalar() : absl::StrCat(path, ".", key.Scalar());
    if (!seen.insert(key.Scalar()).second) {
      return Error(line, "", absl::StrCat("duplicate key '", full, "'"));
    }
    const Field* field = nullptr;
    for (const Field& f : fields) {
      if (f.key == key.Scalar()) field = &f;
    }
    if (field == nullptr) {
      std::vector<absl::string_view> known;
      for (const Field& f : fields) known.push_back(f.key);
      return Error(line, "",
                   absl::StrCat("unknown key '", full, "' (known keys",
                                path.empty() ? "" : absl::StrCat(" in '", path, "'"), ": ",
                                absl::StrJoin(known, ", "), ")"));
    }
    lines_[full] = line;
    if (absl::Status s = field->read(value, full); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ConfigReader::Read(const YAML::Node& root, ServerConfig* c) {
  if (root.IsNull()) return absl::OkStatus();  // empty file or only comments: all defaults
  if (!root.IsMap()) {
    const int line = root.Mark().line >= 0 ? root.Mark().line + 1 : 0;
    return Error(line, "",
                 absl::StrCat("the document must be a mapping of sections, got ", Describe(root)));
  }
  ServerSection& s = c->server;
  ModelSection& m = c->model;
  SchedulerSection& sc = c->scheduler;
  KvCacheSection& kv = c->kv_cache;
  SparseOptions& sp = c->sparse.options;
  const std::vector<Field> sections = {
      {"server", Section({{"listen", String(&s.listen)},
                          {"metrics_listen", String(&s.metrics_listen)},
                          {"http_listen", String(&s.http_listen)},
                          {"http_max_body_bytes", Int(&s.http_max_body_bytes)},
                          {"max_receive_message_bytes", Int(&s.max_receive_message_bytes)},
                          {"shutdown_grace_seconds", Double(&s.shutdown_grace_seconds)},
                          {"stall_seconds", Double(&s.stall_seconds)},
                          {"log_level", String(&s.log_level)},
                          {"send_priority", String(&s.send_priority)},
                          {"reflection", Bool(&s.reflection)},
                          {"auth", Section({{"token_file", String(&s.auth_token_file)}})},
                          {"connections",
                           Section({{"grpc_max_idle_seconds", Double(&s.grpc_max_idle_seconds)},
                                    {"grpc_handshake_seconds", Double(&s.grpc_handshake_seconds)},
                                    {"http_idle_seconds", Int(&s.http_idle_seconds)},
                                    {"http_max_connections", Int(&s.http_max_connections)},
                                    {"http_request_read_seconds",
                                     Double(&s.http_request_read_seconds)},
                                    {"http_max_connections_per_ip",
                                     Int(&s.http_max_connections_per_ip)},
                                    {"min_ping_interval_seconds",
                                     Double(&s.min_ping_interval_seconds)},
                                    {"max_ping_strikes", Int(&s.max_ping_strikes)},
                                    {"ping_without_calls", Bool(&s.ping_without_calls)}})},
                          {"tls", Section({{"cert_file", String(&s.tls_cert_file)},
                                           {"key_file", String(&s.tls_key_file)},
                                           {"client_ca_file", String(&s.tls_client_ca_file)},
                                           {"reload_seconds", Double(&s.tls_reload_seconds)}})},
                          {"limits", Section({{"max_prompt_tokens", Int(&s.max_prompt_tokens)},
                                              {"max_tokens", Int(&s.max_output_tokens)},
                                              {"max_requests_per_client",
                                               Int(&s.max_requests_per_client)}})}})},
      {"model", Section({{"path", String(&m.path)},
                         {"name", String(&m.name)},
                         {"device", String(&m.device)},
                         {"chat_template", String(&m.chat_template)},
                         {"tool_call_parser", String(&m.tool_call_parser)}})},
      {"scheduler", Section({{"max_running_requests", Int(&sc.max_running_requests)},
                             {"max_waiting_requests", Int(&sc.max_waiting_requests)},
                             {"prefill_chunk_tokens", Int(&sc.prefill_chunk_tokens)},
                             {"solo_prefill_chunk_tokens", Int(&sc.solo_prefill_chunk_tokens)},
                             {"default_max_tokens", Int(&sc.default_max_tokens)},
                             {"threads", Int(&sc.threads)},
                             {"max_tokenizing_requests", Int(&sc.max_tokenizing_requests)},
                             {"max_overtakes", Int(&sc.max_overtakes)}})},
      {"kv_cache", Section({{"page_size", Int(&kv.page_size)},
                            {"capacity_tokens", Int(&kv.capacity_tokens)},
                            {"dtype", String(&kv.dtype)},
                            {"prefix_cache", Bool(&kv.prefix_cache)},
                            {"session_ttl_seconds", Double(&kv.session_ttl_seconds)},
                            {"max_sessions", Int(&kv.max_sessions)},
                            {"host_capacity_tokens", Int(&kv.host_capacity_tokens)}})},
      {"sparse", Section({{"enabled", Bool(&sp.enabled)},
                          {"budget_tokens", Int(&sp.budget_tokens)},
                          {"sink_tokens", Int(&sp.sink_tokens)},
                          {"recent_tokens", Int(&sp.recent_tokens)},
                          {"selector", String(&sp.selector)},
                          {"speculation", Enum(&sp.speculation, ParseSpeculationMode)},
                          {"miss_policy", Enum(&sp.miss_policy, ParseMissPolicy)},
                          {"min_context_tokens", Int(&sp.min_context_tokens)},
                          {"prefetch_threads", Int(&sp.prefetch_threads)},
                          {"prefetch_extra_tokens", Int(&sp.prefetch_extra_tokens)},
                          {"host_capacity_tokens", OptionalInt(&c->sparse.host_capacity_tokens)},
                          {"page_size", OptionalInt(&c->sparse.page_size)}})},
  };
  return ReadMapping(root, "", sections);
}

}  // namespace

absl::Status ParseHostPort(absl::string_view host_port, std::string* host, int* port) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("invalid address '", host_port, "': ", why));
  };
  absl::string_view h;
  absl::string_view p;
  if (!host_port.empty() && host_port.front() == '[') {
    const size_t close = host_port.find(']');
    if (close == absl::string_view::npos) return bad("missing ']' after the IPv6 host");
    h = host_port.substr(1, close - 1);
    const absl::string_view rest = host_port.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return bad("expected ':PORT' after ']'");
    p = rest.substr(1);
    if (h.find(':') == absl::string_view::npos) {
      return bad("brackets are only for IPv6 hosts, e.g. [::1]:50051");
    }
    for (char ch : h) {
      // Hex groups, ':', an embedded IPv4 tail and a "%zone" suffix.
      if (!absl::ascii_isalnum(ch) && ch != ':' && ch != '.' && ch != '%') {
        return bad(
            absl::StrCat("invalid character '", absl::string_view(&ch, 1), "' in the IPv6 host"));
      }
    }
  } else {
    const size_t colon = host_port.rfind(':');
    if (colon == absl::string_view::npos) return bad("expected HOST:PORT, e.g. 127.0.0.1:50051");
    h = host_port.substr(0, colon);
    p = host_port.substr(colon + 1);
    if (h.empty()) return bad("empty host (use 0.0.0.0 or [::] for every interface)");
    if (h.find(':') != absl::string_view::npos) {
      return bad("IPv6 hosts must be in brackets, e.g. [::1]:50051");
    }
    for (char ch : h) {
      if (!absl::ascii_isalnum(ch) && ch != '.' && ch != '-' && ch != '_') {
        return bad(absl::StrCat("invalid character '", absl::string_view(&ch, 1), "' in the host"));
      }
    }
  }
  if (p.empty()) return bad("missing port after ':'");
  int value = 0;
  for (char ch : p) {
    if (!absl::ascii_isdigit(ch) || p.size() > 5) return bad("port must be a number in [0, 65535]");
    value = value * 10 + (ch - '0');
  }
  if (value > 65535) return bad("port must be a number in [0, 65535]");
  if (host != nullptr) *host = std::string(h);
  if (port != nullptr) *port = value;
  return absl::OkStatus();
}

int64_t HostCapacityTokens(const ServerConfig& c) {
  if (c.kv_cache.host_capacity_tokens >= 0) return c.kv_cache.host_capacity_tokens;
  // The old key sized the store of the sparse cache only: a config that set it with the cache
  // off (as the reference file did) does not get pinned memory it never asked for.
  if (!c.sparse.options.enabled) return -1;
  return c.sparse.host_capacity_tokens.value_or(-1);
}

absl::Status ValidateConfig(const ServerConfig& config) {
  std::optional<Violation> v = FindViolation(config);
  if (!v) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(v->key, ": ", v->message));
}

namespace {

// Counts documents, keeping where each one's content starts.
class DocumentCounter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    starts.push_back(mark);
    content_seen_ = false;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { Node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    Node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Node(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Node(mark);
  }
  void OnMapEnd() override {}
  // Per document: its first node's position, else where the document started.
  std::vector<YAML::Mark> starts;

 private:
  void Node(const YAML::Mark& mark) {
    if (starts.empty() || content_seen_) return;
    starts.back() = mark;
    content_seen_ = true;
  }
  bool content_seen_ = false;
};

// The 1-based line of a second document, if the text has one. At most two documents are read:
// yaml-cpp 0.7's LoadAll loops forever on some malformed text (a lone ","), producing empty
// documents without consuming input, which the config fuzzer found (a config file holding just
// "," hung the daemon at startup). Such text reads here as several documents, an error.
std::optional<int> SecondDocumentLine(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentCounter counter;
  int documents = 0;
  while (documents < 2 && parser.HandleNextDocument(counter)) ++documents;
  if (documents < 2) return std::nullopt;
  if (counter.starts.size() < 2 || counter.starts[1].line < 0) return 0;
  return counter.starts[1].line + 1;
}

}  // namespace

absl::StatusOr<ServerConfig> ParseConfigYaml(absl::string_view yaml_text,
                                             absl::string_view source_name) {
  ConfigReader reader(source_name);
  ServerConfig config;
  try {
    const std::string text(yaml_text);
    if (std::optional<int> second = SecondDocumentLine(text)) {
      return reader.Error(*second, "", "expected one YAML document, found several");
    }
    const YAML::Node doc = YAML::Load(text);
    if (doc.IsDefined() && !doc.IsNull()) {
      if (absl::Status s = reader.Read(doc, &config); !s.ok()) return s;
    }
  } catch (const YAML::Exception& e) {
    // e.mark is 0-based; e.msg is the message without yaml-cpp's own position prefix.
    const int line = e.mark.line >= 0 ? e.mark.line + 1 : 0;
    return reader.Error(line, "", absl::StrCat("invalid YAML: ", e.msg));
  } catch (const std::exception& e) {
    return reader.Error(0, "", absl::StrCat("invalid YAML: ", e.what()));
  }
  if (std::optional<Violation> v = FindViolation(config)) {
    return reader.Error(reader.LineOf(v->key), v->key, v->message);
  }
  return config;
}

absl::StatusOr<ServerConfig> LoadConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text,
                   ReadBoundedFile(path, kMaxConfigFileBytes, "config file"));
  return ParseConfigYaml(text, path);
}

}  // namespace specula
