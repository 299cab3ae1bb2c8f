#pragma once

// The environment a launcher gives each worker (torchrun's variables plus
// meshrun's own), parsed and validated into one value. No libtorch here, so
// any target may include it cheaply.
//
// Required (torch's env:// needs them, and meshrun and torchrun always set
// them): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. Everything
// else is optional; a variable that is set must be valid.

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace meshrun::worker {

struct WorkerEnv {
  int rank = 0;                          // RANK
  int world_size = 1;                    // WORLD_SIZE
  int local_rank = 0;                    // LOCAL_RANK
  std::optional<int> local_world_size;   // LOCAL_WORLD_SIZE
  std::optional<int> group_rank;         // GROUP_RANK (the node's rank)
  std::optional<int> group_world_size;   // GROUP_WORLD_SIZE (number of nodes)
  std::optional<int> role_rank;          // ROLE_RANK
  std::optional<std::string> role_name;  // ROLE_NAME
  std::optional<int> role_world_size;    // ROLE_WORLD_SIZE
  std::string master_addr;               // MASTER_ADDR
  int master_port = 0;                   // MASTER_PORT
  int restart_count = 0;                 // TORCHELASTIC_RESTART_COUNT (0 if unset)
  int max_restarts = 0;                  // TORCHELASTIC_MAX_RESTARTS (0 if unset)
  std::optional<std::string> run_id;     // TORCHELASTIC_RUN_ID
  // TORCHELASTIC_USE_AGENT_STORE: true when MASTER_ADDR:MASTER_PORT is a
  // TCPStore the agent already serves (workers then only connect to it).
  bool use_agent_store = false;
  std::optional<std::string> error_file;  // TORCHELASTIC_ERROR_FILE
  // MESHRUN_STORE_ENDPOINT ("host:port" of meshrun-rdzvd) and
  // MESHRUN_STORE_PREFIX (this round's store namespace): both or neither.
  std::optional<std::string> store_endpoint;
  std::optional<std::string> store_prefix;

  // Started by meshrun (its store is available).
  bool has_meshrun_store() const { return store_endpoint.has_value(); }
};

// Parses `env` (variable name -> value). Errors name every missing required
// variable at once ("RANK is not set: start this program with meshrun (or
// torchrun)", FAILED_PRECONDITION), or the first invalid one with its value
// and the rule it breaks (INVALID_ARGUMENT).
absl::StatusOr<WorkerEnv> ParseWorkerEnv(const std::map<std::string, std::string>& env);

// ParseWorkerEnv over this process's environment (`environ`).
absl::StatusOr<WorkerEnv> WorkerEnvFromProcessEnvironment();

// True for "localhost", 127.0.0.0/8 and ::1 (no name resolution).
bool IsLoopbackAddress(const std::string& host);

}  // namespace meshrun::worker
