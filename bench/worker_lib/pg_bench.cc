// Worker-library benchmark program, run under the real launcher by
// bench/worker_lib/bench_worker_lib.py (scripts/bench-worker-lib.sh):
//
//   meshrun --standalone --nproc-per-node=N --no-python pg_bench allreduce
//       --store meshrun|tcpstore [--sizes 1024,16384,...] [--warmup 3]
//       InitProcessGroup("gloo") through the chosen store, then for each size
//       a float32 SUM all-reduce on the default group: `warmup` untimed calls,
//       then timed calls (fewer for big sizes). Each timed call is preceded by
//       a barrier and timed on every rank (steady_clock around allreduce +
//       wait); the call's time is the maximum over ranks. Rank 0 prints
//         RESULT allreduce store=S server=V n=N bytes=B iters=I median_us=T
//             busbw_gbps=G
//       with busbw = 2(n-1)/n * bytes / median time (nccl-tests' bus bandwidth).
//
//   meshrun --standalone --nproc-per-node=8 --no-python pg_bench mesh
//       --store meshrun|tcpstore [--shape 2,2,2]
//       Process-group creation: each rank takes steady_clock (CLOCK_MONOTONIC,
//       shared by all processes of the machine) just before InitProcessGroup
//       and just after InitDeviceMesh returns. Rank 0 prints
//         RESULT mesh store=S server=V n=N shape=... max_rank_ms=M span_ms=P
//             last_start_ms=L init_pg_ms=A mesh_ms=B groups_per_rank=G
//       max_rank_ms: the longest per-rank time (before InitProcessGroup to
//       after InitDeviceMesh); span_ms: earliest start to latest finish over
//       ranks; last_start_ms: the last rank's start to the last finish (the
//       creation once every process is up, without start-up skew);
//       init_pg_ms / mesh_ms: the maxima over ranks of the two parts.
//
// server=V is rank 0's TCPStore server backend, "libuv" (torch 2's default)
// or "classic", and "-" for meshrun's store.
//
// The store only carries the rendezvous (Gloo's pair addresses); the
// all-reduce data goes over Gloo's own TCP connections either way.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"

namespace meshrun::worker {
namespace {

using Clock = std::chrono::steady_clock;

double NowMs() {
  return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch())
      .count();
}

std::vector<long long> ParseList(const std::string& text) {
  std::vector<long long> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    out.push_back(std::atoll(text.substr(pos, comma - pos).c_str()));
    pos = comma + 1;
  }
  return out;
}

// Element-wise MAX over all ranks of the default group.
std::vector<double> MaxOverRanks(World& world, const std::vector<double>& values) {
  std::vector<at::Tensor> t{
      at::tensor(values, at::TensorOptions().dtype(at::kDouble)).clone()};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  world.group()->allreduce(t, max)->wait();
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = t[0][i].item<double>();
  return out;
}

