#pragma once

// A c10d TCPStore client on a raw socket, for tests of TCPStore front-ends
// (the daemon's, an agent's relay) against hostile and careless clients: it
// sends exactly the bytes given (EncodeQuery writes what torch's client
// sends), and every read and send has a deadline.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "rendezvous/core/tcpstore_wire.h"

namespace meshrun::testing {

// A socket connected to 127.0.0.1:port from `source` (another loopback
// address, so the server sees another peer), or -1.
int ConnectFrom(const char* source, int port);

class RawClient {
 public:
  // Connects (from `source` when given) and, with `handshake`, validates.
  explicit RawClient(int port, bool handshake = true, const char* source = nullptr);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool ok() const { return fd_ >= 0; }
  bool Send(const rdzv::tcpstore::Query& q) {
    return SendRaw(rdzv::tcpstore::EncodeQuery(q));
  }
  bool SendRaw(const std::string& bytes);
  // Exactly n bytes, or nullopt (closed, or nothing within `timeout`).
  std::optional<std::string> Read(
      size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  std::optional<int64_t> ReadI64(
      std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // A length-prefixed value (get's reply).
  std::optional<std::string> ReadValue(
      std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // True when the server closed the connection within `timeout`.
  bool ClosedByPeer(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  int fd() const { return fd_; }

 private:
  int fd_;
};

}  // namespace meshrun::testing
