// Well-formed but hostile request sequences against the real daemon: many
// nodes of a few runs joining, heartbeating, failing, succeeding, leaving
// and closing in any order with any config, and store clients of those runs
// doing every operation with odd keys, large values, waits and conflicting
// writes. Requests go through the daemon's services (validation, KvStore,
// RendezvousState and the adapters between them), in-process over loopback.

#include <fuzzer/FuzzedDataProvider.h>
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/client/store_client.h"
#include "tests/fuzz/fuzz_daemon.h"

namespace {

namespace v1 = meshrun::v1;
using meshrun::rdzv::RendezvousClient;
using meshrun::rdzv::StoreClient;
using std::chrono::milliseconds;

constexpr int kRuns = 3;
constexpr int kNodes = 5;
constexpr int kMaxOps = 96;

// Mostly small values from a few choices, sometimes anything.
uint32_t Hostile32(FuzzedDataProvider& in, uint32_t usual_max) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      return 0;
    case 1:
      return in.ConsumeIntegral<uint32_t>();
    case 2:
      return UINT32_MAX;
    default:
      return in.ConsumeIntegralInRange<uint32_t>(1, usual_max);
  }
}

std::string Key(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0:
      return "";
    case 1:
      return std::string(in.ConsumeIntegralInRange<size_t>(4000, 5000), 'k');
    case 2:
      return in.ConsumeRandomLengthString(64);
    default:
      return "k" + std::to_string(in.ConsumeIntegralInRange<int>(0, 7));
  }
}

std::string Value(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0:
      return std::string(in.ConsumeIntegralInRange<size_t>(1000000, 1100000), 'v');
    case 1:
      return std::to_string(in.ConsumeIntegral<int64_t>());
    default:
      return in.ConsumeRandomLengthString(32);
  }
}

// Large values only in small requests, so one input stays in the megabytes.
std::string SmallValue(FuzzedDataProvider& in, size_t entries) {
  return entries > 6 ? in.ConsumeRandomLengthString(8) : Value(in);
}

std::vector<std::string> Keys(FuzzedDataProvider& in) {
  std::vector<std::string> keys(in.ConsumeIntegralInRange<size_t>(0, 6));
  for (auto& key : keys) key = Key(in);
  if (in.ConsumeIntegralInRange<int>(0, 31) == 0) keys.resize(1100, "many");
  return keys;
}

class Sequence {
 public:
  explicit Sequence(const std::string& prefix)
      : prefix_(prefix), client_(meshrun::fuzz::FuzzDaemon::Get().channel) {
    client_.set_call_timeout(milliseconds(2000));
  }

  void Run(FuzzedDataProvider& in) {
    for (int op = 0; op < kMaxOps && in.remaining_bytes() > 0; ++op) {
      const int run = in.ConsumeIntegralInRange<int>(0, kRuns - 1);
      const int node = in.ConsumeIntegralInRange<int>(0, kNodes - 1);
      switch (in.ConsumeIntegralInRange<int>(0, 11)) {
        case 0:
        case 1:
          Join(in, run, node);
          break;
        case 2:
          (void)client_.Heartbeat(RunId(run), NodeId(node));
          break;
        case 3:
          if (in.ConsumeBool()) {
            (void)client_.ReportFailure(RunId(run), NodeId(node), Round(in),
                                        in.ConsumeRandomLengthString(128));
          } else {
            // Restart scope "replica": counted without a re-form.
            v1::FailureReport report;
            report.set_run_id(RunId(run));
            report.set_node_id(NodeId(node));
            report.set_round(Round(in));
            report.set_replica(Hostile32(in, 8));
            if (in.ConsumeBool()) report.set_replica_restarts(Hostile32(in, 3));
            (void)client_.ReportFailure(report);
          }
          break;
        case 4:
          (void)client_.ReportSuccess(RunId(run), NodeId(node), Round(in));
          break;
        case 5:
          (void)client_.Leave(RunId(run), NodeId(node));
          break;
        case 6:
          (void)client_.Close(
              RunId(run),
              static_cast<v1::RunOutcome>(in.ConsumeIntegralInRange<int>(-1, 4)),
              in.ConsumeRandomLengthString(64));
          break;
        case 7:
          Drain(run, node);
          break;
        case 8:
          sessions_.erase({run, node});  // the node's stream breaks
          break;
        default:
          StoreOp(in, run);
          break;
      }
    }
  }

 private:
  std::string RunId(int run) const { return prefix_ + "run" + std::to_string(run); }
  std::string NodeId(int node) const { return "node" + std::to_string(node); }

