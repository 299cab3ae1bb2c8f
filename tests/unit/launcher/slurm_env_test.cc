#include "launcher/slurm_env.h"

#include <csignal>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "launcher/launch_config.h"

namespace meshrun::launcher {
namespace {

using Env = std::map<std::string, std::string>;
using Args = std::vector<std::string>;

// What srun -N2 --ntasks-per-node=1 gave the task on the first node of a
// Debian slurmd 22.05 cluster (trimmed to what matters).
Env SrunStep(int node_id = 0) {
  return {
      {"SLURM_JOB_ID", "1"},
      {"SLURM_JOBID", "1"},
      {"SLURM_STEP_ID", "0"},
      {"SLURM_STEPID", "0"},
      {"SLURM_JOB_NUM_NODES", "2"},
      {"SLURM_NNODES", "2"},
      {"SLURM_STEP_NUM_NODES", "2"},
      {"SLURM_JOB_NODELIST", "n[1-2]"},
      {"SLURM_NODELIST", "n[1-2]"},
      {"SLURM_STEP_NODELIST", "n[1-2]"},
      {"SLURM_NODEID", std::to_string(node_id)},
      {"SLURM_LOCALID", "0"},
      {"SLURM_PROCID", std::to_string(node_id)},
      {"SLURM_NTASKS", "2"},
      {"SLURM_NTASKS_PER_NODE", "1"},
      {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
      {"SLURM_TASKS_PER_NODE", "1(x2)"},
  };
}

Env With(Env env, const Env& changes, const std::vector<std::string>& removed = {}) {
  for (const auto& [name, value] : changes) env[name] = value;
  for (const auto& name : removed) env.erase(name);
  return env;
}

std::string Endpoint(const std::string& host, const std::string& run_id) {
  return absl::StrCat(host, ":", SlurmRendezvousPort(run_id));
}

struct Expected {
  std::string nnodes;
  std::string node_rank;
  std::string rdzv_id;
  std::string rdzv_endpoint;
  std::optional<std::string> nproc;  // nullopt: SLURM does not say
};

struct Row {
  std::string name;
  Env env;
  Expected expected;
};

TEST(SlurmEnvTest, MapsEnvironmentsToFlags) {
  const Row kRows[] = {
      {"srun step, first node",
       SrunStep(0),
       {"2", "0", "1.0", Endpoint("n1", "1.0"), "1"}},
      {"srun step, second node",
       SrunStep(1),
       {"2", "1", "1.0", Endpoint("n1", "1.0"), "1"}},
      {"GPUs on the node win over tasks per node",
       With(SrunStep(), {{"SLURM_GPUS_ON_NODE", "4"}}),
       {"2", "0", "1.0", Endpoint("n1", "1.0"), "4"}},
      {"zero GPUs fall back to tasks per node",
       With(SrunStep(), {{"SLURM_GPUS_ON_NODE", "0"}, {"SLURM_NTASKS_PER_NODE", "3"}}),
       {"2", "0", "1.0", Endpoint("n1", "1.0"), "3"}},
      {"neither GPUs nor tasks per node: the flag decides",
       With(SrunStep(), {}, {"SLURM_NTASKS_PER_NODE"}),
       {"2", "0", "1.0", Endpoint("n1", "1.0"), std::nullopt}},
      {"a step on a subset of the job's nodes uses the step's",
       With(SrunStep(), {{"SLURM_JOB_NUM_NODES", "3"},
                         {"SLURM_JOB_NODELIST", "n[1-3]"},
                         {"SLURM_NNODES", "1"},
                         {"SLURM_STEP_NUM_NODES", "1"},
                         {"SLURM_STEP_NODELIST", "n2"},
                         {"SLURM_STEP_ID", "3"},
                         {"SLURM_STEP_TASKS_PER_NODE", "1"}}),
       {"1", "0", "1.3", Endpoint("n2", "1.3"), "1"}},
      {"the batch script of a one-node job (no step)",
       {{"SLURM_JOB_ID", "77"},
        {"SLURM_JOB_NUM_NODES", "1"},
        {"SLURM_JOB_NODELIST", "gpu-a08"},
        {"SLURM_NODEID", "0"},
        {"SLURM_GPUS_ON_NODE", "8"},
        {"SLURM_TASKS_PER_NODE", "8"}},
       {"1", "0", "77", Endpoint("gpu-a08", "77"), "8"}},
      {"old variable names only (SLURM_JOBID, SLURM_STEPID, SLURM_NODELIST)",
       With(SrunStep(1), {},
            {"SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
             "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES"}),
       {"2", "1", "1.0", Endpoint("n1", "1.0"), "1"}},
      {"several prefixes and zero padding: the first host hosts",
       With(SrunStep(2), {{"SLURM_STEP_NODELIST", "gpu-a[08-09],gpu-b01"},
                          {"SLURM_STEP_NUM_NODES", "3"},
                          {"SLURM_STEP_TASKS_PER_NODE", "1(x3)"}}),
       {"3", "2", "1.0", Endpoint("gpu-a08", "1.0"), "1"}},
      {"a big job id and step",
       With(SrunStep(), {{"SLURM_JOB_ID", "123456789"}, {"SLURM_STEP_ID", "12"}}),
       {"2", "0", "123456789.12", Endpoint("n1", "123456789.12"), "1"}},
      {"a one-node step without SLURM_NODEID",
       With(SrunStep(),
            {{"SLURM_STEP_NUM_NODES", "1"},
             {"SLURM_STEP_NODELIST", "n1"},
             {"SLURM_STEP_TASKS_PER_NODE", "1"}},
            {"SLURM_NODEID"}),
       {"1", "0", "1.0", Endpoint("n1", "1.0"), "1"}},
  };
  for (const Row& row : kRows) {
    SCOPED_TRACE(row.name);
    auto flags = SlurmFlagsFromEnv(row.env);
    ASSERT_TRUE(flags.ok()) << flags.status();
    EXPECT_EQ(flags->nnodes.text, row.expected.nnodes);
    EXPECT_EQ(flags->node_rank.text, row.expected.node_rank);
    EXPECT_EQ(flags->rdzv_id.text, row.expected.rdzv_id);
    EXPECT_EQ(flags->rdzv_endpoint.text, row.expected.rdzv_endpoint);
    ASSERT_EQ(flags->nproc_per_node.has_value(), row.expected.nproc.has_value());
    if (row.expected.nproc) {
      EXPECT_EQ(flags->nproc_per_node->text, *row.expected.nproc);
    }
  }
}

TEST(SlurmEnvTest, NamesTheVariableEachValueCameFrom) {
  auto flags = SlurmFlagsFromEnv(With(SrunStep(1), {{"SLURM_GPUS_ON_NODE", "2"}}));
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->nnodes, (SlurmValue{"2", "SLURM_STEP_NUM_NODES"}));
  EXPECT_EQ(flags->node_rank, (SlurmValue{"1", "SLURM_NODEID"}));
  EXPECT_EQ(flags->rdzv_id, (SlurmValue{"1.0", "SLURM_JOB_ID+SLURM_STEP_ID"}));
  EXPECT_EQ(flags->rdzv_endpoint.origin, "SLURM_STEP_NODELIST");
  EXPECT_EQ(flags->nproc_per_node, (SlurmValue{"2", "SLURM_GPUS_ON_NODE"}));
}

struct BadRow {
  std::string name;
  Env env;
  std::string message_part;
};

TEST(SlurmEnvTest, RefusesWhatWouldNotFormOneWorld) {
  const BadRow kRows[] = {
      {"not in SLURM",
       {{"HOME", "/root"}},
       "not inside a SLURM job (SLURM_JOB_ID is unset)"},
      {"two tasks per node (srun without --ntasks-per-node=1)",
       With(SrunStep(), {{"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}, {"SLURM_NTASKS", "4"}}),
       "this srun step runs 2 tasks on a node (SLURM_STEP_TASKS_PER_NODE=2(x2))"},
      {"uneven tasks per node", With(SrunStep(), {{"SLURM_STEP_TASKS_PER_NODE", "1,2"}}),
       "runs 2 tasks on a node"},
      {"second task on the node, no task list",
       With(SrunStep(), {{"SLURM_LOCALID", "1"}},
            {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}),
       "SLURM_LOCALID=1: more than one task"},
      {"the batch script of a multi-node job",
       With(SrunStep(), {}, {"SLURM_STEP_ID", "SLURM_STEPID"}),
       "not inside an srun step, but job 1 has 2 nodes"},
      {"malformed node list", With(SrunStep(), {{"SLURM_STEP_NODELIST", "n[1-2"}}),
       "SLURM_STEP_NODELIST: malformed hostlist 'n[1-2': '[' is never closed"},
      {"node list shorter than the node count",
       With(SrunStep(), {{"SLURM_STEP_NODELIST", "n1"}}),
       "SLURM_STEP_NODELIST='n1' names 1 hosts but SLURM_STEP_NUM_NODES=2"},
      {"node id beyond the nodes", With(SrunStep(), {{"SLURM_NODEID", "2"}}),
       "SLURM_NODEID=2 is not below SLURM_STEP_NUM_NODES=2"},
      {"multi-node step without node id", With(SrunStep(), {}, {"SLURM_NODEID"}),
       "SLURM_NODEID is unset"},
      {"no node count",
       With(SrunStep(), {},
            {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}),
       "SLURM_NNODES and SLURM_JOB_NUM_NODES are unset"},
      {"no node list",
       With(SrunStep(), {},
            {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}),
       "SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are unset"},
      {"garbage node count", With(SrunStep(), {{"SLURM_STEP_NUM_NODES", "two"}}),
       "SLURM_STEP_NUM_NODES='two' is not a node count"},
      {"zero nodes", With(SrunStep(), {{"SLURM_STEP_NUM_NODES", "0"}}),
       "is not a node count"},
      {"garbage job id", With(SrunStep(), {{"SLURM_JOB_ID", "1x"}}),
       "SLURM_JOB_ID='1x' is not a job id"},
      {"garbage GPU count", With(SrunStep(), {{"SLURM_GPUS_ON_NODE", "a100:2"}}),
       "SLURM_GPUS_ON_NODE='a100:2' is not a GPU count"},
      {"zero tasks per node", With(SrunStep(), {{"SLURM_NTASKS_PER_NODE", "0"}}),
       "SLURM_NTASKS_PER_NODE='0' is not a task count"},
      {"malformed task list", With(SrunStep(), {{"SLURM_STEP_TASKS_PER_NODE", "1(x"}}),
       "malformed count list '1(x'"},
  };
  for (const BadRow& row : kRows) {
    SCOPED_TRACE(row.name);
    auto flags = SlurmFlagsFromEnv(row.env);
    ASSERT_FALSE(flags.ok());
    EXPECT_EQ(flags.status().code(), absl::StatusCode::kInvalidArgument);
    std::string message(flags.status().message());
    EXPECT_TRUE(absl::StartsWith(message, "--slurm: ")) << message;
    EXPECT_TRUE(absl::StrContains(message, row.message_part)) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  }
}

// --- Through the command line: --slurm's values sit below flags and PET_* ----

HostProbe FakeHost() {
  HostProbe host;
  host.cpu_count = [] { return 8; };
  host.gpu_count = [] { return 0; };
  host.new_run_id = [] { return std::string("standalone-id"); };
  return host;
}

absl::StatusOr<LaunchConfig> Parse(const Args& args, const Env& env) {
  return ParseLaunchArgs(args, env, FakeHost());
}

TEST(SlurmLaunchConfigTest, DerivesEverythingInsideAStep) {
  for (int node : {0, 1}) {
    SCOPED_TRACE(node);
    auto config = Parse({"--slurm", "train.py", "--lr", "0.1"}, SrunStep(node));
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_TRUE(config->slurm);
    EXPECT_EQ(config->min_nodes, 2);
    EXPECT_EQ(config->max_nodes, 2);
    EXPECT_EQ(config->node_rank, node);
    EXPECT_TRUE(config->node_rank_given);
    EXPECT_EQ(config->rdzv_id, "1.0");
    EXPECT_EQ(config->rdzv_endpoint, (HostPort{"n1", SlurmRendezvousPort("1.0")}));
    EXPECT_EQ(config->rdzv_backend, RdzvBackend::kDynamic);
    // The first node serves the rendezvous, whatever its name resolves to.
    ASSERT_TRUE(config->rdzv_conf.is_host.has_value());
    EXPECT_EQ(*config->rdzv_conf.is_host, node == 0);
    EXPECT_EQ(config->nproc_per_node, 1);
    EXPECT_EQ(config->signals_to_handle,
              (std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}));
    EXPECT_EQ(config->script_args, (std::vector<std::string>{"--lr", "0.1"}));
    ASSERT_FALSE(config->notices.empty());
    EXPECT_TRUE(absl::StrContains(config->notices.back(), "--nnodes=2"))
        << config->notices.back();
  }
}

TEST(SlurmLaunchConfigTest, ExplicitFlagsAndPetVariablesWin) {
  auto config = Parse(
      {"--slurm", "--nnodes=1:4", "--nproc-per-node=2", "--rdzv-id=mine", "--node-rank=3",
       "--rdzv-endpoint=rdzv.example:1234", "--signals-to-handle=SIGTERM", "train.py"},
      With(SrunStep(1), {{"SLURM_GPUS_ON_NODE", "8"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->min_nodes, 1);
  EXPECT_EQ(config->max_nodes, 4);
  EXPECT_EQ(config->nproc_per_node, 2);
  EXPECT_EQ(config->rdzv_id, "mine");
  EXPECT_EQ(config->node_rank, 3);
  EXPECT_EQ(config->rdzv_endpoint, (HostPort{"rdzv.example", 1234}));
  // An external endpoint: hosted where it says, not forced onto node 0.
  EXPECT_FALSE(config->rdzv_conf.is_host.has_value());
  EXPECT_EQ(config->signals_to_handle, (std::vector<int>{SIGTERM}));

  config =
      Parse({"--slurm", "train.py"},
            With(SrunStep(0), {{"PET_NPROC_PER_NODE", "3"}, {"PET_RDZV_ID", "pet"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->nproc_per_node, 3);
  EXPECT_EQ(config->rdzv_id, "pet");
  EXPECT_EQ(config->min_nodes, 2);

  // The backend falls back to c10d (elastic), not torchrun's static; a given
  // one wins.
  config = Parse({"--slurm", "--rdzv-backend=static", "train.py"}, SrunStep(1));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rdzv_backend, RdzvBackend::kStatic);
  EXPECT_EQ(config->node_rank, 1);

  // is_host in --rdzv-conf is the user's to set.
  config = Parse({"--slurm", "--rdzv-conf=is_host=false", "train.py"}, SrunStep(0));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rdzv_conf.is_host, std::optional<bool>(false));
}

TEST(SlurmLaunchConfigTest, EnabledByPetSlurmToo) {
  auto config = Parse({"train.py"}, With(SrunStep(1), {{"PET_SLURM", "1"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->slurm);
  EXPECT_EQ(config->node_rank, 1);
  // Without --slurm the SLURM variables are ignored.
  config = Parse({"train.py"}, SrunStep(1));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->slurm);
  EXPECT_EQ(config->max_nodes, 1);
}

TEST(SlurmLaunchConfigTest, ErrorsAreOneLineAndNameTheSource) {
  auto error = [](const Args& args, const Env& env) {
    auto config = Parse(args, env);
    return config.ok() ? std::string("<ok>") : std::string(config.status().message());
  };
  EXPECT_EQ(error({"--slurm", "--standalone", "train.py"}, SrunStep()),
            "--slurm: cannot be combined with --standalone");
  EXPECT_TRUE(absl::StartsWith(error({"--slurm", "train.py"}, {}),
                               "--slurm: not inside a SLURM job"));
  // SLURM's node id against an explicit, smaller --nnodes.
  EXPECT_EQ(error({"--slurm", "--nnodes=1", "train.py"}, SrunStep(1)),
            "--node-rank: must be below the maximum node count 1, got 1 (from "
            "SLURM_NODEID)");
  EXPECT_TRUE(
      absl::StrContains(error({"--slurm", "train.py"},
                              With(SrunStep(), {{"SLURM_STEP_TASKS_PER_NODE", "4(x2)"}})),
                        "runs 4 tasks on a node"));
}

}  // namespace
}  // namespace meshrun::launcher
