// meshrun_soak: a bounded soak test of meshrun-rdzvd with real processes.
//
// For --duration-s seconds it holds, at once:
//  - --runs elastic jobs, each --nodes real `meshrun` agents (--nnodes 2:N)
//    whose workers are real processes that run --worker-seconds and exit 0;
//    a finished job is replaced by a new one (a new run id), so runs churn;
//  - --store-procs child processes, each with --clients-per-proc store
//    clients (a quarter on connections of their own) doing set / get / add /
//    compare_set / multi_get / check / append / delete and waits that time
//    out, paced, and re-connecting now and then;
// and injects faults at random: an agent SIGKILLed or SIGTERMed (a fresh
// agent joins in its place), a worker SIGKILLed (the job restarts), a whole
// store process SIGKILLed (a fresh one takes its place). A probe client
// times a set+get pair every 100 ms. The daemon's memory is sampled every
// second from its /metrics: its RSS and its heap in use.
// Then the faults stop and every job must finish.
//
// Passes (exit 0) when: the daemon is alive at the end; every agent that was
// not deliberately killed exited 0; every job started has finished; store
// clients saw no error other than their deliberate wait timeouts (except in
// killed processes); and the daemon's memory is flat: its heap in use over
// the last fifth of the fault phase at most --max-memory-growth above the
// second fifth's, or within --memory-slack-mib of it (a burst of reconnecting
// clients holds a few MiB for a while). The heap in use, not the RSS: glibc
// keeps each arena's high-water mark, so the RSS ratchets up with every burst
// (31.6 -> 40.2 MiB in one 60 s CI run; traced, the heap in use moved within
// 15-22 MiB while the arenas grew). Where the daemon cannot report its heap
// (a sanitizer's allocator), the RSS is judged.
// Prints a summary and one `SOAK_JSON {...}` line.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/client/store_client.h"
#include "tests/support/child_process.h"
#include "tests/support/http_client.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

struct Options {
  int duration_s = 180;
  int runs = 6;
  int nodes = 3;
  int nproc = 2;
  int worker_seconds = 6;
  int store_procs = 4;
  int clients_per_proc = 500;
  int fault_interval_ms = 1500;
  int drain_s = 180;
  double max_memory_growth = 0.25;  // fraction
  double memory_slack_mib = 8;
  uint64_t seed = 0;
  std::string work_dir;
  // Child mode: run store clients against this endpoint until killed.
  std::string store_load_endpoint;
  int store_load_index = 0;
};

// ---------------------------------------------------------------- store load

