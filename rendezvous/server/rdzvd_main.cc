// meshrun-rdzvd: the rendezvous daemon. Prints one machine-readable line,
// `MESHRUN_RDZVD_ENDPOINT=host:port`, on stdout once it serves (then
// `MESHRUN_RDZVD_METRICS=host:port` with --metrics-port); logs go to
// stderr. SIGTERM/SIGINT shut it down gracefully.
//
// With --etcd-endpoints it is one of several replicas whose state lives in
// etcd (rendezvous/etcd/): it first prints `MESHRUN_RDZVD_STANDBY=host:port`
// and stands by, its port bound but not listening (agents' connections are
// refused, so they try the next endpoint), until it becomes the leader; it
// then loads the state from etcd and serves as above. A leader that finds
// another daemon leading exits with 75 (EX_TEMPFAIL: a supervisor that
// starts it again gets a standby) without answering again.

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_leadership.h"
#include "rendezvous/etcd/etcd_state_medium.h"
#include "rendezvous/security/auth.h"
#include "rendezvous/server/daemon.h"
#include "rendezvous/status/build_info.h"

namespace {

struct EtcdFlags {
  std::string endpoints;
  std::string prefix = "/meshrun/";
  std::string deployment = "meshrun";
  std::string user;
  std::string password_file;
  std::string cacert;
  std::string cert;
  std::string key;
  int lease_ttl_s = 3;
  int dial_timeout_s = 30;
};

// Binds host:port (0: kernel-assigned) without listening, so the port is
// this daemon's while connections to it are refused; -1 on failure.
int ReservePort(const std::string& host, int port, int* bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0)
    return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      close(fd);
      fd = -1;
      continue;
    }
    *bound_port = ntohs(addr.ss_family == AF_INET6
                            ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                            : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  freeaddrinfo(found);
  return fd;
}

