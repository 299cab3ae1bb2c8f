#include "worker_lib/mesh/process_group.h"

#include <arpa/inet.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#ifndef MESHRUN_WORKER_WITHOUT_GRPC_STORE
#include "worker_lib/mesh/grpc_store.h"
#endif

#ifdef MESHRUN_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace meshrun::worker {

namespace {

// c10 messages carry a C++ backtrace after the first line; a user needs the
// first line.
std::string FirstLine(const std::exception& e) {
  if (auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    return std::string(c10_error->msg().substr(0, c10_error->msg().find('\n')));
  std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

// torch.cuda.set_device(LOCAL_RANK), which every torchrun NCCL script runs
// before init_process_group: the current CUDA device is where CUDA work
// without a device of its own goes (the caching allocator's allocations,
// the current stream, NCCL's barrier), so without it every rank of a node
// would share GPU 0 for those. With one visible device (a scheduler gave
// each process its own through CUDA_VISIBLE_DEVICES) that one. Through
// c10's device-generic guard interface, so that it builds without CUDA's
// headers; a libtorch without CUDA has no CUDA guard and is left to
// MakeGroup's refusal of nccl.
absl::Status SetCudaDeviceFromLocalRank(const WorkerEnv& env) {
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) return absl::OkStatus();
  const c10::impl::DeviceGuardImplInterface* cuda =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  const int count = cuda->deviceCount();
  if (count == 0) {
    return absl::FailedPreconditionError(
        "init_process_group(nccl): no GPU is visible to this process (CUDA counts no "
        "device)");
  }
  const int index = count == 1 ? 0 : env.local_rank;
  if (index >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("init_process_group(nccl): LOCAL_RANK ", env.local_rank,
                     " has no GPU of its own: this process sees ", count,
                     " CUDA devices; start at most ", count, " processes per node"));
  }
  try {
    cuda->setDevice(
        c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)));
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("init_process_group(nccl): cannot make cuda:", index,
                     " the current device: ", FirstLine(e)));
  }
  return absl::OkStatus();
}

// The local address the kernel would use to reach host:port (no packet is
// sent: connecting a UDP socket only chooses the route). Empty on failure.
std::string RouteAddressTo(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0)
    return "";
  std::string address;
  for (addrinfo* ai = found; ai != nullptr && address.empty(); ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw = local.ss_family == AF_INET
                            ? static_cast<const void*>(
                                  &reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                            : static_cast<const void*>(
                                  &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, raw, text, sizeof text) != nullptr) address = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return address;
}

