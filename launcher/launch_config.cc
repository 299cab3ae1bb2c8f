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
#include "launcher/slurm_env.h"
#include "rendezvous/core/request_validation.h"

namespace meshrun::launcher {
namespace {

constexpr int kDefaultRdzvPort = 29400;
constexpr int kMaxPort = 65535;
// Larger second counts are typos, and would overflow milliseconds in int64.
constexpr double kMaxSeconds = 1e9;

// --- The flag table -----------------------------------------------------------
// One row per flag; the CLI11 app, the argument splitter, the underscore
// spelling and the PET_* name are all derived from it, so they cannot drift.

enum FlagId {
  kNnodes,
  kNprocPerNode,
  kRdzvBackend,
  kRdzvEndpoint,
  kRdzvId,
  kRdzvConf,
  kStandalone,
  kMaxRestarts,
  kRestartScope,
  kReplicaSize,
  kWorkerStore,
  kMonitorInterval,
  kStartMethod,
  kEventLogHandler,
  kRole,
  kModule,
  kNoPython,
  kRunPath,
  kLogDir,
  kRedirects,
  kTee,
  kLocalRanksFilter,
  kDuplicateStdoutFilters,
  kDuplicateStderrFilters,
  kNodeRank,
  kMasterAddr,
  kMasterPort,
  kLocalAddr,
  kLogsSpecs,
  kNumaBinding,
  kShutdownTimeout,
  kRdzvReconnectGrace,
  kHangTimeout,
  kHealthCheck,
  kHealthCheckDir,
  kHealthCheckTimeout,
  kSignalsToHandle,
  kLogLinePrefixTemplate,
  kVirtualLocalRank,
  kPrintCompletion,
  kSlurm,
  kTokenFile,
  kTlsCa,
  kTlsCert,
  kTlsKey,
  kTlsClientCa,
  kMetricsPort,
  kRay,
  kNumFlags,
};

struct FlagDef {
  absl::string_view name;        // dash spelling, the canonical one
  absl::string_view short_name;  // "-r", or empty
  bool takes_value;              // false: a switch (store_true)
  absl::string_view type_name;   // for --help
  absl::string_view default_text;
  absl::string_view help;
  // Whether PET_<DEST> supplies a default (torchrun's `env`/`check_env`
  // actions); torchrun's --logs-specs, --numa-binding and --print-completion
  // have none.
  bool pet = true;
};

constexpr FlagDef kFlags[] = {
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
    {"--rdzv-endpoint", "", true, "HOST[:PORT]", "",
     "Rendezvous daemon address (c10d: default localhost:29400; static: PORT "
     "required); IPv6 as [ADDR]:PORT."},
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
static_assert(std::size(kFlags) == kNumFlags, "one kFlags row per FlagId");

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

struct SplitArgs {
  // meshrun's own flags, normalised to "--canonical" [value] so CLI11 never
  // has to guess what a token is. Never "--canonical=value": CLI11 reads
  // "--x=" as "--x" and would take the next token as the value.
  std::vector<std::string> flag_tokens;
  bool help = false;
  bool version = false;
  std::optional<std::string> script;
  std::vector<std::string> script_args;
};

absl::Status UnknownFlag(absl::string_view spelled) {
  return absl::InvalidArgumentError(
      absl::StrCat(spelled, ": unknown flag (see meshrun --help)"));
}

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

// A flag's value and where it came from, so errors can say "(from PET_X)".
struct Given {
  std::string text;
  std::string origin;  // empty: the command line; else the PET_* variable
};

absl::Status FlagError(FlagId id, const Given& given, absl::string_view what) {
  std::string message = absl::StrCat(kFlags[id].name, ": ", what);
  if (!given.origin.empty()) absl::StrAppend(&message, " (from ", given.origin, ")");
  return absl::InvalidArgumentError(message);
}

absl::Status FlagError(FlagId id, absl::string_view what) {
  return FlagError(id, Given{}, what);
}

std::string Got(absl::string_view expected, absl::string_view text) {
  return absl::StrCat("expected ", expected, ", got '", text, "'");
}

// What the command line, PET_* and (with --slurm) SLURM's environment say, in
// that order of precedence.
class FlagValues {
 public:
  FlagValues(std::array<std::string, kNumFlags> cli_values,
             std::array<bool, kNumFlags> on_cli,
             const std::map<std::string, std::string>& env)
      : cli_values_(std::move(cli_values)), on_cli_(on_cli), env_(env) {}

  // nullopt when neither the command line, a non-empty PET_* nor a fallback
  // gives it.
  std::optional<Given> Get(FlagId id) const {
    if (std::optional<Given> given = GetExplicit(id)) return given;
    auto fallback = fallbacks_.find(id);
    if (fallback != fallbacks_.end()) return fallback->second;
    return std::nullopt;
  }

  // The command line or PET_* only.
  std::optional<Given> GetExplicit(FlagId id) const {
    if (on_cli_[id]) return Given{cli_values_[id], ""};
    if (!kFlags[id].pet) return std::nullopt;
    std::string pet = PetName(kFlags[id]);
    auto it = env_.find(pet);
    if (it == env_.end() || it->second.empty()) return std::nullopt;
    return Given{it->second, pet};
  }

  // A value below the command line and PET_* (SLURM's environment).
  void SetFallback(FlagId id, Given given) { fallbacks_[id] = std::move(given); }

  // The flag's value, or its default from the table.
  Given GetOr(FlagId id) const {
    std::optional<Given> given = Get(id);
    return given ? *given : Given{std::string(kFlags[id].default_text), ""};
  }

  // Switches: torchrun's check_env, but lenient about spelling: any value but
  // "", "0" and "false" turns the switch on.
  bool Switch(FlagId id) const {
    if (on_cli_[id]) return true;
    if (!kFlags[id].pet) return false;
    auto it = env_.find(PetName(kFlags[id]));
    if (it == env_.end()) return false;
    std::string value = absl::AsciiStrToLower(absl::StripAsciiWhitespace(it->second));
    return !value.empty() && value != "0" && value != "false";
  }

 private:
  std::array<std::string, kNumFlags> cli_values_;
  std::array<bool, kNumFlags> on_cli_;
  const std::map<std::string, std::string>& env_;
  std::map<FlagId, Given> fallbacks_;
};

// --- Value parsers: pure, message without the flag prefix ----------------------

std::optional<int> ParseInt(absl::string_view text) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

// Seconds as a decimal number, possibly fractional, kept to the millisecond.
std::optional<std::chrono::milliseconds> ParseSeconds(absl::string_view text) {
  double seconds = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, seconds);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(seconds) ||
      seconds < 0 || seconds > kMaxSeconds) {
    return std::nullopt;
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

std::optional<std::pair<int, int>> ParseNnodes(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  if (parts.size() > 2) return std::nullopt;
  std::optional<int> min = ParseInt(parts[0]);
  std::optional<int> max = parts.size() == 2 ? ParseInt(parts[1]) : min;
  if (!min || !max || *min < 1 || *min > *max) return std::nullopt;
  return std::make_pair(*min, *max);
}

// Letters, digits, '.', '-', '_' (torch's hostname rule); ':' and '%' (zone)
// only inside brackets, where they belong to an IPv6 literal.
bool ValidHost(absl::string_view host, bool ipv6) {
  if (host.empty()) return false;
  return std::all_of(host.begin(), host.end(), [ipv6](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ||
           c == '_' || (ipv6 && (c == ':' || c == '%'));
  });
}

std::optional<int> ParsePort(absl::string_view text) {
  if (text.empty() || text.size() > 5) return std::nullopt;
  std::optional<int> port = ParseInt(text);
  if (!port || *port < 0 || *port > kMaxPort || text[0] == '-' || text[0] == '+') {
    return std::nullopt;
  }
  return port;
}

// "host", "host:port", "[v6]", "[v6]:port". nullopt port when none given.
absl::StatusOr<std::pair<std::string, std::optional<int>>> ParseEndpoint(
    absl::string_view text) {
  const std::string kExpected = "HOST[:PORT] with PORT in 0..65535, IPv6 as [ADDR]:PORT";
  absl::string_view host = text;
  std::optional<absl::string_view> port_text;
  bool ipv6 = false;
  if (absl::StartsWith(text, "[")) {
    size_t close = text.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(Got(kExpected, text));
    }
    host = text.substr(1, close - 1);
    absl::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return absl::InvalidArgumentError(Got(kExpected, text));
      port_text = rest.substr(1);
    }
    ipv6 = true;
  } else {
    size_t colons = std::count(text.begin(), text.end(), ':');
    if (colons > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(Got(kExpected, text), " (put IPv6 addresses in brackets)"));
    }
    if (colons == 1) {
      size_t colon = text.find(':');
      host = text.substr(0, colon);
      port_text = text.substr(colon + 1);
    }
  }
  if (!ValidHost(host, ipv6)) return absl::InvalidArgumentError(Got(kExpected, text));
  std::optional<int> port;
  if (port_text.has_value()) {
    port = ParsePort(*port_text);
    if (!port) return absl::InvalidArgumentError(Got(kExpected, text));
  }
  return std::make_pair(std::string(host), port);
}

