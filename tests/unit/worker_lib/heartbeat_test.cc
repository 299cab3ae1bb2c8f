#include "worker_lib/env/heartbeat.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>

namespace meshrun::worker {
namespace {

// An agent's end: an abstract datagram socket that is told who sent each
// datagram, as agent/heartbeat_server.cc binds it.
class AgentSocket {
 public:
  AgentSocket() {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    const int on = 1;
    setsockopt(fd_, SOL_SOCKET, SO_PASSCRED, &on, sizeof on);
    name_ = "meshrun-heartbeat-test-" + std::to_string(getpid());
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path + 1, name_.data(), name_.size());
    bound_ = bind(fd_, reinterpret_cast<const sockaddr*>(&address),
                  static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                                         name_.size())) == 0;
    timeval timeout{5, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  }
  ~AgentSocket() { close(fd_); }
  bool bound() const { return bound_; }
  std::string env_value() const { return "@" + name_; }

  // The sender's pid of the next datagram, or -1; its bytes in `payload`.
  pid_t Receive(std::string* payload = nullptr) {
    char data[64];
    iovec part{data, sizeof data};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
    msghdr message{};
    message.msg_iov = &part;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    const ssize_t got = recvmsg(fd_, &message, 0);
    if (got < 0) return -1;
    if (payload != nullptr) payload->assign(data, static_cast<size_t>(got));
    for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
         header = CMSG_NXTHDR(&message, header)) {
      if (header->cmsg_type == SCM_CREDENTIALS) {
        ucred credentials;
        std::memcpy(&credentials, CMSG_DATA(header), sizeof credentials);
        return credentials.pid;
      }
    }
    return -1;
  }

 private:
  int fd_ = -1;
  std::string name_;
  bool bound_ = false;
};

TEST(HeartbeatTest, ReachesTheAgentAsThisProcess) {
  AgentSocket agent;
  ASSERT_TRUE(agent.bound());
  setenv("MESHRUN_HEARTBEAT_SOCKET", agent.env_value().c_str(), 1);
  EXPECT_TRUE(Heartbeat());
  EXPECT_TRUE(Heartbeat());
  EXPECT_EQ(agent.Receive(), getpid());
  EXPECT_EQ(agent.Receive(), getpid());
  unsetenv("MESHRUN_HEARTBEAT_SOCKET");
}

TEST(HeartbeatTest, CarriesTheStepTimeWhenGiven) {
  AgentSocket agent;
  ASSERT_TRUE(agent.bound());
  setenv("MESHRUN_HEARTBEAT_SOCKET", agent.env_value().c_str(), 1);
  std::string payload;
  EXPECT_TRUE(Heartbeat(0.25));
  EXPECT_EQ(agent.Receive(&payload), getpid());
  EXPECT_EQ(payload, "step=0.250000");
  EXPECT_TRUE(Heartbeat());
  EXPECT_EQ(agent.Receive(&payload), getpid());
  EXPECT_EQ(payload, "1");
  unsetenv("MESHRUN_HEARTBEAT_SOCKET");
}

TEST(HeartbeatTest, WithoutAnAgentItSaysSoAndDoesNothing) {
  unsetenv("MESHRUN_HEARTBEAT_SOCKET");
  EXPECT_FALSE(Heartbeat());
  setenv("MESHRUN_HEARTBEAT_SOCKET", "/not/abstract", 1);
  EXPECT_FALSE(Heartbeat());
  // Nobody bound there.
  setenv("MESHRUN_HEARTBEAT_SOCKET", "@meshrun-heartbeat-nobody-here", 1);
  EXPECT_FALSE(Heartbeat());
  unsetenv("MESHRUN_HEARTBEAT_SOCKET");
}

}  // namespace
}  // namespace meshrun::worker
