// The Responses API's routes on the OpenAI listener (docs/CHAT.md, "Responses API"):
// POST /v1/responses (a generation: server/openai_call.h with the Responses protocol),
// GET /v1/responses/{id} and DELETE /v1/responses/{id} (the store).
//
// A stored response's KV stays on the server as a session named by the response's id (unless the
// request names its own session with x-session-id), so a request continuing it reuses that KV
// through the prefix cache and prefills only its new items and the template's glue. Each
// response is its own session, so two requests continuing one response (a branch) are both
// served.
#pragma once

#include <string>
#include <vector>

#include "server/generate_call.h"
#include "server/http_server.h"
#include "server/response_store.h"

namespace specula {

// `env`, `served_model` and `store` outlive the routes and every request they start.
std::vector<HttpRoute> ResponsesRoutes(CallEnv* env, const std::string* served_model,
                                       ResponseStore* store);

}  // namespace specula
