// Jinja2's built-in tests (tests.py): `x is defined`, `x is string`, `n is divisibleby 3`...
#include <cmath>

#include "engine/chat/template/builtins.h"
#include "engine/chat/template/error.h"
#include "engine/chat/template/operators.h"
#include "engine/chat/template/py_str.h"

namespace specula::jinja {
namespace {

const Value& Arg(const char* test, CallArgs& args) {
  if (args.positional.size() + args.keyword.size() != 1) {
    ThrowRuntime(std::string(test) + "() takes exactly one argument");
  }
  return args.positional.empty() ? args.keyword[0].second : args.positional[0];
}

// value % n == r with Python's modulo.
bool ModuloIs(const Value& value, const Value& n, int64_t r) {
  return Equals(Binary(BinaryOp::kMod, value, n, 0), Value::Int(r));
}

// Tests without arguments are predicates on the value.
template <bool (*kPredicate)(const Value&)>
bool NoArgTest(Evaluator&, const Value& v, CallArgs& args) {
  ArgBinder("test", args, {});
  return kPredicate(v);
}

bool IsDefined(const Value& v) { return !v.is_undefined(); }
bool IsUndefined(const Value& v) { return v.is_undefined(); }
bool IsNone(const Value& v) { return v.is_none(); }
bool IsBoolean(const Value& v) { return v.is_bool(); }
bool IsTrue(const Value& v) { return v.is_bool() && v.bool_value(); }
bool IsFalse(const Value& v) { return v.is_bool() && !v.bool_value(); }
bool IsInteger(const Value& v) { return v.is_int(); }
bool IsFloat(const Value& v) { return v.is_float(); }
bool IsNumber(const Value& v) { return v.is_number(); }
bool IsString(const Value& v) { return v.is_string(); }
bool IsMapping(const Value& v) { return v.is_dict(); }
bool IsCallable(const Value& v) { return v.is_callable(); }
// iter() and len() work on these (an undefined value iterates as empty and has length 0).
bool IsIterable(const Value& v) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool IsEscaped(const Value&) { return false; }  // no Markup values here
bool IsOdd(const Value& v) { return ModuloIs(v, Value::Int(2), 1); }
bool IsEven(const Value& v) { return ModuloIs(v, Value::Int(2), 0); }
bool IsFilterName(const Value& v) { return v.is_string() && FindFilter(v.str()) != nullptr; }
bool IsTestName(const Value& v) { return v.is_string() && FindTest(v.str()) != nullptr; }

// str(value).islower() (kUpper false) or .isupper(): some cased character, none of the other case.
template <bool kUpper>
bool IsCase(const Value& v) {
  bool cased = false;
  for (char32_t cp : py::Decode(v.ToString())) {
    if ((kUpper ? py::IsLower(cp) : py::IsUpper(cp)) || py::IsTitle(cp)) return false;
    cased = cased || (kUpper ? py::IsUpper(cp) : py::IsLower(cp));
  }
  return cased;
}

bool DivisibleBy(Evaluator&, const Value& v, CallArgs& a) {
  return ModuloIs(v, Arg("divisibleby", a), 0);
}

// Python's `is`: the same object; None, True, False and small ints are singletons.
bool SameAs(Evaluator&, const Value& v, CallArgs& a) {
  const Value& other = Arg("sameas", a);
  if (v.kind() != other.kind()) return false;
  if (v.is_none() || v.is_undefined()) return v.is_none();
  if (v.is_bool()) return v.bool_value() == other.bool_value();
  if (v.is_int()) {
    return v.int_value() == other.int_value() && v.int_value() >= -5 && v.int_value() <= 256;
  }
  return v.SameObject(other);
}
bool In(Evaluator&, const Value& v, CallArgs& a) { return Contains(Arg("in", a), v); }

// eq, ne, lt...: `x is lt 3` is `x < 3`.
template <CompareOp kOp>
bool CompareTest(Evaluator&, const Value& v, CallArgs& a) {
  return Compare(kOp, v, Arg("comparison test", a));
}

constexpr TestDef kTests[] = {
    {"==", CompareTest<CompareOp::kEq>},
    {"!=", CompareTest<CompareOp::kNe>},
    {"<", CompareTest<CompareOp::kLt>},
    {"<=", CompareTest<CompareOp::kLe>},
    {">", CompareTest<CompareOp::kGt>},
    {">=", CompareTest<CompareOp::kGe>},
    {"boolean", NoArgTest<IsBoolean>},
    {"callable", NoArgTest<IsCallable>},
    {"defined", NoArgTest<IsDefined>},
    {"divisibleby", DivisibleBy},
    {"eq", CompareTest<CompareOp::kEq>},
    {"equalto", CompareTest<CompareOp::kEq>},
    {"escaped", NoArgTest<IsEscaped>},
    {"even", NoArgTest<IsEven>},
    {"false", NoArgTest<IsFalse>},
    {"filter", NoArgTest<IsFilterName>},
    {"float", NoArgTest<IsFloat>},
    {"ge", CompareTest<CompareOp::kGe>},
    {"greaterthan", CompareTest<CompareOp::kGt>},
    {"gt", CompareTest<CompareOp::kGt>},
    {"in", In},
    {"integer", NoArgTest<IsInteger>},
    {"iterable", NoArgTest<IsIterable>},
    {"le", CompareTest<CompareOp::kLe>},
    {"lessthan", CompareTest<CompareOp::kLt>},
    {"lower", NoArgTest<IsCase<false>>},
    {"lt", CompareTest<CompareOp::kLt>},
    {"mapping", NoArgTest<IsMapping>},
    {"ne", CompareTest<CompareOp::kNe>},
    {"none", NoArgTest<IsNone>},
    {"number", NoArgTest<IsNumber>},
    {"odd", NoArgTest<IsOdd>},
    {"sameas", SameAs},
    {"sequence", NoArgTest<IsIterable>},
    {"string", NoArgTest<IsString>},
    {"test", NoArgTest<IsTestName>},
    {"true", NoArgTest<IsTrue>},
    {"undefined", NoArgTest<IsUndefined>},
    {"upper", NoArgTest<IsCase<true>>},
};

}  // namespace

const TestDef* FindTest(std::string_view name) {
  for (const TestDef& t : kTests) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace specula::jinja
