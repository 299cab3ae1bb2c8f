// meshrun-rdzvd --state-dir end to end: the real daemon is SIGKILLed and
// restarted on the same port with the same directory; store contents and
// rounds survive, a second daemon on the directory, a damaged snapshot and a
// damaged log are refused, a torn last log record is dropped.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/client/store_client.h"
#include "tests/support/child_process.h"
#include "tests/support/temp_dir.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
namespace v1 = meshrun::v1;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::BinDir;
using testing::ChildProcess;

// Every directory of this file's tests is named after it.
class TempDir : public testing::TempDir {
 public:
  TempDir() : testing::TempDir("meshrun-state") {}
};

// A real meshrun-rdzvd on 127.0.0.1:`port` (0: kernel-assigned).
struct Daemon {
  std::unique_ptr<ChildProcess> process;
  std::string endpoint;
  int port = 0;
};

Daemon StartDaemon(const std::string& state_dir, int port = 0,
                   std::vector<std::string> extra = {}) {
  std::vector<std::string> argv{BinDir() + "/meshrun-rdzvd",
                                "--host",
                                "127.0.0.1",
                                "--port",
                                std::to_string(port),
                                "--log-level",
                                "warn",
                                "--state-dir",
                                state_dir};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Daemon d;
  d.process = std::make_unique<ChildProcess>(argv);
  auto line = d.process->ReadLine(seconds(20));
  const std::string prefix = "MESHRUN_RDZVD_ENDPOINT=";
  EXPECT_TRUE(line && line->rfind(prefix, 0) == 0) << "daemon did not start";
  if (!line || line->rfind(prefix, 0) != 0) return d;
  d.endpoint = line->substr(prefix.size());
  d.port = std::stoi(d.endpoint.substr(d.endpoint.rfind(':') + 1));
  return d;
}

void Kill9(Daemon& d) {
  d.process->Signal(SIGKILL);
  ASSERT_TRUE(d.process->Wait(seconds(10)).has_value());
}

// Runs the daemon expecting it to refuse to start; returns its exit code and
// stderr+stdout.
std::pair<int, std::string> StartRefused(const std::string& state_dir) {
  ChildProcess p({BinDir() + "/meshrun-rdzvd", "--port", "0", "--state-dir", state_dir},
                 /*merge_stderr=*/true);
  std::string out = p.ReadAll(seconds(20));
  auto status = p.Wait(seconds(10));
  if (!status || !WIFEXITED(*status)) return {-1, out};
  return {WEXITSTATUS(*status), out};
}

std::unique_ptr<rdzv::StoreClient> Connect(const std::string& endpoint,
                                           const std::string& ns = "job/r1") {
  rdzv::StoreClientOptions options;
  options.target = endpoint;
  options.ns = ns;
  options.timeout = seconds(20);
  auto client = rdzv::StoreClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

v1::JoinRequest MakeJoin(const std::string& node, uint64_t resume_round = 0) {
  v1::JoinRequest join;
  join.set_run_id("job");
  join.set_node_id(node);
  join.set_host("host-" + node);
  join.set_nproc(2);
  join.set_node_rank_hint(-1);
  join.set_master_port(4242);
  join.set_resume_round(resume_round);
  auto* config = join.mutable_config();
  config->set_min_nodes(2);
  config->set_max_nodes(2);
  config->set_max_restarts(3);
  config->set_keep_alive_interval_ms(1000);
  config->set_keep_alive_max_attempt(5);
  return join;
}

v1::RendezvousEvent NextNonWaiting(rdzv::RendezvousClient::JoinSession& session) {
  while (true) {
    auto event = session.Next(seconds(20));
    EXPECT_TRUE(event.ok()) << event.status();
    if (!event.ok()) return {};
    if (!event->has_waiting()) return *event;
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string WalOf(const std::string& dir) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("wal.", 0) == 0) return entry.path();
  }
  return {};
}