constexpr absl::string_view kRdzvConfKeys[] = {
    "cas_backoff_max_seconds",
    "close_timeout",
    "is_host",
    "join_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "last_call_timeout",
    "read_timeout",
    "store_type",
    "timeout",
};

absl::StatusOr<bool> ParseBool(absl::string_view key, absl::string_view text) {
  // torch's RendezvousParameters.get_as_bool spellings.
  std::string lower = absl::AsciiStrToLower(text);
  for (absl::string_view yes : {"1", "true", "t", "yes", "y"}) {
    if (lower == yes) return true;
  }
  for (absl::string_view no : {"0", "false", "f", "no", "n"}) {
    if (lower == no) return false;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(key, ": ", Got("a boolean (1/0, true/false, yes/no)", text)));
}

absl::StatusOr<RdzvConf> ParseRdzvConf(absl::string_view text) {
  RdzvConf conf;
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return conf;
  bool saw_timeout = false, saw_join_timeout = false;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    if (key.empty()) {
      return absl::InvalidArgumentError(Got("KEY=VALUE,KEY=VALUE,...", text));
    }
    if (value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("'", key, "' needs a value"));
    }
    auto seconds = [&](std::chrono::milliseconds* field) -> absl::Status {
      std::optional<std::chrono::milliseconds> parsed = ParseSeconds(value);
      if (!parsed || parsed->count() <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(key, ": ", Got("a positive number of seconds", value)));
      }
      *field = *parsed;
      return absl::OkStatus();
    };
    absl::Status status;
    if (key == "join_timeout" || key == "timeout") {
      (key == "timeout" ? saw_timeout : saw_join_timeout) = true;
      status = seconds(&conf.join_timeout);
    } else if (key == "last_call_timeout") {
      status = seconds(&conf.last_call_timeout);
    } else if (key == "close_timeout") {
      status = seconds(&conf.close_timeout);
    } else if (key == "keep_alive_interval") {
      status = seconds(&conf.keep_alive_interval);
    } else if (key == "read_timeout") {
      status = seconds(&conf.read_timeout);
    } else if (key == "keep_alive_max_attempt") {
      std::optional<int> attempts = ParseInt(value);
      if (!attempts || *attempts < 1) {
        status = absl::InvalidArgumentError(
            absl::StrCat(key, ": ", Got("an integer >= 1", value)));
      } else {
        conf.keep_alive_max_attempt = *attempts;
      }
    } else if (key == "cas_backoff_max_seconds") {
      // torch's c10d backend waits this long after a lost compare-and-set;
      // the daemon joins nodes server-side, so no agent ever loses one.
      if (!ParseSeconds(value)) {
        status = absl::InvalidArgumentError(
            absl::StrCat(key, ": ", Got("a non-negative number of seconds", value)));
      }
    } else if (key == "store_type") {
      if (absl::AsciiStrToLower(value) != "tcp") {
        status = absl::InvalidArgumentError(absl::StrCat(
            key,
            ": meshrun's rendezvous is its daemon over TCP, so only 'tcp' is "
            "accepted, got '",
            value, "'"));
      }
    } else if (key == "is_host") {
      absl::StatusOr<bool> is_host = ParseBool(key, value);
      if (is_host.ok()) conf.is_host = *is_host;
      status = is_host.status();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown key '", key, "'; valid keys: ", absl::StrJoin(kRdzvConfKeys, ", ")));
    }
    if (!status.ok()) return status;
  }
  if (saw_timeout && saw_join_timeout) {
    return absl::InvalidArgumentError(
        "'timeout' and 'join_timeout' are the same setting; give one");
  }
  return conf;
}

