#include "rendezvous/client/endpoint_list.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace meshrun::rdzv {

bool IsEndpointList(absl::string_view endpoint) {
  return endpoint.find(',') != absl::string_view::npos;
}

std::vector<std::string> SplitEndpointList(absl::string_view list) {
  std::vector<std::string> entries;
  for (absl::string_view entry : absl::StrSplit(list, ','))
    entries.emplace_back(absl::StripAsciiWhitespace(entry));
  return entries;
}

bool SplitHostPort(absl::string_view endpoint, std::string* host, int* port) {
  const size_t colon = endpoint.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  int value = 0;
  if (!absl::SimpleAtoi(endpoint.substr(colon + 1), &value) || value < 1 || value > 65535)
    return false;
  absl::string_view name = endpoint.substr(0, colon);
  if (absl::ConsumePrefix(&name, "[")) {
    if (!absl::ConsumeSuffix(&name, "]") || name.empty()) return false;
  } else if (name.find(':') != absl::string_view::npos) {
    return false;
  }
  *host = std::string(name);
  *port = value;
  return true;
}

std::string SockaddrTarget(const std::vector<ResolvedAddress>& addresses) {
  const bool all_v4 = std::all_of(
      addresses.begin(), addresses.end(),
      [](const ResolvedAddress& a) { return a.ip.find(':') == std::string::npos; });
  std::vector<std::string> parts;
  parts.reserve(addresses.size());
  for (const ResolvedAddress& address : addresses) {
    if (all_v4) {
      parts.push_back(absl::StrCat(address.ip, ":", address.port));
    } else if (address.ip.find(':') == std::string::npos) {
      parts.push_back(absl::StrCat("[::ffff:", address.ip, "]:", address.port));
    } else {
      parts.push_back(absl::StrCat("[", address.ip, "]:", address.port));
    }
  }
  return absl::StrCat(all_v4 ? "ipv4:" : "ipv6:", absl::StrJoin(parts, ","));
}

namespace {

// Every address of `host` for a TCP connection, numeric, in getaddrinfo's
// order (RFC 6724's preference); empty when it does not resolve.
std::vector<std::string> Addresses(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::vector<std::string> ips;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return ips;
  for (addrinfo* info = found; info != nullptr; info = info->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw = nullptr;
    if (info->ai_family == AF_INET) {
      raw = &reinterpret_cast<const sockaddr_in*>(info->ai_addr)->sin_addr;
    } else if (info->ai_family == AF_INET6) {
      raw = &reinterpret_cast<const sockaddr_in6*>(info->ai_addr)->sin6_addr;
    } else {
      continue;
    }
    if (inet_ntop(info->ai_family, raw, text, sizeof text) == nullptr) continue;
    if (std::find(ips.begin(), ips.end(), text) == ips.end()) ips.emplace_back(text);
  }
  freeaddrinfo(found);
  return ips;
}

}  // namespace

ChannelTarget ResolveChannelTarget(const std::string& endpoint) {
  ChannelTarget out;
  if (!IsEndpointList(endpoint)) {
    out.target = endpoint;
    return out;
  }
  const std::vector<std::string> entries = SplitEndpointList(endpoint);
  std::vector<ResolvedAddress> addresses;
  for (const std::string& entry : entries) {
    std::string host;
    int port = 0;
    if (!SplitHostPort(entry, &host, &port)) {
      // Not ours to judge (a gRPC URI with a comma, say): as given.
      out.target = endpoint;
      return out;
    }
    if (out.tls_name.empty()) out.tls_name = host;
    const std::vector<std::string> ips = Addresses(host);
    if (ips.empty()) out.unresolved.push_back(entry);
    for (const std::string& ip : ips) {
      const bool seen = std::any_of(
          addresses.begin(), addresses.end(),
          [&](const ResolvedAddress& a) { return a.ip == ip && a.port == port; });
      if (!seen) addresses.push_back({ip, port});
    }
  }
  out.target = addresses.empty() ? entries.front() : SockaddrTarget(addresses);
  return out;
}

}  // namespace meshrun::rdzv