TEST(StateDirTest, StoreAndRoundSurviveSigkillOnTheSamePort) {
  TempDir dir;
  Daemon first = StartDaemon(dir.path());
  ASSERT_FALSE(first.endpoint.empty());
  {
    auto store = Connect(first.endpoint);
    ASSERT_TRUE(store->Set("a", "1").ok());
    EXPECT_EQ(*store->Add("n", 5), 5);
    EXPECT_EQ(*store->Add("n", 2), 7);
    EXPECT_EQ(*store->CompareSet("a", "1", "2"), "2");
    EXPECT_EQ(*store->CompareSet("a", "1", "3"), "2");  // no change
    ASSERT_TRUE(store->Append("log", "ab").ok());
    ASSERT_TRUE(store->Append("log", "cd").ok());
    ASSERT_TRUE(store->MultiSet({{"k1", "v1"}, {"k2", "v2"}}).ok());
    ASSERT_TRUE(store->Set("gone", "x").ok());
    EXPECT_TRUE(*store->Delete("gone"));
  }
  uint32_t a_rank = 0;
  {
    auto channel =
        grpc::CreateChannel(first.endpoint, grpc::InsecureChannelCredentials());
    rdzv::RendezvousClient client(channel);
    auto a = client.Join(MakeJoin("a"));
    auto b = client.Join(MakeJoin("b"));
    auto assigned = NextNonWaiting(*a);
    ASSERT_TRUE(assigned.has_assigned());
    EXPECT_EQ(assigned.assigned().round(), 1u);
    a_rank = assigned.assigned().group_rank();
    ASSERT_TRUE(NextNonWaiting(*b).has_assigned());
    // A store write is acknowledged only once the log holds every change
    // made before it, the run's included: no sleep needed before the kill.
    ASSERT_TRUE(Connect(first.endpoint)->Set("sync", "1").ok());
    Kill9(first);
  }

  Daemon second = StartDaemon(dir.path(), first.port);
  ASSERT_EQ(second.endpoint, first.endpoint) << "rebinding the same port after SIGKILL";
  auto store = Connect(second.endpoint);
  EXPECT_EQ(*store->Get("a"), "2");
  EXPECT_EQ(*store->Add("n", 0), 7);
  EXPECT_EQ(*store->Get("log"), "abcd");
  EXPECT_EQ(*store->MultiGet({"k1", "k2"}), (std::vector<std::string>{"v1", "v2"}));
  EXPECT_FALSE(*store->Check({"gone"}));
  EXPECT_EQ(*store->NumKeys(), 6);  // a n log k1 k2 sync

  // Both nodes resume round 1: the daemon re-attaches them, no re-form.
  auto channel = grpc::CreateChannel(second.endpoint, grpc::InsecureChannelCredentials());
  rdzv::RendezvousClient client(channel);
  auto a = client.Join(MakeJoin("a", 1));
  auto again = NextNonWaiting(*a);
  ASSERT_TRUE(again.has_assigned()) << again.DebugString();
  EXPECT_EQ(again.assigned().round(), 1u);
  EXPECT_EQ(again.assigned().group_rank(), a_rank);
  EXPECT_EQ(again.assigned().restart_count(), 0u);
  auto heartbeat = client.Heartbeat("job", "b");
  ASSERT_TRUE(heartbeat.ok()) << "b was restored with a fresh lease: "
                              << heartbeat.status();
  EXPECT_EQ(heartbeat->round(), 1u);
  // A resume of a round the daemon does not have is refused.
  auto stale = client.Join(MakeJoin("b", 7));
  auto refused = stale->Next(seconds(20));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound) << refused.status();
}