// One store client's loop. Counts ops and unexpected errors; the deliberate
// wait timeouts are expected and counted as ops.
void StoreClientLoop(const std::string& endpoint, int proc, int index, uint64_t seed,
                     std::atomic<uint64_t>& ops, std::atomic<uint64_t>& errors,
                     std::mutex& first_error_mu, std::string& first_error) {
  std::mt19937_64 rng(seed * 1000003 + index);
  auto pick = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  const bool own_connection = index % 4 == 0;
  const std::string ns =
      "soak-store-" + std::to_string(proc) + "-" + std::to_string(index % 16);
  const std::string mine = "k" + std::to_string(index);
  const std::string value(64, 'v');
  auto fail = [&](const absl::Status& status, const char* op) {
    errors.fetch_add(1);
    std::lock_guard<std::mutex> lock(first_error_mu);
    if (first_error.empty()) first_error = std::string(op) + ": " + status.ToString();
  };
  while (true) {
    meshrun::rdzv::StoreClientOptions options;
    options.ns = ns;
    options.timeout = seconds(30);
    options.connect_timeout = seconds(60);
    if (own_connection) {
      options.channel =
          meshrun::rdzv::MakeStoreChannel(endpoint, /*own_connection=*/true);
      options.share_stream = false;
    } else {
      options.target = endpoint;
    }
    auto client = meshrun::rdzv::StoreClient::Connect(options);
    if (!client.ok()) {
      fail(client.status(), "connect");
      std::this_thread::sleep_for(seconds(1));
      continue;
    }
    auto& store = **client;
    // A client lives for 10-60 s, then reconnects (connection churn).
    const auto reconnect_at = Clock::now() + seconds(pick(10, 60));
    while (Clock::now() < reconnect_at) {
      absl::Status status;
      const char* op = "";
      switch (pick(0, 9)) {
        case 0:
        case 1:
          op = "set";
          status = store.Set(mine, value);
          break;
        case 2:
          op = "get";
          if (auto s = store.Set(mine, value); !s.ok()) {
            status = s;
            break;
          }
          status = store.Get(mine).status();
          break;
        case 3:
          op = "add";
          status = store.Add("counter", 1).status();
          break;
        case 4:
          op = "compare_set";
          status = store.CompareSet(mine + "-cas", "", value).status();
          break;
        case 5:
          op = "multi_get";
          if (auto s = store.MultiSet({{mine + "-a", value}, {mine + "-b", value}});
              !s.ok()) {
            status = s;
            break;
          }
          status = store.MultiGet({mine + "-a", mine + "-b"}).status();
          break;
        case 6:
          op = "check";
          status = store.Check({mine, "counter"}).status();
          break;
        case 7: {
          op = "append";
          // Bounded: the value restarts once it reaches 1 KiB.
          auto appended = store.Append(mine + "-log", value);
          status = appended;
          if (status.ok() && pick(0, 15) == 0)
            status = store.Delete(mine + "-log").status();
          break;
        }
        case 8: {
          op = "wait";
          // Parked in the daemon, then timed out: expected.
          auto waited = store.Wait({mine + "-never"}, milliseconds(pick(50, 400)));
          if (waited.code() != absl::StatusCode::kDeadlineExceeded) status = waited;
          break;
        }
        default:
          op = "delete";
          status = store.Delete(mine + "-cas").status();
          break;
      }
      if (status.ok()) {
        ops.fetch_add(1);
      } else {
        fail(status, op);
      }
      std::this_thread::sleep_for(milliseconds(pick(50, 950)));
    }
  }
}

// Child mode: never returns; prints `OPS <n> ERRORS <m> [first error]` every
// second, dies with its parent.
[[noreturn]] void RunStoreLoad(const Options& options) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::atomic<uint64_t> ops{0}, errors{0};
  std::mutex first_error_mu;
  std::string first_error;
  std::vector<std::thread> threads;
  for (int i = 0; i < options.clients_per_proc; ++i) {
    threads.emplace_back(StoreClientLoop, options.store_load_endpoint,
                         options.store_load_index, i, options.seed, std::ref(ops),
                         std::ref(errors), std::ref(first_error_mu),
                         std::ref(first_error));
  }
  while (true) {
    std::this_thread::sleep_for(seconds(1));
    std::lock_guard<std::mutex> lock(first_error_mu);
    std::printf("OPS %llu ERRORS %llu %s\n", static_cast<unsigned long long>(ops.load()),
                static_cast<unsigned long long>(errors.load()), first_error.c_str());
    std::fflush(stdout);
  }
}

// ------------------------------------------------------------------ driver

// A process whose stdout and stderr go to a file (agents log a lot; a pipe
// nobody reads would block them).
class LoggedProcess {
 public:
  LoggedProcess(const std::vector<std::string>& argv, const std::string& log_path) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("cannot start " + argv[0]);
  }
  ~LoggedProcess() {
    if (!status_) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }
  pid_t pid() const { return pid_; }
  // Non-blocking; the wait status once exited.
  std::optional<int> Poll() {
    if (status_) return status_;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) status_ = status;
    return status_;
  }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

struct Agent {
  std::unique_ptr<LoggedProcess> process;
  std::string log;
  bool killed = false;       // by the soak, on purpose
  bool replacement = false;  // started in place of a killed one
};

struct Job {
  std::string run_id;
  std::vector<Agent> agents;
  Clock::time_point started;
  // When an agent of the job first exited 0: the run has succeeded.
  std::optional<Clock::time_point> succeeded_at;
  bool finished = false;
  bool failed = false;
};

