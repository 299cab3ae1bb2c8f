#pragma once

// The client-process side of store_bench. Each Run* function is one process
// role; it reports on stdout in lines of `WORD key=value ...` (an `error=`
// field, if any, comes last and runs to the end of the line) that the
// orchestrator in store_bench.cc parses. Times that cross processes are
// steady_clock nanoseconds (CLOCK_MONOTONIC, one clock for the whole machine).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "bench/bench_stores.h"

namespace meshrun::bench {

// Throughput and latency: `clients` threads, each with its own store client,
// loop set(k_i, 64 B) / get(k_i) / add("counter", 1) for warmup + duration;
// only ops started in the measured window count. Over the same window it
// reads the CPU time of this process and of the server (`server_pid`), and
// how busy the machine's cores were, to tell where the time per op goes.
// Prints: RESULT ops= seconds= ops_per_s= p50_us= p99_us= client_cpu_us_per_op=
//   server_cpu_us_per_op= busy_cores= errors= [error=]
struct OpsOptions {
  Impl impl = Impl::kMeshrun;
  std::string target;    // host:port, or a list (client i takes the i-th, round robin)
  pid_t server_pid = 0;  // 0: server CPU not measured
  pid_t relay_pid = 0;   // the relays in front of it, counted as server CPU
  int clients = 1;
  // meshrun only: every client's stream on one channel (one TCP connection)
  // instead of a channel and a connection each.
  bool shared_channel = false;
  size_t value_bytes = 64;
  std::chrono::milliseconds warmup{300};
  std::chrono::milliseconds duration{3000};
  std::chrono::milliseconds timeout{30000};
};
int RunOpsClient(const OpsOptions& options);

// One process's share of a store barrier of `total` clients: every client adds
// 1 to "arrived", the one that reaches `total` sets "done", all wait for
// "done". Each client has its own connection. Driven through stdin:
//   prints READY; on CONNECT connects all clients (one thread each) and prints
//   CONNECTED ok= failed= t_ns= [error=]; on GO runs the barrier and prints
//   DONE ok= failed= t_ns= [error=]; on EXIT or EOF exits at once.
// While waiting it prints PROGRESS connected= released= every 2 s.
struct BarrierOptions {
  Impl impl = Impl::kMeshrun;
  std::string target;
  int clients = 1;
  int total = 1;
  std::chrono::milliseconds timeout{120000};
};
int RunBarrierClient(const BarrierOptions& options);

// One rendezvous round of `nodes` simulated nodes against meshrun-rdzvd: each
// node is a Join stream (callback API) on one of `channels` connections, with
// min_nodes = max_nodes = nodes. Times first join -> last `assigned` event,
// checks ranks and world sizes, then closes the run.
// Prints: RESULT seconds= issue_seconds= assigned= ranks_ok= world_ok= [error=]
struct RdzvOptions {
  std::string target;
  int nodes = 1;
  int channels = 8;
  std::string run_id = "bench";
  std::chrono::milliseconds timeout{60000};
};
int RunRdzvClient(const RdzvOptions& options);

// A c10d TCPStore server on 127.0.0.1, port 0. Prints TCPSTORE_PORT=<port>,
// then serves until stdin reaches EOF.
int RunTcpStoreServer(std::chrono::milliseconds timeout);
// `count` agents' store relays (rendezvous/relay/store_relay.h) to the daemon
// at `daemon`, in this process: prints RELAY_ENDPOINTS=host:port,... and
// serves until stdin closes.
int RunRelays(const std::string& daemon, int count);

// "host:port" -> host, port (port -1 when malformed).
std::pair<std::string, int> SplitHostPort(const std::string& target);

}  // namespace meshrun::bench
