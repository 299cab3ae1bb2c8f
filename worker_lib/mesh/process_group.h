#pragma once

// Process groups for C++ workers, as torch.distributed gives them to Python:
// InitProcessGroup (init_process_group with env://) creates the default group
// from the launcher's environment, NewGroup (new_group) creates subgroups.
//
// Under meshrun the groups rendezvous through meshrun-rdzvd's store (a
// GrpcStore on the round's namespace). Started by torchrun (no
// MESHRUN_STORE_ENDPOINT), or with StoreKind::kTcpStore, they use c10d's
// TCPStore at MASTER_ADDR:MASTER_PORT, served by rank 0, as env:// does.
//
// Collective calls: InitProcessGroup and NewGroup must be called by every rank
// of the world, in the same order (NewGroup even by ranks outside the new
// group, with the same `ranks`), as in PyTorch. A rank that skips one leaves
// the others waiting until the timeout.
//
// Thread-safety: a World may be shared between threads, but its collective
// calls (NewGroup) must be issued in the same order on every rank, so in
// practice from one thread. The groups themselves are c10d process groups:
// their collectives must likewise be called in the same order on every member.

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "absl/status/statusor.h"
#include "worker_lib/env/worker_env.h"

namespace gloo::transport {
class Device;
}

namespace meshrun::worker {

enum class StoreKind {
  kAuto,      // TCPStore when it is the agent's store (TORCHELASTIC_USE_AGENT_STORE),
              // else meshrun's store when MESHRUN_STORE_ENDPOINT is set, else TCPStore
  kMeshrun,   // meshrun's store; an error when not started by meshrun
  kTcpStore,  // c10d::TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 serves it)
};

struct InitOptions {
  // The worker's environment; default: WorkerEnvFromProcessEnvironment().
  std::optional<WorkerEnv> env;
  StoreKind store = StoreKind::kAuto;
  // Timeout of collectives and of the groups' rendezvous through the store
  // (torch's default_pg_timeout; torch also makes it the store timeout).
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  // How long to wait for the store itself to answer when connecting.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(60);
  // Gloo's network device, first that applies: `gloo_interface` (or
  // $GLOO_SOCKET_IFNAME, comma-separated for several devices), then
  // `gloo_hostname`, then 127.0.0.1 when MASTER_ADDR is loopback, then the
  // local address that routes to MASTER_ADDR, then c10d's default device.
  std::string gloo_interface;
  std::string gloo_hostname;
  int gloo_threads = 2;  // per group, as in torch
  // A key prefix in the store for this world's groups (default none): for a
  // world of part of the job's processes that may form again while the rest
  // go on, such as a fault-tolerant replica group (replicas.h), each
  // incarnation keying apart.
  std::string store_prefix;
};

struct GroupOptions {
  std::string backend;  // empty: the world's backend
  // The group's collectives and its rendezvous (the store waits Gloo makes
  // while the group forms); default: the world's timeout.
  std::optional<std::chrono::milliseconds> timeout;
};

// The default group and what subgroups are made from. Created by
// InitProcessGroup; keeps every group it created alive until it is destroyed
// (torch keeps them until destroy_process_group).
class World {
 public:
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return env_.rank; }
  int size() const { return env_.world_size; }
  const WorkerEnv& env() const { return env_; }
  const std::string& backend() const { return backend_; }
  // The default group (all ranks; group rank == global rank).
  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const { return group_; }
  // The world's store: a GrpcStore on the round's namespace, or a TCPStore,
  // under InitOptions::store_prefix. Groups use PrefixStores over it ("pg/<n>/").
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  // "meshrun" or "tcpstore".
  const std::string& store_kind() const { return store_kind_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // The global ranks of `group` in group-rank order (sorted), for the default
  // group and any group NewGroup returned; empty for other groups.
  std::vector<int> GroupRanks(const c10d::ProcessGroup& group) const;
  // Global rank of `group_rank` in `group`, or -1 if not one of its ranks.
  int GlobalRank(const c10d::ProcessGroup& group, int group_rank) const;
  // Rank within `group` of global rank `global_rank`, or -1 if not a member.
  int GroupRank(const c10d::ProcessGroup& group, int global_rank) const;

 private:
  friend struct WorldInternals;  // process_group.cc
  World() = default;

  WorkerEnv env_;
  std::string backend_;
  std::string store_kind_;
  std::chrono::milliseconds timeout_{};
  InitOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Store> base_store_;  // store_ without store_prefix
  // Gloo's devices, shared by all groups of this world (a device is a
  // listening socket and an event-loop thread; groups multiplex on it).
  std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;

  mutable std::mutex mu_;
  int next_group_ = 1;  // guarded by mu_; the default group is "pg/0/"
  // Groups this rank is a member of -> their global ranks; guarded by mu_.
  std::map<const c10d::ProcessGroup*, std::vector<int>> group_ranks_;
  std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> groups_;  // guarded by mu_
};

// Creates the default group of `backend` ("gloo", or "nccl" when built with
// NCCL: "meshrun_worker was built without NCCL" otherwise) over all ranks of
// the environment. Collective: every rank calls it. Errors (environment,
// store, rendezvous, unknown backend) are returned, never thrown.
// With "nccl" it first makes the GPU of LOCAL_RANK the current CUDA device
// (the only one when the process sees one), as torch.cuda.set_device(
// LOCAL_RANK) in a torchrun script does; FAILED_PRECONDITION when no GPU is
// visible or LOCAL_RANK has none of its own.
// REQUIRES: one successful call per process and round: the default group
// rendezvouses under "pg/0/" of the round's namespace (meshrun gives every
// restart a fresh namespace).
absl::StatusOr<std::shared_ptr<World>> InitProcessGroup(
    const std::string& backend = "gloo", InitOptions options = {});

// torch.distributed.new_group(ranks): a group of the given global ranks,
// sorted as torch sorts them (group rank = position in the sorted list).
// Collective over the whole world: every rank calls it with the same `ranks`.
// Members get the group; other ranks get a null pointer (and OK). Each call
// rendezvouses under its own store prefix ("pg/<n>/", n counting calls), so
// repeated creations never collide. Members check that they agree on `ranks`
// (FAILED_PRECONDITION naming both lists otherwise). INVALID_ARGUMENT for an
// empty list, a duplicate or an out-of-range rank.
// Ends, like torch's new_group, with a barrier of the whole world through
// the store: no rank returns (members, non-members, and ranks whose part
// failed alike) before every rank has finished its part, so a rank that
// exits right after NewGroup cannot break a peer still connecting to it.
// Rank 0 returns last: it may serve the TCPStore the barrier goes through.
// The barrier waits up to twice the group's timeout (a peer may spend one
// timeout failing its part); UNAVAILABLE, naming how many ranks arrived,
// when it runs out.
absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> NewGroup(
    World& world, std::vector<int> ranks, const GroupOptions& options = {});

// A group whose members are not ranks of this world: `size` processes that
// rendezvous under `store_prefix` of the job's store (the world's store
// without InitOptions::store_prefix), this one as `rank`, e.g. the
// replica-dimension group of fault-tolerant replicas, formed again whenever
// its membership changes. Collective over those processes only; the caller
// owns the group (the world keeps no reference). UNAVAILABLE when the
// rendezvous fails or times out.
absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> NewGroupOutsideWorld(
    World& world, const std::string& store_prefix, int rank, int size,
    const GroupOptions& options = {});

}  // namespace meshrun::worker
