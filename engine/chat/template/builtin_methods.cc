// Methods of str, dict and list values (`s.strip()`, `d.items()`, `xs.index(x)`), as Python has
// them. The methods transformers' ImmutableSandboxedEnvironment refuses (those that would change
// a list or dict) fail when called, as they do there.
#include <algorithm>
#include <memory>
#include <span>

#include "engine/chat/template/builtins.h"
#include "engine/chat/template/error.h"
#include "engine/chat/template/evaluator.h"
#include "engine/chat/template/objects.h"
#include "engine/chat/template/operators.h"
#include "engine/chat/template/py_str.h"
#include "engine/chat/template/str_cat.h"

namespace specula::jinja {
namespace {

struct MethodDef {
  std::string_view name;
  MethodFn fn;
};

Value StrList(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (std::string& p : parts) out.push_back(Value::Str(std::move(p)));
  return Value::List(std::move(out));
}

std::string RequireStr(const Value& v, std::string_view method) {
  if (!v.is_string()) {
    ThrowRuntime(Cat(method, "() argument must be str, not ", v.TypeName()));
  }
  return v.str();
}

std::optional<int64_t> OptIndex(const ArgBinder& a, size_t i) {
  if (a.GetOrNull(i) == nullptr) return std::nullopt;
  return a.Int(i, 0);
}

// s[start:end] for the optional start/end arguments of startswith, count...
std::string Window(const std::string& s, const ArgBinder& a, size_t first) {
  if (!a.Has(first) && !a.Has(first + 1)) return s;
  const std::u32string cps = py::Decode(s);
  std::u32string out;
  for (int64_t i : py::SliceIndices(static_cast<int64_t>(cps.size()), OptIndex(a, first),
                                    OptIndex(a, first + 1), std::nullopt)) {
    out += cps[i];
  }
  return py::Encode(out);
}

// ---- str

template <bool kLeft, bool kRight>
Value Strip(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder a("strip", args, {"chars"});
  return Value::Str(py::Strip(self.str(), a.OptStr(0), kLeft, kRight));
}

template <bool kReverse>
Value Split(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder a("split", args, {"sep", "maxsplit"});
  const int64_t maxsplit = a.Int(1, -1);
  return StrList(kReverse ? py::RSplit(self.str(), a.OptStr(0), maxsplit)
                          : py::Split(self.str(), a.OptStr(0), maxsplit));
}

Value SplitLines(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder a("splitlines", args, {"keepends"});
  return StrList(py::SplitLines(self.str(), a.Bool(0, false)));
}

template <bool kEnd>
Value StartsWith(Evaluator&, const Value& self, CallArgs& args) {
  const char* name = kEnd ? "endswith" : "startswith";
  ArgBinder a(name, args, {"prefix", "start", "end"}, 1);
  const std::string s = Window(self.str(), a, 1);
  const Value& prefix = a.Get(0);
  std::vector<Value> options = prefix.is_tuple() ? prefix.items() : std::vector<Value>{prefix};
  for (const Value& p : options) {
    if (!p.is_string()) {
      ThrowRuntime(Cat(name, " first arg must be str or a tuple of str, not ", p.TypeName()));
    }
    if (kEnd ? s.ends_with(p.str()) : s.starts_with(p.str())) return Value::Bool(true);
  }
  return Value::Bool(false);
}

template <std::string (*kFn)(std::string_view)>
Value CaseMethod(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder("str method", args, {});
  return Value::Str(kFn(self.str()));
}

Value Replace(Evaluator& ev, const Value& self, CallArgs& args) {
  ArgBinder a("replace", args, {"old", "new", "count"}, 2);
  std::string out = py::Replace(self.str(), RequireStr(a.Get(0), "replace"),
                                RequireStr(a.Get(1), "replace"), a.Int(2, -1));
  if (out.size() > ev.max_size()) ThrowRuntime("replace(): result larger than the limit");
  return Value::Str(std::move(out));
}

template <bool kReverse, bool kRaise>
Value Find(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder a("find", args, {"sub", "start", "end"}, 1);
  const int64_t at =
      py::Find(self.str(), RequireStr(a.Get(0), "find"), OptIndex(a, 1), OptIndex(a, 2), kReverse);
  if (kRaise && at < 0) ThrowRuntime("substring not found");
  return Value::Int(at);
}

Value Count(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder a("count", args, {"sub", "start", "end"}, 1);
  return Value::Int(py::Count(Window(self.str(), a, 1), RequireStr(a.Get(0), "count")));
}

Value Join(Evaluator& ev, const Value& self, CallArgs& args) {
  ArgBinder a("join", args, {"iterable"}, 1);
  std::string out;
  const std::vector<Value> items = IterateValue(a.Get(0));
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      ThrowRuntime(
          Cat("sequence item ", i, ": expected str instance, ", items[i].TypeName(), " found"));
    }
    if (i > 0) out += self.str();
    out += items[i].str();
    if (out.size() > ev.max_size()) ThrowRuntime("join(): result larger than the limit");
  }
  return Value::Str(std::move(out));
}