// torchrun's Std.from_str, except that local ranks may have several digits
// (torch's regex takes one, so "10:1" fails there for no good reason).
std::optional<StdStreamsSpec> ParseStdStreams(absl::string_view text) {
  auto stream = [](absl::string_view s) -> std::optional<StdStreams> {
    if (s.size() != 1 || s[0] < '0' || s[0] > '3') return std::nullopt;
    return static_cast<StdStreams>(s[0] - '0');
  };
  StdStreamsSpec spec;
  if (text.find(':') == absl::string_view::npos) {
    std::optional<StdStreams> all = stream(text);
    if (!all) return std::nullopt;
    spec.all_ranks = *all;
    return spec;
  }
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, ':');
    if (kv.size() != 2) return std::nullopt;
    std::optional<int> local_rank = ParseInt(kv[0]);
    std::optional<StdStreams> value = stream(kv[1]);
    if (!local_rank || *local_rank < 0 || !value) return std::nullopt;
    spec.by_local_rank[*local_rank] = *value;
  }
  return spec;
}

std::optional<std::set<int>> ParseLocalRanks(absl::string_view text) {
  std::set<int> ranks;
  if (absl::StripAsciiWhitespace(text).empty()) return ranks;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::optional<int> rank = ParseInt(absl::StripAsciiWhitespace(item));
    if (!rank || *rank < 0) return std::nullopt;
    ranks.insert(*rank);
  }
  return ranks;
}

