#include "bench/bench_workloads.h"

#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_child.h"
#include "bench/sync_stream_store.h"
#include "meshrun/v1/rendezvous.grpc.pb.h"
#include "rendezvous/client/store_client.h"
#include "rendezvous/relay/store_relay.h"

namespace meshrun::bench {

namespace {

namespace v1 = meshrun::v1;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             SteadyClock::now().time_since_epoch())
      .count();
}

void Emit(const std::string& line) {
  // One write per line, so lines of concurrent writers never interleave.
  std::string data = line + "\n";
  fwrite(data.data(), 1, data.size(), stdout);
  fflush(stdout);
}

// Error text for the end of a report line: one line, no surprises.
std::string OneLine(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

// A thread with a small stack: barrier client processes run thousands of them.
class SmallThread {
 public:
  explicit SmallThread(std::function<void()> body) : body_(std::move(body)) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 512 * 1024);
    started_ = pthread_create(&thread_, &attr, &SmallThread::Trampoline, this) == 0;
    pthread_attr_destroy(&attr);
  }
  bool started() const { return started_; }
  void Join() {
    if (started_) pthread_join(thread_, nullptr);
    started_ = false;
  }

 private:
  static void* Trampoline(void* self) {
    static_cast<SmallThread*>(self)->body_();
    return nullptr;
  }
  std::function<void()> body_;
  pthread_t thread_{};
  bool started_ = false;
};

// A latch the orchestrator's GO opens for every client thread at once.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void Pass() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

absl::StatusOr<std::unique_ptr<BenchStore>> Connect(
    Impl impl, const std::string& target, std::shared_ptr<grpc::Channel> channel,
    std::chrono::milliseconds timeout) {
  if (impl == Impl::kMeshrun) return ConnectMeshrun(target, std::move(channel), timeout);
  if (impl == Impl::kMeshrunSync)
    return ConnectMeshrunSync(target, std::move(channel), timeout);
  auto [host, port] = SplitHostPort(target);
  if (port < 0) return absl::InvalidArgumentError("bad target " + target);
  return ConnectTcpStore(host, port, timeout);
}

int64_t Percentile(std::vector<int64_t>& sorted_ns, double q) {
  if (sorted_ns.empty()) return 0;
  size_t i = static_cast<size_t>(q * static_cast<double>(sorted_ns.size() - 1) + 0.5);
  return sorted_ns[std::min(i, sorted_ns.size() - 1)];
}

}  // namespace

std::pair<std::string, int> SplitHostPort(const std::string& target) {
  auto colon = target.rfind(':');
  if (colon == std::string::npos) return {target, -1};
  std::string host = target.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  try {
    return {host, std::stoi(target.substr(colon + 1))};
  } catch (const std::exception&) {
    return {host, -1};
  }
}

namespace {

// CPU time used so far, in microseconds: this process, or another one
// (from /proc/<pid>/stat; 0 if it cannot be read).
double OwnCpuUs() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto us = [](const timeval& t) { return t.tv_sec * 1e6 + t.tv_usec; };
  return us(usage.ru_utime) + us(usage.ru_stime);
}

