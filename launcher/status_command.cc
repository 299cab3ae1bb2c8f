#include "launcher/status_command.h"

#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "rendezvous/client/endpoint_list.h"
#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/security/security.h"
#include "rendezvous/status/status_proto.h"
#include "rendezvous/status/status_render.h"

namespace meshrun::launcher {
namespace {

// HOST:PORT with a port, IPv6 as [ADDR]:PORT, or a comma-separated list of
// them (daemon replicas: the one that serves answers).
bool ValidEndpoints(const std::string& endpoints) {
  std::vector<std::string> seen;
  for (const std::string& entry : rdzv::SplitEndpointList(endpoints)) {
    std::string host;
    int port = 0;
    if (!rdzv::SplitHostPort(entry, &host, &port)) return false;
    if (std::find(seen.begin(), seen.end(), entry) != seen.end()) return false;
    seen.push_back(entry);
  }
  return true;
}

}  // namespace

int RunStatusCommand(const std::vector<std::string>& args) {
  std::string endpoint;
  std::string run_id;
  bool json = false;
  double timeout_s = 5;
  rdzv::ClientSecurityFiles security_files;
  CLI::App app{"meshrun status: the runs a rendezvous daemon knows", "meshrun status"};
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", endpoint,
                 "The daemon's HOST:PORT (its gRPC port), or a comma-separated "
                 "list of daemon replicas")
      ->required();
  app.add_option("--run-id,--run_id,--rdzv-id,--rdzv_id", run_id,
                 "Show only this run (default: every run)");
  app.add_flag("--json", json, "Print JSON (the status page's /api/status format)");
  app.add_option("--token-file,--token_file", security_files.token_file,
                 "File holding the daemon's token (else MESHRUN_RDZV_TOKEN(_FILE))");
  app.add_option("--tls-ca,--tls_ca", security_files.tls_ca,
                 "Talk TLS to the daemon, trusting this CA (PEM)");
  app.add_option("--tls-cert,--tls_cert", security_files.tls_cert,
                 "Client certificate (PEM), for a daemon that requires one");
  app.add_option("--tls-key,--tls_key", security_files.tls_key, "The key of --tls-cert");
  app.add_option("--timeout", timeout_s, "Seconds to wait for the daemon")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  try {
    // CLI11 wants the arguments reversed.
    app.parse(std::vector<std::string>(args.rbegin(), args.rend()));
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "meshrun status: %s (see meshrun status --help)\n", e.what());
    return 2;
  }
  if (!ValidEndpoints(endpoint)) {
    std::fprintf(stderr,
                 "meshrun status: --rdzv-endpoint: expected HOST:PORT (IPv6 as "
                 "[ADDR]:PORT) or a list of distinct ones, comma-separated, got '%s'\n",
                 endpoint.c_str());
    return 2;
  }

  auto security = rdzv::LoadClientSecurity(security_files, getenv);
  if (!security.ok()) {
    std::fprintf(stderr, "meshrun status: %s\n",
                 std::string(security.status().message()).c_str());
    return 2;
  }
  auto channel = rdzv::MakeChannel(endpoint, *security);
  rdzv::RendezvousClient client(channel);
  client.set_call_timeout(
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  meshrun::v1::StatusRequest request;
  request.set_run_id(run_id);
  auto reply = client.Status(request);
  if (!reply.ok()) {
    const absl::StatusCode code = reply.status().code();
    if (code == absl::StatusCode::kNotFound) {
      std::fprintf(stderr, "meshrun status: %s\n",
                   std::string(reply.status().message()).c_str());
    } else if (code == absl::StatusCode::kUnauthenticated ||
               code == absl::StatusCode::kPermissionDenied) {
      std::fprintf(stderr,
                   "meshrun status: the rendezvous daemon at %s refused the call: %s "
                   "(see --token-file, --tls-ca)\n",
                   endpoint.c_str(), std::string(reply.status().message()).c_str());
    } else {
      std::fprintf(stderr,
                   "meshrun status: cannot reach the rendezvous daemon at %s: %s\n",
                   endpoint.c_str(), std::string(reply.status().message()).c_str());
    }
    return 1;
  }
  rdzv::StatusSnapshot snapshot = rdzv::FromProto(*reply);
  if (json) {
    std::cout << rdzv::RenderStatusJson(snapshot) << "\n";
  } else {
    std::cout << rdzv::RenderStatusTable(snapshot);
  }
  return 0;
}

}  // namespace meshrun::launcher