template <bool (*kPred)(uint32_t)>
Value AllChars(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder("str method", args, {});
  const std::u32string cps = py::Decode(self.str());
  return Value::Bool(!cps.empty() && std::all_of(cps.begin(), cps.end(), kPred));
}

// isupper() (kUpper) and islower(): some cased character, none of the other case.
template <bool kUpper>
Value IsCase(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder("str method", args, {});
  bool cased = false;
  for (char32_t cp : py::Decode(self.str())) {
    if ((kUpper ? py::IsLower(cp) : py::IsUpper(cp)) || py::IsTitle(cp)) return Value::Bool(false);
    cased = cased || (kUpper ? py::IsUpper(cp) : py::IsLower(cp));
  }
  return Value::Bool(cased);
}

Value IsTitle(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder("istitle", args, {});
  bool cased = false, previous_cased = false;
  for (char32_t cp : py::Decode(self.str())) {
    if (py::IsUpper(cp) || py::IsTitle(cp)) {
      if (previous_cased) return Value::Bool(false);
      previous_cased = cased = true;
    } else if (py::IsLower(cp)) {
      if (!previous_cased) return Value::Bool(false);
      previous_cased = cased = true;
    } else {
      previous_cased = false;
    }
  }
  return Value::Bool(cased);
}

template <int kAlign>
Value Justify(Evaluator& ev, const Value& self, CallArgs& args) {
  ArgBinder a("center", args, {"width", "fillchar"}, 1);
  const std::string fill = a.Str(1, " ");
  if (py::Length(fill) != 1) ThrowRuntime("The fill character must be exactly one character long");
  const int64_t width = a.Int(0, 0);
  if (width > static_cast<int64_t>(ev.max_size())) ThrowRuntime("width larger than the limit");
  return Value::Str(py::Pad(self.str(), width, py::Decode(fill)[0], kAlign));
}

Value ZFill(Evaluator& ev, const Value& self, CallArgs& args) {
  ArgBinder a("zfill", args, {"width"}, 1);
  const std::string& s = self.str();
  const int64_t width = a.Int(0, 0);
  if (width > static_cast<int64_t>(ev.max_size())) ThrowRuntime("width larger than the limit");
  const int64_t fill = width - py::Length(s);
  if (fill <= 0) return self;
  const size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-');
  return Value::Str(s.substr(0, sign) + std::string(fill, '0') + s.substr(sign));
}

template <bool kReverse>
Value Partition(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder a("partition", args, {"sep"}, 1);
  const std::string sep = RequireStr(a.Get(0), "partition");
  if (sep.empty()) ThrowRuntime("empty separator");
  const std::string& s = self.str();
  const size_t at = kReverse ? s.rfind(sep) : s.find(sep);
  if (at == std::string::npos) {
    return kReverse ? Value::Tuple({Value::Str(""), Value::Str(""), self})
                    : Value::Tuple({self, Value::Str(""), Value::Str("")});
  }
  return Value::Tuple(
      {Value::Str(s.substr(0, at)), Value::Str(sep), Value::Str(s.substr(at + sep.size()))});
}

template <bool kSuffix>
Value RemoveAffix(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder a("removeprefix", args, {"affix"}, 1);
  const std::string affix = RequireStr(a.Get(0), "removeprefix");
  const std::string& s = self.str();
  if (kSuffix && s.ends_with(affix)) return Value::Str(s.substr(0, s.size() - affix.size()));
  if (!kSuffix && s.starts_with(affix)) return Value::Str(s.substr(affix.size()));
  return self;
}

constexpr MethodDef kStrMethods[] = {
    {"strip", Strip<true, true>},
    {"lstrip", Strip<true, false>},
    {"rstrip", Strip<false, true>},
    {"split", Split<false>},
    {"rsplit", Split<true>},
    {"splitlines", SplitLines},
    {"startswith", StartsWith<false>},
    {"endswith", StartsWith<true>},
    {"upper", CaseMethod<py::Upper>},
    {"lower", CaseMethod<py::Lower>},
    {"casefold", CaseMethod<py::Lower>},
    {"title", CaseMethod<py::Title>},
    {"capitalize", CaseMethod<py::Capitalize>},
    {"swapcase", CaseMethod<py::SwapCase>},
    {"replace", Replace},
    {"find", Find<false, false>},
    {"rfind", Find<true, false>},
    {"index", Find<false, true>},
    {"rindex", Find<true, true>},
    {"count", Count},
    {"join", Join},
    {"isalpha", AllChars<py::IsAlpha>},
    {"isalnum", AllChars<py::IsAlnum>},
    {"isdecimal", AllChars<py::IsDecimal>},
    {"isdigit", AllChars<py::IsDigit>},
    {"isnumeric", AllChars<py::IsNumeric>},
    {"isspace", AllChars<py::IsSpace>},
    {"isupper", IsCase<true>},
    {"islower", IsCase<false>},
    {"istitle", IsTitle},
    {"center", Justify<0>},
    {"ljust", Justify<-1>},
    {"rjust", Justify<1>},
    {"zfill", ZFill},
    {"partition", Partition<false>},
    {"rpartition", Partition<true>},
    {"removeprefix", RemoveAffix<false>},
    {"removesuffix", RemoveAffix<true>},
};