double ProcessCpuUs(pid_t pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // Fields after the command name, which ends at the last ')': state is the
  // 3rd field of the file; utime and stime are the 14th and 15th.
  const size_t end = stat.rfind(')');
  if (end == std::string::npos) return 0;
  std::istringstream fields(stat.substr(end + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i)
    if (i >= 14) ticks += std::stod(field);
  return ticks * 1e6 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Busy and total jiffies of all cores (/proc/stat's first line).
std::pair<double, double> MachineJiffies() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;
  double value, total = 0, idle = 0;
  for (int i = 0; i < 10 && in >> value; ++i) {
    total += value;
    if (i == 3 || i == 4) idle += value;  // idle, iowait
  }
  return {total - idle, total};
}

struct CpuSnapshot {
  double own_us, server_us;
  std::pair<double, double> machine;
  static CpuSnapshot Take(pid_t server, pid_t relays) {
    return {OwnCpuUs(), ProcessCpuUs(server) + (relays > 0 ? ProcessCpuUs(relays) : 0.0),
            MachineJiffies()};
  }
};

}  // namespace

int RunOpsClient(const OpsOptions& options) {
  std::shared_ptr<grpc::Channel> shared;
  if (!UsesTcpStoreClient(options.impl) && options.shared_channel)
    shared = rdzv::MakeStoreChannel(options.target, /*own_connection=*/false);

  const std::vector<std::string> targets = absl::StrSplit(options.target, ',');
  std::vector<std::unique_ptr<BenchStore>> stores;
  for (int i = 0; i < options.clients; ++i) {
    auto store = Connect(options.impl, targets[static_cast<size_t>(i) % targets.size()],
                         shared, options.timeout);
    if (!store.ok()) {
      Emit(absl::StrCat("RESULT ops=0 errors=1 error=connect: ",
                        store.status().ToString()));
      return 1;
    }
    stores.push_back(std::move(*store));
  }

  // 0: warm-up, 1: measured, 2: stop.
  std::atomic<int> phase{0};
  Gate gate;
  struct PerThread {
    std::vector<int64_t> latencies_ns;
    int64_t errors = 0;
    std::string first_error;
  };
  std::vector<PerThread> results(static_cast<size_t>(options.clients));
  std::vector<std::thread> threads;
  for (int i = 0; i < options.clients; ++i) {
    threads.emplace_back([&, i] {
      BenchStore& store = *stores[static_cast<size_t>(i)];
      PerThread& out = results[static_cast<size_t>(i)];
      out.latencies_ns.reserve(1 << 18);
      const std::string key = absl::StrCat("k", i);
      const std::string value(options.value_bytes, static_cast<char>('a' + i % 26));
      gate.Pass();
      for (int op = 0;; op = (op + 1) % 3) {
        int at_start = phase.load(std::memory_order_relaxed);
        if (at_start == 2) break;
        absl::Status status;
        int64_t t0 = NowNs();
        if (op == 0) {
          status = store.Set(key, value);
        } else if (op == 1) {
          status = store.Get(key).status();
        } else {
          status = store.Add("counter", 1).status();
        }
        int64_t t1 = NowNs();
        if (!status.ok()) {
          ++out.errors;
          out.first_error = status.ToString();
          break;  // the client is broken; do not spin on errors
        }
        if (at_start == 1) out.latencies_ns.push_back(t1 - t0);
      }
    });
  }
  gate.Open();
  std::this_thread::sleep_for(options.warmup);
  const CpuSnapshot cpu_start = CpuSnapshot::Take(options.server_pid, options.relay_pid);
  auto measure_start = SteadyClock::now();
  phase.store(1);
  std::this_thread::sleep_for(options.duration);
  phase.store(2);
  auto measure_end = SteadyClock::now();
  const CpuSnapshot cpu_end = CpuSnapshot::Take(options.server_pid, options.relay_pid);
  for (auto& t : threads) t.join();

  std::vector<int64_t> all;
  int64_t errors = 0;
  std::string first_error;
  for (auto& r : results) {
    all.insert(all.end(), r.latencies_ns.begin(), r.latencies_ns.end());
    errors += r.errors;
    if (first_error.empty()) first_error = r.first_error;
  }
  std::sort(all.begin(), all.end());
  double seconds = std::chrono::duration<double>(measure_end - measure_start).count();
  const double ops = static_cast<double>(std::max<size_t>(1, all.size()));
  const double busy = cpu_end.machine.first - cpu_start.machine.first;
  const double jiffies = cpu_end.machine.second - cpu_start.machine.second;
  const double cores = static_cast<double>(std::thread::hardware_concurrency());
  std::string line = absl::StrCat(
      "RESULT ops=", all.size(), " seconds=", seconds,
      " ops_per_s=", static_cast<double>(all.size()) / seconds,
      " p50_us=", static_cast<double>(Percentile(all, 0.50)) / 1e3,
      " p99_us=", static_cast<double>(Percentile(all, 0.99)) / 1e3,
      " client_cpu_us_per_op=", (cpu_end.own_us - cpu_start.own_us) / ops,
      " server_cpu_us_per_op=",
      options.server_pid > 0 ? (cpu_end.server_us - cpu_start.server_us) / ops : 0.0,
      " busy_cores=", jiffies > 0 ? cores * busy / jiffies : 0.0, " errors=", errors);
  if (!first_error.empty()) absl::StrAppend(&line, " error=", OneLine(first_error));
  Emit(line);
  // Tear-down is not measured; leave at once (c10d's and gRPC's destructors
  // of dozens of clients only add time).
  std::_Exit(errors == 0 ? 0 : 1);
}

int RunBarrierClient(const BarrierOptions& options) {
  const size_t n = static_cast<size_t>(options.clients);
  std::vector<std::unique_ptr<BenchStore>> stores(n);
  std::atomic<int> connected{0}, connect_failed{0}, arrived{0}, released{0},
      barrier_failed{0};
  std::atomic<int64_t> last_connect_ns{0}, last_release_ns{0};
  std::mutex error_mu;
  std::string first_error;  // guarded by error_mu
  auto note_error = [&](const absl::Status& status) {
    std::lock_guard<std::mutex> lock(error_mu);
    if (first_error.empty()) first_error = status.ToString();
  };
  auto raise_to = [](std::atomic<int64_t>& max, int64_t value) {
    int64_t seen = max.load();
    while (seen < value && !max.compare_exchange_weak(seen, value)) {
    }
  };
  Gate connect_gate, go_gate;
  const std::vector<std::string> done_key{"done"};
  const std::vector<std::string> targets = absl::StrSplit(options.target, ',');

  std::vector<std::unique_ptr<SmallThread>> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto thread = std::make_unique<SmallThread>([&, i] {
      connect_gate.Pass();
      auto store =
          Connect(options.impl, targets[i % targets.size()], nullptr, options.timeout);
      // Connected means served: TCPStore's constructor returns once the
      // kernel completed the handshake, before its server accepted the socket.
      absl::Status served =
          store.ok() ? (*store)->Check(done_key).status() : store.status();
      if (!served.ok()) {
        note_error(served);
        connect_failed.fetch_add(1);
        return;
      }
      stores[i] = std::move(*store);
      raise_to(last_connect_ns, NowNs());
      connected.fetch_add(1);
      go_gate.Pass();
      BenchStore& s = *stores[i];
      absl::Status status;
      auto count = s.Add("arrived", 1);
      if (!count.ok()) {
        status = count.status();
      } else {
        arrived.fetch_add(1);
        if (*count == options.total) status = s.Set("done", "1");
      }
      if (status.ok()) status = s.Wait(done_key);
      if (!status.ok()) {
        note_error(status);
        barrier_failed.fetch_add(1);
        return;
      }
      raise_to(last_release_ns, NowNs());
      released.fetch_add(1);
    });
    if (!thread->started()) {
      Emit(absl::StrCat("FAILED error=cannot start client thread ", i));
      std::_Exit(1);
    }
    threads.push_back(std::move(thread));
  }

  auto wait_all = [&](const std::function<bool()>& finished) {
    auto next_progress = SteadyClock::now() + std::chrono::seconds(2);
    while (!finished()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      if (SteadyClock::now() >= next_progress) {
        Emit(absl::StrCat("PROGRESS connected=", connected.load(),
                          " arrived=", arrived.load(), " released=", released.load(),
                          " failed=", connect_failed.load() + barrier_failed.load()));
        next_progress += std::chrono::seconds(2);
      }
    }
  };
  auto tail = [&] {
    std::lock_guard<std::mutex> lock(error_mu);
    return first_error.empty() ? std::string() : " error=" + OneLine(first_error);
  };

  Emit("READY");
  std::string command;
  while (std::getline(std::cin, command)) {
    if (command == "CONNECT") {
      connect_gate.Open();
      wait_all(
          [&] { return connected.load() + connect_failed.load() == options.clients; });
      Emit(absl::StrCat("CONNECTED ok=", connected.load(), " failed=",
                        connect_failed.load(), " t_ns=", last_connect_ns.load(), tail()));
    } else if (command == "GO") {
      go_gate.Open();
      wait_all([&] {
        return released.load() + barrier_failed.load() + connect_failed.load() ==
               options.clients;
      });
      Emit(absl::StrCat("DONE ok=", released.load(), " failed=", barrier_failed.load(),
                        " t_ns=", last_release_ns.load(), tail()));
    } else if (command == "EXIT") {
      break;
    }
  }
  // Exit without tearing thousands of clients down one by one; the kernel
  // closes their sockets. Threads may still be parked in the gates.
  std::_Exit(0);
}

