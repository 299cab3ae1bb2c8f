// Fault-tolerant replicas over a user's torch::nn::Module and AdamW
// (module_fault_tolerance.h) under `meshrun --restart-scope=replica`: each
// rank is a replica group of one, training module_net.h's MLP on its rows
// of every step's batch; --kill-at-step N --kill-replica R makes replica R
// SIGKILL itself (first incarnation) at the start of step N. The survivors
// go on; the restarted replica is healed (parameters, AdamW's moments and
// step) from a live one. At the end every replica checks its parameters
// against one process trained on the committed steps, each on the rows of
// the replicas that took part (rtol 1e-5).
//
//   meshrun --standalone --nproc-per-node=4 --restart-scope=replica module_ft_worker
//       --replicas 4 --steps 30 --kill-at-step 10 --kill-replica 2

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "tests/integration/parallel/module_net.h"
#include "worker_lib/env/worker_env.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/training/fault_tolerant.h"
#include "worker_lib/training/module_fault_tolerance.h"

namespace meshrun::worker::parallel::testing {
namespace {

struct Flags {
  int replicas = 4;
  int steps = 30;
  int kill_at_step = -1;
  int kill_replica = -1;
};

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int Train(const Flags& flags) {
  WorkerEnv env = ValueOrFail(WorkerEnvFromProcessEnvironment(), "environment");
  ReplicaIdentity id =
      ValueOrFail(ReplicaIdentityFromEnv(env, flags.replicas), "identity");
  std::shared_ptr<World> world = ValueOrFail(InitReplicaGroupWorld(id), "replica world");
  Say("rank " + std::to_string(env.rank) + " pid " + std::to_string(getpid()) +
      ": replica " + std::to_string(id.replica) + " incarnation " +
      std::to_string(id.incarnation));
  FaultToleranceOptions options;
  options.steps = static_cast<uint64_t>(flags.steps);
  auto replicas =
      ValueOrFail(FaultTolerantReplicas::Create(world, id, options), "replicas");

  Net net = MakeNet();
  torch::optim::AdamW optimizer(net->parameters(), Adam());
  ModuleTrainingState state(*net, optimizer);
  while (true) {
    absl::StatusOr<StepQuorum> quorum = replicas->BeginStep(state);
    if (absl::IsOutOfRange(quorum.status())) return 0;  // came back after the end
    CheckOk(quorum.status(), "quorum");
    if (!quorum->participating) continue;
    if (quorum->healed) {
      Say("replica " + std::to_string(id.replica) + " healed from replica " +
          std::to_string(quorum->source_replica) + " at step " +
          std::to_string(quorum->step));
    }
    const int step = static_cast<int>(quorum->step);
    if (step >= flags.steps) break;
    if (step == flags.kill_at_step && id.replica == flags.kill_replica &&
        id.incarnation == 0) {
      Say("replica " + std::to_string(id.replica) + " SIGKILLs itself at step " +
          std::to_string(step));
      raise(SIGKILL);
    }
    Batch data = SyntheticBatch(kDataSeed, step, kBatch, kIn, kOut);
    optimizer.zero_grad();
    at::Tensor loss =
        MseLoss(Forward(net, DataShard(data.input, flags.replicas, id.replica)),
                DataShard(data.target, flags.replicas, id.replica));
    loss.backward();
    double value = loss.item<double>();
    absl::StatusOr<bool> commit = replicas->Sync(state.params(), &value);
    CheckOk(commit.status(), "sync");
    if (!*commit) continue;  // discarded everywhere: trained again
    optimizer.step();
    if (id.replica == static_cast<int>(quorum->participants[0]))
      Say("step " + std::to_string(step) + " loss " + std::to_string(value));
  }

  // One process, the committed steps, each on its participants' rows.
  Net reference = MakeNet();
  torch::optim::AdamW reference_optimizer(reference->parameters(), Adam());
  const auto& history = replicas->history();
  size_t partial = 0;
  for (size_t step = 0; step < history.size(); ++step) {
    Batch data = SyntheticBatch(kDataSeed, static_cast<int64_t>(step), kBatch, kIn, kOut);
    std::vector<at::Tensor> inputs, targets;
    for (uint32_t r : history[step]) {
      inputs.push_back(DataShard(data.input, flags.replicas, r));
      targets.push_back(DataShard(data.target, flags.replicas, r));
    }
    partial += history[step].size() < static_cast<size_t>(flags.replicas);
    reference_optimizer.zero_grad();
    MseLoss(reference->forward(at::cat(inputs)), at::cat(targets)).backward();
    reference_optimizer.step();
  }
  auto mine = net->named_parameters();
  for (const auto& item : reference->named_parameters())
    ExpectClose("final " + item.key(), mine[item.key()], item.value());
  Say("verified rank " + std::to_string(env.rank) + " pid " + std::to_string(getpid()) +
      ": equal one process trained on " + std::to_string(history.size()) +
      " committed steps (" + std::to_string(partial) + " without every replica)");
  world->group()->barrier()->wait();
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main(int argc, char** argv) {
  CLI::App app{"Fault-tolerant replicas over a torch::nn::Module and AdamW"};
  meshrun::worker::parallel::testing::Flags flags;
  app.add_option("--replicas", flags.replicas);
  app.add_option("--steps", flags.steps);
  app.add_option("--kill-at-step", flags.kill_at_step);
  app.add_option("--kill-replica", flags.kill_replica);
  CLI11_PARSE(app, argc, argv);
  return meshrun::worker::parallel::testing::Train(flags);
}
