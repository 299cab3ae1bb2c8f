#pragma once

// Test support: a small network of Linux network namespaces for partition
// tests. A hub namespace holds a bridge at 10.200.0.1/24; node i lives in a
// namespace of its own at 10.200.0.(10 + i), linked to the hub by a veth
// pair. Cut(i) takes node i's link down (its packets vanish, no reset is
// sent), Heal(i) brings it back. Everything is removed when the lab goes
// away. Needs root and iproute2; Unavailable() says why not otherwise.

#include <optional>
#include <string>
#include <vector>

namespace meshrun::testing {

class NetnsLab {
 public:
  // Why a lab cannot be built here (not root, no `ip`), or nullopt.
  static std::optional<std::string> Unavailable();

  explicit NetnsLab(int nodes);  // throws std::runtime_error on failure
  ~NetnsLab();
  NetnsLab(const NetnsLab&) = delete;
  NetnsLab& operator=(const NetnsLab&) = delete;

  std::string hub_address() const { return "10.200.0.1"; }
  std::string node_address(int node) const;
  // The name of node `node`'s interface, inside its namespace (for
  // GLOO_SOCKET_IFNAME: Gloo otherwise looks for the machine's host name).
  std::string node_interface(int node) const;
  // `argv` run inside the hub's / node's namespace (same pid: ip execs it).
  std::vector<std::string> InHub(const std::vector<std::string>& argv) const;
  std::vector<std::string> InNode(int node, const std::vector<std::string>& argv) const;
  void Cut(int node);
  void Heal(int node);

 private:
  std::string HubVeth(int node) const;
  void TearDown();
  std::string tag_;
  std::string hub_;
  std::vector<std::string> nodes_;
};

}  // namespace meshrun::testing
