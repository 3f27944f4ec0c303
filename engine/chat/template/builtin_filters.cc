// Jinja2's built-in filters (filters.py), with transformers' `tojson`.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "engine/chat/template/builtins.h"
#include "engine/chat/template/error.h"
#include "engine/chat/template/evaluator.h"
#include "engine/chat/template/operators.h"
#include "engine/chat/template/py_json.h"
#include "engine/chat/template/py_str.h"
#include "engine/chat/template/str_cat.h"

namespace specula::jinja {
namespace {

// ---- helpers

// What `str(x)` gives, the conversion Jinja's string filters apply.
std::string SoftStr(const Value& v) { return v.ToString(); }

std::vector<std::string> SplitOn(const std::string& s, char sep) {
  return py::Split(s, std::string(1, sep), -1);
}

Value IgnoreCase(const Value& v) { return v.is_string() ? Value::Str(py::Lower(v.str())) : v; }

// Jinja's make_attrgetter: "a.b.0" looks up a, then b, then item 0, item-first like `x[...]`.
Value LookupPath(Evaluator& ev, Value item, const Value& attribute, const Value* fallback) {
  std::vector<Value> parts;
  if (attribute.is_string()) {
    for (const std::string& part : SplitOn(attribute.str(), '.')) {
      const bool digits = !part.empty() && part.find_first_not_of("0123456789") == part.npos;
      parts.push_back(digits ? Value::Int(std::stoll(part)) : Value::Str(part));
    }
  } else if (!attribute.is_none()) {
    parts.push_back(attribute);
  }
  for (const Value& part : parts) {
    item = ev.GetItem(item, part);
    if (fallback != nullptr && item.is_undefined()) item = *fallback;
  }
  return item;
}

// Sort keys of make_multi_attrgetter: one value per comma-separated attribute.
Value SortKey(Evaluator& ev, const Value& item, const Value& attribute, bool ignore_case) {
  std::vector<Value> key;
  if (attribute.is_string()) {
    for (const std::string& a : SplitOn(attribute.str(), ',')) {
      Value v = LookupPath(ev, item, Value::Str(a), nullptr);
      key.push_back(ignore_case ? IgnoreCase(v) : v);
    }
  } else {
    Value v = LookupPath(ev, item, attribute, nullptr);
    key.push_back(ignore_case ? IgnoreCase(v) : v);
  }
  return Value::List(std::move(key));
}

// Python's sorted(items, key=..., reverse=...): stable either way.
void SortByKeys(std::vector<Value>& items, std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? Order(keys[b], keys[a]) < 0 : Order(keys[a], keys[b]) < 0;
  });
  std::vector<Value> sorted;
  for (size_t i : order) sorted.push_back(std::move(items[i]));
  items = std::move(sorted);
}

// Python's float(str): surrounding whitespace, underscores between digits, inf and nan.
std::optional<double> ParsePyFloat(std::string_view text) {
  const std::string s = py::Strip(text, std::nullopt, true, true);
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '_') {
      clean += s[i];
    } else if (i == 0 || i + 1 == s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
               !std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      return std::nullopt;
    }
  }
  const std::string lower = py::Lower(clean);
  const std::string_view body =
      std::string_view(lower).substr(!lower.empty() && (lower[0] == '+' || lower[0] == '-'));
  if (body == "inf" || body == "infinity" || body == "nan") {
    const double v = body == "nan" ? NAN : INFINITY;
    return lower[0] == '-' ? -v : v;
  }
  if (body.empty() || body.find_first_not_of("0123456789.e+-") != body.npos) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return v;
}

// Python's int(str, base) for bases 2..36 (and 0: from the prefix).
std::optional<int64_t> ParsePyInt(std::string_view text, int64_t base) {
  std::string s = py::Strip(text, std::nullopt, true, true);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.erase(0, 1);
  }
  const std::string lower = py::Lower(s);
  const int prefixed = lower.starts_with("0x")   ? 16
                       : lower.starts_with("0o") ? 8
                       : lower.starts_with("0b") ? 2
                                                 : 0;
  if (prefixed != 0 && (base == 0 || base == prefixed)) {
    base = prefixed;
    s.erase(0, 2);
    if (!s.empty() && s[0] == '_') s.erase(0, 1);
  }
  if (base == 0) base = 10;
  if (base < 2 || base > 36 || s.empty() || s[0] == '_' || s.back() == '_' ||
      s.find("__") != s.npos) {
    return std::nullopt;
  }
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, static_cast<int>(base));
  if (end != s.c_str() + s.size() || errno == ERANGE || s[0] == '+' || s[0] == '-') {
    return std::nullopt;
  }
  return negative ? -v : v;
}

