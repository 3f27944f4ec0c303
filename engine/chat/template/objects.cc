#include "engine/chat/template/objects.h"

#include <algorithm>

#include "engine/chat/template/ast.h"
#include "engine/chat/template/error.h"
#include "engine/chat/template/evaluator.h"
#include "engine/chat/template/operators.h"
#include "engine/chat/template/str_cat.h"

namespace specula::jinja {
namespace {

// loop.cycle(...) and loop.changed(...), bound to their loop.
class LoopMethod : public Callable {
 public:
  LoopMethod(std::shared_ptr<LoopObject> loop, bool cycle)
      : loop_(std::move(loop)), cycle_(cycle) {}
  Value Call(Evaluator&, CallArgs& args) const override {
    return cycle_ ? loop_->Cycle(args) : Value::Bool(loop_->Changed(args));
  }
  std::string Repr() const override { return cycle_ ? "<loop.cycle>" : "<loop.changed>"; }

 private:
  std::shared_ptr<LoopObject> loop_;
  bool cycle_;
};

class CyclerMethod : public Callable {
 public:
  CyclerMethod(std::shared_ptr<Cycler> cycler, bool next)
      : cycler_(std::move(cycler)), next_(next) {}
  Value Call(Evaluator&, CallArgs& args) const override {
    if (!args.positional.empty() || !args.keyword.empty())
      ThrowRuntime("cycler methods take no arguments");
    if (next_) return cycler_->Next();
    cycler_->Reset();
    return Value::None();
  }
  std::string Repr() const override { return next_ ? "<cycler.next>" : "<cycler.reset>"; }

 private:
  std::shared_ptr<Cycler> cycler_;
  bool next_;
};

}  // namespace

// ---- Namespace

Value Namespace::GetAttr(std::string_view name) const {
  for (const auto& [k, v] : attrs_) {
    if (k == name) return v;
  }
  return Value();
}

void Namespace::SetAttr(std::string_view name, Value value) {
  depth_ = std::max(depth_, value.Depth() + 1);
  if (depth_ > kMaxValueDepth) {
    ThrowRuntime(Cat("namespaces nest deeper than ", kMaxValueDepth, " levels"));
  }
  for (auto& [k, v] : attrs_) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  attrs_.emplace_back(std::string(name), std::move(value));
}

std::string Namespace::Repr() const {
  std::vector<std::pair<Value, Value>> items;
  for (const auto& [k, v] : attrs_) items.emplace_back(Value::Str(k), v);
  return "<Namespace " + Value::Dict(std::move(items)).Repr() + ">";
}

// ---- LoopObject

Value LoopObject::GetAttr(std::string_view name) const {
  const auto n = static_cast<int64_t>(items_.size());
  const auto i = static_cast<int64_t>(index_);
  if (name == "index") return Value::Int(i + 1);
  if (name == "index0") return Value::Int(i);
  if (name == "revindex") return Value::Int(n - i);
  if (name == "revindex0") return Value::Int(n - i - 1);
  if (name == "first") return Value::Bool(i == 0);
  if (name == "last") return Value::Bool(i == n - 1);
  if (name == "length") return Value::Int(n);
  if (name == "depth") return Value::Int(1);
  if (name == "depth0") return Value::Int(0);
  if (name == "previtem") {
    return i > 0 ? items_[i - 1] : Value::Undefined("there is no previous item");
  }
  if (name == "nextitem") {
    return i + 1 < n ? items_[i + 1] : Value::Undefined("there is no next item");
  }
  if (name == "cycle" || name == "changed") {
    auto self = std::const_pointer_cast<LoopObject>(shared_from_this());
    return Value::Func(std::make_shared<LoopMethod>(std::move(self), name == "cycle"));
  }
  return Value();
}

std::string LoopObject::Repr() const {
  return Cat("<LoopContext ", index_ + 1, "/", items_.size(), ">");
}

Value LoopObject::Cycle(const CallArgs& args) const {
  if (args.positional.empty()) ThrowRuntime("no items for cycling given");
  return args.positional[index_ % args.positional.size()];
}

bool LoopObject::Changed(const CallArgs& args) {
  Value current = Value::Tuple(args.positional);
  if (last_changed_ && Equals(*last_changed_, current)) return false;
  last_changed_ = std::move(current);
  return true;
}

// ---- Cycler, Joiner

Value Cycler::GetAttr(std::string_view name) const {
  if (name == "current") return items_[pos_];
  if (name == "next" || name == "reset") {
    auto self = std::const_pointer_cast<Cycler>(shared_from_this());
    return Value::Func(std::make_shared<CyclerMethod>(std::move(self), name == "next"));
  }
  return Value();
}

Value Cycler::Next() {
  Value current = items_[pos_];
  pos_ = (pos_ + 1) % items_.size();
  return current;
}

Value Joiner::Call(Evaluator&, CallArgs&) const {
  if (!used_) {
    used_ = true;
    return Value::Str("");
  }
  return Value::Str(sep_);
}

// ---- Macro, BoundMethod

Value Macro::Call(Evaluator& ev, CallArgs& args) const {
  return ev.CallMacro(*def_, closure_, args);
}

std::string Macro::Repr() const { return "<Macro " + Value::Str(def_->name).Repr() + ">"; }

std::string BoundMethod::Repr() const {
  return "<built-in method " + name_ + " of " + self_.TypeName() + " object>";
}

}  // namespace specula::jinja
