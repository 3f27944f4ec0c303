#include "engine/chat/template/operators.h"

#include <cmath>
#include <limits>

#include "engine/chat/template/error.h"
#include "engine/chat/template/str_cat.h"

namespace specula::jinja {
namespace {

bool BothIntegral(const Value& a, const Value& b) { return a.is_integral() && b.is_integral(); }

[[noreturn]] void ThrowOperandTypes(std::string_view op, const Value& a, const Value& b) {
  ThrowRuntime(Cat("unsupported operand type(s) for ", op, ": '", a.TypeName(), "' and '",
                   b.TypeName(), "'"));
}

void CheckSize(size_t size, size_t max_size) {
  if (size > max_size) {
    ThrowRuntime(Cat("value larger than the limit of ", max_size, " bytes"));
  }
}

int Sign(double x) { return x < 0 ? -1 : x > 0 ? 1 : 0; }

int OrderOrThrow(const Value& a, const Value& b, std::string_view op) {
  if (a.is_undefined()) a.ThrowUndefined();
  if (b.is_undefined()) b.ThrowUndefined();
  if (BothIntegral(a, b)) return a.AsInt() < b.AsInt() ? -1 : a.AsInt() > b.AsInt();
  if (a.is_number() && b.is_number()) return Sign(a.AsDouble() - b.AsDouble());
  if (a.is_string() && b.is_string()) return a.str().compare(b.str()) < 0 ? -1 : a.str() > b.str();
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equals(x[i], y[i])) return OrderOrThrow(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  ThrowRuntime(Cat("'", op, "' not supported between instances of '", a.TypeName(), "' and '",
                   b.TypeName(), "'"));
}

enum class IntOp { kAdd, kSub, kMul };

Value CheckedInt(IntOp op, int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflow = op == IntOp::kAdd   ? __builtin_add_overflow(a, b, &r)
                        : op == IntOp::kSub ? __builtin_sub_overflow(a, b, &r)
                                            : __builtin_mul_overflow(a, b, &r);
  if (overflow) ThrowRuntime("integer overflow");
  return Value::Int(r);
}

// Python's float floor division and modulo (the result of % takes the divisor's sign).
std::pair<double, double> FloatDivMod(double x, double y) {
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  double floordiv = std::copysign(0.0, x / y);
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  }
  return {floordiv, mod};
}

Value Repeat(const Value& seq, int64_t times, size_t max_size) {
  times = std::max<int64_t>(times, 0);
  if (seq.is_string()) {
    CheckSize(seq.str().size() * static_cast<uint64_t>(times), max_size);
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.str();
    return Value::Str(std::move(out));
  }
  CheckSize(seq.items().size() * static_cast<uint64_t>(times), max_size);
  std::vector<Value> out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return seq.is_tuple() ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
}

Value Add(const Value& a, const Value& b, size_t max_size) {
  if (BothIntegral(a, b)) return CheckedInt(IntOp::kAdd, a.AsInt(), b.AsInt());
  if (a.is_number() && b.is_number()) return Value::Float(a.AsDouble() + b.AsDouble());
  if (a.is_string() && b.is_string()) {
    CheckSize(a.str().size() + b.str().size(), max_size);
    return Value::Str(a.str() + b.str());
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    CheckSize(a.items().size() + b.items().size(), max_size);
    std::vector<Value> out = a.items();
    out.insert(out.end(), b.items().begin(), b.items().end());
    return a.is_tuple() ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
  }
  if (a.is_string() || a.is_list()) {
    ThrowRuntime(Cat("can only concatenate ", a.TypeName(), " (not \"", b.TypeName(), "\") to ",
                     a.TypeName()));
  }
  ThrowOperandTypes("+", a, b);
}

Value Multiply(const Value& a, const Value& b, size_t max_size) {
  if (BothIntegral(a, b)) return CheckedInt(IntOp::kMul, a.AsInt(), b.AsInt());
  if (a.is_number() && b.is_number()) return Value::Float(a.AsDouble() * b.AsDouble());
  if ((a.is_string() || a.is_list()) && b.is_integral()) return Repeat(a, b.AsInt(), max_size);
  if ((b.is_string() || b.is_list()) && a.is_integral()) return Repeat(b, a.AsInt(), max_size);
  if (a.is_string() || a.is_list()) {
    ThrowRuntime("can't multiply sequence by non-int of type '" + b.TypeName() + "'");
  }
  ThrowOperandTypes("*", a, b);
}

Value Divide(BinaryOp op, const Value& a, const Value& b) {
  if (a.is_string() && op == BinaryOp::kMod) {
    ThrowRuntime("printf-style string formatting ('%' on a string) is not supported");
  }
  if (!a.is_number() || !b.is_number()) ThrowOperandTypes(BinaryOpSymbol(op), a, b);
  if (b.AsDouble() == 0) {
    ThrowRuntime(op == BinaryOp::kDiv ? "division by zero" : "integer division or modulo by zero");
  }
  if (op == BinaryOp::kDiv) return Value::Float(a.AsDouble() / b.AsDouble());
  if (BothIntegral(a, b)) {
    const int64_t x = a.AsInt(), y = b.AsInt();
    if (x == std::numeric_limits<int64_t>::min() && y == -1) ThrowRuntime("integer overflow");
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
      q -= 1;
      m += y;
    }
    return Value::Int(op == BinaryOp::kFloorDiv ? q : m);
  }
  const auto [q, m] = FloatDivMod(a.AsDouble(), b.AsDouble());
  return Value::Float(op == BinaryOp::kFloorDiv ? q : m);
}

