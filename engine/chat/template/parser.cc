#include "engine/chat/template/parser.h"

#include <set>
#include <utility>

#include "engine/chat/template/builtins.h"
#include "engine/chat/template/error.h"
#include "engine/chat/template/str_cat.h"

namespace specula::jinja {
namespace {

using Names = std::vector<std::string_view>;

bool IsCompareOperator(std::string_view op, CompareOp* out) {
  static constexpr std::pair<std::string_view, CompareOp> kOps[] = {
      {"==", CompareOp::kEq}, {"!=", CompareOp::kNe}, {"<", CompareOp::kLt},
      {"<=", CompareOp::kLe}, {">", CompareOp::kGt},  {">=", CompareOp::kGe}};
  for (const auto& [text, op_value] : kOps) {
    if (text == op) {
      *out = op_value;
      return true;
    }
  }
  return false;
}

std::string Quoted(const Names& names) {
  std::string out;
  for (std::string_view n : names) out += Cat(out.empty() ? "" : " or ", "'", n, "'");
  return out;
}

ExprPtr Literal(int line, Value v) { return std::make_unique<LiteralExpr>(line, std::move(v)); }

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  StmtList Run() {
    StmtList body = Subparse({});
    CheckCalledNames();
    return body;
  }

 private:
  // Raises the nesting depth for its lifetime; fails past kMaxParseDepth.
  class Nest {
   public:
    explicit Nest(Parser* p) : p_(p) { p_->CheckDepth(++p_->depth_); }
    ~Nest() { --p_->depth_; }

   private:
    Parser* p_;
  };

  struct Subscript {
    ExprPtr index;
    bool is_slice = false;
    ExprPtr start, stop, step;
  };

