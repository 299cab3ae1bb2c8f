// Observability end to end: a real meshrun-rdzvd with --metrics-port 0 and
// two real `meshrun` agents whose workers use the store and fail once on the
// test's cue. The test scrapes /metrics and runs `meshrun status` while the
// run is live and checks that the values move: joins, nodes, store ops, the
// restart after the failure and its root cause. Then the HTTP port's
// behaviour under bad requests, slow clients and too many connections.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/status/build_info.h"
#include "tests/support/child_process.h"
#include "tests/support/http_client.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::BinDir;
using testing::ChildProcess;
using testing::DaemonProcess;
using testing::ExitCode;
using testing::HttpResult;
using testing::ReadToClose;
using testing::ScrapeUntil;
using testing::SendAll;
namespace fs = std::filesystem;

const std::string kWorker =
    std::string(MESHRUN_SOURCE_DIR) + "/tests/integration/workers/obs_worker.sh";
const std::string kRaiseError =
    std::string(MESHRUN_SOURCE_DIR) + "/tests/integration/workers/raise_error.py";

int PortOf(const std::string& endpoint) {
  return std::atoi(endpoint.substr(endpoint.rfind(':') + 1).c_str());
}

std::unique_ptr<ChildProcess> Agent(const std::string& endpoint, const std::string& dir) {
  return std::make_unique<ChildProcess>(
      std::vector<std::string>{
          "/usr/bin/env", "FAIL_PY=" + kRaiseError, "PYTHON_EXEC=" MESHRUN_PYTHON,
          BinDir() + "/meshrun", "--nnodes=2", "--nproc-per-node=2",
          "--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint, "--rdzv-id=obs",
          "--max-restarts=1", "--no-python", kWorker, BinDir() + "/store_tool", dir},
      /*merge_stderr=*/true);
}

// `meshrun status ...`: exit code and output.
std::pair<int, std::string> Status(const std::vector<std::string>& args) {
  std::vector<std::string> argv{BinDir() + "/meshrun", "status"};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess process(argv, /*merge_stderr=*/true);
  int code = ExitCode(process, seconds(30));
  return {code, process.output()};
}

void Touch(const std::string& path) { std::ofstream(path) << "x"; }

std::string TempDir() {
  std::string pattern = (fs::temp_directory_path() / "meshrun-obs-XXXXXX").string();
  if (!mkdtemp(pattern.data())) return {};
  return pattern;
}

