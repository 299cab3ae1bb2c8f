#include "agent/worker_env.h"

namespace meshrun::agent {

std::map<std::string, std::string> BuildWorkerEnv(const WorkerEnvInputs& in) {
  const int rank = static_cast<int>(in.round.rank_base) + in.local_rank;
  std::map<std::string, std::string> env{
      {"LOCAL_RANK", std::to_string(in.local_rank)},
      {"RANK", std::to_string(rank)},
      {"GROUP_RANK", std::to_string(in.round.group_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(in.round.group_world_size)},
      // One role per job, so the role's ranks are the global ones.
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_NAME", in.role},
      {"ROLE_WORLD_SIZE", std::to_string(in.round.world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(in.local_world_size)},
      {"WORLD_SIZE", std::to_string(in.round.world_size)},
      {"MASTER_ADDR", in.master_addr},
      {"MASTER_PORT", std::to_string(in.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(in.round.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(in.max_restarts)},
      {"TORCHELASTIC_RUN_ID", in.run_id},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"TORCHELASTIC_ERROR_FILE", in.error_file},
      {"MESHRUN_STORE_ENDPOINT", in.store_endpoint},
      {"MESHRUN_STORE_PREFIX", in.round.store_prefix},
  };
  // torchrun 1.13 sets this for NCCL unless the user did.
  if (!in.has_nccl_async_error_handling) env["NCCL_ASYNC_ERROR_HANDLING"] = "1";
  // Several workers each using every core oversubscribe the node.
  if (!in.has_omp_num_threads && in.local_world_size > 1) env["OMP_NUM_THREADS"] = "1";
  return env;
}

}  // namespace meshrun::agent