TEST(StateDirTest, WritesAfterACompactionSurvive) {
  TempDir dir;
  Daemon first = StartDaemon(dir.path(), 0, {"--state-snapshot-bytes", "4096"});
  {
    auto store = Connect(first.endpoint);
    for (int i = 0; i < 400; ++i)
      ASSERT_TRUE(store->Set("key" + std::to_string(i), std::string(50, 'v')).ok());
  }
  Kill9(first);
  // Compacted: one log generation left, much smaller than what was written.
  int logs = 0;
  for (const auto& entry : fs::directory_iterator(dir.path()))
    logs += entry.path().filename().string().rfind("wal.", 0) == 0;
  EXPECT_EQ(logs, 1);
  EXPECT_LT(fs::file_size(WalOf(dir.path())), 8192u);
  Daemon second = StartDaemon(dir.path(), first.port);
  auto store = Connect(second.endpoint);
  EXPECT_EQ(*store->NumKeys(), 400);
  EXPECT_EQ(*store->Get("key399"), std::string(50, 'v'));
}

TEST(StateDirTest, SecondDaemonOnTheSameDirIsRefused) {
  TempDir dir;
  Daemon first = StartDaemon(dir.path());
  auto [code, out] = StartRefused(dir.path());
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("in use by another meshrun-rdzvd (pid " +
                     std::to_string(first.process->pid()) + ")"),
            std::string::npos)
      << out;
  // The first one still serves.
  EXPECT_TRUE(Connect(first.endpoint)->Set("still", "here").ok());
}

TEST(StateDirTest, DamagedSnapshotIsRefused) {
  TempDir dir;
  {
    Daemon d = StartDaemon(dir.path());
    ASSERT_TRUE(Connect(d.endpoint)->Set("a", std::string(100, 'x')).ok());
    d.process->Signal(SIGTERM);
    ASSERT_TRUE(d.process->Wait(seconds(10)).has_value());
  }
  {
    // The restart after a clean stop compacts "a" into the snapshot.
    Daemon d = StartDaemon(dir.path());
    Kill9(d);
  }
  const std::string path = dir.path() + "/snapshot";
  std::string bytes = ReadFile(path);
  ASSERT_GT(bytes.size(), 100u);
  bytes[bytes.size() / 2] ^= 0x20;
  WriteFile(path, bytes);
  auto [code, out] = StartRefused(dir.path());
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("snapshot is damaged"), std::string::npos) << out;
  EXPECT_EQ(out.find('\n'), out.size() - 1) << "one line: " << out;
}

TEST(StateDirTest, TornLastLogRecordIsDroppedAndDamageBeforeItRefused) {
  TempDir dir;
  Daemon first = StartDaemon(dir.path());
  {
    auto store = Connect(first.endpoint);
    ASSERT_TRUE(store->Set("a", "1").ok());
    ASSERT_TRUE(store->Set("b", "2").ok());
  }
  Kill9(first);
  const std::string wal = WalOf(dir.path());
  const std::string good = ReadFile(wal);
  ASSERT_FALSE(good.empty());
  // A crash in the middle of a write: half a frame at the end.
  WriteFile(wal, good + std::string("\x40\x00\x00\x00\x12\x34", 6));
  {
    Daemon second = StartDaemon(dir.path(), first.port);
    ASSERT_FALSE(second.endpoint.empty());
    auto store = Connect(second.endpoint);
    EXPECT_EQ(*store->Get("a"), "1");
    EXPECT_EQ(*store->Get("b"), "2");
    ASSERT_TRUE(store->Set("c", "3").ok());
    Kill9(second);
  }
  // A flipped byte in the first record, with a good one after it: damage.
  const std::string wal2 = WalOf(dir.path());
  std::string bytes = ReadFile(wal2);
  ASSERT_FALSE(bytes.empty());
  bytes[9] ^= 0x01;
  std::string doubled = bytes + ReadFile(wal2);
  WriteFile(wal2, doubled);
  auto [code, out] = StartRefused(dir.path());
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("is damaged"), std::string::npos) << out;
}

}  // namespace
}  // namespace meshrun