TEST(ObservabilityTest, MetricsAndStatusFollowARealRunThroughARestart) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  DaemonProcess daemon({"--metrics-port", "0"});
  const int port = daemon.ReadMetricsPort();
  ASSERT_GT(port, 0);

  std::string metrics = testing::HttpGet(port, "/metrics").body;
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_joins_total"), 0);
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_store_ops_total{op=\"set\"}"), 0);
  // The daemon's build, as this test's (one build made both).
  const rdzv::BuildInfo build = rdzv::GetBuildInfo();
  EXPECT_EQ(testing::MetricSample(metrics, std::string("meshrun_build_info{version=\"") +
                                               build.version + "\",commit=\"" +
                                               build.commit + "\"}"),
            1)
      << metrics;
  EXPECT_GT(testing::MetricSample(metrics, "process_resident_memory_bytes").value_or(0),
            1 << 20)
      << metrics;

  auto a = Agent(daemon.endpoint(), dir);
  auto b = Agent(daemon.endpoint(), dir);
  // Both nodes joined, round 1 formed, all 4 workers set their key and waited.
  metrics = ScrapeUntil(port, [](const std::string& m) {
    return testing::MetricSample(m, "meshrun_store_ops_total{op=\"wait\"}") >= 4;
  });
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_joins_total"), 2);
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_runs_created_total"), 1);
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_rounds_completed_total"), 1);
  EXPECT_EQ(testing::MetricSample(metrics,
                                  "meshrun_run_nodes{run=\"obs\",state=\"participant\"}"),
            2);
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_run_world_size{run=\"obs\"}"), 4);
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_store_ops_total{op=\"set\"}"), 4);
  EXPECT_EQ(testing::MetricSample(metrics,
                                  "meshrun_store_op_duration_seconds_count{op=\"set\"}"),
            4);
  EXPECT_EQ(
      testing::MetricSample(metrics, "meshrun_restarts_total{cause=\"worker failure\"}"),
      0);
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_join_streams_open"), 2);
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_runs{state=\"active\"}"), 1);

  auto [code, table] = Status({"--rdzv-endpoint", daemon.endpoint()});
  EXPECT_EQ(code, 0) << table;
  EXPECT_NE(
      table.find("run obs: active, round 1, restarts 0/1, nodes 2..2, world size 4"),
      std::string::npos)
      << table;
  EXPECT_NE(table.find("participant  0           0-1    2"), std::string::npos) << table;
  EXPECT_NE(table.find("participant  1           2-3    2"), std::string::npos) << table;

  // Rank 3 fails (a Python traceback through @record): one restart. With
  // its `import torch` it took over a minute on 2 cores beside the soak test
  // and three busy loops.
  Touch(dir + "/fail");
  metrics = ScrapeUntil(
      port,
      [](const std::string& m) {
        return testing::MetricSample(m, "meshrun_store_ops_total{op=\"wait\"}") >= 8;
      },
      seconds(180));
  EXPECT_EQ(
      testing::MetricSample(metrics, "meshrun_restarts_total{cause=\"worker failure\"}"),
      1);
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_restarts_total{cause=\"node left\"}"),
            0);
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_rounds_completed_total"), 2);
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_run_restarts{run=\"obs\"}"), 1);
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_run_round{run=\"obs\"}"), 2);
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_store_ops_total{op=\"set\"}"), 8);
  EXPECT_GE(testing::MetricSample(metrics, "meshrun_failure_reports_total"), 1);
  // Round 1's four exits: rank 3's code, three stopped by SIGTERM.
  metrics = ScrapeUntil(port, [](const std::string& m) {
    return testing::MetricSample(m, "meshrun_worker_exits_total{result=\"signal\"}") >= 3;
  });
  EXPECT_EQ(
      testing::MetricSample(metrics, "meshrun_worker_exits_total{result=\"exit_code\"}"),
      1);
  EXPECT_EQ(
      testing::MetricSample(metrics, "meshrun_worker_exits_total{result=\"signal\"}"), 3);

  auto [json_code, json] = Status({"--rdzv-endpoint", daemon.endpoint(), "--json"});
  EXPECT_EQ(json_code, 0) << json;
  for (
      const char* want :
      {R"("run_id":"obs","state":"active")", R"("round":2,"restart_count":1)",
       R"("root_cause":{"exit":{"local_rank":1,"global_rank":3,"exit_code":1,"signal":0)",
       R"(corrupt batch at step 17 on rank 3)", R"(in load_batch)",
       R"("description":"SIGTERM")"}) {
    EXPECT_NE(json.find(want), std::string::npos) << want << "\n" << json;
  }
  auto [one_code, one] =
      Status({"--rdzv-endpoint", daemon.endpoint(), "--run-id", "obs"});
  EXPECT_EQ(one_code, 0);
  EXPECT_NE(one.find("last failure: round 1"), std::string::npos) << one;
  EXPECT_NE(one.find("rank 3 (local 1) exit 1"), std::string::npos) << one;
  EXPECT_NE(one.find("ValueError: corrupt batch at step 17 on rank 3"), std::string::npos)
      << one;
  // The same snapshot over HTTP.
  HttpResult api = testing::HttpGet(port, "/api/status?run=obs");
  EXPECT_EQ(api.status, 200);
  EXPECT_NE(api.head.find("Content-Type: application/json"), std::string::npos);
  EXPECT_NE(api.body.find(R"("restart_count":1)"), std::string::npos);

  Touch(dir + "/finish");
  EXPECT_EQ(ExitCode(*a), 0) << a->output();
  EXPECT_EQ(ExitCode(*b), 0) << b->output();
  metrics = ScrapeUntil(port, [](const std::string& m) {
    return testing::MetricSample(m, "meshrun_worker_exits_total{result=\"success\"}") >=
           4;
  });
  EXPECT_EQ(
      testing::MetricSample(metrics, "meshrun_runs_closed_total{outcome=\"succeeded\"}"),
      1);
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_runs{state=\"closed\"}"), 1);
  EXPECT_EQ(
      testing::MetricSample(metrics, "meshrun_worker_exits_total{result=\"success\"}"),
      4);
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_join_streams_open"), 0);
  fs::remove_all(dir);
}

