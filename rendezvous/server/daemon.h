#pragma once

// The rendezvous daemon as a library: a gRPC server carrying the Store and
// Rendezvous services. `meshrun-rdzvd` wraps it; `meshrun --standalone`
// embeds it in-process.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rendezvous/persist/state_medium.h"
#include "rendezvous/security/security.h"
#include "rendezvous/server/rendezvous_service.h"
#include "rendezvous/server/store_link_server.h"
#include "rendezvous/server/store_service.h"
#include "rendezvous/server/tcpstore_server.h"
#include "rendezvous/status/http_server.h"
#include "rendezvous/status/metrics.h"

namespace grpc {
class Channel;
class Server;
}  // namespace grpc

namespace meshrun::rdzv {

// Whether the daemon's port also speaks c10d's TCPStore protocol. Stock
// TCPStore clients can send neither a token nor TLS, so kAuto serves it only
// when the daemon requires neither; kOn with a token or TLS is refused.
enum class TcpStoreMode { kAuto, kOn, kOff };

struct DaemonOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: kernel-assigned; read the result from Daemon::port()
  StoreServiceOptions store;
  // How long a closed run stays queryable before the daemon forgets it and
  // drops its store namespaces.
  std::chrono::seconds closed_run_retention{3600};
  // Token check and TLS (rendezvous/security.h); default: neither.
  ServerSecurity security;
  // gRPC refuses larger messages before they reach the services; kept a little
  // above the store's value limit so an oversized value gets the store's
  // clearer error.
  size_t max_message_bytes = (64 << 20) + (1 << 20);
  // Non-empty: persist runs and store contents here (see state_log.h) and
  // resume from what it holds. Empty: state lives in memory only.
  std::string state_dir;
  // Set: persist on this medium instead (etcd; state_dir must be empty).
  std::function<std::unique_ptr<StateMedium>()> state_medium;
  // Set: adds families to /metrics (the etcd leadership's).
  std::function<void(std::vector<MetricFamily>*)> extra_metrics;
  // Adds to the status (page and Status RPC) what the daemon's owner knows.
  std::function<void(StatusSnapshot*)> extra_status;
  // The log is compacted into a new snapshot once it grows past this.
  size_t state_snapshot_after_bytes = 64 << 20;
  // The HTTP port for /metrics, /api/status and the status page, on `host`:
  // -1 for none, 0 for a kernel-assigned one (read metrics_port()).
  int metrics_port = -1;
  TcpStoreMode tcpstore = TcpStoreMode::kAuto;
  // The run whose store stock TCPStore clients see (the launcher names its
  // own for the daemon it embeds). Empty: the first run assigned a round
  // while no other is served, until it closes (rendezvous/core/
  // tcpstore_owner.h); kDefaultTcpStoreNamespace while there is no run.
  std::string tcpstore_run;
  // I/O threads of the TCPStore front-end, each with an event loop of its
  // own (TcpStoreServerOptions::io_threads); 0: IoThreadsFor(cores). (One
  // loop shared by two threads was slower than one thread: a query and its
  // reply ran on different threads.)
  int tcpstore_threads = 0;
  // While the TCPStore front-end owns the port (TcpStoreServerOptions): how
  // long a connection may take to send its first byte and, for TCPStore, its
  // VALIDATE; the caps on connections open there, in all (0: from the
  // descriptor limit, ConnectionCapFor) and from one address.
  std::chrono::milliseconds handshake_timeout{30000};
  size_t max_connections = 0;
  size_t max_connections_per_peer = 16384;
};

class Daemon {
 public:
  // Raises the soft descriptor limit to the hard one (fd_limit.h), loads the
  // state dir (if any), binds and starts serving. UNAVAILABLE if
  // the address cannot be bound; the state dir's errors (in use, damaged,
  // unwritable) keep their own codes, and nothing is served.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  ~Daemon();  // Shutdown() with no grace if still running
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  int port() const { return port_; }
  // Whether port() also speaks the TCPStore protocol.
  bool serves_tcpstore() const { return tcpstore_ != nullptr; }
  std::string endpoint() const;
  // -1 when not serving HTTP.
  int metrics_port() const;
  // host:port of the HTTP port, empty when not serving it.
  std::string metrics_endpoint() const;
  // The text served at /metrics.
  std::string MetricsText();
  // Stops accepting calls; calls still open after `grace` are cancelled.
  void Shutdown(std::chrono::milliseconds grace);
  // A channel into this server with no socket (tests and fuzzers). No token
  // or TLS check applies on it. REQUIRES: the daemon is running.
  std::shared_ptr<grpc::Channel> InProcessChannel();
  StoreService& store() { return *store_; }
  // Null without a state dir.
  StateLog* state_log() { return state_log_.get(); }
  RendezvousService& rendezvous() { return *rendezvous_; }

 private:
  Daemon() = default;
  absl::Status OpenState(const DaemonOptions& options);
  std::string host_;
  std::function<void(std::vector<MetricFamily>*)> extra_metrics_;
  int port_ = 0;
  std::unique_ptr<StoreService> store_;
  std::unique_ptr<RendezvousService> rendezvous_;
  // After the services: destroyed first, while its hooks' targets live.
  std::unique_ptr<StateLog> state_log_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> http_;  // after the services: stopped first
  // Owns the port when it serves; hands gRPC connections to server_, and
  // store links (agents' relays) to link_.
  std::unique_ptr<StoreLinkServer> link_;
  std::unique_ptr<TcpStoreServer> tcpstore_;
};

}  // namespace meshrun::rdzv
