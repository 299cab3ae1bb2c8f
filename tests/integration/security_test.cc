// Token authentication and TLS end to end: the real meshrun-rdzvd and meshrun
// binaries on 127.0.0.1, real clients, certificates made by the openssl CLI
// into a temporary directory.

#include "rendezvous/security/security.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "meshrun/v1/rendezvous.grpc.pb.h"
#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/client/store_client.h"
#include "tests/support/child_process.h"
#include "tests/support/temp_dir.h"
#include "tests/support/text.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
namespace v1 = meshrun::v1;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::BinDir;
using testing::ChildProcess;
using testing::Count;
using testing::ExitCode;
using testing::FreePort;

const std::string kToken = "s3cret-token-0123456789-abcdefghij";
const std::string kOtherToken = "other-token-9876543210-zyxwvutsrq";
const std::string kWorker =
    std::string(MESHRUN_SOURCE_DIR) + "/tests/integration/workers/worker.sh";

// Every directory of this file's tests is named after it.
class TempDir : public testing::TempDir {
 public:
  TempDir() : testing::TempDir("meshrun-security-test") {}
};

// meshrun-rdzvd on 127.0.0.1:0 with stderr merged into the captured output.
class Daemon {
 public:
  explicit Daemon(std::vector<std::string> extra_args)
      : process_(Argv(std::move(extra_args)), /*merge_stderr=*/true) {
    auto line = process_.ReadUntil("MESHRUN_RDZVD_ENDPOINT=", seconds(20));
    if (line) endpoint_ = line->substr(line->find('=') + 1);
  }
  const std::string& endpoint() const { return endpoint_; }
  ChildProcess& process() { return process_; }
  // Stops the daemon (SIGTERM) and returns everything it printed.
  std::string Stop() {
    process_.Signal(SIGTERM);
    process_.ReadAll(seconds(20));
    process_.Wait(seconds(20));
    return process_.output();
  }

