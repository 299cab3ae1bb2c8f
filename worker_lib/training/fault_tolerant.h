#pragma once

// Fault-tolerant replicated training (issue 18): data parallelism across
// replica groups that goes on when one of them fails, as torchft does, with
// the per-step quorum in meshrun's daemon (rendezvous/core/replica_quorum.h).
//
// A replica group is one dp index with its tp / fsdp peers: it trains with
// a ModuleTrainer over its own world (InitReplicaGroupWorld), and
// FaultTolerantReplicas averages the gradients across the groups taking
// part in each step:
//
//   auto id = ReplicaIdentityFromEnv(env, num_replicas).value();
//   auto world = InitReplicaGroupWorld(id).value();
//   auto replicas = FaultTolerantReplicas::Create(world, id, {}).value();
//   auto trainer = ModuleTrainer::Create(world, layout, model, make_optimizer,
//                                        replicas.get()).value();
//   while (true) {
//     StepQuorum q = replicas->BeginStep(trainer->training_state()).value();
//     if (!q.participating) continue;          // arrived late: the next one
//     if (q.step >= steps) break;
//     auto loss = trainer->Step(my rows of batch(q.step));  // kAborted: discarded
//   }
//
// Each step: every member of every live group arrives at the daemon's
// quorum; the participants' replica-dimension group is rebuilt when they
// changed (or the last step was discarded); when someone is behind (a
// restarted group, or one that missed steps), every participant takes part
// in copying the training state from the most advanced one (params, the
// optimizer's state, the committed step count and history). After backward,
// the gradients and the loss are averaged over the participants in one
// all-reduce; every member votes, and the step is applied only when the
// daemon says all votes were ok. A vote whose answer is lost (a connection
// reset, the daemon restarting) is sent again while the daemon keeps the
// decision; then the members of each group agree (a minimum over their own
// world): the group applies the step only if every member was told to
// commit, so that a group never holds shards of two steps, and a group that
// discarded a step others applied is behind by one, healed by the next
// quorum. A step a failure interrupts is discarded
// everywhere and trained again by the survivors (the failed group's rows
// left out); the survivors keep their processes and never reload a
// checkpoint.
//
// Needs meshrun's daemon (MESHRUN_STORE_ENDPOINT): the groups rendezvous in
// the round's namespace, which outlives any one group's restart.
//
// Not thread-safe; one per process.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/param.h"
#include "worker_lib/training/replica_sync.h"

namespace meshrun::rdzv {
class RendezvousClient;
}

namespace meshrun::worker::parallel {

// Who this process is among the replicas.
struct ReplicaIdentity {
  std::string run_id;    // TORCHELASTIC_RUN_ID
  int replica = 0;       // MESHRUN_REPLICA_ID, else RANK / replica_size
  int member = 0;        // rank within the replica group
  int replica_size = 1;  // MESHRUN_REPLICA_SIZE, else WORLD_SIZE / num_replicas
  // The groups at full strength (the data is split among them: --dp).
  int num_replicas = 1;
  // The groups in this process's world (WORLD_SIZE / replica_size): fewer
  // than num_replicas while an elastic job has not reached its full size;
  // a node joining later brings the next ones (replica ids from here on).
  int replicas_in_world = 1;
  int incarnation = 0;  // MESHRUN_REPLICA_RESTARTS, else 0
  // MESHRUN_ADMISSION_EPOCH, else 0: the node's admission into its slot,
  // which the daemon checks at every quorum and vote (the workers of a node
  // that lost its slot are refused once another took it) and which keys the
  // group's store prefix (a slot's next occupant never reads its keys).
  uint64_t admission = 0;
  // Started by meshrun --restart-scope=replica (MESHRUN_REPLICA_SIZE set):
  // only a failed group restarts. Otherwise a failure restarts the world,
  // and training starts over (see RestartScopeWarning).
  bool replica_scope = false;
  WorkerEnv env;  // the worker's
};

// From the worker's environment (meshrun --restart-scope=replica sets
// MESHRUN_REPLICA_*). `num_replicas`: the groups at full strength. Under
// meshrun's replica scope the world may hold fewer (an elastic job that
// grows as nodes join); otherwise it must split into exactly that many.
// INVALID_ARGUMENT when it does not, or holds more; FAILED_PRECONDITION
// without meshrun's store.
absl::StatusOr<ReplicaIdentity> ReplicaIdentityFromEnv(const WorkerEnv& env,
                                                       int num_replicas);

// Empty under meshrun's replica scope; otherwise a one-line warning that
// a failure will restart every replica group, from step 0, for a program
// to print (the launcher's default scope is torchrun's: the whole job).
std::string RestartScopeWarning(const ReplicaIdentity& id);

// The replica group's own world (its members only, as ranks 0..size-1),
// rendezvousing under a store prefix of this admission's and incarnation's
// ("ft/replica<r>/admission<a>/incarnation<i>/").
absl::StatusOr<std::shared_ptr<World>> InitReplicaGroupWorld(const ReplicaIdentity& id,
                                                             InitOptions options = {});

struct FaultToleranceOptions {
  // The training's length: a group that has committed this many steps waits
  // at its last quorum for failed groups that are restarting, and heals
  // them, before it leaves. 0: no end.
  uint64_t steps = 0;
  // How long the daemon waits for missing live groups before a quorum forms
  // without them, and for the votes of a step.
  std::chrono::milliseconds quorum_timeout = std::chrono::seconds(30);
  std::chrono::milliseconds commit_timeout = std::chrono::seconds(30);
  // The replica-dimension group's rendezvous and collectives.
  std::chrono::milliseconds collective_timeout = std::chrono::seconds(20);
  // Test hook: called at named points of a step ("allreduce": the
  // all-reduce was issued and not waited for; "voted"), e.g. to die there.
  std::function<void(const std::string& point, uint64_t step)> fault_injection;
};

// One step's quorum, as this process sees it.
struct StepQuorum {
  bool participating = false;
  uint64_t step = 0;  // the participants' committed steps: the step to train
  std::vector<uint32_t> participants;
  bool healed = false;      // this process received the training state
  int source_replica = -1;  // where it came from when healed
};

// What a heal copies from the most advanced replica, in place: the same
// tensors in the same order on every replica (a replica that has not
// stepped yet makes its optimizer state first, as zeros).
class TrainingState {
 public:
  virtual ~TrainingState() = default;
  virtual std::vector<at::Tensor> Tensors() = 0;
  // After a heal filled Tensors() (to apply what they carry elsewhere,
  // e.g. an optimizer's step counts).
  virtual void Received() {}
};

class FaultTolerantReplicas final : public ReplicaGradientSync {
 public:
  // `world`: the replica group's (InitReplicaGroupWorld). Sets SIGPIPE to
  // be ignored unless the program handles it: a peer's death must be an
  // error here, not this process's end.
  static absl::StatusOr<std::unique_ptr<FaultTolerantReplicas>> Create(
      std::shared_ptr<World> world, ReplicaIdentity id, FaultToleranceOptions options);
  ~FaultTolerantReplicas() override;

