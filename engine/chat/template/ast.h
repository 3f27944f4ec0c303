// The syntax tree the parser builds and the evaluator walks. Plain data: every node records its
// kind and the template line it starts on; filters and tests are resolved to their
// implementations at parse time.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat/template/operators.h"
#include "engine/chat/template/value.h"

namespace specula::jinja {

struct FilterDef;
struct TestDef;

// ---- expressions

struct Expr {
  enum class Kind {
    kLiteral,
    kList,  // list or tuple display
    kDict,
    kName,
    kGetAttr,  // a.b
    kGetItem,  // a[b]
    kSlice,    // a[b:c:d]
    kCall,
    kFilter,
    kTest,
    kNegate,  // -a, +a
    kNot,
    kBinary,
    kAnd,
    kOr,
    kCompare,
    kCondExpr,  // a if b else c
  };
  Expr(Kind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
  const Kind kind;
  const int line;
};
using ExprPtr = std::unique_ptr<Expr>;

struct LiteralExpr : Expr {
  LiteralExpr(int l, Value v) : Expr(Kind::kLiteral, l), value(std::move(v)) {}
  Value value;
};

struct ListExpr : Expr {
  ListExpr(int l, bool t) : Expr(Kind::kList, l), tuple(t) {}
  bool tuple;
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(Kind::kDict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct NameExpr : Expr {
  NameExpr(int l, std::string n) : Expr(Kind::kName, l), name(std::move(n)) {}
  std::string name;
};

struct GetAttrExpr : Expr {
  GetAttrExpr(int l, ExprPtr o, std::string n)
      : Expr(Kind::kGetAttr, l), object(std::move(o)), name(std::move(n)) {}
  ExprPtr object;
  std::string name;
};

struct GetItemExpr : Expr {
  GetItemExpr(int l, ExprPtr o, ExprPtr i)
      : Expr(Kind::kGetItem, l), object(std::move(o)), index(std::move(i)) {}
  ExprPtr object, index;
};

struct SliceExpr : Expr {
  explicit SliceExpr(int l) : Expr(Kind::kSlice, l) {}
  ExprPtr object, start, stop, step;  // null when left out
};

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  ExprPtr star_args, star_kwargs;  // f(*a, **k)
};

struct CallExpr : Expr {
  CallExpr(int l, ExprPtr c) : Expr(Kind::kCall, l), callee(std::move(c)) {}
  ExprPtr callee;
  Arguments args;
};

struct FilterExpr : Expr {
  FilterExpr(int l, std::string n, const FilterDef* f)
      : Expr(Kind::kFilter, l), name(std::move(n)), filter(f) {}
  ExprPtr operand;  // null in `{% filter %}` and `{% set x | f %}` chains: the block's output
  std::string name;
  const FilterDef* filter;
  Arguments args;
};

struct TestExpr : Expr {
  TestExpr(int l, std::string n, const TestDef* t)
      : Expr(Kind::kTest, l), name(std::move(n)), test(t) {}
  ExprPtr operand;
  std::string name;
  const TestDef* test;
  Arguments args;
  bool negated = false;  // `is not`
};

struct UnaryExpr : Expr {
  UnaryExpr(Kind k, int l, ExprPtr o) : Expr(k, l), operand(std::move(o)) {}
  ExprPtr operand;
  bool minus = true;  // kNegate: - or +
};

struct BinaryExpr : Expr {
  BinaryExpr(Kind k, int l, ExprPtr a, ExprPtr b)
      : Expr(k, l), lhs(std::move(a)), rhs(std::move(b)) {}
  BinaryOp op = BinaryOp::kAdd;  // kBinary only (kAnd and kOr short-circuit)
  ExprPtr lhs, rhs;
};

struct CompareExpr : Expr {
  CompareExpr(int l, ExprPtr f) : Expr(Kind::kCompare, l), first(std::move(f)) {}
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;  // a < b < c
};

struct CondExpr : Expr {
  explicit CondExpr(int l) : Expr(Kind::kCondExpr, l) {}
  ExprPtr then, cond, otherwise;  // otherwise null: undefined
};

// ---- assignment targets: x, (a, b), ns.attr

struct Target {
  enum class Kind { kName, kTuple, kNamespaceAttr };
  Kind kind = Kind::kName;
  std::string name;              // kName, kNamespaceAttr (the namespace variable)
  std::string attr;              // kNamespaceAttr
  std::vector<Target> elements;  // kTuple
  int line = 0;
};

// ---- statements

struct Stmt {
  enum class Kind {
    kText,
    kPrint,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kFilterBlock,
    kWith,
    kBreak,
    kContinue,
    kScope,  // {% generation %}: the body, in a scope of its own
  };
  Stmt(Kind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  const Kind kind;
  const int line;
};
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;
using FilterChain = std::vector<std::unique_ptr<FilterExpr>>;  // operands null

struct TextStmt : Stmt {
  TextStmt(int l, std::string t) : Stmt(Kind::kText, l), text(std::move(t)) {}
  std::string text;
};

struct PrintStmt : Stmt {
  PrintStmt(int l, ExprPtr e) : Stmt(Kind::kPrint, l), expr(std::move(e)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(Kind::kIf, l) {}
  std::vector<std::pair<ExprPtr, StmtList>> branches;  // if, elif...
  StmtList else_body;
};

struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(Kind::kFor, l) {}
  Target target;
  ExprPtr iter, filter;  // filter: `for x in xs if cond`, may be null
  StmtList body, else_body;
};

struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(Kind::kSet, l) {}
  Target target;
  ExprPtr value;
};

struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(int l) : Stmt(Kind::kSetBlock, l) {}
  Target target;
  FilterChain filters;
  StmtList body;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(Kind::kMacro, l) {}
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  StmtList body;
  bool uses_varargs = false, uses_kwargs = false;
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(int l) : Stmt(Kind::kFilterBlock, l) {}
  FilterChain filters;
  StmtList body;
};

struct WithStmt : Stmt {
  explicit WithStmt(int l) : Stmt(Kind::kWith, l) {}
  std::vector<std::pair<Target, ExprPtr>> assignments;
  StmtList body;
};

struct ScopeStmt : Stmt {
  explicit ScopeStmt(int l) : Stmt(Kind::kScope, l) {}
  StmtList body;
};

}  // namespace specula::jinja
