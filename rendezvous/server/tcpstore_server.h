#pragma once

// The daemon's second front-end to its store: c10d's TCPStore wire protocol
// (core/tcpstore_wire.h) on Boost.Asio, so stock PyTorch workers use the
// daemon's store as their agent store (TORCHELASTIC_USE_AGENT_STORE=True).
//
// It owns the daemon's listening port and tells the protocols apart by a
// connection's first byte: 'P' opens the HTTP/2 preface every gRPC client
// sends, and that connection is handed to the gRPC server (on_grpc_fd); 'M'
// opens a store link (on_link_fd); anything else is a TCPStore client, whose
// first query must be VALIDATE with c10d's magic number.
//
// Each TCPStore connection is a session of a StoreBackend: its queries become
// StoreRequests in the namespace `namespace_for` picks when it validates. In
// the daemon the backend is its StoreService, so they share the gRPC store's
// limits, waiters, metrics and state log; in an agent it is a StoreRelay to
// the daemon.
// A connection that sends garbage, a wrong handshake, an oversized field or
// a request the store refuses is closed (as torch's server does) and
// counted; the daemon and every other client go on. So is one that says
// nothing (or never validates) for handshake_timeout, and one over the
// connection caps.
//
// Thread-safe. Stop() before the backend goes away.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "rendezvous/core/tcpstore_wire.h"
#include "rendezvous/server/store_backend.h"
#include "rendezvous/status/metrics.h"

namespace boost::asio {
class io_context;
}

namespace meshrun::rdzv {

struct TcpStoreServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: kernel-assigned
  tcpstore::WireLimits limits;
  // A connection stops reading while this many reply bytes wait to be
  // written to it (a client that sends without reading).
  size_t max_queued_reply_bytes = 64 << 20;
  // Blocking queries one connection may have parked (a stock client has
  // one at most); past it the connection is closed as for any refusal.
  size_t max_parked_waits = 16;
  // Event loops, each run by a thread of its own; a connection is dealt
  // to one when accepted and stays there, so its query, the store call and
  // its reply run on one thread (a wakeup for a connection on another loop
  // is posted there). 0: IoThreadsFor(the machine's cores).
  int io_threads = 0;
  // A connection is closed when its first byte (which tells gRPC from
  // TCPStore) or, for a TCPStore client, its VALIDATE has not come this long
  // after it was accepted. A validated connection may idle for ever: torch's
  // client sends nothing between calls, for hours during training.
  std::chrono::milliseconds handshake_timeout{30000};
  // Connections open on the port, counting sockets whose first byte has not
  // come (a gRPC connection stops counting when it is handed over): a new
  // one over either cap is closed at once. 0: ConnectionCapFor(the soft
  // descriptor limit at Start). Per peer address: above the 10,000
  // TCPStore clients bench/ runs from 127.0.0.1.
  size_t max_connections = 0;
  size_t max_connections_per_peer = 16384;
  // The store namespace of a connection from `peer` (its address), asked
  // once, when it validates; an error closes the connection.
  std::function<absl::StatusOr<std::string>(const std::string& peer)> namespace_for;
  // Takes ownership of a connection's fd whose first byte was an HTTP/2
  // preface's; null: such connections are closed.
  std::function<void(int fd)> on_grpc_fd;
  // The same for a store link's (its magic's first byte, 'M': an agent's
  // relay; store_link_server.h); null: such connections are closed.
  std::function<void(int fd)> on_link_fd;
};

// io_threads = 0: half the machine's cores (the rest for gRPC, the state
// log and the timer), at least 1 and at most 8 (past that the store's lock,
// not the I/O, is the limit: bench/results/store-analysis.md).
int IoThreadsFor(unsigned cores);

class TcpStoreServer {
 public:
  // Binds host:port and serves. UNAVAILABLE when the address cannot be bound.
  // `store` must remain live until Stop() returned.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(
      TcpStoreServerOptions options, StoreBackend& store);
  ~TcpStoreServer();  // Stop()
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // As served: max_connections and io_threads resolved when they were 0.
  const TcpStoreServerOptions& options() const;
  // Stops accepting, closes every connection (their parked waits end), and
  // joins the I/O threads. Idempotent.
  void Stop();
  // The first I/O thread's event loop, for more work on the same thread (an
  // agent's relay runs its link to the daemon there: no thread hand-off
  // between a worker's query and its trip upstream). Runs until Stop().
  boost::asio::io_context& loop();
  void CollectMetrics(std::vector<MetricFamily>* out);

  class Impl;

 private:
  TcpStoreServer() = default;
  int port_ = 0;
  std::shared_ptr<Impl> impl_;
  std::vector<std::thread> threads_;
};

}  // namespace meshrun::rdzv
