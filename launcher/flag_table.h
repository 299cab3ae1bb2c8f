#pragma once

// meshrun's flags: the table of every flag (torchrun's spellings, value,
// default, --help text, PET_* variable), splitting a command line into
// meshrun's flags and the script's, the values with where each came from
// (command line, PET_*, SLURM), and the CLI11 app that prints --help. Used by
// launch_config.cc, which turns the values into a LaunchConfig.

#include <array>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace meshrun::launcher {

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

// One row per FlagId, in its order.
extern const FlagDef (&kFlags)[kNumFlags];

// --flag-name's other spelling, --flag_name (torchrun takes both).
std::string UnderscoreSpelling(absl::string_view name);
// The flag's PET_* variable.
std::string PetName(const FlagDef& def);

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

// Finds where meshrun's flags end and the script begins.
absl::StatusOr<SplitArgs> SplitCommandLine(const std::vector<std::string>& args);

// A flag's value and where it came from, so errors can say "(from PET_X)".
struct Given {
  std::string text;
  std::string origin;  // empty: the command line; else the PET_* variable
};

// "--flag: <what>", with "(from PET_X)" when the value came from there.
absl::Status FlagError(FlagId id, const Given& given, absl::string_view what);
absl::Status FlagError(FlagId id, absl::string_view what);

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

// CLI11 is given only the normalised flag tokens; it owns the declaration of
// the flags (both spellings, short names) and the --help text.
struct CliApp {
  CLI::App app{"Launch a distributed PyTorch-style training job (torchrun-compatible).",
               "meshrun"};
  std::array<std::string, kNumFlags> values;
  std::array<CLI::Option*, kNumFlags> options{};
  std::string script_placeholder;
  std::vector<std::string> script_args_placeholder;

  CliApp();
};

}  // namespace meshrun::launcher