TEST(ObservabilityTest, StatusCommandErrors) {
  DaemonProcess daemon;
  auto [unknown, out1] =
      Status({"--rdzv-endpoint", daemon.endpoint(), "--run-id", "nope"});
  EXPECT_EQ(unknown, 1);
  EXPECT_NE(out1.find("meshrun status: the daemon knows no run nope"), std::string::npos)
      << out1;
  auto [empty, out2] = Status({"--rdzv-endpoint", daemon.endpoint()});
  EXPECT_EQ(empty, 0);
  EXPECT_EQ(out2, "no runs\n");

  // Nothing listens on a port the kernel just handed out and took back.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string dead = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  close(fd);
  auto [unreachable, out3] = Status({"--rdzv-endpoint", dead, "--timeout", "2"});
  EXPECT_EQ(unreachable, 1);
  EXPECT_NE(out3.find("meshrun status: cannot reach the rendezvous daemon at " + dead),
            std::string::npos)
      << out3;
  EXPECT_EQ(std::count(out3.begin(), out3.end(), '\n'), 1) << "one line: " << out3;

  auto [missing, out4] = Status({});
  EXPECT_EQ(missing, 2);
  EXPECT_NE(out4.find("--rdzv-endpoint is required"), std::string::npos) << out4;
  auto [bad, out5] = Status({"--rdzv-endpoint", "no-port"});
  EXPECT_EQ(bad, 2);
  EXPECT_NE(out5.find("expected HOST:PORT"), std::string::npos) << out5;
}

TEST(ObservabilityTest, StatusCommandSendsTheToken) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << "observability-test-token\n";
  ASSERT_EQ(chmod(token_file.c_str(), 0600), 0);
  DaemonProcess daemon({"--token-file", token_file});
  auto [refused, out1] = Status({"--rdzv-endpoint", daemon.endpoint()});
  EXPECT_EQ(refused, 1) << out1;
  EXPECT_NE(out1.find("meshrun status: the rendezvous daemon at " + daemon.endpoint() +
                      " refused the call"),
            std::string::npos)
      << out1;
  auto [ok, out2] =
      Status({"--rdzv-endpoint", daemon.endpoint(), "--token-file", token_file});
  EXPECT_EQ(ok, 0) << out2;
  EXPECT_EQ(out2, "no runs\n");
  fs::remove_all(dir);
}