 private:
  static std::vector<std::string> Argv(std::vector<std::string> extra) {
    std::vector<std::string> argv{BinDir() + "/meshrun-rdzvd", "--host", "127.0.0.1",
                                  "--port", "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }
  ChildProcess process_;
  std::string endpoint_;
};

rdzv::ClientSecurity WithToken(const std::string& token) {
  rdzv::ClientSecurity security;
  security.token = token;
  return security;
}

// Clients expected to fail the TLS handshake give up after `connect_timeout`.
absl::StatusOr<std::unique_ptr<rdzv::StoreClient>> Store(
    const std::string& endpoint, const rdzv::ClientSecurity& security,
    milliseconds connect_timeout = seconds(10)) {
  rdzv::StoreClientOptions options;
  options.channel = rdzv::MakeStoreChannel(endpoint, /*own_connection=*/true, security);
  options.ns = "run-a";
  options.timeout = seconds(10);
  options.connect_timeout = connect_timeout;
  options.share_stream = false;
  return rdzv::StoreClient::Connect(std::move(options));
}

v1::JoinRequest MakeJoin(const std::string& run, const std::string& node) {
  v1::JoinRequest join;
  join.set_run_id(run);
  join.set_node_id(node);
  join.set_host("127.0.0.1");
  join.set_nproc(1);
  join.set_node_rank_hint(-1);
  join.mutable_config()->set_min_nodes(1);
  join.mutable_config()->set_max_nodes(1);
  return join;
}

// Joins a one-node run and returns the first non-waiting event's status.
absl::StatusOr<v1::RendezvousEvent> JoinOnce(rdzv::RendezvousClient& client,
                                             const std::string& run,
                                             const std::string& node) {
  auto session = client.Join(MakeJoin(run, node));
  while (true) {
    auto event = session->Next(seconds(20));
    if (!event.ok() || !event->has_waiting()) return event;
  }
}

// --- Token ---------------------------------------------------------------------

class TokenTest : public ::testing::Test {
 protected:
  TempDir dir_;
  std::string token_file_ = dir_.Write("token", kToken + "\n");
  Daemon daemon_{{"--token-file", token_file_}};
};

TEST_F(TokenTest, RightTokenServesStoreAndRendezvous) {
  ASSERT_FALSE(daemon_.endpoint().empty());
  auto store = Store(daemon_.endpoint(), WithToken(kToken));
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("k", "v").ok());
  EXPECT_EQ(*(*store)->Get("k"), "v");

  rdzv::RendezvousClient client(rdzv::MakeChannel(daemon_.endpoint(), WithToken(kToken)));
  auto session = client.Join(MakeJoin("run-a", "n0"));
  auto event = session->Next(seconds(20));
  while (event.ok() && event->has_waiting()) event = session->Next(seconds(20));
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_TRUE(event->has_assigned());
  EXPECT_TRUE(client.Heartbeat("run-a", "n0").ok());
  EXPECT_TRUE(client.ReportSuccess("run-a", "n0", event->assigned().round()).ok());
}

TEST_F(TokenTest, MissingOrWrongTokenIsRefusedAndChangesNothing) {
  ASSERT_FALSE(daemon_.endpoint().empty());
  for (const auto& [token, why] : {std::pair<std::string, std::string>{"", "no token"},
                                   {kOtherToken, "wrong token"}}) {
    SCOPED_TRACE(why);
    // The store: the stream is refused before any request reaches the store.
    auto store = Store(daemon_.endpoint(), WithToken(token));
    ASSERT_TRUE(store.ok()) << store.status();  // the connection itself is fine
    auto set = (*store)->Set("intruder", "x");
    ASSERT_EQ(set.code(), absl::StatusCode::kUnauthenticated) << set;
    EXPECT_NE(set.message().find("meshrun rendezvous daemon: " + why), std::string::npos)
        << set;

    rdzv::RendezvousClient client(
        rdzv::MakeChannel(daemon_.endpoint(), WithToken(token)));
    auto event = JoinOnce(client, "evil-run", "evil-node");
    ASSERT_EQ(event.status().code(), absl::StatusCode::kUnauthenticated)
        << event.status();
    EXPECT_NE(event.status().message().find(why), std::string::npos);
    EXPECT_EQ(client.Heartbeat("evil-run", "evil-node").status().code(),
              absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(client.Close("run-a", v1::OUTCOME_ABORTED, "hostile").code(),
              absl::StatusCode::kUnauthenticated);
  }

  // Nothing changed: no key, no run, and run-a was not closed.
  auto store = Store(daemon_.endpoint(), WithToken(kToken));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE(*(*store)->Check({"intruder"}));
  EXPECT_EQ(*(*store)->NumKeys(), 0);
  rdzv::RendezvousClient client(rdzv::MakeChannel(daemon_.endpoint(), WithToken(kToken)));
  EXPECT_EQ(client.Heartbeat("evil-run", "evil-node").status().code(),
            absl::StatusCode::kNotFound);
  auto event = JoinOnce(client, "run-a", "n0");
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_TRUE(event->has_assigned());
}

// Every RPC of every service in proto/meshrun/v1, including ones added after
// this test was written, must be refused without the token.
TEST_F(TokenTest, EveryMethodOfEveryServiceNeedsTheToken) {
  ASSERT_FALSE(daemon_.endpoint().empty());
  auto channel =
      grpc::CreateChannel(daemon_.endpoint(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  int methods = 0;
  for (const auto& entry :
       fs::directory_iterator(std::string(MESHRUN_SOURCE_DIR) + "/proto/meshrun/v1")) {
    if (entry.path().extension() != ".proto") continue;
    const std::string name = "meshrun/v1/" + entry.path().filename().string();
    const auto* file =
        google::protobuf::DescriptorPool::generated_pool()->FindFileByName(name);
    ASSERT_NE(file, nullptr) << name << " is not linked into this test";
    for (int s = 0; s < file->service_count(); ++s) {
      const auto* service = file->service(s);
      for (int m = 0; m < service->method_count(); ++m) {
        const std::string path =
            "/" + service->full_name() + "/" + service->method(m)->name();
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + seconds(10));
        grpc::ByteBuffer request, response;
        grpc::Slice empty("");
        request = grpc::ByteBuffer(&empty, 1);
        std::mutex mu;
        std::condition_variable cv;
        std::optional<grpc::Status> result;
        stub.UnaryCall(&context, path, grpc::StubOptions(), &request, &response,
                       [&](grpc::Status status) {
                         std::lock_guard<std::mutex> lock(mu);
                         result = status;
                         cv.notify_one();
                       });
        std::unique_lock<std::mutex> lock(mu);
        ASSERT_TRUE(cv.wait_for(lock, seconds(20), [&] { return result.has_value(); }))
            << path;
        EXPECT_EQ(result->error_code(), grpc::StatusCode::UNAUTHENTICATED)
            << path << ": " << result->error_message();
        ++methods;
      }
    }
  }
  EXPECT_GE(methods, 8);  // Store: 2, Rendezvous: 6, plus any added since
}

TEST_F(TokenTest, FloodOfRefusalsIsLoggedRateLimitedAndTheDaemonKeepsServing) {
  ASSERT_FALSE(daemon_.endpoint().empty());
  rdzv::RendezvousClient bad(
      rdzv::MakeChannel(daemon_.endpoint(), WithToken(kOtherToken)));
  for (int i = 0; i < 300; ++i) {
    ASSERT_EQ(bad.Heartbeat("run", "node").status().code(),
              absl::StatusCode::kUnauthenticated);
  }
  auto store = Store(daemon_.endpoint(), WithToken(kToken));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->Set("still", "serving").ok());
  const std::string log = daemon_.Stop();
  const size_t logged = Count(log, "refused a call: wrong token");
  EXPECT_GE(logged, 1u) << log;
  // 5 per 10 s window; the flood takes well under 20 s.
  EXPECT_LE(logged, 15u) << log;
  EXPECT_EQ(log.find(kToken), std::string::npos) << "the daemon logged the token";
  EXPECT_EQ(log.find(kOtherToken), std::string::npos) << "the daemon logged a token";
}

TEST(TokenOffTest, WithoutATokenAnyClientIsServed) {
  Daemon daemon({});
  ASSERT_FALSE(daemon.endpoint().empty());
  for (const std::string& token : {std::string(), kToken}) {
    auto store = Store(daemon.endpoint(), WithToken(token));
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_TRUE((*store)->Set("k", token).ok());
    rdzv::RendezvousClient client(rdzv::MakeChannel(daemon.endpoint(), WithToken(token)));
    auto event = JoinOnce(client, "run-" + std::to_string(token.size()), "n0");
    ASSERT_TRUE(event.ok()) << event.status();
  }
}

TEST(TokenFileTest, TrailingNewlineIgnoredAndEnvironmentWorks) {
  TempDir dir;
  // The daemon's file ends in a newline, the client's does not.
  Daemon daemon({"--token-file", dir.Write("daemon-token", kToken + "\n")});
  ASSERT_FALSE(daemon.endpoint().empty());
  auto client =
      rdzv::LoadClientSecurity({dir.Write("client-token", kToken), "", "", ""},
                               [](const char*) -> const char* { return nullptr; });
  ASSERT_TRUE(client.ok()) << client.status();
  auto store = Store(daemon.endpoint(), *client);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->Set("k", "v").ok());

  // store_tool (a separate process, like a worker) takes the token from
  // MESHRUN_RDZV_TOKEN_FILE.
  const std::string token_file = dir / "client-token";
  ChildProcess tool(
      {"/usr/bin/env", "MESHRUN_RDZV_TOKEN_FILE=" + token_file, BinDir() + "/store_tool",
       daemon.endpoint(), "run-a", "set", "k2", "v"},
      /*merge_stderr=*/true);
  EXPECT_EQ(ExitCode(tool), 0) << tool.output();
  ChildProcess without(
      {BinDir() + "/store_tool", daemon.endpoint(), "run-a", "set", "k3", "v"},
      /*merge_stderr=*/true);
  EXPECT_EQ(ExitCode(without), 1) << without.output();
  EXPECT_NE(without.output().find("UNAUTHENTICATED"), std::string::npos)
      << without.output();
}

TEST(TokenFileTest, OpenOrMissingTokenFilesAreRefusedAtStart) {
  TempDir dir;
  const std::string open_file = dir.Write("open", kToken, 0644);
  ChildProcess open(
      {BinDir() + "/meshrun-rdzvd", "--port", "0", "--token-file", open_file},
      /*merge_stderr=*/true);
  EXPECT_EQ(ExitCode(open), 2);
  EXPECT_EQ(open.output(), "meshrun-rdzvd: permissions 0644 for token file " + open_file +
                               " are too open: it must not be accessible by group or "
                               "others (chmod 600 " +
                               open_file + ")\n");
  ChildProcess missing(
      {BinDir() + "/meshrun-rdzvd", "--port", "0", "--token-file", dir / "missing"},
      /*merge_stderr=*/true);
  EXPECT_EQ(ExitCode(missing), 2);
  EXPECT_NE(missing.output().find("cannot open token file"), std::string::npos)
      << missing.output();
  ChildProcess launcher({BinDir() + "/meshrun", "--standalone", "--token-file", open_file,
                         "--no-python", "/bin/true"},
                        /*merge_stderr=*/true);
  EXPECT_EQ(ExitCode(launcher), 2);
  EXPECT_NE(launcher.output().find("meshrun: permissions 0644"), std::string::npos)
      << launcher.output();
}

// --- The launcher with a token ------------------------------------------------------

std::unique_ptr<ChildProcess> Meshrun(std::vector<std::string> args) {
  std::vector<std::string> argv{BinDir() + "/meshrun"};
  argv.insert(argv.end(), args.begin(), args.end());
  return std::make_unique<ChildProcess>(argv, /*merge_stderr=*/true);
}

TEST_F(TokenTest, TwoAgentsWithTheTokenCompleteARun) {
  ASSERT_FALSE(daemon_.endpoint().empty());
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(
        Meshrun({"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=" + daemon_.endpoint(), "--rdzv-id=job", "--token-file",
                 token_file_, "--no-python", kWorker, "env"}));
  }
  for (auto& agent : agents) {
    EXPECT_EQ(ExitCode(*agent), 0) << agent->output();
    EXPECT_NE(agent->output().find("run succeeded"), std::string::npos)
        << agent->output();
    EXPECT_NE(agent->output().find("WORLD_SIZE=2"), std::string::npos) << agent->output();
  }
}

TEST_F(TokenTest, AgentsWithoutTheTokenAreRefusedAndTheDaemonKeepsServing) {
  ASSERT_FALSE(daemon_.endpoint().empty());
  const std::string wrong = dir_.Write("wrong", kOtherToken);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--token-file", wrong}, "wrong token"}, {{}, "no token"}};
  for (const auto& [token_args, why] : cases) {
    std::vector<std::string> args{"--nnodes=1", "--rdzv-backend=c10d",
                                  "--rdzv-endpoint=" + daemon_.endpoint(),
                                  "--rdzv-id=refused"};
    args.insert(args.end(), token_args.begin(), token_args.end());
    args.insert(args.end(), {"--no-python", kWorker, "env"});
    auto agent = Meshrun(args);
    EXPECT_EQ(ExitCode(*agent), 1) << agent->output();
    EXPECT_NE(agent->output().find("meshrun rendezvous daemon: " + why),
              std::string::npos)
        << agent->output();
    EXPECT_EQ(agent->output().find("ENV "), std::string::npos) << "a worker ran";
  }
  // The refused run id was never created: a good agent forms it from round 1.
  auto good = Meshrun({"--nnodes=1", "--rdzv-backend=c10d",
                       "--rdzv-endpoint=" + daemon_.endpoint(), "--rdzv-id=refused",
                       "--token-file", token_file_, "--no-python", kWorker, "env"});
  EXPECT_EQ(ExitCode(*good), 0) << good->output();
  EXPECT_NE(good->output().find("round 1:"), std::string::npos) << good->output();
}

