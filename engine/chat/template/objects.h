// The objects and callables a render creates: namespace(), the `loop` variable, cycler(),
// joiner(), macros, built-in functions and bound methods.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/chat/template/value.h"

namespace specula::jinja {

struct MacroStmt;
class Scope;

class Namespace : public Object {
 public:
  std::string TypeName() const override { return "Namespace"; }
  Value GetAttr(std::string_view name) const override;
  void SetAttr(std::string_view name, Value value) override;
  std::string Repr() const override;
  void Clear() override { attrs_.clear(); }
  int Depth() const override { return depth_; }

 private:
  std::vector<std::pair<std::string, Value>> attrs_;
  int depth_ = 1;
};

class LoopObject : public Object, public std::enable_shared_from_this<LoopObject> {
 public:
  explicit LoopObject(std::vector<Value> items) : items_(std::move(items)) {}
  const std::vector<Value>& items() const { return items_; }
  void set_index(size_t i) { index_ = i; }
  std::string TypeName() const override { return "LoopContext"; }
  Value GetAttr(std::string_view name) const override;
  std::string Repr() const override;
  void Clear() override { items_.clear(); }
  // loop.cycle(a, b...) and loop.changed(x...).
  Value Cycle(const CallArgs& args) const;
  bool Changed(const CallArgs& args);

 private:
  std::vector<Value> items_;
  size_t index_ = 0;
  std::optional<Value> last_changed_;
};

class Cycler : public Object, public std::enable_shared_from_this<Cycler> {
 public:
  explicit Cycler(std::vector<Value> items) : items_(std::move(items)) {}
  std::string TypeName() const override { return "Cycler"; }
  Value GetAttr(std::string_view name) const override;
  void Clear() override { items_.clear(); }
  Value Next();
  void Reset() { pos_ = 0; }

 private:
  std::vector<Value> items_;
  size_t pos_ = 0;
};

class Joiner : public Callable {
 public:
  explicit Joiner(std::string sep) : sep_(std::move(sep)) {}
  Value Call(Evaluator& ev, CallArgs& args) const override;
  std::string Repr() const override { return "<Joiner>"; }

 private:
  std::string sep_;
  mutable bool used_ = false;
};

class Macro : public Callable {
 public:
  Macro(const MacroStmt* def, std::shared_ptr<Scope> closure)
      : def_(def), closure_(std::move(closure)) {}
  Value Call(Evaluator& ev, CallArgs& args) const override;
  std::string Repr() const override;

 private:
  const MacroStmt* def_;
  std::shared_ptr<Scope> closure_;
};

using BuiltinFn = Value (*)(Evaluator& ev, CallArgs& args);

class BuiltinFunction : public Callable {
 public:
  BuiltinFunction(std::string_view name, BuiltinFn fn) : name_(name), fn_(fn) {}
  Value Call(Evaluator& ev, CallArgs& args) const override { return fn_(ev, args); }
  std::string Repr() const override { return "<built-in function " + name_ + ">"; }

 private:
  std::string name_;
  BuiltinFn fn_;
};

using MethodFn = Value (*)(Evaluator& ev, const Value& self, CallArgs& args);

class BoundMethod : public Callable {
 public:
  BoundMethod(Value self, std::string_view name, MethodFn fn)
      : self_(std::move(self)), name_(name), fn_(fn) {}
  Value Call(Evaluator& ev, CallArgs& args) const override { return fn_(ev, self_, args); }
  std::string Repr() const override;

 private:
  Value self_;
  std::string name_;
  MethodFn fn_;
};

}  // namespace specula::jinja
