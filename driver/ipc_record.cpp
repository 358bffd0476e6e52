#include "driver/ipc_record.h"

#include <cstdio>
#include <cstring>

namespace cudalloc::shim::ipc {

namespace {

// Fields at fixed offsets in host byte order: both ends run on one host.
template <typename T>
void put(unsigned char* out, std::size_t at, T v) {
  std::memcpy(out + at, &v, sizeof v);
}
template <typename T>
T get(const unsigned char* in, std::size_t at) {
  T v;
  std::memcpy(&v, in + at, sizeof v);
  return v;
}

void put_magic(unsigned char* out) {
  std::memcpy(out, kMagic, sizeof kMagic);
  put<std::uint16_t>(out, 8, kVersion);
}
bool magic(const unsigned char* in) { return std::memcmp(in, kMagic, sizeof kMagic) == 0; }
bool current(const unsigned char* in) { return magic(in) && get<std::uint16_t>(in, 8) == kVersion; }

}  // namespace

// magic 0..8, version 8..10, pid 12..16, device 16..20, token 24..32, export id 32..40,
// size 40..48; the rest zero.
void encode_handle(const HandleFields& f, unsigned char out[kHandleBytes]) {
  std::memset(out, 0, kHandleBytes);
  put_magic(out);
  put(out, 12, f.pid);
  put(out, 16, f.device);
  put(out, 24, f.token);
  put(out, 32, f.export_id);
  put(out, 40, f.size);
}

Decoded decode_handle(const unsigned char in[kHandleBytes], HandleFields* out) {
  if (!magic(in)) return Decoded::kForeign;
  if (!current(in)) return Decoded::kBadVersion;
  out->pid = get<std::int32_t>(in, 12);
  out->device = get<std::int32_t>(in, 16);
  out->token = get<std::uint64_t>(in, 24);
  out->export_id = get<std::uint64_t>(in, 32);
  out->size = get<std::uint64_t>(in, 40);
  return Decoded::kOk;
}

std::string socket_name(std::int32_t pid, std::uint64_t token) {
  char name[64];
  const int n = std::snprintf(name, sizeof name, "%ccudalloc-ipc-%d-%016llx", '\0', pid,
                              static_cast<unsigned long long>(token));
  return std::string(name, static_cast<std::size_t>(n));
}

// magic 0..8, version 8..10, token 16..24, export id 24..32.
void encode_request(const Request& r, unsigned char out[kRequestBytes]) {
  std::memset(out, 0, kRequestBytes);
  put_magic(out);
  put(out, 16, r.token);
  put(out, 24, r.export_id);
}

std::optional<Request> decode_request(const unsigned char in[kRequestBytes]) {
  if (!current(in)) return std::nullopt;
  return Request{get<std::uint64_t>(in, 16), get<std::uint64_t>(in, 24)};
}

// magic 0..8, version 8..10, refusal 12..16, driver error 16..20, device 20..24, size 24..32,
// block offset 32..40, chunk count 40..44; then per chunk its bytes and offset.
std::vector<unsigned char> encode_reply(const Reply& r) {
  std::vector<unsigned char> out(kReplyHeaderBytes + r.chunks.size() * kChunkBytes, 0);
  unsigned char* p = out.data();
  put_magic(p);
  put(p, 12, static_cast<std::int32_t>(r.refusal));
  put(p, 16, r.cuda_error);
  put(p, 20, r.device);
  put(p, 24, r.size);
  put(p, 32, r.block_offset);
  put(p, 40, static_cast<std::uint32_t>(r.chunks.size()));
  for (std::size_t i = 0; i < r.chunks.size(); ++i) {
    put(p, kReplyHeaderBytes + i * kChunkBytes, r.chunks[i].bytes);
    put(p, kReplyHeaderBytes + i * kChunkBytes + 8, r.chunks[i].offset);
  }
  return out;
}

std::optional<Reply> decode_reply_header(const unsigned char in[kReplyHeaderBytes], std::uint32_t* chunk_count) {
  if (!current(in)) return std::nullopt;
  Reply r;
  const auto refusal = get<std::int32_t>(in, 12);
  if (refusal < 0 || refusal > static_cast<std::int32_t>(Refusal::kBadRequest)) return std::nullopt;
  r.refusal = static_cast<Refusal>(refusal);
  r.cuda_error = get<std::int32_t>(in, 16);
  r.device = get<std::int32_t>(in, 20);
  r.size = get<std::uint64_t>(in, 24);
  r.block_offset = get<std::uint64_t>(in, 32);
  *chunk_count = get<std::uint32_t>(in, 40);
  if (*chunk_count > kMaxChunks) return std::nullopt;
  return r;
}

Chunk decode_chunk(const unsigned char in[kChunkBytes]) {
  return Chunk{get<std::uint64_t>(in, 0), get<std::uint64_t>(in, 8)};
}

bool reply_consistent(const Reply& r) {
  if (r.chunks.empty() || r.size == 0) return false;
  std::uint64_t total = 0;
  for (const Chunk& c : r.chunks) {
    if (c.bytes == 0 || total + c.bytes < total) return false;
    total += c.bytes;
  }
  return r.block_offset < total && r.size <= total - r.block_offset;
}

}  // namespace cudalloc::shim::ipc
