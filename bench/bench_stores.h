#pragma once

// The two stores under test behind one small interface, so the workloads are
// written once: meshrun's StoreClient (one Session stream on a shared or an
// own channel) and c10d's TCPStore (one client object, its own sockets).
// c10d's exceptions are caught here and turned into statuses.
//
// A BenchStore is used by one thread at a time.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace grpc {
class Channel;
}

namespace meshrun::bench {

// kMeshrun: meshrun's gRPC StoreClient against meshrun-rdzvd.
// kTcpStore: c10d's stock TCPStore client against torch's libuv TCPStore server.
// kMeshrunTcpStore: the same stock TCPStore client against meshrun-rdzvd's
//   TCPStore endpoint (its gRPC port, c10d's wire protocol): only the server
//   differs from kTcpStore.
// kMeshrunSync: the diagnostic client of sync_stream_store.h, not a product.
enum class Impl { kMeshrun, kTcpStore, kMeshrunSync, kMeshrunTcpStore };
const char* ToString(Impl impl);

// Whether `impl`'s clients are c10d::TCPStore objects (ConnectTcpStore).
inline bool UsesTcpStoreClient(Impl impl) {
  return impl == Impl::kTcpStore || impl == Impl::kMeshrunTcpStore;
}

class BenchStore {
 public:
  virtual ~BenchStore() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  virtual absl::StatusOr<std::string> Get(const std::string& key) = 0;
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
  virtual absl::Status Wait(const std::vector<std::string>& keys) = 0;
  // A round trip that changes nothing (c10d check).
  virtual absl::StatusOr<bool> Check(const std::vector<std::string>& keys) = 0;
};

// `channel` null: the client makes its own channel with its own connection.
// `timeout` bounds connecting and every blocking call.
absl::StatusOr<std::unique_ptr<BenchStore>> ConnectMeshrun(
    const std::string& target, std::shared_ptr<grpc::Channel> channel,
    std::chrono::milliseconds timeout);

// A TCPStore client (isServer=false) of the server at host:port.
absl::StatusOr<std::unique_ptr<BenchStore>> ConnectTcpStore(
    const std::string& host, int port, std::chrono::milliseconds timeout);

// Runs a TCPStore server (isServer=true, port 0, the libuv backend: an error
// if libtorch serves with the classic one) in this process until the returned
// object goes away; reports the port the kernel gave it.
class TcpStoreServer {
 public:
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(
      std::chrono::milliseconds timeout);
  virtual ~TcpStoreServer() = default;
  virtual int port() const = 0;
};

}  // namespace meshrun::bench
