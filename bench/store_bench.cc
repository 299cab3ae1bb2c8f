// store_bench: meshrun's store and rendezvous against c10d's TCPStore, side by
// side in one invocation.
//
// The headline compares two TCPStore servers driven by the same stock
// c10d::TCPStore client of the pinned libtorch: torch's own (libuv backend)
// and meshrun-rdzvd's TCPStore endpoint on its gRPC port. meshrun's gRPC
// store client is measured beside them against the libuv runs.
//
// The orchestrator (default mode) starts every server and client as a separate
// process of its own and only coordinates them over pipes, so neither peer
// shares a process, a gRPC runtime or an allocator with the other:
//   - meshrun: the real `meshrun-rdzvd --port 0` from this binary's directory
//     (gRPC and TCPStore protocol on one port);
//   - TCPStore: this binary in `--mode tcpstore-server` (isServer=true, port 0,
//     libtorch 2's libuv server, its default);
//   - clients: this binary in `--mode ops-client|barrier-client|rdzv-client`.
// Each cell runs with a fresh server, the peers interleaved within each
// repetition, and the median of the repetitions is reported.
//
// scripts/bench-store.sh builds and runs it and records bench/results/store.md.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_child.h"
#include "bench/bench_workloads.h"

namespace meshrun::bench {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

struct Config {
  std::string rdzvd;
  int reps = 3;
  milliseconds duration{3000};
  milliseconds warmup{300};
  std::vector<int> ops_clients{1, 8, 64, 256};
  std::vector<int> barrier_sizes{1000, 10000};
  int barrier_procs = 4;
  seconds barrier_timeout{120};
  std::vector<int> rdzv_sizes{1000, 10000};
  int rdzv_channels = 8;
  std::vector<std::string> sections{"ops", "barrier", "rdzv"};
  // The headline pair (c10d's TCPStore client against torch's libuv server
  // and against meshrun-rdzvd) and meshrun's gRPC client; meshrun-sync, a
  // diagnostic client (ops only, see sync_stream_store.h), on request.
  std::vector<std::string> peers{"tcpstore", "meshrun-tcpstore", "meshrun"};
  // Who serves the meshrun-tcpstore runs: "rdzvd" (meshrun-rdzvd's TCPStore
  // endpoint), or "torch" (torch's libuv server on both sides: an A/A check of
  // the harness, whose ratios show its noise).
  std::string meshrun_tcpstore_server = "rdzvd";
  // The daemon's TCPStore I/O threads (--tcpstore-threads); 0: its default.
  int rdzvd_tcpstore_threads = 0;
  // > 0: the meshrun-tcpstore clients reach meshrun-rdzvd through agents'
  // store relays, this many clients a relay (a simulated node), as workers
  // under meshrun --rdzv-backend=c10d do; 0: directly.
  int meshrun_via_relays = 0;
  // Non-empty: every daemon keeps its state in the etcd at these endpoints
  // (--etcd-endpoints; a prefix of its own each), so what a replicated
  // daemon costs the store shows beside a run without.
  std::string rdzvd_etcd;
  std::string json_path;

  bool Runs(Impl impl) const {
    return std::find(peers.begin(), peers.end(), ToString(impl)) != peers.end();
  }

  bool Has(const std::string& section) const {
    return std::find(sections.begin(), sections.end(), section) != sections.end();
  }
};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             SteadyClock::now().time_since_epoch())
      .count();
}

void Log(const std::string& text) {
  std::fprintf(stderr, "[store_bench] %s\n", text.c_str());
  std::fflush(stderr);
}

// `WORD k=v k=v ... error=free text`.
struct Report {
  std::string word;
  std::map<std::string, std::string> fields;
  std::string error;

  double Num(const std::string& key, double fallback = 0) const {
    auto it = fields.find(key);
    if (it == fields.end()) return fallback;
    try {
      return std::stod(it->second);
    } catch (const std::exception&) {
      return fallback;
    }
  }
};

Report Parse(const std::string& line) {
  Report report;
  std::string rest = line;
  if (auto e = rest.find(" error="); e != std::string::npos) {
    report.error = rest.substr(e + 7);
    rest.resize(e);
  }
  std::istringstream in(rest);
  in >> report.word;
  std::string token;
  while (in >> token) {
    auto eq = token.find('=');
    if (eq != std::string::npos)
      report.fields[token.substr(0, eq)] = token.substr(eq + 1);
  }
  return report;
}