  uint64_t Round(FuzzedDataProvider& in) {
    return in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 4)
                            : in.ConsumeIntegral<uint64_t>();
  }

  void Join(FuzzedDataProvider& in, int run, int node) {
    v1::JoinRequest join;
    join.set_run_id(RunId(run));
    join.set_node_id(NodeId(node));
    join.set_host(in.ConsumeBool() ? "127.0.0.1" : in.ConsumeRandomLengthString(32));
    join.set_nproc(Hostile32(in, 8));
    join.set_node_rank_hint(in.ConsumeIntegralInRange<int32_t>(-3, kNodes));
    join.set_master_port(Hostile32(in, 65535));
    auto* config = join.mutable_config();
    config->set_min_nodes(Hostile32(in, 3));
    config->set_max_nodes(Hostile32(in, kNodes));
    config->set_max_restarts(Hostile32(in, 3));
    // Timeouts short enough that deadlines pass within an input.
    config->set_last_call_timeout_ms(Hostile32(in, 5));
    config->set_join_timeout_ms(Hostile32(in, 50));
    config->set_keep_alive_interval_ms(Hostile32(in, 10));
    config->set_keep_alive_max_attempt(Hostile32(in, 3));
    config->set_uniform_nproc(in.ConsumeBool());
    config->set_replica_size(Hostile32(in, 2));
    sessions_[{run, node}] = client_.Join(join);
  }

  void Drain(int run, int node) {
    auto it = sessions_.find({run, node});
    if (it == sessions_.end()) return;
    for (int i = 0; i < 8; ++i) {
      auto event = it->second->Next(milliseconds(1));
      if (!event.ok()) return;
    }
  }

  StoreClient* Store(int run) {
    auto& slot = stores_[run];
    if (!slot) {
      meshrun::rdzv::StoreClientOptions options;
      options.channel = meshrun::fuzz::FuzzDaemon::Get().loopback_channel;
      options.ns = RunId(run) + "/r1";
      options.timeout = milliseconds(2);
      options.connect_timeout = milliseconds(2000);
      auto client = StoreClient::Connect(std::move(options));
      if (!client.ok()) return nullptr;
      slot = std::move(*client);
    }
    return slot.get();
  }

  void StoreOp(FuzzedDataProvider& in, int run) {
    StoreClient* store = Store(run);
    if (store == nullptr) return;
    const milliseconds wait(in.ConsumeIntegralInRange<int>(1, 3));
    switch (in.ConsumeIntegralInRange<int>(0, 10)) {
      case 0:
        (void)store->Set(Key(in), Value(in));
        break;
      case 1:
        (void)store->Get(Key(in), wait);
        break;
      case 2:
        (void)store->Add(Key(in), in.ConsumeIntegral<int64_t>());
        break;
      case 3: {
        std::string key = Key(in);
        std::string expected = Value(in);
        (void)store->CompareSet(key, expected, Value(in));
        break;
      }
      case 4:
        (void)store->Wait(Keys(in), wait);
        break;
      case 5:
        (void)store->Delete(Key(in));
        break;
      case 6:
        (void)store->NumKeys();
        break;
      case 7:
        (void)store->Check(Keys(in));
        break;
      case 8: {
        // MultiGet blocks until every key exists: only keys just set.
        std::vector<std::string> keys = Keys(in);
        std::vector<std::pair<std::string, std::string>> entries;
        for (const auto& key : keys)
          entries.emplace_back(key, SmallValue(in, keys.size()));
        if (store->MultiSet(entries).ok() && !keys.empty() && keys.size() <= 6)
          (void)store->MultiGet(keys);
        break;
      }
      case 9:
        (void)store->Append(Key(in), Value(in));
        break;
      case 10: {
        std::vector<std::pair<std::string, std::string>> entries;
        std::vector<std::string> keys = Keys(in);
        for (const auto& key : keys)
          entries.emplace_back(key, SmallValue(in, keys.size()));
        (void)store->MultiSet(entries);
        break;
      }
    }
  }

  const std::string prefix_;
  RendezvousClient client_;
  std::map<std::pair<int, int>, std::unique_ptr<RendezvousClient::JoinSession>> sessions_;
  std::map<int, std::unique_ptr<StoreClient>> stores_;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Hostile text fields are often not UTF-8, which protobuf logs each time.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Sequence sequence(meshrun::fuzz::FuzzDaemon::Get().NextPrefix());
  sequence.Run(in);
  return 0;
}
