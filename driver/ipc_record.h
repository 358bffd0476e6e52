// What cudalloc's IPC of expandable-segment blocks puts on the wire: the 64 bytes of the
// CUipcMemHandle it hands out, and the exporter's answer to an importer's request (ipc_export.h
// serves it, ipc_import.h asks for it). Plain data and checks only, no driver, no sockets, so
// that tests/unit can check the encoding on its own.
//
// A block of an expandable segment is backed by physical chunks that no native IPC handle
// names; the handle instead names an export of the exporting process, which hands the chunks'
// POSIX file descriptors over a Unix socket whose name the handle carries (socket_name).
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cudalloc::shim::ipc {

inline constexpr std::size_t kHandleBytes = 64;  // CU_IPC_HANDLE_SIZE
// Starts every handle, request and reply: what tells cudalloc's handles from the driver's.
inline constexpr char kMagic[8] = {'c', 'u', 'd', 'a', 'l', 'l', 'o', 'c'};
inline constexpr std::uint16_t kVersion = 1;
// File descriptors per SCM_RIGHTS message (the kernel takes at most 253): neither side holds
// more than this many chunk descriptors at a time, whatever the block's size.
inline constexpr std::size_t kFdsPerMessage = 64;
// A reply describes at most this many chunks (2 TiB of 2 MiB pages): a bound on what an
// importer allocates for a reply it has not checked yet.
inline constexpr std::uint32_t kMaxChunks = 1u << 20;

// The fields of a cudalloc handle.
struct HandleFields {
  std::int32_t pid = 0;         // the exporting process, as it sees itself
  std::int32_t device = 0;      // the exporter's device ordinal (for messages)
  std::uint64_t token = 0;      // the exporter's random token: in its socket's name
  std::uint64_t export_id = 0;  // the export, in the exporter's table
  std::uint64_t size = 0;       // the block's size
};

enum class Decoded { kForeign, kBadVersion, kOk };
void encode_handle(const HandleFields& f, unsigned char out[kHandleBytes]);
// kForeign: not cudalloc's (the driver's own handle); kBadVersion: cudalloc's, another format.
Decoded decode_handle(const unsigned char in[kHandleBytes], HandleFields* out);

// The exporter's abstract-namespace socket (first byte NUL; not a file).
std::string socket_name(std::int32_t pid, std::uint64_t token);

struct Request {
  std::uint64_t token = 0;
  std::uint64_t export_id = 0;
};
inline constexpr std::size_t kRequestBytes = 32;
void encode_request(const Request& r, unsigned char out[kRequestBytes]);
std::optional<Request> decode_request(const unsigned char in[kRequestBytes]);

// Why an export was refused.
enum class Refusal : std::int32_t {
  kNone = 0,
  kUnknownExport = 1,  // never exported here, or the block was freed since
  kNotPermitted = 2,   // another user, or the wrong token
  kDriverError = 3,    // the driver refused to export a chunk (cuda_error says how)
  kBadRequest = 4,
};

// One physical chunk, in address order: the importer maps `bytes` of it from `offset`.
struct Chunk {
  std::uint64_t bytes = 0;
  std::uint64_t offset = 0;
};

struct Reply {
  Refusal refusal = Refusal::kNone;
  std::int32_t cuda_error = 0;
  std::int32_t device = 0;
  std::uint64_t size = 0;         // the block's
  std::uint64_t block_offset = 0;  // the block's start, from the first chunk's mapped start
  std::vector<Chunk> chunks;      // their file descriptors follow, kFdsPerMessage at a time
};
inline constexpr std::size_t kReplyHeaderBytes = 48;
inline constexpr std::size_t kChunkBytes = 16;
std::vector<unsigned char> encode_reply(const Reply& r);
// The header alone, chunks left empty; `chunk_count` gets how many follow (kChunkBytes each).
// Null for a header that is not one, or whose chunks would not fit kMaxChunks.
std::optional<Reply> decode_reply_header(const unsigned char in[kReplyHeaderBytes], std::uint32_t* chunk_count);
Chunk decode_chunk(const unsigned char in[kChunkBytes]);
// Whether the chunks cover the block: each non-empty, the block inside their sum, and that sum
// without overflow. An importer checks this before it reserves anything.
bool reply_consistent(const Reply& r);

// State of the calling process, made afresh in a fork child (the parent's stays with it,
// leaked: the child must not answer or use what the parent exported or imported). T has a
// `pid_t pid` member and a default constructor.
template <typename T>
T& per_process(std::atomic<T*>& slot) {
  const pid_t me = ::getpid();
  for (;;) {
    T* s = slot.load(std::memory_order_acquire);
    if (s != nullptr && s->pid == me) return *s;
    auto* fresh = new T;
    fresh->pid = me;
    if (slot.compare_exchange_strong(s, fresh, std::memory_order_acq_rel)) return *fresh;
    delete fresh;  // another thread of this process made it first
  }
}

}  // namespace cudalloc::shim::ipc