TEST(HostedDaemonTokenTest, TheAgentHostingTheDaemonRequiresTheToken) {
  TempDir dir;
  const std::string token_file = dir.Write("token", kToken);
  const std::string endpoint = "127.0.0.1:" + std::to_string(FreePort());
  // Two agents form the run (one of them hosts the daemon); an agent without
  // the token, started meanwhile, is refused by the hosted daemon.
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(
        Meshrun({"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint,
                 "--rdzv-id=hosted", "--token-file", token_file, "--no-python", kWorker,
                 "wait-world", "3"}));
  }
  for (auto& agent : agents)
    ASSERT_TRUE(agent->ReadUntil("world=2", seconds(30))) << agent->output();
  auto intruder =
      Meshrun({"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint,
               "--rdzv-id=hosted", "--no-python", kWorker, "env"});
  EXPECT_EQ(ExitCode(*intruder), 1) << intruder->output();
  EXPECT_NE(intruder->output().find("no token"), std::string::npos) << intruder->output();
  // The refused agent never entered the run: no re-forming into round 2.
  for (auto& agent : agents)
    EXPECT_FALSE(agent->ReadUntil("re-forming", milliseconds(300))) << agent->output();
  for (auto& agent : agents) agent->Signal(SIGTERM);
  for (auto& agent : agents) ExitCode(*agent);
}

