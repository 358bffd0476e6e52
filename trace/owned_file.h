// Opening the files cudalloc writes on a user's behalf (CUDALLOC_LOG_FILE, CUDALLOC_TRACE).
// The path comes from the environment and may name anything: a symlink to a file of the user's
// own, a FIFO some other process holds open, a file another user made world-writable so that it
// receives the trace, a hard link to a file elsewhere that a truncation would wipe. So a file is
// created exclusively with the caller's mode; an existing one is taken only if it is a regular
// file of the effective user with no other name. Header-only: the log (shim) and the trace
// writer (and the tools that compile the writer's sources directly) share it without a new unit.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace cudalloc {

// Returns a descriptor open for writing (O_NONBLOCK stays set: on a regular file it changes
// nothing, and nothing else gets this far), or -1 with the reason in `*why` (a phrase that
// follows the path: "is a symbolic link"). `flags` adds O_APPEND or the like.
inline int open_owned_file(const std::string& path, int flags, mode_t mode, std::string* why) {
  const int base = O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | flags;
  int fd = ::open(path.c_str(), base | O_CREAT | O_EXCL, mode);
  if (fd >= 0) return fd;
  if (errno != EEXIST) {
    *why = errno == ELOOP ? "is a symbolic link" : std::string("cannot be created: ") + std::strerror(errno);
    return -1;
  }
  // O_NONBLOCK: opening a FIFO must not wait for a reader (one with none fails with ENXIO).
  fd = ::open(path.c_str(), base);
  if (fd < 0) {
    const int e = errno;
    *why = e == ELOOP    ? "is a symbolic link"
           : e == ENXIO  ? "is not a regular file"
                         : std::string("cannot be opened: ") + std::strerror(e);
    return -1;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    *why = std::string("cannot be checked: ") + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    *why = "is not a regular file";
  } else if (st.st_uid != ::geteuid()) {
    *why = "is owned by uid " + std::to_string(st.st_uid) + ", not by this process's user (uid " +
           std::to_string(::geteuid()) + ")";
  } else if (st.st_nlink != 1) {
    *why = "has " + std::to_string(st.st_nlink) + " hard links (another name would see what is written)";
  } else {
    return fd;
  }
  ::close(fd);
  return -1;
}

}  // namespace cudalloc
