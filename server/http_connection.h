// Internal to the HTTP listener: one accepted connection, served until it closes. Each runs as a
// coroutine on its socket's strand: the TLS handshake (HTTPS), then for each request the head
// (parsed by Boost.Beast, which refuses ambiguous framing itself and never writes), specula's
// checks on it before any body is read, the body, the route, and the answer (whole, or streamed
// in chunks while the route writes). Deadlines shut the socket down, never close it, so the
// descriptor the connection guard knows is closed only after the guard forgets it.
#pragma once

// Boost 1.74's Asio uses std::exchange without including <utility>.
#include <utility>
// clang-format off
#include <boost/asio/ip/tcp.hpp>
// clang-format on

#include <string>

namespace specula {

class HttpServer;

// One connection's coroutine (http_connection.cc; a friend of HttpServer).
template <class Stream>
class HttpConnection;

class HttpConnections {
 public:
  // Starts serving `socket` (accepted, and admitted by the server's connection guard, which the
  // connection now tells of) on the socket's executor, which must be a strand.
  static void Serve(const HttpServer& server, boost::asio::ip::tcp::socket socket,
                    std::string peer);
};

}  // namespace specula