// All command lines of processes now running.
std::vector<std::string> AllCommandLines() {
  std::vector<std::string> lines;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return lines;
  while (dirent* entry = readdir(proc)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    std::ifstream file(std::string("/proc/") + entry->d_name + "/cmdline",
                       std::ios::binary);
    std::stringstream text;
    text << file.rdbuf();
    lines.push_back(text.str());
  }
  closedir(proc);
  return lines;
}

TEST(TokenVisibilityTest, NoCommandLineTheLauncherCreatesShowsTheToken) {
  TempDir dir;
  const std::string token_file = dir.Write("token", kToken + "\n");
  const std::string go = dir / "go";
  // Workers report how they would reach the daemon, then wait (bounded) for
  // the test to look at every command line on the machine.
  const std::string script =
      "echo \"TOKENFILE $RANK $MESHRUN_RDZV_TOKEN_FILE\"; "
      "echo \"TOKENVAR $RANK ${MESHRUN_RDZV_TOKEN-unset}\"; echo READY; "
      "i=0; while [ ! -e '" +
      go + "' ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done";
  auto launcher = Meshrun({"--standalone", "--nproc-per-node=2", "--token-file",
                           token_file, "--no-python", "/bin/sh", "-c", script});
  ASSERT_TRUE(launcher->ReadUntil("READY", seconds(30))) << launcher->output();
  ASSERT_TRUE(launcher->ReadUntil("READY", seconds(30))) << launcher->output();
  const auto lines = AllCommandLines();
  std::ofstream(go) << "";
  EXPECT_EQ(ExitCode(*launcher), 0) << launcher->output();
  EXPECT_GE(lines.size(), 4u);
  for (const std::string& line : lines)
    EXPECT_EQ(line.find(kToken.substr(0, 16)), std::string::npos) << line;
  // Workers get the file's path (to reach the store themselves), not the token.
  EXPECT_NE(launcher->output().find("TOKENFILE 0 " + token_file), std::string::npos)
      << launcher->output();
  EXPECT_NE(launcher->output().find("TOKENVAR 1 unset"), std::string::npos)
      << launcher->output();
  EXPECT_EQ(launcher->output().find(kToken), std::string::npos) << launcher->output();
}

// --- TLS ---------------------------------------------------------------------

