#pragma once

// The daemon's end of store links (proto/meshrun/v1/store.proto,
// StoreLinkHello): an agent's store relay sends BatchSession's messages over
// a plain TCP connection on the daemon's port, which the TCPStore front-end
// hands over by its first byte. Each link is a StoreService session, as a
// gRPC stream is, without gRPC's cost per message (a worker's round trip
// through its relay is mostly that cost). A bad link (wrong magic or token,
// an oversized frame, garbage) is closed; nothing else notices.
//
// One I/O thread: an agent has one link, so links are few. Thread-safe.

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/server/store_service.h"
#include "rendezvous/status/metrics.h"

namespace meshrun::rdzv {

struct StoreLinkServerOptions {
  // A hello must carry it; empty: none is required.
  std::string token;
  // A larger frame closes the link (as gRPC refuses larger messages).
  size_t max_frame_bytes = (64 << 20) + (1 << 20);
  size_t max_requests_per_batch = 1024;
  // A link stops reading while this many reply bytes wait to be written.
  size_t max_queued_reply_bytes = 64 << 20;
  // Replies are framed together up to about this many bytes.
  size_t max_reply_batch_bytes = 1 << 20;
  std::chrono::milliseconds handshake_timeout{30000};
};

class StoreLinkServer {
 public:
  // `store` must remain live until Stop() returned.
  StoreLinkServer(StoreLinkServerOptions options, StoreService& store);
  ~StoreLinkServer();  // Stop()
  StoreLinkServer(const StoreLinkServer&) = delete;
  StoreLinkServer& operator=(const StoreLinkServer&) = delete;

  // Serves a connected socket whose next bytes are the link's magic.
  void Adopt(int fd);
  // Closes every link and joins the thread. Idempotent.
  void Stop();
  void CollectMetrics(std::vector<MetricFamily>* out);

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
  std::thread thread_;
};

}  // namespace meshrun::rdzv