  // Joins the next step's quorum (see above). A heal copies `state` in
  // place (module_fault_tolerance.h has one for a torch::nn::Module and its
  // optimizer: this member's shards and the optimizer's state).
  // OUT_OF_RANGE when this group came (back) after the groups that finished
  // training left: nobody can hand it the final state, so it has nothing to
  // do.
  absl::StatusOr<StepQuorum> BeginStep(TrainingState& state);

  // Averages grads and *loss over the step's participants and votes; true
  // when the step commits (the caller applies it). Called by
  // ModuleTrainer::Step.
  absl::StatusOr<bool> Sync(const std::vector<std::shared_ptr<Param>>& params,
                            double* loss) override;

  const ReplicaIdentity& identity() const { return id_; }
  uint64_t committed_steps() const { return committed_steps_; }
  // Each committed step's participants, in order (copied along with a heal,
  // so a restarted group knows the steps taken before it came back).
  const std::vector<std::vector<uint32_t>>& history() const { return history_; }
  // Why the last step was discarded.
  const std::string& last_discard_reason() const { return last_discard_reason_; }

 private:
  FaultTolerantReplicas(std::shared_ptr<World> world, ReplicaIdentity id,
                        FaultToleranceOptions options);
  absl::Status Heal(TrainingState& state, int source_index);

  std::shared_ptr<World> world_;
  ReplicaIdentity id_;
  FaultToleranceOptions options_;
  std::unique_ptr<rdzv::RendezvousClient> daemon_;
  // The replica-dimension group: this member's counterparts in the
  // participating groups, rebuilt when the quorum's group id changes.
  ProcessGroupPtr group_;
  uint64_t group_id_ = 0;
  // The step in progress.
  uint64_t quorum_id_ = 0;
  std::vector<uint32_t> participants_;
  uint64_t committed_steps_ = 0;
  std::vector<std::vector<uint32_t>> history_;
  std::string last_discard_reason_;
};

// Replays a fault-tolerant run's committed steps in one replica group with
// the arithmetic of FaultTolerantReplicas::Sync, to check such a run
// (train_text --replay-history). Per step: BeginStep(n), then one
// ModuleTrainer::Step per participant, in participant order, on that
// participant's rows; the first n - 1 are held back (Step answers ABORTED,
// nothing applied) and the n-th applies the n gradients and losses summed
// in that order and divided by n. That is the replicas' all-reduce bit for
// bit with up to two participants (a + b == b + a); with more, Gloo may sum
// in another order, which differs in the last bits.
class ReplayedReplicaSync final : public ReplicaGradientSync {
 public:
  void BeginStep(size_t participants);
  absl::StatusOr<bool> Sync(const std::vector<std::shared_ptr<Param>>& params,
                            double* loss) override;

 private:
  size_t participants_ = 0;
  size_t seen_ = 0;
  at::Tensor sum_;
};

}  // namespace meshrun::worker::parallel
