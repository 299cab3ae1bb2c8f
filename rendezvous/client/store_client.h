#pragma once

// Client of the daemon's Store service. Calls travel on a bidirectional
// BatchSession stream; any number of threads may call a StoreClient at once
// and their requests are multiplexed on that stream (each call blocks its own
// thread only). By default StoreClients of one process on the same channel
// (or, without a channel, the same target) share one stream: the requests of
// concurrent callers are then sent together as one gRPC message, which is
// where gRPC's cost lies. The calling threads do the stream's I/O themselves
// (no background thread, no hand-off when a caller is alone).
//
// Thread-safe. Blocking calls return UNAVAILABLE if the stream breaks; a
// StoreClient connected after that gets a new stream.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "meshrun/v1/store.pb.h"
#include "rendezvous/security/security.h"

namespace grpc {
class Channel;
}

namespace meshrun::rdzv {

struct StoreClientOptions {
  // "host:port" of meshrun-rdzvd. Ignored when `channel` is set.
  std::string target;
  // Reuse an existing channel (shared connection); optional.
  std::shared_ptr<grpc::Channel> channel;
  // Token and TLS of the channel made for `target` (ignored with `channel`).
  ClientSecurity security;
  // The store namespace every call of this client uses.
  std::string ns;
  // Default for get/wait/multi_get (c10d's default store timeout is 300 s).
  std::chrono::milliseconds timeout{300000};
  // How long Connect() waits for the daemon to answer.
  std::chrono::milliseconds connect_timeout{10000};
  // Share the stream with other StoreClients of this process on the same
  // channel (or target). c10d semantics hold either way: every call is
  // answered by its own reply, and a parked wait holds up no other call.
  bool share_stream = true;
};

// A channel to `target` tuned for the store; `own_connection` gives it a TCP
// connection of its own instead of gRPC's process-wide shared one.
std::shared_ptr<grpc::Channel> MakeStoreChannel(const std::string& target,
                                                bool own_connection,
                                                const ClientSecurity& security = {});

class StoreClient {
 public:
  static absl::StatusOr<std::unique_ptr<StoreClient>> Connect(StoreClientOptions options);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  absl::Status Set(const std::string& key, const std::string& value);
  absl::StatusOr<std::string> Get(const std::string& key);
  absl::StatusOr<std::string> Get(const std::string& key,
                                  std::chrono::milliseconds timeout);
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  absl::StatusOr<std::string> CompareSet(const std::string& key,
                                         const std::string& expected,
                                         const std::string& desired);
  absl::Status Wait(const std::vector<std::string>& keys);
  absl::Status Wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout);
  absl::StatusOr<bool> Delete(const std::string& key);
  absl::StatusOr<int64_t> NumKeys();
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys);
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys);
  absl::Status MultiSet(const std::vector<std::pair<std::string, std::string>>& entries);
  absl::Status Append(const std::string& key, const std::string& value);

  const std::string& ns() const;
  std::chrono::milliseconds timeout() const;

 private:
  class Stream;  // the gRPC reactor, in store_client.cc
  explicit StoreClient(StoreClientOptions options);
  // A live stream for this client: the shared one if another client already
  // replaced `broken`, else a new one once the channel (re)connects.
  absl::StatusOr<std::shared_ptr<Stream>> OpenStream(
      const std::shared_ptr<Stream>& broken,
      std::chrono::system_clock::time_point deadline);
  // Sends one request; after the stream breaks, reconnects and repeats it if
  // it is a read or was not sent yet (see SafeToRepeat in store_client.cc).
  absl::StatusOr<meshrun::v1::StoreResponse> Call(meshrun::v1::StoreRequest request);

  const StoreClientOptions options_;
  std::string registry_key_;  // where a shared stream is registered
  std::mutex mu_;
  std::shared_ptr<Stream> stream_;  // guarded by mu_; replaced after it breaks
};

}  // namespace meshrun::rdzv
