#include "engine/chat/template/builtins.h"

#include <algorithm>
#include <cmath>

#include "engine/chat/template/error.h"
#include "engine/chat/template/py_str.h"
#include "engine/chat/template/str_cat.h"

namespace specula::jinja {

ArgBinder::ArgBinder(std::string_view function, const CallArgs& args,
                     std::initializer_list<std::string_view> params, size_t required)
    : function_(function), params_(params), bound_(params.size(), nullptr) {
  if (args.positional.size() > params_.size()) {
    ThrowRuntime(Cat(function, "() takes at most ", params_.size(), " argument(s) (",
                     args.positional.size(), " given)"));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) bound_[i] = &args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    const auto it = std::find(params_.begin(), params_.end(), key);
    if (it == params_.end()) {
      ThrowRuntime(Cat(function, "() got an unexpected keyword argument '", key, "'"));
    }
    const size_t i = it - params_.begin();
    if (bound_[i] != nullptr) {
      ThrowRuntime(Cat(function, "() got multiple values for argument '", key, "'"));
    }
    bound_[i] = &value;
  }
  for (size_t i = 0; i < required; ++i) {
    if (bound_[i] == nullptr) {
      ThrowRuntime(Cat(function, "() missing required argument '", params_[i], "'"));
    }
  }
}

const Value& ArgBinder::Get(size_t i) const {
  static const Value* const kUndefined = new Value();
  return bound_[i] != nullptr ? *bound_[i] : *kUndefined;
}

const Value* ArgBinder::GetOrNull(size_t i) const {
  return bound_[i] == nullptr || bound_[i]->is_none() ? nullptr : bound_[i];
}

int64_t ArgBinder::Int(size_t i, int64_t fallback) const {
  if (!Has(i)) return fallback;
  const Value& v = Get(i);
  if (v.is_integral()) return v.AsInt();
  if (v.is_float() && std::isfinite(v.float_value())) {
    return static_cast<int64_t>(std::trunc(v.float_value()));
  }
  ThrowRuntime(Cat(function_, "(): '", params_[i], "' must be an integer, not ", v.TypeName()));
}

std::string ArgBinder::Str(size_t i, std::string fallback) const {
  return Has(i) ? Get(i).ToString() : std::move(fallback);
}

std::optional<std::string> ArgBinder::OptStr(size_t i) const {
  const Value* v = GetOrNull(i);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) {
    ThrowRuntime(Cat(function_, "(): '", params_[i], "' must be str or None, not ", v->TypeName()));
  }
  return v->str();
}

std::vector<Value> IterateValue(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return value.items();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(value.dict().items.size());
      for (const auto& kv : value.dict().items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (char32_t cp : py::Decode(value.str())) chars.push_back(Value::Str(py::Encode({&cp, 1})));
      return chars;
    }
    default:
      ThrowRuntime("'" + value.TypeName() + "' object is not iterable");
  }
}

int64_t LengthOf(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return py::Length(value.str());
    case Value::Kind::kList:
      return static_cast<int64_t>(value.items().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(value.dict().items.size());
    default:
      ThrowRuntime("object of type '" + value.TypeName() + "' has no len()");
  }
}

}  // namespace specula::jinja