  // ---- token stream
  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  Token& Next() {
    Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool IsOp(std::string_view op) const {
    return Cur().type == TokenType::kOperator && Cur().value == op;
  }
  bool IsName(std::string_view name) const {
    return Cur().type == TokenType::kName && Cur().value == name;
  }
  bool IsNameIn(const Names& names) const {
    if (Cur().type != TokenType::kName) return false;
    for (std::string_view n : names) {
      if (Cur().value == n) return true;
    }
    return false;
  }
  bool SkipOp(std::string_view op) { return IsOp(op) ? (Next(), true) : false; }
  bool SkipName(std::string_view name) { return IsName(name) ? (Next(), true) : false; }
  void ExpectOp(std::string_view op) {
    if (!SkipOp(op)) Fail(Cat("expected token '", op, "', got ", DescribeToken(Cur())));
  }
  void Expect(TokenType type, std::string_view what) {
    if (Cur().type != type) Fail(Cat("expected ", what, ", got ", DescribeToken(Cur())));
    Next();
  }
  std::string ExpectName() {
    if (Cur().type != TokenType::kName) {
      Fail("expected token 'name', got " + DescribeToken(Cur()));
    }
    return Next().value;
  }
  [[noreturn]] void Fail(std::string message, int line = -1) const {
    ThrowSyntax(std::move(message), line < 0 ? Cur().line : line);
  }
  void CheckDepth(int depth) const {
    if (depth > kMaxParseDepth) {
      Fail(Cat("template nested deeper than ", kMaxParseDepth, " levels"));
    }
  }

  // ---- statements
  StmtList Subparse(const Names& end_names) {
    StmtList body;
    while (Cur().type != TokenType::kEof) {
      const int line = Cur().line;
      if (Cur().type == TokenType::kData) {
        body.push_back(std::make_unique<TextStmt>(line, std::move(Next().value)));
      } else if (Cur().type == TokenType::kVariableBegin) {
        Next();
        body.push_back(std::make_unique<PrintStmt>(line, ParseTuple(false, true, {}, false)));
        Expect(TokenType::kVariableEnd, "end of print statement");
      } else if (Cur().type == TokenType::kBlockBegin) {
        Next();
        if (IsNameIn(end_names)) return body;
        ParseStatement(&body);
        Expect(TokenType::kBlockEnd, "end of statement block");
      } else {
        Fail("unexpected " + DescribeToken(Cur()));
      }
    }
    return body;
  }

  // Jinja's parse_statements: the rest of the tag, then the body up to one of `end_names`.
  StmtList ParseBody(Names end_names, bool drop_needle) {
    SkipOp(":");
    Expect(TokenType::kBlockEnd, "end of statement block");
    end_stack_.push_back(end_names);
    StmtList body = Subparse(end_names);
    end_stack_.pop_back();
    if (Cur().type == TokenType::kEof) {
      Fail("unexpected end of template, expected " + Quoted(end_names));
    }
    if (drop_needle) Next();
    return body;
  }

  void ParseStatement(StmtList* out) {
    Nest nest(this);
    if (Cur().type != TokenType::kName) Fail("tag name expected");
    const std::string name = Cur().value;
    if (name == "if") return out->push_back(ParseIf());
    if (name == "for") return out->push_back(ParseFor());
    if (name == "set") return out->push_back(ParseSet());
    if (name == "macro") return out->push_back(ParseMacro());
    if (name == "filter") return out->push_back(ParseFilterBlock());
    if (name == "with") return out->push_back(ParseWith());
    if (name == "generation") return out->push_back(ParseScope({"endgeneration"}));
    if (name == "break" || name == "continue") return out->push_back(ParseLoopControl());
    if (name == "print") return ParsePrint(out);
    if (name.starts_with("end") || name == "else" || name == "elif") {
      std::string message = "unexpected '" + name + "'";
      if (!end_stack_.empty()) message += Cat(" (expected ", Quoted(end_stack_.back()), ")");
      Fail(message);
    }
    Fail("unsupported statement '" + name + "'");
  }

  StmtPtr ParseIf() {
    auto node = std::make_unique<IfStmt>(Next().line);
    while (true) {
      ExprPtr test = ParseTuple(false, false, {}, false);
      node->branches.emplace_back(std::move(test), ParseBody({"elif", "else", "endif"}, false));
      const std::string tag = Next().value;
      if (tag == "elif") continue;
      if (tag == "else") node->else_body = ParseBody({"endif"}, true);
      return node;
    }
  }

  StmtPtr ParseFor() {
    auto node = std::make_unique<ForStmt>(Next().line);
    node->target = ParseAssignTarget(false, {"in"});
    if (!SkipName("in")) Fail("expected token 'in', got " + DescribeToken(Cur()));
    node->iter = ParseTuple(false, false, {"recursive"}, false);
    if (SkipName("if")) node->filter = ParseExpression(true);
    if (IsName("recursive")) Fail("unsupported: recursive for loops");
    ++loop_depth_;
    node->body = ParseBody({"endfor", "else"}, false);
    --loop_depth_;
    if (Next().value == "else") node->else_body = ParseBody({"endfor"}, true);
    return node;
  }

  StmtPtr ParseSet() {
    const int line = Next().line;
    Target target = ParseAssignTarget(true, {});
    if (SkipOp("=")) {
      auto node = std::make_unique<SetStmt>(line);
      node->target = std::move(target);
      node->value = ParseTuple(false, true, {}, false);
      return node;
    }
    auto node = std::make_unique<SetBlockStmt>(line);
    node->target = std::move(target);
    while (SkipOp("|")) node->filters.push_back(ParseOneFilter());
    node->body = ParseBody({"endset"}, true);
    return node;
  }

  StmtPtr ParseMacro() {
    auto node = std::make_unique<MacroStmt>(Next().line);
    node->name = ParseNameOnly();
    ExpectOp("(");
    bool seen_default = false;
    while (!IsOp(")")) {
      if (!node->params.empty()) ExpectOp(",");
      std::string param = ParseNameOnly();
      ExprPtr fallback;
      if (SkipOp("=")) {
        fallback = ParseExpression(true);
        seen_default = true;
      } else if (seen_default) {
        Fail("non-default argument follows default argument");
      }
      node->params.emplace_back(std::move(param), std::move(fallback));
    }
    ExpectOp(")");
    macro_stack_.push_back(node.get());
    const int saved_loop_depth = std::exchange(loop_depth_, 0);
    node->body = ParseBody({"endmacro"}, true);
    loop_depth_ = saved_loop_depth;
    macro_stack_.pop_back();
    return node;
  }

  StmtPtr ParseFilterBlock() {
    auto node = std::make_unique<FilterBlockStmt>(Next().line);
    node->filters.push_back(ParseOneFilter());
    while (SkipOp("|")) node->filters.push_back(ParseOneFilter());
    node->body = ParseBody({"endfilter"}, true);
    return node;
  }

  StmtPtr ParseWith() {
    auto node = std::make_unique<WithStmt>(Next().line);
    while (Cur().type != TokenType::kBlockEnd) {
      if (!node->assignments.empty()) ExpectOp(",");
      Target target = ParseAssignTarget(false, {});
      ExpectOp("=");
      node->assignments.emplace_back(std::move(target), ParseExpression(true));
    }
    node->body = ParseBody({"endwith"}, true);
    return node;
  }

  // {% generation %}: rendered unchanged, in a scope of its own (a call block in Jinja).
  StmtPtr ParseScope(Names end_names) {
    auto node = std::make_unique<ScopeStmt>(Next().line);
    const int saved_loop_depth = std::exchange(loop_depth_, 0);
    node->body = ParseBody(std::move(end_names), true);
    loop_depth_ = saved_loop_depth;
    return node;
  }

  StmtPtr ParseLoopControl() {
    const Token& t = Next();
    if (loop_depth_ == 0) Fail("'" + t.value + "' outside loop", t.line);
    return std::make_unique<Stmt>(t.value == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue,
                                  t.line);
  }

  void ParsePrint(StmtList* out) {
    const int line = Next().line;
    for (bool first = true; Cur().type != TokenType::kBlockEnd; first = false) {
      if (!first) ExpectOp(",");
      out->push_back(std::make_unique<PrintStmt>(line, ParseExpression(true)));
    }
  }

  // ---- assignment targets
  Target ParseAssignTarget(bool with_namespace, Names extra_end) {
    if (with_namespace && Cur().type == TokenType::kName && Look().type == TokenType::kOperator &&
        Look().value == ".") {
      Target t;
      t.kind = Target::Kind::kNamespaceAttr;
      t.line = Cur().line;
      t.name = Next().value;
      Next();
      t.attr = ExpectName();
      return t;
    }
    return ToTarget(*ParseTuple(true, false, extra_end, false));
  }

  Target ToTarget(const Expr& e) {
    Target t;
    t.line = e.line;
    if (e.kind == Expr::Kind::kName) {
      t.name = static_cast<const NameExpr&>(e).name;
      bound_names_.insert(t.name);
      return t;
    }
    if (e.kind == Expr::Kind::kList && static_cast<const ListExpr&>(e).tuple) {
      t.kind = Target::Kind::kTuple;
      for (const ExprPtr& item : static_cast<const ListExpr&>(e).items) {
        t.elements.push_back(ToTarget(*item));
      }
      return t;
    }
    Fail("can't assign to this expression", e.line);
  }

  std::string ParseNameOnly() {
    const int line = Cur().line;
    std::string name = ExpectName();
    for (std::string_view reserved : {"true", "false", "none", "True", "False", "None"}) {
      if (name == reserved) Fail("can't assign to '" + name + "'", line);
    }
    bound_names_.insert(name);
    return name;
  }

  // ---- expressions, lowest precedence first
  ExprPtr ParseTuple(bool simplified, bool with_condexpr, const Names& extra_end,
                     bool explicit_parentheses) {
    const int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) ExpectOp(",");
      if (IsTupleEnd(extra_end)) break;
      items.push_back(simplified ? ParsePrimary() : ParseExpression(with_condexpr));
      if (!IsOp(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) Fail("expected an expression, got " + DescribeToken(Cur()));
    }
    auto tuple = std::make_unique<ListExpr>(line, true);
    tuple->items = std::move(items);
    return tuple;
  }