// ---- dict

Value DictItems(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder("items", args, {});
  std::vector<Value> out;
  for (const auto& [k, v] : self.dict().items) out.push_back(Value::Tuple({k, v}));
  return Value::List(std::move(out));
}

template <bool kKeys>
Value DictKeysOrValues(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder(kKeys ? "keys" : "values", args, {});
  std::vector<Value> out;
  for (const auto& [k, v] : self.dict().items) out.push_back(kKeys ? k : v);
  return Value::List(std::move(out));
}

Value DictGet(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder a("get", args, {"key", "default"}, 1);
  const Value& key = a.Get(0);
  if (key.is_dict() || (key.is_list() && !key.is_tuple())) {
    ThrowRuntime("unhashable type: '" + key.TypeName() + "'");
  }
  const Value* v = self.dict().Find(key);
  return v != nullptr ? *v : a.Or(1, Value::None());
}

Value Copy(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder("copy", args, {});
  if (self.is_dict()) return Value::Dict(self.dict().items);
  return Value::List(self.items());
}

constexpr MethodDef kDictMethods[] = {
    {"items", DictItems},
    {"keys", DictKeysOrValues<true>},
    {"values", DictKeysOrValues<false>},
    {"get", DictGet},
    {"copy", Copy},
};

// ---- list and tuple

Value ListIndex(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder a("index", args, {"value", "start", "stop"}, 1);
  const auto& items = self.items();
  for (int64_t i : py::SliceIndices(static_cast<int64_t>(items.size()), OptIndex(a, 1),
                                    OptIndex(a, 2), std::nullopt)) {
    if (Equals(items[i], a.Get(0))) return Value::Int(i);
  }
  ThrowRuntime(a.Get(0).Repr() + " is not in list");
}

Value ListCount(Evaluator&, const Value& self, CallArgs& args) {
  ArgBinder a("count", args, {"value"}, 1);
  return Value::Int(std::count_if(self.items().begin(), self.items().end(),
                                  [&](const Value& v) { return Equals(v, a.Get(0)); }));
}

constexpr MethodDef kListMethods[] = {
    {"index", ListIndex},
    {"count", ListCount},
    {"copy", Copy},
};

constexpr std::string_view kUnsafeListMethods[] = {"append", "clear",  "extend",  "insert",
                                                   "pop",    "remove", "reverse", "sort"};
constexpr std::string_view kUnsafeDictMethods[] = {"clear", "pop", "popitem", "setdefault",
                                                   "update"};
// Methods of the loop variable and of cycler() objects.
constexpr std::string_view kObjectMethods[] = {"cycle", "changed", "next", "reset"};

template <typename T>
bool Listed(std::span<const T> table, std::string_view name) {
  for (const T& entry : table) {
    if constexpr (std::is_same_v<T, MethodDef>) {
      if (entry.name == name) return true;
    } else if (entry == name) {
      return true;
    }
  }
  return false;
}

}  // namespace

bool IsMethodName(std::string_view name) {
  return Listed<MethodDef>(kStrMethods, name) || Listed<MethodDef>(kDictMethods, name) ||
         Listed<MethodDef>(kListMethods, name) ||
         Listed<std::string_view>(kUnsafeListMethods, name) ||
         Listed<std::string_view>(kUnsafeDictMethods, name) ||
         Listed<std::string_view>(kObjectMethods, name);
}

std::optional<Value> LookupMethod(const Value& value, std::string_view name) {
  std::span<const MethodDef> table;
  std::span<const std::string_view> unsafe;
  if (value.is_string()) {
    table = kStrMethods;
  } else if (value.is_dict()) {
    table = kDictMethods;
    unsafe = kUnsafeDictMethods;
  } else if (value.is_list()) {
    table = kListMethods;
    if (!value.is_tuple()) unsafe = kUnsafeListMethods;
  } else {
    return std::nullopt;
  }
  for (const MethodDef& m : table) {
    if (m.name == name) return Value::Func(std::make_shared<BoundMethod>(value, m.name, m.fn));
  }
  if (Listed<std::string_view>(unsafe, name)) {
    return Value::Undefined(
        Cat("access to attribute '", name, "' of '", value.TypeName(), "' object is unsafe."));
  }
  return std::nullopt;
}

}  // namespace specula::jinja