TEST(ObservabilityTest, HttpPortRefusesBadRequests) {
  DaemonProcess daemon({"--metrics-port", "0"});
  const int port = daemon.ReadMetricsPort();
  ASSERT_GT(port, 0);
  EXPECT_EQ(testing::HttpGet(port, "/nope").status, 404);
  HttpResult post = testing::HttpRequest(
      port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi");
  EXPECT_EQ(post.status, 405);
  EXPECT_NE(post.head.find("Allow: GET, HEAD"), std::string::npos) << post.head;
  EXPECT_EQ(testing::HttpRequest(port, "BLAH\r\n\r\n").status, 400);
  EXPECT_EQ(testing::HttpRequest(
                port, "GET / HTTP/1.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n")
                .status,
            431);
  EXPECT_EQ(
      testing::HttpRequest(port, "GET / HTTP/1.1\r\nContent-Length: 100000\r\n\r\n" +
                                     std::string(100000, 'b'))
          .status,
      413);
  HttpResult head = testing::HttpRequest(port, "HEAD / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.body.empty());
  HttpResult page = testing::HttpGet(port, "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.head.find("Content-Security-Policy: default-src 'none'"),
            std::string::npos);
  EXPECT_NE(page.body.find("<title>meshrun status</title>"), std::string::npos);
}

TEST(ObservabilityTest, SlowAndExcessConnectionsDoNotHarmTheDaemon) {
  DaemonProcess daemon({"--metrics-port", "0"});
  const int port = daemon.ReadMetricsPort();
  ASSERT_GT(port, 0);
  // 64 slowloris clients: a request line, then nothing.
  std::vector<int> slow;
  for (int i = 0; i < 64; ++i) {
    int fd = testing::ConnectLoopback(port);
    ASSERT_GE(fd, 0);
    SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n");
    slow.push_back(fd);
  }
  // The server counts them as open once it has accepted them.
  // One more is over the limit: closed at once, unanswered.
  const auto deadline = std::chrono::steady_clock::now() + seconds(5);
  bool refused = false;
  while (!refused && std::chrono::steady_clock::now() < deadline) {
    int fd = testing::ConnectLoopback(port);
    ASSERT_GE(fd, 0);
    SendAll(fd, "GET /metrics HTTP/1.1\r\n\r\n");
    auto response = ReadToClose(fd, seconds(2));
    close(fd);
    refused = response && response->empty();
  }
  EXPECT_TRUE(refused) << "a connection beyond the limit was answered";
  // The gRPC side is unaffected meanwhile.
  auto [code, out] = Status({"--rdzv-endpoint", daemon.endpoint()});
  EXPECT_EQ(code, 0) << out;
  // The slow ones are closed after the request timeout (5 s), unanswered.
  for (int fd : slow) {
    auto rest = ReadToClose(fd, seconds(15));
    EXPECT_TRUE(rest.has_value()) << "a slow connection was never closed";
    if (rest) {
      EXPECT_TRUE(rest->empty()) << *rest;
    }
    close(fd);
  }
  // And the port serves again.
  std::string metrics = ScrapeUntil(port, [](const std::string& m) {
    return testing::MetricSample(m, "meshrun_http_connections_rejected_total") >= 1;
  });
  EXPECT_GE(testing::MetricSample(metrics, "meshrun_http_connections_rejected_total"), 1)
      << metrics;
  EXPECT_TRUE(daemon.process().Running());
}

TEST(ObservabilityTest, DaemonFlagErrors) {
  ChildProcess bad({BinDir() + "/meshrun-rdzvd", "--metrics-port", "70000"}, true);
  EXPECT_EQ(ExitCode(bad), 2) << bad.output();
  // A metrics port already in use: a clear line and exit 1.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string used = std::to_string(ntohs(addr.sin_port));
  ChildProcess busy({BinDir() + "/meshrun-rdzvd", "--host", "127.0.0.1", "--port", "0",
                     "--metrics-port", used},
                    true);
  EXPECT_EQ(ExitCode(busy), 1) << busy.output();
  EXPECT_NE(busy.output().find("cannot listen on 127.0.0.1:" + used), std::string::npos)
      << busy.output();
  close(fd);
}

TEST(ObservabilityTest, StandaloneServesTheStatusPage) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  ChildProcess run({"/usr/bin/env", BinDir() + "/meshrun", "--standalone",
                    "--metrics-port=0", "--nproc-per-node=2", "--max-restarts=1",
                    "--no-python", kWorker, BinDir() + "/store_tool", dir},
                   /*merge_stderr=*/true);
  auto line = run.ReadUntil("status page and metrics on http://", seconds(30));
  ASSERT_TRUE(line.has_value()) << run.output();
  const size_t at = line->find("http://") + 7;
  const std::string endpoint = line->substr(at, line->find('/', at) - at);
  const int port = PortOf(endpoint);
  ASSERT_GT(port, 0) << *line;
  std::string metrics = ScrapeUntil(port, [](const std::string& m) {
    return testing::MetricSample(m, "meshrun_store_ops_total{op=\"wait\"}") >= 2;
  });
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_joins_total"), 1) << metrics;
  EXPECT_EQ(testing::MetricSample(metrics, "meshrun_runs{state=\"active\"}"), 1);
  HttpResult api = testing::HttpGet(port, "/api/status");
  EXPECT_NE(api.body.find(R"("state":"active")"), std::string::npos) << api.body;
  // Ranks 0 and 1 only: nobody fails in attempt 0 and the workers wait to
  // be stopped, as meshrun does on SIGTERM.
  run.Signal(SIGTERM);
  EXPECT_EQ(ExitCode(run), 128 + SIGTERM) << run.output();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshrun
