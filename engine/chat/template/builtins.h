// The filters, tests, global functions and methods the interpreter implements. The parser
// resolves names against these tables, so a template using anything else fails to parse.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/template/value.h"

namespace specula::jinja {

using FilterFn = Value (*)(Evaluator& ev, const Value& input, CallArgs& args);
using TestFn = bool (*)(Evaluator& ev, const Value& input, CallArgs& args);

struct FilterDef {
  std::string_view name;
  FilterFn fn;
};

struct TestDef {
  std::string_view name;
  TestFn fn;
};

// nullptr when not implemented.
const FilterDef* FindFilter(std::string_view name);
const TestDef* FindTest(std::string_view name);

// range, namespace, dict, cycler, joiner, raise_exception, strftime_now.
bool IsGlobalFunction(std::string_view name);
Value GetGlobal(std::string_view name);  // undefined when not a global

// Whether `x.name(...)` can be a method call on some value (str, dict, list, loop, cycler), or
// one transformers' sandbox refuses at run time (list.append...).
bool IsMethodName(std::string_view name);
// `value.name` for str, list and dict values: the bound method, an undefined value that refuses
// to be called for the sandbox's unsafe methods (list.append...), or nullopt when none.
std::optional<Value> LookupMethod(const Value& value, std::string_view name);

// Binds call arguments to named parameters like Python does: positional ones first, then
// keywords; throws TypeError-like errors for extra, repeated or unknown arguments.
class ArgBinder {
 public:
  ArgBinder(std::string_view function, const CallArgs& args,
            std::initializer_list<std::string_view> params, size_t required = 0);

  bool Has(size_t i) const { return bound_[i] != nullptr; }
  // The argument, or an undefined value when not given.
  const Value& Get(size_t i) const;
  // Not given or None: nullopt.
  const Value* GetOrNull(size_t i) const;
  Value Or(size_t i, Value fallback) const { return Has(i) ? Get(i) : std::move(fallback); }
  bool Bool(size_t i, bool fallback) const { return Has(i) ? Get(i).Truthy() : fallback; }
  int64_t Int(size_t i, int64_t fallback) const;
  std::string Str(size_t i, std::string fallback) const;
  // None or missing: nullopt; otherwise must be a string.
  std::optional<std::string> OptStr(size_t i) const;

 private:
  std::string function_;
  std::vector<std::string_view> params_;
  std::vector<const Value*> bound_;
};

// Python's iter(): the items of a list/tuple, the keys of a dict, the characters of a string;
// nothing for undefined. Throws for values that are not iterable.
std::vector<Value> IterateValue(const Value& value);

// Python's len().
int64_t LengthOf(const Value& value);

}  // namespace specula::jinja