// A throwaway CA with a server and a client certificate, and a second CA
// with a client certificate of its own, made once for the suite.
class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string script = R"(set -e
cd "$1"
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
for ca in ca other-ca; do
  openssl req -x509 $ec -keyout $ca.key -out $ca.pem -days 2 -subj /CN=$ca 2>/dev/null
done
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > san.ext
sign() {  # name ca
  openssl req $ec -keyout $1.key -out $1.csr -subj /CN=$1 2>/dev/null
  openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial \
    -CAserial $2.srl -out $1.pem -days 2 -extfile san.ext 2>/dev/null
}
sign server ca
sign client ca
sign stranger other-ca
chmod 600 *.key
echo made
)";
    ChildProcess openssl({"/bin/sh", "-c", script, "sh", dir_->path()},
                         /*merge_stderr=*/true);
    const int code = ExitCode(openssl);
    made_ = code == 0;
    if (!made_) std::fprintf(stderr, "openssl failed: %s\n", openssl.output().c_str());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(made_) << "could not make certificates with openssl";
  }

  static std::string Path(const std::string& name) { return *dir_ / name; }
  static rdzv::ClientSecurity Client(const std::string& cert,
                                     const std::string& ca = "ca",
                                     const std::string& token = "") {
    rdzv::ClientSecurityFiles files;
    files.tls_ca = Path(ca + ".pem");
    if (!cert.empty()) {
      files.tls_cert = Path(cert + ".pem");
      files.tls_key = Path(cert + ".key");
    }
    auto security = rdzv::LoadClientSecurity(
        files, [](const char*) -> const char* { return nullptr; });
    EXPECT_TRUE(security.ok()) << security.status();
    security->token = token;
    return *security;
  }
  static std::vector<std::string> ServerArgs(bool client_ca) {
    std::vector<std::string> args{"--tls-cert", Path("server.pem"), "--tls-key",
                                  Path("server.key")};
    if (client_ca) args.insert(args.end(), {"--tls-client-ca", Path("ca.pem")});
    return args;
  }

  static TempDir* dir_;
  static bool made_;
};
TempDir* TlsTest::dir_ = nullptr;
bool TlsTest::made_ = false;

TEST_F(TlsTest, TlsDaemonServesTlsClientsAndRefusesPlaintextOnes) {
  Daemon daemon(ServerArgs(/*client_ca=*/false));
  ASSERT_FALSE(daemon.endpoint().empty()) << daemon.process().output();
  auto store = Store(daemon.endpoint(), Client(""));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->Set("k", "v").ok());
  rdzv::RendezvousClient client(rdzv::MakeChannel(daemon.endpoint(), Client("")));
  auto event = JoinOnce(client, "tls-run", "n0");
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_TRUE(event->has_assigned());

  auto plaintext = Store(daemon.endpoint(), rdzv::ClientSecurity(), seconds(2));
  EXPECT_EQ(plaintext.status().code(), absl::StatusCode::kUnavailable)
      << plaintext.status();
  // A client that trusts another CA does not accept the daemon either.
  auto distrust = Store(daemon.endpoint(), Client("", "other-ca"), seconds(2));
  EXPECT_EQ(distrust.status().code(), absl::StatusCode::kUnavailable)
      << distrust.status();
  // And the other way round: a TLS client finds no TLS at a plaintext daemon.
  Daemon plain({});
  auto mismatch = Store(plain.endpoint(), Client(""), seconds(2));
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kUnavailable)
      << mismatch.status();
}

