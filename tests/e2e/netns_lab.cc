#include "tests/e2e/netns_lab.h"

#include <sys/wait.h>
#include <unistd.h>

#include <stdexcept>

#include "tests/support/child_process.h"

namespace meshrun::testing {
namespace {

constexpr char kIp[] = "/usr/sbin/ip";

// Runs `ip args...`; throws with its output when it fails.
void Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv{kIp};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess ip(argv, /*merge_stderr=*/true);
  ip.ReadAll(std::chrono::seconds(20));
  auto status = ip.Wait(std::chrono::seconds(20));
  if (!status || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    std::string command;
    for (const auto& a : argv) command += a + " ";
    throw std::runtime_error("`" + command + "` failed: " + ip.output());
  }
}

}  // namespace

std::optional<std::string> NetnsLab::Unavailable() {
  if (geteuid() != 0) return "network namespaces need root";
  if (access(kIp, X_OK) != 0) return std::string(kIp) + " not found (install iproute2)";
  // Root without CAP_SYS_ADMIN (some containers) cannot make namespaces.
  const std::string probe = "mr" + std::to_string(getpid()) + "-probe";
  try {
    Ip({"netns", "add", probe});
    Ip({"netns", "del", probe});
  } catch (const std::exception& e) {
    return std::string("cannot create network namespaces here: ") + e.what();
  }
  return std::nullopt;
}

NetnsLab::NetnsLab(int nodes) {
  // Names are unique per test process; veth names must fit in 15 bytes.
  tag_ = "mr" + std::to_string(getpid());
  hub_ = tag_ + "-hub";
  try {
    Ip({"netns", "add", hub_});
    Ip({"-n", hub_, "link", "set", "lo", "up"});
    Ip({"-n", hub_, "link", "add", "br0", "type", "bridge"});
    Ip({"-n", hub_, "addr", "add", hub_address() + "/24", "dev", "br0"});
    Ip({"-n", hub_, "link", "set", "br0", "up"});
    for (int i = 0; i < nodes; ++i) {
      const std::string ns = tag_ + "-n" + std::to_string(i);
      Ip({"netns", "add", ns});
      nodes_.push_back(ns);
      const std::string node_side = node_interface(i);
      // Created inside the hub namespace, so no name ever lands in the
      // machine's own namespace.
      Ip({"-n", hub_, "link", "add", HubVeth(i), "type", "veth", "peer", "name",
          node_side, "netns", ns});
      Ip({"-n", hub_, "link", "set", HubVeth(i), "master", "br0"});
      Ip({"-n", hub_, "link", "set", HubVeth(i), "up"});
      Ip({"-n", ns, "link", "set", "lo", "up"});
      Ip({"-n", ns, "addr", "add", node_address(i) + "/24", "dev", node_side});
      Ip({"-n", ns, "link", "set", node_side, "up"});
    }
  } catch (...) {
    TearDown();
    throw;
  }
}

NetnsLab::~NetnsLab() { TearDown(); }

void NetnsLab::TearDown() {
  // Deleting a namespace removes its end of each veth pair, and with it the
  // peer. Failures are ignored: there is nothing better to do in cleanup.
  for (auto& ns : nodes_) {
    try {
      Ip({"netns", "del", ns});
    } catch (const std::exception&) {
    }
  }
  nodes_.clear();
  if (!hub_.empty()) {
    try {
      Ip({"netns", "del", hub_});
    } catch (const std::exception&) {
    }
    hub_.clear();
  }
}

std::string NetnsLab::node_interface(int node) const {
  return tag_ + "n" + std::to_string(node);
}

std::string NetnsLab::node_address(int node) const {
  return "10.200.0." + std::to_string(10 + node);
}

std::string NetnsLab::HubVeth(int node) const {
  return tag_ + "h" + std::to_string(node);
}

std::vector<std::string> NetnsLab::InHub(const std::vector<std::string>& argv) const {
  std::vector<std::string> wrapped{kIp, "netns", "exec", hub_};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return wrapped;
}

std::vector<std::string> NetnsLab::InNode(int node,
                                          const std::vector<std::string>& argv) const {
  std::vector<std::string> wrapped{kIp, "netns", "exec", nodes_.at(node)};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return wrapped;
}

void NetnsLab::Cut(int node) { Ip({"-n", hub_, "link", "set", HubVeth(node), "down"}); }

void NetnsLab::Heal(int node) { Ip({"-n", hub_, "link", "set", HubVeth(node), "up"}); }

}  // namespace meshrun::testing
