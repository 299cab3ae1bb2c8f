#include "launcher/local_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>

namespace meshrun::launcher {

namespace {

std::string AddressText(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, text,
              sizeof text);
  } else if (addr->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, text,
              sizeof text);
  }
  return text;
}

std::set<std::string> InterfaceAddresses() {
  std::set<std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* it = list; it; it = it->ifa_next)
    if (it->ifa_addr) out.insert(AddressText(it->ifa_addr));
  freeifaddrs(list);
  out.erase("");
  return out;
}

}  // namespace

std::string LocalHostName() {
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

bool SomethingListens(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &resolved) != 0) return false;
  bool listening = false;
  for (addrinfo* it = resolved; it && !listening; it = it->ai_next) {
    int fd = socket(it->ai_family, it->ai_socktype | SOCK_CLOEXEC, it->ai_protocol);
    if (fd < 0) continue;
    listening = connect(fd, it->ai_addr, it->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(resolved);
  return listening;
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

bool IsLocalAddress(const std::string& host) {
  if (IsLoopback(host)) return true;
  std::string name = LocalHostName();
  if (host == name || host.rfind(name + ".", 0) == 0) return true;
  std::set<std::string> mine = InterfaceAddresses();
  if (mine.count(host)) return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &resolved) != 0) return false;
  bool local = false;
  for (addrinfo* it = resolved; it && !local; it = it->ai_next) {
    std::string text = AddressText(it->ai_addr);
    local = mine.count(text) > 0 || IsLoopback(text);
  }
  freeaddrinfo(resolved);
  return local;
}

}  // namespace meshrun::launcher