TEST_F(TlsTest, ClientCaRequiresAClientCertificateFromThatCa) {
  Daemon daemon(ServerArgs(/*client_ca=*/true));
  ASSERT_FALSE(daemon.endpoint().empty()) << daemon.process().output();
  auto with_cert = Store(daemon.endpoint(), Client("client"));
  ASSERT_TRUE(with_cert.ok()) << with_cert.status();
  EXPECT_TRUE((*with_cert)->Set("k", "v").ok());
  auto without_cert = Store(daemon.endpoint(), Client(""), seconds(2));
  if (without_cert.ok()) {
    // TLS 1.3 may finish the client's handshake before the server refuses.
    EXPECT_FALSE((*without_cert)->Set("k2", "v").ok());
  }
  auto stranger = Store(daemon.endpoint(), Client("stranger"), seconds(2));
  if (stranger.ok()) {
    EXPECT_FALSE((*stranger)->Set("k3", "v").ok());
  }
  EXPECT_FALSE(*(*with_cert)->Check({"k2"}));
  EXPECT_FALSE(*(*with_cert)->Check({"k3"}));
}

TEST_F(TlsTest, TokenAndClientCertificatesTogetherUnderMeshrun) {
  TempDir dir;
  const std::string token_file = dir.Write("token", kToken);
  std::vector<std::string> args = ServerArgs(/*client_ca=*/true);
  args.insert(args.end(), {"--token-file", token_file});
  Daemon daemon(args);
  ASSERT_FALSE(daemon.endpoint().empty()) << daemon.process().output();
  // Each worker writes a key through store_tool, which reaches the daemon
  // with what meshrun put in its environment.
  const std::string script = "exec \"" + BinDir() +
                             "/store_tool\" \"$MESHRUN_STORE_ENDPOINT\" "
                             "\"$MESHRUN_STORE_PREFIX\" set \"from-$RANK\" ok";
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(Meshrun(
        {"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
         "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=tls-job", "--token-file",
         token_file, "--tls-ca", Path("ca.pem"), "--tls-cert", Path("client.pem"),
         "--tls-key", Path("client.key"), "--no-python", "/bin/sh", "-c", script}));
  }
  for (auto& agent : agents) {
    EXPECT_EQ(ExitCode(*agent), 0) << agent->output();
    EXPECT_NE(agent->output().find("run succeeded"), std::string::npos)
        << agent->output();
  }
  // Without the client certificate the agent never gets through.
  auto refused = Meshrun({"--nnodes=1", "--rdzv-backend=c10d",
                          "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=tls-refused",
                          "--rdzv-conf=join_timeout=3", "--token-file", token_file,
                          "--tls-ca", Path("ca.pem"), "--no-python", "/bin/true"});
  EXPECT_EQ(ExitCode(*refused), 1) << refused->output();
}

TEST_F(TlsTest, StandaloneWithTlsAndToken) {
  TempDir dir;
  const std::string token_file = dir.Write("token", kToken);
  const std::string script =
      "echo \"TLSENV $MESHRUN_RDZV_TLS_CA $MESHRUN_RDZV_TLS_CERT\"; exec \"" + BinDir() +
      "/store_tool\" \"$MESHRUN_STORE_ENDPOINT\" \"$MESHRUN_STORE_PREFIX\" set "
      "\"k$RANK\" ok";
  // The node's certificate serves the embedded daemon and is its client
  // certificate too.
  auto launcher = Meshrun(
      {"--standalone", "--nproc-per-node=2", "--token-file", token_file, "--tls-ca",
       Path("ca.pem"), "--tls-cert", Path("server.pem"), "--tls-key", Path("server.key"),
       "--tls-client-ca", Path("ca.pem"), "--no-python", "/bin/sh", "-c", script});
  EXPECT_EQ(ExitCode(*launcher), 0) << launcher->output();
  EXPECT_EQ(Count(launcher->output(), "\nok\n"), 2u) << launcher->output();
  EXPECT_NE(
      launcher->output().find("TLSENV " + Path("ca.pem") + " " + Path("server.pem")),
      std::string::npos)
      << launcher->output();

  auto half =
      Meshrun({"--standalone", "--tls-ca", Path("ca.pem"), "--no-python", "/bin/true"});
  EXPECT_EQ(ExitCode(*half), 2) << half->output();
  EXPECT_NE(half->output().find("needs --tls-ca, --tls-cert and --tls-key"),
            std::string::npos)
      << half->output();
}

}  // namespace
}  // namespace meshrun
