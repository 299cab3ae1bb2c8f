#include "launcher/flag_table.h"

#include <algorithm>
#include <cctype>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace meshrun::launcher {

namespace {

// --- The flag table -----------------------------------------------------------
// One row per flag; the CLI11 app, the argument splitter, the underscore
// spelling and the PET_* name are all derived from it, so they cannot drift.

constexpr FlagDef kFlagRows[] = {
    {"--nnodes", "", true, "N|MIN:MAX", "1:1",
     "Number of nodes, or the range MIN:MAX of an elastic job."},
    {"--nproc-per-node", "", true, "INT|cpu|gpu|auto", "1",
     "Workers per node: a number, the CPU count, the GPU count, or GPUs if any "
     "else CPUs."},
    {"--rdzv-backend", "", true, "BACKEND", "static",
     "static (torchrun's default): fixed nodes, each with its --node-rank, "
     "rendezvous at --rdzv-endpoint or else --master-addr:--master-port; c10d, "
     "meshrun or dynamic: meshrun's elastic rendezvous daemon. As with torchrun, "
     "static on one node with neither endpoint nor --master-port is --standalone."},
    {"--rdzv-endpoint", "", true, "HOST[:PORT][,...]", "",
     "Rendezvous daemon address (c10d: default localhost:29400; static: PORT "
     "required); IPv6 as [ADDR]:PORT. c10d: a comma-separated list names daemon "
     "replicas, of which whichever serves is used and followed when another takes "
     "over; with a list, meshrun never hosts the daemon itself."},
    {"--rdzv-id", "", true, "ID", "none", "Run id shared by every node of the job."},
    {"--rdzv-conf", "", true, "K=V,...", "",
     "Rendezvous settings in seconds: join_timeout (alias timeout), "
     "last_call_timeout, close_timeout, keep_alive_interval, read_timeout; "
     "keep_alive_max_attempt; is_host; torch's store_type=tcp and "
     "cas_backoff_max_seconds are accepted with no effect."},
    {"--standalone", "", false, "", "",
     "Single node with its own rendezvous daemon on a free port; overrides the "
     "rendezvous flags and --nnodes."},
    {"--max-restarts", "", true, "INT", "0",
     "Restarts of the worker group before the job fails."},
    {"--restart-scope", "", true, "job|replica", "job",
     "What a worker failure restarts: job (torchrun's way) stops and restarts every "
     "worker on every node; replica restarts only the failed worker's replica group "
     "(--replica-size), the others keep running. Each restart counts against "
     "--max-restarts."},
    {"--replica-size", "", true, "INT", "1",
     "With --restart-scope=replica: workers per replica group; global ranks "
     "[r*N, (r+1)*N) form group r, which must lie within one node "
     "(--nproc-per-node a multiple of N)."},
    {"--worker-store", "", true, "agent|daemon", "",
     "Where workers' MASTER_ADDR:MASTER_PORT (their TCPStore) points. agent: this "
     "node's agent, which relays to the daemon with its token and TLS and through "
     "daemon restarts (the default with c10d). daemon: the daemon's own port, where "
     "it serves this run to stock clients (the default with static and "
     "--standalone, as torchrun's MASTER_PORT); the agent's when it does not."},
    {"--monitor-interval", "", true, "SECONDS", "0.1",
     "No effect: meshrun reacts to worker exits at once instead of polling."},
    {"--start-method", "", true, "METHOD", "spawn",
     "spawn, fork or forkserver. No effect, as with torchrun for a script: workers "
     "are always fresh processes."},
    {"--event-log-handler", "", true, "NAME", "null",
     "null only (no effect): meshrun records no torchelastic events; the daemon's "
     "status page and metrics (--metrics-port) report the run."},
    {"--role", "", true, "NAME", "default", "Role name of the workers (ROLE_NAME)."},
    {"--module", "-m", false, "", "", "Run the script as a module: python -m SCRIPT."},
    {"--no-python", "", false, "", "",
     "Execute SCRIPT directly instead of under python."},
    {"--run-path", "", false, "", "",
     "torchrun runs the script in its own interpreter; meshrun runs python -u "
     "SCRIPT."},
    {"--log-dir", "", true, "DIR", "", "Base directory for worker log files."},
    {"--redirects", "-r", true, "STREAMS", "0",
     "Send worker streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both, "
     "for all local ranks (3) or per local rank (0:1,1:2)."},
    {"--tee", "-t", true, "STREAMS", "0",
     "Copy worker streams to log files as well as the console (format as "
     "--redirects)."},
    {"--local-ranks-filter", "", true, "LIST", "",
     "Only show these local ranks' output on the console, e.g. 0,1."},
    {"--duplicate-stdout-filters", "", true, "LIST", "",
     "Tee'd (-t) console lines of stdout that contain any of these comma-separated "
     "strings (,, for a comma) are also copied to "
     "<log-dir>/<run-id>/attempt_<n>/filtered_stdout.log."},
    {"--duplicate-stderr-filters", "", true, "LIST", "",
     "As --duplicate-stdout-filters, for stderr (filtered_stderr.log)."},
    {"--node-rank", "", true, "INT", "",
     "This node's rank (required by the static backend; a hint otherwise)."},
    {"--master-addr", "", true, "ADDR", "127.0.0.1",
     "Static backend: address of node 0; IPv6 as [ADDR]."},
    {"--master-port", "", true, "PORT", "29500", "Static backend: port on node 0."},
    {"--local-addr", "", true, "ADDR", "",
     "Address other nodes reach this node by (default: this host's FQDN)."},
    {"--logs-specs", "", true, "NAME", "",
     "Refused: meshrun loads no Python LogsSpecs plugins; it lays out logs as "
     "torchrun's default (--log-dir, -r, -t).",
     false},
    {"--numa-binding", "", true, "MODE", "",
     "Refused: meshrun binds no worker to CPUs; run the workers under numactl or "
     "taskset (--no-python).",
     false},
    {"--shutdown-timeout", "", true, "SECONDS", "30",
     "Grace period between SIGTERM and SIGKILL when stopping workers (default: "
     "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30)."},
    {"--rdzv-reconnect-grace", "", true, "SECONDS", "",
     "How long the workers keep running while the daemon is unreachable (the "
     "agent reconnects meanwhile); then they are stopped and meshrun exits 75. "
     "Default: keep_alive_interval x keep_alive_max_attempt."},
    {"--hang-timeout", "", true, "SECONDS", "1800",
     "A local worker group that makes no progress for this long (no CPU time "
     "and no output from any worker and its children; heartbeats alone for "
     "workers that call meshrun.heartbeat()) has its stacks printed (py-spy, "
     "else gdb) and is stopped as failed. The default is torch's default "
     "process-group timeout, which a wait that long fails anyway; 0: off."},
    {"--health-check", "", true, "CMD", "",
     "A command (run by /bin/sh) that must succeed before this node joins and "
     "before each restart; repeatable. A failing one keeps the node out: it says "
     "which check failed and its output, the daemon's status page shows the node "
     "unhealthy, and meshrun exits 69, so an elastic run re-forms without it."},
    {"--health-check-dir", "", true, "DIR", "",
     "Every executable in DIR is a --health-check too, in name order (as "
     "run-parts)."},
    {"--health-check-timeout", "", true, "SECONDS", "60",
     "A health check still running after this long fails."},
    {"--signals-to-handle", "", true, "LIST", "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
     "Signals forwarded to the workers."},
    {"--log-line-prefix-template", "", true, "TEMPLATE", "[${role_name}${local_rank}]:",
     "Console prefix of the lines of tee'd worker streams (-t), as torchrun 2; "
     "${role_name}, ${rank}, ${local_rank}, "
     "${hostname} (this host's short name), ${host} (its address); default "
     "$TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else [${role_name}${local_rank}]:."},
    {"--virtual-local-rank", "", false, "", "",
     "LOCAL_RANK=0 for every worker, and CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES "
     "where set) narrowed to the worker's own GPU."},
    {"--print-completion", "", true, "SHELL", "",
     "Refused: meshrun prints no shell completion script; meshrun --help lists "
     "every flag.",
     false},
    {"--slurm", "", false, "", "",
     "Inside a SLURM step (srun --ntasks-per-node=1): take --nnodes, --node-rank, "
     "--rdzv-id, --rdzv-endpoint (first node, which hosts it) and --nproc-per-node "
     "(GPUs on the node, else SLURM_NTASKS_PER_NODE) from SLURM's environment; "
     "flags and PET_* variables given win."},
    {"--token-file", "", true, "PATH", "",
     "File (mode 600) holding the rendezvous daemon's shared token, sent on every "
     "call and required by a daemon meshrun hosts; else MESHRUN_RDZV_TOKEN or "
     "MESHRUN_RDZV_TOKEN_FILE. Never pass the token itself on a command line."},
    {"--tls-ca", "", true, "PEM", "", "Talk TLS to the daemon, trusting this CA."},
    {"--tls-cert", "", true, "PEM", "",
     "This node's certificate: the hosted daemon's, and the client certificate sent."},
    {"--tls-key", "", true, "PEM", "", "The private key of --tls-cert."},
    {"--tls-client-ca", "", true, "PEM", "",
     "A daemon meshrun hosts requires client certificates signed by this CA."},
    {"--metrics-port", "", true, "PORT", "",
     "When this meshrun hosts the rendezvous daemon (--standalone, or the node the "
     "endpoint names): serve /metrics, /api/status and the status page on PORT "
     "(0: kernel-assigned; the URL is logged)."},
    {"--ray", "", true, "[=ADDRESS]", "",
     "Run on a Ray cluster (ADDRESS, else $RAY_ADDRESS, else auto) from this one "
     "command: one agent per Ray node in a placement group of --nnodes MAX bundles "
     "(MIN alive at least), the rendezvous daemon beside this command, every "
     "node's output here, prefixed by node. Needs meshrun's Python package and "
     "ray where the command runs. Only as --ray or --ray=ADDRESS.",
     false},
};
static_assert(std::size(kFlagRows) == kNumFlags, "one kFlags row per FlagId");

}  // namespace

