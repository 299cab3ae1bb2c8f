// A worker program for the process-group tests, run under the real launcher
// (meshrun, or torchrun as the peer). Every rank checks the values it gets
// and prints one "PASS rank=<r> checks=<n>" line, or "FAIL rank=<r> ..." lines
// and exits 1.
//
//   pg_worker collectives [--store auto|meshrun|tcpstore] [--backend gloo|nccl]
//       InitProcessGroup(backend), then all-reduce, all-gather, broadcast,
//       send/recv, reduce-scatter and barrier on the default group and on
//       NewGroup subsets (pairs, evens, odds, a singleton, an unsorted list,
//       the same ranks created again and again). With nccl, every tensor is
//       on the GPU of the worker's LOCAL_RANK.
//   pg_worker errors
//       The documented error cases of InitProcessGroup and NewGroup.
//   pg_worker exit-after-newgroup [--store ...]
//       NewGroup of every rank but 0, the last rank first sleeping a second
//       (slowed before it creates its Gloo pairs); every rank prints
//       "NEWGROUP rank=<r> member|not a member" (or "NEWGROUP rank=<r> FAILED
//       <status>", exit 1) and exits at once with _Exit, as a program that
//       is done may. Rank 0 may serve the TCPStore.

#include <ATen/Context.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker_lib/mesh/collectives.h"
#include "worker_lib/mesh/process_group.h"

