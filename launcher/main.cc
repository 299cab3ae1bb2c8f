// meshrun: launches a training script on this node the way torchrun does, with
// meshrun's rendezvous daemon (embedded for --standalone, or hosted by the
// agent whose --rdzv-endpoint names this machine when nothing serves there).
//
// Exit codes: 0 success; the root-cause worker's exit code (or 128 + its
// signal) when the run failed; 128 + N when meshrun itself got signal N; 1
// for launcher errors (daemon unreachable, cannot start workers); 2 for bad
// flags; 71 (agent::kResourceExitCode) when it cannot get a thread
// (thread_guard.cc) or the file descriptors it needs.

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent.h"
#include "agent/dump_helper.h"
#include "agent/resources.h"
#include "agent/worker_group.h"
#include "launcher/launch_config.h"
#include "launcher/local_address.h"
#include "launcher/status_command.h"
#include "rendezvous/security/security.h"
#include "rendezvous/server/daemon.h"
#include "rendezvous/status/build_info.h"

extern char** environ;

namespace meshrun::launcher {
namespace {

std::map<std::string, std::string> Environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

std::string FormatEndpoint(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

// host_pid_random, after MESHRUN_NODE_LABEL's letters, digits and -.: when
// set (meshrun --ray: "ray-" and the Ray node), so that the status page and
// `meshrun status` say which node of the cluster each agent is.
std::string NodeId() {
  std::random_device random;
  char suffix[9];
  std::snprintf(suffix, sizeof suffix, "%08x", random());
  std::string label;
  if (const char* given = getenv("MESHRUN_NODE_LABEL")) {
    for (const char* c = given; *c != '\0' && label.size() < 64; ++c) {
      if (std::isalnum(static_cast<unsigned char>(*c)) || *c == '-' || *c == '.' ||
          *c == ':')
        label.push_back(*c);
    }
    if (!label.empty()) label.push_back('_');
  }
  return label + LocalHostName() + "_" + std::to_string(getpid()) + "_" + suffix;
}

// torchrun hands every script to python unless --no-python. An executable
// file that is not a .py script (a C++ training program linking
// meshrun_worker) runs as itself instead, which python could not do anyway;
// scripts with a shebang keep working either way.
void RunExecutablesDirectly(LaunchConfig& config) {
  if (config.no_python || config.module || config.run_path) return;
  const std::string& script = config.script;
  if (script.size() >= 3 && script.compare(script.size() - 3, 3, ".py") == 0) return;
  struct stat info;
  if (stat(script.c_str(), &info) != 0 || !S_ISREG(info.st_mode) ||
      access(script.c_str(), X_OK) != 0)
    return;
  config.worker_argv = {script};
  config.worker_argv.insert(config.worker_argv.end(), config.script_args.begin(),
                            config.script_args.end());
}

meshrun::v1::RunConfig ToRunConfig(const LaunchConfig& config) {
  meshrun::v1::RunConfig run;
  run.set_min_nodes(static_cast<uint32_t>(config.min_nodes));
  run.set_max_nodes(static_cast<uint32_t>(config.max_nodes));
  run.set_max_restarts(static_cast<uint32_t>(config.max_restarts));
  const auto& conf = config.rdzv_conf;
  run.set_last_call_timeout_ms(static_cast<uint32_t>(conf.last_call_timeout.count()));
  run.set_join_timeout_ms(static_cast<uint32_t>(conf.join_timeout.count()));
  run.set_keep_alive_interval_ms(static_cast<uint32_t>(conf.keep_alive_interval.count()));
  run.set_keep_alive_max_attempt(static_cast<uint32_t>(conf.keep_alive_max_attempt));
  // Nodes of one run must agree on it (the daemon refuses a node that does
  // not): a replica group restarting alone on one node while another node
  // restarts the world would leave the groups out of step.
  if (config.restart_scope == RestartScope::kReplica)
    run.set_replica_size(static_cast<uint32_t>(config.replica_size));
  return run;
}

constexpr char kHostTlsNeedsCert[] =
    "hosting the rendezvous daemon with TLS needs --tls-ca, --tls-cert and --tls-key "
    "together";

// A daemon this launcher hosts takes the agents' token, and serves TLS with
// this node's --tls-cert when the agents talk TLS (--tls-ca).
absl::Status HostedDaemonSecurity(const LaunchConfig& config,
                                  const rdzv::ClientSecurity& client,
                                  rdzv::ServerSecurity* server) {
  rdzv::ServerSecurityFiles files;
  files.tls_cert = config.tls_cert;
  files.tls_key = config.tls_key;
  files.tls_client_ca = config.tls_client_ca;
  // The token was read already; no second read of the environment.
  auto loaded =
      rdzv::LoadServerSecurity(files, [](const char*) -> const char* { return nullptr; });
  if (!loaded.ok()) return loaded.status();
  *server = std::move(*loaded);
  server->token = client.token;
  return absl::OkStatus();
}

// Workers reach the daemon as the agent does: through file paths in their
// environment (a token given in MESHRUN_RDZV_TOKEN is inherited as is).
std::map<std::string, std::string> WorkerSecurityEnv(const LaunchConfig& config) {
  std::map<std::string, std::string> env;
  auto add = [&](const char* name, const std::string& path) {
    if (path.empty()) return;
    std::error_code ignored;
    auto absolute = std::filesystem::absolute(path, ignored);
    env[name] = absolute.empty() ? path : absolute.string();
  };
  add(rdzv::kTokenFileEnv, config.token_file);
  add(rdzv::kTlsCaEnv, config.tls_ca);
  add(rdzv::kTlsCertEnv, config.tls_cert);
  add(rdzv::kTlsKeyEnv, config.tls_key);
  return env;
}

// The workers' interpreter as the spawner finds it (a name on PATH as the
// file it resolves to), and where the choice came from.
std::string DescribePython(const LaunchConfig& config) {
  std::string path = config.python;
  for (const std::string& candidate : agent::ExecCandidates(config.python, {})) {
    if (access(candidate.c_str(), X_OK) == 0) {
      path = candidate;
      break;
    }
  }
  return absl::StrCat(path, " (from ", config.python_source,
                      "; set PYTHON_EXEC to choose another)");
}

// --ray: the launch is the Ray driver's (python/meshrun/ray_launch.py), which
// starts an agent per Ray node with these same arguments less --ray. Returns
// only when it cannot be started.
int ExecRayDriver(const std::vector<std::string>& args, const LaunchConfig& config) {
  std::error_code ignored;
  const std::string self =
      std::filesystem::read_symlink("/proc/self/exe", ignored).string();
  const std::string& python = config.python;
  std::vector<std::string> driver{
      python,
      "-m",
      "meshrun.ray_launch",
      "--address=" + *config.ray_address,
      "--meshrun=" + self,
      "--nnodes=" + std::to_string(config.min_nodes) + ":" +
          std::to_string(config.max_nodes),
      "--nproc-per-node=" + std::to_string(config.nproc_per_node)};
  if (!config.ray_rdzv_id_given) driver.push_back("--name-run");
  // The daemon the driver starts requires the agents' token (else it makes
  // one of its own, which the agents' --token-file would not match).
  if (!config.token_file.empty()) {
    std::error_code ignored;
    auto absolute = std::filesystem::absolute(config.token_file, ignored);
    driver.push_back("--token-file=" +
                     (absolute.empty() ? config.token_file : absolute.string()));
  }
  // Where the program is among the arguments, so that the driver can ship
  // its folder to a node that lacks it.
  const char* kind = config.module ? "module" : config.no_python ? "binary" : "script";
  driver.push_back(std::string("--program-kind=") + kind);
  driver.push_back("--program-args=" + std::to_string(config.script_args.size()));
  driver.push_back("--");
  bool dropped = false;  // the first --ray is the launcher's (a value cannot be one)
  for (const std::string& arg : args) {
    if (!dropped && (arg == "--ray" || arg.rfind("--ray=", 0) == 0)) {
      dropped = true;
      continue;
    }
    driver.push_back(arg);
  }
  std::vector<char*> argv;
  for (std::string& arg : driver) argv.push_back(arg.data());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "meshrun: --ray: cannot run %s: %s\n", python.c_str(),
               std::strerror(errno));
  return 1;
}

int Main(int argc, char** argv) {
  // The agent's stack dump helper (agent/dump_helper.h): the agent's binary
  // run again, before anything else is set up.
  if (argc >= 2 && std::string_view(argv[1]) == agent::kDumpHelperFlag)
    return agent::RunDumpHelper(argc, argv);
  // Debian builds absl with debug deadlock detection on; its bookkeeping was
  // ~11% of the daemon's CPU in a 5,000-client barrier (bench/results).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::vector<std::string> args(argv + 1, argv + argc);
  // A subcommand, not a script: run a script named "status" as ./status.
  if (!args.empty() && args.front() == "status") {
    return RunStatusCommand({args.begin() + 1, args.end()});
  }
  auto parsed = ParseLaunchArgs(args, Environment());
  if (!parsed.ok()) {
    std::fprintf(stderr, "meshrun: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  LaunchConfig config = std::move(*parsed);
  if (!config.help_text.empty()) {
    std::fputs(config.help_text.c_str(), stdout);
    return 0;
  }
  if (config.version_requested) {
    std::printf("%s\n", rdzv::VersionLine("meshrun").c_str());
    return 0;
  }
  if (config.ray_address) return ExecRayDriver(args, config);
  RunExecutablesDirectly(config);

  auto log = spdlog::stderr_color_mt("meshrun");
  // One pattern for every logger (the agent's too, created later).
  spdlog::set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
  spdlog::set_default_logger(log);
  if (const char* level = getenv("MESHRUN_LOG_LEVEL"))
    spdlog::set_level(spdlog::level::from_str(level));
  for (const auto& notice : config.notices) log->warn("{}", notice);
  if (config.nproc_per_node > 1 && !getenv("OMP_NUM_THREADS")) {
    log->warn(
        "setting OMP_NUM_THREADS=1 for each worker to avoid overloading the node; "
        "set it yourself to tune");
  }

  // Token and TLS, for the agent's calls and for a daemon hosted here.
  auto client_security = rdzv::LoadClientSecurity(
      {config.token_file, config.tls_ca, config.tls_cert, config.tls_key}, getenv);
  if (!client_security.ok()) {
    std::fprintf(stderr, "meshrun: %s\n",
                 std::string(client_security.status().message()).c_str());
    return 2;
  }
  rdzv::ServerSecurity server_security;
  if (auto s = HostedDaemonSecurity(config, *client_security, &server_security);
      !s.ok()) {
    std::fprintf(stderr, "meshrun: %s\n", std::string(s.message()).c_str());
    return 2;
  }

  // gRPC aborts when it cannot make its descriptors, so check for them
  // before anything starts (a daemon hosted here takes more).
  // A list names daemon replicas, which run on their own: never hosted here.
  const bool replicas = !config.rdzv_endpoints.empty();
  const bool may_host =
      config.standalone || (!replicas && IsLocalAddress(config.rdzv_endpoint.host));
  if (auto s = agent::CheckDescriptors(
          agent::DescriptorsNeeded(config.nproc_per_node, may_host));
      !s.ok()) {
    std::fprintf(stderr, "meshrun: %s\n", std::string(s.message()).c_str());
    return agent::kResourceExitCode;
  }

  // Where the daemon is, and whether this agent serves it.
  std::unique_ptr<rdzv::Daemon> daemon;
  std::string endpoint;
  HostPort daemon_address;  // as this node's agent and workers reach it
  const HostPort& rdzv = config.rdzv_endpoint;
  if (config.standalone) {
    rdzv::DaemonOptions options;  // 127.0.0.1, kernel-assigned port
    options.security = server_security;
    // Stock TCPStore clients (the workers' env://) see this run's store.
    options.tcpstore_run = config.rdzv_id;
    if (options.security.tls() != client_security->tls()) {
      std::fprintf(stderr, "meshrun: %s\n", kHostTlsNeedsCert);
      return 2;
    }
    options.metrics_port = config.metrics_port;
    auto started = rdzv::Daemon::Start(options);
    if (!started.ok()) {
      log->error("cannot start the embedded rendezvous daemon: {}",
                 std::string(started.status().message()));
      return 1;
    }
    daemon = std::move(*started);
    endpoint = daemon->endpoint();
    daemon_address = {"127.0.0.1", daemon->port()};
  } else {
    endpoint = FormatEndpoint(rdzv.host, rdzv.port);
    for (size_t i = 1; i < config.rdzv_endpoints.size(); ++i) {
      absl::StrAppend(
          &endpoint, ",",
          FormatEndpoint(config.rdzv_endpoints[i].host, config.rdzv_endpoints[i].port));
    }
    daemon_address = rdzv;
    bool host_it =
        !replicas && config.rdzv_conf.is_host.value_or(IsLocalAddress(rdzv.host));
    if (config.rdzv_backend == RdzvBackend::kStatic && !config.rdzv_conf.is_host)
      host_it = config.node_rank == 0;
    // A daemon already serving there (another agent of this machine, or a
    // meshrun-rdzvd) is joined, not competed with.
    if (host_it && SomethingListens(rdzv.host, rdzv.port)) host_it = false;
    if (host_it) {
      rdzv::DaemonOptions options;
      options.host = IsLoopback(rdzv.host) ? "127.0.0.1" : "0.0.0.0";
      options.port = rdzv.port;
      options.security = server_security;
      // The static backend's daemon serves this one run (torchrun's run id
      // "none" unless given); a c10d one may serve other runs too, and picks
      // the only one with a formed round.
      if (config.rdzv_backend == RdzvBackend::kStatic)
        options.tcpstore_run = config.rdzv_id;
      if (options.security.tls() != client_security->tls()) {
        std::fprintf(stderr, "meshrun: %s\n", kHostTlsNeedsCert);
        return 2;
      }
      options.metrics_port = config.metrics_port;
      auto started = rdzv::Daemon::Start(options);
      if (started.ok()) {
        daemon = std::move(*started);
        if (rdzv.port == 0) {  // static, one node, --master-port=0
          daemon_address.port = daemon->port();
          endpoint = FormatEndpoint(rdzv.host, daemon->port());
        }
        log->info("hosting the rendezvous daemon on {}", endpoint);
      } else {
        // Another agent on this machine serves it already; be its client.
        log->info("rendezvous endpoint {} is served already; joining it", endpoint);
      }
    }
  }

  if (daemon && daemon->metrics_port() >= 0) {
    log->info("status page and metrics on http://{}/ (run {})",
              daemon->metrics_endpoint(), config.rdzv_id);
  } else if (config.metrics_port >= 0) {
    log->warn(
        "--metrics-port: this meshrun does not host the rendezvous daemon; ignored");
  }

  agent::AgentOptions options;
  options.run_id = config.rdzv_id;
  options.role = config.role;
  options.node_id = NodeId();
  bool loopback = IsLoopback(rdzv.host);
  for (const HostPort& replica : config.rdzv_endpoints)
    loopback = loopback && IsLoopback(replica.host);
  options.host = !config.local_addr.empty()      ? config.local_addr
                 : loopback || config.standalone ? "127.0.0.1"
                                                 : LocalHostName();
  options.nproc = config.nproc_per_node;
  if (config.restart_scope == RestartScope::kReplica)
    options.replica_size = config.replica_size;
  options.node_rank_hint = config.node_rank_given ? config.node_rank : -1;
  options.rdzv_endpoint = endpoint;
  // Workers' store (--worker-store): the agent's relay with c10d, which keeps
  // them working through daemon restarts and serves every run of a shared or
  // secured daemon; the daemon's port with static and --standalone, as
  // torchrun's MASTER_PORT, where that daemon serves this run.
  const bool daemon_store =
      config.worker_store == WorkerStore::kDaemon ||
      (config.worker_store == WorkerStore::kDefault &&
       (config.standalone || config.rdzv_backend == RdzvBackend::kStatic));
  if (daemon_store)
    options.daemon_store =
        agent::AgentOptions::StoreAddress{daemon_address.host, daemon_address.port};
  options.security = std::move(*client_security);
  options.worker_security_env = WorkerSecurityEnv(config);
  options.run_config = ToRunConfig(config);
  if (config.rdzv_backend == RdzvBackend::kStatic) {
    // A fixed node set: the round forms when every node is in.
    options.run_config.set_min_nodes(static_cast<uint32_t>(config.max_nodes));
  }
  options.worker_argv = config.worker_argv;
  if (!config.log_dir.empty()) options.log_dir = config.log_dir;
  auto streams = [](const StdStreamsSpec& spec, int* all, std::vector<int>* per_rank,
                    int nproc) {
    *all = static_cast<int>(spec.all_ranks);
    per_rank->clear();
    for (int local_rank = 0; local_rank < nproc; ++local_rank)
      per_rank->push_back(static_cast<int>(spec.ForLocalRank(local_rank)));
  };
  streams(config.redirects, &options.redirects_all, &options.redirects, options.nproc);
  streams(config.tee, &options.tee_all, &options.tee, options.nproc);
  options.prefix_template = config.log_line_prefix_template;
  options.local_ranks_filter = config.local_ranks_filter;
  options.shutdown_timeout = config.shutdown_timeout;
  options.reconnect_grace = config.reconnect_grace;
  options.hang_timeout = config.hang_timeout;
  options.health_checks = config.health_checks;
  options.health_check_timeout = config.health_check_timeout;
  options.signals_to_handle = config.signals_to_handle;
  options.signals_to_handle_text = config.signals_to_handle_text;
  options.virtual_local_rank = config.virtual_local_rank;
  options.duplicate_stdout_filters = config.duplicate_stdout_filters;
  options.duplicate_stderr_filters = config.duplicate_stderr_filters;

  int code = agent::RunAgent(options);
  if (daemon) daemon->Shutdown(std::chrono::seconds(2));
  // Which Python ran the workers: a script failing on `import torch` was
  // most often run by another interpreter than the user thought.
  if (code > 0 && code < 128 && !config.no_python)
    std::fprintf(stderr, "meshrun: the workers' Python was %s\n",
                 DescribePython(config).c_str());
  return code;
}

}  // namespace
}  // namespace meshrun::launcher

int main(int argc, char** argv) { return meshrun::launcher::Main(argc, argv); }
