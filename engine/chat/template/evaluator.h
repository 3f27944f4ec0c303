// Walks the syntax tree: executes statements into an output string and evaluates expressions to
// Values, with Jinja2's scoping (a for-loop iteration, a macro call, `with` and call blocks get a
// scope of their own; `if` does not) and its Undefined semantics. One Evaluator per render.
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/chat/template/ast.h"
#include "engine/chat/template/value.h"

namespace specula::jinja {

// A local date and time, what Python's naive datetime.now() holds.
struct LocalTime {
  std::tm tm{};  // tm_wday and tm_yday filled in too
  int microseconds = 0;
};

struct RenderOptions {
  // strftime_now()'s clock: the current local time by default.
  std::function<LocalTime()> now;
  // Limit on the output and on any string or list the template builds.
  size_t max_output_bytes = 32 << 20;
  // Limit on nested evaluation (macro recursion): a clear error instead of a stack overflow.
  int max_depth = 1000;
  // Limit on loop iterations in one render (a template could loop for very long otherwise).
  int64_t max_loop_iterations = 10'000'000;
};

// Variables visible in one frame; lookups fall back to the enclosing frames.
class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}
  const Value* Lookup(std::string_view name) const;
  void Set(std::string_view name, Value value);
  void Clear() { vars_.clear(); }

 private:
  std::shared_ptr<Scope> parent_;
  std::vector<std::pair<std::string, Value>> vars_;
};

class Evaluator {
 public:
  Evaluator(const RenderOptions& options, std::shared_ptr<Scope> root);
  ~Evaluator();  // breaks reference cycles (macros and their scopes, namespaces)
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  std::string Render(const StmtList& body);

  // ---- for builtins
  Value Eval(const Expr& e);
  Value CallValue(const Value& callee, CallArgs& args);
  Value CallFilter(std::string_view name, const Value& input, CallArgs& args);
  bool CallTest(std::string_view name, const Value& input, CallArgs& args);
  // Jinja's environment.getattr (`a.b`) and getitem (`a[b]`).
  Value GetAttr(const Value& object, std::string_view name);
  Value GetItem(const Value& object, const Value& key);
  Value CallMacro(const MacroStmt& macro, const std::shared_ptr<Scope>& closure, CallArgs& args);
  // Namespaces are emptied when the render ends, which frees any cycle they are part of.
  void TrackNamespace(std::shared_ptr<Object> ns) { namespaces_.push_back(std::move(ns)); }
  LocalTime Now() const;
  size_t max_size() const { return options_.max_output_bytes; }
  int line() const { return line_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  class DepthGuard;
  class ScopeGuard;

  Flow Exec(const StmtList& body, std::string& out);
  Flow ExecStmt(const Stmt& s, std::string& out);
  Flow ExecIf(const IfStmt& s, std::string& out);
  Flow ExecFor(const ForStmt& s, std::string& out);
  std::vector<Value> LoopItems(const ForStmt& s);
  void ExecMacroDef(const MacroStmt& s);
  std::string RenderInScope(const StmtList& body, Flow* flow);
  std::string ApplyFilters(const FilterChain& filters, std::string text);
  void Assign(const Target& target, const Value& value);
  void Append(std::string& out, std::string_view text) const;

  Value EvalList(const ListExpr& e);
  Value EvalDict(const DictExpr& e);
  Value EvalName(const NameExpr& e);
  Value EvalSlice(const SliceExpr& e);
  Value EvalCall(const CallExpr& e);
  Value EvalFilter(const FilterExpr& e, const Value& input);
  Value EvalTest(const TestExpr& e);
  Value EvalBinary(const BinaryExpr& e);
  Value EvalCompare(const CompareExpr& e);
  Value EvalCondExpr(const CondExpr& e);
  CallArgs EvalArgs(const Arguments& a);

  const RenderOptions& options_;
  std::shared_ptr<Scope> scope_;
  std::vector<std::shared_ptr<Scope>> macro_scopes_;
  std::vector<std::shared_ptr<Object>> namespaces_;
  int depth_ = 0;
  int line_ = 0;
  int64_t iterations_ = 0;
};

}  // namespace specula::jinja
