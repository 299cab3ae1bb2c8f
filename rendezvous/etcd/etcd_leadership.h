#pragma once

// Which of several meshrun-rdzvd replicas serves: the one holding the key
// <prefix>leader in etcd, attached to its etcd lease. The others stand by and
// take the key when the leader's lease runs out (it died, or lost etcd).
//
// Keys under <prefix> (the deployment's; Open refuses a prefix holding
// anything else):
//   meta    "meshrun-rdzvd state 1 deployment=<name>": whose prefix this is
//   term    how many times a daemon has become leader
//   leader  "<endpoint> term=<n> id=<random>", with the leader's lease
// Every write of the leader's state carries Fence(): the leader key still
// holds this daemon's value. A daemon whose lease ran out (paused, cut off
// from etcd) can therefore write nothing once another leads; when no other
// did (the term is unchanged) it takes the key back and carries on, since
// its state is still the latest.
//
// Thread-safe.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "rendezvous/etcd/etcd_client.h"

namespace meshrun::rdzv {

struct EtcdLeadershipOptions {
  std::string prefix = "/meshrun/";  // ends with '/'
  std::string deployment = "meshrun";
  std::string endpoint;  // this daemon's, for the others' logs and status
  int lease_ttl_s = 3;
  // How often a standby looks whether the leader key is gone.
  std::chrono::milliseconds poll_interval{250};
};

class EtcdLeadership {
 public:
  // Checks that <prefix> is this deployment's (INVALID_ARGUMENT, nothing
  // written, when it holds keys of anything else) and marks it when empty.
  static absl::StatusOr<std::unique_ptr<EtcdLeadership>> Open(
      std::shared_ptr<EtcdClient> etcd, EtcdLeadershipOptions options);
  ~EtcdLeadership();  // stops the keep-alive thread; the lease runs out by itself

  // Blocks until this daemon leads, or `stop` returns true (CANCELLED).
  // `leader_seen` is called with the leader's value whenever it changes.
  absl::Status Campaign(const std::function<bool()>& stop,
                        const std::function<void(const std::string&)>& leader_seen);
  // After Campaign: keeps the lease alive on a thread of its own. `lost` is
  // called once, on that thread, when another daemon leads.
  void KeepLeading(std::function<void(const std::string&)> lost);
  // After a write failed its fence: takes leadership back if nobody else led
  // meanwhile (OK: write again with the new Fence()), else FAILED_PRECONDITION
  // naming who leads. UNAVAILABLE while etcd cannot be reached.
  absl::Status Reconfirm();
  // Gives the key up at once (a clean shutdown), so a standby need not wait
  // for the lease to run out.
  void Resign();

  // The compare that every write of the leader's carries.
  etcdserverpb::Compare Fence();
  uint64_t term();
  // Whether the last keep-alive reached etcd.
  bool etcd_reachable() const { return etcd_reachable_.load(); }
  const std::string& prefix() const { return options_.prefix; }
  EtcdClient& etcd() { return *etcd_; }

 private:
  EtcdLeadership() = default;
  // One attempt to become leader with lease `lease`: compares that nobody
  // leads and that the term is still `expected_term` (any term when
  // expected_term is 0 and any_term). Returns whether it won and, if not, the
  // leader's value.
  absl::StatusOr<bool> TryLead(int64_t lease, uint64_t expected_term, bool any_term,
                               std::string* leader);
  void KeepAliveLoop();

  std::shared_ptr<EtcdClient> etcd_;
  EtcdLeadershipOptions options_;
  std::mutex reconfirm_mu_;  // one Reconfirm at a time; taken before mu_
  std::mutex mu_;
  int64_t lease_ = 0;     // guarded by mu_
  uint64_t term_ = 0;     // guarded by mu_
  std::string value_;     // guarded by mu_: the leader key's value while leading
  bool leading_ = false;  // guarded by mu_
  std::atomic<bool> etcd_reachable_{true};
  std::function<void(const std::string&)> lost_;
  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  std::thread keep_alive_;
};

}  // namespace meshrun::rdzv
