// Test helper: one store operation against a daemon, from its own process,
// so tests can kill a client in the middle of a call. Token and TLS come from
// the environment, as a worker's do (MESHRUN_RDZV_TOKEN(_FILE), MESHRUN_RDZV_TLS_*).
//   store_tool ENDPOINT NS set KEY VALUE
//   store_tool ENDPOINT NS wait KEY TIMEOUT_MS   (prints "waiting" first)
//   store_tool ENDPOINT NS get KEY TIMEOUT_MS    (prints the value)
//   store_tool ENDPOINT NS setmany PREFIX COUNT  (one after another; prints
//                                                 "elapsed_us=N")
#include <cstdio>
#include <cstdlib>
#include <string>

#include "rendezvous/client/store_client.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr,
                 "usage: store_tool ENDPOINT NS set|wait KEY [VALUE|TIMEOUT_MS]\n");
    return 2;
  }
  meshrun::rdzv::StoreClientOptions options;
  options.target = argv[1];
  options.ns = argv[2];
  auto security = meshrun::rdzv::ClientSecurityFromEnvironment(std::getenv);
  if (!security.ok()) {
    std::fprintf(stderr, "%s\n", security.status().ToString().c_str());
    return 1;
  }
  options.security = std::move(*security);
  // STORE_TOOL_CONNECT_MS: longer where the daemon may be failing over to a
  // replica (the first of a list on a silent host costs seconds).
  const char* connect_ms = std::getenv("STORE_TOOL_CONNECT_MS");
  options.connect_timeout =
      std::chrono::milliseconds(connect_ms != nullptr ? std::atoi(connect_ms) : 5000);
  auto client = meshrun::rdzv::StoreClient::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  std::string op = argv[3];
  absl::Status status;
  if (op == "set" && argc == 6) {
    status = (*client)->Set(argv[4], argv[5]);
  } else if (op == "wait" && argc == 6) {
    std::printf("waiting\n");
    std::fflush(stdout);
    status = (*client)->Wait({argv[4]}, std::chrono::milliseconds(std::stol(argv[5])));
  } else if (op == "setmany" && argc == 6) {
    const long count = std::stol(argv[5]);
    const auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < count && status.ok(); ++i)
      status = (*client)->Set(std::string(argv[4]) + std::to_string(i), "value");
    std::printf(
        "elapsed_us=%lld\n",
        static_cast<long long>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now() - start)
                                   .count()));
  } else if (op == "get" && argc == 6) {
    auto value = (*client)->Get(argv[4], std::chrono::milliseconds(std::stol(argv[5])));
    status = value.status();
    if (value.ok()) std::printf("value=%s\n", value->c_str());
  } else {
    std::fprintf(stderr, "store_tool: bad arguments\n");
    return 2;
  }
  std::printf("%s\n", status.ok() ? "ok" : status.ToString().c_str());
  return status.ok() ? 0 : 1;
}
