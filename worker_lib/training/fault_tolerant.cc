#include "worker_lib/training/fault_tolerant.h"

#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/client/store_client.h"
#include "rendezvous/security/security.h"

namespace meshrun::worker::parallel {

namespace v1 = meshrun::v1;

namespace {

// An optional non-negative integer variable; -1 when unset.
absl::StatusOr<int> IntFromEnv(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return -1;
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=", value, " is not a non-negative integer"));
  }
  return parsed;
}

// An optional unsigned 64-bit variable; 0 when unset.
absl::StatusOr<uint64_t> U64FromEnv(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return 0;
  uint64_t parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=", value, " is not a non-negative integer"));
  }
  return parsed;
}

std::string FirstLine(const std::exception& e) {
  std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

// Every param's grad (zeros where none) and the loss, in one flat buffer of
// the grads' dtype: what the replicas all-reduce.
at::Tensor FlattenGradsAndLoss(const std::vector<std::shared_ptr<Param>>& params,
                               double loss) {
  std::vector<at::Tensor> parts;
  for (const auto& param : params) {
    const at::Tensor& grad = param->data().grad();
    parts.push_back(grad.defined()
                        ? grad.detach().flatten()
                        : at::zeros({param->data().numel()}, param->data().options()));
  }
  const at::TensorOptions options =
      parts.empty() ? at::TensorOptions().dtype(at::kFloat) : parts.front().options();
  parts.push_back(at::full({1}, loss, options));
  return at::cat(parts);
}

// The reverse: `flat` into every param's grad and *loss.
void UnflattenGradsAndLoss(const at::Tensor& flat,
                           const std::vector<std::shared_ptr<Param>>& params,
                           double* loss) {
  int64_t offset = 0;
  for (const auto& param : params) {
    at::Tensor data = param->data();
    const int64_t n = data.numel();
    at::Tensor value = flat.narrow(0, offset, n).view(data.sizes());
    if (data.grad().defined()) {
      data.mutable_grad().copy_(value);
    } else {
      data.mutable_grad() = value.clone();
    }
    offset += n;
  }
  *loss = flat[offset].item<double>();
}

bool Retryable(const absl::Status& status) {
  // The daemon restarting, or no group complete in time: arrive again.
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
}

}  // namespace

absl::StatusOr<ReplicaIdentity> ReplicaIdentityFromEnv(const WorkerEnv& env,
                                                       int num_replicas) {
  if (!env.has_meshrun_store()) {
    return absl::FailedPreconditionError(
        "the fault-tolerant mode needs meshrun's daemon (MESHRUN_STORE_ENDPOINT): start "
        "this program with meshrun");
  }
  auto size = IntFromEnv("MESHRUN_REPLICA_SIZE");
  auto replica = IntFromEnv("MESHRUN_REPLICA_ID");
  auto restarts = IntFromEnv("MESHRUN_REPLICA_RESTARTS");
  for (const auto* parsed : {&size, &replica, &restarts})
    if (!parsed->ok()) return parsed->status();
  ReplicaIdentity id;
  id.env = env;
  id.run_id = env.run_id.value_or("");
  if (id.run_id.empty()) {
    return absl::FailedPreconditionError(
        "TORCHELASTIC_RUN_ID is not set: the daemon's quorum is per run");
  }
  if (num_replicas < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the number of replica groups is ", num_replicas));
  }
  id.num_replicas = num_replicas;
  if (*size > 0) {
    // meshrun's groups: the world holds up to num_replicas of them (fewer
    // while an elastic job has not yet reached its full size).
    id.replica_size = *size;
    if (env.world_size % *size != 0 || env.world_size / *size > num_replicas) {
      return absl::InvalidArgumentError(
          absl::StrCat("meshrun runs replica groups of ", *size,
                       " workers (--replica-size), but a world of ", env.world_size,
                       " does not hold ", num_replicas, " or fewer of them"));
    }
  } else {
    if (env.world_size % num_replicas != 0) {
      return absl::InvalidArgumentError(absl::StrCat("WORLD_SIZE ", env.world_size,
                                                     " does not split into ",
                                                     num_replicas, " replica groups"));
    }
    id.replica_size = env.world_size / num_replicas;
  }
  id.replica_scope = *size > 0;
  id.replicas_in_world = env.world_size / id.replica_size;
  id.replica = env.rank / id.replica_size;
  id.member = env.rank % id.replica_size;
  if (*replica >= 0 && *replica != id.replica) {
    return absl::InvalidArgumentError(absl::StrCat("MESHRUN_REPLICA_ID=", *replica,
                                                   " but rank ", env.rank,
                                                   " is in replica ", id.replica));
  }
  id.incarnation = std::max(0, *restarts);
  auto admission = U64FromEnv("MESHRUN_ADMISSION_EPOCH");
  if (!admission.ok()) return admission.status();
  id.admission = *admission;
  return id;
}