const FlagDef (&kFlags)[kNumFlags] = kFlagRows;

std::string UnderscoreSpelling(absl::string_view name) {
  std::string out(name);
  std::replace(out.begin() + 2, out.end(), '-', '_');
  return out;
}

// torchrun's env action: PET_ + the argparse dest (first long name, '_' for '-').
std::string PetName(const FlagDef& def) {
  return absl::StrCat("PET_",
                      absl::AsciiStrToUpper(UnderscoreSpelling(def.name).substr(2)));
}

namespace {

const FlagDef* FindLongFlag(absl::string_view spelled) {
  for (const FlagDef& def : kFlags) {
    if (spelled == def.name || spelled == UnderscoreSpelling(def.name)) return &def;
  }
  return nullptr;
}

const FlagDef* FindShortFlag(absl::string_view spelled) {
  for (const FlagDef& def : kFlags) {
    if (!def.short_name.empty() && spelled == def.short_name) return &def;
  }
  return nullptr;
}

// --- Splitting the command line ----------------------------------------------

// argparse's rule: a "-1" or "-.5" after a flag is its value, not a flag.
bool LooksLikeNegativeNumber(absl::string_view arg) {
  if (arg.size() < 2 || arg[0] != '-') return false;
  absl::string_view rest = arg.substr(1);
  size_t dot = rest.find('.');
  auto all_digits = [](absl::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
  };
  if (dot == absl::string_view::npos) return all_digits(rest);
  return all_digits(rest.substr(0, dot)) && rest.size() > dot + 1 &&
         all_digits(rest.substr(dot + 1));
}

bool IsFlagLike(absl::string_view arg) {
  return arg.size() > 1 && arg[0] == '-' && !LooksLikeNegativeNumber(arg);
}

absl::Status UnknownFlag(absl::string_view spelled) {
  return absl::InvalidArgumentError(
      absl::StrCat(spelled, ": unknown flag (see meshrun --help)"));
}

}  // namespace

