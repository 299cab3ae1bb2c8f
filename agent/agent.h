#pragma once

// The per-node elastic agent: joins the run at the daemon, starts the local
// workers for each round, and carries out AgentState's decisions. One Asio
// io_context on the calling thread drives everything: SIGCHLD, worker pipes,
// signals, timers, and rendezvous events (posted from the gRPC reader).

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "meshrun/v1/rendezvous.pb.h"
#include "rendezvous/security/security.h"

namespace meshrun::agent {

// Which of a worker's streams go to log files (-r) or also to the console
// (-t). Indexed by local rank; a missing entry means "none".
enum StdStreams : int { kNone = 0, kStdout = 1, kStderr = 2, kBoth = 3 };

struct AgentOptions {
  std::string run_id;
  std::string role = "default";
  // Unique per agent process; the daemon tells agents apart by it.
  std::string node_id;
  // This node's address as other nodes reach it (MASTER_ADDR when it is
  // group rank 0).
  std::string host;
  int nproc = 1;
  // --restart-scope=replica: workers per replica group (a divisor of nproc);
  // a failed worker restarts its replica group only. 0: restart scope job.
  int replica_size = 0;
  int node_rank_hint = -1;
  std::string rdzv_endpoint;  // the daemon's host:port
  // Workers' MASTER_ADDR / MASTER_PORT, with TORCHELASTIC_USE_AGENT_STORE=True
  // as under torchrun 2: the daemon's TCPStore front-end as this node's
  // workers reach it (`daemon_store`: --standalone, the static backend,
  // --worker-store=daemon), in rounds whose assignment says the daemon serves
  // this run there; otherwise (unset, or a daemon that serves another run,
  // wants a token or TLS, or serves no TCPStore) the agent's own store relay
  // on 127.0.0.1 (rendezvous/relay/store_relay.h), which carries the
  // workers' requests to the daemon with the agent's token and TLS and
  // through daemon restarts.
  struct StoreAddress {
    std::string host;  // bare, no IPv6 brackets
    int port = 0;
  };
  std::optional<StoreAddress> daemon_store;
  // Token and TLS of the agent's calls to the daemon.
  rdzv::ClientSecurity security;
  // What workers need to reach the daemon the same way: file paths
  // (MESHRUN_RDZV_TOKEN_FILE, MESHRUN_RDZV_TLS_*), never the token itself.
  std::map<std::string, std::string> worker_security_env;
  meshrun::v1::RunConfig run_config;
  std::vector<std::string> worker_argv;
  // Logs: <log_dir>/<run_id>/attempt_<n>/<local_rank>/{stdout,stderr}.log and
  // error.json. Without a log dir, a temporary one holds the error files.
  std::optional<std::string> log_dir;
  int redirects_all = kNone;
  std::vector<int> redirects;  // per local rank; overrides redirects_all
  int tee_all = kNone;
  std::vector<int> tee;
  // Console prefix; ${role_name} ${rank} ${local_rank} ${hostname} (short
  // host name) ${host} (`host` above) are replaced.
  std::string prefix_template = "[${role_name}${local_rank}]:";
  std::set<int> local_ranks_filter;  // empty: every local rank on the console
  // torchrun's --duplicate-std{out,err}-filters: tee'd console lines holding
  // any of these also go to <log root>/attempt_<n>/filtered_std{out,err}.log.
  // Unset: no such file.
  std::optional<std::vector<std::string>> duplicate_stdout_filters;
  std::optional<std::vector<std::string>> duplicate_stderr_filters;
  std::chrono::milliseconds shutdown_timeout{30000};
  // How long the workers keep running without a successful heartbeat (the
  // daemon restarting, or this node cut off) while the agent reconnects;
  // then they are stopped and the agent exits with kLeaseExpiredExitCode.
  // Unset: keep_alive_interval x keep_alive_max_attempt, the daemon's lease.
  std::optional<std::chrono::milliseconds> reconnect_grace;
  // --hang-timeout: a local worker group that makes no progress for this
  // long (agent/hang_detector.h) has its stacks taken and is stopped as
  // failed. 0: off.
  std::chrono::milliseconds hang_timeout{0};
  // Run by /bin/sh before joining and before each restart round
  // (agent/health_check.h); the first to fail keeps this node out.
  std::vector<std::string> health_checks;
  std::chrono::seconds health_check_timeout{60};
  std::vector<int> signals_to_handle;
  // As given on the command line: the workers' TORCHELASTIC_SIGNALS_TO_HANDLE.
  std::string signals_to_handle_text = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  // --virtual-local-rank: LOCAL_RANK=0 and one visible GPU per worker.
  bool virtual_local_rank = false;
};

// Runs the agent until the run ends for this node; returns the launcher's
// exit code (0, the root-cause worker's code, or 128 + a signal).
int RunAgent(const AgentOptions& options);

}  // namespace meshrun::agent
