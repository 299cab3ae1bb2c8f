#include "launcher/launch_config.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <optional>
#include <random>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "agent/health_check.h"
#include "launcher/flag_table.h"
#include "launcher/slurm_env.h"
#include "launcher/value_parsers.h"
#include "rendezvous/core/request_validation.h"

namespace meshrun::launcher {
namespace {

constexpr int kDefaultRdzvPort = 29400;

// torchrun uses $PYTHON_EXEC, else its own interpreter (sys.executable: the
// venv's python that torchrun was installed with). Ours: $PYTHON_EXEC, else
// the python3 of the venv meshrun was pip-installed into (so that a venv's
// meshrun run by its path, unactivated, runs that venv's torch), else
// python3 from PATH, resolved by the spawner.
void ChoosePython(const std::map<std::string, std::string>& env, const HostProbe& host,
                  LaunchConfig* config) {
  if (auto it = env.find("PYTHON_EXEC"); it != env.end() && !it->second.empty()) {
    config->python = it->second;
    config->python_source = "$PYTHON_EXEC";
  } else if (std::string venv = host.venv_python ? host.venv_python() : "";
             !venv.empty()) {
    config->python = venv;
    config->python_source = "meshrun's virtualenv";
  } else {
    config->python = "python3";
    config->python_source = "PATH";
  }
}

// --nnodes, the rendezvous flags, --node-rank and --master-*: --standalone
// first, as it decides which of the others are read at all.
absl::Status ParseRendezvousFlags(const FlagValues& flags, const HostProbe& host,
                                  LaunchConfig* config) {
  config->standalone = flags.Switch(kStandalone);
  // torchrun 2's rule: the static backend (its default) on one node with
  // neither --rdzv-endpoint nor --master-port turns into c10d on localhost:0
  // with a fresh run id, that is --standalone in all but name.
  bool implied_standalone = false;
  if (!config->standalone && flags.GetOr(kRdzvBackend).text == "static" &&
      absl::StripAsciiWhitespace(flags.GetOr(kRdzvEndpoint).text).empty() &&
      !flags.Get(kMasterPort)) {
    std::optional<std::pair<int, int>> range = ParseNnodes(flags.GetOr(kNnodes).text);
    implied_standalone = range.has_value() && range->second == 1;
  }
  if (config->standalone || implied_standalone) {
    std::vector<std::string> ignored;
    // Values standalone would pick anyway are not worth a notice: torch's own
    // docs write `--standalone --nnodes=1`.
    const std::map<FlagId, std::set<std::string>> kHarmless = {
        {kNnodes, {"1", "1:1"}},
        {kRdzvBackend, {"c10d", "meshrun", "dynamic"}},
        {kNodeRank, {"0"}},
    };
    for (FlagId id : {kNnodes, kRdzvBackend, kRdzvEndpoint, kRdzvId, kNodeRank}) {
      std::optional<Given> given = flags.Get(id);
      auto harmless = kHarmless.find(id);
      if (!given || given->text.empty() ||
          (harmless != kHarmless.end() && harmless->second.count(given->text))) {
        continue;
      }
      // Implied, the backend is static and --nnodes says one node.
      if (implied_standalone && (id == kRdzvBackend || id == kNnodes)) continue;
      absl::StrAppend(&ignored.emplace_back(), kFlags[id].name, "=", given->text);
    }
    config->standalone = true;
    config->rdzv_backend = RdzvBackend::kDynamic;
    config->rdzv_endpoint = HostPort{"localhost", 0};
    config->rdzv_id = host.new_run_id();
    if (!ignored.empty()) {
      config->notices.push_back(absl::StrCat(
          implied_standalone ? "one node with neither --rdzv-endpoint nor --master-port "
                               "(torchrun's rule): ignoring "
                             : "--standalone: ignoring ",
          absl::StrJoin(ignored, " "), " (one node, rendezvous on localhost:0, run id ",
          config->rdzv_id, ")"));
    }
  } else {
    Given nnodes = flags.GetOr(kNnodes);
    std::optional<std::pair<int, int>> range = ParseNnodes(nnodes.text);
    if (!range) return FlagError(kNnodes, nnodes, Got("N or MIN:MAX", nnodes.text));
    std::tie(config->min_nodes, config->max_nodes) = *range;

    Given backend = flags.GetOr(kRdzvBackend);
    if (backend.text == "c10d" || backend.text == "meshrun" ||
        backend.text == "dynamic") {
      config->rdzv_backend = RdzvBackend::kDynamic;
    } else if (backend.text == "static") {
      config->rdzv_backend = RdzvBackend::kStatic;
    } else if (backend.text == "etcd" || backend.text == "etcd-v2") {
      return FlagError(kRdzvBackend, backend,
                       absl::StrCat(backend.text,
                                    " is not supported: meshrun's rendezvous daemon "
                                    "replaces etcd (--rdzv-backend=c10d "
                                    "--rdzv-endpoint=HOST:PORT of a meshrun-rdzvd or "
                                    "of node 0)"));
    } else {
      return FlagError(kRdzvBackend, backend,
                       Got("one of static, c10d, meshrun, dynamic", backend.text));
    }

    Given id = flags.GetOr(kRdzvId);
    if (id.text.empty()) return FlagError(kRdzvId, id, "must not be empty");
    // The daemon's own rule, so a run id it would refuse at join time (exit
    // 1, or no message at all) is refused here, with the flag's exit code.
    if (absl::Status invalid =
            rdzv::ValidateId(kFlags[kRdzvId].name, id.text, rdzv::RequestLimits{});
        !invalid.ok()) {
      absl::string_view what = invalid.message();
      absl::ConsumePrefix(&what, absl::StrCat(kFlags[kRdzvId].name, ": "));
      return FlagError(kRdzvId, id, what);
    }
    config->rdzv_id = id.text;

    if (std::optional<Given> rank = flags.Get(kNodeRank)) {
      std::optional<int> parsed = ParseInt(rank->text);
      if (!parsed || *parsed < 0) {
        return FlagError(kNodeRank, *rank, Got("a non-negative integer", rank->text));
      }
      if (*parsed >= config->max_nodes) {
        return FlagError(kNodeRank, *rank,
                         absl::StrCat("must be below the maximum node count ",
                                      config->max_nodes, ", got ", *parsed));
      }
      config->node_rank = *parsed;
      config->node_rank_given = true;
    }
  }

  Given master_addr = flags.GetOr(kMasterAddr);
  absl::string_view bare_addr = master_addr.text;
  bool bracketed =
      absl::ConsumePrefix(&bare_addr, "[") && absl::ConsumeSuffix(&bare_addr, "]");
  if (!ValidHost(bare_addr, bracketed)) {
    return FlagError(kMasterAddr, master_addr,
                     Got("a host name or address, IPv6 as [ADDR]", master_addr.text));
  }
  config->master_addr = master_addr.text;
  Given master_port = flags.GetOr(kMasterPort);
  std::optional<int> parsed_master_port = ParsePort(master_port.text);
  if (!parsed_master_port) {
    return FlagError(kMasterPort, master_port,
                     Got("a port in 0..65535", master_port.text));
  }
  config->master_port = *parsed_master_port;

  if (!config->standalone) {
    std::optional<Given> endpoint = flags.Get(kRdzvEndpoint);
    if (endpoint && !absl::StripAsciiWhitespace(endpoint->text).empty()) {
      auto list =
          ParseEndpointList(absl::StripAsciiWhitespace(endpoint->text), kDefaultRdzvPort);
      if (!list.ok()) {
        return FlagError(kRdzvEndpoint, *endpoint, list.status().message());
      }
      // Replicas elect a serving daemon among themselves; the static
      // backend's daemon is node 0's, one address.
      if (config->rdzv_backend == RdzvBackend::kStatic && list->size() > 1) {
        return FlagError(kRdzvEndpoint, *endpoint,
                         absl::StrCat("a list of daemon replicas needs "
                                      "--rdzv-backend=c10d (the static backend's "
                                      "daemon is node 0's), got '",
                                      endpoint->text, "'"));
      }
      for (const auto& [host_name, port] : *list) {
        if (config->rdzv_backend == RdzvBackend::kStatic && !port.has_value()) {
          return FlagError(
              kRdzvEndpoint, *endpoint,
              Got("HOST:PORT (the static backend needs a port)", endpoint->text));
        }
        // Port 0 only makes sense for a daemon nobody else has to find.
        if (port == 0) {
          return FlagError(
              kRdzvEndpoint, *endpoint,
              absl::StrCat("port 0 cannot be reached by the agents "
                           "(--standalone runs a daemon on a free port), got '",
                           endpoint->text, "'"));
        }
        HostPort parsed{host_name, port.value_or(kDefaultRdzvPort)};
        if (list->size() > 1) config->rdzv_endpoints.push_back(parsed);
      }
      config->rdzv_endpoint =
          HostPort{list->front().first, list->front().second.value_or(kDefaultRdzvPort)};
      config->rdzv_endpoint_given = true;
    } else if (config->rdzv_backend == RdzvBackend::kStatic) {
      config->rdzv_endpoint = HostPort{std::string(bare_addr), config->master_port};
    }
  }

  if (config->rdzv_backend == RdzvBackend::kStatic) {
    // torch's static rendezvous silently uses MAX as the world size and rank 0
    // for every node that forgot --node-rank; both end in a hang, so say so.
    if (config->min_nodes != config->max_nodes) {
      return FlagError(kNnodes, flags.GetOr(kNnodes),
                       absl::StrCat("the static backend needs a fixed node count, got '",
                                    flags.GetOr(kNnodes).text, "'"));
    }
    if (!config->node_rank_given) {
      if (config->max_nodes > 1) {
        return FlagError(kNodeRank,
                         "required with the static backend (torchrun's default) when "
                         "--nnodes is above 1; --rdzv-backend=c10d assigns node ranks "
                         "at the rendezvous");
      }
      config->node_rank = 0;
    }
  } else if (implied_standalone && flags.Get(kMasterAddr)) {
    config->notices.emplace_back(
        "--master-addr: unused on one node without --master-port (torchrun's rule: "
        "the rendezvous runs on localhost:0)");
  } else if (flags.Get(kMasterAddr) || flags.Get(kMasterPort)) {
    config->notices.emplace_back(
        "--master-addr/--master-port: only used by --rdzv-backend=static; the dynamic "
        "backend picks a free port on node 0 and publishes it");
  }

  Given conf = flags.GetOr(kRdzvConf);
  absl::StatusOr<RdzvConf> rdzv_conf = ParseRdzvConf(conf.text);
  if (!rdzv_conf.ok()) return FlagError(kRdzvConf, conf, rdzv_conf.status().message());
  config->rdzv_conf = *rdzv_conf;
  if (!config->rdzv_endpoints.empty() && config->rdzv_conf.is_host.value_or(false)) {
    return FlagError(kRdzvConf, conf,
                     "is_host: a launcher given a list of daemon replicas "
                     "(--rdzv-endpoint=A,B,...) never hosts the daemon; run "
                     "meshrun-rdzvd replicas");
  }

  return absl::OkStatus();
}

// Sizes, restarts, timeouts, logging and signals.
absl::Status ParseWorkerFlags(const FlagValues& flags,
                              const std::map<std::string, std::string>& env,
                              const HostProbe& host, LaunchConfig* config) {
  Given nproc = flags.GetOr(kNprocPerNode);
  config->nproc_per_node_spec = nproc.text;
  if (nproc.text == "cpu") {
    config->nproc_per_node = host.cpu_count();
  } else if (nproc.text == "gpu") {
    config->nproc_per_node = host.gpu_count();
    if (config->nproc_per_node <= 0) {
      return FlagError(kNprocPerNode, nproc, "'gpu' but no GPU found");
    }
  } else if (nproc.text == "xpu") {
    return FlagError(kNprocPerNode, nproc,
                     "'xpu': meshrun counts NVIDIA GPUs only (gpu, auto); give the "
                     "number of workers");
  } else if (nproc.text == "auto") {
    int gpus = host.gpu_count();
    config->nproc_per_node = gpus > 0 ? gpus : host.cpu_count();
  } else {
    std::optional<int> count = ParseInt(nproc.text);
    if (!count || *count < 1) {
      return FlagError(kNprocPerNode, nproc,
                       Got("a positive integer, cpu, gpu or auto", nproc.text));
    }
    config->nproc_per_node = *count;
  }
  config->nproc_per_node = std::max(config->nproc_per_node, 1);

  Given restarts = flags.GetOr(kMaxRestarts);
  std::optional<int> max_restarts = ParseInt(restarts.text);
  if (!max_restarts || *max_restarts < 0) {
    return FlagError(kMaxRestarts, restarts,
                     Got("a non-negative integer", restarts.text));
  }
  config->max_restarts = *max_restarts;

  Given scope = flags.GetOr(kRestartScope);
  if (scope.text == "job") {
    config->restart_scope = RestartScope::kJob;
  } else if (scope.text == "replica") {
    config->restart_scope = RestartScope::kReplica;
  } else {
    return FlagError(kRestartScope, scope, Got("job or replica", scope.text));
  }
  Given worker_store = flags.GetOr(kWorkerStore);
  if (worker_store.text == "agent") {
    config->worker_store = WorkerStore::kAgent;
  } else if (worker_store.text == "daemon") {
    config->worker_store = WorkerStore::kDaemon;
  } else if (!worker_store.text.empty()) {
    return FlagError(kWorkerStore, worker_store,
                     Got("agent or daemon", worker_store.text));
  }
  Given replica_size = flags.GetOr(kReplicaSize);
  std::optional<int> size = ParseInt(replica_size.text);
  if (!size || *size < 1) {
    return FlagError(kReplicaSize, replica_size,
                     Got("a positive integer", replica_size.text));
  }
  // A size that silently does nothing would hide a forgotten scope.
  if (config->restart_scope == RestartScope::kJob && flags.Get(kReplicaSize)) {
    return FlagError(kReplicaSize, replica_size,
                     "needs --restart-scope=replica (the default scope, job, restarts "
                     "every worker)");
  }
  if (config->restart_scope == RestartScope::kReplica &&
      config->nproc_per_node % *size != 0) {
    return FlagError(
        kReplicaSize, replica_size,
        absl::StrCat(*size, " does not divide --nproc-per-node=", config->nproc_per_node,
                     ": a replica group lives within one node, so each "
                     "node runs whole replica groups"));
  }
  config->replica_size = *size;

  for (auto [id, field] : {std::pair{kMonitorInterval, &config->monitor_interval},
                           std::pair{kShutdownTimeout, &config->shutdown_timeout}}) {
    Given given = flags.GetOr(id);
    // torchrun 2 takes an unset --shutdown-timeout from this variable.
    if (id == kShutdownTimeout && !flags.Get(id)) {
      auto it = env.find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
      if (it != env.end() && !it->second.empty()) {
        given = Given{it->second, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"};
      }
    }
    std::optional<std::chrono::milliseconds> seconds = ParseSeconds(given.text);
    if (!seconds) {
      return FlagError(id, given, Got("a non-negative number of seconds", given.text));
    }
    *field = *seconds;
  }

  if (Given grace = flags.GetOr(kRdzvReconnectGrace); !grace.text.empty()) {
    std::optional<std::chrono::milliseconds> seconds = ParseSeconds(grace.text);
    if (!seconds || seconds->count() == 0) {
      return FlagError(kRdzvReconnectGrace, grace,
                       Got("a positive number of seconds", grace.text));
    }
    config->reconnect_grace = *seconds;
  }

  {
    Given hang = flags.GetOr(kHangTimeout);
    std::optional<std::chrono::milliseconds> seconds = ParseSeconds(hang.text);
    if (!seconds) {
      return FlagError(kHangTimeout, hang,
                       Got("a non-negative number of seconds", hang.text));
    }
    config->hang_timeout = *seconds;
  }

  if (std::optional<Given> checks = flags.Get(kHealthCheck)) {
    // Repeated flags arrive joined by newlines (CliApp).
    for (absl::string_view check :
         absl::StrSplit(checks->text, '\n', absl::SkipWhitespace()))
      config->health_checks.emplace_back(check);
  }
  if (std::optional<Given> dir = flags.Get(kHealthCheckDir); dir && !dir->text.empty()) {
    absl::StatusOr<std::vector<std::string>> checks = agent::HealthChecksIn(dir->text);
    if (!checks.ok()) return FlagError(kHealthCheckDir, *dir, checks.status().message());
    config->health_checks.insert(config->health_checks.end(), checks->begin(),
                                 checks->end());
  }
  {
    Given timeout = flags.GetOr(kHealthCheckTimeout);
    std::optional<std::chrono::milliseconds> seconds = ParseSeconds(timeout.text);
    if (!seconds || *seconds < std::chrono::seconds(1)) {
      return FlagError(kHealthCheckTimeout, timeout,
                       Got("a number of seconds, at least 1", timeout.text));
    }
    config->health_check_timeout =
        std::chrono::duration_cast<std::chrono::seconds>(*seconds);
  }

  Given start_method = flags.GetOr(kStartMethod);
  if (start_method.text != "spawn" && start_method.text != "fork" &&
      start_method.text != "forkserver") {
    return FlagError(kStartMethod, start_method,
                     Got("one of spawn, fork, forkserver", start_method.text));
  }
  if (start_method.text != "spawn") {
    config->notices.push_back(
        absl::StrCat("--start-method=", start_method.text,
                     ": ignored; workers are always fresh processes"));
  }

  Given role = flags.GetOr(kRole);
  if (role.text.empty()) return FlagError(kRole, role, "must not be empty");
  config->role = role.text;

  config->log_dir = flags.GetOr(kLogDir).text;
  config->local_addr = flags.GetOr(kLocalAddr).text;
  config->token_file = flags.GetOr(kTokenFile).text;
  config->tls_ca = flags.GetOr(kTlsCa).text;
  config->tls_cert = flags.GetOr(kTlsCert).text;
  config->tls_key = flags.GetOr(kTlsKey).text;
  config->tls_client_ca = flags.GetOr(kTlsClientCa).text;

  for (auto [id, field] :
       {std::pair{kRedirects, &config->redirects}, std::pair{kTee, &config->tee}}) {
    Given given = flags.GetOr(id);
    std::optional<StdStreamsSpec> spec = ParseStdStreams(given.text);
    if (!spec) {
      return FlagError(
          id, given,
          Got("0-3 or LOCAL_RANK:0-3,... (0 none, 1 stdout, 2 stderr, 3 both)",
              given.text));
    }
    *field = *spec;
  }

  Given filter = flags.GetOr(kLocalRanksFilter);
  std::optional<std::set<int>> ranks = ParseLocalRanks(filter.text);
  if (!ranks) {
    return FlagError(
        kLocalRanksFilter, filter,
        Got("a comma-separated list of local ranks like 0,1,2", filter.text));
  }
  config->local_ranks_filter = *ranks;
  if (!ranks->empty()) {
    const int nproc = config->nproc_per_node;
    const std::string range = absl::StrCat(
        "0..", nproc - 1, " with --nproc-per-node=", config->nproc_per_node_spec);
    std::vector<int> missing;
    for (int rank : *ranks)
      if (rank >= nproc) missing.push_back(rank);
    // Every line of output would be hidden. A count given as a number is
    // the same on every node: refuse. One that depends on the machine
    // (cpu, gpu, auto) may be larger elsewhere: warn.
    if (missing.size() == ranks->size()) {
      if (ParseInt(config->nproc_per_node_spec)) {
        return FlagError(kLocalRanksFilter, filter,
                         absl::StrCat("names no local rank of this node (", range,
                                      "), got '", filter.text, "'"));
      }
      config->notices.push_back(
          absl::StrCat("--local-ranks-filter: names no local rank of this node (", range,
                       " here); no worker output will reach the console"));
    } else if (!missing.empty()) {
      config->notices.push_back(
          absl::StrCat("--local-ranks-filter: local rank",
                       missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ","),
                       missing.size() > 1 ? " do" : " does", " not exist (", range, ")"));
    }
  }

  // torchrun's comma_separated_list: ",," is a literal comma.
  for (auto [id, field] :
       {std::pair{kDuplicateStdoutFilters, &config->duplicate_stdout_filters},
        std::pair{kDuplicateStderrFilters, &config->duplicate_stderr_filters}}) {
    std::optional<Given> given = flags.Get(id);
    if (!given) continue;
    std::vector<std::string> needles;
    for (absl::string_view item :
         absl::StrSplit(absl::StrReplaceAll(given->text, {{",,", "\x01"}}), ',')) {
      needles.push_back(absl::StrReplaceAll(item, {{"\x01", ","}}));
    }
    *field = std::move(needles);
  }

  Given signals = flags.GetOr(kSignalsToHandle);
  absl::StatusOr<std::vector<int>> signal_numbers = ParseSignals(signals.text);
  if (!signal_numbers.ok()) {
    return FlagError(kSignalsToHandle, signals, signal_numbers.status().message());
  }
  config->signals_to_handle = *signal_numbers;
  config->signals_to_handle_text = signals.text;

  config->virtual_local_rank = flags.Switch(kVirtualLocalRank);
  if (config->virtual_local_rank) {
    // Each worker gets one entry of the parent's device list (HIP's where
    // set, as torchrun); torchrun fails the worker at start when there are
    // too few, the count is known here already.
    auto visible = env.find("HIP_VISIBLE_DEVICES");
    if (visible == env.end() || visible->second.empty()) {
      visible = env.find("CUDA_VISIBLE_DEVICES");
    }
    if (visible != env.end()) {
      const int devices = static_cast<int>(
          std::vector<absl::string_view>(absl::StrSplit(visible->second, ',')).size());
      if (config->nproc_per_node > devices) {
        return FlagError(
            kVirtualLocalRank,
            absl::StrCat("local rank ", devices, " has no GPU in ", visible->first, "=",
                         visible->second,
                         " (--nproc-per-node=", config->nproc_per_node_spec, ")"));
      }
    }
  }

  // torch 2.x reads the template from TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE;
  // honour it below the flag and PET_*, so torch-era job scripts keep working.
  Given prefix = flags.GetOr(kLogLinePrefixTemplate);
  if (!flags.Get(kLogLinePrefixTemplate)) {
    auto it = env.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    if (it != env.end() && !it->second.empty()) {
      prefix = Given{it->second, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"};
    }
  }
  if (absl::Status status = ValidatePrefixTemplate(prefix.text); !status.ok()) {
    return FlagError(kLogLinePrefixTemplate, prefix, status.message());
  }
  config->log_line_prefix_template = prefix.text;

  return absl::OkStatus();
}

// torchrun flags meshrun does not carry out: one line each saying what
// meshrun does instead. Checked before anything else, as torchrun acts on
// --print-completion before it looks for a script.
absl::Status RefuseUnsupportedFlags(const FlagValues& flags) {
  if (std::optional<Given> given = flags.Get(kPrintCompletion)) {
    return FlagError(kPrintCompletion, *given,
                     "meshrun prints no shell completion script; meshrun --help lists "
                     "every flag");
  }
  if (std::optional<Given> given = flags.Get(kLogsSpecs)) {
    return FlagError(kLogsSpecs, *given,
                     "meshrun loads no Python LogsSpecs plugins; it lays out logs as "
                     "torchrun's default does (--log-dir, -r, -t)");
  }
  if (std::optional<Given> given = flags.Get(kNumaBinding)) {
    return FlagError(kNumaBinding, *given,
                     "meshrun binds no worker to CPUs or NUMA nodes; run the workers "
                     "under numactl or taskset (--no-python numactl ... python3 -u "
                     "SCRIPT)");
  }
  if (Given handler = flags.GetOr(kEventLogHandler); handler.text != "null") {
    return FlagError(kEventLogHandler, handler,
                     absl::StrCat("meshrun records no torchelastic events, so only "
                                  "'null' is accepted; the daemon's status page and "
                                  "metrics (--metrics-port) report the run, got '",
                                  handler.text, "'"));
  }
  return absl::OkStatus();
}

// The worker command, as torchrun's config_from_args builds it.
absl::Status BuildWorkerCommand(const FlagValues& flags,
                                const std::map<std::string, std::string>& env,
                                const HostProbe& host, LaunchConfig* config) {
  config->module = flags.Switch(kModule);
  config->no_python = flags.Switch(kNoPython);
  config->run_path = flags.Switch(kRunPath);
  ChoosePython(env, host, config);
  const std::string& python = config->python;
  if (config->run_path) {
    // torchrun: --run-path wins over --no-python and drops -m.
    std::vector<std::string> dropped;
    if (config->no_python) dropped.emplace_back("--no-python");
    if (config->module) dropped.emplace_back("-m");
    config->notices.push_back(absl::StrCat(
        "--run-path: meshrun has no in-process interpreter; running ", python, " -u ",
        config->script, dropped.empty() ? "" : " and ignoring ",
        absl::StrJoin(dropped, " and ")));
    config->worker_argv = {python, "-u", config->script};
  } else if (config->no_python) {
    if (config->module) {
      return FlagError(kNoPython, "cannot be combined with -m/--module");
    }
    config->worker_argv = {config->script};
  } else {
    config->worker_argv = {python, "-u"};
    if (config->module) config->worker_argv.emplace_back("-m");
    config->worker_argv.push_back(config->script);
  }
  config->worker_argv.insert(config->worker_argv.end(), config->script_args.begin(),
                             config->script_args.end());
  return absl::OkStatus();
}

// --slurm: SLURM's view of the step becomes the fallback of the flags it
// defines; what the command line or PET_* says still wins.
absl::Status ApplySlurmEnvironment(const std::map<std::string, std::string>& env,
                                   FlagValues* flags, LaunchConfig* config) {
  if (flags->Switch(kStandalone)) {
    return FlagError(kSlurm, "cannot be combined with --standalone");
  }
  absl::StatusOr<SlurmFlags> slurm = SlurmFlagsFromEnv(env);
  if (!slurm.ok()) return slurm.status();
  std::vector<std::string> derived;
  auto fallback = [&](FlagId id, const SlurmValue& value) {
    if (flags->GetExplicit(id)) return;
    flags->SetFallback(id, Given{value.text, value.origin});
    derived.push_back(absl::StrCat(kFlags[id].name, "=", value.text));
  };
  fallback(kNnodes, slurm->nnodes);
  fallback(kNodeRank, slurm->node_rank);
  fallback(kRdzvId, slurm->rdzv_id);
  fallback(kRdzvEndpoint, slurm->rdzv_endpoint);
  // The derived endpoint is meant for meshrun's elastic daemon (an allocation
  // may grow and shrink), not torchrun's default static backend.
  if (!flags->GetExplicit(kRdzvBackend)) {
    flags->SetFallback(kRdzvBackend, Given{"c10d", ""});
  }
  if (slurm->nproc_per_node) fallback(kNprocPerNode, *slurm->nproc_per_node);
  // SLURM's early-warning signal (--signal=USR1@N) must reach the workers
  // rather than kill the launcher.
  if (!flags->GetExplicit(kSignalsToHandle)) {
    flags->SetFallback(kSignalsToHandle,
                       Given{"SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2", ""});
  }
  config->notices.push_back(absl::StrCat(
      "--slurm: ",
      derived.empty() ? "nothing taken from SLURM" : absl::StrJoin(derived, " "),
      derived.empty() ? "" : " (from SLURM's environment)"));
  return absl::OkStatus();
}

// --ray: the Ray driver (python/meshrun/ray_launch.py) starts the daemon and
// gives each node's agent its endpoint; the flags that would name another
// rendezvous are refused, and the rest validates as a c10d launch.
absl::Status ApplyRay(const Given& ray, const std::map<std::string, std::string>& env,
                      FlagValues* flags, LaunchConfig* config) {
  for (FlagId other : {kSlurm, kStandalone}) {
    if (flags->Switch(other))
      return FlagError(kRay,
                       absl::StrCat("cannot be combined with ", kFlags[other].name));
  }
  for (FlagId other : {kRdzvEndpoint, kNodeRank, kMasterAddr, kMasterPort}) {
    if (flags->GetExplicit(other)) {
      return FlagError(kRay, absl::StrCat("cannot be combined with ", kFlags[other].name,
                                          ": Ray places the nodes and meshrun starts the "
                                          "rendezvous daemon itself"));
    }
  }
  if (std::optional<Given> backend = flags->GetExplicit(kRdzvBackend);
      backend && backend->text != "c10d") {
    return FlagError(kRay, "runs the c10d rendezvous; --rdzv-backend=" + backend->text +
                               " cannot be used with it");
  }
  flags->SetFallback(kRdzvBackend, Given{"c10d", ""});
  flags->SetFallback(kRdzvEndpoint, Given{"127.0.0.1:29400", ""});  // the driver's, later
  auto from_env = env.find("RAY_ADDRESS");
  config->ray_address = !ray.text.empty() ? ray.text
                        : from_env != env.end() && !from_env->second.empty()
                            ? from_env->second
                            : "auto";
  config->ray_rdzv_id_given = flags->GetExplicit(kRdzvId).has_value();
  return absl::OkStatus();
}

}  // namespace

StdStreams StdStreamsSpec::ForLocalRank(int local_rank) const {
  auto it = by_local_rank.find(local_rank);
  return it != by_local_rank.end() ? it->second : all_ranks;
}

HostProbe SystemHostProbe() {
  HostProbe probe;
  probe.cpu_count = [] {
    // os.cpu_count(): online CPUs, ignoring affinity, like torchrun.
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online > 0) return static_cast<int>(online);
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  };
  probe.gpu_count = [] {
    // NVIDIA's driver creates /dev/nvidiaN per GPU; no CUDA runtime needed,
    // and no CUDA_VISIBLE_DEVICES interpretation (the workers' business).
    int count = 0;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/dev", ec)) {
      std::string name = entry.path().filename().string();
      if (name.size() > 6 && absl::StartsWith(name, "nvidia") &&
          std::all_of(name.begin() + 6, name.end(), [](char c) {
            return std::isdigit(static_cast<unsigned char>(c));
          })) {
        ++count;
      }
    }
    return count;
  };
  probe.new_run_id = [] {
    // A UUIDv4, the form torchrun's --standalone uses.
    std::random_device device;
    std::array<uint8_t, 16> bytes;
    for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(device());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    std::string id;
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (i == 4 || i == 6 || i == 8 || i == 10) id += '-';
      absl::StrAppend(&id, absl::Hex(bytes[i], absl::kZeroPad2));
    }
    return id;
  };
  probe.venv_python = [] {
    // bin/meshrun beside bin/python3, under a folder that pyvenv.cfg (venv)
    // or conda-meta/ (conda) marks as an environment: not /usr/bin/meshrun
    // beside /usr/bin/python3, where PATH's python3 (maybe an activated
    // venv's) is the user's choice.
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return std::string();
    const std::filesystem::path bin = exe.parent_path();
    const std::filesystem::path python = bin / "python3";
    const std::filesystem::path env = bin.parent_path();
    if (access(python.c_str(), X_OK) != 0) return std::string();
    if (!std::filesystem::exists(env / "pyvenv.cfg", ec) &&
        !std::filesystem::is_directory(env / "conda-meta", ec))
      return std::string();
    return python.string();
  };
  return probe;
}