// The backend of the TCPStore rank 0 serves (rank 0 is its server).
const char* StoreServer(const World& world) {
  const auto* tcp = dynamic_cast<const c10d::TCPStore*>(world.store().get());
  if (tcp == nullptr) return "-";
  return tcp->isLibUvBackend() ? "libuv" : "classic";
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Timed calls per size: enough for a stable median at small sizes, few for
// the large ones (a 64 MiB all-reduce takes ~0.1-1 s on a loaded 2-core box).
int ItersFor(long long bytes) {
  if (bytes <= 16 * 1024) return 50;
  if (bytes <= 256 * 1024) return 30;
  if (bytes <= 4 * 1024 * 1024) return 10;
  return 5;
}

std::shared_ptr<World> Init(StoreKind store) {
  InitOptions options;
  options.store = store;
  options.timeout = std::chrono::seconds(120);
  auto world = InitProcessGroup("gloo", options);
  if (!world.ok()) {
    std::fprintf(stderr, "pg_bench: InitProcessGroup: %s\n",
                 std::string(world.status().message()).c_str());
    std::exit(1);
  }
  return *world;
}

int AllReduce(StoreKind store, const std::vector<long long>& sizes, int warmup) {
  std::shared_ptr<World> world = Init(store);
  const int n = world->size();
  auto& group = world->group();
  for (long long bytes : sizes) {
    const int64_t numel = bytes / static_cast<int64_t>(sizeof(float));
    std::vector<at::Tensor> t{at::ones({numel}, at::kFloat)};
    for (int i = 0; i < warmup; ++i) group->allreduce(t)->wait();
    const int iters = ItersFor(bytes);
    std::vector<double> times_us(iters);
    for (int i = 0; i < iters; ++i) {
      group->barrier()->wait();
      const auto start = Clock::now();
      group->allreduce(t)->wait();
      times_us[i] =
          std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    }
    times_us = MaxOverRanks(*world, times_us);
    const double median_us = Median(times_us);
    const double busbw_gbps =
        2.0 * (n - 1) / n * static_cast<double>(bytes) / (median_us * 1e-6) / 1e9;
    if (world->rank() == 0) {
      std::printf(
          "RESULT allreduce store=%s server=%s n=%d bytes=%lld iters=%d median_us=%.1f "
          "min_us=%.1f busbw_gbps=%.4f\n",
          world->store_kind().c_str(), StoreServer(*world), n, bytes, iters, median_us,
          *std::min_element(times_us.begin(), times_us.end()), busbw_gbps);
      std::fflush(stdout);
    }
  }
  // Rank 0 may serve the TCPStore: nobody leaves while others still use it.
  group->barrier()->wait();
  return 0;
}

int Mesh(StoreKind store, const std::vector<long long>& shape_ll) {
  std::vector<int> shape(shape_ll.begin(), shape_ll.end());
  const double start = NowMs();
  std::shared_ptr<World> world = Init(store);
  const double after_pg = NowMs();
  std::vector<std::string> names;
  for (size_t i = 0; i < shape.size(); ++i) names.push_back("d" + std::to_string(i));
  auto mesh = InitDeviceMesh(world, "cpu", shape, names);
  const double end = NowMs();
  if (!mesh.ok()) {
    std::fprintf(stderr, "pg_bench: InitDeviceMesh: %s\n",
                 std::string(mesh.status().message()).c_str());
    return 1;
  }
  int groups = 0;
  auto all = mesh->GetAllGroups();
  if (all.ok()) groups = static_cast<int>(all->size());
  // Maxima over ranks; the earliest start as the maximum of its negation.
  std::vector<double> m = MaxOverRanks(
      *world, {end - start, -start, end, after_pg - start, end - after_pg, start});
  if (world->rank() == 0) {
    std::string shape_text;
    for (size_t i = 0; i < shape.size(); ++i)
      shape_text += (i ? "," : "") + std::to_string(shape[i]);
    std::printf(
        "RESULT mesh store=%s server=%s n=%d shape=%s max_rank_ms=%.1f span_ms=%.1f "
        "last_start_ms=%.1f init_pg_ms=%.1f mesh_ms=%.1f groups_per_rank=%d\n",
        world->store_kind().c_str(), StoreServer(*world), world->size(),
        shape_text.c_str(), m[0], m[2] + m[1], m[2] - m[5], m[3], m[4], groups);
    std::fflush(stdout);
  }
  world->group()->barrier()->wait();
  return 0;
}

}  // namespace
}  // namespace meshrun::worker

int main(int argc, char** argv) {
  using meshrun::worker::StoreKind;
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: pg_bench allreduce|mesh --store meshrun|tcpstore "
                 "[--sizes B,B,...] [--warmup W] [--shape 2,2,2]\n");
    return 2;
  }
  std::string mode = argv[1];
  StoreKind store = StoreKind::kAuto;
  std::string sizes = "1024,16384,262144,4194304,67108864";
  std::string shape = "2,2,2";
  int warmup = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--store") {
      if (value == "meshrun") {
        store = StoreKind::kMeshrun;
      } else if (value == "tcpstore") {
        store = StoreKind::kTcpStore;
      } else {
        std::fprintf(stderr, "pg_bench: --store meshrun|tcpstore, not %s\n",
                     value.c_str());
        return 2;
      }
    } else if (flag == "--sizes") {
      sizes = value;
    } else if (flag == "--shape") {
      shape = value;
    } else if (flag == "--warmup") {
      warmup = std::atoi(value.c_str());
    } else {
      std::fprintf(stderr, "pg_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    if (mode == "allreduce")
      return meshrun::worker::AllReduce(store, meshrun::worker::ParseList(sizes), warmup);
    if (mode == "mesh")
      return meshrun::worker::Mesh(store, meshrun::worker::ParseList(shape));
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::fprintf(stderr, "pg_bench: uncaught: %s\n",
                 what.substr(0, what.find('\n')).c_str());
    return 3;
  }
  std::fprintf(stderr, "pg_bench: unknown mode %s\n", mode.c_str());
  return 2;
}