// Finds where meshrun's flags end and the script begins. CLI11 cannot be told
// "everything from the first positional on is not mine", so the split is done
// here, with the flag table saying which flags consume a value.
absl::StatusOr<SplitArgs> SplitCommandLine(const std::vector<std::string>& args) {
  SplitArgs out;
  absl::Status first_error;
  auto fail = [&](absl::Status status) {
    if (first_error.ok()) first_error = std::move(status);
  };
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (!IsFlagLike(arg)) break;  // the script (or "-", stdin to python)
    if (arg == "-h" || arg == "--help") {
      out.help = true;
      continue;
    }
    if (arg == "--version") {
      out.version = true;
      continue;
    }
    const FlagDef* def = nullptr;
    absl::string_view spelled = arg;
    std::optional<std::string> value;
    if (absl::StartsWith(arg, "--")) {
      size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        spelled = absl::string_view(arg).substr(0, eq);
        value = arg.substr(eq + 1);
      }
      def = FindLongFlag(spelled);
    } else {
      // Short flags as argparse takes them: "-r 3", "-r3", "-r=3".
      def = FindShortFlag(absl::string_view(arg).substr(0, 2));
      if (def != nullptr) spelled = def->short_name;
      if (def != nullptr && arg.size() > 2) {
        if (def->takes_value) {
          value = arg.substr(arg[2] == '=' ? 3 : 2);
        } else {  // "-mx" is not "-m"; argparse's flag bundling is not worth it
          def = nullptr;
          spelled = arg;
        }
      }
    }
    if (def == nullptr) {
      fail(UnknownFlag(spelled));
      continue;
    }
    if (!def->takes_value) {
      if (value.has_value()) {
        fail(absl::InvalidArgumentError(absl::StrCat(spelled, ": takes no value")));
      }
      out.flag_tokens.emplace_back(def->name);
      continue;
    }
    if (!value.has_value() && def == &kFlags[kRay]) value = "";  // bare --ray
    if (!value.has_value()) {
      if (i + 1 >= args.size() || IsFlagLike(args[i + 1]) || args[i + 1] == "--") {
        fail(absl::InvalidArgumentError(absl::StrCat(spelled, ": missing value")));
        continue;
      }
      value = args[++i];
    }
    out.flag_tokens.emplace_back(def->name);
    out.flag_tokens.push_back(std::move(*value));
  }
  // --help and --version win over other mistakes, as with argparse.
  if (out.help || out.version) return out;
  if (!first_error.ok()) return first_error;
  if (i < args.size()) {
    out.script = args[i];
    out.script_args.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
  }
  return out;
}

