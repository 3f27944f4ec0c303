#include "engine/chat/template/value.h"

#include <algorithm>

#include "engine/chat/template/error.h"
#include "engine/chat/template/operators.h"
#include "engine/chat/template/py_str.h"
#include "engine/chat/template/str_cat.h"

namespace specula::jinja {
namespace {

int MaxDepth(const std::vector<Value>& items) {
  int depth = 0;
  for (const Value& v : items) depth = std::max(depth, v.Depth());
  return depth;
}

void CheckDepth(int depth) {
  if (depth > kMaxValueDepth) {
    ThrowRuntime(Cat("lists and dicts nest deeper than ", kMaxValueDepth, " levels"));
  }
}

// str() and repr() of containers, guarded against cycles through namespaces.
std::string Format(const Value& v, bool repr, int depth);

std::string FormatItems(const std::vector<Value>& items, int depth) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    out += Format(items[i], true, depth + 1);
  }
  return out;
}

std::string Format(const Value& v, bool repr, int depth) {
  if (depth > 2 * kMaxValueDepth) ThrowRuntime("maximum recursion depth exceeded in repr");
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return repr ? "Undefined" : "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.bool_value() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.int_value());
    case Value::Kind::kFloat:
      return py::FloatRepr(v.float_value());
    case Value::Kind::kString:
      return repr ? py::Repr(v.str()) : v.str();
    case Value::Kind::kList: {
      const std::string inner = FormatItems(v.items(), depth);
      if (!v.is_tuple()) return "[" + inner + "]";
      return "(" + inner + (v.items().size() == 1 ? ",)" : ")");
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      for (const auto& [key, value] : v.dict().items) {
        if (out.size() > 1) out += ", ";
        out += Format(key, true, depth + 1) + ": " + Format(value, true, depth + 1);
      }
      return out + "}";
    }
    case Value::Kind::kObject:
      return v.object().Repr();
    case Value::Kind::kCallable:
      return v.callable().Repr();
  }
  return "";
}

}  // namespace

Value Object::GetAttr(std::string_view) const { return Value(); }

void Object::SetAttr(std::string_view, Value) {
  ThrowRuntime("cannot assign attribute on non-namespace object");
}

std::string Object::Repr() const { return "<" + TypeName() + " object>"; }

Value Value::Undefined(std::string hint) {
  Value v;
  v.data_ = UndefinedData{std::make_shared<const std::string>(std::move(hint))};
  return v;
}

Value Value::None() {
  Value v;
  v.data_ = std::monostate();
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.data_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.data_ = i;
  return v;
}

Value Value::Float(double d) {
  Value v;
  v.data_ = d;
  return v;
}

Value Value::Str(std::string s) {
  Value v;
  v.data_ = std::move(s);
  return v;
}

Value Value::List(std::vector<Value> items) {
  auto data = std::make_shared<ListData>();
  data->depth = MaxDepth(items) + 1;
  CheckDepth(data->depth);
  data->items = std::move(items);
  Value v;
  v.data_ = std::shared_ptr<const ListData>(std::move(data));
  return v;
}

Value Value::Tuple(std::vector<Value> items) {
  auto data = std::make_shared<ListData>();
  data->depth = MaxDepth(items) + 1;
  CheckDepth(data->depth);
  data->items = std::move(items);
  data->is_tuple = true;
  Value v;
  v.data_ = std::shared_ptr<const ListData>(std::move(data));
  return v;
}

Value Value::Dict(std::vector<std::pair<Value, Value>> items) {
  auto data = std::make_shared<DictData>();
  int depth = 0;
  for (const auto& kv : items) depth = std::max(depth, kv.second.Depth());
  data->depth = depth + 1;
  CheckDepth(data->depth);
  data->items = std::move(items);
  Value v;
  v.data_ = std::shared_ptr<const DictData>(std::move(data));
  return v;
}

Value Value::Obj(std::shared_ptr<Object> object) {
  Value v;
  v.data_ = std::move(object);
  return v;
}

Value Value::Func(std::shared_ptr<const Callable> callable) {
  Value v;
  v.data_ = std::move(callable);
  return v;
}

bool Value::is_tuple() const { return is_list() && list().is_tuple; }

const std::vector<Value>& Value::items() const { return list().items; }

std::string Value::undefined_message() const {
  const auto& hint = std::get<UndefinedData>(data_).hint;
  return hint ? *hint : "undefined value";
}

double Value::AsDouble() const {
  if (is_float()) return float_value();
  return static_cast<double>(AsInt());
}

int Value::Depth() const {
  if (is_list()) return list().depth;
  if (is_dict()) return dict().depth;
  if (is_object()) return object().Depth();
  return 0;
}

bool Value::SameObject(const Value& other) const {
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::kList:
      return &list() == &other.list();
    case Kind::kDict:
      return &dict() == &other.dict();
    case Kind::kObject:
      return &object() == &other.object();
    case Kind::kCallable:
      return &callable() == &other.callable();
    default:
      return false;
  }
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_value();
    case Kind::kInt:
      return int_value() != 0;
    case Kind::kFloat:
      return float_value() != 0.0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
      return !items().empty();
    case Kind::kDict:
      return !dict().items.empty();
    default:
      return true;
  }
}

std::string Value::ToString() const { return Format(*this, false, 0); }

std::string Value::Repr() const { return Format(*this, true, 0); }

std::string Value::TypeName() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return is_tuple() ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kObject:
      return object().TypeName();
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

void Value::ThrowUndefined() const { ThrowRuntime(undefined_message()); }

const Value* DictData::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

const Value* DictData::Find(const Value& key) const {
  if (key.is_string()) return Find(std::string_view(key.str()));
  for (const auto& [k, v] : items) {
    if (Equals(k, key)) return &v;
  }
  return nullptr;
}

void DictBuilder::Set(Value key, Value value) {
  if (key.is_dict() || (key.is_list() && !key.is_tuple())) {
    ThrowRuntime("unhashable type: '" + key.TypeName() + "'");
  }
  for (auto& [k, v] : items_) {
    if (Equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items_.emplace_back(std::move(key), std::move(value));
}

}  // namespace specula::jinja
