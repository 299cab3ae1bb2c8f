#pragma once

// What a store front-end serves its sessions from. The TCPStore front-end
// (tcpstore_server.h) runs over either backend: the daemon's StoreService
// (the store itself) or an agent's StoreRelay (relay/store_relay.h), which
// carries the same requests to a daemon over gRPC.

#include <cstddef>
#include <vector>

#include "meshrun/v1/store.pb.h"

namespace meshrun::rdzv {

// What a backend needs of a session (a gRPC stream, a TCPStore connection):
// a way to queue replies.
class StoreReplySink {
 public:
  virtual ~StoreReplySink() = default;
  // Queue replies. May be called from any thread until EndSession() ran.
  virtual void Send(meshrun::v1::StoreResponse reply) = 0;
  virtual void SendAll(std::vector<meshrun::v1::StoreResponse>* replies) = 0;
  // --state-dir: replies wait for the log. Hold() keeps the stream from
  // finishing (so the session outlives the wait) and counts `replies`
  // against the session's bounds as if queued; SendHeld() queues them and
  // lets it finish again.
  virtual void Hold(const std::vector<meshrun::v1::StoreResponse>& replies) = 0;
  virtual void SendHeld(std::vector<meshrun::v1::StoreResponse>* replies) = 0;
  // True when the session is over its bounds; it then calls
  // RedeliverDeferred() once it is back within them (MarkDeferred: in any
  // case, after its next write).
  virtual bool DeferIfOverBounds() = 0;
  virtual void MarkDeferred() = 0;
  // Reply bytes the session may still queue within both byte bounds.
  virtual size_t RoomBytes() = 0;
  // This session's cap on parked blocking requests; 0: the backend's.
  virtual size_t MaxParkedWaits() { return 0; }
  // The backend has room for this session's requests again, after Busy()
  // said it had not. May be called from any thread, under the backend's lock.
  virtual void Resume() {}
};

class StoreBackend {
 public:
  virtual ~StoreBackend() = default;
  // A session opens, sends requests through Handle(), and ends with
  // EndSession(), after which no reply reaches it. Handle() replies through
  // `session` now or later (parked waits), from any thread; every request
  // gets exactly one reply unless its session cancels its waits or ends.
  virtual void OpenSession() = 0;
  virtual void Handle(StoreReplySink* session,
                      const meshrun::v1::StoreRequest& request) = 0;
  // Forgets the session's parked waits (c10d's cancel_wait); their replies
  // never come. The session stays open.
  virtual void CancelWaits(StoreReplySink* session) = 0;
  virtual void EndSession(StoreReplySink* session) = 0;
  // True when `session` should stop sending requests for now (a relay whose
  // daemon has not answered its many earlier ones: a c10d client's set gets
  // no reply, so nothing else would slow it down); the backend then calls
  // session->Resume() once it may go on.
  virtual bool Busy(StoreReplySink* /*session*/) { return false; }
  // Reply bytes queued by every session together (sessions count theirs in).
  virtual void AddQueuedReplyBytes(size_t bytes) = 0;
  virtual void SubtractQueuedReplyBytes(size_t bytes) = 0;
  // For a session with `own` reply bytes queued and a bound of `own_max`:
  // whether it is over that bound or (while it holds some of those bytes,
  // so that a write of its own will resume it) over the bound of all
  // sessions.
  virtual bool OverReplyBounds(size_t own, size_t own_max) const = 0;
};

}  // namespace meshrun::rdzv
