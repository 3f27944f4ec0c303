// The token mask cache keys (TokenMasker) a grammar's stacks can present, found from the grammar
// alone, before any request runs: what TokenMasker::Prepare builds ahead of a grammar's first
// step.
//
// A stack's frames are the references it is inside, bottom first, and its top is a byte symbol.
// The frame below a position of rule R is a reference to R that is not the last symbol of its
// alternative (a last one is a tail call: it replaced its own frame, so the frame below is then
// whatever was below that one), or nothing when R is the root's (the stack's bottom).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "engine/grammar/grammar.h"

namespace specula::grammar {

struct StackKey {
  std::vector<int32_t> frames;  // bottom first; the top is a byte position
  bool whole = false;           // the whole stack, not the top of a longer one
};

// The keys of `frames` frames (or whole stacks of at most that many) of the stacks whose top is
// one of `tops` (byte positions), in their order, at most `max_keys` of them (and fewer for a
// grammar whose stacks can be formed in more than ~65K ways: the search is bounded). A frame
// inside a bounded repetition (Grammar::counted) appears at count `anchor(repeat)` only: the
// others are derived from it.
std::vector<StackKey> StackKeys(const Grammar& g, size_t frames, const std::vector<int32_t>& tops,
                                absl::FunctionRef<int32_t(int32_t)> anchor, size_t max_keys);

}  // namespace specula::grammar