  bool IsTupleEnd(const Names& extra_end) const {
    return Cur().type == TokenType::kVariableEnd || Cur().type == TokenType::kBlockEnd ||
           IsOp(")") || IsNameIn(extra_end);
  }

  ExprPtr ParseExpression(bool with_condexpr) {
    Nest nest(this);
    return with_condexpr ? ParseCondExpr() : ParseOr();
  }

  ExprPtr ParseCondExpr() {
    Nest nest(this);
    const int line = Cur().line;
    ExprPtr expr = ParseOr();
    while (SkipName("if")) {
      auto node = std::make_unique<CondExpr>(line);
      node->then = std::move(expr);
      node->cond = ParseOr();
      if (SkipName("else")) node->otherwise = ParseCondExpr();
      expr = std::move(node);
    }
    return expr;
  }

  ExprPtr ParseOr() { return ParseLogical("or", Expr::Kind::kOr, &Parser::ParseAnd); }
  ExprPtr ParseAnd() { return ParseLogical("and", Expr::Kind::kAnd, &Parser::ParseNot); }

  ExprPtr ParseLogical(std::string_view word, Expr::Kind kind, ExprPtr (Parser::*operand)()) {
    const int line = Cur().line;
    ExprPtr left = (this->*operand)();
    for (int n = 1; SkipName(word); ++n) {
      CheckDepth(depth_ + n);
      left = std::make_unique<BinaryExpr>(kind, line, std::move(left), (this->*operand)());
    }
    return left;
  }

