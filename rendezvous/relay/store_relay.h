#pragma once

// An agent's store relay: the node's workers talk c10d's TCPStore protocol to
// their own agent (TcpStoreServer, on loopback by default), and the agent
// carries their requests to the daemon on one gRPC stream of its own, with
// its token and TLS. So every run on any daemon, secured or not, gets its
// own store (the relay names the run's namespace, which a stock client
// cannot), and a daemon restart breaks no worker: torch's client never
// reconnects, but it never sees the daemon; the relay reconnects and sends
// again what it must (relay_core.h), so a worker blocked in wait through the
// restart gets its key. Many workers' requests travel as one message, and
// many waits, gets and adds as one request (relay_core.h). The stream is a
// store link (plain TCP) where the daemon takes one, else gRPC.
//
// What the daemon's TCPStore front-end refuses, this one refuses the same way
// (the same TcpStoreServer and limits): it closes that worker's connection,
// never the stream to the daemon or another worker's connection.
//
// Thread-safe.

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rendezvous/core/tcpstore_wire.h"
#include "rendezvous/relay/relay_core.h"
#include "rendezvous/security/security.h"

namespace meshrun::rdzv {

class TcpStoreServer;

struct StoreRelayOptions {
  // "host:port" of meshrun-rdzvd, or a list "h1:p1,h2:p2" of daemon replicas
  // (rendezvous/client/endpoint_list.h): each connection goes to the first
  // that takes it.
  std::string daemon;
  ClientSecurity security;
  // Where workers connect.
  std::string host = "127.0.0.1";
  int port = 0;  // 0: kernel-assigned
  // What one TCPStore query may hold, as the daemon's defaults.
  tcpstore::WireLimits limits;
  RelayLimits relay;
  std::chrono::milliseconds handshake_timeout{30000};
  // How requests travel to the daemon. kLink: a store link (plain TCP on
  // the daemon's port, store.proto's StoreLinkHello), a few times faster a
  // round trip than gRPC; kGrpc: a Store.BatchSession stream; kAuto: the
  // link unless TLS is configured, and gRPC from the first time a daemon
  // turns a link down (one whose port gRPC owns: TLS, a token, or
  // --tcpstore=off).
  enum class Transport { kAuto, kLink, kGrpc };
  Transport transport = Transport::kAuto;
  // Between reconnect attempts that fail before the daemon answered
  // (doubling up to the maximum); a stream that broke after working is
  // replaced at once. gRPC waits for the channel itself in between.
  std::chrono::milliseconds min_reconnect_delay{50};
  std::chrono::milliseconds max_reconnect_delay{1000};
  // With a list of replicas: how long a store link's connect to one address
  // may hang (a silent host) before the next is tried.
  std::chrono::milliseconds connect_timeout{3000};
  // Tests only: runs on gRPC's thread when a gRPC stream has ended, as its
  // OnDone starts (gRPC has freed its call object; the relay has not yet
  // freed the stream or carried on without it), so that a test can hold
  // that moment open while workers write.
  std::function<void()> grpc_stream_done_for_test;
};

class StoreRelay {
 public:
  // Listens on host:port and starts the stream to the daemon (which may not
  // be up yet: requests wait for it). UNAVAILABLE when the address cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<StoreRelay>> Start(StoreRelayOptions options);
  ~StoreRelay();  // Stop()
  StoreRelay(const StoreRelay&) = delete;
  StoreRelay& operator=(const StoreRelay&) = delete;

  int port() const;
  // The store namespace of connections that validate from now on (the
  // round's store prefix); connections already open keep theirs. While it
  // is empty, connections are refused.
  void SetNamespace(std::string ns);
  // Closes every worker connection and the stream, and logs what the relay
  // did. Idempotent; not thread-safe against itself.
  void Stop();
  RelayStats Stats();
  // Upstream streams opened so far (1 until the first reconnect).
  uint64_t streams_opened();
  // Whether the current (or last) upstream is a store link.
  bool using_link();

  class Backend;  // in the .cc

 private:
  StoreRelay() = default;
  std::shared_ptr<Backend> backend_;
  std::unique_ptr<TcpStoreServer> front_;
  bool stopped_ = false;
};

}  // namespace meshrun::rdzv
