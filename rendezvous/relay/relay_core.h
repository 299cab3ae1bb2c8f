#pragma once

// The pure core of an agent's store relay (store_relay.h): what its workers'
// requests become on the one stream (a store link, or gRPC) the agent keeps
// to the daemon. No sockets, threads or clock; the adapter feeds it requests,
// replies and the stream's fate, and sends what it hands out.
//
// Requests are aggregated where c10d's semantics allow it, so that W workers
// on a node cost the daemon about one request per node, not W:
//  - waits on the same keys share one upstream wait, also one already sent
//    (a wait only says that the keys exist; no client deletes a key while
//    others wait on it);
//  - identical gets, multi_gets and checks queued for the same batch share
//    one request and its reply;
//  - adds to one key queued for the same batch become one add of their sum,
//    and each caller gets the value after its own part, as if they ran one
//    after the other.
// Only requests not yet sent join each other, except waits, so every shared
// answer is taken after each caller asked. A session's request joins
// nothing while the session has another one pending, so a client that
// pipelines still sees its own requests in order.
//
// When the stream breaks, requests the daemon may not have seen are sent
// again on the next stream, and so are those sent whose repeat is harmless
// (reads, waits, set, multi_set, delete, an add of 0), and the mutations
// whose repeat would not be (add, compare_set, append, queue push and pop):
// each of those carries a dedup_id (this relay's identity and its upstream
// id), so the daemon applies it once and answers a repeat with the first
// answer (store.proto), across its restarts with --state-dir. The daemon
// keeps that answer until the relay says it has it: each answered dedup id
// rides, in forget_dedup_ids, on the next request of its namespace (sent
// again if that request's stream broke), and no more than
// max_dedup_in_flight such requests are out at once, so what the daemon
// holds for a relay stays bounded without it ever forgetting an answer a
// repeat could still ask for. Only a barrier
// sent and not answered (it parks after its add) may or may not have been
// applied, and is answered STORE_UNAVAILABLE.
//
// Not thread-safe: the adapter holds one lock around it.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "meshrun/v1/store.pb.h"

namespace meshrun::rdzv {

class StoreReplySink;

struct RelayLimits {
  // The daemon ends a stream whose batch holds more (StoreServiceOptions).
  size_t max_requests_per_batch = 1024;
  // A batch is closed at about this many bytes; a larger request goes alone.
  size_t max_batch_bytes = 1 << 20;
  // Larger requests are refused: the daemon's gRPC would end the whole
  // stream for them (DaemonOptions::max_message_bytes, less room to spare).
  size_t max_request_bytes = (64 << 20) + (512 << 10);
  // A session with this many requests pending stops being read until half
  // of them are answered (StoreBackend::Busy): a stock c10d client has one
  // pending, or many sets (which get no reply on its wire).
  size_t pause_session_at = 256;
  // More are refused (a front-end that does not pause).
  size_t max_pending_per_session = 4096;
  // Bytes of requests not yet sent, from all sessions (the daemon away).
  size_t max_unsent_bytes = 256 << 20;
  // Requests with a dedup id sent and not answered: the daemon keeps each
  // one's answer until told (see above), so past this many the next waits.
  size_t max_dedup_in_flight = 4096;
  // Dedup ids named for the daemon to forget on one request
  // (RequestLimits::max_forget_dedup_ids).
  size_t max_forget_per_request = 4096;
};

struct RelayStats {
  uint64_t requests = 0;          // from sessions
  uint64_t joined = 0;            // of those, answered by another's request
  uint64_t sent = 0;              // requests sent upstream (repeats included)
  uint64_t batches = 0;           // upstream messages
  uint64_t repeated = 0;          // sent again after a stream broke
  uint64_t failed_in_flight = 0;  // answered UNAVAILABLE after a stream broke (barriers)
  uint64_t refused = 0;           // over the limits above
};

struct RelayDelivery {
  StoreReplySink* session;
  meshrun::v1::StoreResponse reply;
};

class RelayCore {
 public:
  // `identity` makes this relay's dedup ids its own: the daemon's memory of
  // answers is shared by every relay and client of a namespace, so a
  // relay picks it at random (StoreRelay does) and keeps it while it lives.
  explicit RelayCore(RelayLimits limits = {}, uint64_t identity = 0);

