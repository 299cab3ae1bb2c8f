#pragma once

// A c10d::Store over meshrun-rdzvd's Store service, scoped to one namespace
// (the round's MESHRUN_STORE_PREFIX), so Gloo and NCCL rendezvous through
// meshrun with no second TCPStore. c10d::PrefixStore composes with it.
//
// Semantics are TCPStore's: get() blocks until the key exists, up to the
// store timeout (getTimeout(); kNoTimeout waits forever, where TCPStore 2
// times out at once); wait(keys) likewise; compareSet with an absent key and empty
// `expected` creates it; add() counts in decimal text; multiGet, multiSet and append (the
// extended API) take one round trip each. Errors are thrown as StoreError (a
// c10::DistStoreError) whose what() is one line; a timeout is a StoreTimeoutError
// reading "Wait timeout after 300 ms in get: timed out waiting for keys: 'a',
// 'b' (meshrun store 127.0.0.1:29400, namespace 'job/r1')".
// Differences from TCPStore: getNumKeys() counts this namespace only (a
// TCPStore counts its whole server); add() on a non-integer value is an error
// here (TCPStore 1.13's server dropped the connection); watchKey() is not
// supported (deprecated in c10d 2.x); a timed-out call leaves the store usable
// (TCPStore 1.13's client socket is out of step after a timeout).
//
// Thread-safety: every call may come from any thread at once; calls are
// multiplexed on one gRPC stream, and a blocked get/wait does not hold up other
// calls (TCPStore serialises all calls of one object). setTimeout() must not
// race with other calls (as in c10d).

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "rendezvous/security/security.h"

namespace meshrun::rdzv {
class StoreClient;
}

namespace meshrun::worker {

// What GrpcStore throws: a c10::DistStoreError (as c10d's stores throw) whose
// what() is the one-line message, without c10's trailing backtrace section.
class StoreError : public c10::DistStoreError {
 public:
  explicit StoreError(std::string message)
      : c10::DistStoreError(std::move(message), /*backtrace=*/nullptr) {}
  const char* what() const noexcept override { return what_without_backtrace(); }
};

// A get/wait/multiGet that ran out of time; names the missing keys.
class StoreTimeoutError : public StoreError {
 public:
  using StoreError::StoreError;
};

struct GrpcStoreOptions {
  std::string endpoint;  // "host:port" of meshrun-rdzvd (MESHRUN_STORE_ENDPOINT)
  std::string ns;        // the namespace (MESHRUN_STORE_PREFIX)
  // The store timeout for get() and wait(keys); c10d's default.
  std::chrono::milliseconds timeout = c10d::Store::kDefaultTimeout;
  std::chrono::milliseconds connect_timeout{30000};
  // A TCP connection of this store's own instead of gRPC's process-wide
  // shared one (several stores in one process, e.g. tests).
  bool own_connection = false;
  // Token and TLS; unset: from the environment meshrun gives its workers
  // (MESHRUN_RDZV_TOKEN(_FILE), MESHRUN_RDZV_TLS_*; rendezvous/security.h).
  std::optional<rdzv::ClientSecurity> security;
};

class GrpcStore : public c10d::Store {
 public:
  // Connects to the daemon; UNAVAILABLE if it does not answer in time.
  static absl::StatusOr<c10::intrusive_ptr<GrpcStore>> Connect(GrpcStoreOptions options);

  // Over an existing client; calls use `client->ns()`. `endpoint` only names
  // the daemon in messages.
  GrpcStore(std::shared_ptr<rdzv::StoreClient> client, std::string endpoint,
            std::chrono::milliseconds timeout);
  ~GrpcStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key,
                                  const std::vector<uint8_t>& expected_value,
                                  const std::vector<uint8_t>& desired_value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  // get() with its own timeout instead of the store's (kNoTimeout: forever).
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout);
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  // A store over the same connection and namespace (c10d clones a store for
  // a backend's own threads).
  c10::intrusive_ptr<c10d::Store> clone() override;

  // The extended API, each one round trip. multiGet blocks like get() until
  // every key exists.
  std::vector<std::vector<uint8_t>> multiGet(
      const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) override;
  void append(const std::string& key, const std::vector<uint8_t>& value) override;
  bool hasExtendedApi() const override { return true; }

  const std::string& endpoint() const { return endpoint_; }
  const std::string& ns() const;
  rdzv::StoreClient& client() { return *client_; }

 private:
  std::shared_ptr<rdzv::StoreClient> client_;
  std::string endpoint_;
};

}  // namespace meshrun::worker
