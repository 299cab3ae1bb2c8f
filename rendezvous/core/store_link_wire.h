#pragma once

// The store link's framing (proto/meshrun/v1/store.proto, StoreLinkHello):
// the magic, then frames of a 4-byte little-endian length and a serialized
// protobuf message. Pure: no sockets.

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace meshrun::rdzv::link {

// The connection's first bytes. 'M' tells it apart on the daemon's port from
// gRPC ('P', its HTTP/2 preface) and c10d's TCPStore (0, its VALIDATE).
inline constexpr std::string_view kMagic = "MRL1";
inline constexpr size_t kHeaderBytes = 4;

// Appends `message` (any protobuf message) as one frame.
template <typename Message>
void AppendFrame(const Message& message, std::string* out) {
  const size_t size = message.ByteSizeLong();
  const uint32_t length = static_cast<uint32_t>(size);
  char header[kHeaderBytes];
  for (size_t i = 0; i < kHeaderBytes; ++i)
    header[i] = static_cast<char>(length >> (8 * i));
  out->append(header, kHeaderBytes);
  const size_t at = out->size();
  out->resize(at + size);
  message.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out->data() + at));
}

// The length a frame header announces.
inline uint32_t FrameLength(const char* header) {
  uint32_t length = 0;
  for (size_t i = 0; i < kHeaderBytes; ++i)
    length |= static_cast<uint32_t>(static_cast<uint8_t>(header[i])) << (8 * i);
  return length;
}

}  // namespace meshrun::rdzv::link
