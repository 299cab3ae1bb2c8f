#pragma once

// The environment of one worker, exactly as torchrun sets it (so scripts
// written for torchrun run unchanged), plus meshrun's own store endpoint and
// round prefix for the worker library. Pure: no getenv, no I/O.

#include <cstdint>
#include <map>
#include <string>

#include "agent/agent_state.h"

namespace meshrun::agent {

struct WorkerEnvInputs {
  std::string role = "default";
  std::string run_id;
  int local_rank = 0;
  int local_world_size = 1;
  uint32_t max_restarts = 0;
  RoundInfo round;
  std::string master_addr;
  int master_port = 0;
  std::string store_endpoint;  // the daemon's host:port
  std::string error_file;      // TORCHELASTIC_ERROR_FILE
  // Whether the agent's own environment already has these.
  bool has_omp_num_threads = false;
  bool has_nccl_async_error_handling = false;
};

std::map<std::string, std::string> BuildWorkerEnv(const WorkerEnvInputs& in);

}  // namespace meshrun::agent
