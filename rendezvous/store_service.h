#pragma once

// gRPC adapter of the Store service: converts StoreRequest/StoreResponse to
// KvStore calls and delivers the waiters KvStore wakes. One callback-API
// reactor per client stream, so a parked wait costs no thread.
//
// Thread-safe. All KvStore access is serialised by one mutex; the core's
// operations are short, and the notes in shared/notes show the server's
// cost is gRPC's, not the map's.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "meshrun/v1/store.grpc.pb.h"
#include "rendezvous/deadline_timer.h"
#include "rendezvous/kv_store.h"

namespace meshrun::rdzv {

struct StoreServiceOptions {
  StoreLimits limits;
  // Used when a blocking request says timeout_ms = 0 (c10d's default).
  std::chrono::milliseconds default_timeout{300000};
  // A session stops reading once this many replies wait to be written, so a
  // client that never reads cannot make the daemon buffer without bound.
  size_t max_queued_replies_per_session = 4096;
};

struct StoreServiceStats {
  uint64_t sessions_open = 0;
  uint64_t ops = 0;
  uint64_t waiters = 0;
};

class StoreService final : public meshrun::v1::Store::CallbackService {
 public:
  explicit StoreService(StoreServiceOptions options);
  ~StoreService() override;

  grpc::ServerBidiReactor<meshrun::v1::StoreRequest, meshrun::v1::StoreResponse>* Session(
      grpc::CallbackServerContext* context) override;

  StoreServiceStats Stats();

  class StoreSession;  // one client stream; defined in the .cc

 private:
  friend class StoreSession;
  struct PendingWait {
    StoreSession* session;
    uint64_t request_id;
  };

  // Executes one request; replies now or parks it. Called by sessions.
  void Handle(StoreSession* session, const meshrun::v1::StoreRequest& request);
  // The session's stream ended: forget its parked waits.
  void EndSession(StoreSession* session);
  // REQUIRES: mu_ held.
  void DeliverLocked(std::vector<Wakeup>& woken);
  std::optional<TimePoint> Expire(TimePoint now);

  const StoreServiceOptions options_;
  std::mutex mu_;
  KvStore store_;                                      // guarded by mu_
  std::unordered_map<WaiterId, PendingWait> pending_;  // guarded by mu_
  // The same waits by session, so a closing stream finds its own quickly.
  std::unordered_map<StoreSession*, std::unordered_set<WaiterId>>
      parked_;                  // guarded by mu_
  WaiterId next_waiter_ = 1;    // guarded by mu_
  uint64_t sessions_open_ = 0;  // guarded by mu_
  std::atomic<uint64_t> ops_{0};
  std::unique_ptr<DeadlineTimer> timer_;
};

}  // namespace meshrun::rdzv