namespace {

// Collects the outcome of every simulated node's Join stream.
class RoundTracker {
 public:
  explicit RoundTracker(int nodes)
      : nodes_(nodes), rank_seen_(static_cast<size_t>(nodes), false) {}

  void Assigned(const v1::RoundAssignment& a) {
    int64_t now = NowNs();
    std::lock_guard<std::mutex> lock(mu_);
    ++assigned_;
    last_assigned_ns_ = std::max(last_assigned_ns_, now);
    if (a.group_world_size() != static_cast<uint32_t>(nodes_) ||
        a.world_size() != static_cast<uint32_t>(nodes_))
      world_ok_ = false;
    if (a.group_rank() >= static_cast<uint32_t>(nodes_) || rank_seen_[a.group_rank()]) {
      ranks_ok_ = false;
    } else {
      rank_seen_[a.group_rank()] = true;
    }
    if (assigned_ == nodes_) cv_.notify_all();
  }
  void Unexpected(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = what;
  }
  void Done(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED &&
        error_.empty() && assigned_ < nodes_)
      error_ = "join stream ended: " + status.error_message();
    cv_.notify_all();
  }
  // True when every node was assigned (or some stream ended early) in time.
  bool WaitAssigned(SteadyTime deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline, [this] { return assigned_ == nodes_; });
  }
  bool WaitDone(SteadyTime deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline, [this] { return done_ == nodes_; });
  }

  std::mutex mu_;
  std::condition_variable cv_;
  const int nodes_;
  int assigned_ = 0;              // guarded by mu_
  int done_ = 0;                  // guarded by mu_
  int64_t last_assigned_ns_ = 0;  // guarded by mu_
  std::vector<bool> rank_seen_;   // guarded by mu_
  bool ranks_ok_ = true;          // guarded by mu_
  bool world_ok_ = true;          // guarded by mu_
  std::string error_;             // guarded by mu_
};

