// Global functions: Jinja2's range, namespace, dict, cycler and joiner, and transformers'
// raise_exception and strftime_now.
#include <cstdio>
#include <memory>

#include "engine/chat/template/builtins.h"
#include "engine/chat/template/error.h"
#include "engine/chat/template/evaluator.h"
#include "engine/chat/template/objects.h"
#include "engine/chat/template/str_cat.h"

namespace specula::jinja {
namespace {

// The sandbox's cap on range() (jinja2.sandbox.MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

int64_t IntArg(const Value& v, int position) {
  if (!v.is_integral()) {
    ThrowRuntime(Cat("range() argument ", position, " must be int, not ", v.TypeName()));
  }
  return v.AsInt();
}

Value Range(Evaluator&, CallArgs& args) {
  const auto& p = args.positional;
  if (!args.keyword.empty()) ThrowRuntime("range() takes no keyword arguments");
  if (p.empty() || p.size() > 3) ThrowRuntime("range expected 1 to 3 arguments");
  const int64_t start = p.size() == 1 ? 0 : IntArg(p[0], 1);
  const int64_t stop = p.size() == 1 ? IntArg(p[0], 1) : IntArg(p[1], 2);
  const int64_t step = p.size() == 3 ? IntArg(p[2], 3) : 1;
  if (step == 0) ThrowRuntime("range() arg 3 must not be zero");
  const int64_t count = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                                 : (start > stop ? (start - stop - step - 1) / -step : 0);
  if (count > kMaxRange) {
    ThrowRuntime(
        Cat("Range too big. The sandbox blocks ranges larger than MAX_RANGE (", kMaxRange, ")."));
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(Value::Int(start + i * step));
  return Value::List(std::move(out));
}

// Python's dict(*args, **kwargs): a mapping or (key, value) pairs, then keywords.
std::vector<std::pair<Value, Value>> DictItems(const char* fn, CallArgs& args) {
  if (args.positional.size() > 1) {
    ThrowRuntime(Cat(fn, " expected at most 1 argument, got ", args.positional.size()));
  }
  DictBuilder dict;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_undefined()) source.ThrowUndefined();
    if (source.is_dict()) {
      for (const auto& [k, v] : source.dict().items) dict.Set(k, v);
    } else {
      for (const Value& pair : IterateValue(source)) {
        if (!pair.is_list() || pair.items().size() != 2) {
          ThrowRuntime(Cat(fn, ": sequence elements must be (key, value) pairs"));
        }
        dict.Set(pair.items()[0], pair.items()[1]);
      }
    }
  }
  for (const auto& [k, v] : args.keyword) dict.Set(Value::Str(k), v);
  Value built = dict.Build();
  return built.dict().items;
}

Value Dict(Evaluator&, CallArgs& args) { return Value::Dict(DictItems("dict", args)); }

Value MakeNamespace(Evaluator& ev, CallArgs& args) {
  auto ns = std::make_shared<Namespace>();
  for (const auto& [k, v] : DictItems("namespace", args)) {
    if (!k.is_string()) ThrowRuntime("namespace() keys must be strings");
    ns->SetAttr(k.str(), v);
  }
  ev.TrackNamespace(ns);
  return Value::Obj(std::move(ns));
}

Value MakeCycler(Evaluator&, CallArgs& args) {
  if (args.positional.empty()) ThrowRuntime("at least one item has to be provided");
  if (!args.keyword.empty()) ThrowRuntime("cycler() takes no keyword arguments");
  return Value::Obj(std::make_shared<Cycler>(args.positional));
}

Value MakeJoiner(Evaluator&, CallArgs& args) {
  ArgBinder a("joiner", args, {"sep"});
  return Value::Func(std::make_shared<Joiner>(a.Str(0, ", ")));
}

Value RaiseException(Evaluator&, CallArgs& args) {
  ArgBinder a("raise_exception", args, {"message"}, 1);
  throw TemplateError(a.Get(0).ToString(), TemplateError::Kind::kRaised);
}

// Python's datetime.strftime on a naive datetime: %f is the microseconds, %z and %Z are empty;
// the rest is the C library's strftime, as CPython uses it.
std::string FormatTime(const LocalTime& now, const std::string& format) {
  std::string c_format;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 == format.size()) {
      c_format += format[i];
      continue;
    }
    const char spec = format[++i];
    if (spec == 'f') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "%06d", now.microseconds);
      c_format += buf;
    } else if (spec != 'z' && spec != 'Z') {
      c_format += '%';
      c_format += spec;
    }
  }
  if (c_format.empty()) return "";
  for (size_t size = 64 + c_format.size() * 4; size <= (1u << 20); size *= 4) {
    std::string out(size, '\0');
    const size_t n = std::strftime(out.data(), out.size(), c_format.c_str(), &now.tm);
    if (n > 0) return out.substr(0, n);
  }
  return "";
}

Value StrftimeNow(Evaluator& ev, CallArgs& args) {
  ArgBinder a("strftime_now", args, {"format"}, 1);
  if (!a.Get(0).is_string()) ThrowRuntime("strftime_now() argument must be str");
  return Value::Str(FormatTime(ev.Now(), a.Get(0).str()));
}

struct GlobalDef {
  std::string_view name;
  BuiltinFn fn;
};

constexpr GlobalDef kGlobals[] = {
    {"range", Range},
    {"dict", Dict},
    {"namespace", MakeNamespace},
    {"cycler", MakeCycler},
    {"joiner", MakeJoiner},
    {"raise_exception", RaiseException},
    {"strftime_now", StrftimeNow},
};

}  // namespace

bool IsGlobalFunction(std::string_view name) {
  for (const GlobalDef& g : kGlobals) {
    if (g.name == name) return true;
  }
  return false;
}

Value GetGlobal(std::string_view name) {
  static const auto* const kValues = [] {
    auto* values = new std::vector<std::pair<std::string_view, Value>>();
    for (const GlobalDef& g : kGlobals) {
      values->emplace_back(g.name, Value::Func(std::make_shared<BuiltinFunction>(g.name, g.fn)));
    }
    return values;
  }();
  for (const auto& [n, v] : *kValues) {
    if (n == name) return v;
  }
  return Value();
}

}  // namespace specula::jinja
