#include "server/handed_sockets.h"

#include <sys/stat.h>

#include <algorithm>

namespace specula {
namespace {

bool Identify(int fd, dev_t* device, ino_t* inode) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  *device = st.st_dev;
  *inode = st.st_ino;
  return true;
}

}  // namespace

void HandedSockets::Add(int fd) {
  Socket s{fd, 0, 0};
  if (Identify(fd, &s.device, &s.inode)) sockets_.push_back(s);
}

int HandedSockets::CountOpen() {
  std::erase_if(sockets_, [](const Socket& s) {
    dev_t device;
    ino_t inode;
    return !Identify(s.fd, &device, &inode) || device != s.device || inode != s.inode;
  });
  return static_cast<int>(sockets_.size());
}

}  // namespace specula
