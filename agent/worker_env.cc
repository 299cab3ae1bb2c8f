#include "agent/worker_env.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

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
      // torch's own spelling of the boolean (torchrun writes str(bool)).
      {"TORCHELASTIC_USE_AGENT_STORE", in.use_agent_store ? "True" : "False"},
      {"TORCHELASTIC_ERROR_FILE", in.error_file},
      // torchrun 2 sets it in its own environment, which workers inherit.
      {"TORCHELASTIC_SIGNALS_TO_HANDLE", in.signals_to_handle},
      // torchrun 2: the user's value, else 1 (1.x set NCCL_ASYNC_ERROR_HANDLING).
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING",
       in.torch_nccl_async_error_handling.value_or("1")},
      {"MESHRUN_STORE_ENDPOINT", in.store_endpoint},
      {"MESHRUN_STORE_PREFIX", in.round.store_prefix},
  };
  if (in.replica_size > 0) {
    // For the worker library's step quorum; TORCHELASTIC_RESTART_COUNT stays
    // the run's count.
    env["MESHRUN_RESTART_SCOPE"] = "replica";
    env["MESHRUN_REPLICA_SIZE"] = std::to_string(in.replica_size);
    env["MESHRUN_REPLICA_ID"] = std::to_string(rank / in.replica_size);
    env["MESHRUN_REPLICA_RESTARTS"] = std::to_string(in.replica_restarts);
    env["MESHRUN_NUM_REPLICAS"] = std::to_string(in.num_replicas);
    // The step quorum's check of who the worker is, and its group's keys.
    if (in.round.admission_epoch != 0)
      env["MESHRUN_ADMISSION_EPOCH"] = std::to_string(in.round.admission_epoch);
  }
  // Several workers each using every core oversubscribe the node.
  if (!in.has_omp_num_threads && in.local_world_size > 1) env["OMP_NUM_THREADS"] = "1";
  if (in.virtual_local_rank) {
    // Every worker sees its own GPU as device 0.
    env["LOCAL_RANK"] = "0";
    const bool hip =
        in.hip_visible_devices.has_value() && !in.hip_visible_devices->empty();
    const std::optional<std::string>& parent =
        hip ? in.hip_visible_devices : in.cuda_visible_devices;
    std::string device = std::to_string(in.local_rank);
    if (parent.has_value()) {
      std::vector<std::string> devices = absl::StrSplit(*parent, ',');
      if (in.local_rank < static_cast<int>(devices.size())) {
        device = std::string(absl::StripAsciiWhitespace(devices[in.local_rank]));
      }
    }
    env["CUDA_VISIBLE_DEVICES"] = device;
    if (hip) env["HIP_VISIBLE_DEVICES"] = device;
  }
  return env;
}

}  // namespace meshrun::agent