Value Power(const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) ThrowOperandTypes("**", a, b);
  if (BothIntegral(a, b) && b.AsInt() >= 0) {
    int64_t result = 1, base = a.AsInt();
    for (int64_t e = b.AsInt(); e > 0; e >>= 1) {
      if ((e & 1) && __builtin_mul_overflow(result, base, &result))
        ThrowRuntime("integer overflow");
      if (e > 1 && __builtin_mul_overflow(base, base, &base)) ThrowRuntime("integer overflow");
    }
    return Value::Int(result);
  }
  if (a.AsDouble() == 0 && b.AsDouble() < 0) {
    ThrowRuntime("0.0 cannot be raised to a negative power");
  }
  return Value::Float(std::pow(a.AsDouble(), b.AsDouble()));
}

}  // namespace

bool Equals(const Value& a, const Value& b) {
  if (BothIntegral(a, b)) return a.AsInt() == b.AsInt();
  if (a.is_number() && b.is_number()) return a.AsDouble() == b.AsDouble();
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kList: {
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (!Equals(a.items()[i], b.items()[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict().items.size() != b.dict().items.size()) return false;
      for (const auto& [key, value] : a.dict().items) {
        const Value* other = b.dict().Find(key);
        if (other == nullptr || !Equals(value, *other)) return false;
      }
      return true;
    }
    default:
      return a.SameObject(b);
  }
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        ThrowRuntime("'in <string>' requires string as left operand, not " + item.TypeName());
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.items()) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (item.is_dict() || (item.is_list() && !item.is_tuple())) {
        ThrowRuntime("unhashable type: '" + item.TypeName() + "'");
      }
      return container.dict().Find(item) != nullptr;
    default:
      ThrowRuntime("argument of type '" + container.TypeName() + "' is not iterable");
  }
}

bool Compare(CompareOp op, const Value& a, const Value& b) {
  switch (op) {
    case CompareOp::kEq:
      return Equals(a, b);
    case CompareOp::kNe:
      return !Equals(a, b);
    case CompareOp::kIn:
      return Contains(b, a);
    case CompareOp::kNotIn:
      return !Contains(b, a);
    case CompareOp::kLt:
      return OrderOrThrow(a, b, "<") < 0;
    case CompareOp::kLe:
      return OrderOrThrow(a, b, "<=") <= 0;
    case CompareOp::kGt:
      return OrderOrThrow(a, b, ">") > 0;
    case CompareOp::kGe:
      return OrderOrThrow(a, b, ">=") >= 0;
  }
  return false;
}

int Order(const Value& a, const Value& b) { return OrderOrThrow(a, b, "<"); }

Value Binary(BinaryOp op, const Value& a, const Value& b, size_t max_size) {
  if (op == BinaryOp::kConcat) {
    std::string s = a.ToString();
    const std::string t = b.ToString();
    CheckSize(s.size() + t.size(), max_size);
    return Value::Str(s + t);
  }
  if (a.is_undefined()) a.ThrowUndefined();
  if (b.is_undefined()) b.ThrowUndefined();
  switch (op) {
    case BinaryOp::kAdd:
      return Add(a, b, max_size);
    case BinaryOp::kSub: {
      if (BothIntegral(a, b)) return CheckedInt(IntOp::kSub, a.AsInt(), b.AsInt());
      if (a.is_number() && b.is_number()) return Value::Float(a.AsDouble() - b.AsDouble());
      ThrowOperandTypes("-", a, b);
    }
    case BinaryOp::kMul:
      return Multiply(a, b, max_size);
    case BinaryOp::kPow:
      return Power(a, b);
    default:
      return Divide(op, a, b);
  }
}

Value Negate(const Value& v, bool minus) {
  if (v.is_undefined()) v.ThrowUndefined();
  if (v.is_float()) return Value::Float(minus ? -v.float_value() : v.float_value());
  if (!v.is_integral()) {
    ThrowRuntime(Cat("bad operand type for unary ", minus ? "-" : "+", ": '", v.TypeName(), "'"));
  }
  if (!minus) return Value::Int(v.AsInt());
  if (v.AsInt() == std::numeric_limits<int64_t>::min()) ThrowRuntime("integer overflow");
  return Value::Int(-v.AsInt());
}

std::string_view BinaryOpSymbol(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "+";
    case BinaryOp::kSub:
      return "-";
    case BinaryOp::kMul:
      return "*";
    case BinaryOp::kDiv:
      return "/";
    case BinaryOp::kFloorDiv:
      return "//";
    case BinaryOp::kMod:
      return "%";
    case BinaryOp::kPow:
      return "**";
    case BinaryOp::kConcat:
      return "~";
  }
  return "?";
}

}  // namespace specula::jinja
