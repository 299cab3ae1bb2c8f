// meshrun-rdzvd: the rendezvous daemon. Prints one machine-readable line,
// `MESHRUN_RDZVD_ENDPOINT=host:port`, on stdout once it serves (then
// `MESHRUN_RDZVD_METRICS=host:port` with --metrics-port); logs go to
// stderr. SIGTERM/SIGINT shut it down gracefully.

#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/synchronization/mutex.h"
#include "rendezvous/server/daemon.h"
#include "rendezvous/status/build_info.h"

int main(int argc, char** argv) {
  // Debian builds absl with debug deadlock detection on; its bookkeeping was
  // ~11% of the daemon's CPU in a 5,000-client barrier (bench/results).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  meshrun::rdzv::DaemonOptions options;
  int grace_ms = 2000;
  int default_timeout_s = 300;
  std::string log_level = "info";
  meshrun::rdzv::ServerSecurityFiles security_files;

  CLI::App app{"meshrun-rdzvd: rendezvous and key-value store daemon for meshrun"};
  app.set_version_flag("--version", meshrun::rdzv::VersionLine("meshrun-rdzvd"),
                       "Print the version and the git commit built from, and exit");
  app.add_option("--host", options.host, "Address to listen on")->capture_default_str();
  app.add_option("--port", options.port, "Port to listen on (0: kernel-assigned)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  auto& limits = options.store.limits;
  app.add_option("--max-key-bytes", limits.max_key_bytes,
                 "Bytes a store key may have; a longer one is refused")
      ->capture_default_str();
  app.add_option("--max-value-bytes", limits.max_value_bytes,
                 "Bytes a store value may have; a larger one is refused")
      ->capture_default_str();
  app.add_option("--max-keys-per-run", limits.max_keys_per_namespace,
                 "Keys one run's store may hold (a queue item counts as one)")
      ->capture_default_str();
  app.add_option("--max-bytes-per-run", limits.max_bytes_per_namespace,
                 "Bytes of keys and values one run's store may hold")
      ->capture_default_str();
  app.add_option("--max-reply-bytes", limits.max_reply_bytes,
                 "Bytes of values (multi_get) or keys (list_keys) one reply may carry; "
                 "a request over it is refused (never below --max-value-bytes)")
      ->capture_default_str();
  app.add_option("--max-waiters", limits.max_waiters,
                 "Blocking store calls (get, wait, multi_get, barrier) parked at once "
                 "in all runs")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-waiters-per-run", limits.max_waiters_per_namespace,
                 "Blocking store calls parked at once in one run's store")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-waiters-per-client", options.store.max_parked_waits_per_session,
                 "Blocking store calls one gRPC store stream may have parked at once "
                 "(a TCPStore connection may have 16)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-queued-reply-bytes", options.store.max_queued_reply_bytes,
                 "Bytes of store replies queued for all clients together; past it, "
                 "clients with replies of their own queued are not read until they read")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-queued-reply-bytes-per-client",
                 options.store.max_queued_reply_bytes_per_session,
                 "Bytes of store replies queued for one client (a gRPC store stream or "
                 "a TCPStore connection) before it is no longer read")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--store-timeout", default_timeout_s,
                 "Seconds a blocking store call waits when it names no timeout")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  int retention_s = static_cast<int>(options.closed_run_retention.count());
  app.add_option("--closed-run-retention", retention_s,
                 "Seconds a closed run stays queryable before it and its store data are "
                 "forgotten")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--metrics-port", options.metrics_port,
                 "HTTP port for /metrics, /api/status and the status page at / "
                 "(0: kernel-assigned; default: none)")
      ->check(CLI::Range(0, 65535));
  app.add_option(
         "--shutdown-grace-ms", grace_ms,
         "On SIGTERM, how long calls in flight may finish before the daemon stops")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option(
      "--token-file", security_files.token_file,
      "File holding the shared token every call must carry (mode 600); "
      "else MESHRUN_RDZV_TOKEN or MESHRUN_RDZV_TOKEN_FILE; none: no token check");
  app.add_option("--tls-cert", security_files.tls_cert, "Serve TLS: certificate (PEM)");
  app.add_option("--tls-key", security_files.tls_key, "Serve TLS: private key (PEM)");
  app.add_option("--tls-client-ca", security_files.tls_client_ca,
                 "Require client certificates signed by this CA (PEM)");
  app.add_option("--state-dir", options.state_dir,
                 "Persist runs and store contents here (fsync'd log + snapshot) and "
                 "resume from them after a restart");
  app.add_option("--state-snapshot-bytes", options.state_snapshot_after_bytes,
                 "Compact the state log into a snapshot once it grows past this")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  std::string tcpstore = "auto";
  app.add_option("--tcpstore", tcpstore,
                 "Also serve c10d's TCPStore protocol on --port, for stock PyTorch "
                 "workers (TORCHELASTIC_USE_AGENT_STORE): auto = unless a token or TLS "
                 "is required (its clients can send neither)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--tcpstore-run", options.tcpstore_run,
                 "The run whose store TCPStore clients use (default: the only run in "
                 "progress)");
  app.add_option("--tcpstore-threads", options.tcpstore_threads,
                 "I/O threads (event loops) of the TCPStore protocol's front-end; 0: "
                 "half the cores, 1 to 8")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  int handshake_timeout_ms = static_cast<int>(options.handshake_timeout.count());
  app.add_option("--handshake-timeout-ms", handshake_timeout_ms,
                 "A connection to the port that sends no first byte, or a TCPStore "
                 "client that sends no VALIDATE, within this long is closed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-connections", options.max_connections,
                 "Connections the port holds open, counting those whose first byte has "
                 "not come (0: the descriptor limit, which the daemon raises to the hard "
                 "one at start, less a quarter (at least 256) kept for gRPC and files)")
      ->capture_default_str();
  app.add_option("--max-connections-per-peer", options.max_connections_per_peer,
                 "Connections the port holds open from one address")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--log-level", log_level, "Least severity logged (stderr)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  try {
    app.parse(argc, argv);
    options.tcpstore = tcpstore == "on"    ? meshrun::rdzv::TcpStoreMode::kOn
                       : tcpstore == "off" ? meshrun::rdzv::TcpStoreMode::kOff
                                           : meshrun::rdzv::TcpStoreMode::kAuto;
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "meshrun-rdzvd: " << e.what() << " (see --help)\n";
    return 2;
  }

  auto security = meshrun::rdzv::LoadServerSecurity(security_files, getenv);
  if (!security.ok()) {
    std::cerr << "meshrun-rdzvd: " << security.status().message() << "\n";
    return 2;
  }
  options.security = std::move(*security);

  auto log = spdlog::stderr_color_mt("rdzvd");
  spdlog::set_default_logger(log);
  spdlog::set_level(spdlog::level::from_str(log_level));
  options.store.default_timeout = std::chrono::seconds(default_timeout_s);
  options.closed_run_retention = std::chrono::seconds(retention_s);
  options.handshake_timeout = std::chrono::milliseconds(handshake_timeout_ms);
  options.max_message_bytes = limits.max_value_bytes + limits.max_key_bytes + (1 << 20);

  // Block the shutdown signals in every thread (gRPC's inherit this mask) and
  // take them synchronously here.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto daemon = meshrun::rdzv::Daemon::Start(options);
  if (!daemon.ok()) {
    std::cerr << "meshrun-rdzvd: " << daemon.status().message() << "\n";
    // 1: cannot listen; 2: options that cannot go together; 3: the state dir
    // is refused (in use, damaged, unwritable).
    switch (daemon.status().code()) {
      case absl::StatusCode::kUnavailable:
        return 1;
      case absl::StatusCode::kInvalidArgument:
        return 2;
      default:
        return 3;
    }
  }
  std::printf("MESHRUN_RDZVD_ENDPOINT=%s\n", (*daemon)->endpoint().c_str());
  if ((*daemon)->metrics_port() >= 0)
    std::printf("MESHRUN_RDZVD_METRICS=%s\n", (*daemon)->metrics_endpoint().c_str());
  std::fflush(stdout);
  log->info(
      "serving on {} ({}, {}{})", (*daemon)->endpoint(),
      options.security.tls()
          ? (options.security.tls_client_ca_pem.empty() ? "TLS"
                                                        : "TLS with client certificates")
          : "plaintext",
      options.security.token.empty() ? "no token check" : "token required",
      (*daemon)->serves_tcpstore() ? ", gRPC and c10d's TCPStore protocol" : ", gRPC");
  if ((*daemon)->metrics_port() >= 0)
    log->info("status page and metrics on http://{}/", (*daemon)->metrics_endpoint());

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  log->info("signal {} received, shutting down", signal_number);
  (*daemon)->Shutdown(std::chrono::milliseconds(grace_ms));
  return 0;
}
