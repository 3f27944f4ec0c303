// The specula-cli commands that call a running specula-server over gRPC (--server HOST:PORT).
// Each returns the process exit code: 0 on success, 2 for INVALID_ARGUMENT (the request was
// wrong), 1 for any other failure, so scripts can tell a bad request from a bad server.
#pragma once

namespace specula {

// Streams the text to stdout as messages arrive; finish reason, usage and speed to stderr.
int GenerateRemote();
// --prompt -> token ids (first line, comma-separated, reusable as --prompt_ids) and strings.
int TokenizeRemote();
// --prompt_ids -> text.
int DetokenizeRemote();
// The model and server limits, one field per line.
int InfoRemote();
// The sessions the server keeps, one tab-separated line each after a header.
int ListSessionsRemote();
// Frees --session_id's KV.
int DeleteSessionRemote();
// Prints the serving status of --service; exit 0 only when SERVING.
int HealthRemote();

}  // namespace specula