// How long a replacement agent may outlive its job's success: a participant
// exits at once; one still running joined too late and gathers a new
// incarnation of the run that nobody else joins.
constexpr auto kLateReplacementGrace = std::chrono::seconds(10);

// Where a process that should have ended is stuck: each thread's name and
// kernel wait channel, and its stacks when gdb is installed.
void PrintThreads(pid_t pid) {
  const std::string command =
      "cd /proc/" + std::to_string(pid) +
      "/task 2>/dev/null && for t in *; do echo \"    thread $t $(cat $t/comm) "
      "wchan=$(cat $t/wchan)\"; done; command -v gdb >/dev/null && timeout 60 gdb -p " +
      std::to_string(pid) +
      " -batch -ex 'thread apply all bt' 2>&1 | grep -E '^(Thread|#)'";
  std::fflush(stderr);
  if (FILE* out = ::popen(command.c_str(), "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, out)) std::fputs(line, stderr);
    ::pclose(out);
  }
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

std::string Tail(const std::string& path, size_t bytes) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string all = text.str();
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

// Direct children of `pid` (the agent's workers).
std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) +
                   "/children");
  std::vector<pid_t> children;
  pid_t child;
  while (in >> child) children.push_back(child);
  return children;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The medians of the second and last fifths of the first `n` samples, and
// the peak of them all; samples < 0 (not read) left out. nullopt when a
// fifth has no sample.
struct MemoryTrend {
  double early = 0, late = 0, peak = 0;
};
std::optional<MemoryTrend> Trend(const std::vector<double>& mib, int n) {
  auto read = [](auto begin, auto end) {
    std::vector<double> kept;
    std::copy_if(begin, end, std::back_inserter(kept), [](double v) { return v >= 0; });
    return kept;
  };
  const std::vector<double> early = read(mib.begin() + n / 5, mib.begin() + 2 * n / 5),
                            late = read(mib.begin() + 4 * n / 5, mib.begin() + n);
  if (early.empty() || late.empty()) return std::nullopt;
  return MemoryTrend{.early = Median(early),
                     .late = Median(late),
                     .peak = *std::max_element(mib.begin(), mib.end())};
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(p * values.size()))];
}

class Soak {
 public:
  explicit Soak(Options options) : options_(std::move(options)), rng_(options_.seed) {}

