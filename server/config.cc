#include "server/config.h"

#include <algorithm>
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
#include "server/config_table.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace specula {
namespace {

// A config file is a page of YAML; anything bigger is a mistake (or /dev/zero).
constexpr int64_t kMaxConfigFileBytes = 1 << 20;

// A value that failed validation: the full key path and what is wrong with it.
struct Violation {
  std::string key;
  std::string message;
};

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

// `key` (an address) on the same port and host as another listener's.
std::optional<Violation> SharedPort(absl::string_view key, const std::string& address,
                                    absl::string_view other_key, const std::string& other) {
  std::string host, other_host;
  int port = 0, other_port = 0;
  if (address.empty() || other.empty() || !ParseHostPort(address, &host, &port).ok() ||
      !ParseHostPort(other, &other_host, &other_port).ok()) {
    return std::nullopt;
  }
  if (port == 0 || port != other_port || host != other_host) return std::nullopt;
  return Violation{std::string(key),
                   absl::StrCat("must differ from ", other_key, ", both are '", other, "'")};
}

std::optional<Violation> ListenerViolation(const ServerSection& s) {
  if (auto v = SharedPort("server.metrics_listen", s.metrics_listen, "server.listen", s.listen)) {
    return v;
  }
  if (auto v = SharedPort("server.http_listen", s.http_listen, "server.listen", s.listen)) {
    return v;
  }
  return SharedPort("server.http_listen", s.http_listen, "server.metrics_listen", s.metrics_listen);
}

std::optional<Violation> TlsViolation(const ServerSection& s) {
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
  return std::nullopt;
}

// kv_cache.host_capacity_tokens and its old name.
std::optional<Violation> HostCapacityViolation(const ServerConfig& c) {
  const int64_t kv = c.kv_cache.host_capacity_tokens;
  if (const std::optional<int64_t>& old = c.sparse.host_capacity_tokens) {
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

// The rules that relate several keys; each key's own rule is its table row's.
std::optional<Violation> CrossKeyViolation(const ServerConfig& c) {
  if (auto v = ListenerViolation(c.server)) return v;
  if (auto v = TlsViolation(c.server)) return v;
  const KvCacheSection& kv = c.kv_cache;
  if (kv.capacity_tokens < kv.page_size) {
    return Violation{"kv_cache.capacity_tokens",
                     absl::StrCat("must be >= kv_cache.page_size (", kv.page_size, "), got ",
                                  kv.capacity_tokens)};
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

// Every key's rule in table order, then the cross-key rules: the one list of value rules, shared
// by the parser (which adds file and line) and ValidateConfig (which runs again after flag
// overrides).
std::optional<Violation> FindViolation(const ServerConfig& config) {
  ServerConfig copy = config;  // the table's fields are reached through a mutable config
  for (const ConfigKey& key : ConfigKeys()) {
    if (std::optional<std::string> why = RuleViolation(key, copy)) {
      return Violation{key.path, *std::move(why)};
    }
  }
  return CrossKeyViolation(config);
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

// Turns a YAML tree into a ServerConfig by the key table, remembering on which line each key
// stood.
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

  // One key's value into its field.
  absl::Status ReadValue(const YAML::Node& value, const std::string& path, ConfigField field);

 private:
  // The keys and sections directly under `path` ("" for the root), in table order; a section's
  // entry has no row.
  struct Child {
    std::string name;
    const ConfigKey* row;
  };
  static std::vector<Child> ChildrenOf(const std::string& path);

  // Reads the mapping `node` at `path` ("" for the root).
  absl::Status ReadMapping(const YAML::Node& node, const std::string& path, ServerConfig* c);

  absl::Status TypeError(const std::string& path, absl::string_view expected,
                         const YAML::Node& value) const {
    return Error(LineOf(path), path,
                 absl::StrCat("expected ", expected, ", got ", Describe(value)));
  }

  // A plain (unquoted) scalar decoded as T, or the type error.
  template <typename T>
  absl::StatusOr<T> Plain(const YAML::Node& v, const std::string& path,
                          absl::string_view expected) const {
    T x{};
    if (!v.IsScalar() || v.Tag() == "!" || !YAML::convert<T>::decode(v, x)) {
      return TypeError(path, expected, v);
    }
    return x;
  }

  // An integer that fits in T (the value rules proper are the table's).
  template <typename T>
  absl::StatusOr<T> Integer(const YAML::Node& v, const std::string& path) const {
    ASSIGN_OR_RETURN(const int64_t x, Plain<int64_t>(v, path, "an integer"));
    if (x < std::numeric_limits<T>::min()) {
      return Error(LineOf(path), path,
                   absl::StrCat("must be >= ", std::numeric_limits<T>::min(), ", got ", x));
    }
    if (x > std::numeric_limits<T>::max()) {
      return Error(LineOf(path), path,
                   absl::StrCat("must be <= ", std::numeric_limits<T>::max(), ", got ", x));
    }
    return static_cast<T>(x);
  }

  std::string source_;
  absl::flat_hash_map<std::string, int> lines_;
};

std::vector<ConfigReader::Child> ConfigReader::ChildrenOf(const std::string& path) {
  const std::string prefix = path.empty() ? "" : absl::StrCat(path, ".");
  std::vector<Child> children;
  for (const ConfigKey& key : ConfigKeys()) {
    if (!absl::StartsWith(key.path, prefix)) continue;
    const std::string rest = key.path.substr(prefix.size());
    const size_t dot = rest.find('.');
    const std::string name = rest.substr(0, dot);
    const bool known = std::any_of(children.begin(), children.end(),
                                   [&](const Child& ch) { return ch.name == name; });
    if (!known) children.push_back(Child{name, dot == std::string::npos ? &key : nullptr});
  }
  return children;
}

absl::Status ConfigReader::ReadValue(const YAML::Node& v, const std::string& path,
                                     ConfigField field) {
  if (auto* p = std::get_if<std::string*>(&field)) {
    // A bare `key:` is null; insisting on "" avoids guessing what the operator meant.
    if (!v.IsScalar()) return TypeError(path, "a string (write \"\" for an empty one)", v);
    **p = v.Scalar();
  } else if (auto* p = std::get_if<bool*>(&field)) {
    ASSIGN_OR_RETURN(**p, Plain<bool>(v, path, "true or false"));
  } else if (auto* p = std::get_if<double*>(&field)) {
    ASSIGN_OR_RETURN(**p, Plain<double>(v, path, "a number"));
  } else if (auto* p = std::get_if<int*>(&field)) {
    ASSIGN_OR_RETURN(**p, Integer<int>(v, path));
  } else if (auto* p = std::get_if<int64_t*>(&field)) {
    ASSIGN_OR_RETURN(**p, Integer<int64_t>(v, path));
  } else if (auto* p = std::get_if<std::optional<int>*>(&field)) {
    ASSIGN_OR_RETURN(**p, Integer<int>(v, path));
  } else if (auto* p = std::get_if<std::optional<int64_t>*>(&field)) {
    ASSIGN_OR_RETURN(**p, Integer<int64_t>(v, path));
  } else if (auto* p = std::get_if<NamedField>(&field)) {
    if (!v.IsScalar()) return TypeError(path, "a string", v);
    if (absl::Status s = p->parse(v.Scalar()); !s.ok()) {
      return Error(LineOf(path), path, s.message());
    }
  }
  return absl::OkStatus();
}

absl::Status ConfigReader::ReadMapping(const YAML::Node& node, const std::string& path,
                                       ServerConfig* c) {
  const std::vector<Child> children = ChildrenOf(path);
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
    auto child = std::find_if(children.begin(), children.end(),
                              [&](const Child& ch) { return ch.name == key.Scalar(); });
    if (child == children.end()) {
      std::vector<absl::string_view> known;
      for (const Child& ch : children) known.push_back(ch.name);
      return Error(line, "",
                   absl::StrCat("unknown key '", full, "' (known keys",
                                path.empty() ? "" : absl::StrCat(" in '", path, "'"), ": ",
                                absl::StrJoin(known, ", "), ")"));
    }
    lines_[full] = line;
    if (child->row != nullptr) {
      RETURN_IF_ERROR(ReadValue(value, full, child->row->field(*c)));
    } else if (!value.IsNull()) {  // null: a header with every key commented out
      if (!value.IsMap()) return TypeError(full, "a mapping", value);
      RETURN_IF_ERROR(ReadMapping(value, full, c));
    }
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
  return ReadMapping(root, "", c);
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

absl::Status SetConfigValue(ServerConfig* config, absl::string_view path, absl::string_view text,
                            absl::string_view source) {
  ConfigReader reader(source);
  const ConfigKey* key = FindConfigKey(path);
  if (key == nullptr) return reader.Error(0, "", absl::StrCat("unknown key '", path, "'"));
  return reader.ReadValue(YAML::Node(std::string(text)), std::string(path), key->field(*config));
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