// One simulated node: a Join stream read to its end.
class JoinCall final : public grpc::ClientReadReactor<v1::RendezvousEvent> {
 public:
  JoinCall(RoundTracker* tracker, v1::JoinRequest request)
      : tracker_(tracker), request_(std::move(request)) {}

  void Start(v1::Rendezvous::Stub* stub) {
    stub->async()->Join(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    if (event_.has_assigned()) {
      tracker_->Assigned(event_.assigned());
    } else if (event_.has_reform()) {
      tracker_->Unexpected("unexpected reform: " + event_.reform().detail());
    }
    StartRead(&event_);
  }
  void OnDone(const grpc::Status& status) override { tracker_->Done(status); }

 private:
  RoundTracker* const tracker_;
  grpc::ClientContext context_;
  v1::JoinRequest request_;
  v1::RendezvousEvent event_;
};

}  // namespace

int RunRdzvClient(const RdzvOptions& options) {
  const int channels = std::max(1, std::min(options.channels, options.nodes));
  std::vector<std::shared_ptr<grpc::Channel>> conns;
  std::vector<std::unique_ptr<v1::Rendezvous::Stub>> stubs;
  for (int c = 0; c < channels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel = grpc::CreateCustomChannel(options.target,
                                             grpc::InsecureChannelCredentials(), args);
    if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                   std::chrono::seconds(10))) {
      Emit("RESULT assigned=0 error=cannot connect to " + options.target);
      return 1;
    }
    stubs.push_back(v1::Rendezvous::NewStub(channel));
    conns.push_back(std::move(channel));
  }

  RoundTracker tracker(options.nodes);
  std::vector<std::unique_ptr<JoinCall>> calls;
  calls.reserve(static_cast<size_t>(options.nodes));
  for (int i = 0; i < options.nodes; ++i) {
    v1::JoinRequest request;
    request.set_run_id(options.run_id);
    request.set_node_id(absl::StrCat("node-", i));
    request.set_host(absl::StrCat("sim-", i));
    request.set_nproc(1);
    request.set_node_rank_hint(-1);
    auto* config = request.mutable_config();
    config->set_min_nodes(static_cast<uint32_t>(options.nodes));
    config->set_max_nodes(static_cast<uint32_t>(options.nodes));
    // No heartbeats are sent: keep leases longer than the benchmark.
    config->set_keep_alive_interval_ms(600000);
    config->set_keep_alive_max_attempt(3);
    config->set_join_timeout_ms(static_cast<uint32_t>(options.timeout.count()));
    calls.push_back(std::make_unique<JoinCall>(&tracker, std::move(request)));
  }

  // One issuing thread per channel, as `channels` agents' worth of nodes.
  const int64_t start_ns = NowNs();
  std::vector<std::thread> issuers;
  for (int c = 0; c < channels; ++c) {
    issuers.emplace_back([&, c] {
      for (int i = c; i < options.nodes; i += channels)
        calls[static_cast<size_t>(i)]->Start(stubs[static_cast<size_t>(c)].get());
    });
  }
  for (auto& t : issuers) t.join();
  const int64_t issued_ns = NowNs();

  bool all_assigned = tracker.WaitAssigned(SteadyClock::now() + options.timeout);

  // End the run so every stream finishes; cancel whatever is left.
  v1::Rendezvous::Stub closer(conns[0]);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::CloseRequest request;
    request.set_run_id(options.run_id);
    request.set_outcome(v1::OUTCOME_SUCCEEDED);
    request.set_reason("benchmark round done");
    v1::Empty reply;
    grpc::Status status = closer.Close(&context, request, &reply);
    if (!status.ok()) tracker.Unexpected("close: " + status.error_message());
  }
  if (!tracker.WaitDone(SteadyClock::now() + std::chrono::seconds(30))) {
    for (auto& call : calls) call->Cancel();
    if (!tracker.WaitDone(SteadyClock::now() + std::chrono::seconds(30))) {
      Emit("RESULT assigned=0 error=join streams did not end after close and cancel");
      std::_Exit(1);
    }
  }

  std::lock_guard<std::mutex> lock(tracker.mu_);
  std::string line = absl::StrCat(
      "RESULT seconds=", static_cast<double>(tracker.last_assigned_ns_ - start_ns) / 1e9,
      " issue_seconds=", static_cast<double>(issued_ns - start_ns) / 1e9,
      " assigned=", tracker.assigned_, " ranks_ok=", tracker.ranks_ok_ ? 1 : 0,
      " world_ok=", tracker.world_ok_ ? 1 : 0);
  std::string error = tracker.error_;
  if (!all_assigned && error.empty())
    error = absl::StrCat("only ", tracker.assigned_, " of ", options.nodes,
                         " nodes assigned within ", options.timeout.count(), " ms");
  if (!error.empty()) absl::StrAppend(&line, " error=", OneLine(error));
  Emit(line);
  bool ok =
      all_assigned && tracker.ranks_ok_ && tracker.world_ok_ && tracker.error_.empty();
  // Leave without destroying 10,000 reactors whose last callbacks may still be
  // unwinding on gRPC's threads.
  std::_Exit(ok ? 0 : 1);
}

int RunRelays(const std::string& daemon, int count) {
  std::vector<std::unique_ptr<rdzv::StoreRelay>> relays;
  std::vector<std::string> endpoints;
  for (int i = 0; i < count; ++i) {
    rdzv::StoreRelayOptions options;
    options.daemon = daemon;
    auto relay = rdzv::StoreRelay::Start(std::move(options));
    if (!relay.ok()) {
      Emit("RELAY_ERROR " + relay.status().ToString());
      return 1;
    }
    // The namespace stock clients of a daemon with no run see, as the
    // direct runs' clients do.
    (*relay)->SetNamespace("_tcpstore");
    endpoints.push_back(absl::StrCat("127.0.0.1:", (*relay)->port()));
    relays.push_back(std::move(*relay));
  }
  Emit("RELAY_ENDPOINTS=" + absl::StrJoin(endpoints, ","));
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

int RunTcpStoreServer(std::chrono::milliseconds timeout) {
  auto server = TcpStoreServer::Start(timeout);
  if (!server.ok()) {
    std::cerr << "store_bench: " << server.status().message() << "\n";
    return 1;
  }
  Emit(absl::StrCat("TCPSTORE_PORT=", (*server)->port()));
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  std::_Exit(0);
}

}  // namespace meshrun::bench