  int Run() {
    const std::string bin = meshrun::testing::BinDir();
    // A short retention, so the soak also covers forgetting closed runs.
    daemon_ = std::make_unique<meshrun::testing::DaemonProcess>(
        std::vector<std::string>{"--closed-run-retention", "20", "--metrics-port", "0"});
    endpoint_ = daemon_->endpoint();
    metrics_port_ = daemon_->ReadMetricsPort();
    if (metrics_port_ < 0) {
      std::fprintf(stderr, "soak: the daemon did not print its metrics port\n");
      return 1;
    }
    daemon_pid_ = daemon_->process().pid();
    std::fprintf(stderr, "soak: daemon pid %d at %s; work dir %s\n", daemon_pid_,
                 endpoint_.c_str(), options_.work_dir.c_str());

    for (int i = 0; i < options_.store_procs; ++i) StartStoreProc();
    std::thread probe([this] { Probe(); });
    // Joined however Run ends: a process that cannot be started throws, and
    // the processes started so far are then ended by their destructors.
    struct StopProbe {
      Soak* soak;
      std::thread* probe;
      ~StopProbe() {
        soak->stop_probe_ = true;
        if (probe->joinable()) probe->join();
      }
    } stop_probe{this, &probe};
    for (int i = 0; i < options_.runs; ++i) StartJob();

    const auto start = Clock::now();
    const auto fault_end = start + seconds(options_.duration_s);
    auto next_fault = start + milliseconds(options_.fault_interval_ms);
    auto next_store_kill = start + seconds(20);
    auto next_sample = start;
    while (Clock::now() < fault_end) {
      const auto now = Clock::now();
      if (now >= next_sample) {
        const Memory memory = ReadMemory();
        rss_mib_.push_back(memory.rss_mib);
        heap_mib_.push_back(memory.heap_mib);
        next_sample += seconds(1);
        CollectStoreCounts();
      }
      if (now >= next_fault) {
        InjectFault();
        next_fault = now + milliseconds(std::uniform_int_distribution<int>(
                               options_.fault_interval_ms / 2,
                               options_.fault_interval_ms * 3 / 2)(rng_));
      }
      if (now >= next_store_kill) {
        KillStoreProc();
        next_store_kill = now + seconds(20);
      }
      ReapJobs(/*replace=*/true);
      std::this_thread::sleep_for(milliseconds(50));
    }
    const int fault_phase_samples = static_cast<int>(rss_mib_.size());
    std::fprintf(stderr, "soak: fault phase over (%d jobs finished); draining\n",
                 jobs_finished_);

    // Drain: no more faults and no new jobs; everything must finish.
    const auto drain_end = Clock::now() + seconds(options_.drain_s);
    while (Clock::now() < drain_end && !AllJobsDone()) {
      ReapJobs(/*replace=*/false);
      std::this_thread::sleep_for(milliseconds(100));
    }
    CollectStoreCounts();
    stop_probe_ = true;
    probe.join();  // before the report reads its samples
    const bool daemon_alive = daemon_->process().Running();
    const Memory end = ReadMemory();

    // Report.
    const int n = fault_phase_samples;
    const MemoryTrend rss = Trend(rss_mib_, n).value_or(MemoryTrend{});
    // Unknown under a sanitizer's allocator (the daemon does not report it).
    const std::optional<MemoryTrend> heap_trend = Trend(heap_mib_, n);
    const bool heap_known = heap_trend.has_value();
    const MemoryTrend heap = heap_trend.value_or(MemoryTrend{});
    const MemoryTrend& judged = heap_known ? heap : rss;
    const bool memory_flat =
        judged.late <= judged.early * (1 + options_.max_memory_growth) ||
        judged.late <= judged.early + options_.memory_slack_mib;
    int unfinished = 0;
    for (auto& job : jobs_) {
      if (!job.finished) {
        ++unfinished;
        Fail("job " + job.run_id + " did not finish within the drain");
        for (auto& agent : job.agents) {
          if (!agent.process->Poll()) {
            std::fprintf(stderr, "  still running: pid %d, log tail:\n%s\n",
                         agent.process->pid(), Tail(agent.log, 1500).c_str());
            PrintThreads(agent.process->pid());
          }
        }
      }
    }
    if (!daemon_alive) Fail("the daemon died");
    if (!memory_flat)
      Fail(heap_known ? "daemon heap in use grew" : "daemon memory (RSS) grew");
    if (store_errors_ > 0) Fail("store clients saw errors: " + first_store_error_);
    if (jobs_finished_ == 0) Fail("no job finished");
    const double probe_p50 = Percentile(probe_us_, 0.5),
                 probe_p99 = Percentile(probe_us_, 0.99);

    std::printf(
        "meshrun soak: %d s of faults, %d jobs at once (%d agents x %d workers each), "
        "%d store clients in %d processes\n",
        options_.duration_s, options_.runs, options_.nodes, options_.nproc,
        options_.store_procs * options_.clients_per_proc, options_.store_procs);
    std::printf(
        "  faults injected: %d agents SIGKILLed, %d agents SIGTERMed, %d workers "
        "SIGKILLed, %d store processes SIGKILLed\n",
        agent_kills_, agent_terms_, worker_kills_, store_kills_);
    std::printf(
        "  agents started: %d (%d replacements came too late for their job); jobs "
        "started: %zu, finished: %d, failed: %d, unfinished after the drain: %d\n",
        agents_started_, late_replacements_, jobs_.size(), jobs_finished_, jobs_failed_,
        unfinished);
    std::printf(
        "  store ops answered: %llu (%.0f ops/s over the run), unexpected errors: "
        "%llu; probe set+get p50 %.0f us, p99 %.0f us\n",
        static_cast<unsigned long long>(store_ops_total_),
        store_ops_total_ / std::max(1.0, static_cast<double>(n)),
        static_cast<unsigned long long>(store_errors_), probe_p50, probe_p99);
    std::printf(
        "  daemon RSS MiB: 2nd fifth median %.1f, last fifth median %.1f, peak %.1f, "
        "after the drain %.1f%s\n",
        rss.early, rss.late, rss.peak, end.rss_mib, heap_known ? "" : " (judged)");
    if (heap_known) {
      std::printf(
          "  daemon heap in use MiB: 2nd fifth median %.1f, last fifth median %.1f, "
          "peak %.1f, after the drain %.1f (judged)\n",
          heap.early, heap.late, heap.peak, end.heap_mib);
    }
    std::printf("  memory judged: allowed growth %.0f%% or %.0f MiB\n",
                options_.max_memory_growth * 100, options_.memory_slack_mib);
    std::printf("  result: %s\n", failures_.empty() ? "PASS" : "FAIL");
    for (const auto& failure : failures_) std::printf("    - %s\n", failure.c_str());
    std::printf(
        "SOAK_JSON {\"duration_s\":%d,\"runs_at_once\":%d,\"store_clients\":%d,"
        "\"agent_kills\":%d,\"agent_terms\":%d,\"worker_kills\":%d,\"store_proc_kills\":%"
        "d,"
        "\"jobs_started\":%zu,\"jobs_finished\":%d,\"jobs_failed\":%d,\"store_ops\":%llu,"
        "\"store_errors\":%llu,\"probe_p50_us\":%.0f,\"probe_p99_us\":%.0f,"
        "\"rss_early_mib\":%.1f,\"rss_late_mib\":%.1f,\"rss_peak_mib\":%.1f,"
        "\"heap_early_mib\":%.1f,\"heap_late_mib\":%.1f,\"heap_peak_mib\":%.1f,"
        "\"pass\":%s}\n",
        options_.duration_s, options_.runs,
        options_.store_procs * options_.clients_per_proc, agent_kills_, agent_terms_,
        worker_kills_, store_kills_, jobs_.size(), jobs_finished_, jobs_failed_,
        static_cast<unsigned long long>(store_ops_total_),
        static_cast<unsigned long long>(store_errors_), probe_p50, probe_p99, rss.early,
        rss.late, rss.peak, heap.early, heap.late, heap.peak,
        failures_.empty() ? "true" : "false");
    std::fflush(stdout);
    return failures_.empty() ? 0 : 1;
  }