std::string RestartScopeWarning(const ReplicaIdentity& id) {
  if (id.replica_scope) return "";
  return "warning: meshrun runs this job with --restart-scope=job, so a failure restarts "
         "every replica group and the fault-tolerant training starts over from step 0; "
         "start it with meshrun --restart-scope=replica --replica-size=" +
         std::to_string(id.replica_size) + " so that only the failed group restarts";
}

absl::StatusOr<std::shared_ptr<World>> InitReplicaGroupWorld(const ReplicaIdentity& id,
                                                             InitOptions options) {
  WorkerEnv env = id.env;
  env.rank = id.member;
  env.world_size = id.replica_size;
  options.env = env;
  options.store = StoreKind::kMeshrun;
  // The admission keeps a slot's occupants apart (each counts its
  // incarnations from 0): a newcomer must not read a lost group's addresses.
  options.store_prefix =
      absl::StrCat("ft/replica", id.replica, "/",
                   id.admission != 0 ? absl::StrCat("admission", id.admission, "/") : "",
                   "incarnation", id.incarnation, "/");
  return InitProcessGroup("gloo", std::move(options));
}

FaultTolerantReplicas::FaultTolerantReplicas(std::shared_ptr<World> world,
                                             ReplicaIdentity id,
                                             FaultToleranceOptions options)
    : world_(std::move(world)), id_(std::move(id)), options_(std::move(options)) {}

FaultTolerantReplicas::~FaultTolerantReplicas() = default;

absl::StatusOr<std::unique_ptr<FaultTolerantReplicas>> FaultTolerantReplicas::Create(
    std::shared_ptr<World> world, ReplicaIdentity id, FaultToleranceOptions options) {
  // A survivor writing to a dead replica's socket must get EPIPE (a Gloo
  // error: the step is discarded), not die of SIGPIPE, as it did in the
  // recovery benchmark (Gloo sends without MSG_NOSIGNAL; Python ignores
  // SIGPIPE, a C++ program may not). A handler of the program's own stays.
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ignore, nullptr);
  }
  auto security = rdzv::ClientSecurityFromEnvironment(std::getenv);
  if (!security.ok()) return security.status();
  std::unique_ptr<FaultTolerantReplicas> replicas(
      new FaultTolerantReplicas(std::move(world), std::move(id), std::move(options)));
  replicas->daemon_ = std::make_unique<rdzv::RendezvousClient>(rdzv::MakeStoreChannel(
      *replicas->id_.env.store_endpoint, /*own_connection=*/false, *security));
  replicas->daemon_->set_call_timeout(std::chrono::seconds(10));
  return replicas;
}

