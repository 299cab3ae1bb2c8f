#include "agent/agent.h"

#include <arpa/inet.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "agent/agent_state.h"
#include "agent/backoff.h"
#include "agent/dump_helper.h"
#include "agent/endpoint_probe.h"
#include "agent/file_timer_server.h"
#include "agent/hang_detector.h"
#include "agent/health_check.h"
#include "agent/heartbeat_server.h"
#include "agent/resources.h"
#include "agent/stack_dump.h"
#include "agent/worker_env.h"
#include "agent/worker_group.h"
#include "rendezvous/client/endpoint_list.h"
#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/core/step_times.h"
#include "rendezvous/relay/store_relay.h"

namespace meshrun::agent {

namespace v1 = meshrun::v1;
namespace fs = std::filesystem;

namespace {

std::string ReplaceAll(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

// socket.gethostname(), what torchrun 2's ${hostname} shows.
std::string ShortHostName() {
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

std::string Now() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d_%H:%M:%S", std::localtime(&t));
  return buf;
}

std::string SignalName(int number) {
  const char* abbrev = sigabbrev_np(number);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(number);
}

// What torch's @record wrote to TORCHELASTIC_ERROR_FILE: the error message and
// the Python traceback, or empty strings when there is no (valid) file.
struct ErrorFile {
  std::string message;
  std::string traceback;
};

ErrorFile ReadErrorFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::stringstream text;
  text << in.rdbuf();
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(text.str(), &root).ok()) return {};
  ErrorFile out;
  auto message = root.fields().find("message");
  if (message == root.fields().end()) return out;
  if (message->second.has_string_value()) {
    out.message = message->second.string_value();
    return out;
  }
  const auto& fields = message->second.struct_value().fields();
  if (auto m = fields.find("message"); m != fields.end())
    out.message = m->second.string_value();
  if (auto extra = fields.find("extraInfo"); extra != fields.end()) {
    const auto& info = extra->second.struct_value().fields();
    if (auto tb = info.find("py_callstack"); tb != info.end())
      out.traceback = tb->second.string_value();
  }
  return out;
}

RunEnd FromProto(v1::RunOutcome outcome) {
  switch (outcome) {
    case v1::OUTCOME_SUCCEEDED:
      return RunEnd::kSucceeded;
    case v1::OUTCOME_FAILED:
      return RunEnd::kFailed;
    default:
      return RunEnd::kAborted;
  }
}

// A re-form's reason in words, for the log.
const char* ReformWords(v1::ReformReason reason) {
  switch (reason) {
    case v1::REFORM_NODES_WAITING:
      return "nodes are waiting to join";
    case v1::REFORM_NODE_EXPIRED:
      return "a node missed its heartbeats";
    case v1::REFORM_NODE_LEFT:
      return "a node left";
    case v1::REFORM_WORKER_FAILURE:
      return "a worker failed";
    default:
      return "the daemon re-forms the run";
  }
}

// "9m40s", "45s", "1h02m".
std::string Approx(std::chrono::milliseconds duration) {
  long long s = std::max<long long>(0, duration.count() / 1000);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof text, "%lldh%02lldm", s / 3600, (s / 60) % 60);
  } else if (s >= 60) {
    std::snprintf(text, sizeof text, "%lldm%02llds", s / 60, s % 60);
  } else {
    std::snprintf(text, sizeof text, "%llds", s);
  }
  return text;
}

// The agent's calls to the daemon, made one at a time and in order on a
// thread of their own: a slow or unreachable daemon (each call may take its
// whole deadline) must never hold up the event loop, which reaps workers,
// drains their pipes and runs the stop grace timer. Results come back as
// handlers the calls post to the loop.
//
// Thread-safety: Post and Drain from the owner's thread.
class CallQueue {
 public:
  CallQueue() : thread_([this] { Loop(); }) {}
  ~CallQueue() {
    Drain(std::chrono::steady_clock::now(), [] {});
  }

  void Post(std::function<void()> call) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      calls_.push_back(std::move(call));
    }
    cv_.notify_all();
  }

  // Lets the calls posted so far end until `deadline`; then drops those not
  // started, runs `cancel` (which must end the call under way) and joins.
  void Drain(std::chrono::steady_clock::time_point deadline,
             const std::function<void()>& cancel) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!thread_.joinable()) return;
    idle_cv_.wait_until(lock, deadline, [this] { return calls_.empty() && !busy_; });
    stopped_ = true;
    calls_.clear();
    lock.unlock();
    cv_.notify_all();
    cancel();
    thread_.join();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stopped_ || !calls_.empty(); });
      if (calls_.empty()) return;  // stopped
      std::function<void()> call = std::move(calls_.front());
      calls_.pop_front();
      busy_ = true;
      lock.unlock();
      call();
      lock.lock();
      busy_ = false;
      if (calls_.empty()) idle_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<std::function<void()>> calls_;  // guarded by mu_
  bool busy_ = false;                        // guarded by mu_
  bool stopped_ = false;                     // guarded by mu_
  std::thread thread_;
};

// How long an exiting agent lets its last calls to the daemon (a Leave, a
// report) finish. Its exit ends its Join stream, which the daemon takes as a
// departure anyway, so a daemon that does not answer must not hold it longer.
constexpr std::chrono::seconds kExitDrain{2};
// Heartbeat senders (Heartbeat()); each heartbeat's deadline is this many
// intervals.
constexpr int kHeartbeatsInFlight = 3;
// How often an agent that cannot reach the daemon, or waits for other nodes,
// says so.
constexpr std::chrono::seconds kWaitReportEvery{20};
// How long a stack dumper (py-spy, gdb) may take for one worker.
constexpr std::chrono::seconds kStackDumpTimeout{20};

int StreamsFor(const std::vector<int>& per_rank, int all, int local_rank) {
  if (local_rank < static_cast<int>(per_rank.size())) return per_rank[local_rank];
  return all;
}

class Agent {
 public:
  explicit Agent(const AgentOptions& options)
      : options_(options),
        state_(options.nproc, options.replica_size),
        signals_(io_),
        hang_timer_(io_),
        lease_timer_(io_),
        waiting_timer_(io_),
        report_retry_timer_(io_),
        grace_(ReconnectGrace(options)),
        heartbeat_interval_(
            options.run_config.keep_alive_interval_ms() > 0
                ? std::chrono::milliseconds(options.run_config.keep_alive_interval_ms())
                : std::chrono::milliseconds(5000)),
        join_timeout_(
            options.run_config.join_timeout_ms() > 0
                ? std::chrono::milliseconds(options.run_config.join_timeout_ms())
                : std::chrono::milliseconds(600000)) {
    // Restart scope "replica": a group per replica group, so one can stop
    // and start while the others run.
    const int groups =
        options.replica_size > 0 ? options.nproc / options.replica_size : 1;
    for (int group = 0; group < groups; ++group) {
      WorkerGroupOptions group_options;
      group_options.log_setup = group == 0;
      groups_.push_back(std::make_unique<WorkerGroup>(
          io_, [this](const WorkerExit& exit) { OnWorkerExit(exit); }, group_options));
    }
  }

  int Run() {
    for (int number : options_.signals_to_handle) signals_.add(number);
    WaitForSignal();
    if (!StartWorkerWatchdog()) return 1;
    if (!StartHangWatch()) return 1;
    if (!PrepareLogRoot()) return 1;
    channel_ = rdzv::IsEndpointList(options_.rdzv_endpoint)
                   ? rdzv::MakeChannel(options_.rdzv_endpoint, options_.security,
                                       ReplicaChannelArgs(heartbeat_interval_))
                   : rdzv::MakeChannel(options_.rdzv_endpoint, options_.security);
    client_ = std::make_unique<rdzv::RendezvousClient>(channel_);
    // Heartbeats go out on a fixed clock, several in flight (Heartbeat()):
    // each may be answered within kHeartbeatsInFlight intervals.
    heartbeat_client_ = std::make_unique<rdzv::RendezvousClient>(channel_);
    heartbeat_client_->set_call_timeout(heartbeat_interval_ * kHeartbeatsInFlight);
    // Reports for show (worker exits, health) go on the call queue, which
    // the agent's exit drains with a deadline of its own, so they may wait as
    // long as other calls: with 2 s, a node's exits report was dropped under
    // a load average of 13 and the daemon's metrics missed its workers.
    report_client_ = std::make_unique<rdzv::RendezvousClient>(channel_);
    calls_ = std::make_unique<CallQueue>();
    if (!WaitForDaemon()) {
      // A Leave sent on a signal meanwhile cannot reach the daemon anyway.
      calls_->Drain(std::chrono::steady_clock::now(), [this] { client_->CancelCalls(); });
      CleanUpLogRoot();
      return exit_code_;
    }
    std::optional<HealthFailure> failure;
    if (!RunHealthChecksBeforeJoining(&failure)) {
      calls_->Drain(std::chrono::steady_clock::now(), [this] { client_->CancelCalls(); });
      CleanUpLogRoot();
      return exit_code_;
    }
    if (failure) {
      SayUnhealthy(*failure, "before joining");
      (void)report_client_->ReportHealth(HealthReportOf(*failure));
      calls_->Drain(std::chrono::steady_clock::now(), [this] { client_->CancelCalls(); });
      CleanUpLogRoot();
      return kUnhealthyExitCode;
    }
    Join();
    io_.run();
    cancel_stack_dumps_ = true;  // the workers are gone: their stacks are moot
    if (stack_dumper_.joinable()) stack_dumper_.join();
    cancel_health_checks_ = true;  // a re-form's checks need not finish now
    if (health_checker_.joinable()) health_checker_.join();
    StopBackgroundThreads();
    CleanUpLogRoot();
    return exit_code_;
  }

