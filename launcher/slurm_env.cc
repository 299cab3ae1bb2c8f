#include "launcher/slurm_env.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace meshrun::launcher {
namespace {

// 20000..28999: below Linux's ephemeral ports (kernel-chosen ones never
// collide) and clear of torch's fixed 29400 (rendezvous) and 29500
// (MASTER_PORT).
constexpr int kPortBase = 20000;
constexpr int kPortSpan = 9000;
// Digits of a range bound; more would overflow the arithmetic below.
constexpr size_t kMaxBoundDigits = 18;

bool AllDigits(absl::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
}

std::optional<int64_t> ParseNonNegative(absl::string_view text) {
  if (!AllDigits(text) || text.size() > kMaxBoundDigits) return std::nullopt;
  int64_t value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

std::string Padded(int64_t value, size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// The alternatives inside one pair of brackets: "01-04,07" -> 01 02 03 04 07.
absl::StatusOr<std::vector<std::string>> ExpandBracket(absl::string_view inside,
                                                       absl::string_view hostlist) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed hostlist '", hostlist, "': ", what));
  };
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(inside, ',')) {
    if (part.empty()) return bad(absl::StrCat("empty range in '[", inside, "]'"));
    size_t dash = part.find('-');
    absl::string_view lo_text = part.substr(0, dash);
    absl::string_view hi_text =
        dash == absl::string_view::npos ? lo_text : part.substr(dash + 1);
    std::optional<int64_t> lo = ParseNonNegative(lo_text);
    std::optional<int64_t> hi = ParseNonNegative(hi_text);
    if (!lo || !hi) {
      return bad(absl::StrCat("'", part, "' is not a number or a range N-M"));
    }
    if (*lo > *hi) return bad(absl::StrCat("range '", part, "' runs backwards"));
    if (*hi - *lo >= static_cast<int64_t>(kMaxHostlistHosts)) {
      return bad(
          absl::StrCat("range '", part, "' has more than ", kMaxHostlistHosts, " hosts"));
    }
    for (int64_t value = *lo; value <= *hi; ++value) {
      out.push_back(Padded(value, lo_text.size()));
    }
    if (out.size() > kMaxHostlistHosts) {
      return bad(absl::StrCat("more than ", kMaxHostlistHosts, " hosts"));
    }
  }
  return out;
}

// One host pattern without top-level commas: "rack[1-2]-n[01-02]".
absl::Status ExpandPattern(absl::string_view pattern, absl::string_view hostlist,
                           std::vector<std::string>* hosts) {
  std::vector<std::string> partial = {""};
  size_t i = 0;
  while (i < pattern.size()) {
    size_t open = pattern.find('[', i);
    absl::string_view literal = pattern.substr(i, open - i);
    for (std::string& prefix : partial) absl::StrAppend(&prefix, literal);
    if (open == absl::string_view::npos) break;
    size_t close = pattern.find(']', open);
    // The caller has checked that brackets balance and do not nest.
    auto choices = ExpandBracket(pattern.substr(open + 1, close - open - 1), hostlist);
    if (!choices.ok()) return choices.status();
    if (partial.size() * choices->size() > kMaxHostlistHosts) {
      return absl::InvalidArgumentError(absl::StrCat("malformed hostlist '", hostlist,
                                                     "': more than ", kMaxHostlistHosts,
                                                     " hosts"));
    }
    std::vector<std::string> next;
    next.reserve(partial.size() * choices->size());
    for (const std::string& prefix : partial) {
      for (const std::string& choice : *choices) next.push_back(prefix + choice);
    }
    partial = std::move(next);
    i = close + 1;
  }
  if (hosts->size() + partial.size() > kMaxHostlistHosts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed hostlist '", hostlist, "': more than ", kMaxHostlistHosts, " hosts"));
  }
  hosts->insert(hosts->end(), partial.begin(), partial.end());
  return absl::OkStatus();
}

std::optional<std::string> Lookup(const std::map<std::string, std::string>& env,
                                  const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

// The first of `names` that is set, with its name.
std::optional<SlurmValue> First(const std::map<std::string, std::string>& env,
                                std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto value = Lookup(env, name)) return SlurmValue{*value, name};
  }
  return std::nullopt;
}

