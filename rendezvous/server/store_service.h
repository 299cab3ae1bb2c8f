#pragma once

// gRPC adapter of the Store service: converts StoreRequest/StoreResponse to
// KvStore calls and delivers the waiters KvStore wakes. One callback-API
// reactor per client stream, so a parked wait costs no thread. Both protocols
// are served: Session (a message per request) and BatchSession (a message per
// batch of requests; a batch is executed under one lock acquisition and
// answered with one write, and replies that queue up while a write is in
// flight leave together in the next one).
//
// Thread-safe. All KvStore access is serialised by one mutex, held only for
// the store's own work: a request is validated before, and its metrics are
// recorded after. Held ~0.3-0.5 us a TCPStore op against ~8-10 us of
// socket work per op in the front-end's I/O threads
// (bench/results/store-analysis.md); meshrun_store_lock_acquisitions_total
// counts how often a thread found it taken.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "meshrun/v1/store.grpc.pb.h"
#include "rendezvous/core/kv_store.h"
#include "rendezvous/core/request_validation.h"
#include "rendezvous/persist/state_log.h"
#include "rendezvous/server/deadline_timer.h"
#include "rendezvous/server/store_backend.h"
#include "rendezvous/status/metrics.h"

namespace meshrun::rdzv {

struct StoreServiceOptions {
  StoreLimits limits;
  // Used when a blocking request says timeout_ms = 0 (c10d's default).
  std::chrono::milliseconds default_timeout{300000};
  // A session stops reading its requests (and executing the rest of a
  // batch) once this many replies, or this many reply bytes, wait to be
  // written, until its client reads; so a client that never reads cannot
  // make the daemon buffer without bound (each Get's reply is a copy of the
  // value). A single reply may exceed the byte bound: one request is always
  // executed.
  size_t max_queued_replies_per_session = 4096;
  size_t max_queued_reply_bytes_per_session = 64 << 20;
  // Reply bytes queued by all sessions together: past this, every session
  // with replies of its own queued stops reading until they are written.
  size_t max_queued_reply_bytes = 512 << 20;
  // A BatchSession message with more requests than this ends its stream with
  // INVALID_ARGUMENT (rdzv::StoreClient sends at most kMaxClientBatch).
  size_t max_requests_per_batch = 1024;
  // Replies are packed into one StoreResponseBatch up to about this many
  // bytes (a single larger reply travels alone), well under gRPC's limit.
  size_t max_reply_batch_bytes = 1 << 20;
  // Blocking requests one session may have parked at once (a session may say
  // less: StoreReplySink::MaxParkedWaits); past it, a blocking request is
  // answered RESOURCE_EXHAUSTED. The store's per-namespace and global caps
  // (StoreLimits) apply as well.
  size_t max_parked_waits_per_session = 1 << 14;
};

struct StoreServiceStats {
  uint64_t sessions_open = 0;
  uint64_t ops = 0;
  uint64_t waiters = 0;
  uint64_t queued_reply_bytes = 0;
};

class StoreService final : public meshrun::v1::Store::CallbackService,
                           public StoreBackend {
 public:
  explicit StoreService(StoreServiceOptions options);
  ~StoreService() override;

  grpc::ServerBidiReactor<meshrun::v1::StoreRequest, meshrun::v1::StoreResponse>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::ServerBidiReactor<meshrun::v1::StoreRequestBatch,
                          meshrun::v1::StoreResponseBatch>*
  BatchSession(grpc::CallbackServerContext* context) override;

  StoreServiceStats Stats();
  // Drops every namespace of these runs ("<run id>/r<round>"); their parked waits
  // fail with ABORTED.
  void DropRunNamespaces(const std::vector<std::string>& run_ids);
  // Ops, errors and latency by op type; sessions open and waiters parked.
  void CollectMetrics(std::vector<MetricFamily>* out);

  // --state-dir: every change is logged, and no reply (nor a wakeup it
  // causes) leaves before the log holds it. REQUIRES: before serving; `log`
  // must remain live while the service is.
  void set_state_log(StateLog* log) { log_ = log; }
  // Runs `fn` on the store under the service's lock (restore, snapshots).
  void WithStore(const std::function<void(KvStore&)>& fn);

  using ReplySink = StoreReplySink;

  // StoreBackend, for front-ends other than gRPC (the TCPStore protocol).
  void OpenSession() override;
  void Handle(ReplySink* session, const meshrun::v1::StoreRequest& request) override;
  void CancelWaits(ReplySink* session) override;
  void EndSession(ReplySink* session) override;
  void AddQueuedReplyBytes(size_t bytes) override {
    queued_reply_bytes_.fetch_add(bytes);
  }
  void SubtractQueuedReplyBytes(size_t bytes) override {
    queued_reply_bytes_.fetch_sub(bytes);
  }
  bool OverReplyBounds(size_t own, size_t own_max) const override;

  // One client stream, of either protocol; defined in the .cc.
  template <typename In, typename Out>
  class SessionReactor;

 private:
  template <typename In, typename Out>
  friend class SessionReactor;
  struct PendingWait {
    ReplySink* session;
    uint64_t request_id;
    // For the latency metric, which for a blocking op includes the wait.
    int op;
    TimePoint arrived;
    // Get and multi_get: what to read again when the reply was deferred.
    std::string ns;
    std::vector<std::string> keys;
    TimePoint deadline;
  };
  // Per op type (index: StoreRequest::OpCase - kFirstOp; 0 for OP_NOT_SET).
  static constexpr int kFirstOp = meshrun::v1::StoreRequest::kSet;
  static constexpr int kNumOps = meshrun::v1::StoreRequest::kBarrier - kFirstOp + 2;
  struct OpMetrics {
    Counter ops;
    Counter errors;  // answered with a code other than STORE_OK
    Histogram latency{LatencyBuckets()};
  };
  static int OpIndex(const meshrun::v1::StoreRequest& request);
  void Observe(int op, TimePoint arrived, const meshrun::v1::StoreResponse& reply);
  using Requests = google::protobuf::RepeatedPtrField<meshrun::v1::StoreRequest>;

  // Executes requests[start..] until the bytes of the replies it produced
  // reach `budget` (at least one request runs); returns where it stopped.
  size_t HandleBatch(ReplySink* session, const Requests& requests, size_t start,
                     size_t budget);
  // REQUIRES: mu_ held. Executes one request; false when it was parked (no
  // reply yet), otherwise `reply` holds the answer.
  // `validated`: the caller ran ValidateStoreRequest already.
  bool ExecuteLocked(ReplySink* session, const meshrun::v1::StoreRequest& request,
                     meshrun::v1::StoreResponse* reply, std::vector<Wakeup>* woken,
                     bool validated = false);
  // Takes mu_, counting whether another thread held it.
  std::unique_lock<std::mutex> LockStore();
  // Answers the session's woken waits that were deferred while it was over
  // its bounds, reading their values now, as far as its room allows.
  void RedeliverDeferred(ReplySink* session);
  // REQUIRES: mu_ held.
  void RedeliverLocked(ReplySink* session);
  // The bytes a session with `own` reply bytes queued (bound `own_max`) may
  // still queue within its bound and that of all sessions.
  size_t ReplyRoom(size_t own, size_t own_max) const;
  // REQUIRES: mu_ held. False (and `reply` says why) when `session` already
  // has as many requests parked as it may.
  bool RoomToPark(ReplySink* session, meshrun::v1::StoreResponse* reply);
  // REQUIRES: mu_ held.
  void CancelWaitsLocked(ReplySink* session);
  // REQUIRES: mu_ held.
  void DeliverLocked(std::vector<Wakeup>& woken);
  // REQUIRES: log_ set; mu_ not held unless `woken` is empty.
  void AfterDurable(ReplySink* session, StateLog::Mark mark,
                    std::vector<meshrun::v1::StoreResponse> replies,
                    std::vector<Wakeup> woken);
  std::optional<TimePoint> Expire(TimePoint now);

  const StoreServiceOptions options_;
  RequestLimits request_limits_;
  std::mutex mu_;
  KvStore store_;                                      // guarded by mu_
  std::unordered_map<WaiterId, PendingWait> pending_;  // guarded by mu_
  // The same waits by session, so a closing stream finds its own quickly.
  std::unordered_map<ReplySink*, std::unordered_set<WaiterId>> parked_;  // guarded by mu_
  // Woken gets of sessions over their bounds, not yet answered: their
  // replies (a copy of each value) are made when the client has read. Still
  // in pending_ and parked_, no longer in the store.
  std::unordered_map<ReplySink*, std::deque<WaiterId>> deferred_;  // guarded by mu_
  // Sessions whose deferred gets the timer thread is to answer.
  std::unordered_set<ReplySink*> kicked_;  // guarded by mu_
  WaiterId next_waiter_ = 1;               // guarded by mu_
  uint64_t sessions_open_ = 0;             // guarded by mu_
  uint64_t lock_acquisitions_ = 0;         // guarded by mu_; by LockStore()
  uint64_t lock_contended_ = 0;            // guarded by mu_; of those, had to wait
  std::atomic<uint64_t> ops_{0};
  // Bytes of replies queued (or held for the log) by every session.
  std::atomic<size_t> queued_reply_bytes_{0};
  std::array<OpMetrics, kNumOps> op_metrics_;
  std::unique_ptr<DeadlineTimer> timer_;
  StateLog* log_ = nullptr;
};

}  // namespace meshrun::rdzv