namespace meshrun::worker {
namespace {

int rank = -1;
int checks = 0;
int failures = 0;

void Expect(bool ok, const std::string& what) {
  ++checks;
  if (ok) return;
  ++failures;
  std::printf("FAIL rank=%d %s\n", rank, what.c_str());
  std::fflush(stdout);
}

std::string Show(const at::Tensor& t) {
  std::vector<std::string> items;
  at::Tensor flat = t.reshape({-1}).to(at::kDouble);
  for (int64_t i = 0; i < flat.numel(); ++i)
    items.push_back(absl::StrCat(flat[i].item<double>()));
  return "[" + absl::StrJoin(items, ", ") + "]";
}

// Exact, except for rounding (AVG divides).
void ExpectTensor(const at::Tensor& got_anywhere, const at::Tensor& want_anywhere,
                  const std::string& what) {
  const at::Tensor got = got_anywhere.cpu(), want = want_anywhere.cpu();
  Expect(got.sizes().equals(want.sizes()) &&
             at::allclose(got, want.to(got.scalar_type()), /*rtol=*/1e-6, /*atol=*/1e-6),
         absl::StrCat(what, ": got ", Show(got), ", want ", Show(want)));
}

// Where the collectives' tensors live: CPU for Gloo, this rank's GPU for NCCL.
at::TensorOptions opts = at::TensorOptions().dtype(at::kFloat);

at::Tensor Floats(std::vector<float> values) {
  return at::tensor(values, at::kFloat).to(opts.device());
}

// Runs every collective on `group` (whose global ranks, sorted, are `ranks`)
// and checks the results.
void CheckCollectives(World& world, const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                      const std::vector<int>& ranks, const std::string& name) {
  const int n = static_cast<int>(ranks.size());
  const int me = world.GroupRank(*group, world.rank());
  Expect(group->getSize() == n, absl::StrCat(name, ": size ", group->getSize()));
  Expect(group->getRank() == me, absl::StrCat(name, ": group rank ", group->getRank(),
                                              ", World::GroupRank ", me));
  Expect(world.GroupRanks(*group) == ranks, name + ": World::GroupRanks");
  for (int r = 0; r < n; ++r)
    Expect(world.GlobalRank(*group, r) == ranks[r],
           absl::StrCat(name, ": GlobalRank ", r));
  int sum_ranks = 0, max_rank = 0;
  for (int r : ranks) {
    sum_ranks += r;
    max_rank = std::max(max_rank, r);
  }
  const float g = static_cast<float>(world.rank());

  // all-reduce: SUM and MAX.
  {
    std::vector<at::Tensor> t{at::full({3}, g + 1, opts)};
    group->allreduce(t)->wait();
    ExpectTensor(t[0], at::full({3}, static_cast<float>(sum_ranks + n)),
                 name + ": allreduce sum");
    std::vector<at::Tensor> m{Floats({g, -g})};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    group->allreduce(m, max)->wait();
    ExpectTensor(m[0],
                 Floats({static_cast<float>(max_rank), -static_cast<float>(ranks[0])}),
                 name + ": allreduce max");
  }
  // all-gather: slot i holds group rank i's tensor.
  {
    std::vector<at::Tensor> input{Floats({g, 10 * g})};
    std::vector<std::vector<at::Tensor>> output(1);
    for (int i = 0; i < n; ++i) output[0].push_back(at::zeros({2}, opts));
    group->allgather(output, input)->wait();
    for (int i = 0; i < n; ++i) {
      const float r = static_cast<float>(ranks[i]);
      ExpectTensor(output[0][i], Floats({r, 10 * r}),
                   absl::StrCat(name, ": allgather[", i, "]"));
    }
  }
  // broadcast from the last group rank.
  {
    const int root = n - 1;
    std::vector<at::Tensor> t{me == root ? at::full({5}, 42 + g, opts)
                                         : at::zeros({5}, opts)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    group->broadcast(t, options)->wait();
    ExpectTensor(t[0], at::full({5}, 42.0f + static_cast<float>(ranks[root])),
                 name + ": broadcast");
  }
  // send/recv around the ring of group ranks (both posted before waiting).
  if (n > 1) {
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    std::vector<at::Tensor> out{at::arange(4, opts) + 1000 * g};
    std::vector<at::Tensor> in{at::zeros({4}, opts)};
    auto sent = group->send(out, next, /*tag=*/7);
    auto received = group->recv(in, prev, /*tag=*/7);
    sent->wait();
    received->wait();
    ExpectTensor(in[0], at::arange(4, opts) + 1000.0f * static_cast<float>(ranks[prev]),
                 name + ": recv from previous");
  }
  // reduce-scatter (native on Gloo in libtorch 2; AVG by the helper): inputs[j] = 100 g +
  // j.
  {
    std::vector<at::Tensor> inputs;
    for (int j = 0; j < n; ++j) inputs.push_back(at::full({2, 2}, 100 * g + j, opts));
    at::Tensor out = at::zeros({2, 2}, opts);
    absl::Status s = ReduceScatter(*group, out, inputs);
    Expect(s.ok(), name + ": ReduceScatter: " + s.ToString());
    ExpectTensor(out, at::full({2, 2}, static_cast<float>(100 * sum_ranks + n * me)),
                 name + ": reduce_scatter sum");
    at::Tensor max_out = at::zeros({2, 2}, opts);
    s = ReduceScatter(*group, max_out, inputs, c10d::ReduceOp::MAX);
    Expect(s.ok(), name + ": ReduceScatter max: " + s.ToString());
    ExpectTensor(max_out, at::full({2, 2}, static_cast<float>(100 * max_rank + me)),
                 name + ": reduce_scatter max");
    // The flat form: chunk k of `input` (k*3 .. k*3+2, plus g) goes to rank k.
    at::Tensor input = at::arange(3 * n, opts) + g;
    at::Tensor chunk = at::zeros({3}, opts);
    s = ReduceScatterTensor(*group, chunk, input);
    Expect(s.ok(), name + ": ReduceScatterTensor: " + s.ToString());
    ExpectTensor(chunk,
                 (at::arange(3, opts) + 3 * me) * n + static_cast<float>(sum_ranks),
                 name + ": reduce_scatter_tensor");
    at::Tensor avg = at::zeros({3}, opts);
    s = ReduceScatterTensor(*group, avg, input, c10d::ReduceOp::AVG);
    Expect(s.ok(), name + ": ReduceScatterTensor avg: " + s.ToString());
    ExpectTensor(avg, at::arange(3, opts) + 3 * me + static_cast<float>(sum_ranks) / n,
                 name + ": reduce_scatter_tensor avg");
  }
  group->barrier()->wait();
}

void CheckNotMember(const absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>>& group,
                    const std::string& name) {
  Expect(group.ok(), name + ": " + group.status().ToString());
  Expect(group.ok() && !*group, name + ": a non-member got a group");
}

// NewGroup + CheckCollectives for members, the null check for the others.
void Subgroup(World& world, std::vector<int> ranks, const std::string& name) {
  auto group = NewGroup(world, ranks);
  std::sort(ranks.begin(), ranks.end());
  if (!std::binary_search(ranks.begin(), ranks.end(), world.rank())) {
    CheckNotMember(group, name);
    return;
  }
  Expect(group.ok(), name + ": " + group.status().ToString());
  if (!group.ok() || !*group) return;
  CheckCollectives(world, *group, ranks, name);
}

// InitProcessGroup(backend) over `store` with a 60 s timeout; null, after
// saying why on stderr, when it fails.
std::shared_ptr<World> Init(StoreKind store, const std::string& backend = "gloo") {
  InitOptions options;
  options.store = store;
  options.timeout = std::chrono::seconds(60);
  auto world = InitProcessGroup(backend, options);
  if (world.ok()) return *world;
  std::fprintf(stderr, "pg_worker: %s\n", std::string(world.status().message()).c_str());
  return nullptr;
}

int Collectives(StoreKind store, const std::string& backend) {
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<World> world_ptr = Init(store, backend);
  const auto init_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count();
  if (!world_ptr) return 1;
  World& world = *world_ptr;
  rank = world.rank();
  const int n = world.size();
  if (backend == "nccl")
    opts = opts.device(c10::Device(
        c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(world.env().local_rank)));
  std::printf("INFO rank=%d size=%d store=%s backend=%s device=%s init_ms=%lld\n", rank,
              n, world.store_kind().c_str(), backend.c_str(), opts.device().str().c_str(),
              static_cast<long long>(init_ms));
  std::fflush(stdout);
  Expect(world.group()->getRank() == rank && world.group()->getSize() == n,
         "default group");
  if (store != StoreKind::kAuto) {
    Expect(world.store_kind() == (store == StoreKind::kTcpStore ? "tcpstore" : "meshrun"),
           "store kind " + world.store_kind());
  }

  std::vector<int> all(n);
  for (int r = 0; r < n; ++r) all[r] = r;
  CheckCollectives(world, world.group(), all, "default");

  std::vector<int> evens, odds, reversed(all.rbegin(), all.rend());
  for (int r = 0; r < n; ++r) (r % 2 == 0 ? evens : odds).push_back(r);
  Subgroup(world, evens, "evens");
  if (!odds.empty()) Subgroup(world, odds, "odds");
  for (int r = 0; r + 1 < n; r += 2) Subgroup(world, {r, r + 1}, absl::StrCat("pair", r));
  Subgroup(world, {n - 1}, "singleton");
  Subgroup(world, reversed, "all-unsorted");
  if (n >= 3) Subgroup(world, {n - 1, 0, 1}, "unsorted-triple");
  // The same ranks again and again: each creation has its own prefix.
  for (int i = 0; i < 8; ++i) Subgroup(world, {0, n - 1}, absl::StrCat("again", i));
  world.group()->barrier()->wait();  // every member has written its keys
  // Every creation (members and not) consumed one "pg/<k>/" prefix.
  const int created =
      1 + 1 + (odds.empty() ? 0 : 1) + n / 2 + 1 + 1 + (n >= 3 ? 1 : 0) + 8;
  Expect(world.store()->check({absl::StrCat("pg/", created - 1, "/ranks")}),
         "prefix of the last group");
  Expect(!world.store()->check({absl::StrCat("pg/", created, "/ranks")}),
         "no prefix beyond the last group");
  // Rank 0 may serve the TCPStore: nobody leaves while others still use it.
  world.group()->barrier()->wait();
  if (failures == 0) std::printf("PASS rank=%d checks=%d\n", rank, checks);
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

int Errors() {
  InitOptions options;
  options.timeout = std::chrono::seconds(60);
  {
    auto nccl = InitProcessGroup("nccl", options);
#ifdef MESHRUN_WITH_NCCL
    // Compiled in; without a GPU it must fail with torch's reason, not crash.
    if (!at::hasCUDA()) {
      Expect(!nccl.ok() && nccl.status().message().find("GPU") != std::string::npos,
             "nccl without a GPU: " + nccl.status().ToString());
    }
#else
    Expect(!nccl.ok() && nccl.status().code() == absl::StatusCode::kUnimplemented &&
               nccl.status().message().find("meshrun_worker was built without NCCL") == 0,
           "nccl: " + nccl.status().ToString());
#endif
    auto bogus = InitProcessGroup("bogus", options);
    Expect(!bogus.ok() && bogus.status().message() ==
                              "unknown backend 'bogus': expected gloo or nccl",
           "bogus: " + bogus.status().ToString());
  }
  std::shared_ptr<World> world_ptr = Init(StoreKind::kAuto);
  if (!world_ptr) return 1;
  World& world = *world_ptr;
  rank = world.rank();
  const int n = world.size();
  auto expect_invalid = [&](std::vector<int> ranks, const std::string& message) {
    auto group = NewGroup(world, ranks);
    Expect(!group.ok() && group.status().code() == absl::StatusCode::kInvalidArgument &&
               group.status().message() == message,
           absl::StrCat("NewGroup([", absl::StrJoin(ranks, ","),
                        "]): ", group.status().ToString()));
  };
  expect_invalid({}, "NewGroup: ranks is empty");
  expect_invalid({1, 0, 1}, "NewGroup: ranks [0, 1, 1] contain a duplicate");
  expect_invalid(
      {0, n},
      absl::StrCat("NewGroup: ranks [0, ", n,
                   "] must be within the world size set by InitProcessGroup (", n, ")"));
  expect_invalid({-1},
                 absl::StrCat("NewGroup: ranks [-1] must be within the world size set "
                              "by InitProcessGroup (",
                              n, ")"));
  {
    GroupOptions nccl;
    nccl.backend = "nccl";
    auto group = NewGroup(world, {0}, nccl);
    if (rank == 0) {
#ifndef MESHRUN_WITH_NCCL
      Expect(!group.ok() && group.status().code() == absl::StatusCode::kUnimplemented,
             "NewGroup nccl: " + group.status().ToString());
#endif
    } else {
      CheckNotMember(group, "NewGroup nccl non-member");
    }
  }
  // The invalid calls consumed no prefix: the next group still works.
  {
    std::vector<int> all(n);
    for (int r = 0; r < n; ++r) all[r] = r;
    auto group = NewGroup(world, all);
    Expect(group.ok() && *group, "NewGroup after errors: " + group.status().ToString());
    if (group.ok() && *group) CheckCollectives(world, *group, all, "after-errors");
  }
  world.group()->barrier()->wait();

  // Ranks disagreeing on a NewGroup: the first member to arrive fixes the
  // ranks, a member with other ranks is told; members left waiting for a peer
  // time out (bounded here by a short group timeout).
  {
    std::vector<int> ranks =
        rank < n / 2 ? std::vector<int>{0, n - 1} : std::vector<int>{n - 1, 0, 1};
    GroupOptions quick;
    quick.timeout = std::chrono::milliseconds(3000);
    auto group = NewGroup(world, ranks, quick);
    if (!group.ok()) {
      std::printf("DISAGREE rank=%d %s\n", rank, group.status().ToString().c_str());
    } else {
      std::printf("DISAGREE rank=%d %s\n", rank, *group ? "group" : "not a member");
    }
  }
  if (failures == 0) std::printf("PASS rank=%d checks=%d\n", rank, checks);
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

int ExitAfterNewGroup(StoreKind store) {
  std::shared_ptr<World> world_ptr = Init(store);
  if (!world_ptr) return 1;
  World& world = *world_ptr;
  rank = world.rank();
  const int n = world.size();
  std::vector<int> members;
  for (int r = 1; r < n; ++r) members.push_back(r);
  if (rank == n - 1) std::this_thread::sleep_for(std::chrono::seconds(1));
  auto group = NewGroup(world, members);
  if (!group.ok()) {
    std::printf("NEWGROUP rank=%d FAILED %s\n", rank, group.status().ToString().c_str());
  } else {
    std::printf("NEWGROUP rank=%d %s\n", rank, *group ? "member" : "not a member");
  }
  std::fflush(stdout);
  std::_Exit(group.ok() ? 0 : 1);  // no destructors: the process is simply gone
}

}  // namespace
}  // namespace meshrun::worker

int main(int argc, char** argv) {
  using meshrun::worker::StoreKind;
  std::string mode = argc > 1 ? argv[1] : "collectives";
  StoreKind store = StoreKind::kAuto;
  std::string backend = "gloo";
  for (int i = 2; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--backend") == 0) backend = argv[i + 1];
    if (std::strcmp(argv[i], "--store") != 0) continue;
    std::string kind = argv[i + 1];
    store = kind == "meshrun"    ? StoreKind::kMeshrun
            : kind == "tcpstore" ? StoreKind::kTcpStore
                                 : StoreKind::kAuto;
  }
  try {
    if (mode == "collectives") return meshrun::worker::Collectives(store, backend);
    if (mode == "errors") return meshrun::worker::Errors();
    if (mode == "exit-after-newgroup") return meshrun::worker::ExitAfterNewGroup(store);
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::fprintf(stderr, "pg_worker: uncaught: %s\n",
                 what.substr(0, what.find('\n')).c_str());
    return 3;
  }
  std::fprintf(stderr, "pg_worker: unknown mode %s\n", mode.c_str());
  return 2;
}
