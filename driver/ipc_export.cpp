#include "driver/ipc_export.h"

#include <pthread.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "driver/current_context.h"
#include "driver/driver_api.h"
#include "driver/ipc_record.h"
#include "driver/ipc_socket.h"
#include "support/log.h"

namespace cudalloc::shim::ipc {

namespace {

struct Export {
  ContextState* state;  // never freed (a context that goes keeps its state, its blocks forgotten)
  DevicePtr base;
  std::size_t size;
  std::uint64_t buffer_id;  // the hand-out's: a block freed and handed out again has another
};

struct Exporter {
  pid_t pid = 0;
  std::mutex mutex;  // everything below
  std::uint64_t token = 0;
  bool serving = false;
  std::uint64_t next_id = 1;
  std::map<std::uint64_t, Export> exports;
  // Read by the fork and exit handlers, which take no lock.
  std::atomic<int> listen_fd{-1};
};

std::atomic<Exporter*> g_exporter{nullptr};
std::atomic<bool> g_exiting{false};

// The listening socket belongs to the process that made it: a fork child closes its copy, so
// that importers of a parent that exited are refused at once rather than left to time out.
void close_inherited_socket() {
  if (Exporter* e = g_exporter.load(std::memory_order_acquire)) {
    const int fd = e->listen_fd.exchange(-1);
    if (fd >= 0) ::close(fd);
  }
}

// At exit: no new connection is accepted, and one being answered gets nothing more.
void stop_serving() {
  g_exiting.store(true);
  if (Exporter* e = g_exporter.load(std::memory_order_acquire); e != nullptr && e->pid == ::getpid()) {
    const int fd = e->listen_fd.load();
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }
}

std::uint64_t random_token() {
  std::uint64_t t = 0;
  if (::getrandom(&t, sizeof t, GRND_NONBLOCK) == static_cast<ssize_t>(sizeof t) && t != 0) return t;
  // No entropy source: the name must still be hard to guess for a process of the same user.
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  return static_cast<std::uint64_t>(now) * 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(::getpid()) ^
         reinterpret_cast<std::uintptr_t>(&t);
}

// The reply to a request, chunks included, and the chunks' addresses to export (empty on a
// refusal).
struct Answer {
  Reply reply;
  std::vector<DriverBackend::MappedChunk> chunks;
  ContextState* state = nullptr;
  Export exported{};  // the block the answer is about
};

// Whether the exported block is still the hand-out that was exported.
bool still_exported(const Export& ex) {
  const auto info = ex.state->allocator.find(ex.base);
  return info && info->base == ex.base && info->buffer_id == ex.buffer_id;
}

Answer look_up(Exporter& e, const std::optional<Request>& request) {
  Answer a;
  if (!request) {
    a.reply.refusal = Refusal::kBadRequest;
    return a;
  }
  if (request->token != e.token) {
    a.reply.refusal = Refusal::kNotPermitted;
    return a;
  }
  Export ex{};
  {
    std::lock_guard lock(e.mutex);
    const auto it = e.exports.find(request->export_id);
    if (it == e.exports.end()) {
      a.reply.refusal = Refusal::kUnknownExport;
      return a;
    }
    ex = it->second;
  }
  if (!still_exported(ex) || !ex.state->backend.describe_range(ex.base, ex.size, &a.chunks)) {
    a.chunks.clear();
    a.reply.refusal = Refusal::kUnknownExport;
    return a;
  }
  a.state = ex.state;
  a.exported = ex;
  a.reply.device = static_cast<std::int32_t>(ex.state->device);
  a.reply.size = ex.size;
  a.reply.block_offset = ex.base - a.chunks.front().va;
  for (const auto& c : a.chunks) a.reply.chunks.push_back(Chunk{c.bytes, 0});
  return a;
}

// Sends the chunks' descriptors, kFdsPerMessage at a time, each batch exported just before it
// goes and closed just after. A chunk the driver will not export ends the answer with its error,
// and so does a block freed since the answer began (its chunks may serve another hand-out by now).
void send_chunks(int c, const Answer& a) {
  CurrentContext current(a.state->ctx);
  std::vector<int> fds;
  for (std::size_t at = 0; at < a.chunks.size(); at += kFdsPerMessage) {
    CUresult r = CUDA_SUCCESS;
    for (std::size_t i = at; i < a.chunks.size() && i < at + kFdsPerMessage && r == CUDA_SUCCESS; ++i) {
      int fd = -1;
      r = a.state->backend.export_chunk(a.chunks[i].va, a.chunks[i].bytes, &fd);
      if (r == CUDA_SUCCESS) fds.push_back(fd);
    }
    if (r == CUDA_SUCCESS && !still_exported(a.exported)) r = CUDA_ERROR_INVALID_VALUE;
    if (r != CUDA_SUCCESS) close_all(fds);
    const bool sent = send_fds(c, static_cast<std::int32_t>(r), fds);
    close_all(fds);
    if (!sent || r != CUDA_SUCCESS) return;
  }
}

void answer(Exporter& e, int c) {
  if (!set_timeouts(c)) return;
  ucred peer{};
  socklen_t len = sizeof peer;
  const bool same_user = ::getsockopt(c, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0 && peer.uid == ::geteuid();
  unsigned char request[kRequestBytes];
  if (!recv_all(c, request, sizeof request)) return;
  Answer a;
  if (same_user) {
    a = look_up(e, decode_request(request));
  } else {
    a.reply.refusal = Refusal::kNotPermitted;
  }
  if (g_exiting.load()) return;
  const std::vector<unsigned char> bytes = encode_reply(a.reply);
  if (!send_all(c, bytes.data(), bytes.size()) || a.reply.refusal != Refusal::kNone) {
    log_debug("IPC: refused process %d (reason %d)", static_cast<int>(peer.pid), static_cast<int>(a.reply.refusal));
    return;
  }
  log_debug("IPC: sending %zu chunks to process %d", a.chunks.size(), static_cast<int>(peer.pid));
  send_chunks(c, a);
}

void* serve(void* arg) {
  auto& e = *static_cast<Exporter*>(arg);
  for (;;) {
    const int fd = e.listen_fd.load();
    if (fd < 0 || g_exiting.load()) return nullptr;
    const int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the importer times out
        continue;
      }
      return nullptr;  // shut down at exit
    }
    answer(e, c);
    ::close(c);
  }
}

// Under e.mutex.
bool start_server_locked(Exporter& e) {
  e.token = random_token();
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string name = socket_name(e.pid, e.token);
  std::memcpy(addr.sun_path, name.data(), name.size());
  const auto addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), addr_len) != 0 || ::listen(fd, 64) != 0) {
    ::close(fd);
    return false;
  }
  e.listen_fd.store(fd);
  // The thread takes no signal meant for the program's own threads.
  sigset_t all;
  sigset_t old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t thread;
  const bool started = pthread_create(&thread, nullptr, serve, &e) == 0;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (!started) {
    e.listen_fd.store(-1);
    ::close(fd);
    return false;
  }
  pthread_setname_np(thread, "cudalloc-ipc");
  pthread_detach(thread);
  static std::once_flag handlers;
  std::call_once(handlers, [] {
    pthread_atfork(nullptr, nullptr, close_inherited_socket);
    std::atexit(stop_serving);
  });
  return true;
}