absl::Status BadVariable(const SlurmValue& value, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("--slurm: ", value.origin, "='", value.text, "' is not ", expected));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostlist(absl::string_view hostlist) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed hostlist '", hostlist, "': ", what));
  };
  if (hostlist.empty()) return bad("it is empty");
  // Split at commas outside brackets, checking the brackets on the way.
  std::vector<absl::string_view> patterns;
  size_t start = 0;
  bool in_bracket = false;
  for (size_t i = 0; i < hostlist.size(); ++i) {
    char c = hostlist[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      return bad(absl::StrCat("whitespace at offset ", i));
    }
    if (c == '[') {
      if (in_bracket) return bad(absl::StrCat("nested '[' at offset ", i));
      in_bracket = true;
    } else if (c == ']') {
      if (!in_bracket) return bad(absl::StrCat("']' without '[' at offset ", i));
      in_bracket = false;
    } else if (c == ',' && !in_bracket) {
      patterns.push_back(hostlist.substr(start, i - start));
      start = i + 1;
    }
  }
  if (in_bracket) return bad("'[' is never closed");
  patterns.push_back(hostlist.substr(start));

  std::vector<std::string> hosts;
  for (absl::string_view pattern : patterns) {
    if (pattern.empty()) return bad("empty host name between commas");
    absl::Status status = ExpandPattern(pattern, hostlist, &hosts);
    if (!status.ok()) return status;
  }
  return hosts;
}

absl::StatusOr<std::vector<int>> ExpandCountList(absl::string_view counts) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed count list '", counts, "': expected N or N(xK), comma-separated"));
  };
  if (counts.empty()) return bad();
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(counts, ',')) {
    int64_t repeat = 1;
    size_t paren = part.find('(');
    if (paren != absl::string_view::npos) {
      absl::string_view tail = part.substr(paren);
      if (tail.size() < 4 || tail.substr(0, 2) != "(x" || tail.back() != ')')
        return bad();
      std::optional<int64_t> times = ParseNonNegative(tail.substr(2, tail.size() - 3));
      if (!times || *times == 0 || *times > static_cast<int64_t>(kMaxHostlistHosts)) {
        return bad();
      }
      repeat = *times;
      part = part.substr(0, paren);
    }
    std::optional<int64_t> value = ParseNonNegative(part);
    if (!value || *value > 1000000) return bad();
    if (out.size() + static_cast<size_t>(repeat) > kMaxHostlistHosts) return bad();
    out.insert(out.end(), static_cast<size_t>(repeat), static_cast<int>(*value));
  }
  return out;
}

int SlurmRendezvousPort(absl::string_view run_id) {
  // FNV-1a: stable across machines and builds, unlike std::hash.
  uint32_t hash = 2166136261u;
  for (char c : run_id) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 16777619u;
  }
  return kPortBase + static_cast<int>(hash % kPortSpan);
}