absl::StatusOr<StepQuorum> FaultTolerantReplicas::BeginStep(TrainingState& state) {
  v1::QuorumRequest request;
  request.set_run_id(id_.run_id);
  request.set_replica(id_.replica);
  request.set_member(id_.member);
  request.set_replica_size(id_.replica_size);
  request.set_num_replicas(id_.replicas_in_world);
  request.set_committed_steps(committed_steps_);
  request.set_incarnation(id_.incarnation);
  request.set_timeout_ms(static_cast<uint32_t>(options_.quorum_timeout.count()));
  request.set_finished(options_.steps > 0 && committed_steps_ >= options_.steps);
  request.set_admission_epoch(id_.admission);
  // A daemon restarting, or a quorum no group completed: try again for a
  // while (the agent's lease bounds how long a daemon may be away).
  const auto give_up = std::chrono::steady_clock::now() + 3 * options_.quorum_timeout;
  absl::StatusOr<v1::QuorumReply> reply = daemon_->Quorum(request);
  while (!reply.ok() && Retryable(reply.status()) &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    reply = daemon_->Quorum(request);
  }
  if (!reply.ok()) {
    return absl::Status(reply.status().code(),
                        absl::StrCat("step quorum: ", reply.status().message()));
  }

  StepQuorum quorum;
  quorum.participants.assign(reply->participants().begin(), reply->participants().end());
  quorum.step = reply->max_committed_steps();
  auto me = std::find(quorum.participants.begin(), quorum.participants.end(),
                      static_cast<uint32_t>(id_.replica));
  quorum.participating = me != quorum.participants.end();
  if (!quorum.participating) return quorum;  // late: the next quorum has us
  quorum_id_ = reply->quorum_id();
  participants_ = quorum.participants;

  if (!group_ || reply->group_id() != group_id_) {
    group_.reset();  // the old group's pairs close before the new one forms
    group_id_ = 0;
    GroupOptions group_options;
    group_options.timeout = options_.collective_timeout;
    auto group = NewGroupOutsideWorld(
        *world_, absl::StrCat("ft/group", reply->group_id(), "/member", id_.member, "/"),
        static_cast<int>(me - quorum.participants.begin()),
        static_cast<int>(quorum.participants.size()), group_options);
    if (!group.ok()) {
      // Not fatal: the others fail the same way, the step is discarded, and
      // the next quorum names a new group.
      last_discard_reason_ = std::string(group.status().message());
      return quorum;
    }
    group_ = *group;
    group_id_ = reply->group_id();
  }
  if (reply->heal()) {
    auto source = std::find(quorum.participants.begin(), quorum.participants.end(),
                            reply->source_replica());
    const int source_index = static_cast<int>(source - quorum.participants.begin());
    quorum.healed = committed_steps_ < reply->max_committed_steps();
    quorum.source_replica = static_cast<int>(reply->source_replica());
    if (absl::Status healed = Heal(state, source_index); !healed.ok()) {
      group_.reset();
      group_id_ = 0;
      last_discard_reason_ = std::string(healed.message());
      if (quorum.healed) {
        // Our params may be half copied: arrive as the least advanced, so
        // that the next quorum heals us again. (A replica as advanced as
        // the source received its own values, if anything.)
        committed_steps_ = 0;
        history_.clear();
      }
      quorum.healed = false;
    }
  }
  return quorum;
}

