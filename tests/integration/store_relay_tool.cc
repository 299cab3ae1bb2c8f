// Test helper: an agent's store relay on its own, for the TCPStore
// conformance suite and benchmarks: serves c10d's TCPStore protocol on
// 127.0.0.1 (kernel-assigned port) and relays to the daemon at ENDPOINT in
// store namespace NS. Token and TLS come from the environment, as an agent's
// workers' do (MESHRUN_RDZV_TOKEN(_FILE), MESHRUN_RDZV_TLS_*). Prints
// MESHRUN_RELAY_ENDPOINT=127.0.0.1:PORT, then serves until stdin closes, and
// logs what it did.
//   store_relay_tool ENDPOINT NS
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "rendezvous/relay/store_relay.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: store_relay_tool ENDPOINT NS\n");
    return 2;
  }
  auto security = meshrun::rdzv::ClientSecurityFromEnvironment(std::getenv);
  if (!security.ok()) {
    std::fprintf(stderr, "%s\n", security.status().ToString().c_str());
    return 1;
  }
  meshrun::rdzv::StoreRelayOptions options;
  options.daemon = argv[1];
  options.security = std::move(*security);
  auto relay = meshrun::rdzv::StoreRelay::Start(std::move(options));
  if (!relay.ok()) {
    std::fprintf(stderr, "%s\n", relay.status().ToString().c_str());
    return 1;
  }
  (*relay)->SetNamespace(argv[2]);
  std::printf("MESHRUN_RELAY_ENDPOINT=127.0.0.1:%d\n", (*relay)->port());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  (*relay)->Stop();  // logs what it did
  return 0;
}
