// store_bench: meshrun's store and rendezvous against c10d's TCPStore, side by
// side in one invocation.
//
// The orchestrator (default mode) starts every server and client as a separate
// process of its own and only coordinates them over pipes, so neither peer
// shares a process, a gRPC runtime or an allocator with the other:
//   - meshrun: the real `meshrun-rdzvd --port 0` from this binary's directory;
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
  std::vector<int> ops_clients{1, 8, 64};
  std::vector<int> barrier_sizes{1000, 10000};
  int barrier_procs = 4;
  seconds barrier_timeout{120};
  std::vector<int> rdzv_sizes{1000, 10000};
  int rdzv_channels = 8;
  std::vector<std::string> sections{"ops", "barrier", "rdzv"};
  // meshrun-sync: a diagnostic client (ops only), see sync_stream_store.h.
  std::vector<std::string> peers{"meshrun", "tcpstore", "meshrun-sync"};
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
  std::string target;

  void Stop() {
    if (!process) return;
    process->CloseStdin();
    process->Stop(milliseconds(5000));
    process.reset();
  }
};

absl::StatusOr<Server> StartServer(Impl impl, const Config& config) {
  std::vector<std::string> argv;
  std::string marker;
  if (impl != Impl::kTcpStore) {
    argv = {config.rdzvd,  "--host", "127.0.0.1",           "--port", "0",
            "--log-level", "warn",   "--shutdown-grace-ms", "0"};
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
      server.target = impl != Impl::kTcpStore ? value : "127.0.0.1:" + value;
      return server;
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
  auto server = StartServer(impl, config);
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
  auto server = StartServer(impl, config);
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
  auto server = StartServer(Impl::kMeshrun, config);
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

struct OpsRow {
  int clients;
  std::string variant;  // "own" | "shared"
  Cell<OpsSample> meshrun;
  const Cell<OpsSample>* tcpstore;
};

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
  std::vector<std::pair<std::string, bool>> targets;  // description, met
  bool all_ran = true;

  // ---- 1. store ops
  if (config.Has("ops")) {
    // (impl, clients, shared channel) -> runs
    std::map<std::tuple<Impl, int, bool>, Cell<OpsSample>> ops;
    for (int rep = 0; rep < config.reps; ++rep) {
      for (int clients : config.ops_clients) {
        for (Impl impl : {Impl::kMeshrun, Impl::kMeshrunSync, Impl::kTcpStore}) {
          if (!config.Runs(impl)) continue;
          // One client has no channel to share; TCPStore has no channels.
          std::vector<bool> variants = {false};
          if (impl != Impl::kTcpStore && clients > 1) variants.push_back(true);
          for (bool shared : variants) {
            auto s = RunOpsCell(config, impl, clients, shared);
            Log(absl::StrCat("ops rep ", rep + 1, " ", ToString(impl),
                             impl == Impl::kTcpStore ? ""
                             : shared                ? " shared"
                                                     : " own",
                             " clients=", clients, ": ", Thousands(s.ops_per_s),
                             " ops/s p50 ", Fmt(s.p50_us), " p99 ", Fmt(s.p99_us), " us",
                             s.ok ? "" : " FAILED " + s.note));
            ops[{impl, clients, shared}].samples.push_back(s);
          }
        }
      }
    }
    out << "\n## 1. Store ops: each client loops set(k_i) / get(k_i) / add(counter), "
        << "64-byte values\n"
        << Wrap(absl::StrCat(
               "Each client is one thread of one client process with its own store "
               "client: "
               "meshrun = its own rdzv::StoreClient, either on a channel (TCP "
               "connection) of its own, with a BatchSession stream of its own, or on "
               "one channel shared by the process, where StoreClients share one "
               "stream by default (requests of concurrent callers travel as one "
               "batch); TCPStore = its own TCPStore object (isServer=false) of a "
               "libuv TCPStore server (torch 2's default). Servers run in their own "
               "processes. ",
               config.duration.count() / 1000.0, " s measured per cell after ",
               config.warmup.count(), " ms warm-up; median of ", config.reps,
               " runs. Ratio columns are 'x better' for meshrun: ops/s meshrun/TCPStore, "
               "latency TCPStore/meshrun (> 1 = meshrun better), each the median of "
               "the runs' own ratios (meshrun and TCPStore of one run ran back to back; "
               "the targets are judged on these)."));
    const auto ops_of = [](const OpsSample& s) { return s.ops_per_s; };
    const auto p50_of = [](const OpsSample& s) { return s.p50_us; };
    const auto p99_of = [](const OpsSample& s) { return s.p99_us; };
    const auto client_cpu_of = [](const OpsSample& s) { return s.client_cpu_us; };
    const auto server_cpu_of = [](const OpsSample& s) { return s.server_cpu_us; };
    const auto busy_of = [](const OpsSample& s) { return s.busy_cores; };
    for (Impl impl : {Impl::kMeshrun, Impl::kMeshrunSync}) {
      if (!config.Runs(impl)) continue;
      if (impl == Impl::kMeshrunSync) {
        out << "\n"
            << Wrap(
                   "Diagnostic, not a product client: meshrun-sync = the same daemon "
                   "with "
                   "a client on gRPC's synchronous stream API "
                   "(bench/sync_stream_store.h), where the calling thread does its own "
                   "I/O "
                   "instead of handing each operation to a callback thread and back.");
      }
      out << "\n"
          << absl::StrFormat("%-7s | %-22s | %10s %8s %8s | %10s %8s %8s | %6s %6s %6s\n",
                             "clients", std::string(ToString(impl)) + " channel",
                             "mesh op/s", "p50 us", "p99 us", "tcp op/s", "p50 us",
                             "p99 us", "op/s x", "p50 x", "p99 x");
      out << std::string(114, '-') << "\n";
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
          out << absl::StrFormat(
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
            out << "        " << ToString(impl) << " failures: " << m.failure() << "\n";
          if (!t.samples.empty() && !t.ok())
            out << "        TCPStore failures: " << t.failure() << "\n";
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
          const std::string label = absl::StrCat(
              "[", clients, " clients, meshrun channel ", clients == 1 ? "own" : v, "] ");
          if (clients == 64) {
            targets.push_back(
                {label + absl::StrFormat("ops/s >= 2x TCPStore with p99 no worse: %.2fx, "
                                         "p99 %s vs %s us (%.2fx)",
                                         ops_x, Fmt(m_p99), Fmt(t_p99), p99_x),
                 ops_x >= 2 && p99_x >= 1});
          } else if (clients == 8) {
            targets.push_back(
                {label + absl::StrFormat("ops/s ahead of TCPStore: %.2fx", ops_x),
                 ops_x > 1});
          } else if (clients == 1) {
            targets.push_back(
                {label + absl::StrFormat("p50 within 2x TCPStore's: %s vs %s us (%.2fx)",
                                         Fmt(m_p50), Fmt(t_p50), 1 / p50_x),
                 p50_x >= 0.5});
          }
        }
      }
      out << "\n"
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

  // ---- 2. barrier
  if (config.Has("barrier")) {
    std::map<std::pair<int, Impl>, Cell<BarrierSample>> cells;
    for (int n : config.barrier_sizes) {
      for (Impl impl : {Impl::kMeshrun, Impl::kTcpStore}) {
        if (!config.Runs(impl)) continue;
        auto& cell = cells[{n, impl}];
        for (int rep = 0; rep < config.reps; ++rep) {
          auto s = RunBarrierCell(config, impl, n);
          Log(absl::StrCat(
              "barrier rep ", rep + 1, " ", ToString(impl), " N=", n, ": ",
              s.ok ? absl::StrFormat("connect %.2f s + barrier %.2f s = %.2f s",
                                     s.connect_s, s.barrier_s, s.total_s())
                   : "FAILED " + s.note));
          cell.samples.push_back(s);
          // A failure or timeout is reported once, not waited for three times.
          if (!s.ok) break;
        }
      }
    }
    out << "\n## 2. Store barrier: N clients add(arrived, 1); the N-th sets done; all "
        << "wait(done)\n"
        << Wrap(absl::StrCat(
               "Every client has its own connection (meshrun: MakeStoreChannel(target, "
               "own_connection=true) and one BatchSession stream; TCPStore: its own "
               "TCPStore "
               "object, which opens two sockets) and its own thread, spread over ",
               config.barrier_procs,
               " client processes; servers in their own process. connect = all clients "
               "connected and served one request (check), all connecting at once; "
               "barrier = first add to last release; total (the headline) = both. "
               "Median of up to ",
               config.reps, " runs (a failing cell is not repeated); bounded at ",
               config.barrier_timeout.count(),
               " s. 'x' = TCPStore/meshrun (> 1 = meshrun faster)."))
        << "\n";
    out << absl::StrFormat("%-6s | %9s %9s %9s | %9s %9s %9s | %7s\n", "N", "mesh conn",
                           "barrier", "total s", "tcp conn", "barrier", "total s",
                           "total x");
    out << std::string(84, '-') << "\n";
    for (int n : config.barrier_sizes) {
      const auto& m = cells[{n, Impl::kMeshrun}];
      const auto& t = cells[{n, Impl::kTcpStore}];
      auto conn = [](const BarrierSample& s) { return s.connect_s; };
      auto bar = [](const BarrierSample& s) { return s.barrier_s; };
      auto tot = [](const BarrierSample& s) { return s.total_s(); };
      double mt = m.Med(tot), tt = t.Med(tot);
      out << absl::StrFormat("%-6d | %9s %9s %9s | %9s %9s %9s | %7s\n", n,
                             Fmt(m.Med(conn), "%.2f"), Fmt(m.Med(bar), "%.3f"),
                             Fmt(mt, "%.2f"), Fmt(t.Med(conn), "%.2f"),
                             Fmt(t.Med(bar), "%.3f"), Fmt(tt, "%.2f"),
                             m.ok() && t.ok() ? Fmt(tt / mt, "%.2f") : "-");
      if (!m.samples.empty() && !m.ok())
        out << "         meshrun: FAILED: " << m.failure() << "\n";
      if (!t.samples.empty() && !t.ok())
        out << "         TCPStore: FAILED: " << t.failure() << "\n";
      if (!m.samples.empty()) {
        // A TCPStore that fails the barrier counts as slower than one that
        // completes it.
        const bool met = m.ok() && (!t.ok() ? !t.samples.empty() : mt < tt);
        targets.push_back(
            {absl::StrFormat("[barrier %d clients] faster than TCPStore: %s vs %s s", n,
                             Fmt(mt, "%.2f"),
                             t.ok() ? Fmt(tt, "%.2f") : std::string("TCPStore failed")),
             met});
      }
      all_ran = all_ran && m.ok();
      json.push_back(absl::StrCat("{\"section\":\"barrier\",\"n\":", n,
                                  ",\"meshrun_connect_s\":", JsonNum(m.Med(conn)),
                                  ",\"meshrun_barrier_s\":", JsonNum(m.Med(bar)),
                                  ",\"meshrun_total_s\":", JsonNum(mt),
                                  ",\"meshrun_ok\":", m.ok() ? "true" : "false",
                                  ",\"meshrun_error\":", JsonStr(m.failure()),
                                  ",\"tcpstore_connect_s\":", JsonNum(t.Med(conn)),
                                  ",\"tcpstore_barrier_s\":", JsonNum(t.Med(bar)),
                                  ",\"tcpstore_total_s\":", JsonNum(tt),
                                  ",\"tcpstore_ok\":", t.ok() ? "true" : "false",
                                  ",\"tcpstore_error\":", JsonStr(t.failure()), "}"));
    }
  }

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
    out << "\n## 3. One rendezvous round against meshrun-rdzvd (Rendezvous.Join "
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
        targets.push_back(
            {absl::StrFormat("[rendezvous 10,000 nodes] < 3 s: %s s", Fmt(secs, "%.3f")),
             c.ok() && secs < 3.0});
      }
    }
  }

  if (!targets.empty()) {
    out << "\n## Targets\n";
    for (const auto& [what, met] : targets)
      out << (met ? "  MET     " : "  MISSED  ") << what << "\n";
  }
  double elapsed = std::chrono::duration<double>(SteadyClock::now() - started).count();
  out << absl::StrFormat("\nTotal benchmark time: %.0f s\n", elapsed);

  std::string summary = "[";
  for (size_t i = 0; i < json.size(); ++i) summary += (i ? "," : "") + json[i];
  summary += "]";
  std::string targets_json = "[";
  for (size_t i = 0; i < targets.size(); ++i) {
    targets_json += absl::StrCat(i ? "," : "", "{\"target\":", JsonStr(targets[i].first),
                                 ",\"met\":", targets[i].second ? "true" : "false", "}");
  }
  targets_json += "]";
  std::string full = absl::StrCat(
      "{\"nproc\":", sysconf(_SC_NPROCESSORS_ONLN), ",\"reps\":", config.reps,
      ",\"duration_ms\":", config.duration.count(), ",\"cells\":", summary,
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
  pid_t server_pid = 0;
  int64_t duration_ms = config.duration.count(), warmup_ms = config.warmup.count();
  int64_t timeout_ms = 120000, barrier_timeout_s = config.barrier_timeout.count();
  std::string run_id = "bench";

  CLI::App app{"store_bench: meshrun's store and rendezvous vs c10d TCPStore"};
  app.add_option("--mode", mode, "all, or a child role")
      ->check(CLI::IsMember(
          {"all", "tcpstore-server", "ops-client", "barrier-client", "rdzv-client"}))
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
  app.add_option("--sections", config.sections, "ops,barrier,rdzv")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--peers", config.peers,
                 "Clients to run: meshrun, tcpstore, and the diagnostic meshrun-sync")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--json", config.json_path, "Also write the summary JSON here");
  // Child roles.
  app.add_option("--impl", impl)
      ->check(CLI::IsMember({"meshrun", "tcpstore", "meshrun-sync"}));
  app.add_option("--target", target);
  app.add_option("--clients", clients);
  app.add_option("--server-pid", server_pid);
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
  const Impl which = impl == "tcpstore"       ? Impl::kTcpStore
                     : impl == "meshrun-sync" ? Impl::kMeshrunSync
                                              : Impl::kMeshrun;
  const auto timeout = std::chrono::milliseconds(timeout_ms);

  if (mode == "all") return RunAll(config);
  DieWithParent();
  if (mode == "tcpstore-server") return RunTcpStoreServer(timeout);
  if (mode == "ops-client") {
    OpsOptions o;
    o.impl = which;
    o.target = target;
    o.clients = clients;
    o.server_pid = server_pid;
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
