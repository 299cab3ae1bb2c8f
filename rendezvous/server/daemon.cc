#include "rendezvous/server/daemon.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "rendezvous/core/state_codec.h"
#include "rendezvous/server/fd_limit.h"
#include "rendezvous/status/build_info.h"
#include "rendezvous/status/process_memory.h"
#include "rendezvous/status/status_http.h"
#include "rendezvous/status/status_render.h"

namespace meshrun::rdzv {

namespace {

void LogDescriptors(const DescriptorLimit& limit, const std::string& caps) {
  if (limit.soft != limit.soft_before) {
    spdlog::info("file descriptors: soft limit raised from {} to {} (the hard limit){}",
                 limit.soft_before, limit.soft, caps);
  } else {
    spdlog::info("file descriptors: soft limit {} (hard {}){}", limit.soft, limit.hard,
                 caps);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  // Every client takes a descriptor; the soft limit is often 1,024.
  const absl::StatusOr<DescriptorLimit> descriptors = RaiseDescriptorLimit();
  if (!descriptors.ok()) {
    spdlog::warn("{}; serving with that soft limit",
                 std::string(descriptors.status().message()));
  }
  std::unique_ptr<Daemon> daemon(new Daemon());
  daemon->host_ = options.host;
  daemon->store_ = std::make_unique<StoreService>(options.store);
  const bool secured = !options.security.token.empty() || options.security.tls();
  if (options.tcpstore == TcpStoreMode::kOn && secured) {
    return absl::InvalidArgumentError(
        "the TCPStore protocol cannot be served with a token or TLS: stock TCPStore "
        "clients send neither (use --tcpstore=auto or off, or a second daemon without "
        "them on a private address)");
  }
  const bool serve_tcpstore = options.tcpstore == TcpStoreMode::kOn ||
                              (options.tcpstore == TcpStoreMode::kAuto && !secured);
  RendezvousServiceOptions rendezvous_options;
  rendezvous_options.serves_tcpstore = serve_tcpstore;
  rendezvous_options.tcpstore_run = options.tcpstore_run;
  rendezvous_options.closed_run_retention = options.closed_run_retention;
  rendezvous_options.annotate_status = options.extra_status;
  // The store outlives the rendezvous service (members are destroyed in
  // reverse order), so the callback never sees a dead store.
  rendezvous_options.on_runs_forgotten =
      [store = daemon->store_.get()](const std::vector<std::string>& run_ids) {
        store->DropRunNamespaces(run_ids);
      };
  daemon->rendezvous_ =
      std::make_unique<RendezvousService>(std::move(rendezvous_options));
  daemon->extra_metrics_ = options.extra_metrics;
  if (!options.state_dir.empty() || options.state_medium) {
    if (absl::Status s = daemon->OpenState(options); !s.ok()) return s;
  }

  grpc::ServerBuilder builder;
  std::string address = options.host.find(':') != std::string::npos
                            ? "[" + options.host + "]:" + std::to_string(options.port)
                            : options.host + ":" + std::to_string(options.port);
  // Serving TCPStore, the front-end owns the port and hands gRPC its
  // connections; gRPC itself listens nowhere.
  if (!serve_tcpstore) {
    builder.AddListeningPort(address, MakeServerCredentials(options.security),
                             &daemon->port_);
  }
  builder.RegisterService(daemon->store_.get());
  builder.RegisterService(daemon->rendezvous_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  // A port in use must fail the start, not be silently shared.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Agents keep Join streams open for hours; let idle connections live, and
  // notice dead peers through keepalive pings.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  daemon->server_ = builder.BuildAndStart();
  if (daemon->server_ && serve_tcpstore) {
    TcpStoreServerOptions front;
    front.host = options.host;
    front.port = options.port;
    front.io_threads = options.tcpstore_threads;
    front.limits.max_key_bytes = options.store.limits.max_key_bytes;
    front.limits.max_value_bytes = options.store.limits.max_value_bytes;
    front.limits.max_keys_per_query = options.store.limits.max_keys_per_request;
    front.limits.max_query_bytes = tcpstore::MaxQueryBytesFor(
        front.limits.max_key_bytes, front.limits.max_value_bytes);
    front.handshake_timeout = options.handshake_timeout;
    front.max_connections = options.max_connections;
    front.max_connections_per_peer = options.max_connections_per_peer;
    front.max_queued_reply_bytes = options.store.max_queued_reply_bytes_per_session;
    grpc::Server* grpc_server = daemon->server_.get();
    front.on_grpc_fd = [grpc_server](int fd) {
      grpc::AddInsecureChannelFromFd(grpc_server, fd);
    };
    StoreLinkServerOptions link;
    link.token = options.security.token;
    link.max_frame_bytes = options.max_message_bytes;
    link.max_requests_per_batch = options.store.max_requests_per_batch;
    link.max_queued_reply_bytes = options.store.max_queued_reply_bytes_per_session;
    link.handshake_timeout = options.handshake_timeout;
    daemon->link_ = std::make_unique<StoreLinkServer>(std::move(link), *daemon->store_);
    front.on_link_fd = [link_server = daemon->link_.get()](int fd) {
      link_server->Adopt(fd);
    };
    RendezvousService* rendezvous = daemon->rendezvous_.get();
    front.namespace_for = [rendezvous](const std::string& /*peer*/) {
      return rendezvous->TcpStoreNamespace();
    };
    auto served = TcpStoreServer::Start(std::move(front), *daemon->store_);
    if (!served.ok()) return served.status();
    const TcpStoreServerOptions& serving = (*served)->options();
    if (descriptors.ok()) {
      LogDescriptors(*descriptors,
                     absl::StrCat("; the port takes at most ", serving.max_connections,
                                  " connections, ", serving.max_connections_per_peer,
                                  " from one address, handshakes within ",
                                  serving.handshake_timeout.count(),
                                  " ms; TCPStore I/O threads: ", serving.io_threads));
    }
    daemon->tcpstore_ = std::move(*served);
    daemon->port_ = daemon->tcpstore_->port();
  }
  if (descriptors.ok() && !daemon->tcpstore_) LogDescriptors(*descriptors, "");
  if (!daemon->server_ || daemon->port_ == 0) {
    return absl::UnavailableError(
        "cannot listen on " + address +
        (options.security.tls()
             ? " (address in use or not local, or the TLS certificate, "
               "key or client CA is invalid?)"
             : " (address in use or not local?)"));
  }
  if (options.metrics_port >= 0) {
    HttpServerOptions http;
    http.host = options.host;
    http.port = options.metrics_port;
    Daemon* self = daemon.get();
    StatusRoutes routes;
    routes.metrics_text = [self] { return self->MetricsText(); };
    routes.status_json = [self](const std::string& run_id) {
      StatusSnapshot snapshot = self->rendezvous_->Snapshot(run_id);
      if (!run_id.empty() && snapshot.runs.empty()) return std::string();
      const BuildInfo build = GetBuildInfo();
      snapshot.version = build.version;
      snapshot.commit = build.commit;
      return RenderStatusJson(snapshot);
    };
    auto server = HttpServer::Start(
        http, [routes](const std::string& method, const std::string& target) {
          return RouteStatusRequest(routes, method, target);
        });
    if (!server.ok()) return server.status();
    daemon->http_ = std::move(*server);
  }
  return daemon;
}

absl::Status Daemon::OpenState(const DaemonOptions& options) {
  StoreService& store = *store_;
  RendezvousService& rendezvous = *rendezvous_;
  absl::Status status;
  StateLoadReport report;
  const RdzvTime now = RdzvClock::now();
  store.WithStore([&](KvStore& kv) {
    rendezvous.WithState([&](RendezvousState& state) {
      auto log =
          options.state_medium
              ? StateLog::Open(options.state_medium(), options.state_snapshot_after_bytes,
                               &kv, &state, now, &report)
              : StateLog::Open(options.state_dir, options.state_snapshot_after_bytes, &kv,
                               &state, now, &report);
      if (log.ok()) {
        state_log_ = std::move(*log);
      } else {
        status = log.status();
      }
    });
  });
  if (!status.ok()) return status;
  spdlog::info(
      "{}: restored {} store entries and {} runs ({}snapshot, {} log "
      "records{})",
      options.state_medium ? std::string("etcd") : "state dir " + options.state_dir,
      report.store_entries, report.runs, report.had_snapshot ? "" : "no ",
      report.log_records, report.torn_tail ? ", a torn last record dropped" : "");
  store.set_state_log(state_log_.get());
  rendezvous.set_state_log(state_log_.get());
  rendezvous.Restored();
  state_log_->Start([&rendezvous](StateLog& log) { rendezvous.CollectChanges(log); },
                    [&store, &rendezvous](const std::function<uint64_t()>& rotate) {
                      std::string bytes;
                      // Same lock order as the services' own paths: store, rendezvous,
                      // log.
                      store.WithStore([&](KvStore& kv) {
                        rendezvous.WithState([&](RendezvousState& state) {
                          (void)state.TakeChangedRuns();  // the snapshot holds them
                          const uint64_t gen = rotate();
                          bytes = codec::EncodeSnapshot(kv, state, gen, RdzvClock::now());
                        });
                      });
                      return bytes;
                    });
  return absl::OkStatus();
}

int Daemon::metrics_port() const { return http_ ? http_->port() : -1; }

std::string Daemon::metrics_endpoint() const {
  if (!http_) return {};
  return (host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_) + ":" +
         std::to_string(http_->port());
}

std::string Daemon::MetricsText() {
  std::vector<MetricFamily> families;
  rendezvous_->CollectMetrics(&families);
  store_->CollectMetrics(&families);
  if (tcpstore_) tcpstore_->CollectMetrics(&families);
  if (link_) link_->CollectMetrics(&families);
  if (http_) http_->CollectMetrics(&families);
  if (extra_metrics_) extra_metrics_(&families);
  AddProcessMemoryMetrics(ReadProcessMemory(), &families);
  // Prometheus' convention for what a process runs: a constant 1 with labels.
  const BuildInfo build = GetBuildInfo();
  families.emplace_back("meshrun_build_info",
                        "The daemon's version and the git commit it was built from",
                        "gauge");
  families.back().Add({{"version", build.version}, {"commit", build.commit}}, 1);
  return RenderPrometheusText(families);
}

Daemon::~Daemon() { Shutdown(std::chrono::milliseconds(0)); }

std::string Daemon::endpoint() const {
  return (host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_) + ":" +
         std::to_string(port_);
}

std::shared_ptr<grpc::Channel> Daemon::InProcessChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return server_->InProcessChannel(args);
}

void Daemon::Shutdown(std::chrono::milliseconds grace) {
  // Its handlers read the services.
  if (http_) http_->Stop();
  if (!server_) return;
  // First: it hands connections to server_, and its sessions end before the
  // store's waits are torn down.
  if (tcpstore_) tcpstore_->Stop();
  if (link_) link_->Stop();
  // Before the server cancels the Join streams, which must not read as the
  // nodes leaving (the flush below would persist a run everybody left).
  rendezvous_->BeginShutdown();
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
  server_.reset();
  // Everything the last calls changed reaches the disk before we return.
  if (state_log_) {
    state_log_->Stop();
    const StateLog::Stats stats = state_log_->stats();
    spdlog::info("state log: {} records, {} bytes in {} fsyncs, {} snapshots",
                 stats.records, stats.bytes, stats.fsyncs, stats.snapshots);
  }
}

}  // namespace meshrun::rdzv
