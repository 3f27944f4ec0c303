// Strict tool calls (OpenAI's `strict: true` function tools; docs/STRUCTURED_OUTPUT.md): the
// output constraint that holds each call the model writes to its tool's parameters schema.
//
// - tool_choice required / a named function: the server already wrote the call's opening
//   (ChatModel's forced prefix), so the grammar holds from the first token to the call object's
//   closing brace; the model then closes the call and may go on.
// - tool_choice auto, and the calls after a forced one: the grammar holds from each time the model
//   writes the syntax's opening tag (Hermes `<tool_call>`) to the object's closing brace. The
//   Llama 3.1 JSON syntax has no opening tag, so strict tools there need tool_choice required or a
//   named function (else INVALID_ARGUMENT says so).
// Tools that are not strict are still callable: their arguments are any JSON object. The grammars
// are compiled once per distinct set of tools (SharedCompiledConstraints), so an agent's repeated
// tools reuse their masks.
#pragma once

#include "absl/status/statusor.h"
#include "engine/chat/output/chat_output_parser.h"
#include "engine/generate/output_constraint.h"
#include "server/chat.h"

namespace specula {

// Empty when no tool the model sees is strict. `forced_prefix_written`: the rendered prompt ends
// with the forced call's opening (tool_choice required or a function). INVALID_ARGUMENT naming
// the tool for a schema the compiler cannot honour.
absl::StatusOr<ConstraintSpec> StrictToolConstraint(const ChatRequest& request,
                                                    ToolCallSyntax syntax,
                                                    bool forced_prefix_written);

}  // namespace specula
