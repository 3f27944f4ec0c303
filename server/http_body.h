// Internal to the HTTP listener: a Boost.Beast body type for request bodies that keeps at most
// `limit` bytes and counts the rest. A declared Content-Length over the limit is refused before
// the body is read; a chunked body that grows past it is read on (and dropped) to its end, so
// that the 413 can be answered on a connection whose framing is still known, up to kMaxDropped
// more bytes, past which the read fails and the connection closes without an answer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

// clang-format off
#include <boost/asio/buffer.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/optional/optional.hpp>
// clang-format on

namespace specula {

struct CappedStringBody {
  static constexpr size_t kMaxDropped = 16 << 20;

  struct value_type {
    std::string data;    // at most `limit` bytes
    size_t limit = 0;    // set before the body is read
    size_t dropped = 0;  // bytes past the limit, read and dropped
  };

  class reader {
   public:
    template <bool kIsRequest, class Fields>
    reader(boost::beast::http::header<kIsRequest, Fields>&, value_type& body) : body_(body) {}

    void init(const boost::optional<std::uint64_t>&, boost::beast::error_code& ec) { ec = {}; }

    template <class ConstBufferSequence>
    size_t put(const ConstBufferSequence& buffers, boost::beast::error_code& ec) {
      ec = {};
      size_t taken = 0;
      for (auto it = boost::asio::buffer_sequence_begin(buffers);
           it != boost::asio::buffer_sequence_end(buffers); ++it) {
        const boost::asio::const_buffer b = *it;
        const size_t room = body_.data.size() < body_.limit && body_.dropped == 0
                                ? body_.limit - body_.data.size()
                                : 0;
        const size_t keep = b.size() < room ? b.size() : room;
        body_.data.append(static_cast<const char*>(b.data()), keep);
        body_.dropped += b.size() - keep;
        taken += b.size();
      }
      if (body_.dropped > kMaxDropped) ec = boost::beast::http::error::body_limit;
      return taken;
    }

    void finish(boost::beast::error_code& ec) { ec = {}; }

   private:
    value_type& body_;
  };
};

}  // namespace specula