// Reads lines until one starts with `word` (PROGRESS lines are kept in
// `progress`); nullopt on EOF or deadline.
std::optional<Report> Expect(ChildProcess& child, const std::string& word,
                             SteadyTime deadline, std::string* progress = nullptr) {
  while (auto line = child.ReadLine(deadline)) {
    Report report = Parse(*line);
    if (report.word == word) return report;
    if (report.word == "PROGRESS" && progress) *progress = *line;
    if (report.word == "FAILED") return report;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------- servers --

struct Server {
  std::unique_ptr<ChildProcess> process;
  std::string target;  // host:port, or a comma-separated list (relays)
  // --meshrun-via-relays: the process hosting the relays, in front of the
  // daemon; its CPU counts as the server's.
  std::unique_ptr<ChildProcess> relays;

  void Stop() {
    if (relays) {
      relays->CloseStdin();
      relays->Stop(milliseconds(5000));
      relays.reset();
    }
    if (!process) return;
    process->CloseStdin();
    process->Stop(milliseconds(5000));
    process.reset();
  }
};

// `clients`: how many will connect (to size the relays).
absl::StatusOr<Server> StartServer(Impl impl, const Config& config, int clients) {
  std::vector<std::string> argv;
  std::string marker;
  const bool daemon = impl == Impl::kMeshrunTcpStore
                          ? config.meshrun_tcpstore_server == "rdzvd"
                          : impl != Impl::kTcpStore;
  if (daemon) {
    // One port serves both gRPC and c10d's TCPStore protocol.
    argv = {config.rdzvd,  "--host", "127.0.0.1",           "--port", "0",
            "--log-level", "warn",   "--shutdown-grace-ms", "0"};
    // The TCPStore protocol is on by default (no token or TLS); said here so
    // that a daemon that cannot serve it fails to start instead.
    if (impl == Impl::kMeshrunTcpStore) argv.insert(argv.end(), {"--tcpstore", "on"});
    if (config.rdzvd_tcpstore_threads > 0)
      argv.insert(argv.end(),
                  {"--tcpstore-threads", std::to_string(config.rdzvd_tcpstore_threads)});
    if (!config.rdzvd_etcd.empty()) {
      static int daemons_started = 0;
      argv.insert(argv.end(), {"--etcd-endpoints", config.rdzvd_etcd, "--etcd-prefix",
                               "/store-bench/" + std::to_string(getpid()) + "-" +
                                   std::to_string(++daemons_started) + "/"});
    }
    // (With etcd, a MESHRUN_RDZVD_STANDBY line comes first.)
    marker = "MESHRUN_RDZVD_ENDPOINT=";
  } else {
    argv = {SelfPath(), "--mode", "tcpstore-server", "--timeout-ms",
            std::to_string(milliseconds(config.barrier_timeout).count())};
    marker = "TCPSTORE_PORT=";
  }
  auto process = ChildProcess::Spawn(argv);
  if (!process.ok()) return process.status();
  Server server{std::move(*process), ""};
  auto deadline = SteadyClock::now() + seconds(30);
  while (auto line = server.process->ReadLine(deadline)) {
    if (line->rfind(marker, 0) == 0) {
      std::string value = line->substr(marker.size());
      server.target = daemon ? value : "127.0.0.1:" + value;
      if (impl != Impl::kMeshrunTcpStore || !daemon || config.meshrun_via_relays <= 0)
        return server;
      // The daemon stays the target's server; clients go to the relays.
      const int count = std::max(
          1, (clients + config.meshrun_via_relays - 1) / config.meshrun_via_relays);
      auto relays =
          ChildProcess::Spawn({SelfPath(), "--mode", "relays", "--target", server.target,
                               "--clients", std::to_string(count)});
      if (!relays.ok()) {
        server.Stop();
        return relays.status();
      }
      server.relays = std::move(*relays);
      const std::string relay_marker = "RELAY_ENDPOINTS=";
      while (auto relay_line = server.relays->ReadLine(deadline)) {
        if (relay_line->rfind(relay_marker, 0) == 0) {
          server.target = relay_line->substr(relay_marker.size());
          return server;
        }
      }
      break;
    }
  }
  server.Stop();
  return absl::UnavailableError(absl::StrCat(
      ToString(impl), " server did not report its ", "endpoint within 30 s"));
}

// ------------------------------------------------------------------ cells --

struct Outcome {
  bool ok = false;
  std::string note;  // why it failed, or a remark
};

struct OpsSample : Outcome {
  double ops_per_s = 0, p50_us = 0, p99_us = 0;
  // CPU time per op of the client process and of the server process, and
  // how many of the machine's cores were busy, over the measured window.
  double client_cpu_us = 0, server_cpu_us = 0, busy_cores = 0;
};

OpsSample RunOpsCell(const Config& config, Impl impl, int clients, bool shared) {
  OpsSample sample;
  auto server = StartServer(impl, config, clients);
  if (!server.ok()) {
    sample.note = server.status().ToString();
    return sample;
  }
  std::vector<std::string> argv = {SelfPath(),
                                   "--mode",
                                   "ops-client",
                                   "--impl",
                                   ToString(impl),
                                   "--target",
                                   server->target,
                                   "--server-pid",
                                   std::to_string(server->process->pid()),
                                   "--clients",
                                   std::to_string(clients),
                                   "--duration-ms",
                                   std::to_string(config.duration.count()),
                                   "--warmup-ms",
                                   std::to_string(config.warmup.count())};
  if (shared) argv.push_back("--shared-channel");
  if (server->relays)
    argv.insert(argv.end(), {"--relay-pid", std::to_string(server->relays->pid())});
  auto child = ChildProcess::Spawn(argv);
  if (!child.ok()) {
    sample.note = child.status().ToString();
  } else {
    auto deadline = SteadyClock::now() + config.duration + config.warmup + seconds(60);
    auto result = Expect(**child, "RESULT", deadline);
    if (!result) {
      sample.note = "client gave no result";
    } else {
      sample.ok = result->Num("errors", 1) == 0 && result->Num("ops") > 0;
      sample.ops_per_s = result->Num("ops_per_s");
      sample.p50_us = result->Num("p50_us");
      sample.p99_us = result->Num("p99_us");
      sample.client_cpu_us = result->Num("client_cpu_us_per_op");
      sample.server_cpu_us = result->Num("server_cpu_us_per_op");
      sample.busy_cores = result->Num("busy_cores");
      sample.note = result->error;
    }
    (*child)->Stop(milliseconds(10000));
  }
  server->Stop();
  return sample;
}

struct BarrierSample : Outcome {
  double connect_s = 0, barrier_s = 0;
  double total_s() const { return connect_s + barrier_s; }
};

BarrierSample RunBarrierCell(const Config& config, Impl impl, int total) {
  BarrierSample sample;
  auto server = StartServer(impl, config, total);
  if (!server.ok()) {
    sample.note = server.status().ToString();
    return sample;
  }
  SteadyTime connect_started = SteadyClock::now();
  const int procs = std::max(1, std::min(config.barrier_procs, total));
  std::vector<std::unique_ptr<ChildProcess>> children;
  std::vector<std::string> progress(static_cast<size_t>(procs));
  auto fail = [&](const std::string& why) {
    // Collect the latest progress of every child before ending them.
    int connected = 0, arrived = 0, released = 0;
    for (size_t i = 0; i < children.size(); ++i) {
      while (auto line = children[i]->ReadLine(SteadyClock::now() + milliseconds(300))) {
        if (line->rfind("PROGRESS", 0) == 0) progress[i] = *line;
      }
      Report p = Parse(progress[i]);
      connected += static_cast<int>(p.Num("connected"));
      arrived += static_cast<int>(p.Num("arrived"));
      released += static_cast<int>(p.Num("released"));
    }
    sample.ok = false;
    sample.note = absl::StrCat(
        why, " (at ",
        absl::StrFormat(
            "%.1f",
            std::chrono::duration<double>(SteadyClock::now() - connect_started).count()),
        " s; last progress: connected ", connected, "/", total, ", add() answered ",
        arrived, "/", total, ", released ", released, "/", total, ")");
    if (auto status = server->process->ExitStatus())
      absl::StrAppend(&sample.note,
                      "; the server process had ended: ", DescribeWaitStatus(*status));
    for (auto& c : children) c->Kill();
    server->Stop();
    return sample;
  };

  for (int p = 0; p < procs; ++p) {
    int share = total / procs + (p < total % procs ? 1 : 0);
    auto child = ChildProcess::Spawn(
        {SelfPath(), "--mode", "barrier-client", "--impl", ToString(impl), "--target",
         server->target, "--clients", std::to_string(share), "--total",
         std::to_string(total), "--timeout-ms",
         std::to_string(milliseconds(config.barrier_timeout).count())});
    if (!child.ok()) return fail(child.status().ToString());
    children.push_back(std::move(*child));
  }
  for (auto& c : children) {
    if (!Expect(*c, "READY", SteadyClock::now() + seconds(60)))
      return fail("a client process did not start");
  }

  // Connect and barrier together are bounded by barrier_timeout.
  const int64_t connect_start = NowNs();
  connect_started = SteadyClock::now();
  const SteadyTime deadline = connect_started + config.barrier_timeout;
  for (auto& c : children) c->WriteLine("CONNECT");
  int64_t connected_at = 0;
  for (size_t i = 0; i < children.size(); ++i) {
    auto r = Expect(*children[i], "CONNECTED", deadline, &progress[i]);
    if (!r) {
      return fail(absl::StrCat("connecting did not finish within ",
                               config.barrier_timeout.count(), " s"));
    }
    if (r->word == "FAILED" || r->Num("failed") > 0)
      return fail(absl::StrCat(r->Num("failed"), " clients of one process failed to ",
                               "connect: ", r->error));
    connected_at = std::max(connected_at, static_cast<int64_t>(r->Num("t_ns")));
  }
  const int64_t go = NowNs();
  for (auto& c : children) c->WriteLine("GO");
  int64_t released_at = 0;
  for (size_t i = 0; i < children.size(); ++i) {
    auto r = Expect(*children[i], "DONE", deadline, &progress[i]);
    if (!r) {
      return fail(absl::StrCat(
          "barrier not released within ", config.barrier_timeout.count(),
          " s of the start (connect took ",
          absl::StrFormat("%.2f", (connected_at - connect_start) / 1e9), " s)"));
    }
    if (r->Num("failed") > 0)
      return fail(
          absl::StrCat(r->Num("failed"), " clients failed the barrier: ", r->error));
    released_at = std::max(released_at, static_cast<int64_t>(r->Num("t_ns")));
  }
  sample.ok = true;
  sample.connect_s = static_cast<double>(connected_at - connect_start) / 1e9;
  sample.barrier_s = static_cast<double>(released_at - go) / 1e9;
  for (auto& c : children) {
    c->WriteLine("EXIT");
    c->CloseStdin();
  }
  for (auto& c : children) c->Stop(milliseconds(10000));
  server->Stop();
  return sample;
}

struct RdzvSample : Outcome {
  double seconds = 0, issue_seconds = 0;
};

RdzvSample RunRdzvCell(const Config& config, int nodes, int rep) {
  RdzvSample sample;
  auto server = StartServer(Impl::kMeshrun, config, 0);
  if (!server.ok()) {
    sample.note = server.status().ToString();
    return sample;
  }
  auto child = ChildProcess::Spawn(
      {SelfPath(), "--mode", "rdzv-client", "--target", server->target, "--nodes",
       std::to_string(nodes), "--channels", std::to_string(config.rdzv_channels),
       "--run-id", absl::StrCat("bench-", nodes, "-", rep), "--timeout-ms", "60000"});
  if (!child.ok()) {
    sample.note = child.status().ToString();
  } else {
    auto result = Expect(**child, "RESULT", SteadyClock::now() + seconds(150));
    if (!result) {
      sample.note = "client gave no result";
    } else {
      sample.seconds = result->Num("seconds");
      sample.issue_seconds = result->Num("issue_seconds");
      bool verified = result->Num("assigned") == nodes && result->Num("ranks_ok") == 1 &&
                      result->Num("world_ok") == 1;
      sample.ok = verified && result->error.empty();
      sample.note = result->error;
      if (!verified && sample.note.empty())
        sample.note = "ranks or world sizes wrong, or nodes missing";
    }
    (*child)->Stop(milliseconds(10000));
  }
  server->Stop();
  return sample;
}

// ------------------------------------------------------------- aggregates --

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Median over the successful samples; `failed` carries the first failure.
template <typename Sample>
struct Cell {
  std::vector<Sample> samples;
  int ok_count() const {
    return static_cast<int>(std::count_if(samples.begin(), samples.end(),
                                          [](const Sample& s) { return s.ok; }));
  }
  bool ok() const {
    return !samples.empty() && ok_count() == static_cast<int>(samples.size());
  }
  std::string failure() const {
    for (const auto& s : samples)
      if (!s.ok) return s.note.empty() ? "failed" : s.note;
    return {};
  }
  template <typename F>
  double Med(F field) const {
    std::vector<double> v;
    for (const auto& s : samples)
      if (s.ok) v.push_back(field(s));
    return Median(v);
  }
};

// Median over reps of a ratio of two cells' samples of the same rep: the two
// ran back to back, so the machine's state changing between reps (it does,
// on a shared VM) cancels out of the ratio.
template <typename Sample, typename F>
double PairedMedian(const Cell<Sample>& a, const Cell<Sample>& b, F ratio) {
  std::vector<double> v;
  for (size_t i = 0; i < std::min(a.samples.size(), b.samples.size()); ++i)
    if (a.samples[i].ok && b.samples[i].ok)
      v.push_back(ratio(a.samples[i], b.samples[i]));
  return Median(v);
}

std::string Fmt(double v, const char* format = "%.1f") {
  if (std::isnan(v)) return "-";
  return absl::StrFormat(format, v);
}

std::string Thousands(double v) {
  if (std::isnan(v)) return "-";
  std::string digits = std::to_string(static_cast<int64_t>(std::llround(v)));
  std::string out;
  int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out += ',';
    out += digits[static_cast<size_t>(i)];
  }
  return out;
}

// Greedy word wrap to `width` columns, ending in a newline.
std::string Wrap(const std::string& text, size_t width = 90) {
  std::istringstream in(text);
  std::string word, line, out;
  while (in >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + line + "\n";
}

std::string JsonNum(double v) {
  return std::isnan(v) ? "null" : absl::StrFormat("%.6g", v);
}

std::string JsonStr(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// ------------------------------------------------------------ orchestrator --

// The headline pair: c10d's stock TCPStore client against torch's libuv
// server and against meshrun-rdzvd's TCPStore endpoint.
constexpr Impl kLibuv = Impl::kTcpStore;
constexpr Impl kMeshTcp = Impl::kMeshrunTcpStore;

// The headline pair in the order repetition `rep` runs it, back to back: the
// order alternates between repetitions, so that neither server always runs
// first on a machine whose speed drifts.
std::vector<Impl> HeadlinePair(const Config& config, int rep) {
  std::vector<Impl> order;
  for (Impl impl : {kLibuv, kMeshTcp})
    if (config.Runs(impl)) order.push_back(impl);
  if (rep % 2 == 1) std::reverse(order.begin(), order.end());
  return order;
}

std::string MeshTcpServerName(const Config& config) {
  return config.meshrun_tcpstore_server == "torch"
             ? "torch's libuv server (--meshrun-tcpstore-server=torch: an A/A check "
               "of the harness, NOT meshrun)"
             : absl::StrCat(
                   config.meshrun_via_relays > 0
                       ? absl::StrCat(
                             "agents' store relays (meshrun's workers' store under "
                             "--rdzv-backend=c10d; ",
                             config.meshrun_via_relays,
                             " clients a relay, all relays in one process, each "
                             "with its own store link) in front of ")
                       : std::string(),
                   "meshrun-rdzvd's TCPStore endpoint (its gRPC port; ",
                   config.rdzvd_tcpstore_threads > 0
                       ? absl::StrCat("--tcpstore-threads ",
                                      config.rdzvd_tcpstore_threads)
                       : std::string("its default I/O threads"),
                   ")",
                   config.meshrun_via_relays > 0
                       ? "; the relays' CPU counts as the server's"
                       : "");
}

int RunAll(const Config& config) {
  InstallChildCleanupHandlers();
  if (access(config.rdzvd.c_str(), X_OK) != 0) {
    std::cerr << "store_bench: cannot run the daemon at " << config.rdzvd
              << " (build meshrun-rdzvd or pass --rdzvd)\n";
    return 1;
  }
  const auto started = SteadyClock::now();
  std::vector<std::string> json;  // summary fields
  std::ostringstream out;
  // meshrun's own gRPC client against the libuv TCPStore: after the headline.
  std::ostringstream grpc_out;
  std::vector<std::pair<std::string, bool>> targets;  // description, met
  std::vector<std::pair<std::string, bool>> grpc_targets;
  bool all_ran = true;
  const bool headline = config.Runs(kLibuv) && config.Runs(kMeshTcp);
  if (config.meshrun_tcpstore_server == "torch")
    out << "\nNOTE: --meshrun-tcpstore-server=torch: the meshrun-tcpstore column is "
           "torch's own libuv server (A/A check of the harness), not meshrun.\n";

  // ---- 1. store ops
  if (config.Has("ops")) {
    // (impl, clients, shared channel) -> runs
    std::map<std::tuple<Impl, int, bool>, Cell<OpsSample>> ops;
    for (int rep = 0; rep < config.reps; ++rep) {
      for (int clients : config.ops_clients) {
        // The headline pair back to back, then meshrun's gRPC clients (one
        // client has no channel to share; TCPStore clients have no channels).
        std::vector<std::pair<Impl, bool>> runs;
        for (Impl impl : HeadlinePair(config, rep)) runs.push_back({impl, false});
        for (Impl impl : {Impl::kMeshrun, Impl::kMeshrunSync}) {
          if (!config.Runs(impl)) continue;
          runs.push_back({impl, false});
          if (clients > 1) runs.push_back({impl, true});
        }
        for (const auto& [impl, shared] : runs) {
          auto s = RunOpsCell(config, impl, clients, shared);
          Log(absl::StrCat("ops rep ", rep + 1, " ", ToString(impl),
                           UsesTcpStoreClient(impl) ? ""
                           : shared                 ? " shared"
                                                    : " own",
                           " clients=", clients, ": ", Thousands(s.ops_per_s),
                           " ops/s p50 ", Fmt(s.p50_us), " p99 ", Fmt(s.p99_us), " us",
                           s.ok ? "" : " FAILED " + s.note));
          ops[{impl, clients, shared}].samples.push_back(s);
        }
      }
    }
    const auto ops_of = [](const OpsSample& s) { return s.ops_per_s; };
    const auto p50_of = [](const OpsSample& s) { return s.p50_us; };
    const auto p99_of = [](const OpsSample& s) { return s.p99_us; };
    const auto client_cpu_of = [](const OpsSample& s) { return s.client_cpu_us; };
    const auto server_cpu_of = [](const OpsSample& s) { return s.server_cpu_us; };
    const auto busy_of = [](const OpsSample& s) { return s.busy_cores; };
    // Cores the server process used: its CPU per op times ops per second.
    const auto server_cores_of = [](const OpsSample& s) {
      return s.server_cpu_us * s.ops_per_s * 1e-6;
    };

    if (headline) {
      out << "\n## 1. Store ops, c10d's own TCPStore client on both sides: torch's libuv "
             "server vs meshrun-rdzvd\n"
          << Wrap(absl::StrCat(
                 "Each client is one thread of one client process with its own stock "
                 "c10d::TCPStore object (isServer=false, one connection each) of the "
                 "pinned libtorch, looping set(k_i, 64 B) / get(k_i) / add(counter, 1); "
                 "the only difference between the columns is the server, each in a "
                 "process of its own, fresh for every run: libuv = torch 2's default "
                 "TCPStore server (TCPStore isServer=true, libuv backend); meshrun = ",
                 MeshTcpServerName(config), ". ", config.duration.count() / 1000.0,
                 " s measured per run after ", config.warmup.count(), " ms warm-up; ",
                 config.reps,
                 " repetitions, each running the two servers back to back (which one "
                 "goes first alternates). Op/s and latencies are medians of the "
                 "repetitions; the 'x' columns (> 1 = meshrun better: op/s "
                 "meshrun/libuv, latency libuv/meshrun) are the median of the "
                 "repetitions' own ratios, and the targets are judged on them."))
          << "\n"
          << absl::StrFormat("%-7s | %10s %8s %8s | %12s %8s %8s | %6s %6s %6s\n",
                             "clients", "libuv op/s", "p50 us", "p99 us", "meshrun op/s",
                             "p50 us", "p99 us", "op/s x", "p50 x", "p99 x")
          << std::string(98, '-') << "\n";
      std::ostringstream cpu_rows;
      for (int clients : config.ops_clients) {
        const auto& l = ops[{kLibuv, clients, false}];
        const auto& m = ops[{kMeshTcp, clients, false}];
        const double l_ops = l.Med(ops_of), l_p50 = l.Med(p50_of), l_p99 = l.Med(p99_of);
        const double m_ops = m.Med(ops_of), m_p50 = m.Med(p50_of), m_p99 = m.Med(p99_of);
        const double ops_x =
            PairedMedian(m, l, [](const OpsSample& a, const OpsSample& b) {
              return a.ops_per_s / b.ops_per_s;
            });
        const double p50_x = PairedMedian(
            m, l,
            [](const OpsSample& a, const OpsSample& b) { return b.p50_us / a.p50_us; });
        const double p99_x = PairedMedian(
            m, l,
            [](const OpsSample& a, const OpsSample& b) { return b.p99_us / a.p99_us; });
        out << absl::StrFormat(
            "%-7d | %10s %8s %8s | %12s %8s %8s | %6s %6s %6s\n", clients,
            Thousands(l_ops), Fmt(l_p50), Fmt(l_p99), Thousands(m_ops), Fmt(m_p50),
            Fmt(m_p99), Fmt(ops_x, "%.2f"), Fmt(p50_x, "%.2f"), Fmt(p99_x, "%.2f"));
        if (!m.ok()) out << "        meshrun failures: " << m.failure() << "\n";
        if (!l.ok()) out << "        libuv failures: " << l.failure() << "\n";
        cpu_rows << absl::StrFormat(
            "%-7d | %9s %9s %9s %6s | %9s %9s %9s %6s\n", clients,
            Fmt(l.Med(client_cpu_of)), Fmt(l.Med(server_cpu_of)),
            Fmt(l.Med(server_cores_of), "%.2f"), Fmt(l.Med(busy_of), "%.2f"),
            Fmt(m.Med(client_cpu_of)), Fmt(m.Med(server_cpu_of)),
            Fmt(m.Med(server_cores_of), "%.2f"), Fmt(m.Med(busy_of), "%.2f"));
        all_ran = all_ran && m.ok() && l.ok();
        json.push_back(absl::StrCat(
            "{\"section\":\"ops\",\"client\":\"c10d-tcpstore\",\"clients\":", clients,
            ",\"libuv_ops_per_s\":", JsonNum(l_ops), ",\"libuv_p50_us\":", JsonNum(l_p50),
            ",\"libuv_p99_us\":", JsonNum(l_p99), ",\"meshrun_ops_per_s\":",
            JsonNum(m_ops), ",\"meshrun_p50_us\":", JsonNum(m_p50),
            ",\"meshrun_p99_us\":", JsonNum(m_p99), ",\"ops_ratio\":", JsonNum(ops_x),
            ",\"p50_ratio\":", JsonNum(p50_x), ",\"p99_ratio\":", JsonNum(p99_x),
            ",\"pairs\":", std::min(m.ok_count(), l.ok_count()),
            ",\"libuv_client_cpu_us_per_op\":", JsonNum(l.Med(client_cpu_of)),
            ",\"libuv_server_cpu_us_per_op\":", JsonNum(l.Med(server_cpu_of)),
            ",\"meshrun_client_cpu_us_per_op\":", JsonNum(m.Med(client_cpu_of)),
            ",\"meshrun_server_cpu_us_per_op\":", JsonNum(m.Med(server_cpu_of)),
            ",\"libuv_server_cores\":", JsonNum(l.Med(server_cores_of)),
            ",\"meshrun_server_cores\":", JsonNum(m.Med(server_cores_of)),
            ",\"libuv_ok\":", l.ok() ? "true" : "false", ",\"meshrun_ok\":",
            m.ok() ? "true" : "false", ",\"meshrun_error\":", JsonStr(m.failure()), "}"));
        const bool ran = m.ok() && l.ok();
        targets.push_back(
            {absl::StrFormat("[TCPStore client, %d clients] op/s, p50, p99 each >= 1.0x "
                             "libuv's: %sx, %sx, %sx (p50 %s vs %s us, p99 %s vs %s us)",
                             clients, Fmt(ops_x, "%.2f"), Fmt(p50_x, "%.2f"),
                             Fmt(p99_x, "%.2f"), Fmt(m_p50), Fmt(l_p50), Fmt(m_p99),
                             Fmt(l_p99)),
             ran && ops_x >= 1 && p50_x >= 1 && p99_x >= 1});
        if (clients == 64) {
          targets.push_back(
              {absl::StrFormat("[TCPStore client, 64 clients] op/s >= 1.5x "
                               "libuv's: %sx (%s vs %s op/s)",
                               Fmt(ops_x, "%.2f"), Thousands(m_ops), Thousands(l_ops)),
               ran && ops_x >= 1.5});
        }
      }
      out << "\n"
          << Wrap(absl::StrCat(
                 "Where the time goes: CPU time per op of the client process (the same "
                 "c10d client on both sides) and of the server process (microseconds, "
                 "from getrusage and /proc/<pid>/stat over the measured window), the "
                 "cores the server used (srv cores: its CPU per op x op/s), and how "
                 "many of the machine's ",
                 std::thread::hardware_concurrency(),
                 " cores were busy in all. When the cores are all busy, throughput is "
                 "bounded by cores / (client + server CPU per op)."))
          << absl::StrFormat("%-7s | %9s %9s %9s %6s | %9s %9s %9s %6s\n", "clients",
                             "libuv cli", "libuv srv", "srv cores", "busy", "mesh cli",
                             "mesh srv", "srv cores", "busy")
          << std::string(86, '-') << "\n"
          << cpu_rows.str();
    }

    if (config.Runs(Impl::kMeshrun) || config.Runs(Impl::kMeshrunSync)) {
      grpc_out
          << "\n## 4. Store ops, meshrun's gRPC client (rdzv::StoreClient) against "
             "meshrun-rdzvd's Store service, vs the libuv column of section 1\n"
          << Wrap(absl::StrCat(
                 "Same loop; meshrun = its own rdzv::StoreClient, either on a channel "
                 "(TCP connection) of its own, with a BatchSession stream of its own, or "
                 "on one channel shared by the process, where StoreClients share one "
                 "stream by default (requests of concurrent callers travel as one "
                 "batch). TCPStore = the libuv runs of section 1 (each repetition ran "
                 "these right after the headline pair). Ratio columns are 'x better' for "
                 "meshrun: ops/s meshrun/TCPStore, latency TCPStore/meshrun, each the "
                 "median of the repetitions' own ratios."));
    }
    for (Impl impl : {Impl::kMeshrun, Impl::kMeshrunSync}) {
      if (!config.Runs(impl)) continue;
      if (impl == Impl::kMeshrunSync) {
        grpc_out
            << "\n"
            << Wrap(
                   "Diagnostic, not a product client: meshrun-sync = the same daemon "
                   "with "
                   "a client on gRPC's synchronous stream API "
                   "(bench/sync_stream_store.h), where the calling thread does its own "
                   "I/O "
                   "instead of handing each operation to a callback thread and back.");
      }
      grpc_out << "\n"
               << absl::StrFormat(
                      "%-7s | %-22s | %10s %8s %8s | %10s %8s %8s | %6s %6s %6s\n",
                      "clients", std::string(ToString(impl)) + " channel", "mesh op/s",
                      "p50 us", "p99 us", "tcp op/s", "p50 us", "p99 us", "op/s x",
                      "p50 x", "p99 x");
      grpc_out << std::string(114, '-') << "\n";
      std::ostringstream cpu_rows;
      for (int clients : config.ops_clients) {
        const auto& t = ops[{Impl::kTcpStore, clients, false}];
        for (bool shared : {false, true}) {
          auto it = ops.find({impl, clients, shared});
          if (it == ops.end()) continue;
          const auto& m = it->second;
          double m_ops = m.Med(ops_of), m_p50 = m.Med(p50_of), m_p99 = m.Med(p99_of);
          double t_ops = t.Med(ops_of), t_p50 = t.Med(p50_of), t_p99 = t.Med(p99_of);
          const double ops_x =
              PairedMedian(m, t, [](const OpsSample& a, const OpsSample& b) {
                return a.ops_per_s / b.ops_per_s;
              });
          const double p50_x = PairedMedian(
              m, t,
              [](const OpsSample& a, const OpsSample& b) { return b.p50_us / a.p50_us; });
          const double p99_x = PairedMedian(
              m, t,
              [](const OpsSample& a, const OpsSample& b) { return b.p99_us / a.p99_us; });
          std::string variant = clients == 1 ? "own (= shared)"
                                : shared     ? "one shared"
                                             : "one per client";
          grpc_out << absl::StrFormat(
              "%-7d | %-22s | %10s %8s %8s | %10s %8s %8s | %6s %6s %6s\n", clients,
              variant, Thousands(m_ops), Fmt(m_p50), Fmt(m_p99), Thousands(t_ops),
              Fmt(t_p50), Fmt(t_p99), Fmt(ops_x, "%.2f"), Fmt(p50_x, "%.2f"),
              Fmt(p99_x, "%.2f"));
          cpu_rows << absl::StrFormat(
              "%-7d | %-22s | %9s %9s %6s | %9s %9s %6s\n", clients, variant,
              Fmt(m.Med(client_cpu_of)), Fmt(m.Med(server_cpu_of)),
              Fmt(m.Med(busy_of), "%.2f"), Fmt(t.Med(client_cpu_of)),
              Fmt(t.Med(server_cpu_of)), Fmt(t.Med(busy_of), "%.2f"));
          if (!m.ok())
            grpc_out << "        " << ToString(impl) << " failures: " << m.failure()
                     << "\n";
          if (!t.samples.empty() && !t.ok())
            grpc_out << "        TCPStore failures: " << t.failure() << "\n";
          all_ran = all_ran && m.ok() && (t.samples.empty() || t.ok());
          const std::string v = shared ? "shared" : "own";
          json.push_back(absl::StrCat(
              "{\"section\":\"ops\",\"client\":\"", ToString(impl), "\",\"clients\":",
              clients, ",\"channel\":\"", v, "\",\"meshrun_ops_per_s\":", JsonNum(m_ops),
              ",\"meshrun_p50_us\":", JsonNum(m_p50), ",\"meshrun_p99_us\":",
              JsonNum(m_p99), ",\"tcpstore_ops_per_s\":", JsonNum(t_ops),
              ",\"tcpstore_p50_us\":", JsonNum(t_p50),
              ",\"tcpstore_p99_us\":", JsonNum(t_p99), ",\"ops_ratio\":", JsonNum(ops_x),
              ",\"p50_ratio\":", JsonNum(p50_x), ",\"p99_ratio\":", JsonNum(p99_x),
              ",\"meshrun_client_cpu_us_per_op\":", JsonNum(m.Med(client_cpu_of)),
              ",\"meshrun_server_cpu_us_per_op\":", JsonNum(m.Med(server_cpu_of)),
              ",\"tcpstore_client_cpu_us_per_op\":", JsonNum(t.Med(client_cpu_of)),
              ",\"tcpstore_server_cpu_us_per_op\":", JsonNum(t.Med(server_cpu_of)),
              ",\"ok\":", m.ok() && t.ok() ? "true" : "false", "}"));
          if (impl != Impl::kMeshrun || t.samples.empty()) continue;
          const std::string label =
              absl::StrCat("[gRPC client, ", clients, " clients, meshrun channel ",
                           clients == 1 ? "own" : v, "] ");
          if (clients == 64) {
            grpc_targets.push_back(
                {label + absl::StrFormat("ops/s >= 2x TCPStore with p99 no worse: %.2fx, "
                                         "p99 %s vs %s us (%.2fx)",
                                         ops_x, Fmt(m_p99), Fmt(t_p99), p99_x),
                 ops_x >= 2 && p99_x >= 1});
          } else if (clients == 8) {
            grpc_targets.push_back(
                {label + absl::StrFormat("ops/s ahead of TCPStore: %.2fx", ops_x),
                 ops_x > 1});
          } else if (clients == 1) {
            grpc_targets.push_back(
                {label + absl::StrFormat("p50 within 2x TCPStore's: %s vs %s us (%.2fx)",
                                         Fmt(m_p50), Fmt(t_p50), 1 / p50_x),
                 p50_x >= 0.5});
          }
        }
      }
      grpc_out
          << "\n"
          << Wrap(absl::StrCat(
                 "Where the time goes (", ToString(impl),
                 "): CPU time per op of the client process and of the server process "
                 "(microseconds, from getrusage and /proc/<pid>/stat over the measured "
                 "window) and how many of the machine's ",
                 std::thread::hardware_concurrency(),
                 " cores were busy. When both cores are busy, throughput is bounded by "
                 "cores / (client + server CPU per op)."))
          << absl::StrFormat("%-7s | %-22s | %9s %9s %6s | %9s %9s %6s\n", "clients",
                             "channel", "mesh cli", "mesh srv", "busy", "tcp cli",
                             "tcp srv", "busy")
          << std::string(90, '-') << "\n"
          << cpu_rows.str();
    }
  }

  // ---- 2. barrier and 3. connection storm (the barrier runs' connect phase)
  if (config.Has("barrier")) {
    std::map<std::pair<int, Impl>, Cell<BarrierSample>> cells;
    for (int rep = 0; rep < config.reps; ++rep) {
      for (int n : config.barrier_sizes) {
        std::vector<Impl> order = HeadlinePair(config, rep);
        if (config.Runs(Impl::kMeshrun)) order.push_back(Impl::kMeshrun);
        for (Impl impl : order) {
          auto& cell = cells[{n, impl}];
          // A failure or timeout is reported once, not waited for every repetition.
          if (cell.samples.size() > static_cast<size_t>(cell.ok_count())) continue;
          auto s = RunBarrierCell(config, impl, n);
          Log(absl::StrCat(
              "barrier rep ", rep + 1, " ", ToString(impl), " N=", n, ": ",
              s.ok ? absl::StrFormat("connect %.2f s + barrier %.3f s = %.2f s",
                                     s.connect_s, s.barrier_s, s.total_s())
                   : "FAILED " + s.note));
          cell.samples.push_back(s);
        }
      }
    }
    auto conn = [](const BarrierSample& s) { return s.connect_s; };
    auto bar = [](const BarrierSample& s) { return s.barrier_s; };
    auto tot = [](const BarrierSample& s) { return s.total_s(); };
    // libuv's time / meshrun's, per pair: > 1 = meshrun faster.
    auto speedup = [](auto field) {
      return [field](const BarrierSample& m, const BarrierSample& l) {
        return field(l) / field(m);
      };
    };
    if (headline) {
      out << "\n## 2. Store barrier, c10d's own TCPStore client on both sides: N clients "
             "add(arrived, 1); the N-th sets done; all wait(done)\n"
          << Wrap(absl::StrCat(
                 "As torch.distributed.elastic.utils.store.barrier does it. Every client "
                 "is its own c10d::TCPStore object (one connection) on a thread of its "
                 "own, spread over ",
                 config.barrier_procs,
                 " client processes (a process may hold 20,000 files); servers in a "
                 "process of their own, fresh for every run: libuv = torch's server, "
                 "meshrun = ",
                 MeshTcpServerName(config),
                 ". First all clients connect at once and each serves one check() "
                 "(section 3, the storm); then the barrier = first add to last release. "
                 "Up to ",
                 config.reps,
                 " repetitions, each running the two servers back to back (which one "
                 "goes first alternates); a server that fails is not run again for that "
                 "N. Times are medians; 'x' = the median of the repetitions' own ratios "
                 "libuv/meshrun (> 1 = meshrun faster). Bounded at ",
                 config.barrier_timeout.count(), " s a run (connect + barrier)."))
          << "\n"
          << absl::StrFormat("%-6s | %10s %10s %9s | %10s %10s %9s\n", "N", "libuv bar s",
                             "mesh bar s", "barrier x", "libuv tot s", "mesh tot s",
                             "total x")
          << std::string(78, '-') << "\n";
      std::ostringstream storm;
      storm << "\n## 3. Connection storm, c10d's own TCPStore client on both sides: N "
               "clients connect at once\n"
            << Wrap(
                   "The connect phase of the runs of section 2: N threads (one "
                   "c10d::TCPStore object each) released at once construct their "
                   "client, then each does one check(); time = release to the last "
                   "check answered. 'x' = the median of the repetitions' own ratios "
                   "libuv/meshrun (> 1 = meshrun faster).")
            << "\n"
            << absl::StrFormat("%-6s | %13s %13s %9s\n", "N", "libuv conn s",
                               "meshrun conn s", "storm x")
            << std::string(48, '-') << "\n";
      for (int n : config.barrier_sizes) {
        const auto& l = cells[{n, kLibuv}];
        const auto& m = cells[{n, kMeshTcp}];
        const double bar_x = PairedMedian(m, l, speedup(bar));
        const double tot_x = PairedMedian(m, l, speedup(tot));
        const double conn_x = PairedMedian(m, l, speedup(conn));
        out << absl::StrFormat("%-6d | %10s %10s %9s | %10s %10s %9s\n", n,
                               Fmt(l.Med(bar), "%.3f"), Fmt(m.Med(bar), "%.3f"),
                               Fmt(bar_x, "%.2f"), Fmt(l.Med(tot), "%.2f"),
                               Fmt(m.Med(tot), "%.2f"), Fmt(tot_x, "%.2f"));
        storm << absl::StrFormat("%-6d | %13s %13s %9s\n", n, Fmt(l.Med(conn), "%.2f"),
                                 Fmt(m.Med(conn), "%.2f"), Fmt(conn_x, "%.2f"));
        if (!m.ok()) out << "         meshrun: FAILED: " << m.failure() << "\n";
        if (!l.ok()) out << "         libuv: FAILED: " << l.failure() << "\n";
        all_ran = all_ran && m.ok();
        // A libuv server that fails counts as slower than a meshrun that completes.
        const bool libuv_failed = !l.samples.empty() && !l.ok();
        auto judged = [&](double x, bool strictly) {
          if (!m.ok()) return false;
          if (std::isnan(x)) return libuv_failed;
          return strictly ? x > 1 : x >= 1;
        };
        const std::string libuv_note = libuv_failed ? " (libuv failed a run)" : "";
        targets.push_back(
            {absl::StrFormat("[TCPStore client, barrier %d clients] %s libuv: %sx "
                             "(barrier %s vs %s s; with connecting %s vs %s s)%s",
                             n, n >= 10000 ? "faster than" : "no slower than",
                             Fmt(bar_x, "%.2f"), Fmt(m.Med(bar), "%.3f"),
                             Fmt(l.Med(bar), "%.3f"), Fmt(m.Med(tot), "%.2f"),
                             Fmt(l.Med(tot), "%.2f"), libuv_note),
             judged(bar_x, n >= 10000)});
        if (n == config.barrier_sizes.back()) {
          targets.push_back(
              {absl::StrFormat("[TCPStore client, storm of %d clients] no slower than "
                               "libuv: %sx (%s vs %s s)%s",
                               n, Fmt(conn_x, "%.2f"), Fmt(m.Med(conn), "%.2f"),
                               Fmt(l.Med(conn), "%.2f"), libuv_note),
               judged(conn_x, false)});
        }
        for (const char* section : {"barrier", "storm"}) {
          const bool is_storm = section[0] == 's';
          auto value = [&](const Cell<BarrierSample>& c) {
            return is_storm ? c.Med(conn) : c.Med(bar);
          };
          json.push_back(absl::StrCat(
              "{\"section\":\"", section, "\",\"client\":\"c10d-tcpstore\",\"n\":", n,
              ",\"libuv_s\":", JsonNum(value(l)), ",\"meshrun_s\":", JsonNum(value(m)),
              ",\"ratio\":", JsonNum(is_storm ? conn_x : bar_x),
              is_storm ? ""
                       : absl::StrCat(",\"libuv_total_s\":", JsonNum(l.Med(tot)),
                                      ",\"meshrun_total_s\":", JsonNum(m.Med(tot)),
                                      ",\"total_ratio\":", JsonNum(tot_x)),
              ",\"pairs\":", std::min(m.ok_count(), l.ok_count()), ",\"libuv_ok\":",
              l.ok() ? "true" : "false", ",\"libuv_error\":", JsonStr(l.failure()),
              ",\"meshrun_ok\":", m.ok() ? "true" : "false",
              ",\"meshrun_error\":", JsonStr(m.failure()), "}"));
        }
      }
      out << storm.str();
    }

    if (config.Runs(Impl::kMeshrun)) {
      grpc_out
          << "\n## 5. Store barrier, meshrun's gRPC client against meshrun-rdzvd's "
             "Store service, vs the libuv runs of section 2\n"
          << Wrap(absl::StrCat(
                 "Every meshrun client has its own connection (MakeStoreChannel(target, "
                 "own_connection=true) and one BatchSession stream) and its own thread, "
                 "spread over ",
                 config.barrier_procs,
                 " client processes; it ran right after each repetition's headline "
                 "pair. connect = all clients connected and served one request "
                 "(check), all connecting at once; barrier = first add to last "
                 "release; total = both. Medians; 'x' = TCPStore/meshrun total, from "
                 "the medians (> 1 = meshrun faster)."))
          << "\n"
          << absl::StrFormat("%-6s | %9s %9s %9s | %9s %9s %9s | %7s\n", "N", "mesh conn",
                             "barrier", "total s", "tcp conn", "barrier", "total s",
                             "total x")
          << std::string(86, '-') << "\n";
      for (int n : config.barrier_sizes) {
        const auto& m = cells[{n, Impl::kMeshrun}];
        const auto& t = cells[{n, kLibuv}];
        double mt = m.Med(tot), tt = t.Med(tot);
        grpc_out << absl::StrFormat("%-6d | %9s %9s %9s | %9s %9s %9s | %7s\n", n,
                                    Fmt(m.Med(conn), "%.2f"), Fmt(m.Med(bar), "%.3f"),
                                    Fmt(mt, "%.2f"), Fmt(t.Med(conn), "%.2f"),
                                    Fmt(t.Med(bar), "%.3f"), Fmt(tt, "%.2f"),
                                    m.ok() && t.ok() ? Fmt(tt / mt, "%.2f") : "-");
        if (!m.ok()) grpc_out << "         meshrun: FAILED: " << m.failure() << "\n";
        if (!t.samples.empty() && !t.ok())
          grpc_out << "         TCPStore: FAILED: " << t.failure() << "\n";
        const bool met = m.ok() && (!t.ok() ? !t.samples.empty() : mt < tt);
        grpc_targets.push_back(
            {absl::StrFormat("[gRPC client, barrier %d clients] faster than TCPStore: "
                             "%s vs %s s",
                             n, Fmt(mt, "%.2f"),
                             t.ok() ? Fmt(tt, "%.2f") : std::string("TCPStore failed")),
             met});
        all_ran = all_ran && m.ok();
        json.push_back(absl::StrCat(
            "{\"section\":\"barrier\",\"client\":\"meshrun\",\"n\":", n,
            ",\"meshrun_connect_s\":", JsonNum(m.Med(conn)), ",\"meshrun_barrier_s\":",
            JsonNum(m.Med(bar)), ",\"meshrun_total_s\":", JsonNum(mt), ",\"meshrun_ok\":",
            m.ok() ? "true" : "false", ",\"meshrun_error\":", JsonStr(m.failure()),
            ",\"tcpstore_connect_s\":", JsonNum(t.Med(conn)), ",\"tcpstore_barrier_s\":",
            JsonNum(t.Med(bar)), ",\"tcpstore_total_s\":", JsonNum(tt),
            ",\"tcpstore_ok\":", t.ok() ? "true" : "false",
            ",\"tcpstore_error\":", JsonStr(t.failure()), "}"));
      }
    }
  }
  out << grpc_out.str();

  // ---- 3. rendezvous
  if (config.Has("rdzv")) {
    std::map<int, Cell<RdzvSample>> cells;
    for (int rep = 0; rep < config.reps; ++rep) {
      for (int n : config.rdzv_sizes) {
        auto s = RunRdzvCell(config, n, rep);
        Log(absl::StrCat(
            "rdzv rep ", rep + 1, " nodes=", n, ": ",
            s.ok ? absl::StrFormat("%.3f s", s.seconds) : "FAILED " + s.note));
        cells[n].samples.push_back(s);
      }
    }
    out << "\n## 6. One rendezvous round against meshrun-rdzvd (Rendezvous.Join "
           "streams)\n"
        << Wrap(absl::StrCat(
               "N simulated nodes, each a Join stream (callback API) with min_nodes = "
               "max_nodes = N, multiplexed over ",
               config.rdzv_channels,
               " connections (one issuing thread each); time = first join issued -> last "
               "node's `assigned` event. Verified: N assignments, distinct group ranks "
               "0..N-1, group_world_size = world_size = N. Median of ",
               config.reps,
               " runs. No TCPStore column: torch's rendezvous (c10d/etcd handlers) is "
               "Python, with no C++ peer to run here."))
        << "\n";
    out << absl::StrFormat("%-6s | %12s | %12s | %s\n", "nodes", "meshrun s",
                           "joins issued", "verified");
    out << std::string(52, '-') << "\n";
    for (int n : config.rdzv_sizes) {
      const auto& c = cells[n];
      double secs = c.Med([](const RdzvSample& s) { return s.seconds; });
      double issue = c.Med([](const RdzvSample& s) { return s.issue_seconds; });
      out << absl::StrFormat("%-6d | %12s | %12s | %s\n", n, Fmt(secs, "%.3f"),
                             Fmt(issue, "%.3f"), c.ok() ? "yes" : "NO: " + c.failure());
      all_ran = all_ran && c.ok();
      json.push_back(absl::StrCat("{\"section\":\"rdzv\",\"nodes\":", n,
                                  ",\"meshrun_s\":", JsonNum(secs),
                                  ",\"ok\":", c.ok() ? "true" : "false",
                                  ",\"error\":", JsonStr(c.failure()), "}"));
      if (n == 10000) {
        grpc_targets.push_back(
            {absl::StrFormat("[rendezvous 10,000 nodes] < 3 s: %s s", Fmt(secs, "%.3f")),
             c.ok() && secs < 3.0});
      }
    }
  }

  if (!targets.empty()) {
    out << "\n## Targets: c10d's TCPStore client, meshrun-rdzvd vs torch's libuv "
           "server (x > 1 = meshrun better)\n";
    for (const auto& [what, met] : targets)
      out << (met ? "  MET     " : "  MISSED  ") << what << "\n";
  }
  if (!grpc_targets.empty()) {
    out << "\n## Earlier targets: meshrun's gRPC clients\n";
    for (const auto& [what, met] : grpc_targets)
      out << (met ? "  MET     " : "  MISSED  ") << what << "\n";
  }
  double elapsed = std::chrono::duration<double>(SteadyClock::now() - started).count();
  out << absl::StrFormat("\nTotal benchmark time: %.0f s\n", elapsed);

  std::string summary = "[";
  for (size_t i = 0; i < json.size(); ++i) summary += (i ? "," : "") + json[i];
  summary += "]";
  std::string targets_json = "[";
  for (const auto* list : {&targets, &grpc_targets}) {
    for (const auto& [what, met] : *list) {
      targets_json +=
          absl::StrCat(targets_json.size() > 1 ? "," : "", "{\"target\":", JsonStr(what),
                       ",\"client\":\"", list == &targets ? "c10d-tcpstore" : "meshrun",
                       "\",\"met\":", met ? "true" : "false", "}");
    }
  }
  targets_json += "]";
  std::string full = absl::StrCat(
      "{\"nproc\":", sysconf(_SC_NPROCESSORS_ONLN), ",\"reps\":", config.reps,
      ",\"duration_ms\":", config.duration.count(), ",\"meshrun_tcpstore_server\":\"",
      config.meshrun_tcpstore_server, "\",\"cells\":", summary,
      ",\"targets\":", targets_json, "}");
  out << "\nSUMMARY_JSON " << full << "\n";
  std::cout << out.str();
  std::cout.flush();
  if (!config.json_path.empty()) {
    if (FILE* f = std::fopen(config.json_path.c_str(), "w")) {
      std::fprintf(f, "%s\n", full.c_str());
      std::fclose(f);
    }
  }
  return all_ran ? 0 : 3;
}

}  // namespace
}  // namespace meshrun::bench

int main(int argc, char** argv) {
  using namespace meshrun::bench;
  Config config;
  config.rdzvd = SelfDir() + "/meshrun-rdzvd";
  std::string mode = "all";
  std::string impl = "meshrun";
  std::string target;
  int clients = 1, total = 1, nodes = 1;
  bool shared_channel = false;
  pid_t server_pid = 0, relay_pid = 0;
  int64_t duration_ms = config.duration.count(), warmup_ms = config.warmup.count();
  int64_t timeout_ms = 120000, barrier_timeout_s = config.barrier_timeout.count();
  std::string run_id = "bench";

  CLI::App app{"store_bench: meshrun's store and rendezvous vs c10d TCPStore"};
  app.add_option("--mode", mode, "all, or a child role")
      ->check(CLI::IsMember({"all", "tcpstore-server", "relays", "ops-client",
                             "barrier-client", "rdzv-client"}))
      ->capture_default_str();
  app.add_option("--rdzvd", config.rdzvd, "meshrun-rdzvd binary")->capture_default_str();
  app.add_option("--reps", config.reps, "Runs per cell (median reported)")
      ->capture_default_str();
  app.add_option("--duration-ms", duration_ms, "Measured time per ops cell")
      ->capture_default_str();
  app.add_option("--warmup-ms", warmup_ms)->capture_default_str();
  app.add_option("--ops-clients", config.ops_clients)
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--barrier-sizes", config.barrier_sizes)
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--barrier-procs", config.barrier_procs)->capture_default_str();
  app.add_option("--barrier-timeout-s", barrier_timeout_s)->capture_default_str();
  app.add_option("--rdzv-sizes", config.rdzv_sizes)
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--rdzv-channels", config.rdzv_channels)->capture_default_str();
  app.add_option("--rdzvd-tcpstore-threads", config.rdzvd_tcpstore_threads,
                 "The daemon's --tcpstore-threads (0: its default)")
      ->capture_default_str();
  app.add_option("--meshrun-via-relays", config.meshrun_via_relays,
                 "Clients of the meshrun-tcpstore runs reach the daemon through agents' "
                 "store relays, this many a relay (0: directly)")
      ->capture_default_str();
  app.add_option("--sections", config.sections, "ops,barrier,rdzv")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--peers", config.peers,
                 "What to run: tcpstore (c10d client, libuv server), meshrun-tcpstore "
                 "(c10d client, meshrun-rdzvd), meshrun (gRPC client), and the "
                 "diagnostic meshrun-sync")
      ->delimiter(',')
      ->check(CLI::IsMember({"tcpstore", "meshrun-tcpstore", "meshrun", "meshrun-sync"}))
      ->capture_default_str();
  app.add_option("--meshrun-tcpstore-server", config.meshrun_tcpstore_server,
                 "Server of the meshrun-tcpstore runs: rdzvd, or torch (the libuv "
                 "server on both sides: an A/A check of the harness)")
      ->check(CLI::IsMember({"rdzvd", "torch"}))
      ->capture_default_str();
  app.add_option(
      "--rdzvd-etcd", config.rdzvd_etcd,
      "Daemons keep their state in etcd at HOST:PORT[,...] (--etcd-endpoints)");
  app.add_option("--json", config.json_path, "Also write the summary JSON here");
  // Child roles.
  app.add_option("--impl", impl)
      ->check(CLI::IsMember({"meshrun", "tcpstore", "meshrun-sync", "meshrun-tcpstore"}));
  app.add_option("--target", target);
  app.add_option("--clients", clients);
  app.add_option("--server-pid", server_pid);
  app.add_option("--relay-pid", relay_pid);
  app.add_flag("--shared-channel", shared_channel);
  app.add_option("--total", total);
  app.add_option("--nodes", nodes);
  app.add_option("--channels", config.rdzv_channels);
  app.add_option("--run-id", run_id);
  app.add_option("--timeout-ms", timeout_ms);
  CLI11_PARSE(app, argc, argv);

  config.duration = std::chrono::milliseconds(duration_ms);
  config.warmup = std::chrono::milliseconds(warmup_ms);
  config.barrier_timeout = std::chrono::seconds(barrier_timeout_s);
  const Impl which = impl == "tcpstore"           ? Impl::kTcpStore
                     : impl == "meshrun-tcpstore" ? Impl::kMeshrunTcpStore
                     : impl == "meshrun-sync"     ? Impl::kMeshrunSync
                                                  : Impl::kMeshrun;
  const auto timeout = std::chrono::milliseconds(timeout_ms);

  if (mode == "all") return RunAll(config);
  DieWithParent();
  if (mode == "tcpstore-server") return RunTcpStoreServer(timeout);
  if (mode == "relays") return RunRelays(target, clients);
  if (mode == "ops-client") {
    OpsOptions o;
    o.impl = which;
    o.target = target;
    o.clients = clients;
    o.server_pid = server_pid;
    o.relay_pid = relay_pid;
    o.shared_channel = shared_channel;
    o.duration = config.duration;
    o.warmup = config.warmup;
    return RunOpsClient(o);
  }
  if (mode == "barrier-client") {
    BarrierOptions o;
    o.impl = which;
    o.target = target;
    o.clients = clients;
    o.total = total;
    o.timeout = timeout;
    return RunBarrierClient(o);
  }
  RdzvOptions o;
  o.target = target;
  o.nodes = nodes;
  o.channels = config.rdzv_channels;
  o.run_id = run_id;
  o.timeout = timeout;
  return RunRdzvClient(o);
}