// ---- filters (alphabetical)

Value Abs(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder("abs", args, {});
  if (in.is_undefined()) in.ThrowUndefined();
  if (in.is_float()) return Value::Float(std::fabs(in.float_value()));
  if (!in.is_integral()) ThrowRuntime("bad operand type for abs(): '" + in.TypeName() + "'");
  return Negate(in, in.AsInt() < 0);
}

Value Attr(Evaluator& ev, const Value& in, CallArgs& args) {
  ArgBinder a("attr", args, {"name"}, 1);
  const std::string name = a.Get(0).ToString();
  if (in.is_object()) return ev.GetAttr(in, name);
  if (std::optional<Value> method = LookupMethod(in, name)) return *method;
  return Value::Undefined("'" + in.TypeName() + " object' has no attribute '" + name + "'");
}

Value Batch(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder a("batch", args, {"linecount", "fill_with"}, 1);
  const int64_t count = a.Int(0, 1);
  if (count <= 0) ThrowRuntime("batch(): linecount must be positive");
  std::vector<Value> batches, current;
  for (Value& item : IterateValue(in)) {
    if (static_cast<int64_t>(current.size()) == count) {
      batches.push_back(Value::List(std::move(current)));
      current.clear();
    }
    current.push_back(std::move(item));
  }
  if (!current.empty()) {
    if (const Value* fill = a.GetOrNull(1)) {
      while (static_cast<int64_t>(current.size()) < count) current.push_back(*fill);
    }
    batches.push_back(Value::List(std::move(current)));
  }
  return Value::List(std::move(batches));
}

Value Capitalize(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder("capitalize", args, {});
  return Value::Str(py::Capitalize(SoftStr(in)));
}

Value Center(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder a("center", args, {"width"});
  return Value::Str(py::Pad(SoftStr(in), a.Int(0, 80), ' ', 0));
}

Value Default(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder a("default", args, {"default_value", "boolean"});
  if (in.is_undefined() || (a.Bool(1, false) && !in.Truthy())) return a.Or(0, Value::Str(""));
  return in;
}

Value DictSort(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder a("dictsort", args, {"case_sensitive", "by", "reverse"});
  if (!in.is_dict()) ThrowRuntime("dictsort(): expected a mapping, got " + in.TypeName());
  const std::string by = a.Str(1, "key");
  if (by != "key" && by != "value") {
    ThrowRuntime("You can only sort by either \"key\" or \"value\"");
  }
  std::vector<Value> items, keys;
  for (const auto& [k, v] : in.dict().items) {
    items.push_back(Value::Tuple({k, v}));
    const Value& key = by == "key" ? k : v;
    keys.push_back(a.Bool(0, false) ? key : IgnoreCase(key));
  }
  SortByKeys(items, keys, a.Bool(2, false));
  return Value::List(std::move(items));
}