absl::StatusOr<SlurmFlags> SlurmFlagsFromEnv(
    const std::map<std::string, std::string>& env) {
  std::optional<SlurmValue> job = First(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  if (!job) {
    return absl::InvalidArgumentError(
        "--slurm: not inside a SLURM job (SLURM_JOB_ID is unset); run it under srun "
        "or sbatch, or use meshrun's own flags");
  }
  if (!ParseNonNegative(job->text)) return BadVariable(*job, "a job id");
  std::optional<SlurmValue> step = First(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
  if (step && !ParseNonNegative(step->text)) return BadVariable(*step, "a step id");

  SlurmFlags flags;
  // A step may use a subset of the job's nodes: the step's numbers come first.
  std::optional<SlurmValue> nnodes =
      step ? First(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"})
           : First(env, {"SLURM_JOB_NUM_NODES", "SLURM_NNODES"});
  if (!nnodes) {
    return absl::InvalidArgumentError(
        "--slurm: SLURM_NNODES and SLURM_JOB_NUM_NODES are unset");
  }
  std::optional<int64_t> node_count = ParseNonNegative(nnodes->text);
  if (!node_count || *node_count < 1 || *node_count > 1000000) {
    return BadVariable(*nnodes, "a node count");
  }
  flags.nnodes = *nnodes;

  if (!step && *node_count > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--slurm: not inside an srun step, but job ", job->text, " has ", *node_count,
        " nodes; start one meshrun per node: srun --ntasks-per-node=1 meshrun-slurm "
        "..."));
  }

  std::optional<SlurmValue> nodelist =
      First(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (!nodelist) {
    return absl::InvalidArgumentError(
        "--slurm: SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are unset");
  }
  auto hosts = ExpandHostlist(nodelist->text);
  if (!hosts.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slurm: ", nodelist->origin, ": ", hosts.status().message()));
  }
  if (static_cast<int64_t>(hosts->size()) != *node_count) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slurm: ", nodelist->origin, "='", nodelist->text, "' names ",
                     hosts->size(), " hosts but ", nnodes->origin, "=", nnodes->text));
  }

  std::optional<SlurmValue> node_id = First(env, {"SLURM_NODEID"});
  if (node_id) {
    std::optional<int64_t> rank = ParseNonNegative(node_id->text);
    if (!rank) return BadVariable(*node_id, "a node index");
    if (*rank >= *node_count) {
      return absl::InvalidArgumentError(
          absl::StrCat("--slurm: SLURM_NODEID=", node_id->text, " is not below ",
                       nnodes->origin, "=", nnodes->text));
    }
    flags.node_rank = *node_id;
  } else if (*node_count == 1) {
    flags.node_rank = SlurmValue{"0", nnodes->origin};
  } else {
    return absl::InvalidArgumentError("--slurm: SLURM_NODEID is unset");
  }

  // One agent per node: a second task on a node would be a second agent,
  // joining as a node of its own, and the job would wait for nodes that never
  // come or form a world twice the size.
  if (step) {
    if (auto tasks = First(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})) {
      auto counts = ExpandCountList(tasks->text);
      if (!counts.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--slurm: ", tasks->origin, ": ", counts.status().message()));
      }
      int most = *std::max_element(counts->begin(), counts->end());
      if (most > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--slurm: this srun step runs ", most, " tasks on a node (", tasks->origin,
            "=", tasks->text,
            "); meshrun wants exactly one per node and starts the workers itself: "
            "srun --ntasks-per-node=1 (and -n/--ntasks equal to the node count when "
            "the job was given more tasks), with --nproc-per-node for the workers"));
      }
    }
    if (auto local_id = First(env, {"SLURM_LOCALID"});
        local_id && local_id->text != "0") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--slurm: SLURM_LOCALID=", local_id->text,
          ": more than one task of this srun step runs on this node; use srun "
          "--ntasks-per-node=1"));
    }
  }

  std::string run_id = job->text;
  std::string id_origin = job->origin;
  if (step) {
    absl::StrAppend(&run_id, ".", step->text);
    absl::StrAppend(&id_origin, "+", step->origin);
  }
  flags.rdzv_id = SlurmValue{run_id, id_origin};
  flags.rdzv_endpoint = SlurmValue{
      absl::StrCat(hosts->front(), ":", SlurmRendezvousPort(run_id)), nodelist->origin};

  if (auto gpus = First(env, {"SLURM_GPUS_ON_NODE"})) {
    std::optional<int64_t> count = ParseNonNegative(gpus->text);
    if (!count || *count > 100000) return BadVariable(*gpus, "a GPU count");
    if (*count > 0) flags.nproc_per_node = gpus;
  }
  if (!flags.nproc_per_node) {
    if (auto tasks = First(env, {"SLURM_NTASKS_PER_NODE"})) {
      std::optional<int64_t> count = ParseNonNegative(tasks->text);
      if (!count || *count < 1 || *count > 100000) {
        return BadVariable(*tasks, "a task count");
      }
      flags.nproc_per_node = tasks;
    }
  }
  return flags;
}

}  // namespace meshrun::launcher