  // A session's request (its id is the session's own). Returns a refusal to
  // deliver when the request is over a limit; nullopt when it was taken.
  std::optional<meshrun::v1::StoreResponse> Submit(StoreReplySink* session,
                                                   meshrun::v1::StoreRequest request);
  // Moves the next requests to send into `batch` (upstream ids). False when
  // there is nothing to send (or the next waits for answers: call again
  // after OnReply). They stay "being written" until WriteDone().
  bool TakeBatch(meshrun::v1::StoreRequestBatch* batch);
  // The batch TakeBatch() gave: written (the daemon may see it), or not
  // written (the stream broke first; it will be sent again).
  void WriteDone(bool written);
  // A reply from the daemon; what it answers, in `out`.
  void OnReply(const meshrun::v1::StoreResponse& reply, std::vector<RelayDelivery>* out);
  // The stream ended. Requests written and not answered are queued again or
  // failed (see above); the failures, in `out`. REQUIRES: no batch being
  // written (its WriteDone came first).
  void OnStreamLost(std::vector<RelayDelivery>* out);
  // c10d's cancel_wait: the session's waits and barriers get no reply. A
  // barrier is still carried out, as the daemon would.
  void CancelWaits(StoreReplySink* session);
  // The session is gone: nothing more is delivered to it. Its writes still
  // reach the daemon, as they would had it sent them there itself.
  void EndSession(StoreReplySink* session);

  size_t pending(StoreReplySink* session) const {
    auto found = pending_.find(session);
    return found == pending_.end() ? 0 : found->second;
  }
  size_t pending_upstream() const { return ops_.size(); }
  // Requests with a dedup id sent (or being written) and not answered.
  size_t dedup_in_flight() const { return dedup_in_flight_; }
  // Answered dedup ids not yet named to the daemon on a request.
  size_t to_forget() const;
  const RelayStats& stats() const { return stats_; }

 private:
  struct Joiner {
    StoreReplySink* session;
    uint64_t id;          // the session's request id
    int64_t add_through;  // adds: the combined delta through this caller's
  };
  struct Op {
    meshrun::v1::StoreRequest request;  // id: the upstream id
    std::vector<Joiner> joiners;
    std::string join_key;  // empty: joins nothing
    size_t bytes = 0;
    enum class State { kUnsent, kWriting, kSent } state = State::kUnsent;
  };
  static std::string JoinKey(const meshrun::v1::StoreRequest& request);
  static bool SafeToRepeat(const meshrun::v1::StoreRequest& request);
  // Mutations whose repeat is not harmless, which get a dedup_id when sent.
  static bool NeedsDedupId(const meshrun::v1::StoreRequest& request);
  // Reads: an unsent one nobody waits for need not be sent at all.
  static bool IsRead(const meshrun::v1::StoreRequest& request);
  // Drops the op. `answered`: the daemon answered it, so it took the dedup
  // ids the request named to forget; otherwise they are named again later.
  void Forget(uint64_t upstream_id, bool answered);
  // The op left the unsent state (true) or went back to it (false).
  void CountInFlight(const Op& op, bool out);
  void RemoveJoiners(StoreReplySink* session, bool waits_only);

  const RelayLimits limits_;
  const uint64_t identity_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Op> ops_;  // by upstream id
  std::set<uint64_t> unsent_;   // in the order they came
  std::vector<uint64_t> writing_;
  size_t unsent_bytes_ = 0;
  std::unordered_map<std::string, uint64_t> joinable_;   // join key -> op
  std::unordered_map<StoreReplySink*, size_t> pending_;  // per session
  std::unordered_map<StoreReplySink*, std::unordered_set<uint64_t>> ops_of_;
  // By namespace: answered dedup ids to name on the next request there.
  std::unordered_map<std::string, std::vector<std::string>> forget_;
  size_t dedup_in_flight_ = 0;
  RelayStats stats_;
};

}  // namespace meshrun::rdzv