Value First(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder("first", args, {});
  if (in.is_list()) {
    return in.items().empty() ? Value::Undefined("No first item, sequence was empty.")
                              : in.items().front();
  }
  std::vector<Value> items = IterateValue(in);
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

Value Float(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder a("float", args, {"default"});
  if (in.is_undefined()) in.ThrowUndefined();
  if (in.is_number()) return Value::Float(in.AsDouble());
  if (in.is_string()) {
    if (std::optional<double> v = ParsePyFloat(in.str())) return Value::Float(*v);
  }
  return a.Or(0, Value::Float(0.0));
}

Value Indent(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder a("indent", args, {"width", "first", "blank"});
  const std::string indention = a.Has(0) && a.Get(0).is_string()
                                    ? a.Get(0).str()
                                    : std::string(std::max<int64_t>(0, a.Int(0, 4)), ' ');
  std::vector<std::string> lines = py::SplitLines(SoftStr(in) + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    if (i > 0 && (a.Bool(2, false) || !lines[i].empty())) out += indention;
    out += lines[i];
  }
  return Value::Str(a.Bool(1, false) ? indention + out : out);
}

Value Int(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder a("int", args, {"default", "base"});
  if (in.is_undefined()) in.ThrowUndefined();
  if (in.is_integral()) return Value::Int(in.AsInt());
  if (in.is_float() && std::isfinite(in.float_value()) && std::fabs(in.float_value()) < 9.2e18) {
    return Value::Int(static_cast<int64_t>(std::trunc(in.float_value())));
  }
  if (in.is_string()) {
    if (std::optional<int64_t> v = ParsePyInt(in.str(), a.Int(1, 10))) return Value::Int(*v);
    std::optional<double> f = ParsePyFloat(in.str());
    if (f && std::isfinite(*f) && std::fabs(*f) < 9.2e18) {
      return Value::Int(static_cast<int64_t>(std::trunc(*f)));
    }
  }
  return a.Or(0, Value::Int(0));
}

Value Items(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder("items", args, {});
  if (in.is_undefined()) return Value::List({});
  if (!in.is_dict()) ThrowRuntime("Can only get item pairs from a mapping.");
  std::vector<Value> items;
  for (const auto& [k, v] : in.dict().items) items.push_back(Value::Tuple({k, v}));
  return Value::List(std::move(items));
}

Value Join(Evaluator& ev, const Value& in, CallArgs& args) {
  ArgBinder a("join", args, {"d", "attribute"});
  const std::string sep = a.Str(0, "");
  std::string out;
  bool first = true;
  for (const Value& item : IterateValue(in)) {
    if (!first) out += sep;
    first = false;
    out += (a.GetOrNull(1) ? LookupPath(ev, item, a.Get(1), nullptr) : item).ToString();
    if (out.size() > ev.max_size()) ThrowRuntime("join(): result larger than the limit");
  }
  return Value::Str(std::move(out));
}

Value Last(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder("last", args, {});
  std::vector<Value> items = IterateValue(in);
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

Value Length(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder("length", args, {});
  return Value::Int(LengthOf(in));
}

Value List(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder("list", args, {});
  return Value::List(IterateValue(in));
}

Value Lower(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder("lower", args, {});
  return Value::Str(py::Lower(SoftStr(in)));
}

Value Map(Evaluator& ev, const Value& in, CallArgs& args) {
  std::vector<Value> out;
  if (!in.Truthy()) return Value::List({});
  if (args.positional.empty()) {
    ArgBinder a("map", args, {"attribute", "default"}, 1);
    const Value* fallback = a.GetOrNull(1);
    for (const Value& item : IterateValue(in))
      out.push_back(LookupPath(ev, item, a.Get(0), fallback));
    return Value::List(std::move(out));
  }
  const std::string name = args.positional[0].ToString();
  CallArgs rest{{args.positional.begin() + 1, args.positional.end()}, args.keyword};
  for (const Value& item : IterateValue(in)) {
    CallArgs call = rest;
    out.push_back(ev.CallFilter(name, item, call));
  }
  return Value::List(std::move(out));
}

Value MinOrMax(Evaluator& ev, const Value& in, CallArgs& args, bool max) {
  ArgBinder a(max ? "max" : "min", args, {"case_sensitive", "attribute"});
  const std::vector<Value> items = IterateValue(in);
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  const bool ignore_case = !a.Bool(0, false);
  auto key = [&](const Value& item) {
    Value k = a.GetOrNull(1) ? LookupPath(ev, item, a.Get(1), nullptr) : item;
    return ignore_case ? IgnoreCase(k) : k;
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (max ? Order(k, best_key) > 0 : Order(k, best_key) < 0) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

Value Max(Evaluator& ev, const Value& in, CallArgs& args) { return MinOrMax(ev, in, args, true); }
Value Min(Evaluator& ev, const Value& in, CallArgs& args) { return MinOrMax(ev, in, args, false); }

// select, reject, selectattr, rejectattr.
Value SelectOrReject(Evaluator& ev, const Value& in, CallArgs& args, bool select, bool attr) {
  if (!in.Truthy()) return Value::List({});
  const size_t off = attr ? 1 : 0;
  if (attr && args.positional.empty()) ThrowRuntime("Missing parameter for attribute name");
  const bool has_test = args.positional.size() > off;
  const std::string test = has_test ? args.positional[off].ToString() : "";
  CallArgs rest;
  if (has_test) rest.positional.assign(args.positional.begin() + off + 1, args.positional.end());
  rest.keyword = args.keyword;
  std::vector<Value> out;
  for (const Value& item : IterateValue(in)) {
    const Value subject = attr ? LookupPath(ev, item, args.positional[0], nullptr) : item;
    CallArgs call = rest;
    const bool passed = has_test ? ev.CallTest(test, subject, call) : subject.Truthy();
    if (passed == select) out.push_back(item);
  }
  return Value::List(std::move(out));
}

Value Reject(Evaluator& ev, const Value& in, CallArgs& args) {
  return SelectOrReject(ev, in, args, false, false);
}
Value RejectAttr(Evaluator& ev, const Value& in, CallArgs& args) {
  return SelectOrReject(ev, in, args, false, true);
}
Value Select(Evaluator& ev, const Value& in, CallArgs& args) {
  return SelectOrReject(ev, in, args, true, false);
}
Value SelectAttr(Evaluator& ev, const Value& in, CallArgs& args) {
  return SelectOrReject(ev, in, args, true, true);
}

Value Replace(Evaluator& ev, const Value& in, CallArgs& args) {
  ArgBinder a("replace", args, {"old", "new", "count"}, 2);
  const int64_t count = a.GetOrNull(2) ? a.Int(2, -1) : -1;
  std::string out = py::Replace(SoftStr(in), a.Str(0, ""), a.Str(1, ""), count);
  if (out.size() > ev.max_size()) ThrowRuntime("replace(): result larger than the limit");
  return Value::Str(std::move(out));
}

Value Reverse(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder("reverse", args, {});
  if (in.is_string()) {
    std::u32string cps = py::Decode(in.str());
    std::reverse(cps.begin(), cps.end());
    return Value::Str(py::Encode(cps));
  }
  std::vector<Value> items = IterateValue(in);
  std::reverse(items.begin(), items.end());
  return Value::List(std::move(items));
}

double RoundHalfEven(double x, int64_t digits) {
  if (!std::isfinite(x)) return x;
  if (digits <= 0) {
    const double scale = std::pow(10.0, static_cast<double>(-digits));
    return std::nearbyint(x / scale) * scale;
  }
  if (digits > 300) return x;
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(digits), x);
  return std::strtod(buf, nullptr);
}

Value Round(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder a("round", args, {"precision", "method"});
  const std::string method = a.Str(1, "common");
  if (method != "common" && method != "ceil" && method != "floor") {
    ThrowRuntime("method must be common, ceil or floor");
  }
  if (!in.is_number()) ThrowRuntime("type " + in.TypeName() + " doesn't define __round__ method");
  const int64_t precision = a.Int(0, 0);
  if (method == "common") {
    if (in.is_integral() && precision >= 0) return Value::Int(in.AsInt());
    return Value::Float(RoundHalfEven(in.AsDouble(), precision));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double scaled = in.AsDouble() * scale;
  return Value::Float((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
}

Value Safe(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder("safe", args, {});
  return in;
}

Value Sort(Evaluator& ev, const Value& in, CallArgs& args) {
  ArgBinder a("sort", args, {"reverse", "case_sensitive", "attribute"});
  std::vector<Value> items = IterateValue(in);
  std::vector<Value> keys;
  const Value attribute = a.Or(2, Value::None());
  for (const Value& item : items) keys.push_back(SortKey(ev, item, attribute, !a.Bool(1, false)));
  SortByKeys(items, keys, a.Bool(0, false));
  return Value::List(std::move(items));
}

Value String(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder("string", args, {});
  return Value::Str(SoftStr(in));
}

Value Sum(Evaluator& ev, const Value& in, CallArgs& args) {
  ArgBinder a("sum", args, {"attribute", "start"});
  Value total = a.Or(1, Value::Int(0));
  for (const Value& item : IterateValue(in)) {
    const Value v = a.GetOrNull(0) ? LookupPath(ev, item, a.Get(0), nullptr) : item;
    total = Binary(BinaryOp::kAdd, total, v, ev.max_size());
  }
  return total;
}

Value Title(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder("title", args, {});
  return Value::Str(py::JinjaTitle(SoftStr(in)));
}

// transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value ToJson(Evaluator& ev, const Value& in, CallArgs& args) {
  ArgBinder a("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  py::JsonDumpsOptions options;
  options.ensure_ascii = a.Bool(0, false);
  options.sort_keys = a.Bool(3, false);
  if (const Value* indent = a.GetOrNull(1)) {
    options.indent =
        indent->is_string() ? indent->str() : std::string(std::max<int64_t>(0, a.Int(1, 0)), ' ');
    options.item_separator = ",";
  }
  if (const Value* seps = a.GetOrNull(2)) {
    if (!seps->is_list() || seps->items().size() != 2) {
      ThrowRuntime("tojson(): separators must be an (item_separator, key_separator) pair");
    }
    options.item_separator = seps->items()[0].ToString();
    options.key_separator = seps->items()[1].ToString();
  }
  std::string out = py::JsonDumps(in, options);
  if (out.size() > ev.max_size()) ThrowRuntime("tojson(): result larger than the limit");
  return Value::Str(std::move(out));
}

Value Trim(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder a("trim", args, {"chars"});
  return Value::Str(py::Strip(SoftStr(in), a.OptStr(0), true, true));
}

Value Truncate(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder a("truncate", args, {"length", "killwords", "end", "leeway"});
  const int64_t length = a.Int(0, 255), leeway = a.GetOrNull(3) ? a.Int(3, 5) : 5;
  if (!in.is_string() && LengthOf(in) <= length + leeway) return in;  // as Python's len(s)
  const std::string s = SoftStr(in);
  if (a.Has(2) && !a.Get(2).is_string()) {
    ThrowRuntime("object of type '" + a.Get(2).TypeName() + "' has no len()");
  }
  const std::string end = a.Str(2, "...");
  const int64_t end_len = py::Length(end);
  if (length < end_len) ThrowRuntime(Cat("expected length >= ", end_len, ", got ", length));
  if (leeway < 0) ThrowRuntime(Cat("expected leeway >= 0, got ", leeway));
  const std::u32string cps = py::Decode(s);
  if (static_cast<int64_t>(cps.size()) <= length + leeway) return Value::Str(s);
  std::string head = py::Encode(std::u32string_view(cps).substr(0, length - end_len));
  if (a.Bool(1, false)) return Value::Str(head + end);
  return Value::Str(py::RSplit(head, std::string(" "), 1).front() + end);
}

Value Unique(Evaluator& ev, const Value& in, CallArgs& args) {
  ArgBinder a("unique", args, {"case_sensitive", "attribute"});
  std::vector<Value> out, seen;
  for (const Value& item : IterateValue(in)) {
    Value key = a.GetOrNull(1) ? LookupPath(ev, item, a.Get(1), nullptr) : item;
    if (!a.Bool(0, false)) key = IgnoreCase(key);
    if (key.is_dict() || (key.is_list() && !key.is_tuple())) {
      ThrowRuntime("unhashable type: '" + key.TypeName() + "'");
    }
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, key); })) {
      seen.push_back(std::move(key));
      out.push_back(item);
    }
  }
  return Value::List(std::move(out));
}

Value Upper(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder("upper", args, {});
  return Value::Str(py::Upper(SoftStr(in)));
}

Value WordCount(Evaluator&, const Value& in, CallArgs& args) {
  ArgBinder("wordcount", args, {});
  int64_t words = 0;
  bool in_word = false;
  for (char32_t cp : py::Decode(SoftStr(in))) {
    const bool word = py::IsWordChar(cp);
    words += word && !in_word;
    in_word = word;
  }
  return Value::Int(words);
}

constexpr FilterDef kFilters[] = {
    {"abs", Abs},           {"attr", Attr},
    {"batch", Batch},       {"capitalize", Capitalize},
    {"center", Center},     {"count", Length},
    {"d", Default},         {"default", Default},
    {"dictsort", DictSort}, {"first", First},
    {"float", Float},       {"indent", Indent},
    {"int", Int},           {"items", Items},
    {"join", Join},         {"last", Last},
    {"length", Length},     {"list", List},
    {"lower", Lower},       {"map", Map},
    {"max", Max},           {"min", Min},
    {"reject", Reject},     {"rejectattr", RejectAttr},
    {"replace", Replace},   {"reverse", Reverse},
    {"round", Round},       {"safe", Safe},
    {"select", Select},     {"selectattr", SelectAttr},
    {"sort", Sort},         {"string", String},
    {"sum", Sum},           {"title", Title},
    {"tojson", ToJson},     {"trim", Trim},
    {"truncate", Truncate}, {"unique", Unique},
    {"upper", Upper},       {"wordcount", WordCount},
};

}  // namespace

const FilterDef* FindFilter(std::string_view name) {
  for (const FilterDef& f : kFilters) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

}  // namespace specula::jinja