 private:
  void Fail(const std::string& what) { failures_.push_back(what); }

  // The daemon's RSS and heap in use from one /metrics scrape; -1 for what
  // it did not say (the heap under a sanitizer's allocator).
  struct Memory {
    double rss_mib = -1, heap_mib = -1;
  };
  Memory ReadMemory() {
    const std::string text = meshrun::testing::HttpGet(metrics_port_, "/metrics").body;
    auto mib = [&](const std::string& sample) {
      const auto bytes = meshrun::testing::MetricSample(text, sample);
      return bytes ? *bytes / (1024.0 * 1024.0) : -1;
    };
    return {.rss_mib = mib("process_resident_memory_bytes"),
            .heap_mib = mib("meshrun_process_heap_bytes{state=\"in_use\"}")};
  }

  void StartJob() {
    Job job;
    job.run_id = "soak-job-" + std::to_string(next_job_++);
    job.started = Clock::now();
    jobs_.push_back(std::move(job));
    for (int i = 0; i < options_.nodes; ++i) StartAgent(jobs_.back());
  }

  void StartAgent(Job& job) {
    const std::string log = options_.work_dir + "/" + job.run_id + "-agent" +
                            std::to_string(job.agents.size()) + ".log";
    std::vector<std::string> argv = {
        meshrun::testing::BinDir() + "/meshrun",
        "--nnodes=2:" + std::to_string(options_.nodes),
        "--nproc-per-node=" + std::to_string(options_.nproc), "--rdzv-backend=c10d",
        "--rdzv-endpoint=" + endpoint_, "--rdzv-id=" + job.run_id, "--max-restarts=1000",
        // Short timers, so re-forms are quick and leases of killed agents
        // run out within the soak.
        "--rdzv-conf=join_timeout=120,last_call_timeout=0.5,keep_alive_interval=1,"
        "keep_alive_max_attempt=3",
        "--shutdown-timeout=5", "--no-python", "/bin/sleep",
        std::to_string(options_.worker_seconds)};
    Agent agent;
    agent.log = log;
    agent.process = std::make_unique<LoggedProcess>(argv, log);
    job.agents.push_back(std::move(agent));
    ++agents_started_;
  }

