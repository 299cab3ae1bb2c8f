#pragma once

// The `meshrun` command line as a pure function: argv (without argv[0]) and the
// process environment in, a validated LaunchConfig or one-line error out. It
// accepts torchrun's flags in both spellings (--nproc-per-node and
// --nproc_per_node), takes unset flags from PET_* variables as torchrun does,
// and passes the training script and everything after it through untouched.
//
// Nothing here spawns, binds, logs or reads the environment by itself; the only
// facts taken from the machine (CPU and GPU counts, a fresh run id) come in
// through HostProbe so tests can pin them.
//
// Thread-safety: ParseLaunchArgs is reentrant; it keeps no state.

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace meshrun::launcher {

// Which rendezvous implementation the agent talks to.
enum class RdzvBackend {
  // meshrun's rendezvous daemon (names "c10d", "meshrun", "dynamic"): elastic
  // membership, heartbeats, restarts agreed by every node.
  kDynamic,
  // A fixed node set: every node states its --node-rank and the node count is
  // fixed; the endpoint defaults to --master-addr:--master-port.
  kStatic,
};

// Which of a worker's standard streams a -r/-t setting applies to. The values
// are torchrun's Std flags, so "3" means both, as on torchrun's command line.
enum class StdStreams { kNone = 0, kOut = 1, kErr = 2, kAll = 3 };

// A -r/--redirects or -t/--tee value: "N" applies to every local rank,
// "LR:N,LR:N" names local ranks one by one and leaves the others untouched
// (torchrun's Std.from_str + to_map).
struct StdStreamsSpec {
  // Applies to local ranks absent from by_local_rank; kNone when a per-rank
  // mapping was given.
  StdStreams all_ranks = StdStreams::kNone;
  // Explicit settings by local rank.
  std::map<int, StdStreams> by_local_rank;

  StdStreams ForLocalRank(int local_rank) const;
  bool operator==(const StdStreamsSpec& other) const {
    return all_ranks == other.all_ranks && by_local_rank == other.by_local_rank;
  }
};

// What a worker failure restarts (--restart-scope).
enum class RestartScope {
  // Every worker on every node: the run re-forms (torchrun's behaviour).
  kJob,
  // Only the failed worker's replica group (--replica-size); the others keep
  // running and the run does not re-form.
  kReplica,
};

// Where workers' MASTER_ADDR:MASTER_PORT points (--worker-store).
enum class WorkerStore {
  kDefault,  // kAgent with c10d; kDaemon with static and --standalone
  kAgent,    // this node's agent (its store relay)
  kDaemon,   // the daemon's port, where it serves this run
};

// A host and a port as given on the command line, brackets of an IPv6 literal
// removed ("[::1]:29400" -> host "::1").
struct HostPort {
  std::string host;
  // 0 asks the server side to let the kernel pick a free port.
  int port = 0;

  bool operator==(const HostPort& other) const {
    return host == other.host && port == other.port;
  }
};

// --rdzv-conf, typed. Durations are given in (possibly fractional) seconds on
// the command line and kept to the millisecond.
struct RdzvConf {
  // How long a node waits for a round to close before giving up (also spelt
  // `timeout`, the static backend's name for it).
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  // Once min nodes have joined, how long to wait for more before closing.
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
  // How long the round may take to close once closing began.
  std::chrono::milliseconds close_timeout{std::chrono::seconds(30)};
  // Heartbeat period of an agent.
  std::chrono::milliseconds keep_alive_interval{std::chrono::seconds(5)};
  // Missed heartbeats after which a node is presumed dead.
  int keep_alive_max_attempt = 3;
  // Timeout of one store read by the agent.
  std::chrono::milliseconds read_timeout{std::chrono::seconds(60)};
  // Whether this node hosts the rendezvous daemon; unset means "decide by
  // whether the endpoint names this host", as torch's c10d backend does.
  std::optional<bool> is_host;
};

struct LaunchConfig {
  // Non-empty iff -h/--help came before the script: main prints it and exits
  // 0. No other field is meaningful then.
  std::string help_text;
  // --version came before the script (and no --help): main prints the
  // version and exits 0. No other field is meaningful then.
  bool version_requested = false;

  // --nnodes MIN:MAX (or N for N:N). 1 <= min_nodes <= max_nodes.
  int min_nodes = 1;
  int max_nodes = 1;

  // --nproc-per-node as written ("4", "cpu", "gpu", "auto"), for messages.
  std::string nproc_per_node_spec = "1";
  // Workers on this node, resolved from the spec; >= 1.
  int nproc_per_node = 1;

  // torchrun 2's default is static; on one node with neither --rdzv-endpoint
  // nor --master-port that becomes --standalone (below), as with torchrun.
  RdzvBackend rdzv_backend = RdzvBackend::kDynamic;
  // Where the rendezvous is served. Static backend without --rdzv-endpoint:
  // --master-addr:--master-port. --standalone: localhost:0. Dynamic backend
  // without --rdzv-endpoint: localhost:29400.
  HostPort rdzv_endpoint{"localhost", 29400};
  // Every endpoint given, in order (c10d's --rdzv-endpoint=A,B,...: daemon
  // replicas, one serving at a time); rdzv_endpoint is the first. Empty when
  // rdzv_endpoint alone is meant (one endpoint, or a default).
  std::vector<HostPort> rdzv_endpoints;
  // False when rdzv_endpoint is a default (a flag/PET_ value was not given).
  bool rdzv_endpoint_given = false;
  // --rdzv-id: the run (job) id shared by all nodes; a fresh UUID under
  // --standalone.
  std::string rdzv_id = "none";
  RdzvConf rdzv_conf;
  // --standalone, or torchrun's rule that implies it (static backend, one
  // node, no --rdzv-endpoint, no --master-port): single node, embedded daemon
  // on a kernel-chosen port, a fresh run id.
  bool standalone = false;

  // --max-restarts: restarts of the worker group before the run fails; >= 0.
  int max_restarts = 0;
  // --restart-scope. With kReplica, --replica-size: workers per replica group
  // (global ranks [r*N, (r+1)*N) form group r); nproc_per_node is a multiple
  // of it. Given without kReplica, --replica-size is refused.
  RestartScope restart_scope = RestartScope::kJob;
  int replica_size = 1;
  // --worker-store.
  WorkerStore worker_store = WorkerStore::kDefault;
  // --monitor-interval. meshrun supervises on events, not by polling; kept so
  // torchrun command lines parse and for anything that must poll.
  std::chrono::milliseconds monitor_interval{100};
  // --role: ROLE_NAME of the workers and the log prefix's ${role_name}.
  std::string role = "default";

  // -m/--module: run the script as `python -m <script>`.
  bool module = false;
  // --no-python: execute the script directly.
  bool no_python = false;
  // --run-path: torchrun runs the script in its own interpreter; meshrun has
  // none, so the script runs under python like without the flag (see notices).
  bool run_path = false;

  // --log-dir: base directory for worker log files; empty: the agent picks a
  // temporary directory, as torchrun does.
  std::string log_dir;
  // -r/--redirects: streams written only to log files.
  StdStreamsSpec redirects;
  // -t/--tee: streams written to log files and the console.
  StdStreamsSpec tee;
  // --local-ranks-filter: local ranks whose output reaches the console; empty
  // means all of them.
  std::set<int> local_ranks_filter;
  // --duplicate-stdout-filters / --duplicate-stderr-filters: substrings
  // (",," for a literal comma) whose tee'd console lines are also copied to
  // attempt_<n>/filtered_std{out,err}.log; unset when the flag was not given
  // (given empty, it is one empty filter: every line, as torchrun).
  std::optional<std::vector<std::string>> duplicate_stdout_filters;
  std::optional<std::vector<std::string>> duplicate_stderr_filters;

  // --node-rank: this node's rank hint (sticky group rank) or -1 for none.
  // The static backend's single node without --node-rank gets 0.
  int node_rank = -1;
  // Whether --node-rank (or PET_NODE_RANK) was given.
  bool node_rank_given = false;
  // --master-addr/--master-port: the static backend's rendezvous address. The
  // dynamic backend publishes a kernel-chosen port instead.
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // --local-addr: the address other nodes reach this node by; empty: the
  // agent looks it up (FQDN), as torchrun does.
  std::string local_addr;

  // --token-file, --tls-ca, --tls-cert, --tls-key, --tls-client-ca: paths
  // (rendezvous/security.h), checked and read by main; empty: not given.
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;

  // --shutdown-timeout: grace between SIGTERM and SIGKILL when stopping
  // workers.
  std::chrono::milliseconds shutdown_timeout{std::chrono::seconds(30)};
  // --rdzv-reconnect-grace: how long workers run on while the daemon is
  // unreachable; unset: the lease (keep_alive_interval x max_attempt).
  std::optional<std::chrono::milliseconds> reconnect_grace;
  // --health-check commands, then --health-check-dir's executables.
  std::vector<std::string> health_checks;
  std::chrono::seconds health_check_timeout{60};
  // --hang-timeout; 0: off.
  std::chrono::milliseconds hang_timeout{std::chrono::seconds(1800)};
  // --signals-to-handle as signal numbers, in the order given, no repeats.
  std::vector<int> signals_to_handle;
  // ... and as given: the workers' TORCHELASTIC_SIGNALS_TO_HANDLE, as torchrun
  // sets it.
  std::string signals_to_handle_text = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  // --virtual-local-rank: LOCAL_RANK=0 and one visible GPU per worker.
  bool virtual_local_rank = false;
  // --log-line-prefix-template: console prefix of worker output lines, with
  // ${role_name}, ${rank}, ${local_rank}, ${hostname} (short host name, as
  // torchrun 2) and ${host} (the agent's address) placeholders.
  std::string log_line_prefix_template = "[${role_name}${local_rank}]:";

  // The training script (or module, or program with --no-python) and its
  // arguments, exactly as given.
  std::string script;
  std::vector<std::string> script_args;
  // What each worker executes, torchrun's way: [python, "-u", ("-m",) script,
  // args...], or [script, args...] with --no-python. argv[0] is resolved from
  // PATH by the spawner when it has no slash.
  std::vector<std::string> worker_argv;
  // The interpreter of Python workers and of the --ray driver: $PYTHON_EXEC,
  // else the python3 of meshrun's own virtualenv, else "python3" from PATH.
  std::string python;
  // Where `python` came from, for messages: "$PYTHON_EXEC", "meshrun's
  // virtualenv" or "PATH".
  std::string python_source;

  // --metrics-port: the embedded daemon's HTTP port (status page, metrics);
  // -1 for none, 0 for kernel-assigned.
  int metrics_port = -1;

  // --slurm: defaults came from SLURM's environment (see slurm_env.h); the
  // first node hosts the derived rendezvous endpoint.
  bool slurm = false;

  // --ray[=ADDRESS]: the Ray cluster's address (the flag's, else
  // $RAY_ADDRESS, else "auto"); unset without the flag. main hands the
  // launch to the Ray driver (python/meshrun/ray_launch.py).
  std::optional<std::string> ray_address;
  bool ray_rdzv_id_given = false;  // else the driver names the run

  // Things the user should be told (overridden or ignored flags), one line
  // each; main logs them before launching.
  std::vector<std::string> notices;
};

// The machine facts the command line depends on, behind one seam.
// REQUIRES: all three functions set.
struct HostProbe {
  // Online CPUs (--nproc-per-node=cpu|auto).
  std::function<int()> cpu_count;
  // Visible GPUs (--nproc-per-node=gpu|auto); 0 when none.
  std::function<int()> gpu_count;
  // A fresh, unique run id for --standalone.
  std::function<std::string()> new_run_id;
  // The python3 of the virtualenv (or conda env) this meshrun is installed
  // in, where it is one (the pip wheel's): "" otherwise, and when unset.
  std::function<std::string()> venv_python;
};

// The real machine: sysconf CPUs, /dev/nvidiaN device nodes, random UUIDv4,
// the python3 beside /proc/self/exe in a virtualenv.
HostProbe SystemHostProbe();

// Parses `args` (argv without argv[0]); `env` supplies PET_* defaults and
// PYTHON_EXEC. Errors are InvalidArgument with a one-line message that starts
// with the flag concerned ("--nnodes: ..."), fit for "meshrun: <message>".
absl::StatusOr<LaunchConfig> ParseLaunchArgs(
    const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
    const HostProbe& host);
// As above with SystemHostProbe().
absl::StatusOr<LaunchConfig> ParseLaunchArgs(
    const std::vector<std::string>& args, const std::map<std::string, std::string>& env);

}  // namespace meshrun::launcher
