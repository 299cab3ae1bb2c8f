// A minimal "agent" for worker_group_test: starts one worker running
// `sleep 100`, prints the worker's pid on stdout, then runs its io_context
// until it is killed. The test SIGKILLs this process and checks that the
// worker dies with it.

#include <boost/asio/io_context.hpp>
#include <cstdio>

#include "agent/worker_group.h"

int main() {
  boost::asio::io_context io;
  meshrun::agent::WorkerGroup group(io, [&io](const meshrun::agent::WorkerExit&) {
    std::fprintf(stdout, "worker exited\n");
    std::fflush(stdout);
    io.stop();
  });
  meshrun::agent::WorkerSpec spec;
  spec.argv = {"sleep", "100"};
  absl::Status status = group.Start({spec});
  if (!status.ok()) {
    std::fprintf(stderr, "pdeathsig_helper: %s\n", status.ToString().c_str());
    return 1;
  }
  std::fprintf(stdout, "%d\n", static_cast<int>(group.pids().at(0)));
  std::fflush(stdout);
  io.run();
  return 0;
}
