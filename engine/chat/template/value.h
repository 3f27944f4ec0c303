// The values a template computes with, modelled on the Python objects Jinja2 handles: undefined,
// None, bool, int, float, str, list/tuple, dict (insertion-ordered), objects with attributes
// (namespace(), the loop variable, cycler(), joiner()) and callables (macros, globals, methods).
//
// Lists and dicts are shared and immutable once built (transformers renders in an
// ImmutableSandboxedEnvironment: list.append, dict.update... are refused), so copying a Value is
// cheap and never observable. Only namespace objects change, through `{% set ns.x = ... %}`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace specula::jinja {

class Value;
class Evaluator;

// Evaluated arguments of a call: `f(1, 2, key=3)`.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct ListData;
struct DictData;

// Objects whose attributes are looked up by name (namespace, loop, cycler, joiner).
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string TypeName() const = 0;
  // An undefined Value when there is no such attribute.
  virtual Value GetAttr(std::string_view name) const;
  // Only namespaces accept attribute assignment; the default throws.
  virtual void SetAttr(std::string_view name, Value value);
  virtual std::string Repr() const;
  // Drops references to other values (breaks cycles such as `set ns.self = ns` after a render).
  virtual void Clear() {}
  // Nesting depth of the values it holds, as Value::Depth.
  virtual int Depth() const { return 0; }
};

class Callable {
 public:
  virtual ~Callable() = default;
  virtual Value Call(Evaluator& ev, CallArgs& args) const = 0;
  virtual std::string Repr() const = 0;
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,  // list or tuple
    kDict,
    kObject,
    kCallable,
  };

  Value() = default;  // undefined
  static Value Undefined(std::string hint);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value Str(std::string s);
  static Value List(std::vector<Value> items);
  static Value Tuple(std::vector<Value> items);
  // `items` must not repeat a key (DictBuilder deduplicates).
  static Value Dict(std::vector<std::pair<Value, Value>> items);
  static Value Obj(std::shared_ptr<Object> object);
  static Value Func(std::shared_ptr<const Callable> callable);

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  // bool, int or float (Python's numbers.Number; bool is an int subclass).
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_integral() const { return is_bool() || is_int(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_tuple() const;
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_object() const { return kind() == Kind::kObject; }
  bool is_callable() const { return kind() == Kind::kCallable; }

  bool bool_value() const { return std::get<bool>(data_); }
  int64_t int_value() const { return std::get<int64_t>(data_); }
  double float_value() const { return std::get<double>(data_); }
  const std::string& str() const { return std::get<std::string>(data_); }
  const ListData& list() const { return *std::get<std::shared_ptr<const ListData>>(data_); }
  const std::vector<Value>& items() const;
  const DictData& dict() const { return *std::get<std::shared_ptr<const DictData>>(data_); }
  Object& object() const { return *std::get<std::shared_ptr<Object>>(data_); }
  const std::shared_ptr<Object>& object_ptr() const {
    return std::get<std::shared_ptr<Object>>(data_);
  }
  const Callable& callable() const { return *std::get<std::shared_ptr<const Callable>>(data_); }
  // The message an operation on this undefined value fails with.
  std::string undefined_message() const;

  // Integer value of a bool or int; the value of any number as a double.
  int64_t AsInt() const { return is_bool() ? bool_value() : int_value(); }
  double AsDouble() const;
  // Nesting depth of lists, dicts and namespaces (1 for a flat one, 0 for scalars).
  int Depth() const;
  // Same object (Python `is`) for lists, dicts, objects and callables.
  bool SameObject(const Value& other) const;

  // Python truthiness: undefined, None, False, 0, 0.0, "", [], {} are false.
  bool Truthy() const;
  // Python str(): what `{{ value }}` prints (undefined prints nothing).
  std::string ToString() const;
  // Python repr(): strings quoted, as they appear inside a printed list or dict.
  std::string Repr() const;
  // Python type name for error messages ("str", "NoneType", "dict"...).
  std::string TypeName() const;

  // Throws the error of using an undefined value (this must be undefined).
  [[noreturn]] void ThrowUndefined() const;

 private:
  struct UndefinedData {
    std::shared_ptr<const std::string> hint;
  };
  std::variant<UndefinedData, std::monostate, bool, int64_t, double, std::string,
               std::shared_ptr<const ListData>, std::shared_ptr<const DictData>,
               std::shared_ptr<Object>, std::shared_ptr<const Callable>>
      data_;
};

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
  int depth = 1;
};

struct DictData {
  std::vector<std::pair<Value, Value>> items;
  int depth = 1;
  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const;
};

// Builds a dict, later assignments to a key replacing earlier ones in place (Python dict order).
class DictBuilder {
 public:
  void Set(Value key, Value value);
  Value Build() { return Value::Dict(std::move(items_)); }

 private:
  std::vector<std::pair<Value, Value>> items_;
};

// Lists and dicts nest at most this deep (a cap on recursion in printing, JSON and destruction).
inline constexpr int kMaxValueDepth = 256;

}  // namespace specula::jinja