// Gloo's devices for this worker, in InitOptions' order of precedence.
absl::StatusOr<std::vector<std::shared_ptr<::gloo::transport::Device>>> MakeGlooDevices(
    const InitOptions& options, const WorkerEnv& env) {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  std::string interfaces = options.gloo_interface;
  if (interfaces.empty()) {
    if (const char* from_env = std::getenv("GLOO_SOCKET_IFNAME")) interfaces = from_env;
  }
  try {
    if (!interfaces.empty()) {
      for (absl::string_view name : absl::StrSplit(interfaces, ',', absl::SkipEmpty()))
        devices.push_back(
            c10d::ProcessGroupGloo::createDeviceForInterface(std::string(name)));
      return devices;
    }
    std::string hostname = options.gloo_hostname;
    if (hostname.empty() && IsLoopbackAddress(env.master_addr)) hostname = "127.0.0.1";
    if (hostname.empty()) hostname = RouteAddressTo(env.master_addr, env.master_port);
    if (!hostname.empty()) {
      devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
    } else {
      devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot create Gloo's network device: ", FirstLine(e)));
  }
  return devices;
}

// meshrun's gRPC store waits for a key and reads it in one round trip; other
// stores answer nullopt (wait, then get).
std::optional<std::vector<uint8_t>> GetInOneRoundTrip(c10d::Store& store,
                                                      const std::string& key,
                                                      std::chrono::milliseconds timeout) {
#ifndef MESHRUN_WORKER_WITHOUT_GRPC_STORE
  if (auto* grpc = dynamic_cast<GrpcStore*>(&store)) return grpc->get(key, timeout);
#else
  (void)store, (void)key, (void)timeout;
#endif
  return std::nullopt;
}

// The store a group rendezvouses through: the world's store with the group's
// own timeout for get() and wait(keys). Gloo's connectFullMesh blocks in
// get() with the store's timeout, not the group's; without this a group that
// can never form (ranks disagreeing on NewGroup) would wait out the world's
// timeout (30 min by default) rather than its own.
class GroupTimeoutStore final : public c10d::Store {
 public:
  GroupTimeoutStore(c10::intrusive_ptr<c10d::Store> store,
                    std::chrono::milliseconds timeout)
      : c10d::Store(timeout), store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    store_->set(key, value);
  }
  std::vector<uint8_t> compareSet(const std::string& key,
                                  const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return store_->compareSet(key, expected, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    if (auto value = GetInOneRoundTrip(*store_, key, timeout_)) return *std::move(value);
    store_->wait({key}, timeout_);
    return store_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override {
    return store_->add(key, value);
  }
  bool deleteKey(const std::string& key) override { return store_->deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override {
    return store_->check(keys);
  }
  int64_t getNumKeys() override { return store_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override {
    store_->wait(keys, timeout_);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }
  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<GroupTimeoutStore>(store_->clone(), timeout_);
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// libtorch 2 splits a group into a ProcessGroup (what users call collectives
// on; it dispatches by the tensors' device) and a Backend per device type
// (Gloo for CPU, NCCL for CUDA), as torch's init_process_group builds it.
c10::intrusive_ptr<c10d::ProcessGroup> GroupOf(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    c10::DeviceType device, c10d::ProcessGroup::BackendType type,
    c10::intrusive_ptr<c10d::Backend> backend) {
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setBackend(device, type, backend);
  group->setDefaultBackend(type);
  return group;
}

// The rendezvous key prefix of the n-th group of a world. c10d::PrefixStore
// adds the "/" itself: keys land under "pg/<n>/".
std::string GroupPrefix(int n) { return absl::StrCat("pg/", n); }

// NewGroup's closing barrier over the whole world, through the store (as
// torch's new_group ends with its store-based barrier): every rank counts
// itself in under the group's prefix and the last to arrive releases the
// others. Through the store rather than a collective on the default group so
// that it neither depends on the default group's backend nor shifts its
// sequence of collectives.
// Rank 0 leaves last: it may serve the TCPStore, and a rank 0 that exits
// right after NewGroup must not take the store down under peers still in
// the barrier (torch's polling barrier has that race). The releases are adds,
// not sets: TCPStore answers an add, so a releasing rank knows the store has
// taken its release before it goes on (and perhaps exits).
absl::Status StoreBarrier(c10d::Store& store, int rank, int group_number, int world_size,
                          std::chrono::milliseconds timeout) {
  const std::string key = absl::StrCat(GroupPrefix(group_number), "/barrier/");
  const std::string arrived = key + "arrived";
  try {
    if (store.add(arrived, 1) == world_size) store.add(key + "released", 1);
    store.wait({key + "released"}, timeout);
    if (world_size > 1) {
      if (rank != 0) {
        if (store.add(key + "left", 1) == world_size - 1) {
          try {
            store.add(key + "all_left", 1);
          } catch (const c10::DistNetworkError&) {
            // Rank 0 saw the release and exited, taking its TCPStore with it
            // before the reply reached us: the release was taken.
          }
        }
      } else {
        store.wait({key + "all_left"}, timeout);
      }
    }
    return absl::OkStatus();
  } catch (const std::exception& e) {
    std::string count = "?";
    try {
      count = absl::StrCat(store.add(arrived, 0));
    } catch (const std::exception&) {
      // The store itself failed; the first error says so.
    }
    return absl::UnavailableError(absl::StrCat(
        "NewGroup #", group_number, ": the closing barrier failed (timeout ",
        timeout.count(), " ms) with ", count, " of ", world_size,
        " ranks arrived (every rank of the world must call NewGroup): ", FirstLine(e)));
  }
}

}  // namespace

// The parts of World only this file needs.
struct WorldInternals {
  static absl::StatusOr<std::shared_ptr<World>> Init(const std::string& backend,
                                                     InitOptions options);
  static absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> NewGroup(
      World& world, std::vector<int> ranks, const GroupOptions& options);
  // This rank's part of NewGroup #group_number: the group for a member of
  // `ranks` (sorted), null for the others.
  static absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> JoinGroup(
      World& world, const std::vector<int>& ranks, const std::string& backend_option,
      int group_number, std::chrono::milliseconds timeout);
  static const c10::intrusive_ptr<c10d::Store>& BaseStore(World& world) {
    return world.base_store_;
  }
  // The group of `rank` of `size` rendezvousing under `prefix` of `store`.
  static absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> MakeGroup(
      World& world, const c10::intrusive_ptr<c10d::Store>& store,
      const std::string& backend, const std::string& prefix, int rank, int size,
      std::chrono::milliseconds timeout);
};

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> WorldInternals::MakeGroup(
    World& world, const c10::intrusive_ptr<c10d::Store>& base_store,
    const std::string& backend, const std::string& prefix, int rank, int size,
    std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::PrefixStore>(
      prefix, c10::make_intrusive<GroupTimeoutStore>(base_store, timeout));
  try {
    if (backend == "gloo") {
      auto options = c10d::ProcessGroupGloo::Options::create(timeout);
      {
        std::lock_guard<std::mutex> lock(world.mu_);
        if (world.gloo_devices_.empty()) {
          auto devices = MakeGlooDevices(world.options_, world.env_);
          if (!devices.ok()) return devices.status();
          world.gloo_devices_ = std::move(*devices);
        }
        options->devices = world.gloo_devices_;
      }
      options->threads = std::max(1, world.options_.gloo_threads);
      return GroupOf(
          store, rank, size, c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO,
          c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options));
    }
    if (backend == "nccl") {
#ifdef MESHRUN_WITH_NCCL
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout;
      return GroupOf(
          store, rank, size, c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL,
          c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options));
#else
      return absl::UnimplementedError(
          "meshrun_worker was built without NCCL (it needs a CUDA libtorch with "
          "ProcessGroupNCCL); use the gloo backend");
#endif
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(backend, " rendezvous of group '", prefix,
                                               "' (rank ", rank, " of ", size,
                                               ") failed: ", FirstLine(e)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", backend, "': expected gloo or nccl"));
}

World::~World() {
  // Groups before the store their rendezvous used.
  groups_.clear();
  group_.reset();
  store_.reset();
  base_store_.reset();
}

std::vector<int> World::GroupRanks(const c10d::ProcessGroup& group) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = group_ranks_.find(&group);
  return it == group_ranks_.end() ? std::vector<int>() : it->second;
}

int World::GlobalRank(const c10d::ProcessGroup& group, int group_rank) const {
  std::vector<int> ranks = GroupRanks(group);
  if (group_rank < 0 || group_rank >= static_cast<int>(ranks.size())) return -1;
  return ranks[group_rank];
}

int World::GroupRank(const c10d::ProcessGroup& group, int global_rank) const {
  std::vector<int> ranks = GroupRanks(group);
  auto it = std::lower_bound(ranks.begin(), ranks.end(), global_rank);
  if (it == ranks.end() || *it != global_rank) return -1;
  return static_cast<int>(it - ranks.begin());
}

absl::StatusOr<std::shared_ptr<World>> InitProcessGroup(const std::string& backend,
                                                        InitOptions options) {
  return WorldInternals::Init(backend, std::move(options));
}

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> NewGroup(
    World& world, std::vector<int> ranks, const GroupOptions& options) {
  return WorldInternals::NewGroup(world, std::move(ranks), options);
}

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> NewGroupOutsideWorld(
    World& world, const std::string& store_prefix, int rank, int size,
    const GroupOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NewGroupOutsideWorld: rank ", rank, " of a group of ", size));
  }
  return WorldInternals::MakeGroup(
      world, WorldInternals::BaseStore(world),
      options.backend.empty() ? world.backend() : options.backend, store_prefix, rank,
      size, options.timeout.value_or(world.timeout()));
}

absl::StatusOr<std::shared_ptr<World>> WorldInternals::Init(const std::string& backend,
                                                            InitOptions options) {
  if (!options.env) {
    auto env = WorkerEnvFromProcessEnvironment();
    if (!env.ok()) return env.status();
    options.env = *env;
  }
  std::shared_ptr<World> world(new World());
  world->env_ = *options.env;
  world->backend_ = backend;
  world->timeout_ = options.timeout;
  const WorkerEnv& env = world->env_;

  StoreKind kind = options.store;
  // The agent's store (meshrun's daemon speaking TCPStore) through c10d's own
  // client when meshrun offers it: 30-40x the gRPC client's single-caller
  // round trips (bench/results/store.md); the gRPC store where the daemon
  // wants a token or TLS, which the TCPStore protocol cannot carry.
  if (kind == StoreKind::kAuto) {
    kind = env.use_agent_store || !env.has_meshrun_store() ? StoreKind::kTcpStore
                                                           : StoreKind::kMeshrun;
  }
  if (kind == StoreKind::kMeshrun) {
    if (!env.has_meshrun_store()) {
      return absl::FailedPreconditionError(
          "MESHRUN_STORE_ENDPOINT is not set: start this program with meshrun to use "
          "meshrun's store");
    }
#ifdef MESHRUN_WORKER_WITHOUT_GRPC_STORE
    return absl::UnimplementedError(
        "meshrun_worker was built without meshrun's gRPC store (MESHRUN_WORKER_ONLY): "
        "use the TCPStore");
#else
    GrpcStoreOptions store_options;
    store_options.endpoint = *env.store_endpoint;
    store_options.ns = *env.store_prefix;
    store_options.timeout = options.timeout;
    store_options.connect_timeout = options.connect_timeout;
    auto store = GrpcStore::Connect(store_options);
    if (!store.ok()) return store.status();
    world->store_ = *store;
    world->store_kind_ = "meshrun";
#endif
  } else {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(env.master_port);
    store_options.isServer = env.rank == 0 && !env.use_agent_store;
    store_options.waitWorkers = false;
    store_options.timeout = options.connect_timeout;
    store_options.multiTenant = true;
    try {
      c10::intrusive_ptr<c10d::Store> tcp =
          c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
      tcp->setTimeout(options.timeout);
      // The agent's store (meshrun's daemon) outlives the workers, so each
      // restart keys its own, as torch's env:// rendezvous does.
      world->store_ = tcp;
      if (env.use_agent_store) {
        world->store_ = c10::make_intrusive<c10d::PrefixStore>(
            "/worker/attempt_" + std::to_string(env.restart_count), tcp);
      }
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(
          "cannot ", store_options.isServer ? "serve" : "reach", " the TCPStore at ",
          env.master_addr, ":", env.master_port, ": ", FirstLine(e)));
    }
    world->store_kind_ = "tcpstore";
  }
  world->base_store_ = world->store_;
  if (!options.store_prefix.empty()) {
    world->store_ =
        c10::make_intrusive<c10d::PrefixStore>(options.store_prefix, world->base_store_);
  }
  world->options_ = std::move(options);

  if (backend == "nccl") {
    absl::Status device = SetCudaDeviceFromLocalRank(env);
    if (!device.ok()) return device;
  }
  auto group = MakeGroup(*world, world->store_, backend, GroupPrefix(0), env.rank,
                         env.world_size, world->timeout_);
  if (!group.ok()) return group.status();
  world->group_ = *group;
  // As torch's init_process_group ends with a barrier: no rank returns (and
  // perhaps exits) while a peer is still connecting its Gloo pairs to it.
  try {
    world->group_->barrier()->wait();
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("init_process_group: the closing barrier failed: ", FirstLine(e)));
  }
  std::vector<int> all(env.world_size);
  for (int r = 0; r < env.world_size; ++r) all[r] = r;
  world->group_ranks_[world->group_.get()] = std::move(all);
  return world;
}

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> WorldInternals::NewGroup(
    World& world, std::vector<int> ranks, const GroupOptions& options) {
  if (ranks.empty()) return absl::InvalidArgumentError("NewGroup: ranks is empty");
  std::sort(ranks.begin(), ranks.end());
  if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NewGroup: ranks [", absl::StrJoin(ranks, ", "), "] contain a duplicate"));
  }
  if (ranks.front() < 0 || ranks.back() >= world.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NewGroup: ranks [", absl::StrJoin(ranks, ", "),
        "] must be within the world size set by InitProcessGroup (", world.size(), ")"));
  }
  int group_number;
  {
    std::lock_guard<std::mutex> lock(world.mu_);
    group_number = world.next_group_++;
  }
  const std::chrono::milliseconds timeout = options.timeout.value_or(world.timeout());
  auto group = JoinGroup(world, ranks, options.backend, group_number, timeout);
  // Members and non-members alike, and after a failure too: no rank returns
  // (and perhaps exits, taking its Gloo pairs or the TCPStore it serves with
  // it) while a peer is still forming the group. A peer may spend up to
  // `timeout` forming it before it arrives (a member whose rendezvous times
  // out), hence twice that here.
  absl::Status barrier =
      StoreBarrier(*world.store_, world.rank(), group_number, world.size(), 2 * timeout);
  if (!group.ok()) return group.status();
  if (!barrier.ok()) return barrier;
  if (*group) {
    std::lock_guard<std::mutex> lock(world.mu_);
    world.group_ranks_[group->get()] = ranks;
    world.groups_.push_back(*group);
  }
  return *group;
}

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> WorldInternals::JoinGroup(
    World& world, const std::vector<int>& ranks, const std::string& backend_option,
    int group_number, std::chrono::milliseconds timeout) {
  auto me = std::lower_bound(ranks.begin(), ranks.end(), world.rank());
  if (me == ranks.end() || *me != world.rank())
    return c10::intrusive_ptr<c10d::ProcessGroup>();
  const int group_rank = static_cast<int>(me - ranks.begin());

  // Members agree on the ranks before rendezvousing: a mismatch (a rank that
  // skipped or reordered a NewGroup call) is named instead of timing out.
  const std::string prefix = GroupPrefix(group_number);
  const std::string joined = absl::StrJoin(ranks, ",");
  try {
    c10d::PrefixStore store(prefix, world.store_);
    std::vector<uint8_t> mine(joined.begin(), joined.end());
    std::vector<uint8_t> agreed = store.compareSet("ranks", {}, mine);
    if (agreed != mine) {
      return absl::FailedPreconditionError(absl::StrCat(
          "NewGroup #", group_number, ": rank ", world.rank(), " was called with ranks [",
          joined, "] but another member with [",
          std::string(agreed.begin(), agreed.end()),
          "]: every rank must call NewGroup with the same ranks in the same order"));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("NewGroup: the store failed: ", FirstLine(e)));
  }

  const std::string backend = backend_option.empty() ? world.backend() : backend_option;
  return MakeGroup(world, world.store_, backend, GroupPrefix(group_number), group_rank,
                   static_cast<int>(ranks.size()), timeout);
}

}  // namespace meshrun::worker