 private:
  // With a list of daemon replicas (rendezvous/client/endpoint_list.h), the
  // agent's channel must leave a daemon whose host went silent (no reset: a
  // cut link, a dead machine) well within the reconnect grace, and find the
  // one that serves next soon after it starts: pings catch a dead connection
  // within two heartbeat intervals (at most 5 s each; the daemon accepts one
  // a second), a connect attempt that hangs gives way to the list's next
  // address after 3 s, and attempts repeat every 2 s at most. One endpoint
  // keeps gRPC's defaults.
  static grpc::ChannelArguments ReplicaChannelArgs(std::chrono::milliseconds interval) {
    const int ping_ms =
        static_cast<int>(std::clamp<int64_t>(interval.count(), 1000, 5000));
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, ping_ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ping_ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, rdzv::kReplicaConnectTimeoutMs);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    return args;
  }

  void WaitForSignal() {
    signals_.async_wait([this](const boost::system::error_code& error, int number) {
      if (error) return;
      spdlog::info("received {}", SignalName(number));
      Dispatch(event::Signal{number});
      WaitForSignal();
    });
  }

  // The daemon may be starting on another node (agent-hosted or static rank
  // 0): wait for it as long as a join may take, saying why it does not answer
  // (at once, then every kWaitReportEvery), and give up at once when what
  // answers is not a meshrun daemon. False: exit with exit_code_.
  bool WaitForDaemon() {
    const auto start = std::chrono::steady_clock::now();
    const auto give_up = start + join_timeout_;
    struct Probe {
      std::mutex mu;
      std::optional<ProbeResult> result;  // guarded by mu
    };
    std::shared_ptr<Probe> probe;
    auto next_probe = start;
    // In slices, so a signal meanwhile still stops the launcher at once.
    while (!channel_->WaitForConnected(std::chrono::system_clock::now() +
                                       std::chrono::milliseconds(100))) {
      io_.poll();
      if (state_.phase() == AgentState::Phase::kExited) return false;
      const auto now = std::chrono::steady_clock::now();
      if (now >= give_up) {
        std::fprintf(stderr,
                     "meshrun: cannot reach the rendezvous daemon at %s within %lld s\n",
                     options_.rdzv_endpoint.c_str(),
                     static_cast<long long>(join_timeout_.count() / 1000));
        exit_code_ = 1;
        return false;
      }
      if (!probe && now >= next_probe) {
        // DNS and connect can block: off this thread. A probe still running
        // when the agent exits only writes to its own shared state.
        probe = std::make_shared<Probe>();
        std::thread([probe, endpoint = options_.rdzv_endpoint,
                     tls = options_.security.tls()] {
          ProbeResult result = ProbeEndpoints(endpoint, tls, std::chrono::seconds(3));
          std::lock_guard<std::mutex> lock(probe->mu);
          probe->result = std::move(result);
        }).detach();
        continue;
      }
      if (!probe) continue;
      std::optional<ProbeResult> result;
      {
        std::lock_guard<std::mutex> lock(probe->mu);
        result = probe->result;
      }
      if (!result) continue;
      probe.reset();
      next_probe = now + kWaitReportEvery;
      if (result->kind == ProbeResult::Kind::kNotMeshrun) {
        std::fprintf(stderr, "meshrun: cannot use the rendezvous endpoint %s: %s\n",
                     options_.rdzv_endpoint.c_str(), result->detail.c_str());
        exit_code_ = 1;
        return false;
      }
      if (result->kind == ProbeResult::Kind::kAnswers) {
        spdlog::info(
            "waiting for the rendezvous daemon at {} ({}), up to {} more",
            options_.rdzv_endpoint, result->detail,
            Approx(std::chrono::duration_cast<std::chrono::milliseconds>(give_up - now)));
      } else {
        spdlog::warn(
            "waiting for the rendezvous daemon at {}: {}; up to {} more",
            options_.rdzv_endpoint, result->detail,
            Approx(std::chrono::duration_cast<std::chrono::milliseconds>(give_up - now)));
      }
    }
    io_.restart();
    return true;
  }

  static std::chrono::milliseconds ReconnectGrace(const AgentOptions& options) {
    if (options.reconnect_grace) return *options.reconnect_grace;
    const auto& config = options.run_config;
    const int64_t interval =
        config.keep_alive_interval_ms() > 0 ? config.keep_alive_interval_ms() : 5000;
    const int64_t attempts =
        config.keep_alive_max_attempt() > 0 ? config.keep_alive_max_attempt() : 3;
    return std::chrono::milliseconds(interval * attempts);
  }

  v1::JoinRequest MakeJoin(uint64_t resume_round) const {
    v1::JoinRequest join;
    join.set_run_id(options_.run_id);
    join.set_node_id(options_.node_id);
    join.set_host(options_.host);
    join.set_nproc(static_cast<uint32_t>(options_.nproc));
    join.set_node_rank_hint(options_.node_rank_hint);
    join.set_resume_round(resume_round);
    *join.mutable_config() = options_.run_config;
    return join;
  }

  void Join() {
    last_contact_ = std::chrono::steady_clock::now();
    lease_until_ = last_contact_ + grace_;
    ArmLeaseTimer();
    reader_ = std::thread([this] { ReadRendezvous(); });
    const auto first = std::chrono::steady_clock::now();
    for (int i = 0; i < kHeartbeatsInFlight; ++i)
      heartbeat_senders_.emplace_back(
          [this, first, i] { Heartbeat(first + heartbeat_interval_ * (i + 1)); });
  }

  // Codes after which re-opening the stream cannot help: the daemon refused
  // this node (bad or conflicting options, a newer join of the same node,
  // credentials).
  static bool Definitive(absl::StatusCode code) {
    switch (code) {
      case absl::StatusCode::kUnavailable:
      case absl::StatusCode::kCancelled:
      case absl::StatusCode::kUnknown:
      case absl::StatusCode::kInternal:
      case absl::StatusCode::kDeadlineExceeded:
        return false;
      default:
        return true;
    }
  }

  // Runs on its own thread: holds the Join stream open and turns the
  // daemon's pushes into events on io_. When the stream breaks, the workers
  // keep running and the stream is re-opened with backoff, resuming this
  // node's round, until the lease watchdog (on io_) gives up. Once the agent
  // leaves, it never joins again.
  void ReadRendezvous() {
    Backoff backoff(std::chrono::milliseconds(100), std::chrono::milliseconds(2000),
                    std::hash<std::string>{}(options_.node_id) ^
                        static_cast<uint64_t>(
                            std::chrono::steady_clock::now().time_since_epoch().count()));
    while (true) {
      const uint64_t resume = resume_round_.load();
      rdzv::RendezvousClient::JoinSession* session = nullptr;
      std::unique_ptr<rdzv::RendezvousClient::JoinSession> old;
      {
        std::lock_guard<std::mutex> lock(stop_mu_);
        if (stop_threads_ || leaving_) return;
        rejoin_requested_ = false;
        old = std::move(session_);
        session_ = client_->Join(MakeJoin(resume));
        session = session_.get();
      }
      old.reset();  // waits for its call to end; not under stop_mu_
      // Before any event of the new stream (posts run in order).
      boost::asio::post(io_, [this] { heard_on_stream_ = false; });
      absl::Status ended;
      while (true) {
        auto next = session->Next(std::chrono::hours(24 * 365));
        if (!next.ok()) {
          if (next.status().code() == absl::StatusCode::kDeadlineExceeded) continue;
          ended = next.status();
          break;
        }
        backoff.Reset();
        v1::RendezvousEvent pushed = std::move(*next);
        bool terminal = pushed.has_closed();
        boost::asio::post(io_, [this, pushed] { OnRendezvousEvent(pushed); });
        if (terminal) return;
      }
      {
        std::lock_guard<std::mutex> lock(stop_mu_);
        if (stop_threads_ || leaving_) return;
        // The agent ended the stream to join again (see OnNotKnown).
        if (rejoin_requested_) continue;
      }
      std::string reason(ended.message());
      if (ended.code() == absl::StatusCode::kNotFound && resume != 0) {
        // The daemon does not know this node in that round: stop the
        // workers and join afresh at once, once io_ has taken the round
        // back (then resume_round_ no longer names it).
        std::unique_lock<std::mutex> lock(stop_mu_);
        round_lost_taken_ = false;
        boost::asio::post(io_, [this, reason] {
          if (!closed_ && !left_) {
            spdlog::warn("{}; stopping the workers and joining afresh", reason);
            Dispatch(event::RoundLost{reason});
            // A fresh join is a new round for this node: checked as at a re-form.
            StartHealthChecks();
          }
          {
            std::lock_guard<std::mutex> taken(stop_mu_);
            round_lost_taken_ = true;
          }
          stop_cv_.notify_all();
        });
        stop_cv_.wait(lock,
                      [this] { return stop_threads_ || leaving_ || round_lost_taken_; });
        continue;
      }
      if (Definitive(ended.code())) {
        boost::asio::post(io_, [this, reason] {
          if (!closed_ && !left_) Dispatch(event::RendezvousLost{reason});
        });
        return;
      }
      boost::asio::post(io_, [this, reason] { OnDisconnected(reason); });
      std::unique_lock<std::mutex> lock(stop_mu_);
      if (stop_cv_.wait_for(lock, backoff.Next(), [this] { return stop_threads_; }))
        return;
    }
  }

  // One of kHeartbeatsInFlight senders, staggered one interval apart from
  // `first`: together a heartbeat every interval, each allowed
  // kHeartbeatsInFlight intervals for its answer, and a slow answer holds
  // back only its own sender's next one. So a daemon that answers slowly
  // (under load) still sees this node every interval and refreshes its
  // lease here. (One sender waiting on each answer: with a one-interval
  // deadline a daemon slower than that for the grace lost its node,
  // soak_test; with a longer one the heartbeats fell behind the daemon's
  // lease, PartitionTest.)
  void Heartbeat(std::chrono::steady_clock::time_point next) {
    std::unique_lock<std::mutex> lock(stop_mu_);
    while (!stop_threads_ && !leaving_) {
      if (stop_cv_.wait_until(lock, next, [this] { return stop_threads_ || leaving_; }))
        break;
      next = std::max(next + heartbeat_interval_ * kHeartbeatsInFlight,
                      std::chrono::steady_clock::now());
      std::vector<v1::RankStepTime> steps;
      for (const auto& [rank, step] : step_times_) steps.push_back(step);
      lock.unlock();
      auto reply = heartbeat_client_->Heartbeat(options_.run_id, options_.node_id, steps);
      lock.lock();
      if (reply.ok()) {
        boost::asio::post(io_, [this] { OnContact(); });
      } else if (reply.status().code() == absl::StatusCode::kNotFound) {
        std::string reason(reply.status().message());
        boost::asio::post(io_, [this, reason] { OnNotKnown(reason); });
      } else {
        std::string reason(reply.status().message());
        boost::asio::post(io_, [this, reason] { OnHeartbeatFailed(reason); });
      }
    }
  }

  // A sign of life from the daemon: it knows this node.
  void OnContact() {
    last_contact_ = std::chrono::steady_clock::now();
    lease_until_ = std::max(lease_until_, last_contact_ + grace_);
    heartbeat_failing_ = false;
    if (disconnected_) {
      disconnected_ = false;
      spdlog::info("reconnected to the rendezvous daemon at {}", options_.rdzv_endpoint);
    }
  }

  void OnHeartbeatFailed(const std::string& reason) {
    if (heartbeat_failing_ || closed_ || left_) return;
    heartbeat_failing_ = true;
    spdlog::warn("heartbeat to {} failed: {}", options_.rdzv_endpoint, reason);
  }

  // The daemon answered a heartbeat, but does not know this node: its lease
  // ran out (this agent was stalled or cut off for longer than the lease,
  // and the others re-formed without it), or the daemon lost its state.
  // Either way the workers' round may be gone: re-open the stream at once;
  // its resume says whether the round still exists.
  void OnNotKnown(const std::string& reason) {
    // Not before the daemon has answered this stream's join: the heartbeat
    // may have overtaken it.
    if (closed_ || left_ || !heard_on_stream_) return;
    OnContact();  // the daemon is there
    {
      std::lock_guard<std::mutex> lock(stop_mu_);
      if (rejoin_requested_) return;  // re-joining already
    }
    const bool run_known = reason.rfind("unknown run", 0) != 0;
    spdlog::warn(
        "{}: {}; re-joining the run",
        run_known ? "the rendezvous daemon expelled this node (no heartbeat within its "
                    "lease: this agent was stalled or cut off)"
                  : "the rendezvous daemon no longer knows this run (it restarted "
                    "without its state)",
        reason);
    {
      std::lock_guard<std::mutex> lock(stop_mu_);
      if (rejoin_requested_) return;  // one re-join per stream
      rejoin_requested_ = true;
      if (session_) session_->Cancel();
    }
    // The round it joins is a new one for this node: checked as at a re-form.
    StartHealthChecks();
  }

  void OnDisconnected(const std::string& reason) {
    if (closed_ || left_ || disconnected_) return;
    disconnected_ = true;
    const auto left = std::max(lease_until_ - std::chrono::steady_clock::now(),
                               std::chrono::steady_clock::duration::zero());
    spdlog::warn(
        "lost the rendezvous daemon at {} ({}); the workers keep running while "
        "reconnecting, for up to {:.1f} s",
        options_.rdzv_endpoint, reason, std::chrono::duration<double>(left).count());
  }

  // The agent's lease: without a sign of life from the daemon for grace_,
  // the workers stop (a cut-off node must not train on while the others
  // re-form without it) and the agent exits. The lease counts time this
  // agent ran: a timer that fires far too late means the process was not
  // running (SIGSTOP, a VM pause, a swap storm), and then the heartbeat it
  // sends on waking gets one call timeout to say whether the daemon is
  // there (and whether it still knows this node) before the agent gives up.
  void ArmLeaseTimer() {
    const auto due = lease_until_;
    lease_timer_.expires_at(due);
    lease_timer_.async_wait([this, due](const boost::system::error_code& error) {
      if (error) return;
      const auto now = std::chrono::steady_clock::now();
      if (now - due > std::max<std::chrono::steady_clock::duration>(
                          heartbeat_interval_, std::chrono::seconds(1))) {
        lease_until_ =
            std::max(lease_until_, now + heartbeat_interval_ * (kHeartbeatsInFlight + 1));
      }
      if (now < lease_until_) {
        ArmLeaseTimer();
        return;
      }
      if (closed_ || left_) return;
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%.1f",
                    std::chrono::duration<double>(grace_).count());
      Dispatch(event::LeaseExpired{
          std::string("lost the rendezvous daemon at ") + options_.rdzv_endpoint +
          ": no successful heartbeat for " + seconds +
          " s (--rdzv-reconnect-grace); stopped this node's workers"});
    });
  }

  void StopBackgroundThreads() {
    {
      std::lock_guard<std::mutex> lock(stop_mu_);
      stop_threads_ = true;
    }
    stop_cv_.notify_all();
    lease_timer_.cancel();
    waiting_timer_.cancel();
    report_retry_timer_.cancel();
    // A heartbeat waiting on a daemon that does not answer ends now.
    heartbeat_client_->CancelCalls();
    for (std::thread& sender : heartbeat_senders_) sender.join();
    heartbeat_senders_.clear();
    {
      std::lock_guard<std::mutex> lock(stop_mu_);
      if (session_) session_->Cancel();
    }
    if (reader_.joinable()) reader_.join();
    calls_->Drain(std::chrono::steady_clock::now() + kExitDrain, [this] {
      client_->CancelCalls();
      report_client_->CancelCalls();
    });
  }

  // While this node waits for a round to form, say how many nodes are in
  // and how long the daemon waits for the rest (its join timeout started
  // with the round's first node, so the time left is at most this): on
  // joining at once, after a re-form (which mostly completes within moments)
  // only if the wait lasts.
  void StartWaitingReports(bool at_once) {
    if (waiting_since_) return;
    waiting_since_ = std::chrono::steady_clock::now();
    if (at_once) {
      ReportWaiting();
      return;
    }
    waiting_timer_.expires_after(kWaitReportEvery);
    waiting_timer_.async_wait([this](const boost::system::error_code& error) {
      if (!error) ReportWaiting();
    });
  }

  void StopWaitingReports() {
    waiting_since_.reset();
    waiting_timer_.cancel();
  }

  void ReportWaiting() {
    waiting_timer_.expires_after(kWaitReportEvery);
    waiting_timer_.async_wait([this](const boost::system::error_code& error) {
      if (!error) ReportWaiting();
    });
    v1::StatusRequest request;
    request.set_run_id(options_.run_id);
    calls_->Post([this, request] {
      auto reply = report_client_->Status(request);
      boost::asio::post(io_, [this, reply] {
        if (!waiting_since_ || closed_ || left_ || !reply.ok() || reply->runs_size() != 1)
          return;
        const v1::RunStatus& run = reply->runs(0);
        if (run.state() != "gathering") return;
        int joined = 0;
        for (const v1::NodeStatus& node : run.nodes())
          if (node.state() == "gathering") ++joined;
        const std::string of = run.min_nodes() == run.max_nodes()
                                   ? std::to_string(run.min_nodes())
                                   : std::to_string(run.min_nodes()) + ".." +
                                         std::to_string(run.max_nodes());
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - *waiting_since_);
        spdlog::info("{} of {} nodes joined round {}, waiting up to {} more", joined, of,
                     run.round(), Approx(join_timeout_ - waited));
      });
    });
  }

  void OnRendezvousEvent(const v1::RendezvousEvent& pushed) {
    OnContact();
    heard_on_stream_ = true;
    // The next round waits for this node's health checks (OnHealthChecked).
    if (pushed.has_assigned() && checking_health_) {
      held_assignment_ = pushed;
      return;
    }
    if (pushed.has_assigned()) {
      // As below, for replica failures not answered yet (the agent resumes
      // the round, which goes on).
      for (const auto& [replica, report] : unreported_replica_failures_)
        if (report.round() == pushed.assigned().round()) SendFailure(report);
    }
    if (pushed.has_assigned() && unreported_failure_ &&
        pushed.assigned().round() == unreported_failure_->round) {
      // The daemon (restarted, or reached again) still runs the round whose
      // failure it has not acknowledged: tell it (again; it counts a failure
      // once); the re-form follows.
      SendFailure(unreported_failure_->report);
      return;
    }
    if (pushed.has_waiting()) {
      StartWaitingReports(/*at_once=*/true);
      return;
    }
    if (pushed.has_assigned()) {
      StopWaitingReports();
      const auto& a = pushed.assigned();
      RoundInfo round;
      round.round = a.round();
      round.group_rank = a.group_rank();
      round.group_world_size = a.group_world_size();
      round.rank_base = a.rank_base();
      round.world_size = a.world_size();
      round.restart_count = a.restart_count();
      round.store_prefix = a.store_prefix();
      round.admission_epoch = a.admission_epoch();
      round.serves_tcpstore = a.serves_tcpstore();
      spdlog::info("round {}: group rank {}/{}, ranks {}..{} of {}, restart {}",
                   round.round, round.group_rank, round.group_world_size, round.rank_base,
                   round.rank_base + options_.nproc - 1, round.world_size,
                   round.restart_count);
      Dispatch(event::Assigned{round});
    } else if (pushed.has_reform()) {
      spdlog::info("re-forming into round {}: {} ({})", pushed.reform().next_round(),
                   ReformWords(pushed.reform().reason()), pushed.reform().detail());
      Dispatch(event::Reform{pushed.reform().next_round(), pushed.reform().detail()});
      StartWaitingReports(/*at_once=*/false);
      StartHealthChecks();
    } else if (pushed.has_closed()) {
      closed_ = true;
      Dispatch(
          event::Closed{FromProto(pushed.closed().outcome()), pushed.closed().reason()});
    }
  }

  // torchrun's worker watchdog when the agent's environment has
  // TORCHELASTIC_ENABLE_FILE_TIMER=1: a FIFO at TORCHELASTIC_TIMER_FILE (else
  // a fresh one in the temporary directory, as torchrun names it) that the
  // workers' torch.distributed.elastic.timer.FileTimerClient writes to.
  // False: it cannot start (said why).
  bool StartWorkerWatchdog() {
    const char* enabled = getenv("TORCHELASTIC_ENABLE_FILE_TIMER");
    if (enabled == nullptr || std::string_view(enabled) != "1") return true;
    const char* given = getenv("TORCHELASTIC_TIMER_FILE");
    std::string path;
    if (given != nullptr && *given != '\0') {
      path = given;
    } else {
      std::random_device random;
      char name[64];
      std::snprintf(name, sizeof name, "watchdog_timer_%08x%08x", random(), random());
      path = (fs::temp_directory_path() / name).string();
    }
    FileTimerServer::Callbacks callbacks;
    callbacks.is_worker = [this](pid_t pid) {
      for (const auto& group : groups_) {
        for (pid_t worker : group->pids())
          if (worker == pid) return true;
      }
      return false;
    };
    callbacks.expired = [this](const ExpiredWorker& expired) { OnTimerExpired(expired); };
    auto started = FileTimerServer::Start(io_, path, std::move(callbacks));
    if (!started.ok()) {
      spdlog::error("{}", std::string(started.status().message()));
      return false;
    }
    worker_watchdog_ = std::move(*started);
    spdlog::info("worker watchdog: serving torch's FileTimerClient at {}", path);
    return true;
  }

  void OnTimerExpired(const ExpiredWorker& expired) {
    if (expired.signal <= 0) {
      spdlog::warn(
          "worker watchdog: the timer '{}' of pid {} expired {:.1f} s ago; it names no "
          "signal, so the worker runs on",
          expired.scope_id, expired.pid, expired.overdue_s);
      return;
    }
    for (const auto& group : groups_) {
      if (std::optional<int> local_rank =
              group->SignalWorker(expired.pid, expired.signal)) {
        spdlog::warn(
            "worker watchdog: the timer '{}' of local rank {} (pid {}) "
            "expired {:.1f} s ago: sent {}",
            expired.scope_id, *local_rank, expired.pid, expired.overdue_s,
            SignalName(expired.signal));
        expired_timers_[expired.pid] = expired.scope_id;
        return;
      }
    }
  }

  // --hang-timeout: every group's progress sampled a few times a timeout
  // (agent/hang_detector.h), and the workers' heartbeats. False: it cannot
  // start (said why).
  bool StartHangWatch() {
    if (options_.hang_timeout.count() <= 0) return true;
    for (size_t group = 0; group < groups_.size(); ++group)
      hang_detectors_.emplace_back(options_.hang_timeout);
    // Before any worker: the workers name it as the one that may trace them
    // (agent/dump_helper.h). Without it the stacks are taken from the agent,
    // which Yama's ptrace_scope 1 refuses (then the kernel's view is shown).
    if (auto helper = DumpHelper::Start(); helper.ok()) {
      dump_helper_ = std::move(*helper);
    } else {
      spdlog::warn(
          "hang watch: no stack dump helper ({}); stacks are taken from the agent",
          std::string(helper.status().message()));
    }
    auto started =
        HeartbeatServer::Start(io_, [this](pid_t pid, std::optional<double> step) {
          for (size_t group = 0; group < groups_.size(); ++group) {
            if (std::optional<int> rank = groups_[group]->GlobalRankOf(pid)) {
              hang_detectors_[group].Heartbeat(pid, std::chrono::steady_clock::now());
              if (step) NoteStepTime(*rank, *step);
              return true;
            }
          }
          return false;
        });
    if (!started.ok()) {
      spdlog::error("{}", std::string(started.status().message()));
      return false;
    }
    heartbeats_ = std::move(*started);
    stack_tools_ = FindStackTools(options_.worker_argv);
    spdlog::debug("hang watch: {} s; py-spy: {}; gdb: {}",
                  options_.hang_timeout.count() / 1000.0,
                  stack_tools_.py_spy.empty() ? "none" : stack_tools_.py_spy,
                  stack_tools_.gdb.empty() ? "none" : stack_tools_.gdb);
    ArmHangTimer();
    return true;
  }

  // A worker's step time (meshrun.heartbeat(step_seconds=...)): kept by rank
  // and sent with the next keep-alive, for the daemon's stragglers.
  void NoteStepTime(int rank, double seconds) {
    rdzv::StepWindow& window = step_windows_[rank];
    window.Add(seconds);
    v1::RankStepTime step;
    step.set_rank(static_cast<uint32_t>(rank));
    step.set_mean_seconds(window.mean());
    step.set_steps(window.steps());
    std::lock_guard<std::mutex> lock(stop_mu_);
    step_times_[rank] = step;
  }

  // A tenth of the timeout between samples (a hang is seen within 1.1x the
  // timeout), but at most 10 s: under the 30-minute default a node of many
  // workers reads their CPU time every 10 s, not every second.
  void ArmHangTimer() {
    const auto interval = std::clamp<std::chrono::milliseconds>(
        options_.hang_timeout / 10, std::chrono::milliseconds(100),
        std::chrono::seconds(10));
    hang_timer_.expires_after(interval);
    hang_timer_.async_wait([this](const boost::system::error_code& error) {
      if (error) return;
      CheckForHangs();
      ArmHangTimer();
    });
  }

  void CheckForHangs() {
    const auto now = std::chrono::steady_clock::now();
    const bool running = state_.phase() == AgentState::Phase::kRunning;
    for (size_t group = 0; group < groups_.size(); ++group) {
      std::vector<WorkerProgress> progress;
      if (running && !groups_[group]->stopping()) progress = groups_[group]->Progress();
      if (std::optional<Hang> hang = hang_detectors_[group].Observe(now, progress))
        OnHang(*groups_[group], *hang);
    }
  }

  // A group made no progress for --hang-timeout: its workers' stacks are
  // taken (off io_, each tool bounded), printed and kept beside their logs,
  // then the workers are SIGKILLed and their exits handled as any failure.
  void OnHang(const WorkerGroup& group, const Hang& hang) {
    const double quiet_s = std::chrono::duration<double>(hang.quiet_for).count();
    const std::string why =
        absl::StrFormat("no progress for %.1f s (%s)", quiet_s,
                        hang.by_heartbeat ? "no heartbeat" : "no CPU time and no output");
    std::vector<std::pair<pid_t, int>> hung;  // pid, local rank
    for (pid_t pid : group.pids()) {
      if (std::optional<int> local_rank = group.LocalRankOf(pid)) {
        hung.emplace_back(pid, *local_rank);
        hung_workers_[pid] = why;
      }
    }
    if (hung.empty()) return;
    // One dump at a time: a group that hangs while another's stacks are being
    // taken is stopped without (rare: both wait for the same peer, whose
    // stacks are the ones that tell).
    spdlog::error("hang: local ranks {}..{} made {}; {}", hung.front().second,
                  hung.back().second, why,
                  dumping_stacks_ ? "stopping them (no stacks: another dump is under way)"
                                  : "taking their stacks, then stopping them");
    if (dumping_stacks_) {
      KillHung(hung);
      return;
    }
    if (stack_dumper_.joinable()) stack_dumper_.join();
    dumping_stacks_ = true;
    std::vector<std::string> files;
    for (const auto& [pid, local_rank] : hung) {
      const std::string error_file = ErrorFilePath(local_rank);
      files.push_back(error_file.empty()
                          ? std::string()
                          : (fs::path(error_file).parent_path() / "stacks.txt").string());
    }
    stack_dumper_ = std::thread([this, hung, files, tools = stack_tools_] {
      std::vector<std::string> dumps;
      for (const auto& [pid, local_rank] : hung)
        dumps.push_back(DumpStacks(pid, tools, kStackDumpTimeout, &cancel_stack_dumps_,
                                   dump_helper_.get()));
      boost::asio::post(io_, [this, hung, files, dumps] {
        dumping_stacks_ = false;
        for (size_t i = 0; i < hung.size(); ++i) {
          spdlog::warn("hang: stacks of local rank {} (pid {}), {}", hung[i].second,
                       hung[i].first, dumps[i]);
          if (files[i].empty()) continue;
          std::ofstream out(files[i]);
          out << dumps[i];
          if (out)
            spdlog::info("hang: local rank {}'s stacks are in {}", hung[i].second,
                         files[i]);
        }
        KillHung(hung);
      });
    });
  }

  void KillHung(const std::vector<std::pair<pid_t, int>>& hung) {
    for (const auto& [pid, local_rank] : hung) {
      for (const auto& group : groups_)
        if (group->SignalWorker(pid, SIGKILL)) break;
    }
  }

  // --health-check: the checks, before the first join, and at each re-form
  // or fresh join (on a thread of their own, while the workers stop; the next
  // round's assignment waits for them). An agent that exits cancels them.
  std::optional<HealthFailure> RunHealthChecksNow() {
    if (options_.health_checks.empty()) return std::nullopt;
    return RunHealthChecks(options_.health_checks, options_.health_check_timeout,
                           &cancel_health_checks_);
  }

  // Before the first join: on a thread, while this one serves signals (as
  // WaitForDaemon does), so SIGTERM need not wait out a hanging check. False:
  // the agent exits meanwhile, with exit_code_.
  bool RunHealthChecksBeforeJoining(std::optional<HealthFailure>* failure) {
    if (options_.health_checks.empty()) return true;
    std::future<std::optional<HealthFailure>> checked =
        std::async(std::launch::async, [this] { return RunHealthChecksNow(); });
    while (checked.wait_for(std::chrono::milliseconds(100)) !=
           std::future_status::ready) {
      io_.poll();
      if (state_.phase() == AgentState::Phase::kExited) cancel_health_checks_ = true;
    }
    *failure = checked.get();
    return state_.phase() != AgentState::Phase::kExited;
  }

  void StartHealthChecks() {
    if (options_.health_checks.empty() || checking_health_) return;
    checking_health_ = true;
    if (health_checker_.joinable()) health_checker_.join();
    health_checker_ = std::thread([this] {
      std::optional<HealthFailure> failure = RunHealthChecksNow();
      boost::asio::post(io_, [this, failure] { OnHealthChecked(failure); });
    });
  }

  void OnHealthChecked(const std::optional<HealthFailure>& failure) {
    checking_health_ = false;
    std::optional<v1::RendezvousEvent> held = std::move(held_assignment_);
    held_assignment_.reset();
    if (!failure) {
      if (held) OnRendezvousEvent(*held);
      return;
    }
    SayUnhealthy(*failure, "before the restart");
    calls_->Post([this, report = HealthReportOf(*failure)] {
      absl::Status status = report_client_->ReportHealth(report);
      if (!status.ok())
        spdlog::warn("cannot tell the daemon this node is unhealthy: {}",
                     std::string(status.message()));
    });
    Dispatch(event::Unhealthy{failure->Summary()});
  }

  void SayUnhealthy(const HealthFailure& failure, const char* when) {
    spdlog::error("{}: {}; this node stays out of run {}", when, failure.Summary(),
                  options_.run_id);
    if (!failure.output.empty())
      spdlog::error("output of the health check '{}':\n{}", failure.check,
                    failure.output);
  }

  v1::HealthReport HealthReportOf(const HealthFailure& failure) const {
    v1::HealthReport report;
    report.set_run_id(options_.run_id);
    report.set_node_id(options_.node_id);
    report.set_host(options_.host);
    report.set_check(failure.check);
    report.set_outcome(failure.outcome);
    report.set_output(failure.output);
    return report;
  }

  void OnWorkerExit(const WorkerExit& exit) {
    if (worker_watchdog_) worker_watchdog_->Forget(exit.pid);
    ExitInfo info;
    info.local_rank = exit.local_rank;
    info.global_rank = exit.global_rank;
    info.exit_code = exit.signal != 0 ? 0 : exit.exit_code;  // -1: status unknown
    info.signal = exit.signal;
    v1::WorkerExit record;
    record.set_local_rank(static_cast<uint32_t>(exit.local_rank));
    record.set_global_rank(static_cast<uint32_t>(exit.global_rank));
    record.set_exit_code(exit.signal != 0 ? -1 : info.exit_code);
    record.set_signal(exit.signal);
    record.set_time_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                exit.when.time_since_epoch())
                                .count());
    *round_exits_.add_exits() = record;
    if (info.failed() && state_.phase() == AgentState::Phase::kRunning) {
      last_failure_detail_[exit.local_rank] = DescribeFailure(info, exit.pid);
      v1::FailureCause& cause = failure_causes_[exit.local_rank];
      cause.Clear();
      *cause.mutable_exit() = record;
      cause.set_host(options_.host);
      ErrorFile error = ReadErrorFile(ErrorFilePath(exit.local_rank));
      cause.set_message(error.message);
      if (auto hang = hung_workers_.find(exit.pid);
          hang != hung_workers_.end() && error.message.empty())
        cause.set_message("hung: " + hang->second);
      cause.set_traceback(TracebackExcerpt(error.traceback));
    }
    expired_timers_.erase(exit.pid);
    hung_workers_.erase(exit.pid);
    Dispatch(event::WorkerExited{info});
    // Every local worker of the round has ended: tell the daemon how, for
    // the status page and metrics. Best effort; the run does not depend on it.
    // (Not while a replica group restarts: its exits join the round's.)
    if (LiveWorkers() == 0 && state_.phase() != AgentState::Phase::kRunning &&
        round_exits_.exits_size() > 0) {
      round_exits_.set_run_id(options_.run_id);
      round_exits_.set_node_id(options_.node_id);
      round_exits_.set_host(options_.host);
      calls_->Post([this, report = round_exits_] {
        absl::Status status = report_client_->ReportWorkerExits(report);
        if (!status.ok())
          spdlog::debug("cannot report worker exits: {}", std::string(status.message()));
      });
      round_exits_.Clear();
    }
  }

  // The end of a Python traceback is where the error is; keep its last
  // lines, up to kMaxTracebackBytes.
  static std::string TracebackExcerpt(const std::string& traceback) {
    constexpr size_t kMaxTracebackBytes = 4096;
    if (traceback.size() <= kMaxTracebackBytes) return traceback;
    size_t from = traceback.size() - kMaxTracebackBytes;
    size_t line = traceback.find('\n', from);
    if (line != std::string::npos && line + 1 < traceback.size()) from = line + 1;
    return "...\n" + traceback.substr(from);
  }

  std::string DescribeFailure(const ExitInfo& exit, pid_t pid) {
    std::ostringstream out;
    out << "  time      : " << Now() << "\n"
        << "  host      : " << options_.host << "\n"
        << "  rank      : " << exit.global_rank << " (local_rank: " << exit.local_rank
        << ")\n";
    if (exit.signal != 0) {
      out << "  exitcode  : " << -exit.signal << " (pid: " << pid << ", "
          << SignalName(exit.signal) << ")\n";
    } else {
      out << "  exitcode  : " << exit.exit_code << " (pid: " << pid << ")\n";
    }
    if (auto timer = expired_timers_.find(pid); timer != expired_timers_.end())
      out << "  watchdog  : its timer '" << timer->second << "' expired\n";
    if (auto hang = hung_workers_.find(pid); hang != hung_workers_.end())
      out << "  hang      : " << hang->second << " (--hang-timeout)\n";
    std::string path = ErrorFilePath(exit.local_rank);
    ErrorFile error = ReadErrorFile(path);
    if (!error.message.empty() || !error.traceback.empty()) {
      out << "  error_file: " << path << "\n";
      if (!error.message.empty()) out << "  message   : " << error.message << "\n";
      if (!error.traceback.empty()) out << "  traceback :\n" << error.traceback;
    } else {
      out << "  error_file: <N/A>\n"
          << "  traceback : To enable traceback see: "
             "https://pytorch.org/docs/stable/elastic/errors.html\n";
    }
    return out.str();
  }

  void Dispatch(const Event& event) {
    for (const Action& action : state_.Step(event)) Perform(action);
    resume_round_.store(state_.resumable_round().value_or(0));
  }

  void Perform(const Action& action) {
    if (auto* start = std::get_if<action::StartWorkers>(&action)) {
      StartWorkers(start->round);
    } else if (auto* stop = std::get_if<action::StopWorkers>(&action)) {
      auto left = std::make_shared<size_t>(groups_.size());
      for (auto& group : groups_) {
        group->Stop(stop->signal, options_.shutdown_timeout, [this, left] {
          if (--*left == 0)
            boost::asio::post(io_, [this] { Dispatch(event::WorkersStopped{}); });
        });
      }
    } else if (auto* stop_replica = std::get_if<action::StopReplica>(&action)) {
      groups_[stop_replica->group]->Stop(stop_replica->signal, options_.shutdown_timeout,
                                         [this, replica = stop_replica->replica] {
                                           boost::asio::post(io_, [this, replica] {
                                             Dispatch(event::ReplicaStopped{replica});
                                           });
                                         });
    } else if (auto* start_replica = std::get_if<action::StartReplica>(&action)) {
      spdlog::info("restarting replica group {} (replica restart {}, restart {})",
                   start_replica->replica, start_replica->restarts,
                   start_replica->round.restart_count);
      StartGroup(start_replica->round, start_replica->group, start_replica->restarts,
                 MakeLineCopies(start_replica->round));
    } else if (auto* forward = std::get_if<action::ForwardSignal>(&action)) {
      // Not a stop (e.g. SLURM's --signal=USR1@N warning): the workers go on.
      spdlog::info("forwarding {} to the workers", SignalName(forward->number));
      for (auto& group : groups_) group->Signal(forward->number);
    } else if (auto* failure = std::get_if<action::ReportFailure>(&action)) {
      v1::FailureReport report;
      report.set_run_id(options_.run_id);
      report.set_node_id(options_.node_id);
      report.set_round(failure->round);
      report.set_detail("[" + std::to_string(failure->exit.global_rank) + "]:\n" +
                        last_failure_detail_[failure->exit.local_rank]);
      if (auto cause = failure_causes_.find(failure->exit.local_rank);
          cause != failure_causes_.end())
        *report.mutable_cause() = cause->second;
      if (failure->replica) {
        const ExitInfo& exit = failure->exit;
        spdlog::warn("rank {} failed ({}); stopping its replica group {} (ranks {}..{})",
                     exit.global_rank,
                     exit.signal != 0 ? SignalName(exit.signal)
                                      : "exit code " + std::to_string(exit.exit_code),
                     *failure->replica, *failure->replica * options_.replica_size,
                     (*failure->replica + 1) * options_.replica_size - 1);
        // Its group restarts only on the daemon's answer: sent again until
        // answered (the daemon counts one incarnation's failure once).
        report.set_replica(*failure->replica);
        report.set_replica_restarts(failure->replica_restarts);
        unreported_replica_failures_[*failure->replica] = report;
        SendFailure(report);
        return;
      }
      // Unacknowledged until the daemon answers: sent again when it re-sends
      // this round's assignment.
      unreported_failure_ = UnreportedFailure{failure->round, report};
      SendFailure(report);
    } else if (auto* success = std::get_if<action::ReportSuccess>(&action)) {
      calls_->Post([this, round = success->round] {
        absl::Status status =
            client_->ReportSuccess(options_.run_id, options_.node_id, round);
        if (!status.ok())
          spdlog::error("cannot report success to the daemon: {}",
                        std::string(status.message()));
      });
    } else if (std::holds_alternative<action::LeaveRun>(action)) {
      left_ = true;  // the stream ends now, and that is expected
      {
        // No re-join and no heartbeat after this: the node is gone.
        std::lock_guard<std::mutex> lock(stop_mu_);
        leaving_ = true;
      }
      stop_cv_.notify_all();
      StopWaitingReports();
      calls_->Post([this] { (void)client_->Leave(options_.run_id, options_.node_id); });
    } else if (auto* exit = std::get_if<action::Exit>(&action)) {
      Finish(*exit);
    }
  }

  void SendFailure(const v1::FailureReport& report) {
    calls_->Post([this, report] {
      auto verdict = client_->ReportFailure(report);
      boost::asio::post(io_, [this, verdict, report, round = report.round()] {
        if (report.has_replica()) {
          OnReplicaVerdict(report, verdict);
          return;
        }
        if (!verdict.ok()) {
          spdlog::error("cannot report the failure to the daemon: {}",
                        std::string(verdict.status().message()));
          return;
        }
        if (unreported_failure_ && unreported_failure_->round == round)
          unreported_failure_.reset();
        if (verdict->will_restart())
          spdlog::warn("worker failed; restarting the run (restart {} of {})",
                       verdict->restart_count(), options_.run_config.max_restarts());
      });
    });
  }

  void OnReplicaVerdict(const v1::FailureReport& report,
                        const absl::StatusOr<v1::FailureReply>& verdict) {
    auto pending = unreported_replica_failures_.find(report.replica());
    // Answered already (a retry's answer), or a later failure replaced it.
    if (pending == unreported_replica_failures_.end() ||
        pending->second.round() != report.round() ||
        pending->second.replica_restarts() != report.replica_restarts())
      return;
    if (!verdict.ok()) {
      if (closed_ || left_) return;
      const absl::StatusCode code = verdict.status().code();
      // Refused for good (NOT_FOUND is not: the node re-joins or resumes,
      // see OnNotKnown): the group can never restart.
      if (Definitive(code) && code != absl::StatusCode::kNotFound) {
        unreported_replica_failures_.erase(pending);
        Dispatch(event::RendezvousLost{"the daemon refused the failure report: " +
                                       std::string(verdict.status().message())});
        return;
      }
      spdlog::warn(
          "cannot report the failure of replica group {} to the daemon: {}; "
          "retrying",
          report.replica(), std::string(verdict.status().message()));
      RetryReplicaReports();
      return;
    }
    unreported_replica_failures_.erase(pending);
    if (verdict->will_restart())
      spdlog::warn("worker failed; restarting replica group {} alone (restart {} of {})",
                   report.replica(), verdict->restart_count(),
                   options_.run_config.max_restarts());
    Dispatch(event::ReplicaVerdict{report.round(), report.replica(),
                                   verdict->will_restart(), verdict->restart_count()});
  }

  // Re-sends the unanswered replica failure reports of the running round in
  // a moment; those of rounds left behind are dropped.
  void RetryReplicaReports() {
    if (replica_retry_armed_) return;
    replica_retry_armed_ = true;
    report_retry_timer_.expires_after(std::chrono::seconds(1));
    report_retry_timer_.async_wait([this](const boost::system::error_code& error) {
      replica_retry_armed_ = false;
      if (error || closed_ || left_) return;
      const std::optional<uint64_t> round = state_.resumable_round();
      for (auto it = unreported_replica_failures_.begin();
           it != unreported_replica_failures_.end();) {
        if (round && it->second.round() == *round) {
          SendFailure(it->second);
          ++it;
        } else {
          it = unreported_replica_failures_.erase(it);
        }
      }
    });
  }

  size_t LiveWorkers() const {
    size_t live = 0;
    for (const auto& group : groups_) live += group->live();
    return live;
  }

  // One copy file per stream and attempt, shared by the attempt's workers.
  std::array<std::shared_ptr<LineCopy>, 2> MakeLineCopies(const RoundInfo& round) {
    const std::string attempt_dir =
        log_root_ + "/attempt_" + std::to_string(round.restart_count);
    std::array<std::shared_ptr<LineCopy>, 2> copies;
    for (auto [filters, name, copy] : {std::tuple(&options_.duplicate_stdout_filters,
                                                  "filtered_stdout.log", &copies[0]),
                                       std::tuple(&options_.duplicate_stderr_filters,
                                                  "filtered_stderr.log", &copies[1])}) {
      if (!filters->has_value()) continue;
      auto created = LineCopy::Create(attempt_dir + "/" + name, **filters);
      if (created.ok()) {
        *copy = std::move(*created);
      } else {
        spdlog::warn("--duplicate-*-filters: {}",
                     std::string(created.status().message()));
      }
    }
    return copies;
  }

  void StartWorkers(const RoundInfo& round) {
    round_exits_.Clear();
    round_exits_.set_round(round.round);
    unreported_replica_failures_.clear();
    // A new round's ranks measure their steps afresh.
    step_windows_.clear();
    {
      std::lock_guard<std::mutex> lock(stop_mu_);
      step_times_.clear();
    }
    const auto copies = MakeLineCopies(round);
    for (size_t group = 0; group < groups_.size(); ++group) {
      if (!StartGroup(round, static_cast<int>(group), 0, copies)) return;
    }
  }

  // The workers' TCPStore in `round` (AgentOptions::daemon_store): the
  // daemon's port where it serves this run, else the agent's relay, started
  // the first time it is needed.
  absl::StatusOr<AgentOptions::StoreAddress> WorkerStore(const RoundInfo& round) {
    if (options_.daemon_store && round.serves_tcpstore) return *options_.daemon_store;
    if (!relay_) {
      rdzv::StoreRelayOptions relay;
      relay.daemon = options_.rdzv_endpoint;
      relay.security = options_.security;
      auto started = rdzv::StoreRelay::Start(std::move(relay));
      if (!started.ok()) return started.status();
      relay_ = std::move(*started);
      spdlog::info("serving the workers' store on 127.0.0.1:{}, relayed to {}",
                   relay_->port(), options_.rdzv_endpoint);
    }
    relay_->SetNamespace(round.store_prefix);
    return AgentOptions::StoreAddress{"127.0.0.1", relay_->port()};
  }

  // Starts the local ranks of `group` (all of them in restart scope job).
  // False when they could not start (the agent then exits).
  bool StartGroup(const RoundInfo& round, int group, uint32_t replica_restarts,
                  const std::array<std::shared_ptr<LineCopy>, 2>& copies) {
    const int size = options_.nproc / static_cast<int>(groups_.size());
    std::vector<WorkerSpec> specs;
    specs.reserve(size);
    const std::string attempt_dir =
        log_root_ + "/attempt_" + std::to_string(round.restart_count);
    const absl::StatusOr<AgentOptions::StoreAddress> store = WorkerStore(round);
    if (!store.ok()) {
      const std::string why = std::string(store.status().message());
      spdlog::error("cannot serve the workers' store: {}", why);
      Finish(action::Exit{1, "cannot serve the workers' store: " + why});
      return false;
    }
    for (int local_rank = group * size; local_rank < (group + 1) * size; ++local_rank) {
      const int rank = static_cast<int>(round.rank_base) + local_rank;
      const std::string rank_dir = attempt_dir + "/" + std::to_string(local_rank);
      std::error_code ignored;
      fs::create_directories(rank_dir, ignored);
      const std::string error_file = rank_dir + "/error.json";
      fs::remove(error_file, ignored);
      error_files_[local_rank] = error_file;

      WorkerEnvInputs in;
      in.role = options_.role;
      in.run_id = options_.run_id;
      in.local_rank = local_rank;
      in.local_world_size = options_.nproc;
      in.max_restarts = options_.run_config.max_restarts();
      in.round = round;
      in.master_addr = store->host;
      in.master_port = store->port;
      in.use_agent_store = true;
      in.store_endpoint = options_.rdzv_endpoint;
      in.error_file = error_file;
      in.signals_to_handle = options_.signals_to_handle_text;
      in.virtual_local_rank = options_.virtual_local_rank;
      in.replica_size = options_.replica_size;
      in.replica_restarts = replica_restarts;
      if (options_.replica_size > 0) {
        in.num_replicas = static_cast<int>(options_.run_config.max_nodes()) *
                          options_.nproc / options_.replica_size;
      }
      in.has_omp_num_threads = getenv("OMP_NUM_THREADS") != nullptr;
      auto inherited = [](const char* name) -> std::optional<std::string> {
        const char* value = getenv(name);
        if (value == nullptr) return std::nullopt;
        return std::string(value);
      };
      in.torch_nccl_async_error_handling = inherited("TORCH_NCCL_ASYNC_ERROR_HANDLING");
      in.cuda_visible_devices = inherited("CUDA_VISIBLE_DEVICES");
      in.hip_visible_devices = inherited("HIP_VISIBLE_DEVICES");

      WorkerSpec spec;
      spec.local_rank = local_rank;
      spec.global_rank = rank;
      spec.argv = options_.worker_argv;
      spec.env = BuildWorkerEnv(in);
      if (worker_watchdog_)
        spec.env["TORCHELASTIC_TIMER_FILE"] = worker_watchdog_->path();
      if (heartbeats_) spec.env["MESHRUN_HEARTBEAT_SOCKET"] = heartbeats_->name();
      if (dump_helper_) spec.ptracer = dump_helper_->pid();
      spec.env.insert(options_.worker_security_env.begin(),
                      options_.worker_security_env.end());
      std::string prefix =
          ReplaceAll(options_.prefix_template, "${role_name}", options_.role);
      prefix = ReplaceAll(prefix, "${rank}", std::to_string(rank));
      prefix = ReplaceAll(prefix, "${local_rank}", std::to_string(local_rank));
      prefix = ReplaceAll(prefix, "${hostname}", ShortHostName());
      spec.console_prefix = ReplaceAll(prefix, "${host}", options_.host);
      const int redirect =
          StreamsFor(options_.redirects, options_.redirects_all, local_rank);
      const int tee = StreamsFor(options_.tee, options_.tee_all, local_rank);
      const bool shown = options_.local_ranks_filter.empty() ||
                         options_.local_ranks_filter.count(local_rank) > 0;
      // -t implies the file; -r without -t keeps the stream off the console.
      const int to_file = options_.log_dir ? (redirect | tee) : kNone;
      spec.stdout_to_console = shown && (!(redirect & kStdout) || (tee & kStdout));
      spec.stderr_to_console = shown && (!(redirect & kStderr) || (tee & kStderr));
      spec.prefix_stdout = (tee & kStdout) != 0;
      spec.prefix_stderr = (tee & kStderr) != 0;
      if (to_file & kStdout) spec.stdout_file = rank_dir + "/stdout.log";
      if (to_file & kStderr) spec.stderr_file = rank_dir + "/stderr.log";
      // torchrun copies what it tails: tee'd streams of ranks on the console.
      if (shown && (tee & kStdout)) spec.stdout_copy = copies[0];
      if (shown && (tee & kStderr)) spec.stderr_copy = copies[1];
      specs.push_back(std::move(spec));
    }
    absl::Status status = groups_[group]->Start(std::move(specs));
    if (!status.ok()) {
      spdlog::error("cannot start workers: {}", std::string(status.message()));
      Finish(action::Exit{1, "cannot start workers: " + std::string(status.message())});
      return false;
    }
    return true;
  }

  std::string ErrorFilePath(int local_rank) {
    auto it = error_files_.find(local_rank);
    return it == error_files_.end() ? std::string() : it->second;
  }

  bool PrepareLogRoot() {
    std::error_code error;
    if (options_.log_dir) {
      log_root_ = *options_.log_dir + "/" + options_.run_id;
      fs::create_directories(log_root_, error);
      if (error) {
        spdlog::error("cannot create log directory {}: {}", log_root_,
                      std::string(error.message()));
        return false;
      }
      return true;
    }
    // Error files need a home even without --log-dir, like torchrun's tmp dir.
    std::string pattern = (fs::temp_directory_path() / "meshrun-XXXXXX").string();
    if (!mkdtemp(pattern.data())) {
      spdlog::error("cannot create a temporary directory: {}", std::strerror(errno));
      return false;
    }
    temporary_root_ = pattern;
    SetRemovedOnResourceExit(temporary_root_);
    log_root_ = pattern + "/" + options_.run_id;
    fs::create_directories(log_root_, error);
    return !error;
  }

  void CleanUpLogRoot() {
    if (temporary_root_.empty()) return;
    SetRemovedOnResourceExit("");
    std::error_code ignored;
    fs::remove_all(temporary_root_, ignored);
  }

  void Finish(const action::Exit& exit) {
    exit_code_ = exit.code;
    if (exit.code != 0 && exit.code < 128) {
      std::fprintf(stderr, "meshrun: %s\n", exit.summary.c_str());
      // This node's own first failure, when it was not the run's root cause.
      if (auto failure = state_.failure()) {
        const std::string& local = last_failure_detail_[failure->local_rank];
        if (exit.summary.find(local) == std::string::npos)
          std::fprintf(stderr, "First failure on this node:\n[%d]:\n%s",
                       failure->global_rank, local.c_str());
      }
    } else if (exit.code >= 128) {
      spdlog::warn("{}", exit.summary);
    } else {
      spdlog::info("{}", exit.summary);
    }
    signals_.cancel();
    io_.stop();
  }

  const AgentOptions& options_;
  boost::asio::io_context io_;
  AgentState state_;
  boost::asio::signal_set signals_;
  // The workers' store when the daemon's port is not (WorkerStore); before
  // the workers, so it outlives them.
  std::unique_ptr<rdzv::StoreRelay> relay_;
  // One per local replica group in restart scope "replica", else one.
  std::vector<std::unique_ptr<WorkerGroup>> groups_;
  // torchrun's worker watchdog (StartWorkerWatchdog), or null; after the
  // groups, which its callbacks look at.
  std::unique_ptr<FileTimerServer> worker_watchdog_;
  // Workers it signalled, and the timer that expired (for the failure's
  // description).
  std::map<pid_t, std::string> expired_timers_;
  // --hang-timeout (StartHangWatch): a detector per group, the workers'
  // heartbeats, and the hung workers being stopped, with why (for the
  // failure's description).
  std::vector<HangDetector> hang_detectors_;
  std::unique_ptr<HeartbeatServer> heartbeats_;
  // Runs the stack dumpers (on stack_dumper_, one dump at a time).
  std::unique_ptr<DumpHelper> dump_helper_;
  boost::asio::steady_timer hang_timer_;
  StackTools stack_tools_;
  std::map<pid_t, std::string> hung_workers_;
  // Step times the workers report, by global rank (io_), and what the
  // keep-alive sends of them (guarded by stop_mu_).
  std::map<int, rdzv::StepWindow> step_windows_;
  std::map<int, v1::RankStepTime> step_times_;
  // Takes the stacks of a hang off io_; joined before the next and at exit.
  std::thread stack_dumper_;
  bool dumping_stacks_ = false;
  // --health-check at a re-form (StartHealthChecks), and the next round's
  // assignment while they run.
  std::thread health_checker_;
  bool checking_health_ = false;
  std::atomic<bool> cancel_health_checks_{false};
  std::atomic<bool> cancel_stack_dumps_{false};
  std::optional<v1::RendezvousEvent> held_assignment_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<rdzv::RendezvousClient> client_;
  std::unique_ptr<rdzv::RendezvousClient> heartbeat_client_;
  std::unique_ptr<rdzv::RendezvousClient> report_client_;
  std::thread reader_;
  std::vector<std::thread> heartbeat_senders_;  // Heartbeat()
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_threads_ = false;  // guarded by stop_mu_
  // The agent left the run: the reader never re-joins, heartbeats stop.
  bool leaving_ = false;  // guarded by stop_mu_
  // The agent cancelled the stream to re-join at once (OnNotKnown).
  bool rejoin_requested_ = false;  // guarded by stop_mu_
  // io_ has dispatched the RoundLost the reader posted.
  bool round_lost_taken_ = false;  // guarded by stop_mu_
  // The current Join stream; replaced by the reader when it reconnects.
  std::unique_ptr<rdzv::RendezvousClient::JoinSession> session_;  // guarded by stop_mu_
  // The round a reconnecting join resumes (0: none); written on io_.
  std::atomic<uint64_t> resume_round_{0};
  // The lease watchdog and what it watches (io_ thread only).
  boost::asio::steady_timer lease_timer_;
  boost::asio::steady_timer waiting_timer_;
  boost::asio::steady_timer report_retry_timer_;
  bool replica_retry_armed_ = false;
  const std::chrono::milliseconds grace_;
  const std::chrono::milliseconds heartbeat_interval_;
  const std::chrono::milliseconds join_timeout_;
  std::chrono::steady_clock::time_point last_contact_;
  // When the lease runs out: last_contact_ + grace_, or later after a stall.
  std::chrono::steady_clock::time_point lease_until_;
  bool disconnected_ = false;
  bool heartbeat_failing_ = false;
  // The daemon has pushed something on the current Join stream.
  bool heard_on_stream_ = false;
  // Since when this node waits for a round to form (reported periodically).
  std::optional<std::chrono::steady_clock::time_point> waiting_since_;
  // The agent's calls to the daemon, off io_ (declared after what they use).
  std::unique_ptr<CallQueue> calls_;
  struct UnreportedFailure {
    uint64_t round;
    v1::FailureReport report;
  };
  std::optional<UnreportedFailure> unreported_failure_;
  // Restart scope "replica": failure reports the daemon has not answered,
  // by replica group.
  std::map<uint32_t, v1::FailureReport> unreported_replica_failures_;
  bool closed_ = false;
  bool left_ = false;
  std::map<int, std::string> error_files_;
  std::map<int, std::string> last_failure_detail_;
  std::map<int, v1::FailureCause> failure_causes_;  // by local rank
  v1::WorkerExitsReport round_exits_;               // of the running round
  std::string log_root_;
  std::string temporary_root_;  // made by us when there is no --log-dir
  int exit_code_ = 1;
};

}  // namespace

int RunAgent(const AgentOptions& options) {
  Agent agent(options);
  return agent.Run();
}

}  // namespace meshrun::agent
