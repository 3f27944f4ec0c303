// The sockets the plaintext gRPC acceptor handed to gRPC, and how many of them are still open.
// gRPC closes a connection's descriptor when the connection ends and tells nobody, so a socket
// is counted as open while its descriptor number still names the same socket (same device and
// inode): a closed descriptor, or one reused for another file or socket, no longer counts.
#pragma once

#include <sys/types.h>

#include <vector>

namespace specula {

class HandedSockets {
 public:
  // Records `fd`, an open socket about to be handed over.
  void Add(int fd);
  // Forgets the sockets that are closed or whose number now names something else, and returns
  // how many are left. Costs one fstat per recorded socket.
  int CountOpen();
  // The number recorded, without checking (an upper bound on the open ones).
  int recorded() const { return static_cast<int>(sockets_.size()); }

 private:
  struct Socket {
    int fd;
    dev_t device;
    ino_t inode;
  };
  std::vector<Socket> sockets_;
};

}  // namespace specula
