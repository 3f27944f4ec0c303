#include "engine/chat/template/evaluator.h"

#include <chrono>

#include "engine/chat/template/builtins.h"
#include "engine/chat/template/error.h"
#include "engine/chat/template/objects.h"
#include "engine/chat/template/py_str.h"
#include "engine/chat/template/str_cat.h"

namespace specula::jinja {
namespace {

// Jinja's object_type_repr, for "'dict object' has no attribute 'x'".
std::string ObjectTypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  return v.TypeName() + " object";
}

}  // namespace

// ---- Scope

const Value* Scope::Lookup(std::string_view name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent_.get()) {
    for (const auto& [k, v] : s->vars_) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Scope::Set(std::string_view name, Value value) {
  for (auto& [k, v] : vars_) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  vars_.emplace_back(std::string(name), std::move(value));
}

// ---- guards

class Evaluator::DepthGuard {
 public:
  explicit DepthGuard(Evaluator* ev) : ev_(ev) {
    if (++ev_->depth_ > ev_->options_.max_depth) {
      ThrowRuntime(Cat("maximum recursion depth exceeded (more than ", ev_->options_.max_depth,
                       " nested evaluations)"));
    }
  }
  ~DepthGuard() { --ev_->depth_; }

 private:
  Evaluator* ev_;
};

class Evaluator::ScopeGuard {
 public:
  ScopeGuard(Evaluator* ev, std::shared_ptr<Scope> scope)
      : ev_(ev), saved_(std::exchange(ev->scope_, std::move(scope))) {}
  ~ScopeGuard() { ev_->scope_ = std::move(saved_); }

 private:
  Evaluator* ev_;
  std::shared_ptr<Scope> saved_;
};

Evaluator::Evaluator(const RenderOptions& options, std::shared_ptr<Scope> root)
    : options_(options), scope_(std::move(root)) {}

Evaluator::~Evaluator() {
  for (const auto& scope : macro_scopes_) scope->Clear();
  for (const auto& ns : namespaces_) ns->Clear();
}

std::string Evaluator::Render(const StmtList& body) {
  std::string out;
  Exec(body, out);
  return out;
}

LocalTime Evaluator::Now() const {
  if (options_.now) return options_.now();
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  LocalTime local;
  localtime_r(&t, &local.tm);
  const auto since_second = now - std::chrono::system_clock::from_time_t(t);
  local.microseconds = static_cast<int>(
      std::chrono::duration_cast<std::chrono::microseconds>(since_second).count() % 1000000);
  return local;
}

void Evaluator::Append(std::string& out, std::string_view text) const {
  if (out.size() + text.size() > options_.max_output_bytes) {
    ThrowRuntime(Cat("output larger than the limit of ", options_.max_output_bytes, " bytes"));
  }
  out.append(text);
}

// ---- statements

Evaluator::Flow Evaluator::Exec(const StmtList& body, std::string& out) {
  for (const StmtPtr& s : body) {
    const Flow flow = ExecStmt(*s, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Evaluator::Flow Evaluator::ExecStmt(const Stmt& s, std::string& out) {
  DepthGuard guard(this);
  line_ = s.line;
  switch (s.kind) {
    case Stmt::Kind::kText:
      Append(out, static_cast<const TextStmt&>(s).text);
      break;
    case Stmt::Kind::kPrint:
      Append(out, Eval(*static_cast<const PrintStmt&>(s).expr).ToString());
      break;
    case Stmt::Kind::kIf:
      return ExecIf(static_cast<const IfStmt&>(s), out);
    case Stmt::Kind::kFor:
      return ExecFor(static_cast<const ForStmt&>(s), out);
    case Stmt::Kind::kSet: {
      const auto& set = static_cast<const SetStmt&>(s);
      Assign(set.target, Eval(*set.value));
      break;
    }
    case Stmt::Kind::kSetBlock: {
      const auto& set = static_cast<const SetBlockStmt&>(s);
      Flow flow = Flow::kNormal;
      std::string body = RenderInScope(set.body, &flow);
      if (flow != Flow::kNormal) return flow;  // a break in the block leaves the loop at once
      Assign(set.target, Value::Str(ApplyFilters(set.filters, std::move(body))));
      break;
    }
    case Stmt::Kind::kMacro:
      ExecMacroDef(static_cast<const MacroStmt&>(s));
      break;
    case Stmt::Kind::kFilterBlock: {
      const auto& block = static_cast<const FilterBlockStmt&>(s);
      Flow flow = Flow::kNormal;
      std::string body = RenderInScope(block.body, &flow);
      if (flow != Flow::kNormal) return flow;
      Append(out, ApplyFilters(block.filters, std::move(body)));
      break;
    }
    case Stmt::Kind::kWith: {
      const auto& with = static_cast<const WithStmt&>(s);
      std::vector<Value> values;
      for (const auto& [target, expr] : with.assignments) values.push_back(Eval(*expr));
      ScopeGuard scope(this, std::make_shared<Scope>(scope_));
      for (size_t i = 0; i < values.size(); ++i) Assign(with.assignments[i].first, values[i]);
      return Exec(with.body, out);
    }
    case Stmt::Kind::kBreak:
      return Flow::kBreak;
    case Stmt::Kind::kContinue:
      return Flow::kContinue;
    case Stmt::Kind::kScope: {  // no break or continue inside (the parser sees to it)
      Flow flow = Flow::kNormal;
      Append(out, RenderInScope(static_cast<const ScopeStmt&>(s).body, &flow));
      break;
    }
  }
  return Flow::kNormal;
}

Evaluator::Flow Evaluator::ExecIf(const IfStmt& s, std::string& out) {
  for (const auto& [cond, body] : s.branches) {
    if (Eval(*cond).Truthy()) return Exec(body, out);
  }
  return Exec(s.else_body, out);
}

Evaluator::Flow Evaluator::ExecFor(const ForStmt& s, std::string& out) {
  auto loop = std::make_shared<LoopObject>(LoopItems(s));
  if (loop->items().empty()) {
    ScopeGuard scope(this, std::make_shared<Scope>(scope_));
    return Exec(s.else_body, out);
  }
  const Value loop_value = Value::Obj(loop);
  for (size_t i = 0; i < loop->items().size(); ++i) {
    if (++iterations_ > options_.max_loop_iterations) {
      ThrowRuntime(Cat("more than ", options_.max_loop_iterations, " loop iterations"));
    }
    ScopeGuard scope(this, std::make_shared<Scope>(scope_));
    loop->set_index(i);
    scope_->Set("loop", loop_value);
    Assign(s.target, loop->items()[i]);
    if (Exec(s.body, out) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

// The iterated items, less those the loop's `if` filters out.
std::vector<Value> Evaluator::LoopItems(const ForStmt& s) {
  std::vector<Value> items = IterateValue(Eval(*s.iter));
  if (s.filter == nullptr) return items;
  std::vector<Value> kept;
  for (Value& item : items) {
    ++iterations_;
    ScopeGuard scope(this, std::make_shared<Scope>(scope_));
    Assign(s.target, item);
    if (Eval(*s.filter).Truthy()) kept.push_back(std::move(item));
  }
  return kept;
}

void Evaluator::ExecMacroDef(const MacroStmt& s) {
  macro_scopes_.push_back(scope_);
  scope_->Set(s.name, Value::Func(std::make_shared<Macro>(&s, scope_)));
}

std::string Evaluator::RenderInScope(const StmtList& body, Flow* flow) {
  ScopeGuard scope(this, std::make_shared<Scope>(scope_));
  std::string out;
  *flow = Exec(body, out);
  return out;
}

std::string Evaluator::ApplyFilters(const FilterChain& filters, std::string text) {
  Value v = Value::Str(std::move(text));
  for (const auto& f : filters) v = EvalFilter(*f, v);
  return v.ToString();
}

void Evaluator::Assign(const Target& target, const Value& value) {
  switch (target.kind) {
    case Target::Kind::kName:
      scope_->Set(target.name, value);
      return;
    case Target::Kind::kNamespaceAttr: {
      const Value* ns = scope_->Lookup(target.name);
      if (ns == nullptr || !ns->is_object()) {
        ThrowRuntime("cannot assign attribute on non-namespace object");
      }
      ns->object().SetAttr(target.attr, value);
      return;
    }
    case Target::Kind::kTuple: {
      const std::vector<Value> items = IterateValue(value);
      const size_t n = target.elements.size();
      if (items.size() < n) {
        ThrowRuntime(Cat("not enough values to unpack (expected ", n, ", got ", items.size(), ")"));
      }
      if (items.size() > n) {
        ThrowRuntime(Cat("too many values to unpack (expected ", n, ")"));
      }
      for (size_t i = 0; i < n; ++i) Assign(target.elements[i], items[i]);
      return;
    }
  }
}

Value Evaluator::CallMacro(const MacroStmt& macro, const std::shared_ptr<Scope>& closure,
                           CallArgs& args) {
  DepthGuard guard(this);
  const size_t n = macro.params.size();
  if (args.positional.size() > n && !macro.uses_varargs) {
    ThrowRuntime(Cat("macro '", macro.name, "' takes not more than ", n, " argument(s)"));
  }
  std::vector<const Value*> bound(n, nullptr);
  for (size_t i = 0; i < n && i < args.positional.size(); ++i) bound[i] = &args.positional[i];
  DictBuilder extra_kwargs;
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < n && macro.params[i].first != key) ++i;
    if (i < n && bound[i] != nullptr) {
      ThrowRuntime(Cat("macro '", macro.name, "' got multiple values for argument '", key, "'"));
    }
    if (i < n) {
      bound[i] = &value;
    } else if (macro.uses_kwargs) {
      extra_kwargs.Set(Value::Str(key), value);
    } else {
      ThrowRuntime(Cat("macro '", macro.name, "' takes no keyword argument '", key, "'"));
    }
  }
  ScopeGuard scope(this, std::make_shared<Scope>(closure));
  for (size_t i = 0; i < n; ++i) {
    const auto& [name, fallback] = macro.params[i];
    scope_->Set(name, bound[i] != nullptr ? *bound[i]
                      : fallback          ? Eval(*fallback)
                                 : Value::Undefined("parameter '" + name + "' was not provided"));
  }
  std::vector<Value> extra;
  for (size_t i = n; i < args.positional.size(); ++i) extra.push_back(args.positional[i]);
  scope_->Set("varargs", Value::Tuple(std::move(extra)));
  scope_->Set("kwargs", extra_kwargs.Build());
  std::string out;
  Exec(macro.body, out);
  return Value::Str(std::move(out));
}

// ---- expressions

Value Evaluator::Eval(const Expr& e) {
  DepthGuard guard(this);
  line_ = e.line;
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return static_cast<const LiteralExpr&>(e).value;
    case Expr::Kind::kList:
      return EvalList(static_cast<const ListExpr&>(e));
    case Expr::Kind::kDict:
      return EvalDict(static_cast<const DictExpr&>(e));
    case Expr::Kind::kName:
      return EvalName(static_cast<const NameExpr&>(e));
    case Expr::Kind::kGetAttr: {
      const auto& get = static_cast<const GetAttrExpr&>(e);
      const Value object = Eval(*get.object);
      line_ = e.line;
      return GetAttr(object, get.name);
    }
    case Expr::Kind::kGetItem: {
      const auto& get = static_cast<const GetItemExpr&>(e);
      const Value object = Eval(*get.object);
      const Value key = Eval(*get.index);
      line_ = e.line;
      return GetItem(object, key);
    }
    case Expr::Kind::kSlice:
      return EvalSlice(static_cast<const SliceExpr&>(e));
    case Expr::Kind::kCall:
      return EvalCall(static_cast<const CallExpr&>(e));
    case Expr::Kind::kFilter: {
      const auto& filter = static_cast<const FilterExpr&>(e);
      return EvalFilter(filter, filter.operand ? Eval(*filter.operand) : Value());
    }
    case Expr::Kind::kTest:
      return EvalTest(static_cast<const TestExpr&>(e));
    case Expr::Kind::kNegate: {
      const auto& unary = static_cast<const UnaryExpr&>(e);
      const Value v = Eval(*unary.operand);
      line_ = e.line;
      return Negate(v, unary.minus);
    }
    case Expr::Kind::kNot:
      return Value::Bool(!Eval(*static_cast<const UnaryExpr&>(e).operand).Truthy());
    case Expr::Kind::kBinary:
      return EvalBinary(static_cast<const BinaryExpr&>(e));
    case Expr::Kind::kAnd:
    case Expr::Kind::kOr: {
      const auto& logic = static_cast<const BinaryExpr&>(e);
      Value left = Eval(*logic.lhs);
      if (left.Truthy() == (e.kind == Expr::Kind::kOr)) return left;
      return Eval(*logic.rhs);
    }
    case Expr::Kind::kCompare:
      return EvalCompare(static_cast<const CompareExpr&>(e));
    case Expr::Kind::kCondExpr:
      return EvalCondExpr(static_cast<const CondExpr&>(e));
  }
  return Value();
}

Value Evaluator::EvalList(const ListExpr& e) {
  std::vector<Value> items;
  items.reserve(e.items.size());
  for (const ExprPtr& item : e.items) items.push_back(Eval(*item));
  return e.tuple ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
}

Value Evaluator::EvalDict(const DictExpr& e) {
  DictBuilder dict;
  for (const auto& [key, value] : e.items) {
    Value k = Eval(*key);
    dict.Set(std::move(k), Eval(*value));
  }
  return dict.Build();
}

Value Evaluator::EvalName(const NameExpr& e) {
  if (const Value* v = scope_->Lookup(e.name)) return *v;
  Value global = GetGlobal(e.name);
  if (!global.is_undefined()) return global;
  return Value::Undefined("'" + e.name + "' is undefined");
}

Value Evaluator::EvalSlice(const SliceExpr& e) {
  const Value object = Eval(*e.object);
  auto bound = [&](const ExprPtr& p) -> std::optional<int64_t> {
    if (p == nullptr) return std::nullopt;
    const Value v = Eval(*p);
    if (v.is_none()) return std::nullopt;
    if (!v.is_integral()) ThrowRuntime("slice indices must be integers or None");
    return v.AsInt();
  };
  const auto start = bound(e.start), stop = bound(e.stop), step = bound(e.step);
  line_ = e.line;
  if (object.is_undefined()) object.ThrowUndefined();
  if (object.is_string()) {
    const std::u32string cps = py::Decode(object.str());
    std::u32string out;
    for (int64_t i : py::SliceIndices(static_cast<int64_t>(cps.size()), start, stop, step)) {
      out += cps[i];
    }
    return Value::Str(py::Encode(out));
  }
  if (object.is_list()) {
    const auto& items = object.items();
    std::vector<Value> out;
    for (int64_t i : py::SliceIndices(static_cast<int64_t>(items.size()), start, stop, step)) {
      out.push_back(items[i]);
    }
    return object.is_tuple() ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
  }
  if (object.is_dict()) ThrowRuntime("unhashable type: 'slice'");
  ThrowRuntime("'" + object.TypeName() + "' object is not subscriptable");
}

CallArgs Evaluator::EvalArgs(const Arguments& a) {
  CallArgs args;
  for (const ExprPtr& p : a.positional) args.positional.push_back(Eval(*p));
  if (a.star_args) {
    for (Value& v : IterateValue(Eval(*a.star_args))) args.positional.push_back(std::move(v));
  }
  for (const auto& [key, expr] : a.keyword) args.keyword.emplace_back(key, Eval(*expr));
  if (a.star_kwargs) {
    const Value kw = Eval(*a.star_kwargs);
    if (!kw.is_dict()) ThrowRuntime("argument after ** must be a mapping, not " + kw.TypeName());
    for (const auto& [key, value] : kw.dict().items) {
      if (!key.is_string()) ThrowRuntime("keywords must be strings");
      args.keyword.emplace_back(key.str(), value);
    }
  }
  return args;
}

Value Evaluator::EvalCall(const CallExpr& e) {
  const Value callee = Eval(*e.callee);
  CallArgs args = EvalArgs(e.args);
  line_ = e.line;
  return CallValue(callee, args);
}

Value Evaluator::CallValue(const Value& callee, CallArgs& args) {
  if (callee.is_callable()) return callee.callable().Call(*this, args);
  if (callee.is_undefined()) callee.ThrowUndefined();
  ThrowRuntime("'" + callee.TypeName() + "' object is not callable");
}

Value Evaluator::EvalFilter(const FilterExpr& e, const Value& input) {
  CallArgs args = EvalArgs(e.args);
  line_ = e.line;
  return e.filter->fn(*this, input, args);
}

Value Evaluator::EvalTest(const TestExpr& e) {
  const Value input = Eval(*e.operand);
  CallArgs args = EvalArgs(e.args);
  line_ = e.line;
  return Value::Bool(e.test->fn(*this, input, args) != e.negated);
}

Value Evaluator::CallFilter(std::string_view name, const Value& input, CallArgs& args) {
  const FilterDef* filter = FindFilter(name);
  if (filter == nullptr) ThrowRuntime("unsupported filter '" + std::string(name) + "'");
  return filter->fn(*this, input, args);
}

bool Evaluator::CallTest(std::string_view name, const Value& input, CallArgs& args) {
  const TestDef* test = FindTest(name);
  if (test == nullptr) ThrowRuntime("unsupported test '" + std::string(name) + "'");
  return test->fn(*this, input, args);
}

Value Evaluator::EvalBinary(const BinaryExpr& e) {
  const Value a = Eval(*e.lhs);
  const Value b = Eval(*e.rhs);
  line_ = e.line;
  return Binary(e.op, a, b, options_.max_output_bytes);
}

Value Evaluator::EvalCompare(const CompareExpr& e) {
  Value left = Eval(*e.first);
  for (const auto& [op, expr] : e.rest) {
    Value right = Eval(*expr);
    line_ = e.line;
    if (!Compare(op, left, right)) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

Value Evaluator::EvalCondExpr(const CondExpr& e) {
  if (Eval(*e.cond).Truthy()) return Eval(*e.then);
  if (e.otherwise) return Eval(*e.otherwise);
  return Value::Undefined(Cat("the inline if-expression on line ", e.line,
                              " evaluated to false and no else section was defined."));
}

// ---- attribute and item access

Value Evaluator::GetAttr(const Value& object, std::string_view name) {
  switch (object.kind()) {
    case Value::Kind::kUndefined:
      object.ThrowUndefined();
    case Value::Kind::kDict:
    case Value::Kind::kString:
    case Value::Kind::kList:
      if (std::optional<Value> method = LookupMethod(object, name)) return *method;
      if (object.is_dict()) {
        if (const Value* v = object.dict().Find(name)) return *v;
      }
      break;
    case Value::Kind::kObject: {
      Value v = object.object().GetAttr(name);
      if (!v.is_undefined()) return v;
      break;
    }
    default:
      break;
  }
  return Value::Undefined(Cat("'", ObjectTypeRepr(object), "' has no attribute '", name, "'"));
}

Value Evaluator::GetItem(const Value& object, const Value& key) {
  switch (object.kind()) {
    case Value::Kind::kUndefined:
      object.ThrowUndefined();
    case Value::Kind::kDict:
      if (!key.is_dict() && !(key.is_list() && !key.is_tuple())) {
        if (const Value* v = object.dict().Find(key)) return *v;
      }
      break;
    case Value::Kind::kList:
      if (key.is_integral()) {
        const auto& items = object.items();
        const int64_t i = py::NormalizeIndex(key.AsInt(), static_cast<int64_t>(items.size()));
        if (i >= 0) return items[i];
      }
      break;
    case Value::Kind::kString:
      if (key.is_integral()) {
        const std::u32string cps = py::Decode(object.str());
        const int64_t i = py::NormalizeIndex(key.AsInt(), static_cast<int64_t>(cps.size()));
        if (i >= 0) return Value::Str(py::Encode(cps.substr(i, 1)));
      }
      break;
    case Value::Kind::kObject:
      if (key.is_string()) return GetAttr(object, key.str());
      break;
    default:
      break;
  }
  if (key.is_string()) {
    if (std::optional<Value> method = LookupMethod(object, key.str())) return *method;
    return Value::Undefined(
        Cat("'", ObjectTypeRepr(object), "' has no attribute '", key.str(), "'"));
  }
  return Value::Undefined(ObjectTypeRepr(object) + " has no element " + key.Repr());
}

}  // namespace specula::jinja