absl::Status FaultTolerantReplicas::Heal(TrainingState& training_state,
                                         int source_index) {
  // The step count and history, flattened as [steps, n, p0..p(n-1), n, ...].
  std::vector<int64_t> state{static_cast<int64_t>(committed_steps_)};
  for (const auto& participants : history_) {
    state.push_back(static_cast<int64_t>(participants.size()));
    state.insert(state.end(), participants.begin(), participants.end());
  }
  at::Tensor length = at::tensor({static_cast<int64_t>(state.size())}, at::kLong);
  c10d::BroadcastOptions from_source;
  from_source.rootRank = source_index;
  try {
    std::vector<at::Tensor> header{length};
    group_->broadcast(header, from_source)->wait();
    at::Tensor flat = at::zeros({length.item<int64_t>()}, at::kLong);
    if (group_->getRank() == source_index) flat.copy_(at::tensor(state, at::kLong));
    std::vector<at::Tensor> state_tensors{flat};
    group_->broadcast(state_tensors, from_source)->wait();
    for (const at::Tensor& tensor : training_state.Tensors()) {
      std::vector<at::Tensor> data{tensor};
      group_->broadcast(data, from_source)->wait();
    }
    training_state.Received();
    const int64_t* values = flat.data_ptr<int64_t>();
    const int64_t size = flat.numel();
    std::vector<std::vector<uint32_t>> history;
    int64_t i = 1;
    while (i < size) {
      const int64_t n = values[i++];
      std::vector<uint32_t> participants;
      for (int64_t k = 0; k < n && i < size; ++k)
        participants.push_back(static_cast<uint32_t>(values[i++]));
      history.push_back(std::move(participants));
    }
    committed_steps_ = static_cast<uint64_t>(values[0]);
    history_ = std::move(history);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("heal: ", FirstLine(e)));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> FaultTolerantReplicas::Sync(
    const std::vector<std::shared_ptr<Param>>& params, double* loss) {
  if (participants_.empty()) {
    return absl::FailedPreconditionError(
        "FaultTolerantReplicas::Sync without a quorum: call BeginStep first");
  }
  // Every grad and the loss in one buffer: one all-reduce a step.
  at::Tensor flat = FlattenGradsAndLoss(params, *loss);

  bool reduced = group_ != nullptr;
  std::string failure = last_discard_reason_;
  if (group_) {
    try {
      std::vector<at::Tensor> tensors{flat};
      auto work = group_->allreduce(tensors);
      if (options_.fault_injection)
        options_.fault_injection("allreduce", committed_steps_);
      work->wait();
    } catch (const std::exception& e) {
      // Close our pairs now, so that peers blocked on us fail at once
      // rather than at their timeout.
      reduced = false;
      failure = FirstLine(e);
      group_.reset();
      group_id_ = 0;
    }
  }

  v1::CommitRequest vote;
  vote.set_run_id(id_.run_id);
  vote.set_quorum_id(quorum_id_);
  vote.set_replica(id_.replica);
  vote.set_member(id_.member);
  vote.set_ok(reduced);
  vote.set_timeout_ms(static_cast<uint32_t>(options_.commit_timeout.count()));
  vote.set_admission_epoch(id_.admission);
  // A lost answer (a connection reset, the daemon restarting): vote again;
  // the daemon answers a decided step with its decision while it keeps it,
  // and a restarted one says "discard".
  const auto give_up = std::chrono::steady_clock::now() + 3 * options_.commit_timeout;
  auto decision = daemon_->Commit(vote);
  while (!decision.ok() && Retryable(decision.status()) &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    decision = daemon_->Commit(vote);
  }
  if (options_.fault_injection) options_.fault_injection("voted", committed_steps_);
  const std::vector<uint32_t> participants = std::move(participants_);
  participants_.clear();
  bool commit = decision.ok() && decision->commit();
  last_discard_reason_ = !decision.ok() ? std::string(decision.status().message())
                         : !reduced     ? failure
                                        : decision->reason();
  if (world_->size() > 1) {
    // The group's members apply the step together or not at all (see the
    // header): one told "discard" (its answer was lost and the restarted
    // daemon no longer knew the step) makes all discard.
    try {
      at::Tensor agreed = at::tensor({commit ? 1 : 0}, at::kInt);
      std::vector<at::Tensor> tensors{agreed};
      c10d::AllreduceOptions min;
      min.reduceOp = c10d::ReduceOp::MIN;
      world_->group()->allreduce(tensors, min)->wait();
      if (commit && agreed.item<int>() == 0) {
        commit = false;
        last_discard_reason_ =
            "another member of this replica group was not told to commit the step";
      }
    } catch (const std::exception& e) {
      commit = false;
      last_discard_reason_ = absl::StrCat("replica group agreement: ", FirstLine(e));
    }
  }
  if (!commit) return false;
  last_discard_reason_.clear();
  flat.div_(static_cast<double>(participants.size()));
  UnflattenGradsAndLoss(flat, params, loss);
  ++committed_steps_;
  history_.push_back(participants);
  return true;
}

void ReplayedReplicaSync::BeginStep(size_t participants) {
  participants_ = participants;
  seen_ = 0;
  sum_ = at::Tensor();
}

absl::StatusOr<bool> ReplayedReplicaSync::Sync(
    const std::vector<std::shared_ptr<Param>>& params, double* loss) {
  if (seen_ >= participants_) {
    return absl::FailedPreconditionError(
        "ReplayedReplicaSync: more Steps than participants; call BeginStep first");
  }
  at::Tensor flat = FlattenGradsAndLoss(params, *loss);  // a new tensor
  sum_ = seen_ == 0 ? flat : sum_.add_(flat);
  if (++seen_ < participants_) return false;
  sum_.div_(static_cast<double>(participants_));
  UnflattenGradsAndLoss(sum_, params, loss);
  return true;
}

}  // namespace meshrun::worker::parallel
