// Python's operators on Values: ==, ordering, `in`, arithmetic, `~`. Type errors throw
// TemplateError with CPython's wording.
#pragma once

#include <cstddef>
#include <string_view>

#include "engine/chat/template/value.h"

namespace specula::jinja {

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kConcat };
enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

// Python ==.
bool Equals(const Value& a, const Value& b);
// Python <, <=, >, >=, ==, !=, in, not in (chained comparisons are the evaluator's job).
bool Compare(CompareOp op, const Value& a, const Value& b);
// Three-way order for sorting (Python's < in both directions); throws when unorderable.
int Order(const Value& a, const Value& b);
// `item in container`.
bool Contains(const Value& container, const Value& item);
// Arithmetic and concatenation; strings and lists produced are limited to `max_size` bytes
// (items for lists).
Value Binary(BinaryOp op, const Value& a, const Value& b, size_t max_size);
// Unary minus and plus.
Value Negate(const Value& v, bool minus);

// "+", "//", "~"...
std::string_view BinaryOpSymbol(BinaryOp op);

}  // namespace specula::jinja
