#include "engine/chat/template/py_json.h"

#include <algorithm>
#include <cstdio>

#include "engine/chat/template/error.h"
#include "engine/chat/template/operators.h"
#include "engine/chat/template/py_str.h"
#include "engine/tokenizer/utf8.h"

namespace specula::jinja::py {
namespace {

class JsonWriter {
 public:
  explicit JsonWriter(const JsonDumpsOptions& options) : options_(options) {}

  std::string Take() { return std::move(out_); }

  void Write(const Value& v, int level) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        out_ += "null";
        return;
      case Value::Kind::kBool:
        out_ += v.bool_value() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        out_ += std::to_string(v.int_value());
        return;
      case Value::Kind::kFloat:
        out_ += FloatText(v.float_value());
        return;
      case Value::Kind::kString:
        WriteString(v.str());
        return;
      case Value::Kind::kList:
        return WriteList(v.items(), level);
      case Value::Kind::kDict:
        return WriteDict(v.dict(), level);
      default:
        ThrowRuntime("Object of type " + v.TypeName() + " is not JSON serializable");
    }
  }

 private:
  static std::string FloatText(double d) {
    if (d != d) return "NaN";
    if (d > 1.7976931348623157e308) return "Infinity";
    if (d < -1.7976931348623157e308) return "-Infinity";
    return FloatRepr(d);
  }

  void Newline(int level) {
    if (!options_.indent) return;
    out_ += '\n';
    for (int i = 0; i < level; ++i) out_ += *options_.indent;
  }

  void WriteList(const std::vector<Value>& items, int level) {
    if (items.empty()) {
      out_ += "[]";
      return;
    }
    out_ += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out_ += options_.item_separator;
      Newline(level + 1);
      Write(items[i], level + 1);
    }
    Newline(level);
    out_ += ']';
  }

  void WriteDict(const DictData& dict, int level) {
    if (dict.items.empty()) {
      out_ += "{}";
      return;
    }
    std::vector<const std::pair<Value, Value>*> items;
    for (const auto& kv : dict.items) items.push_back(&kv);
    if (options_.sort_keys) {
      std::stable_sort(items.begin(), items.end(),
                       [](const auto* a, const auto* b) { return Order(a->first, b->first) < 0; });
    }
    out_ += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out_ += options_.item_separator;
      Newline(level + 1);
      WriteString(KeyText(items[i]->first));
      out_ += options_.key_separator;
      Write(items[i]->second, level + 1);
    }
    Newline(level);
    out_ += '}';
  }

  static std::string KeyText(const Value& key) {
    switch (key.kind()) {
      case Value::Kind::kString:
        return key.str();
      case Value::Kind::kFloat:
        return FloatText(key.float_value());
      case Value::Kind::kBool:
        return key.bool_value() ? "true" : "false";
      case Value::Kind::kNone:
        return "null";
      case Value::Kind::kInt:
        return std::to_string(key.int_value());
      default:
        ThrowRuntime("keys must be str, int, float, bool or None, not " + key.TypeName());
    }
  }

  void WriteString(std::string_view s) {
    out_ += '"';
    for (size_t i = 0; i < s.size();) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c >= 0x80 && options_.ensure_ascii) {
        size_t len = 1;
        AppendEscaped(tokenizer_internal::DecodeCodepoint(s.substr(i), &len));
        i += len;
        continue;
      }
      ++i;
      switch (c) {
        case '"':
          out_ += "\\\"";
          break;
        case '\\':
          out_ += "\\\\";
          break;
        case '\n':
          out_ += "\\n";
          break;
        case '\r':
          out_ += "\\r";
          break;
        case '\t':
          out_ += "\\t";
          break;
        case '\b':
          out_ += "\\b";
          break;
        case '\f':
          out_ += "\\f";
          break;
        default:
          if (c < 0x20 || (c == 0x7F && options_.ensure_ascii)) {
            AppendEscaped(c);
          } else {
            out_ += static_cast<char>(c);
          }
      }
    }
    out_ += '"';
  }

  void AppendEscaped(uint32_t cp) {
    char buf[16];
    if (cp >= 0x10000) {
      cp -= 0x10000;
      std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
      std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
    }
    out_ += buf;
  }

  const JsonDumpsOptions& options_;
  std::string out_;
};

}  // namespace

std::string JsonDumps(const Value& value, const JsonDumpsOptions& options) {
  JsonWriter writer(options);
  writer.Write(value, 0);
  return writer.Take();
}

}  // namespace specula::jinja::py
