#pragma once

// What a SLURM job step's environment says about this node's part in a
// meshrun job, as pure functions: environment in, flag values (each with the
// variable it came from) or a one-line error out. `meshrun --slurm` (and
// scripts/meshrun-slurm) uses them as defaults below the command line and
// PET_* variables.
//
// Hostlists are expanded natively, without scontrol: a missing scontrol in a
// container is how hand-written SLURM scripts end up with every node in a
// world of its own.
//
// Thread-safety: every function is reentrant and keeps no state.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace meshrun::launcher {

// Expands a SLURM hostlist expression into host names, in SLURM's order:
// "node[01-04,07]" -> node01..node04, node07; "a[1-2],b3" -> a1, a2, b3;
// "r[1-2]n[1-2]" -> r1n1, r1n2, r2n1, r2n2. A range's lower bound sets the
// zero-padded width ("[8-10]" -> 8, 9, 10; "[08-10]" -> 08, 09, 10). Commas
// separate hosts only outside brackets. Malformed lists (unbalanced or nested
// brackets, empty hosts or ranges, descending ranges, non-digits in a range,
// more than kMaxHostlistHosts hosts) are InvalidArgument with a message that
// quotes the list and says what is wrong.
absl::StatusOr<std::vector<std::string>> ExpandHostlist(absl::string_view hostlist);

// Hosts one expression may expand to; beyond it a typo ("[1-99999999]") would
// exhaust memory.
inline constexpr size_t kMaxHostlistHosts = 1 << 20;

// Expands SLURM's per-node count lists ("2(x3),1" -> 2, 2, 2, 1), as in
// SLURM_TASKS_PER_NODE and SLURM_JOB_CPUS_PER_NODE.
absl::StatusOr<std::vector<int>> ExpandCountList(absl::string_view counts);

// A flag value derived from the environment, with the variable it came from
// (for messages such as "--nnodes: ... (from SLURM_NNODES)").
struct SlurmValue {
  std::string text;
  std::string origin;

  bool operator==(const SlurmValue& other) const {
    return text == other.text && origin == other.origin;
  }
};

// meshrun's flags as a SLURM step defines them.
struct SlurmFlags {
  // --nnodes N: the step's node count.
  SlurmValue nnodes;
  // --node-rank: SLURM_NODEID (0 on the step's first node).
  SlurmValue node_rank;
  // --rdzv-id: "<job id>.<step id>", or the job id outside a step.
  SlurmValue rdzv_id;
  // --rdzv-endpoint: the first host of the step's node list, on
  // SlurmRendezvousPort().
  SlurmValue rdzv_endpoint;
  // --nproc-per-node: SLURM_GPUS_ON_NODE when above 0, else
  // SLURM_NTASKS_PER_NODE; nullopt when neither is set (the flag decides).
  std::optional<SlurmValue> nproc_per_node;
};

// Derives the flags from a SLURM environment. Fails with a one-line reason
// when the process is not in a SLURM job, when a variable is malformed, when
// the step runs more than one task on a node (meshrun wants one agent per
// node; several would form several worlds), or when a multi-node job is
// launched outside an srun step (from the batch script itself).
absl::StatusOr<SlurmFlags> SlurmFlagsFromEnv(
    const std::map<std::string, std::string>& env);

// The rendezvous port of a job step: 20000 + a hash of "<job>.<step>" modulo
// 9000. Every node computes the same port without talking; below Linux's
// ephemeral range, clear of torch's 29400/29500, and different for jobs that
// share a first node.
int SlurmRendezvousPort(absl::string_view run_id);

}  // namespace meshrun::launcher
