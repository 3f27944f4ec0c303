// What a walk of the vocabulary from some stack frames can see of a grammar, written canonically,
// so that walks of different grammars can be shared (SharedMaskEntries).
//
// A token mask cache key (TokenMasker) is a stack's top frames. The walk from it steps through
// the rest of each frame's alternative and through every rule those positions refer to, and
// nothing else: a JSON string's characters look the same from every schema that has one. The
// signature lists those positions in the order a breadth-first search from the frames meets them,
// each with what Step reads of it (kind, bytes, the positions after it and of the alternatives it
// opens, the bounded-repetition count), positions named by that order. Equal signatures mean
// a bijection between the two reachable parts that keeps all of it, so the two walks take the
// same tokens, leave the frames at the same bytes and meet the same counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/types/span.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/matcher.h"

namespace specula::grammar {

// The signature of a walk from `frames` (bottom first; `partial`: the top of a longer stack,
// whose end is an escape, not the sentence's end; `watch`: an anchor's walk, following that
// repetition), or nullopt when more than `max_positions` positions are reachable (a key high in
// a large schema: its walks stay the grammar's own).
std::optional<std::string> WalkSignature(const Grammar& g, absl::Span<const int32_t> frames,
                                         bool partial, const RepeatWatch* watch,
                                         size_t max_positions);

}  // namespace specula::grammar
