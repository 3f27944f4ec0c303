// Watches gRPC core's log lines for a listener that has died. gRPC 1.51 logs "Failed accept4: ..."
// once when an accept fails (out of descriptors) and never accepts on that listener again
// (grpc/grpc#20418), while the rest of the server carries on. Plaintext gRPC has specula's own
// listener (grpc_acceptor.h); with TLS the listener is gRPC's, and this watch lets the server take
// its fatal path instead of answering health "ok" while nobody can connect.
//
// While a watch is installed, gRPC's log lines (errors, by gRPC's default verbosity) go through
// specula's logger as `event=grpc_log`.
#pragma once

#include <functional>
#include <string>

namespace specula {

// `on_listener_failed(message)` runs on whichever gRPC thread logged the failure; it must not
// call into gRPC. One watch per process: a second replaces the first.
void WatchGrpcLogs(std::function<void(const std::string&)> on_listener_failed);
// Removes the watch; gRPC logs to stderr in its own format again.
void StopWatchingGrpcLogs();

}  // namespace specula