absl::StatusOr<LaunchConfig> ParseLaunchArgs(
    const std::vector<std::string>& args, const std::map<std::string, std::string>& env) {
  return ParseLaunchArgs(args, env, SystemHostProbe());
}

absl::StatusOr<LaunchConfig> ParseLaunchArgs(
    const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
    const HostProbe& host) {
  absl::StatusOr<SplitArgs> split = SplitCommandLine(args);
  if (!split.ok()) return split.status();

  CliApp cli;
  LaunchConfig config;
  if (split->help) {
    config.help_text = cli.app.help();
    return config;
  }
  if (split->version) {
    config.version_requested = true;
    return config;
  }
  try {
    // CLI11 wants the arguments reversed.
    cli.app.parse(
        std::vector<std::string>(split->flag_tokens.rbegin(), split->flag_tokens.rend()));
  } catch (const CLI::ParseError& e) {
    // Unreachable with normalised tokens, but a user still gets one line.
    return absl::InvalidArgumentError(e.what());
  }
  std::array<bool, kNumFlags> on_cli{};
  for (int id = 0; id < kNumFlags; ++id) on_cli[id] = cli.options[id]->count() > 0;
  FlagValues flags(cli.values, on_cli, env);
  if (absl::Status refused = RefuseUnsupportedFlags(flags); !refused.ok()) {
    return refused;
  }

  if (!split->script.has_value()) {
    return absl::InvalidArgumentError("missing training script (see meshrun --help)");
  }
  config.script = *split->script;
  config.script_args = split->script_args;

  if (std::optional<Given> ray = flags.GetExplicit(kRay)) {
    absl::Status status = ApplyRay(*ray, env, &flags, &config);
    if (!status.ok()) return status;
  }
  config.slurm = flags.Switch(kSlurm);
  if (config.slurm) {
    absl::Status status = ApplySlurmEnvironment(env, &flags, &config);
    if (!status.ok()) return status;
  }
  absl::Status status = ParseRendezvousFlags(flags, host, &config);
  if (status.ok() && config.slurm && !flags.GetExplicit(kRdzvEndpoint) &&
      !config.rdzv_conf.is_host.has_value()) {
    // The derived endpoint is the first node, which serves it; another
    // agent on the same machine (virtual nodes, shared nodes) must not.
    config.rdzv_conf.is_host = config.node_rank == 0;
  }
  if (status.ok()) {
    if (std::optional<Given> port = flags.Get(kMetricsPort)) {
      std::optional<int> parsed = ParsePort(port->text);
      if (!parsed)
        return FlagError(kMetricsPort, *port, Got("a port in 0..65535", port->text));
      config.metrics_port = *parsed;
    }
  }
  if (status.ok()) status = ParseWorkerFlags(flags, env, host, &config);
  if (status.ok() && !config.rdzv_endpoints.empty() &&
      config.worker_store == WorkerStore::kDaemon) {
    // torch's TCPStore client knows one address and never reconnects.
    return FlagError(kWorkerStore, flags.GetOr(kWorkerStore),
                     "daemon: workers' TCPStore clients cannot follow a list of "
                     "daemon replicas (--rdzv-endpoint=A,B,...); the default, agent, "
                     "does");
  }
  if (status.ok()) status = BuildWorkerCommand(flags, env, host, &config);
  if (!status.ok()) return status;
  return config;
}

}  // namespace meshrun::launcher