  ExprPtr ParseNot() {
    if (!IsName("not")) return ParseCompare();
    Nest nest(this);
    const int line = Next().line;
    return std::make_unique<UnaryExpr>(Expr::Kind::kNot, line, ParseNot());
  }

  ExprPtr ParseCompare() {
    const int line = Cur().line;
    ExprPtr first = ParseMath1();
    std::vector<std::pair<CompareOp, ExprPtr>> rest;
    while (true) {
      CompareOp op;
      if (Cur().type == TokenType::kOperator && IsCompareOperator(Cur().value, &op)) {
        Next();
      } else if (SkipName("in")) {
        op = CompareOp::kIn;
      } else if (IsName("not") && Look().type == TokenType::kName && Look().value == "in") {
        Next();
        Next();
        op = CompareOp::kNotIn;
      } else {
        break;
      }
      CheckDepth(depth_ + static_cast<int>(rest.size()));
      rest.emplace_back(op, ParseMath1());
    }
    if (rest.empty()) return first;
    auto node = std::make_unique<CompareExpr>(line, std::move(first));
    node->rest = std::move(rest);
    return node;
  }

  // Left-associative binary operators: `operand (op operand)*`.
  ExprPtr ParseBinaryChain(std::initializer_list<std::pair<std::string_view, BinaryOp>> ops,
                           ExprPtr (Parser::*operand)()) {
    const int line = Cur().line;
    ExprPtr left = (this->*operand)();
    for (int n = 1;; ++n) {
      const BinaryOp* op = nullptr;
      for (const auto& [text, value] : ops) {
        if (IsOp(text)) op = &value;
      }
      if (op == nullptr) return left;
      Next();
      CheckDepth(depth_ + n);
      auto node = std::make_unique<BinaryExpr>(Expr::Kind::kBinary, line, std::move(left),
                                               (this->*operand)());
      node->op = *op;
      left = std::move(node);
    }
  }

