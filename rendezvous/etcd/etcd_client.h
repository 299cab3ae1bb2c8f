#pragma once

// A small synchronous client of etcd's v3 gRPC API (proto/etcd/etcd_v3.proto):
// what meshrun-rdzvd needs to keep its state in etcd and elect a leader.
// Several endpoints (members of one cluster): a call goes to the member that
// last answered and moves on to the next when that one is down, cut off or
// without a raft leader, so losing a member costs one call timeout at most.
// With a user, the client authenticates and sends etcd's token with every
// call, authenticating again when etcd has dropped it.
//
// Thread-safe: calls from several threads run concurrently.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "etcd/etcd_v3.grpc.pb.h"

namespace meshrun::rdzv {

struct EtcdClientOptions {
  std::vector<std::string> endpoints;  // host:port of each member
  std::string user;                    // empty: etcd without authentication
  std::string password;
  // TLS when ca_pem is set; a client certificate when cert_pem and key_pem are.
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  // One call on one member; a call tries each member once.
  std::chrono::milliseconds call_timeout{2000};
};

// "a:1,b:2" -> endpoints; INVALID_ARGUMENT names a bad entry.
absl::StatusOr<std::vector<std::string>> ParseEtcdEndpoints(const std::string& list);

class EtcdClient {
 public:
  explicit EtcdClient(EtcdClientOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // Checks that the endpoints are etcd and that the credentials work.
  // INVALID_ARGUMENT: an endpoint answers but is not etcd, or the credentials
  // are refused (nothing to retry); UNAVAILABLE: no member answered.
  absl::Status Check();

  absl::StatusOr<etcdserverpb::RangeResponse> Range(
      const etcdserverpb::RangeRequest& request);
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& request);
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> LeaseGrant(int64_t ttl_s);
  // The lease's remaining TTL in seconds; 0 or less when etcd has dropped it.
  absl::StatusOr<int64_t> LeaseKeepAlive(int64_t lease_id);
  absl::Status LeaseRevoke(int64_t lease_id);

  // The member the next call goes to first.
  std::string current_endpoint();
  const EtcdClientOptions& options() const { return options_; }

 private:
  struct Member {
    std::string endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
    std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  };
  // Runs `call` on each member in turn from the current one until one
  // answers with something other than "unreachable" or "no raft leader".
  template <typename Call>
  absl::Status OnSomeMember(const char* what, Call&& call);
  std::unique_ptr<grpc::ClientContext> Context();
  absl::Status Authenticate(Member& member);
  void DriveConnections();

  EtcdClientOptions options_;
  std::vector<Member> members_;
  std::mutex mu_;
  size_t current_ = 0;     // guarded by mu_
  std::string token_;      // guarded by mu_
  bool stopping_ = false;  // guarded by mu_
  std::condition_variable stop_cv_;
  std::thread connection_driver_;
};

}  // namespace meshrun::rdzv