// Exports whose block is no longer the live block it was. Under e.mutex.
void drop_freed_locked(Exporter& e) {
  for (auto it = e.exports.begin(); it != e.exports.end();) {
    const auto info = it->second.state->allocator.find(it->second.base);
    const bool live = info && info->base == it->second.base && info->buffer_id == it->second.buffer_id;
    it = live ? std::next(it) : e.exports.erase(it);
  }
}

}  // namespace

CUresult export_block(ContextState& s, const AllocationInfo& info, CUipcMemHandle* handle) {
  if (!s.backend.chunks_exportable()) {
    log_error("cuIpcGetMemHandle(0x%llx): this block lies in an expandable segment, and device %d's driver does "
              "not make its memory exportable (POSIX file descriptor handles); run without expandable_segments "
              "to share it",
              static_cast<unsigned long long>(info.base), static_cast<int>(s.device));
    return CUDA_ERROR_INVALID_VALUE;
  }
  Exporter& e = per_process(g_exporter);
  std::lock_guard lock(e.mutex);
  if (!e.serving) {
    if (!start_server_locked(e)) {
      log_error("cuIpcGetMemHandle(0x%llx): cannot start the IPC socket that importers ask for the block's memory "
                "(%s)",
                static_cast<unsigned long long>(info.base), std::strerror(errno));
      return CUDA_ERROR_OPERATING_SYSTEM;
    }
    e.serving = true;
    log_debug("IPC: serving exports on socket @%s", socket_name(e.pid, e.token).c_str() + 1);
  }
  drop_freed_locked(e);
  std::uint64_t id = 0;
  for (const auto& [key, ex] : e.exports) {
    if (ex.state == &s && ex.base == info.base && ex.buffer_id == info.buffer_id) id = key;
  }
  if (id == 0) {
    id = e.next_id++;
    e.exports.emplace(id, Export{&s, info.base, info.size, info.buffer_id});
  }
  HandleFields f;
  f.pid = static_cast<std::int32_t>(e.pid);
  f.device = static_cast<std::int32_t>(s.device);
  f.token = e.token;
  f.export_id = id;
  f.size = info.size;
  static_assert(sizeof handle->reserved == kHandleBytes);
  encode_handle(f, reinterpret_cast<unsigned char*>(handle->reserved));
  return CUDA_SUCCESS;
}

}  // namespace cudalloc::shim::ipc
