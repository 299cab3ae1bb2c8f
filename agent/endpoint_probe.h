#pragma once

// Why the rendezvous endpoint does not answer, found with plain sockets while
// the gRPC channel keeps trying (gRPC itself only says "unavailable"): the
// host does not resolve, nothing listens, or something that is not a meshrun
// daemon answers there, which waiting cannot mend.
//
// Thread-safety: ProbeEndpoint blocks (DNS, connect, a short read); callers
// run it off their event loop. ClassifyGreeting is pure.

#include <chrono>
#include <string>
#include <string_view>

namespace meshrun::agent {

enum class Greeting {
  kHttp2,    // an HTTP/2 frame: what a gRPC server sends first
  kHttp1,    // "HTTP/1.x ...": a web server
  kTls,      // a TLS record: the peer expects TLS
  kUnknown,  // anything else
};

// What the first bytes a peer sent after our HTTP/2 client preface say about
// it. REQUIRES: `bytes` is not empty.
Greeting ClassifyGreeting(std::string_view bytes);

struct ProbeResult {
  enum class Kind {
    kAnswers,       // a TCP connection, and (without TLS) an HTTP/2 answer
    kUnresolvable,  // DNS failure
    kRefused,       // nothing listens on the port
    kUnreachable,   // any other connect error, or no answer to connect
    kSilent,        // accepts connections and says nothing (or closes them)
    kNotMeshrun,    // answers, but not as a gRPC server: waiting cannot help
  };
  Kind kind = Kind::kAnswers;
  std::string detail;  // one line for the user
};

// `endpoint` is HOST:PORT or [V6]:PORT. With `tls` the peer is expected to
// speak TLS first, so only DNS and the TCP connection are checked.
ProbeResult ProbeEndpoint(const std::string& endpoint, bool tls,
                          std::chrono::milliseconds timeout);

// Each endpoint of a list of daemon replicas "A,B,..." in turn (`timeout`
// each): kAnswers when one answers; kNotMeshrun when one is not a meshrun
// daemon (a wrong port in the list); otherwise the first entry's kind and
// every entry's detail. One endpoint: ProbeEndpoint.
ProbeResult ProbeEndpoints(const std::string& endpoints, bool tls,
                           std::chrono::milliseconds timeout);

}  // namespace meshrun::agent
