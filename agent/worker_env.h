#pragma once

// The environment of one worker, exactly as torchrun 2 sets it (so scripts
// written for torchrun run unchanged), plus meshrun's own store endpoint and
// round prefix for the worker library. Pure: no getenv, no I/O; what the
// agent's own environment holds comes in through WorkerEnvInputs.

#include <cstdint>
#include <map>
#include <optional>
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
  // MASTER_ADDR:MASTER_PORT. With use_agent_store, a store workers only
  // connect to (the agent's relay or the daemon's TCPStore front-end);
  // without, a port where rank 0's worker serves a TCPStore itself.
  std::string master_addr;
  int master_port = 0;
  bool use_agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE
  std::string store_endpoint;    // the daemon's host:port
  std::string error_file;        // TORCHELASTIC_ERROR_FILE
  // --signals-to-handle as given (TORCHELASTIC_SIGNALS_TO_HANDLE).
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  // --virtual-local-rank.
  bool virtual_local_rank = false;
  // --restart-scope=replica: workers per replica group (0: restart scope
  // job, none of the MESHRUN_REPLICA_* variables), and how often this
  // worker's replica group has been restarted in this round.
  int replica_size = 0;
  uint32_t replica_restarts = 0;
  // Replica groups at full strength (--nnodes MAX x nproc / replica_size):
  // an elastic job's data shards stay put while nodes come and go.
  int num_replicas = 0;
  // The agent's own environment, where it matters.
  bool has_omp_num_threads = false;
  std::optional<std::string> torch_nccl_async_error_handling;
  std::optional<std::string> cuda_visible_devices;
  std::optional<std::string> hip_visible_devices;
};

// REQUIRES: with virtual_local_rank, the device list in use (HIP's when set
// and non-empty, else CUDA's) has more than local_rank entries (the launcher
// refuses the flag otherwise).
std::map<std::string, std::string> BuildWorkerEnv(const WorkerEnvInputs& in);

}  // namespace meshrun::agent
