#include <catch2/catch.hpp>

#include <cstring>

#include "driver/ipc_record.h"

using namespace cudalloc::shim::ipc;

TEST_CASE("a handle's fields come back as they went in") {
  HandleFields f;
  f.pid = 4242;
  f.device = 3;
  f.token = 0x0123456789abcdefull;
  f.export_id = 77;
  f.size = (7ull << 20) + 512;
  unsigned char bytes[kHandleBytes];
  std::memset(bytes, 0xEE, sizeof bytes);
  encode_handle(f, bytes);
  CHECK(std::memcmp(bytes, kMagic, sizeof kMagic) == 0);
  CHECK(bytes[kHandleBytes - 1] == 0);  // the unused tail is zero
  HandleFields back;
  REQUIRE(decode_handle(bytes, &back) == Decoded::kOk);
  CHECK(back.pid == f.pid);
  CHECK(back.device == f.device);
  CHECK(back.token == f.token);
  CHECK(back.export_id == f.export_id);
  CHECK(back.size == f.size);
}

TEST_CASE("a handle without the magic is the driver's; another version is refused") {
  unsigned char bytes[kHandleBytes] = {};
  HandleFields back;
  CHECK(decode_handle(bytes, &back) == Decoded::kForeign);
  encode_handle(HandleFields{}, bytes);
  bytes[3] ^= 1;  // one bit of the magic
  CHECK(decode_handle(bytes, &back) == Decoded::kForeign);
  encode_handle(HandleFields{}, bytes);
  bytes[8] = static_cast<unsigned char>(kVersion + 1);
  CHECK(decode_handle(bytes, &back) == Decoded::kBadVersion);
}

TEST_CASE("the socket's name is abstract and names the process and its token") {
  const std::string name = socket_name(12, 0xab);
  REQUIRE(name.size() > 1);
  CHECK(name[0] == '\0');
  CHECK(name.substr(1) == "cudalloc-ipc-12-00000000000000ab");
  CHECK(socket_name(12, 0xac) != name);
}

TEST_CASE("a request round-trips; a foreign one does not decode") {
  unsigned char bytes[kRequestBytes];
  encode_request(Request{5, 6}, bytes);
  const auto r = decode_request(bytes);
  REQUIRE(r);
  CHECK(r->token == 5);
  CHECK(r->export_id == 6);
  bytes[0] = 'X';
  CHECK_FALSE(decode_request(bytes));
}

TEST_CASE("a reply round-trips with its chunks") {
  Reply r;
  r.device = 1;
  r.size = 7u << 20;
  r.block_offset = 1u << 20;
  r.chunks = {{2u << 20, 0}, {2u << 20, 0}, {2u << 20, 0}, {2u << 20, 4096}};
  const std::vector<unsigned char> bytes = encode_reply(r);
  REQUIRE(bytes.size() == kReplyHeaderBytes + 4 * kChunkBytes);
  std::uint32_t count = 0;
  auto back = decode_reply_header(bytes.data(), &count);
  REQUIRE(back);
  CHECK(count == 4);
  CHECK(back->refusal == Refusal::kNone);
  CHECK(back->device == 1);
  CHECK(back->size == r.size);
  CHECK(back->block_offset == r.block_offset);
  for (std::uint32_t i = 0; i < count; ++i) back->chunks.push_back(decode_chunk(bytes.data() + kReplyHeaderBytes + i * kChunkBytes));
  CHECK(back->chunks[3].offset == 4096);
  CHECK(back->chunks[3].bytes == 2u << 20);
  CHECK(reply_consistent(*back));
}

TEST_CASE("a refusal carries its reason and the driver's error") {
  Reply r;
  r.refusal = Refusal::kDriverError;
  r.cuda_error = 801;
  const std::vector<unsigned char> bytes = encode_reply(r);
  std::uint32_t count = 1;
  auto back = decode_reply_header(bytes.data(), &count);
  REQUIRE(back);
  CHECK(count == 0);
  CHECK(back->refusal == Refusal::kDriverError);
  CHECK(back->cuda_error == 801);
}

TEST_CASE("headers that do not describe a reply are refused") {
  Reply r;
  std::vector<unsigned char> bytes = encode_reply(r);
  std::uint32_t count = 0;
  bytes[12] = 99;  // an unknown refusal
  CHECK_FALSE(decode_reply_header(bytes.data(), &count));
  bytes = encode_reply(r);
  const std::uint32_t too_many = kMaxChunks + 1;
  std::memcpy(bytes.data() + 40, &too_many, sizeof too_many);
  CHECK_FALSE(decode_reply_header(bytes.data(), &count));
}

TEST_CASE("chunks that do not cover the block are inconsistent") {
  Reply r;
  r.size = 4u << 20;
  r.block_offset = 0;
  CHECK_FALSE(reply_consistent(r));  // no chunks
  r.chunks = {{2u << 20, 0}, {2u << 20, 0}};
  CHECK(reply_consistent(r));
  r.block_offset = 1;  // the block would end past the last chunk
  CHECK_FALSE(reply_consistent(r));
  r.block_offset = 0;
  r.chunks = {{2u << 20, 0}, {0, 0}, {2u << 20, 0}};
  CHECK_FALSE(reply_consistent(r));  // an empty chunk
  r.chunks = {{~0ull, 0}, {2u << 20, 0}};
  CHECK_FALSE(reply_consistent(r));  // their sum overflows
  r.chunks = {{8u << 20, 0}};
  r.size = 0;
  CHECK_FALSE(reply_consistent(r));
}
