// The `server.send_priority` key: how the thread that writes generated tokens to clients is
// scheduled (server/send_executor.h).
#pragma once

namespace specula {

// idle: SCHED_IDLE, so sends fill the CPU the model leaves free; normal: an ordinary thread.
enum class SendPriority { kIdle, kNormal };

}  // namespace specula
