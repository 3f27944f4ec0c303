// `specula-cli generate --offline`: runs the engine in this process, no server needed.
#pragma once

namespace specula {

// Streams the generated text to stdout; statistics go to stderr. Returns the exit code.
int GenerateOffline();

}  // namespace specula