// --- Values with their origin ------------------------------------------------

absl::Status FlagError(FlagId id, const Given& given, absl::string_view what) {
  std::string message = absl::StrCat(kFlags[id].name, ": ", what);
  if (!given.origin.empty()) absl::StrAppend(&message, " (from ", given.origin, ")");
  return absl::InvalidArgumentError(message);
}

absl::Status FlagError(FlagId id, absl::string_view what) {
  return FlagError(id, Given{}, what);
}

// --- CLI11 ---------------------------------------------------------------------

CliApp::CliApp() {
  // argparse keeps the last of repeated flags; so do we.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_help_flag("-h,--help", "Print this help and exit.");
  // Listed here; taken by SplitCommandLine, as --help is.
  app.add_flag("--version")
      ->description(
          "Print meshrun's version and the git commit it was built from, and exit.");
  for (int id = 0; id < kNumFlags; ++id) {
    const FlagDef& def = kFlags[id];
    std::string names(def.name);
    if (!def.short_name.empty()) names = absl::StrCat(def.short_name, ",", names);
    std::string underscore = UnderscoreSpelling(def.name);
    if (underscore != def.name) absl::StrAppend(&names, ",", underscore);
    std::string help(def.help);
    if (def.pet) absl::StrAppend(&help, " [env ", PetName(def), "]");
    if (def.takes_value) {
      options[id] =
          app.add_option(names, values[id], help)->type_name(std::string(def.type_name));
      if (!def.default_text.empty()) {
        options[id]->default_str(std::string(def.default_text));
      }
    } else {
      // Not add_flag(names, help): a non-const string there binds as the
      // flag's result variable.
      options[id] = app.add_flag(names)->description(help);
    }
  }
  // Each --health-check counts (one command a line).
  options[kHealthCheck]->multi_option_policy(CLI::MultiOptionPolicy::Join);
  app.add_option("SCRIPT", script_placeholder,
                 "Training script (a module with -m, a program with --no-python).")
      ->type_name("");
  app.add_option("SCRIPT_ARGS", script_args_placeholder,
                 "The script's arguments, passed through untouched.")
      ->type_name("");
  app.footer(
      "Everything from SCRIPT on goes to the workers untouched, even arguments "
      "that look like meshrun flags; use -- before SCRIPT if its name starts with "
      "'-'. Flags not given default to their PET_* environment variable. Python "
      "workers run as $PYTHON_EXEC (default python3) -u SCRIPT.");
}

}  // namespace meshrun::launcher
