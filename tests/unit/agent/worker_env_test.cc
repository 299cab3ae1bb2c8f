#include "agent/worker_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace meshrun::agent {
namespace {

WorkerEnvInputs Inputs(int local_rank, int local_world_size) {
  WorkerEnvInputs in;
  in.run_id = "job";
  in.local_rank = local_rank;
  in.local_world_size = local_world_size;
  in.max_restarts = 3;
  in.round.rank_base = 4;
  in.round.group_rank = 1;
  in.round.group_world_size = 2;
  in.round.world_size = 8;
  in.round.restart_count = 2;
  in.round.store_prefix = "job/e1.r3";
  // The daemon's TCPStore front-end, as torchrun's agent store.
  in.master_addr = "node0";
  in.master_port = 29400;
  in.use_agent_store = true;
  in.store_endpoint = "node0:29400";
  in.error_file = "/logs/attempt_2/1/error.json";
  return in;
}

// What torchrun 2.15's LocalElasticAgent._start_workers sets (plus the
// variables its launcher puts into its own environment), for the same round.
TEST(AgentWorkerEnvTest, TorchrunTwosVariables) {
  std::map<std::string, std::string> env = BuildWorkerEnv(Inputs(1, 4));
  const std::map<std::string, std::string> expected = {
      {"LOCAL_RANK", "1"},
      {"RANK", "5"},
      {"GROUP_RANK", "1"},
      {"GROUP_WORLD_SIZE", "2"},
      {"ROLE_RANK", "5"},
      {"ROLE_NAME", "default"},
      {"ROLE_WORLD_SIZE", "8"},
      {"LOCAL_WORLD_SIZE", "4"},
      {"WORLD_SIZE", "8"},
      {"MASTER_ADDR", "node0"},
      {"MASTER_PORT", "29400"},
      {"TORCHELASTIC_RESTART_COUNT", "2"},
      {"TORCHELASTIC_MAX_RESTARTS", "3"},
      {"TORCHELASTIC_RUN_ID", "job"},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"},
      {"TORCHELASTIC_ERROR_FILE", "/logs/attempt_2/1/error.json"},
      {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"OMP_NUM_THREADS", "1"},
      {"MESHRUN_STORE_ENDPOINT", "node0:29400"},
      {"MESHRUN_STORE_PREFIX", "job/e1.r3"},
  };
  EXPECT_EQ(env, expected);
  // torch 1.x's name is gone.
  EXPECT_EQ(env.count("NCCL_ASYNC_ERROR_HANDLING"), 0u);
}

// A daemon that wants a token or TLS: stock TCPStore clients cannot reach it,
// so rank 0's worker serves a TCPStore on the port group rank 0 offered.
TEST(AgentWorkerEnvTest, WithoutTheAgentStoreRankZeroServesOne) {
  WorkerEnvInputs in = Inputs(1, 4);
  in.use_agent_store = false;
  in.master_port = 1234;
  std::map<std::string, std::string> env = BuildWorkerEnv(in);
  EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "False");
  EXPECT_EQ(env["MASTER_ADDR"], "node0");
  EXPECT_EQ(env["MASTER_PORT"], "1234");
  EXPECT_EQ(env["MESHRUN_STORE_ENDPOINT"], "node0:29400");
}

TEST(AgentWorkerEnvTest, TheUsersValuesWin) {
  WorkerEnvInputs in = Inputs(0, 2);
  in.has_omp_num_threads = true;
  in.torch_nccl_async_error_handling = "3";
  in.signals_to_handle = "SIGUSR1";
  std::map<std::string, std::string> env = BuildWorkerEnv(in);
  EXPECT_EQ(env.count("OMP_NUM_THREADS"), 0u);  // inherited as it is
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "3");
  EXPECT_EQ(env["TORCHELASTIC_SIGNALS_TO_HANDLE"], "SIGUSR1");
  // One worker does not oversubscribe the node.
  EXPECT_EQ(BuildWorkerEnv(Inputs(0, 1)).count("OMP_NUM_THREADS"), 0u);
}

TEST(AgentWorkerEnvTest, VirtualLocalRank) {
  WorkerEnvInputs in = Inputs(1, 2);
  in.virtual_local_rank = true;
  std::map<std::string, std::string> env = BuildWorkerEnv(in);
  EXPECT_EQ(env["LOCAL_RANK"], "0");
  EXPECT_EQ(env["RANK"], "5");
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "1");  // no list: GPU = local rank
  EXPECT_EQ(env.count("HIP_VISIBLE_DEVICES"), 0u);

  in.cuda_visible_devices = "4, 6";
  EXPECT_EQ(BuildWorkerEnv(in)["CUDA_VISIBLE_DEVICES"], "6");

  in.hip_visible_devices = "7,9";
  env = BuildWorkerEnv(in);
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "9");
  EXPECT_EQ(env["HIP_VISIBLE_DEVICES"], "9");

  // Without the flag, CUDA_VISIBLE_DEVICES is inherited untouched.
  in.virtual_local_rank = false;
  env = BuildWorkerEnv(in);
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u);
}

// --restart-scope=replica (issue 18): the replica group and its restarts;
// TORCHELASTIC_RESTART_COUNT stays the run's count.
TEST(AgentWorkerEnvTest, ReplicaScopeNamesTheReplicaGroup) {
  WorkerEnvInputs in = Inputs(3, 4);  // rank 7
  in.replica_size = 2;
  in.replica_restarts = 1;
  in.num_replicas = 6;
  in.round.admission_epoch = (uint64_t{3} << 32) | 5;
  std::map<std::string, std::string> env = BuildWorkerEnv(in);
  EXPECT_EQ(env["MESHRUN_RESTART_SCOPE"], "replica");
  EXPECT_EQ(env["MESHRUN_ADMISSION_EPOCH"], "12884901893");
  EXPECT_EQ(env["MESHRUN_REPLICA_SIZE"], "2");
  EXPECT_EQ(env["MESHRUN_REPLICA_ID"], "3");
  EXPECT_EQ(env["MESHRUN_REPLICA_RESTARTS"], "1");
  EXPECT_EQ(env["MESHRUN_NUM_REPLICAS"], "6");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "2");
  // Scope job: none of them.
  env = BuildWorkerEnv(Inputs(3, 4));
  for (const char* name :
       {"MESHRUN_RESTART_SCOPE", "MESHRUN_REPLICA_SIZE", "MESHRUN_REPLICA_ID",
        "MESHRUN_REPLICA_RESTARTS", "MESHRUN_ADMISSION_EPOCH", "MESHRUN_NUM_REPLICAS"})
    EXPECT_EQ(env.count(name), 0u) << name;
}

}  // namespace
}  // namespace meshrun::agent