  void StartStoreProc() {
    std::vector<std::string> argv = {"/proc/self/exe"};
    argv[0] = self_exe_;
    const int index = next_store_proc_++;
    argv.insert(argv.end(),
                {"--store-load", endpoint_, "--store-load-index", std::to_string(index),
                 "--clients-per-proc", std::to_string(options_.clients_per_proc),
                 "--seed", std::to_string(options_.seed + index)});
    store_procs_.push_back(
        {std::make_unique<meshrun::testing::ChildProcess>(argv, /*merge_stderr=*/true), 0,
         0, ""});
  }

  void KillStoreProc() {
    if (store_procs_.empty()) return;
    auto& victim = store_procs_[std::uniform_int_distribution<size_t>(
        0, store_procs_.size() - 1)(rng_)];
    ReadStoreCounts(victim);
    store_ops_dead_ += victim.ops;  // errors of a killed process are not counted
    victim.process->Signal(SIGKILL);
    victim.process->Wait(seconds(10));
    victim = {nullptr, 0, 0, ""};
    ++store_kills_;
    // Replace it in place (the index keeps counting up: new namespaces).
    store_procs_.erase(std::remove_if(store_procs_.begin(), store_procs_.end(),
                                      [](const StoreProc& p) { return !p.process; }),
                       store_procs_.end());
    StartStoreProc();
  }

  struct StoreProc {
    std::unique_ptr<meshrun::testing::ChildProcess> process;
    uint64_t ops;
    uint64_t errors;
    std::string first_error;
  };

  static void ReadStoreCounts(StoreProc& proc) {
    while (auto line = proc.process->ReadLine(milliseconds(0))) {
      std::istringstream in(*line);
      std::string ops_word, errors_word;
      uint64_t ops = 0, errors = 0;
      if (in >> ops_word >> ops >> errors_word >> errors && ops_word == "OPS") {
        proc.ops = ops;
        proc.errors = errors;
        std::string rest;
        std::getline(in, rest);
        if (errors > 0 && proc.first_error.empty()) proc.first_error = rest;
      }
    }
  }

  void CollectStoreCounts() {
    uint64_t ops = store_ops_dead_, errors = 0;
    for (auto& proc : store_procs_) {
      ReadStoreCounts(proc);
      ops += proc.ops;
      errors += proc.errors;
      if (proc.errors > 0 && first_store_error_.empty())
        first_store_error_ = proc.first_error;
    }
    store_ops_total_ = ops;
    store_errors_ = errors;
  }

  // Jobs with every agent present, i.e. safe to hurt (min nodes stay alive).
  std::vector<Job*> WholeJobs() {
    std::vector<Job*> whole;
    for (auto& job : jobs_) {
      if (job.finished) continue;
      int live = 0;
      for (auto& agent : job.agents)
        if (!agent.killed && !agent.process->Poll()) ++live;
      if (live == options_.nodes) whole.push_back(&job);
    }
    return whole;
  }

