#include "driver/ipc_import.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "driver/driver_api.h"
#include "driver/ipc_record.h"
#include "driver/ipc_socket.h"
#include "support/log.h"

namespace cudalloc::shim::ipc {

namespace {

struct Import {
  std::int32_t pid;
  std::uint64_t token;
  std::uint64_t export_id;
  CUdeviceptr ptr;                  // the block's start, as handed out
  CUdeviceptr base;                 // the reserved range
  std::vector<std::size_t> pieces;  // mapped from base on, in order
  int refs;
};

struct Importer {
  pid_t pid = 0;
  // Held across a whole open (a round trip bounded by the timeouts): opens are rare, and two
  // threads opening one handle must get one mapping.
  std::mutex mutex;
  std::vector<Import> imports;
};

std::atomic<Importer*> g_importer{nullptr};

std::size_t total_of(const std::vector<std::size_t>& pieces) {
  std::size_t t = 0;
  for (std::size_t p : pieces) t += p;
  return t;
}

// Unmaps what is mapped and gives the range back.
void unmap(CUdeviceptr base, const std::vector<std::size_t>& pieces, std::size_t reserved) {
  const DriverApi& d = driver();
  CUdeviceptr at = base;
  for (std::size_t bytes : pieces) {
    d.cuMemUnmap(at, bytes);
    at += bytes;
  }
  if (reserved != 0) d.cuMemAddressFree(base, reserved);
}

// Logs why the open of `f` failed and returns `r`.
CUresult fail(const HandleFields& f, CUresult r, const std::string& why) {
  log_error("cuIpcOpenMemHandle: the block of %llu bytes exported by process %d (device %d, export %llu) cannot "
            "be opened: %s",
            static_cast<unsigned long long>(f.size), f.pid, f.device, static_cast<unsigned long long>(f.export_id),
            why.c_str());
  return r;
}

std::string error_code(int r) { return " (error " + std::to_string(r) + ")"; }

std::string os_error(const char* doing) {
  if (errno == EAGAIN || errno == EWOULDBLOCK) {
    return std::string(doing) + ": no answer within " + std::to_string(kTimeoutSeconds) + " s";
  }
  if (errno == 0) return std::string(doing) + ": the exporter closed the connection";
  return std::string(doing) + ": " + std::strerror(errno);
}

int connect_to(const HandleFields& f) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string name = socket_name(f.pid, f.token);
  std::memcpy(addr.sun_path, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  if (!set_timeouts(fd) || ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

// What the exporter says, chunks included; on a failure, the CUresult to return (logged).
CUresult receive_reply(int c, const HandleFields& f, Reply* reply) {
  unsigned char request[kRequestBytes];
  encode_request(Request{f.token, f.export_id}, request);
  if (!send_all(c, request, sizeof request)) return fail(f, CUDA_ERROR_INVALID_VALUE, os_error("asking"));
  unsigned char header[kReplyHeaderBytes];
  if (!recv_all(c, header, sizeof header)) {
    return fail(f, CUDA_ERROR_INVALID_VALUE, os_error("reading the answer"));
  }
  std::uint32_t count = 0;
  auto decoded = decode_reply_header(header, &count);
  if (!decoded) return fail(f, CUDA_ERROR_INVALID_VALUE, "the exporter's answer is not understood");
  *reply = std::move(*decoded);
  switch (reply->refusal) {
    case Refusal::kNone: break;
    case Refusal::kUnknownExport:
      return fail(f, CUDA_ERROR_INVALID_VALUE, "the exporter has no such block (freed since it was exported)");
    case Refusal::kNotPermitted:
      return fail(f, CUDA_ERROR_INVALID_VALUE, "the exporter refused: this process runs as another user");
    case Refusal::kDriverError:
    case Refusal::kBadRequest:
      return fail(f, CUDA_ERROR_INVALID_VALUE, "the exporter refused the request" + error_code(reply->cuda_error));
  }
  std::vector<unsigned char> chunks(std::size_t{count} * kChunkBytes);
  if (!recv_all(c, chunks.data(), chunks.size())) {
    return fail(f, CUDA_ERROR_INVALID_VALUE, os_error("reading the chunks"));
  }
  for (std::uint32_t i = 0; i < count; ++i) reply->chunks.push_back(decode_chunk(chunks.data() + i * kChunkBytes));
  if (!reply_consistent(*reply) || reply->size != f.size) {
    return fail(f, CUDA_ERROR_INVALID_VALUE, "the exporter's answer does not describe the block");
  }
  return CUDA_SUCCESS;
}

// Receives the chunks' descriptors and maps them from `base` on, recording each in `pieces`.
CUresult map_chunks(int c, const HandleFields& f, const Reply& reply, CUdeviceptr base,
                    std::vector<std::size_t>* pieces) {
  const DriverApi& d = driver();
  CUdeviceptr at = base;
  std::vector<int> fds;
  for (std::size_t next = 0; next < reply.chunks.size();) {
    std::int32_t status = 0;
    if (!recv_fds(c, &status, &fds)) {
      return fail(f, CUDA_ERROR_MAP_FAILED, os_error("receiving the chunks' file descriptors"));
    }
    if (status != CUDA_SUCCESS) {
      close_all(fds);
      return fail(f, CUDA_ERROR_MAP_FAILED,
                  "the exporter's driver would not export its memory" + error_code(status));
    }
    if (fds.empty() || next + fds.size() > reply.chunks.size()) {
      close_all(fds);
      return fail(f, CUDA_ERROR_MAP_FAILED, "the exporter sent the wrong number of file descriptors");
    }
    for (std::size_t i = 0; i < fds.size(); ++i, ++next) {
      const Chunk& chunk = reply.chunks[next];
      CUmemGenericAllocationHandle h = 0;
      CUresult r = d.cuMemImportFromShareableHandle(
          &h, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fds[i])), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      if (r == CUDA_SUCCESS) {
        r = d.cuMemMap(at, chunk.bytes, chunk.offset, h, 0);
        d.cuMemRelease(h);  // the mapping holds the memory from now on
      }
      if (r != CUDA_SUCCESS) {
        close_all(fds);
        return fail(f, CUDA_ERROR_MAP_FAILED, "importing and mapping a chunk failed" + error_code(r));
      }
      pieces->push_back(chunk.bytes);
      at += chunk.bytes;
    }
    close_all(fds);
  }
  return CUDA_SUCCESS;
}

CUresult open_new(const HandleFields& f, Import* out) {
  const DriverApi& d = driver();
  if (d.cuMemImportFromShareableHandle == nullptr || d.cuMemAddressReserve == nullptr || d.cuMemMap == nullptr ||
      d.cuMemSetAccess == nullptr) {
    return fail(f, CUDA_ERROR_NOT_SUPPORTED, "this driver lacks virtual memory management");
  }
  CUdevice device = 0;
  if (d.cuCtxGetDevice(&device) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CONTEXT;  // the driver's answer
  const int c = connect_to(f);
  if (c < 0) {
    const bool gone = errno == ECONNREFUSED || errno == ENOENT;
    return fail(f, CUDA_ERROR_INVALID_VALUE,
                gone ? "the exporting process has exited" : os_error("connecting to the exporter"));
  }
  Reply reply;
  CUresult r = receive_reply(c, f, &reply);
  std::size_t reserved = 0;
  CUdeviceptr base = 0;
  std::vector<std::size_t> pieces;
  if (r == CUDA_SUCCESS) {
    for (const Chunk& chunk : reply.chunks) reserved += chunk.bytes;
    r = d.cuMemAddressReserve(&base, reserved, 0, 0, 0);
    if (r != CUDA_SUCCESS) {
      reserved = 0;
      fail(f, r, "reserving an address range failed" + error_code(r));
    }
  }
  if (r == CUDA_SUCCESS) r = map_chunks(c, f, reply, base, &pieces);
  ::close(c);
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = d.cuMemSetAccess(base, reserved, &access, 1);
    if (r != CUDA_SUCCESS) {
      fail(f, r, "setting access for device " + std::to_string(device) + " failed" + error_code(r));
    }
  }
  if (r != CUDA_SUCCESS) {
    unmap(base, pieces, reserved);
    return r;
  }
  *out = Import{f.pid, f.token, f.export_id, base + reply.block_offset, base, std::move(pieces), 1};
  return CUDA_SUCCESS;
}

}  // namespace

bool open_handle(const CUipcMemHandle& handle, unsigned int flags, CUdeviceptr* out, CUresult* r) {
  HandleFields f;
  const Decoded decoded = decode_handle(reinterpret_cast<const unsigned char*>(handle.reserved), &f);
  if (decoded == Decoded::kForeign) return false;
  if (decoded == Decoded::kBadVersion) {
    log_error("cuIpcOpenMemHandle: the handle was made by another version of cudalloc, whose format this one "
              "does not read; run both processes with the same cudalloc");
    *r = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  if (out == nullptr || (flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0) {
    *r = CUDA_ERROR_INVALID_VALUE;  // the driver's answers
    return true;
  }
  Importer& im = per_process(g_importer);
  std::lock_guard lock(im.mutex);
  for (Import& i : im.imports) {
    if (i.pid == f.pid && i.token == f.token && i.export_id == f.export_id) {
      ++i.refs;
      *out = i.ptr;
      *r = CUDA_SUCCESS;
      return true;
    }
  }
  Import fresh{};
  *r = open_new(f, &fresh);
  if (*r == CUDA_SUCCESS) {
    *out = fresh.ptr;
    im.imports.push_back(std::move(fresh));
  }
  return true;
}

bool close_handle(CUdeviceptr ptr, CUresult* r) {
  Importer* im = g_importer.load(std::memory_order_acquire);
  if (im == nullptr || im->pid != ::getpid()) return false;
  std::lock_guard lock(im->mutex);
  for (auto it = im->imports.begin(); it != im->imports.end(); ++it) {
    if (it->ptr != ptr) continue;
    *r = CUDA_SUCCESS;
    if (--it->refs == 0) {
      unmap(it->base, it->pieces, total_of(it->pieces));
      im->imports.erase(it);
    }
    return true;
  }
  return false;
}

}  // namespace cudalloc::shim::ipc
