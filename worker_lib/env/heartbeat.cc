#include "worker_lib/env/heartbeat.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace meshrun::worker {

bool Heartbeat(std::optional<double> step_seconds) {
  const char* name = std::getenv("MESHRUN_HEARTBEAT_SOCKET");
  // "@name": an abstract socket, the '@' standing for the leading NUL.
  if (name == nullptr || name[0] != '@' ||
      std::strlen(name) >= sizeof(sockaddr_un::sun_path))
    return false;
  static std::mutex mu;
  static int fd = -1;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> lock(mu);
  // A forked child must not send on its parent's socket as if it were it.
  if (fd < 0 || owner != getpid()) {
    if (fd >= 0) close(fd);
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    owner = getpid();
    if (fd < 0) return false;
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const size_t length = std::strlen(name + 1);
  std::memcpy(address.sun_path + 1, name + 1, length);
  const auto size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + length);
  char payload[64] = "1";
  if (step_seconds) std::snprintf(payload, sizeof payload, "step=%.6f", *step_seconds);
  const size_t bytes = std::strlen(payload);
  return sendto(fd, payload, bytes, MSG_NOSIGNAL,
                reinterpret_cast<const sockaddr*>(&address),
                size) == static_cast<ssize_t>(bytes);
}

}  // namespace meshrun::worker