  void InjectFault() {
    auto whole = WholeJobs();
    if (whole.empty()) return;
    Job& job = *whole[std::uniform_int_distribution<size_t>(0, whole.size() - 1)(rng_)];
    std::vector<Agent*> live;
    for (auto& agent : job.agents)
      if (!agent.killed && !agent.process->Poll()) live.push_back(&agent);
    Agent& agent = *live[std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng_)];
    const int kind = std::uniform_int_distribution<int>(0, 2)(rng_);
    if (kind == 2) {
      auto workers = ChildrenOf(agent.process->pid());
      if (!workers.empty()) {
        kill(workers[std::uniform_int_distribution<size_t>(0, workers.size() - 1)(rng_)],
             SIGKILL);
        ++worker_kills_;
        return;
      }
    }
    agent.killed = true;
    if (kind == 1) {
      kill(agent.process->pid(), SIGTERM);
      ++agent_terms_;
    } else {
      kill(agent.process->pid(), SIGKILL);
      ++agent_kills_;
    }
    StartAgent(job);  // a fresh node takes its place
    job.agents.back().replacement = true;
  }

  // A job is done when all its agents have exited; it succeeded when every
  // agent not killed on purpose exited 0. A replacement agent that came too
  // late for the job's last round never ran in it: the daemon tells it so
  // (exit 1, "before this node took part") or, joining after the end, it
  // gathers a new incarnation of the run alone; the soak ends it and does
  // not count it against the job (README, Rendezvous).
  void ReapJobs(bool replace) {
    for (size_t i = 0; i < jobs_.size(); ++i) {
      Job& job = jobs_[i];
      if (job.finished) continue;
      bool all_exited = true;
      for (auto& agent : job.agents) {
        const std::optional<int> status = agent.process->Poll();
        if (!status) {
          all_exited = false;
        } else if (!agent.killed && WIFEXITED(*status) && WEXITSTATUS(*status) == 0 &&
                   !job.succeeded_at) {
          job.succeeded_at = Clock::now();
        }
      }
      if (!all_exited && job.succeeded_at &&
          Clock::now() - *job.succeeded_at > kLateReplacementGrace) {
        for (auto& agent : job.agents) {
          if (!agent.replacement || agent.killed || agent.process->Poll()) continue;
          kill(agent.process->pid(), SIGTERM);
          agent.killed = true;
          ++late_replacements_;
        }
      }
      if (!all_exited) continue;
      job.finished = true;
      for (auto& agent : job.agents) {
        const int status = *agent.process->Poll();
        if (agent.killed) continue;
        if (agent.replacement && job.succeeded_at &&
            Tail(agent.log, 4000).find("before this node took part") !=
                std::string::npos) {
          ++late_replacements_;
          continue;
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          job.failed = true;
          Fail("job " + job.run_id + ": an agent ended with " + Describe(status) +
               "; log tail:\n" + Tail(agent.log, 1500));
        }
      }
      ++(job.failed ? jobs_failed_ : jobs_finished_);
      if (replace) StartJob();  // may reallocate jobs_; `job` is not used after
    }
  }

  bool AllJobsDone() {
    for (auto& job : jobs_)
      if (!job.finished) return false;
    return true;
  }

  // The daemon stays responsive: a set+get pair every 100 ms, timed.
  void Probe() {
    meshrun::rdzv::StoreClientOptions options;
    options.target = endpoint_;
    options.ns = "soak-probe";
    options.share_stream = false;
    options.channel = meshrun::rdzv::MakeStoreChannel(endpoint_, /*own_connection=*/true);
    auto client = meshrun::rdzv::StoreClient::Connect(options);
    if (!client.ok()) {
      std::lock_guard<std::mutex> lock(probe_mu_);
      probe_error_ = client.status().ToString();
      return;
    }
    while (!stop_probe_) {
      const auto t0 = Clock::now();
      auto set = (*client)->Set("probe", "x");
      auto get = (*client)->Get("probe");
      const double us =
          std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      {
        std::lock_guard<std::mutex> lock(probe_mu_);
        if (!set.ok() || !get.ok()) {
          if (probe_error_.empty())
            probe_error_ = (set.ok() ? get.status() : set).ToString();
        } else {
          probe_us_.push_back(us);
        }
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
  }

 public:
  std::string self_exe_;

 private:
  Options options_;
  std::mt19937_64 rng_;
  std::unique_ptr<meshrun::testing::DaemonProcess> daemon_;
  std::string endpoint_;
  pid_t daemon_pid_ = -1;
  std::vector<Job> jobs_;  // a deque would do too; indices are used while growing
  std::vector<StoreProc> store_procs_;
  int metrics_port_ = -1;
  // Per second of the fault phase; heap -1 where /metrics did not say.
  std::vector<double> rss_mib_, heap_mib_;
  std::vector<std::string> failures_;
  std::mutex probe_mu_;
  std::vector<double> probe_us_;
  std::string probe_error_;
  std::atomic<bool> stop_probe_{false};
  uint64_t store_ops_dead_ = 0, store_ops_total_ = 0, store_errors_ = 0;
  std::string first_store_error_;
  int next_job_ = 0, next_store_proc_ = 0, agents_started_ = 0;
  int agent_kills_ = 0, agent_terms_ = 0, worker_kills_ = 0, store_kills_ = 0;
  int late_replacements_ = 0;
  int jobs_finished_ = 0, jobs_failed_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"meshrun_soak: bounded soak test of meshrun-rdzvd with real processes"};
  app.add_option("--duration-s", options.duration_s, "Seconds of load with faults")
      ->check(CLI::PositiveNumber);
  app.add_option("--runs", options.runs, "Jobs at once")->check(CLI::PositiveNumber);
  app.add_option("--nodes", options.nodes, "Agents per job (>= 3: one may be down)")
      ->check(CLI::Range(3, 16));
  app.add_option("--nproc", options.nproc, "Workers per agent")->check(CLI::Range(1, 8));
  app.add_option("--worker-seconds", options.worker_seconds)->check(CLI::PositiveNumber);
  app.add_option("--store-procs", options.store_procs)->check(CLI::Range(1, 32));
  app.add_option("--clients-per-proc", options.clients_per_proc)
      ->check(CLI::Range(1, 5000));
  app.add_option("--fault-interval-ms", options.fault_interval_ms)
      ->check(CLI::Range(100, 600000));
  app.add_option("--drain-s", options.drain_s)->check(CLI::PositiveNumber);
  app.add_option("--max-memory-growth", options.max_memory_growth)
      ->check(CLI::Range(0.0, 10.0));
  app.add_option("--memory-slack-mib", options.memory_slack_mib)
      ->check(CLI::Range(0.0, 4096.0));
  app.add_option("--seed", options.seed);
  app.add_option("--work-dir", options.work_dir, "Agent logs (default: a temp dir)");
  app.add_option("--store-load", options.store_load_endpoint)->group("");  // child mode
  app.add_option("--store-load-index", options.store_load_index)->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "meshrun_soak: " << e.what() << " (see --help)\n";
    return 2;
  }
  if (!options.store_load_endpoint.empty()) RunStoreLoad(options);
  if (options.seed == 0) options.seed = std::random_device{}();
  std::string made_dir;
  if (options.work_dir.empty()) {
    char path[] = "/tmp/meshrun-soak-XXXXXX";
    if (!mkdtemp(path)) {
      std::cerr << "meshrun_soak: cannot create a temp dir\n";
      return 1;
    }
    options.work_dir = made_dir = path;
  } else {
    std::filesystem::create_directories(options.work_dir);
  }
  std::fprintf(stderr, "soak: seed %llu\n",
               static_cast<unsigned long long>(options.seed));
  int rc;
  {
    Soak soak(options);
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    soak.self_exe_ = n > 0 ? std::string(self, n) : argv[0];
    try {
      rc = soak.Run();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "meshrun_soak: %s\n", e.what());
      rc = 1;
    }
  }
  if (!made_dir.empty() && rc == 0) std::filesystem::remove_all(made_dir);
  return rc;
}
