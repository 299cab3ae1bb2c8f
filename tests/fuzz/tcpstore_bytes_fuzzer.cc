// Arbitrary bytes as a TCPStore client's stream: first through the wire codec
// alone (every query it parses must encode back to the bytes it consumed),
// then, after c10d's handshake, to the real daemon's TCPStore front-end over
// loopback, which must answer or close the connection and go on serving.

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "rendezvous/core/tcpstore_wire.h"
#include "tests/fuzz/fuzz_daemon.h"
#include "tests/support/http_client.h"

namespace {

using meshrun::rdzv::tcpstore::ParseQuery;
using meshrun::rdzv::tcpstore::ParseResult;
using meshrun::rdzv::tcpstore::Query;
using meshrun::rdzv::tcpstore::QueryType;

// The front-end finds a query's end with FrameScanner as its bytes arrive:
// fed them a byte at a time, it must end the query where ParseQuery does, and
// refuse what ParseQuery refuses with the same line. (Short of a whole
// query, it may refuse one from a length before the parse gets there.)
void CheckScanner(std::string_view data, const ParseResult& parsed,
                  const meshrun::rdzv::tcpstore::WireLimits& limits) {
  using meshrun::rdzv::tcpstore::ScanResult;
  meshrun::rdzv::tcpstore::FrameScanner scanner(limits);
  ScanResult scan;
  for (size_t n = 0; n <= data.size(); ++n) {
    scan = scanner.Scan(data.substr(0, n));
    if (scan.kind != ScanResult::Kind::kIncomplete) break;
  }
  const bool agree =
      parsed.kind == ParseResult::Kind::kQuery
          ? scan.kind == ScanResult::Kind::kFrame && scan.frame_bytes == parsed.consumed
      : parsed.kind == ParseResult::Kind::kBad
          ? scan.kind == ScanResult::Kind::kBad && scan.error == parsed.error
          : scan.kind != ScanResult::Kind::kFrame;
  if (!agree) {
    std::fprintf(stderr, "fuzz: the frame scanner and ParseQuery disagree (%s / %s)\n",
                 scan.error.c_str(), parsed.error.c_str());
    std::abort();
  }
}

void CheckCodec(std::string_view data) {
  meshrun::rdzv::tcpstore::WireLimits limits;
  limits.max_value_bytes = 1 << 20;
  limits.max_keys_per_query = 1024;
  limits.max_query_bytes = 4 << 20;
  while (!data.empty()) {
    ParseResult r = ParseQuery(data, limits);
    CheckScanner(data, r, limits);
    if (r.kind != ParseResult::Kind::kQuery) return;
    if (meshrun::rdzv::tcpstore::EncodeQuery(r.query) != data.substr(0, r.consumed)) {
      std::fprintf(stderr, "fuzz: %s does not encode back to its bytes\n",
                   meshrun::rdzv::tcpstore::ToString(r.query.type));
      std::abort();
    }
    data.remove_prefix(r.consumed);
  }
}

// Reads what the daemon sends until it closes or is quiet for a moment.
void Drain(int fd) {
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) return;
    if (recv(fd, buf, sizeof(buf), 0) <= 0) return;
  }
}

// A loopback connection to the daemon, or an abort that names the errno.
int Connect(int port) {
  const int fd = meshrun::testing::ConnectLoopback(port);
  if (fd < 0) {
    std::fprintf(stderr, "fuzz: cannot connect to the daemon's TCPStore port: %s\n",
                 std::strerror(errno));
    std::abort();
  }
  return fd;
}

// Closes with a reset rather than a FIN: the client closes first, and each
// input's two connections would otherwise hold two ephemeral ports in
// TIME_WAIT for 60 s, about 2,000 a second at libFuzzer's pace.
void CloseAbortively(int fd) {
  const linger reset{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  close(fd);
}

int Port() {
  const std::string endpoint = meshrun::fuzz::FuzzDaemon::Get().daemon->endpoint();
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  CheckCodec(bytes);

  static const int port = Port();
  const int fd = Connect(port);
  Query validate;
  validate.type = QueryType::kValidate;
  validate.number = meshrun::rdzv::tcpstore::kValidationMagic;
  meshrun::testing::SendAll(fd, meshrun::rdzv::tcpstore::EncodeQuery(validate));
  meshrun::testing::SendAll(fd, std::string(bytes));
  shutdown(fd, SHUT_WR);
  Drain(fd);
  CloseAbortively(fd);

  // Still serving: a fresh client's ping comes back.
  const int probe = Connect(port);
  Query ping;
  ping.type = QueryType::kPing;
  ping.number = 4242;
  meshrun::testing::SendAll(probe, meshrun::rdzv::tcpstore::EncodeQuery(validate) +
                                       meshrun::rdzv::tcpstore::EncodeQuery(ping));
  uint32_t echoed = 0;
  size_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (got < sizeof(echoed) && std::chrono::steady_clock::now() < deadline) {
    pollfd p{probe, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n =
        recv(probe, reinterpret_cast<char*>(&echoed) + got, sizeof(echoed) - got, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  CloseAbortively(probe);
  if (echoed != 4242) {
    std::fprintf(stderr, "fuzz: the daemon stopped answering TCPStore pings\n");
    std::abort();
  }
  return 0;
}
