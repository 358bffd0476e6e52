// The Unix-socket plumbing of cudalloc's IPC (ipc_export.h serves, ipc_import.h asks): whole
// reads and writes with timeouts, and file descriptors passed with SCM_RIGHTS. Every call gives
// up after kTimeoutSeconds, so that neither side ever hangs on the other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cudalloc::shim::ipc {

inline constexpr int kTimeoutSeconds = 5;

// Read and write timeouts of kTimeoutSeconds on `fd`.
bool set_timeouts(int fd);
// False on an error, a timeout or the peer's close before all was done (errno says which;
// 0 for the close).
bool send_all(int fd, const void* data, std::size_t n);
bool recv_all(int fd, void* data, std::size_t n);
// One message: `status` (a CUresult; CUDA_SUCCESS when `fds` are attached) and the fds, at
// most kFdsPerMessage. The sender keeps its fds.
bool send_fds(int fd, std::int32_t status, const std::vector<int>& fds);
// The other end: the received fds are the caller's (close-on-exec). False, holding none, on a
// failure, or when the kernel dropped some (the receiver is out of file descriptors: errno
// EMFILE).
bool recv_fds(int fd, std::int32_t* status, std::vector<int>* fds);
// Closes every fd in `fds` and empties it.
void close_all(std::vector<int>& fds);

}  // namespace cudalloc::shim::ipc
