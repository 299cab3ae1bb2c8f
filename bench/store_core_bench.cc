// store_core_bench: the daemon's store without sockets. T threads, each a
// session of its own, call StoreService::Handle (what the TCPStore
// front-end's I/O threads call per query) in the store_bench loop: set(k_t,
// 64 B) / get(k_t) / add(counter, 1), all in one namespace. It shows what the
// store core costs per op and whether its one lock lets more threads do
// more: ops/s at T threads against 1, CPU per op, and how often a thread
// found the lock taken (meshrun_store_lock_acquisitions_total).
//
//   store_core_bench [--threads 1,2] [--duration-ms 2000]
//
// With more threads than free cores the threads take turns on a core, and a
// thread preempted while it holds the lock stalls the others: run it with
// at most as many threads as idle cores.

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "rendezvous/server/store_service.h"

namespace meshrun::bench {
namespace {

using meshrun::v1::StoreRequest;
using meshrun::v1::StoreResponse;

// Takes the replies and drops them (counting, so the work is not elided).
class NullSink final : public rdzv::StoreReplySink {
 public:
  void Send(StoreResponse reply) override { bytes_ += reply.ByteSizeLong(); }
  void SendAll(std::vector<StoreResponse>* replies) override {
    for (auto& reply : *replies) Send(std::move(reply));
  }
  void Hold(const std::vector<StoreResponse>& /*replies*/) override {}
  void SendHeld(std::vector<StoreResponse>* replies) override { SendAll(replies); }
  bool DeferIfOverBounds() override { return false; }
  void MarkDeferred() override {}
  size_t RoomBytes() override { return size_t{1} << 30; }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_ = 0;
};

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Result {
  double ops_per_s = 0;
  double cpu_us_per_op = 0;
  double contended = 0;  // fraction of lock acquisitions that waited
};

Result Run(int threads, std::chrono::milliseconds duration) {
  rdzv::StoreService service(rdzv::StoreServiceOptions{});
  std::atomic<bool> stop{false};
  std::vector<uint64_t> ops(static_cast<size_t>(threads), 0);
  std::vector<double> cpu(static_cast<size_t>(threads), 0);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      NullSink sink;
      service.OpenSession();
      // Built once: the front-end's cost of making them is not the store's.
      std::vector<StoreRequest> loop(3);
      loop[0].set_ns("bench");
      loop[0].mutable_set()->set_key("k" + std::to_string(t));
      loop[0].mutable_set()->set_value(std::string(64, 'v'));
      loop[1].set_ns("bench");
      loop[1].mutable_get()->set_key("k" + std::to_string(t));
      loop[1].mutable_get()->set_if_present(true);
      loop[2].set_ns("bench");
      loop[2].mutable_add()->set_key("counter");
      loop[2].mutable_add()->set_delta(1);
      const double cpu0 = ThreadCpuSeconds();
      uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        for (StoreRequest& request : loop) {
          request.set_id(++n);
          service.Handle(&sink, request);
        }
      }
      cpu[static_cast<size_t>(t)] = ThreadCpuSeconds() - cpu0;
      ops[static_cast<size_t>(t)] = n;
      service.EndSession(&sink);
      if (sink.bytes() == 0) std::fprintf(stderr, "no replies?\n");
    });
  }
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(duration);
  stop = true;
  for (std::thread& w : workers) w.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t total = 0;
  double cpu_total = 0;
  for (int t = 0; t < threads; ++t) {
    total += ops[static_cast<size_t>(t)];
    cpu_total += cpu[static_cast<size_t>(t)];
  }
  Result result;
  result.ops_per_s = static_cast<double>(total) / seconds;
  result.cpu_us_per_op = total > 0 ? cpu_total * 1e6 / static_cast<double>(total) : 0;
  std::vector<rdzv::MetricFamily> metrics;
  service.CollectMetrics(&metrics);
  double waited = 0, all = 0;
  for (const auto& family : metrics) {
    if (family.name != "meshrun_store_lock_acquisitions_total") continue;
    for (const auto& sample : family.samples) {
      all += sample.value;
      for (const auto& [name, value] : sample.labels)
        if (name == "waited" && value == "true") waited += sample.value;
    }
  }
  result.contended = all > 0 ? waited / all : 0;
  return result;
}

}  // namespace
}  // namespace meshrun::bench

int main(int argc, char** argv) {
  CLI::App app{"store_core_bench: StoreService::Handle from T threads, no sockets"};
  std::vector<int> threads{1, 2};
  int duration_ms = 2000;
  app.add_option("--threads", threads)->delimiter(',')->capture_default_str();
  app.add_option("--duration-ms", duration_ms)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::printf("threads | ops/s      | x 1 thread | CPU us/op | lock waited\n");
  double base = 0;
  for (int t : threads) {
    const auto r = meshrun::bench::Run(t, std::chrono::milliseconds(duration_ms));
    if (base == 0) base = r.ops_per_s / t;
    std::printf("%7d | %10.0f | %10.2f | %9.3f | %10.2f%%\n", t, r.ops_per_s,
                r.ops_per_s / base, r.cpu_us_per_op, 100 * r.contended);
  }
  return 0;
}
