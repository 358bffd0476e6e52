#include "driver/ipc_socket.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "driver/ipc_record.h"

namespace cudalloc::shim::ipc {

bool set_timeouts(int fd) {
  const timeval tv{kTimeoutSeconds, 0};
  return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0 &&
         setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0;
}

bool send_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);  // a gone peer is an error, not SIGPIPE
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

bool recv_all(int fd, void* data, std::size_t n) {
  auto* p = static_cast<unsigned char*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) errno = 0;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

namespace {
union FdControl {
  cmsghdr header;
  unsigned char bytes[CMSG_SPACE(sizeof(int) * kFdsPerMessage)];
};
}  // namespace

bool send_fds(int fd, std::int32_t status, const std::vector<int>& fds) {
  if (fds.size() > kFdsPerMessage) return false;
  iovec iov{&status, sizeof status};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  FdControl control{};
  if (!fds.empty()) {
    msg.msg_control = control.bytes;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    const ssize_t k = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return false;
    // The fds went with the first byte; the rest of the status, if cut short, follows plainly.
    return send_all(fd, reinterpret_cast<const unsigned char*>(&status) + k, sizeof status - static_cast<std::size_t>(k));
  }
}

bool recv_fds(int fd, std::int32_t* status, std::vector<int>* fds) {
  fds->clear();
  iovec iov{status, sizeof *status};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  FdControl control{};
  msg.msg_control = control.bytes;
  msg.msg_controllen = sizeof control.bytes;
  ssize_t k = 0;
  do {
    k = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (k < 0 && errno == EINTR);
  if (k == 0) errno = 0;
  if (k <= 0) return false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int received = -1;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof received);
      fds->push_back(received);
    }
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    close_all(*fds);
    errno = EMFILE;
    return false;
  }
  if (!recv_all(fd, reinterpret_cast<unsigned char*>(status) + k, sizeof *status - static_cast<std::size_t>(k))) {
    close_all(*fds);
    return false;
  }
  return true;
}

void close_all(std::vector<int>& fds) {
  for (int f : fds) ::close(f);
  fds.clear();
}

}  // namespace cudalloc::shim::ipc