  ExprPtr ParseMath1() {
    return ParseBinaryChain({{"+", BinaryOp::kAdd}, {"-", BinaryOp::kSub}}, &Parser::ParseConcat);
  }
  ExprPtr ParseConcat() {
    return ParseBinaryChain({{"~", BinaryOp::kConcat}}, &Parser::ParseMath2);
  }
  ExprPtr ParseMath2() {
    return ParseBinaryChain({{"*", BinaryOp::kMul},
                             {"/", BinaryOp::kDiv},
                             {"//", BinaryOp::kFloorDiv},
                             {"%", BinaryOp::kMod}},
                            &Parser::ParsePow);
  }
  ExprPtr ParsePow() { return ParseBinaryChain({{"**", BinaryOp::kPow}}, &Parser::ParseUnaryF); }
  ExprPtr ParseUnaryF() { return ParseUnary(true); }

  ExprPtr ParseUnary(bool with_filter) {
    Nest nest(this);
    const int line = Cur().line;
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const bool minus = IsOp("-");
      Next();
      auto unary = std::make_unique<UnaryExpr>(Expr::Kind::kNegate, line, ParseUnary(false));
      unary->minus = minus;
      node = std::move(unary);
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    return with_filter ? ParseFilterExpr(std::move(node)) : std::move(node);
  }

  ExprPtr ParsePrimary() {
    Nest nest(this);
    const Token& t = Cur();
    const int line = t.line;
    switch (t.type) {
      case TokenType::kName:
        return ParseNameOrConstant();
      case TokenType::kString: {
        std::string s = Next().value;
        while (Cur().type == TokenType::kString) s += Next().value;
        return Literal(line, Value::Str(std::move(s)));
      }
      case TokenType::kInteger:
        return Literal(line, Value::Int(Next().int_value));
      case TokenType::kFloat:
        return Literal(line, Value::Float(Next().float_value));
      default:
        break;
    }
    if (SkipOp("(")) {
      ExprPtr e = ParseTuple(false, true, {}, true);
      ExpectOp(")");
      return e;
    }
    if (IsOp("[")) return ParseList();
    if (IsOp("{")) return ParseDict();
    Fail("unexpected " + DescribeToken(t));
  }

  ExprPtr ParseNameOrConstant() {
    const Token& t = Next();
    if (t.value == "true" || t.value == "True") return Literal(t.line, Value::Bool(true));
    if (t.value == "false" || t.value == "False") return Literal(t.line, Value::Bool(false));
    if (t.value == "none" || t.value == "None") return Literal(t.line, Value::None());
    if (!macro_stack_.empty() && t.value == "varargs") macro_stack_.back()->uses_varargs = true;
    if (!macro_stack_.empty() && t.value == "kwargs") macro_stack_.back()->uses_kwargs = true;
    return std::make_unique<NameExpr>(t.line, t.value);
  }

  ExprPtr ParseList() {
    auto node = std::make_unique<ListExpr>(Next().line, false);
    while (!IsOp("]")) {
      if (!node->items.empty()) ExpectOp(",");
      if (IsOp("]")) break;
      node->items.push_back(ParseExpression(true));
    }
    ExpectOp("]");
    return node;
  }

