#pragma once

// A daemon endpoint as clients are given it: "host:port", or a list
// "h1:p1,h2:p2,..." of daemon replicas of which one serves at a time (the
// others refuse connections). One gRPC channel covers a whole list: its
// target names every address, and gRPC's pick_first policy connects to the
// first of them that accepts, in order, again from the first whenever the
// connection is lost. gRPC's own sockaddr resolvers ("ipv4:a:p,b:p",
// "ipv6:[a]:p,...") take numeric addresses only, so host names in a list
// are resolved here (getaddrinfo) when the channel is made: a name whose
// addresses change later is followed only by a channel made later. A
// single endpoint stays a plain target that gRPC's DNS resolver resolves
// (and re-resolves) itself.
//
// Thread-safe: plain functions.

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace meshrun::rdzv {

// With a list, a connection attempt gets this long (gRPC's
// GRPC_ARG_MIN_RECONNECT_BACKOFF_MS) before the list's next address is
// tried: gRPC's default, 20 s, on a replica whose host went silent would
// outlast a failover.
inline constexpr int kReplicaConnectTimeoutMs = 3000;

// Whether `endpoint` is a list of more than one endpoint (has a comma).
bool IsEndpointList(absl::string_view endpoint);

// The entries of a list, whitespace around each removed, empty ones kept
// (callers that validate refuse them). "a:1" -> {"a:1"}.
std::vector<std::string> SplitEndpointList(absl::string_view list);

// "host:port" or "[v6]:port" -> host without brackets and port; false when
// there is no valid port in 1..65535 or no host.
bool SplitHostPort(absl::string_view endpoint, std::string* host, int* port);

// A numeric address and its port, as getaddrinfo gives them.
struct ResolvedAddress {
  std::string ip;  // "10.0.0.1" or "fd00::1", no brackets
  int port = 0;
};

// The sockaddr-resolver target for `addresses`, in order: "ipv4:a:p,b:p"
// when every one is IPv4, else "ipv6:[a]:p,..." with IPv4 addresses mapped
// (::ffff:a.b.c.d: gRPC's sockets are dual-stack). REQUIRES: non-empty.
std::string SockaddrTarget(const std::vector<ResolvedAddress>& addresses);

struct ChannelTarget {
  std::string target;  // what grpc::CreateChannel takes
  // A list's first host: the name a TLS channel checks every daemon's
  // certificate against (a sockaddr target names no host). Empty for a
  // single endpoint.
  std::string tls_name;
  // List entries that did not resolve (left out of `target`).
  std::vector<std::string> unresolved;
};

// The channel target for `endpoint` (see the file comment): unchanged for
// one endpoint or anything that is not a list of host:port entries; the
// resolved addresses of every entry, in the list's order and without
// repeats, for a list. Where no entry resolves, the first entry as a DNS
// target, so the channel reports (and retries) it as it would alone. May
// block on DNS.
ChannelTarget ResolveChannelTarget(const std::string& endpoint);

}  // namespace meshrun::rdzv