std::string HostPort(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

}  // namespace

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
  EtcdFlags etcd;
  auto* etcd_endpoints = app.add_option(
      "--etcd-endpoints", etcd.endpoints,
      "Keep the state in etcd (v3 API) at HOST:PORT[,HOST:PORT...] and serve as one of "
      "several replicas: the leader serves, the others stand by (port bound, not "
      "listening) and take over when its etcd lease runs out");
  app.add_option("--etcd-prefix", etcd.prefix,
                 "The keys of this deployment's state in etcd (refused if it holds keys "
                 "meshrun-rdzvd did not write)")
      ->capture_default_str();
  app.add_option("--etcd-deployment", etcd.deployment,
                 "This deployment's name, recorded under the prefix: a daemon of another "
                 "deployment is refused there")
      ->capture_default_str();
  app.add_option("--etcd-user", etcd.user, "etcd user (authentication on)");
  app.add_option("--etcd-password-file", etcd.password_file,
                 "File holding the etcd user's password (else MESHRUN_ETCD_PASSWORD)");
  app.add_option("--etcd-cacert", etcd.cacert, "Talk TLS to etcd: its CA (PEM)");
  app.add_option("--etcd-cert", etcd.cert, "Client certificate for etcd (PEM)");
  app.add_option("--etcd-key", etcd.key, "Client certificate's key for etcd (PEM)");
  app.add_option("--etcd-lease-ttl", etcd.lease_ttl_s,
                 "Seconds of the leader's etcd lease: a standby takes over this long "
                 "after the leader is gone")
      ->check(CLI::Range(2, 600))
      ->capture_default_str();
  app.add_option("--etcd-dial-timeout", etcd.dial_timeout_s,
                 "Seconds to wait at start for an etcd member to answer")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
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
  etcd_endpoints->excludes(app.get_option("--state-dir"));
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
  // take them synchronously on a thread of their own.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::mutex signal_mu;
  std::condition_variable signal_cv;
  std::atomic<int> signal_number{0};
  std::thread([&] {
    int number = 0;
    sigwait(&stop_signals, &number);
    {
      std::lock_guard<std::mutex> lock(signal_mu);
      signal_number = number;
    }
    signal_cv.notify_all();
  }).detach();

  // --etcd-endpoints: check etcd and the prefix, stand by until leading.
  std::shared_ptr<meshrun::rdzv::EtcdClient> etcd_client;
  std::unique_ptr<meshrun::rdzv::EtcdLeadership> leadership;
  meshrun::rdzv::EtcdStateMedium* medium = nullptr;
  if (!etcd.endpoints.empty()) {
    auto fail = [](const std::string& message, int code) {
      std::cerr << "meshrun-rdzvd: " << message << "\n";
      return code;
    };
    meshrun::rdzv::EtcdClientOptions client;
    auto endpoints = meshrun::rdzv::ParseEtcdEndpoints(etcd.endpoints);
    if (!endpoints.ok()) return fail(std::string(endpoints.status().message()), 2);
    client.endpoints = *endpoints;
    client.user = etcd.user;
    if (!etcd.password_file.empty()) {
      // (Not ReadTokenFile: it asks for 16 bytes at least, a token's rule.)
      std::ifstream in(etcd.password_file, std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      if (!in || in.bad())
        return fail("--etcd-password-file: cannot read " + etcd.password_file, 2);
      client.password = text.str();
      while (!client.password.empty() &&
             (client.password.back() == '\n' || client.password.back() == '\r'))
        client.password.pop_back();
    } else if (const char* password = getenv("MESHRUN_ETCD_PASSWORD")) {
      client.password = password;
    }
    if (!client.password.empty() && client.user.empty())
      return fail("an etcd password without --etcd-user", 2);
    for (auto [flag, path, pem, marker] :
         {std::tuple{"--etcd-cacert", &etcd.cacert, &client.ca_pem, "CERTIFICATE"},
          std::tuple{"--etcd-cert", &etcd.cert, &client.cert_pem, "CERTIFICATE"},
          std::tuple{"--etcd-key", &etcd.key, &client.key_pem, "PRIVATE KEY"}}) {
      if (path->empty()) continue;
      auto read = meshrun::rdzv::ReadPemFile(*path, flag, marker);
      if (!read.ok()) return fail(std::string(read.status().message()), 2);
      *pem = *read;
    }
    if (client.ca_pem.empty() && !(client.cert_pem.empty() && client.key_pem.empty()))
      return fail("--etcd-cert and --etcd-key need --etcd-cacert", 2);
    if (client.cert_pem.empty() != client.key_pem.empty())
      return fail("--etcd-cert and --etcd-key go together", 2);
    etcd_client = std::make_shared<meshrun::rdzv::EtcdClient>(client);

    int port = 0;
    const int reserved = ReservePort(options.host, options.port, &port);
    if (reserved < 0) {
      return fail("cannot bind " + HostPort(options.host, options.port) +
                      " (address in use or not local?)",
                  1);
    }
    const auto dial_deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(etcd.dial_timeout_s);
    absl::Status checked;
    while (!(checked = etcd_client->Check()).ok() &&
           checked.code() == absl::StatusCode::kUnavailable &&
           std::chrono::steady_clock::now() < dial_deadline && signal_number == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    if (!checked.ok()) {
      return fail(std::string(checked.message()),
                  checked.code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
    }
    meshrun::rdzv::EtcdLeadershipOptions election;
    election.prefix = etcd.prefix;
    election.deployment = etcd.deployment;
    election.endpoint = HostPort(options.host, port);
    election.lease_ttl_s = etcd.lease_ttl_s;
    auto opened = meshrun::rdzv::EtcdLeadership::Open(etcd_client, election);
    if (!opened.ok()) {
      return fail(std::string(opened.status().message()),
                  opened.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
    }
    leadership = std::move(*opened);
    std::printf("MESHRUN_RDZVD_STANDBY=%s\n", election.endpoint.c_str());
    std::fflush(stdout);
    log->info("standing by on {} (etcd {}, prefix {})", election.endpoint,
              etcd_client->current_endpoint(), leadership->prefix());
    absl::Status campaign = leadership->Campaign(
        [&] { return signal_number != 0; },
        [&](const std::string& leader) {
          log->info("standing by: the leader is {}", leader.empty() ? "nobody" : leader);
        });
    if (!campaign.ok()) {
      close(reserved);
      if (campaign.code() == absl::StatusCode::kCancelled) {
        log->info("signal {} received while standing by, exiting", signal_number.load());
        return 0;
      }
      return fail(std::string(campaign.message()), 3);
    }
    log->info("leading (term {}): loading the state from etcd", leadership->term());
    close(reserved);
    options.port = port;
    options.state_medium = [&medium, &leadership] {
      auto made = std::make_unique<meshrun::rdzv::EtcdStateMedium>(leadership.get());
      medium = made.get();
      return made;
    };
    // etcd answers the lease keep-alives and the state writes.
    auto etcd_reachable = [&leadership, &medium] {
      return leadership->etcd_reachable() && !(medium != nullptr && medium->stalled());
    };
    options.extra_status = [&leadership, &etcd_client,
                            etcd_reachable](meshrun::rdzv::StatusSnapshot* snapshot) {
      snapshot->etcd = meshrun::rdzv::EtcdStatusRecord{
          leadership->term(), etcd_reachable(), etcd_client->current_endpoint()};
    };
    options.extra_metrics = [&leadership, etcd_reachable](auto* families) {
      families->emplace_back("meshrun_etcd_leader_term",
                             "The etcd leadership term this daemon leads in.", "gauge");
      families->back().Add({}, static_cast<double>(leadership->term()));
      families->emplace_back(
          "meshrun_etcd_reachable",
          "1 while etcd answers this daemon's lease keep-alives and state writes.",
          "gauge");
      families->back().Add({}, etcd_reachable() ? 1 : 0);
    };
  }

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
  if (leadership) {
    leadership->KeepLeading([&log](const std::string& why) {
      log->critical("lost the leadership ({}); exiting so as not to serve stale state",
                    why);
      std::fflush(nullptr);
      _exit(75);
    });
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

  {
    std::unique_lock<std::mutex> lock(signal_mu);
    signal_cv.wait(lock, [&] { return signal_number != 0; });
  }
  log->info("signal {} received, shutting down", signal_number.load());
  // With etcd out of reach, the last writes would wait for it forever: give
  // them the grace and a little more, then end like a crash (nothing of them
  // was acknowledged).
  std::thread abandon;
  std::atomic<bool> shut_down{false};
  if (medium != nullptr) {
    abandon = std::thread([&] {
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(grace_ms) + std::chrono::seconds(5);
      while (!shut_down && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!shut_down) medium->Abandon();
    });
  }
  (*daemon)->Shutdown(std::chrono::milliseconds(grace_ms));
  shut_down = true;
  if (abandon.joinable()) abandon.join();
  // A standby takes over at once rather than when the lease runs out.
  if (leadership) leadership->Resign();
  return 0;
}