struct SignalName {
  absl::string_view name;
  int number;
};

// The signals a launcher can sensibly forward. SIGCHLD, SIGPIPE and the like
// are the agent's own business.
const SignalName kSignals[] = {
    {"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},   {"SIGQUIT", SIGQUIT},
    {"SIGTERM", SIGTERM}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2},
    {"SIGALRM", SIGALRM}, {"SIGXCPU", SIGXCPU}, {"SIGCONT", SIGCONT},
};

// Names as in Python's signal module; "TERM" and lower case are forgiven.
absl::StatusOr<std::vector<int>> ParseSignals(absl::string_view text) {
  std::vector<int> numbers;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::string name = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(item));
    if (!absl::StartsWith(name, "SIG")) name = absl::StrCat("SIG", name);
    if (name == "SIGKILL" || name == "SIGSTOP") {
      return absl::InvalidArgumentError(absl::StrCat(name, " cannot be caught"));
    }
    auto it = std::find_if(std::begin(kSignals), std::end(kSignals),
                           [&](const SignalName& s) { return s.name == name; });
    if (it == std::end(kSignals)) {
      std::vector<absl::string_view> valid;
      for (const SignalName& s : kSignals) valid.push_back(s.name);
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown signal '", item, "'; valid: ", absl::StrJoin(valid, ",")));
    }
    if (std::find(numbers.begin(), numbers.end(), it->number) == numbers.end()) {
      numbers.push_back(it->number);
    }
  }
  return numbers;
}