  ExprPtr ParseDict() {
    auto node = std::make_unique<DictExpr>(Next().line);
    while (!IsOp("}")) {
      if (!node->items.empty()) ExpectOp(",");
      if (IsOp("}")) break;
      ExprPtr key = ParseExpression(true);
      ExpectOp(":");
      node->items.emplace_back(std::move(key), ParseExpression(true));
    }
    ExpectOp("}");
    return node;
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    for (int n = 1;; ++n) {
      CheckDepth(depth_ + n);
      if (IsOp(".") || IsOp("[")) {
        node = ParseSubscript(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    for (int n = 1;; ++n) {
      CheckDepth(depth_ + n);
      if (IsOp("|")) {
        node = ParseFilter(std::move(node));
      } else if (IsName("is")) {
        node = ParseTest(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr node) {
    const Token& t = Next();
    if (t.value == ".") {
      const Token& attr = Next();
      if (attr.type == TokenType::kName) {
        return std::make_unique<GetAttrExpr>(t.line, std::move(node), attr.value);
      }
      if (attr.type != TokenType::kInteger) Fail("expected name or number", attr.line);
      return std::make_unique<GetItemExpr>(t.line, std::move(node),
                                           Literal(attr.line, Value::Int(attr.int_value)));
    }
    std::vector<Subscript> subs;
    while (!IsOp("]")) {
      if (!subs.empty()) ExpectOp(",");
      subs.push_back(ParseSubscribed());
    }
    ExpectOp("]");
    if (subs.empty()) Fail("expected subscript expression", t.line);
    if (subs.size() == 1 && subs[0].is_slice) {
      auto slice = std::make_unique<SliceExpr>(t.line);
      slice->object = std::move(node);
      slice->start = std::move(subs[0].start);
      slice->stop = std::move(subs[0].stop);
      slice->step = std::move(subs[0].step);
      return slice;
    }
    if (subs.size() == 1) {
      return std::make_unique<GetItemExpr>(t.line, std::move(node), std::move(subs[0].index));
    }
    auto key = std::make_unique<ListExpr>(t.line, true);
    for (Subscript& s : subs) {
      if (s.is_slice) Fail("unsupported: slices inside a tuple subscript", t.line);
      key->items.push_back(std::move(s.index));
    }
    return std::make_unique<GetItemExpr>(t.line, std::move(node), std::move(key));
  }

  Subscript ParseSubscribed() {
    Subscript s;
    if (SkipOp(":")) {
      s.is_slice = true;
    } else {
      ExprPtr e = ParseExpression(true);
      if (!SkipOp(":")) {
        s.index = std::move(e);
        return s;
      }
      s.is_slice = true;
      s.start = std::move(e);
    }
    if (!IsOp(":") && !IsOp("]") && !IsOp(",")) s.stop = ParseExpression(true);
    if (SkipOp(":") && !IsOp("]") && !IsOp(",")) s.step = ParseExpression(true);
    return s;
  }

  ExprPtr ParseCall(ExprPtr callee) {
    const int line = Cur().line;
    if (callee->kind == Expr::Kind::kName) {
      called_names_.emplace_back(static_cast<const NameExpr&>(*callee).name, line);
    } else if (callee->kind == Expr::Kind::kGetAttr) {
      const std::string& name = static_cast<const GetAttrExpr&>(*callee).name;
      if (!IsMethodName(name)) Fail("unsupported method '" + name + "'", line);
    }
    auto call = std::make_unique<CallExpr>(line, std::move(callee));
    call->args = ParseCallArgs();
    return call;
  }

  Arguments ParseCallArgs() {
    const int line = Cur().line;
    ExpectOp("(");
    Arguments a;
    auto ensure = [&](bool ok) {
      if (!ok) Fail("invalid syntax for function call expression", line);
    };
    for (bool need_comma = false; !IsOp(")"); need_comma = true) {
      if (need_comma) {
        ExpectOp(",");
        if (IsOp(")")) break;
      }
      if (SkipOp("*")) {
        ensure(!a.star_args && !a.star_kwargs);
        a.star_args = ParseExpression(true);
      } else if (SkipOp("**")) {
        ensure(!a.star_kwargs);
        a.star_kwargs = ParseExpression(true);
      } else if (Cur().type == TokenType::kName && Look().type == TokenType::kOperator &&
                 Look().value == "=") {
        ensure(!a.star_kwargs);
        std::string key = Next().value;
        Next();
        a.keyword.emplace_back(std::move(key), ParseExpression(true));
      } else {
        ensure(!a.star_args && !a.star_kwargs && a.keyword.empty());
        a.positional.push_back(ParseExpression(true));
      }
    }
    ExpectOp(")");
    return a;
  }

  ExprPtr ParseFilter(ExprPtr node) {
    for (int n = 1; SkipOp("|"); ++n) {
      CheckDepth(depth_ + n);
      std::unique_ptr<FilterExpr> filter = ParseOneFilter();
      filter->operand = std::move(node);
      node = std::move(filter);
    }
    return node;
  }

  std::string ParseDottedName() {
    std::string name = ExpectName();
    while (SkipOp(".")) name += "." + ExpectName();
    return name;
  }

  std::unique_ptr<FilterExpr> ParseOneFilter() {
    const int line = Cur().line;
    std::string name = ParseDottedName();
    const FilterDef* def = FindFilter(name);
    if (def == nullptr) Fail("unsupported filter '" + name + "'", line);
    auto filter = std::make_unique<FilterExpr>(line, std::move(name), def);
    if (IsOp("(")) filter->args = ParseCallArgs();
    CheckNamedFunctionArg(*filter);
    return filter;
  }

  // map('upper'), select('odd'), selectattr('x', 'defined'): the named filter or test must
  // exist too when it is a literal.
  void CheckNamedFunctionArg(const FilterExpr& f) {
    const bool map = f.name == "map";
    const bool select = f.name == "select" || f.name == "reject";
    const bool selectattr = f.name == "selectattr" || f.name == "rejectattr";
    const size_t index = selectattr ? 1 : 0;
    if ((!map && !select && !selectattr) || f.args.positional.size() <= index) return;
    const Expr& arg = *f.args.positional[index];
    if (arg.kind != Expr::Kind::kLiteral) return;
    const Value& v = static_cast<const LiteralExpr&>(arg).value;
    if (!v.is_string()) return;
    if (map && FindFilter(v.str()) == nullptr) Fail("unsupported filter '" + v.str() + "'", f.line);
    if (!map && FindTest(v.str()) == nullptr) Fail("unsupported test '" + v.str() + "'", f.line);
  }

  ExprPtr ParseTest(ExprPtr node) {
    const int line = Next().line;
    const bool negated = SkipName("not");
    const int name_line = Cur().line;
    std::string name = ParseDottedName();
    const TestDef* def = FindTest(name);
    if (def == nullptr) Fail("unsupported test '" + name + "'", name_line);
    auto test = std::make_unique<TestExpr>(line, std::move(name), def);
    test->negated = negated;
    test->operand = std::move(node);
    if (IsOp("(")) {
      test->args = ParseCallArgs();
    } else if (IsTestArgumentStart()) {
      if (IsName("is")) Fail("You cannot chain multiple tests with is");
      test->args.positional.push_back(ParsePostfix(ParsePrimary()));
    }
    return test;
  }

  // `x is divisibleby 3`: a test takes one argument without parentheses.
  bool IsTestArgumentStart() const {
    switch (Cur().type) {
      case TokenType::kName:
        return !IsName("else") && !IsName("or") && !IsName("and");
      case TokenType::kString:
      case TokenType::kInteger:
      case TokenType::kFloat:
        return true;
      default:
        return IsOp("[") || IsOp("{");
    }
  }

  // Called names must be global functions or names the template binds (macros mostly).
  void CheckCalledNames() const {
    for (const auto& [name, line] : called_names_) {
      if (!IsGlobalFunction(name) && !bound_names_.contains(name)) {
        Fail("unsupported function '" + name + "'", line);
      }
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<Names> end_stack_;
  std::vector<MacroStmt*> macro_stack_;
  std::set<std::string, std::less<>> bound_names_;
  std::vector<std::pair<std::string, int>> called_names_;
};

}  // namespace

StmtList ParseTemplate(std::string_view source, const LexerOptions& options) {
  return Parser(Tokenize(source, options)).Run();
}

}  // namespace specula::jinja