constexpr absl::string_view kPrefixPlaceholders[] = {"role_name", "rank", "local_rank",
                                                     "hostname", "host"};

// Python string.Template syntax as torch uses it ($$, $name, ${name}), but an
// unknown name is an error here: safe_substitute would print it literally on
// every line, which is never what was meant.
absl::Status ValidatePrefixTemplate(absl::string_view text) {
  auto known = [](absl::string_view name) {
    return std::find(std::begin(kPrefixPlaceholders), std::end(kPrefixPlaceholders),
                     name) != std::end(kPrefixPlaceholders);
  };
  auto ident_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  };
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '$' || i + 1 >= text.size()) continue;
    char next = text[i + 1];
    absl::string_view name;
    if (next == '$') {
      ++i;
      continue;
    } else if (next == '{') {
      size_t close = text.find('}', i + 2);
      if (close == absl::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat("unclosed '${' in '", text, "'"));
      }
      name = text.substr(i + 2, close - i - 2);
      i = close;
    } else if (std::isalpha(static_cast<unsigned char>(next)) || next == '_') {
      size_t end = i + 1;
      while (end < text.size() && ident_char(text[end])) ++end;
      name = text.substr(i + 1, end - i - 1);
      i = end - 1;
    } else {
      continue;  // a lone '$' stays literal, as with safe_substitute
    }
    if (!known(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown placeholder '", name, "' in '", text,
                       "'; valid: ${role_name}, ${rank}, ${local_rank}, ${hostname}, "
                       "${host}"));
    }
  }
  return absl::OkStatus();
}

// --- CLI11 ---------------------------------------------------------------------

// CLI11 is given only the normalised flag tokens; it owns the declaration of
// the flags (both spellings, short names) and the --help text.
struct CliApp {
  CLI::App app{"Launch a distributed PyTorch-style training job (torchrun-compatible).",
               "meshrun"};
  std::array<std::string, kNumFlags> values;
  std::array<CLI::Option*, kNumFlags> options{};
  std::string script_placeholder;
  std::vector<std::string> script_args_placeholder;

  CliApp() {
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
        options[id] = app.add_option(names, values[id], help)
                          ->type_name(std::string(def.type_name));
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
};

// torchrun uses $PYTHON_EXEC, else its own interpreter; ours is python3 from
// PATH, resolved by the spawner.
std::string PythonExecutable(const std::map<std::string, std::string>& env) {
  auto it = env.find("PYTHON_EXEC");
  return it != env.end() && !it->second.empty() ? it->second : std::string("python3");
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
      auto parsed = ParseEndpoint(absl::StripAsciiWhitespace(endpoint->text));
      if (!parsed.ok()) {
        return FlagError(kRdzvEndpoint, *endpoint, parsed.status().message());
      }
      if (config->rdzv_backend == RdzvBackend::kStatic && !parsed->second.has_value()) {
        return FlagError(
            kRdzvEndpoint, *endpoint,
            Got("HOST:PORT (the static backend needs a port)", endpoint->text));
      }
      // Port 0 only makes sense for a daemon nobody else has to find.
      if (parsed->second == 0) {
        return FlagError(
            kRdzvEndpoint, *endpoint,
            absl::StrCat("port 0 cannot be reached by the agents "
                         "(--standalone runs a daemon on a free port), got '",
                         endpoint->text, "'"));
      }
      config->rdzv_endpoint =
          HostPort{parsed->first, parsed->second.value_or(kDefaultRdzvPort)};
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
                                LaunchConfig* config) {
  config->module = flags.Switch(kModule);
  config->no_python = flags.Switch(kNoPython);
  config->run_path = flags.Switch(kRunPath);
  std::string python = PythonExecutable(env);
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
  if (status.ok()) status = BuildWorkerCommand(flags, env, &config);
  if (!status.ok()) return status;
  return config;
}

}  // namespace meshrun::launcher
