// The Store service end to end: the real meshrun-rdzvd binary on 127.0.0.1
// with a kernel-assigned port, real clients over gRPC.

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "meshrun/v1/store.grpc.pb.h"
#include "rendezvous/client/store_client.h"
#include "tests/support/child_process.h"
#include "tests/support/temp_dir.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;
using testing::ChildProcess;
using testing::DaemonProcess;

std::unique_ptr<rdzv::StoreClient> Connect(const std::string& endpoint,
                                           const std::string& ns = "run",
                                           bool own_connection = false) {
  rdzv::StoreClientOptions options;
  options.target = endpoint;
  options.ns = ns;
  options.timeout = std::chrono::seconds(30);
  if (own_connection) options.channel = rdzv::MakeStoreChannel(endpoint, true);
  auto client = rdzv::StoreClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

TEST(StoreDaemonTest, ConcurrentClientsAddExactly) {
  DaemonProcess daemon;
  constexpr int kClients = 8, kAdds = 500;
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = Connect(daemon.endpoint(), "run", /*own_connection=*/c % 2 == 0);
      for (int i = 0; i < kAdds; ++i) ASSERT_TRUE(client->Add("counter", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  auto client = Connect(daemon.endpoint());
  EXPECT_EQ(*client->Add("counter", 0), kClients * kAdds);
}

TEST(StoreDaemonTest, EveryOperationOverTheWire) {
  DaemonProcess daemon;
  auto client = Connect(daemon.endpoint());
  ASSERT_TRUE(client->Set("a", "1").ok());
  EXPECT_EQ(*client->Get("a"), "1");
  EXPECT_EQ(*client->Add("n", 5), 5);
  EXPECT_EQ(*client->CompareSet("a", "1", "2"), "2");
  EXPECT_EQ(*client->CompareSet("a", "1", "3"), "2");
  EXPECT_EQ(*client->CompareSet("fresh", "", "x"), "x");
  ASSERT_TRUE(client->Append("log", "ab").ok());
  ASSERT_TRUE(client->Append("log", "cd").ok());
  EXPECT_EQ(*client->Get("log"), "abcd");
  ASSERT_TRUE(client->MultiSet({{"k1", "v1"}, {"k2", "v2"}}).ok());
  EXPECT_EQ(*client->MultiGet({"k2", "k1"}), (std::vector<std::string>{"v2", "v1"}));
  EXPECT_TRUE(*client->Check({"k1", "k2"}));
  EXPECT_FALSE(*client->Check({"k1", "nope"}));
  EXPECT_EQ(*client->NumKeys(), 6);
  EXPECT_TRUE(*client->Delete("k1"));
  EXPECT_FALSE(*client->Delete("k1"));
  EXPECT_EQ(*client->NumKeys(), 5);
  // Namespaces are separate runs.
  auto other = Connect(daemon.endpoint(), "other-run");
  EXPECT_EQ(*other->NumKeys(), 0);
}

TEST(StoreDaemonTest, WaitIsWokenBySetFromAnotherClient) {
  DaemonProcess daemon;
  auto waiter = Connect(daemon.endpoint());
  auto setter = Connect(daemon.endpoint(), "run", /*own_connection=*/true);
  std::atomic<bool> woke{false};
  std::thread t([&] {
    EXPECT_TRUE(waiter->Wait({"ready", "go"}, std::chrono::seconds(30)).ok());
    woke = true;
  });
  ASSERT_TRUE(setter->Set("ready", "1").ok());
  EXPECT_EQ(*setter->Get("ready"), "1");
  EXPECT_FALSE(woke.load());  // still misses "go"
  ASSERT_TRUE(setter->Set("go", "1").ok());
  t.join();
  EXPECT_TRUE(woke.load());
  // A blocked get returns the value set later.
  std::thread getter([&] { EXPECT_EQ(*waiter->Get("late"), "value"); });
  ASSERT_TRUE(setter->Set("late", "value").ok());
  getter.join();
}

TEST(StoreDaemonTest, TimeoutNamesTheMissingKeys) {
  DaemonProcess daemon;
  auto client = Connect(daemon.endpoint());
  ASSERT_TRUE(client->Set("present", "1").ok());
  absl::Status status = client->Wait({"present", "absent-key"}, milliseconds(100));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("absent-key"), std::string::npos) << status;
  EXPECT_EQ(status.message().find("present"), std::string::npos) << status;
  auto got = client->Get("missing", milliseconds(50));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("missing"), std::string::npos);
  // The stream is still fine after timeouts.
  EXPECT_EQ(*client->Get("present"), "1");
}

TEST(StoreDaemonTest, LimitsAnswerWithClearErrorsAndChangeNothing) {
  DaemonProcess daemon(
      {"--max-key-bytes", "16", "--max-value-bytes", "1024", "--max-keys-per-run", "3"});
  auto client = Connect(daemon.endpoint());
  absl::Status big = client->Set("k", std::string(2048, 'x'));
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted) << big;
  EXPECT_NE(big.message().find("1024"), std::string::npos) << big;
  absl::Status long_key = client->Set(std::string(17, 'k'), "v");
  EXPECT_EQ(long_key.code(), absl::StatusCode::kInvalidArgument) << long_key;
  ASSERT_TRUE(client->Set("a", "1").ok());
  ASSERT_TRUE(client->Set("b", "1").ok());
  ASSERT_TRUE(client->Set("c", "1").ok());
  absl::Status full = client->Set("d", "1");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(*client->NumKeys(), 3);
  ASSERT_TRUE(client->Set("a", "overwrite is fine").ok());
  // Another run has its own key budget.
  auto other = Connect(daemon.endpoint(), "other-run");
  EXPECT_TRUE(other->Set("d", "1").ok());
}

TEST(StoreDaemonTest, ClientKilledMidWaitDisturbsNobody) {
  DaemonProcess daemon;
  ChildProcess doomed({testing::BinDir() + "/store_tool", daemon.endpoint(), "run",
                       "wait", "never", "60000"});
  ASSERT_EQ(doomed.ReadLine(std::chrono::seconds(20)), "waiting");
  auto client = Connect(daemon.endpoint());
  std::thread waiter(
      [&] { EXPECT_TRUE(client->Wait({"go"}, std::chrono::seconds(30)).ok()); });
  doomed.Signal(SIGKILL);
  auto status = doomed.Wait(std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFSIGNALED(*status));
  // Setting the key the dead client waited on must not trip over its corpse.
  auto setter = Connect(daemon.endpoint(), "run", /*own_connection=*/true);
  ASSERT_TRUE(setter->Set("never", "1").ok());
  ASSERT_TRUE(setter->Set("go", "1").ok());
  waiter.join();
  EXPECT_TRUE(daemon.process().Running());
}

TEST(StoreDaemonTest, MalformedRequestsGetErrorsAndTheDaemonKeepsServing) {
  DaemonProcess daemon({"--max-value-bytes", "1024"});
  auto channel = rdzv::MakeStoreChannel(daemon.endpoint(), true);
  auto stub = meshrun::v1::Store::NewStub(channel);
  {
    // A request naming no operation, then a valid one, on one raw stream.
    grpc::ClientContext context;
    auto stream = stub->Session(&context);
    meshrun::v1::StoreRequest empty;
    empty.set_id(7);
    ASSERT_TRUE(stream->Write(empty));
    meshrun::v1::StoreResponse reply;
    ASSERT_TRUE(stream->Read(&reply));
    EXPECT_EQ(reply.id(), 7u);
    EXPECT_EQ(reply.code(), meshrun::v1::STORE_INVALID_ARGUMENT);
    EXPECT_NE(reply.error().find("no operation"), std::string::npos);
    meshrun::v1::StoreRequest num;
    num.set_id(8);
    num.mutable_num_keys();
    ASSERT_TRUE(stream->Write(num));
    ASSERT_TRUE(stream->Read(&reply));
    EXPECT_EQ(reply.id(), 8u);
    EXPECT_EQ(reply.code(), meshrun::v1::STORE_OK);
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
  {
    // A message far over gRPC's limit ends that stream only.
    grpc::ClientContext context;
    auto stream = stub->Session(&context);
    meshrun::v1::StoreRequest huge;
    huge.mutable_set()->set_key("k");
    huge.mutable_set()->set_value(std::string(8 << 20, 'x'));
    stream->Write(huge);
    meshrun::v1::StoreResponse reply;
    EXPECT_FALSE(stream->Read(&reply));
    grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << status.error_message();
  }
  {
    // Raw garbage on the port is not HTTP/2; the daemon drops the connection.
    auto colon = daemon.endpoint().rfind(':');
    int port = std::stoi(daemon.endpoint().substr(colon + 1));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    std::mt19937 rng(42);
    std::string junk(64 << 10, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    (void)!write(fd, junk.data(), junk.size());
    close(fd);
  }
  // Too many keys in one request.
  auto client = Connect(daemon.endpoint());
  std::vector<std::string> keys(200000, "k");
  EXPECT_EQ(client->Check(keys).status().code(), absl::StatusCode::kInvalidArgument);
  // And the daemon still serves a new client.
  auto fresh = Connect(daemon.endpoint(), "run", /*own_connection=*/true);
  ASSERT_TRUE(fresh->Set("alive", "yes").ok());
  EXPECT_EQ(*fresh->Get("alive"), "yes");
  EXPECT_TRUE(daemon.process().Running());
}

TEST(StoreDaemonTest, ThreadsSharingOneClientAreAnsweredCorrectly) {
  DaemonProcess daemon;
  // Clients on one target share a stream by default; their requests travel
  // in batches. Every caller must get its own answer, and a parked wait must
  // hold up nobody.
  auto shared = Connect(daemon.endpoint());
  auto other = Connect(daemon.endpoint());
  std::thread parked(
      [&] { EXPECT_TRUE(other->Wait({"release"}, std::chrono::seconds(60)).ok()); });
  constexpr int kThreads = 32, kOps = 300;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string key = "k" + std::to_string(t);
      for (int i = 0; i < kOps; ++i) {
        const std::string value = std::to_string(t * kOps + i);
        ASSERT_TRUE(shared->Set(key, value).ok());
        auto got = shared->Get(key);
        ASSERT_TRUE(got.ok()) << got.status();
        ASSERT_EQ(*got, value);
        ASSERT_TRUE(shared->Add("counter", 1).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*shared->Add("counter", 0), kThreads * kOps);
  ASSERT_TRUE(shared->Set("release", "1").ok());
  parked.join();
}

TEST(StoreDaemonTest, BatchSessionAnswersEveryRequestOfABatch) {
  DaemonProcess daemon;
  auto stub =
      meshrun::v1::Store::NewStub(rdzv::MakeStoreChannel(daemon.endpoint(), true));
  grpc::ClientContext context;
  auto stream = stub->BatchSession(&context);
  meshrun::v1::StoreRequestBatch batch;
  auto add = [&](uint64_t id) {
    auto* r = batch.add_requests();
    r->set_id(id);
    r->set_ns("run");
    return r;
  };
  // A wait parked by the batch's first request is woken by its third.
  add(1)->mutable_wait()->add_keys("b");
  add(2)->mutable_set()->set_key("a");
  auto* set_b = add(3)->mutable_set();
  set_b->set_key("b");
  set_b->set_value("vb");
  add(4)->mutable_get()->set_key("b");
  add(5);  // names no operation
  add(6)->mutable_add()->set_key("n");
  ASSERT_TRUE(stream->Write(batch));
  std::map<uint64_t, meshrun::v1::StoreResponse> replies;
  meshrun::v1::StoreResponseBatch in;
  while (replies.size() < 6 && stream->Read(&in)) {
    for (const auto& r : in.responses()) EXPECT_TRUE(replies.emplace(r.id(), r).second);
  }
  ASSERT_EQ(replies.size(), 6u);
  for (uint64_t id : {1, 2, 3, 4, 6})
    EXPECT_EQ(replies[id].code(), meshrun::v1::STORE_OK) << id << replies[id].error();
  ASSERT_EQ(replies[4].values_size(), 1);
  EXPECT_EQ(replies[4].values(0), "vb");
  EXPECT_EQ(replies[5].code(), meshrun::v1::STORE_INVALID_ARGUMENT);
  // An empty batch is ignored; the stream goes on.
  batch.Clear();
  ASSERT_TRUE(stream->Write(batch));
  add(7)->mutable_num_keys();
  ASSERT_TRUE(stream->Write(batch));
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_EQ(in.responses_size(), 1);
  EXPECT_EQ(in.responses(0).id(), 7u);
  EXPECT_EQ(in.responses(0).number(), 3);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(StoreDaemonTest, OversizedBatchEndsOnlyItsStreamWithAClearError) {
  DaemonProcess daemon;
  auto client = Connect(daemon.endpoint());
  ASSERT_TRUE(client->Set("before", "1").ok());
  std::thread parked(
      [&] { EXPECT_TRUE(client->Wait({"after"}, std::chrono::seconds(60)).ok()); });
  auto stub =
      meshrun::v1::Store::NewStub(rdzv::MakeStoreChannel(daemon.endpoint(), true));
  for (int count : {1025, 200000}) {
    grpc::ClientContext context;
    auto stream = stub->BatchSession(&context);
    meshrun::v1::StoreRequestBatch batch;
    for (int i = 0; i < count; ++i) {
      auto* r = batch.add_requests();
      r->set_id(static_cast<uint64_t>(i));
      r->mutable_set()->set_key("k" + std::to_string(i));
    }
    stream->Write(batch);
    meshrun::v1::StoreResponseBatch in;
    EXPECT_FALSE(stream->Read(&in));
    grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_message();
    EXPECT_NE(status.error_message().find("exceeds the limit of 1024"), std::string::npos)
        << status.error_message();
  }
  // Nothing of the rejected batches was executed, and other streams go on.
  EXPECT_EQ(*client->NumKeys(), 1);
  auto setter = Connect(daemon.endpoint(), "run", /*own_connection=*/true);
  ASSERT_TRUE(setter->Set("after", "1").ok());
  parked.join();
  EXPECT_TRUE(daemon.process().Running());
}

// The daemon's resident memory in bytes (VmRSS), or 0 if unreadable.
size_t ResidentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// Clients that pipeline Gets of a large value and never read their replies
// (one per protocol): the daemon stops reading their requests once their
// queued replies reach its byte bound, instead of buffering a copy of the
// value per Get (400 Gets of 4 MiB took it to 1.6 GB). Other clients are
// served meanwhile, and once the slow clients read they get every reply.
void CheckClientsThatNeverReadAreBounded(DaemonProcess& daemon) {
  const std::string big(4 << 20, 'v');
  auto writer = Connect(daemon.endpoint());
  ASSERT_TRUE(writer->Set("big", big).ok());
  const size_t before = ResidentBytes(daemon.process().pid());
  ASSERT_GT(before, 0u);

  constexpr int kBatches = 3, kPerBatch = 100, kSingles = 100;
  auto stub =
      meshrun::v1::Store::NewStub(rdzv::MakeStoreChannel(daemon.endpoint(), true));
  auto get = [](uint64_t id, meshrun::v1::StoreRequest* r) {
    r->set_id(id);
    r->set_ns("run");
    r->mutable_get()->set_key("big");
  };
  grpc::ClientContext batch_context;
  batch_context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(2));
  auto batched = stub->BatchSession(&batch_context);
  for (int b = 0; b < kBatches; ++b) {
    meshrun::v1::StoreRequestBatch batch;
    for (int i = 0; i < kPerBatch; ++i)
      get(static_cast<uint64_t>(b * kPerBatch + i), batch.add_requests());
    ASSERT_TRUE(batched->Write(batch));
  }
  grpc::ClientContext single_context;
  single_context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(2));
  auto single = stub->Session(&single_context);
  for (int i = 0; i < kSingles; ++i) {
    meshrun::v1::StoreRequest request;
    get(static_cast<uint64_t>(i), &request);
    ASSERT_TRUE(single->Write(request));
  }

  // Others are served while the slow clients' replies wait.
  auto other = Connect(daemon.endpoint(), "run", /*own_connection=*/true);
  ASSERT_TRUE(other->Set("small", "1").ok());
  auto value = other->Get("big");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(value->size(), big.size());
  // The requests above are all on the daemon's side by now; watch its memory
  // for a while (the unbounded daemon copies the value 400 times within it).
  size_t peak = 0;
  const auto watch_until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < watch_until) {
    peak = std::max(peak, ResidentBytes(daemon.process().pid()));
    std::this_thread::sleep_for(milliseconds(20));
  }
  // Two sessions at the default 64 MiB each, plus gRPC's own buffers.
  EXPECT_LT(peak, before + (256u << 20))
      << "daemon grew from " << (before >> 20) << " MiB to " << (peak >> 20) << " MiB";
  ASSERT_TRUE(other->Set("still", "served").ok());

  std::set<uint64_t> batch_ids;
  meshrun::v1::StoreResponseBatch in;
  while (batch_ids.size() < kBatches * kPerBatch && batched->Read(&in)) {
    for (const auto& r : in.responses()) {
      EXPECT_EQ(r.code(), meshrun::v1::STORE_OK) << r.error();
      EXPECT_TRUE(r.values_size() == 1 && r.values(0).size() == big.size());
      EXPECT_TRUE(batch_ids.insert(r.id()).second) << r.id();
    }
  }
  EXPECT_EQ(batch_ids.size(), size_t{kBatches * kPerBatch});
  std::set<uint64_t> single_ids;
  meshrun::v1::StoreResponse reply;
  while (single_ids.size() < kSingles && single->Read(&reply)) {
    EXPECT_EQ(reply.code(), meshrun::v1::STORE_OK) << reply.error();
    EXPECT_EQ(reply.values(0).size(), big.size());
    EXPECT_TRUE(single_ids.insert(reply.id()).second) << reply.id();
  }
  EXPECT_EQ(single_ids.size(), size_t{kSingles});
  batched->WritesDone();
  single->WritesDone();
  EXPECT_TRUE(batched->Finish().ok());
  EXPECT_TRUE(single->Finish().ok());
}

TEST(StoreDaemonTest, ClientsThatNeverReadCannotMakeTheDaemonBufferWithoutBound) {
  DaemonProcess daemon;
  CheckClientsThatNeverReadAreBounded(daemon);
}

// With --state-dir, replies waiting for the log count as queued too.
TEST(StoreDaemonTest, ClientsThatNeverReadAreBoundedWithAStateDir) {
  testing::TempDir state_dir;
  DaemonProcess daemon({"--state-dir", state_dir.path()});
  CheckClientsThatNeverReadAreBounded(daemon);
}

// Peak VmRSS of `pid` over the next three seconds.
size_t PeakResidentBytesFor3s(pid_t pid) {
  size_t peak = 0;
  const auto watch_until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < watch_until) {
    peak = std::max(peak, ResidentBytes(pid));
    std::this_thread::sleep_for(milliseconds(20));
  }
  return peak;
}

// The same through waits: 300 Gets parked on a missing key, then one Set of
// 4 MiB wakes them all, each reply a copy of the value (1.2 GB before). The
// woken waits of a client over its bounds are answered as it reads.
void CheckWokenWaitsAreBounded(DaemonProcess& daemon) {
  const size_t before = ResidentBytes(daemon.process().pid());
  const std::string big(4 << 20, 'w');
  constexpr int kGets = 300;
  auto stub =
      meshrun::v1::Store::NewStub(rdzv::MakeStoreChannel(daemon.endpoint(), true));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(2));
  auto stream = stub->BatchSession(&context);
  meshrun::v1::StoreRequestBatch batch;
  for (int i = 0; i < kGets; ++i) {
    auto* r = batch.add_requests();
    r->set_id(static_cast<uint64_t>(i));
    r->set_ns("run");
    r->mutable_get()->set_key("late");
  }
  ASSERT_TRUE(stream->Write(batch));
  // Sent on the same stream, so the Gets are parked before it arrives.
  batch.Clear();
  auto* set = batch.add_requests();
  set->set_id(kGets);
  set->set_ns("run");
  set->mutable_set()->set_key("late");
  set->mutable_set()->set_value(big);
  ASSERT_TRUE(stream->Write(batch));

  auto other = Connect(daemon.endpoint(), "run", /*own_connection=*/true);
  auto value = other->Get("late");
  ASSERT_TRUE(value.ok()) << value.status();
  const size_t peak = PeakResidentBytesFor3s(daemon.process().pid());
  EXPECT_LT(peak, before + (192u << 20))
      << "daemon grew from " << (before >> 20) << " MiB to " << (peak >> 20) << " MiB";
  // Deleting the key meanwhile: waits not yet answered wait again.
  ASSERT_TRUE(other->Delete("late").ok());
  ASSERT_TRUE(other->Set("late", big).ok());

  std::set<uint64_t> ids;
  meshrun::v1::StoreResponseBatch in;
  while (ids.size() < kGets + 1 && stream->Read(&in)) {
    for (const auto& r : in.responses()) {
      EXPECT_EQ(r.code(), meshrun::v1::STORE_OK) << r.error();
      if (r.id() < kGets) {
        EXPECT_TRUE(r.values_size() == 1 && r.values(0) == big);
      }
      EXPECT_TRUE(ids.insert(r.id()).second) << r.id();
    }
  }
  EXPECT_EQ(ids.size(), size_t{kGets + 1});
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(StoreDaemonTest, WokenWaitsOfAClientThatNeverReadsAreBounded) {
  DaemonProcess daemon;
  CheckWokenWaitsAreBounded(daemon);
}

TEST(StoreDaemonTest, WokenWaitsOfAClientThatNeverReadsAreBoundedWithAStateDir) {
  testing::TempDir state_dir;
  DaemonProcess daemon({"--state-dir", state_dir.path()});
  CheckWokenWaitsAreBounded(daemon);
}

TEST(StoreDaemonTest, SigtermShutsDownPromptlyWithParkedWaits) {
  DaemonProcess daemon({"--shutdown-grace-ms", "200"});
  auto client = Connect(daemon.endpoint());
  std::thread waiter([&] {
    auto status = client->Wait({"never"}, std::chrono::seconds(60));
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  });
  ASSERT_TRUE(client->Set("x", "1").ok());  // the wait above is parked by now or soon
  daemon.process().Signal(SIGTERM);
  auto status = daemon.process().Wait(std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value()) << "daemon did not exit after SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  waiter.join();
}

// The daemon is SIGKILLed and restarted on the same port (without
// --state-dir, so its store starts empty): clients reconnect on their next
// call, and a get parked across the restart is sent again and answered.
// Sends `requests` as one batch on a new BatchSession and reads every reply.
std::map<uint64_t, meshrun::v1::StoreResponse> Exchange(
    const std::string& endpoint, const std::vector<meshrun::v1::StoreRequest>& requests) {
  auto stub = meshrun::v1::Store::NewStub(rdzv::MakeStoreChannel(endpoint, true));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->BatchSession(&context);
  meshrun::v1::StoreRequestBatch batch;
  for (const auto& request : requests) *batch.add_requests() = request;
  EXPECT_TRUE(stream->Write(batch));
  std::map<uint64_t, meshrun::v1::StoreResponse> replies;
  meshrun::v1::StoreResponseBatch in;
  while (replies.size() < requests.size() && stream->Read(&in)) {
    for (const auto& r : in.responses()) EXPECT_TRUE(replies.emplace(r.id(), r).second);
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  return replies;
}

meshrun::v1::StoreRequest Request(uint64_t id, const std::string& dedup_id,
                                  const std::string& ns = "run") {
  meshrun::v1::StoreRequest r;
  r.set_id(id);
  r.set_ns(ns);
  r.set_dedup_id(dedup_id);
  return r;
}

// What a relay relies on to repeat a mutation whose answer a broken
// connection lost: a repeated dedup id gets the first answer, with its own
// request id, and is not applied again; with --state-dir, also after the
// daemon was killed (log) or stopped (snapshot) and restarted.
TEST(StoreDaemonTest, ARepeatedDedupIdGetsTheFirstAnswerAcrossRestarts) {
  testing::TempDir state("dedup");
  const std::string port = std::to_string(testing::FreePort());
  const std::vector<std::string> args{"--port", port, "--state-dir", state.path()};
  auto daemon = std::make_unique<DaemonProcess>(args);
  auto add = [](uint64_t id, const std::string& dedup_id, int64_t delta,
                const std::string& ns = "run") {
    auto r = Request(id, dedup_id, ns);
    r.mutable_add()->set_key("n");
    r.mutable_add()->set_delta(delta);
    return r;
  };
  auto push = [](uint64_t id, const std::string& dedup_id, const std::string& value) {
    auto r = Request(id, dedup_id);
    r.mutable_queue_push()->set_key("q");
    r.mutable_queue_push()->set_value(value);
    return r;
  };
  auto pop = [](uint64_t id, const std::string& dedup_id) {
    auto r = Request(id, dedup_id);
    r.mutable_queue_pop()->set_key("q");
    return r;
  };
  auto append = [](uint64_t id, const std::string& dedup_id) {
    auto r = Request(id, dedup_id);
    r.mutable_append()->set_key("s");
    r.mutable_append()->set_value("+");
    return r;
  };
  auto first = Exchange(daemon->endpoint(),
                        {add(1, "A", 5), push(2, "P1", "x"), push(3, "P2", "y"),
                         pop(4, "Q"), append(5, "S"), add(6, "A", 5, "other")});
  ASSERT_EQ(first.size(), 6u);
  EXPECT_EQ(first[1].number(), 5);
  ASSERT_EQ(first[4].values_size(), 1);
  EXPECT_EQ(first[4].values(0), "x");
  EXPECT_EQ(first[4].number(), 2);
  EXPECT_EQ(first[6].number(), 5);  // another namespace: another request
  for (int restart = 0; restart <= 2; ++restart) {
    // Everything again, under new request ids: the first answers, nothing
    // applied twice.
    auto again = Exchange(daemon->endpoint(),
                          {add(11, "A", 5), push(12, "P1", "x"), push(13, "P2", "y"),
                           pop(14, "Q"), append(15, "S")});
    ASSERT_EQ(again.size(), 5u) << restart;
    EXPECT_EQ(again[11].number(), 5) << restart;
    EXPECT_EQ(again[11].code(), meshrun::v1::STORE_OK) << restart;
    ASSERT_EQ(again[14].values_size(), 1) << restart;
    EXPECT_EQ(again[14].values(0), "x") << restart;
    EXPECT_EQ(again[14].number(), 2) << restart;
    auto client = Connect(daemon->endpoint());
    EXPECT_EQ(*client->Add("n", 0), 5) << restart;
    EXPECT_EQ(*client->Get("s"), "+") << restart;
    meshrun::v1::StoreRequest length = Request(20, "");
    length.mutable_queue_len()->set_key("q");
    EXPECT_EQ(Exchange(daemon->endpoint(), {length})[20].number(), 1) << restart;
    // A new dedup id is a new request.
    EXPECT_EQ(
        Exchange(daemon->endpoint(), {add(21, "B" + std::to_string(restart), 1)})[21]
            .number(),
        6)
        << restart;
    EXPECT_EQ(*client->Add("n", -1), 5) << restart;
    client.reset();
    if (restart == 2) break;
    daemon->process().Signal(restart == 0 ? SIGKILL : SIGTERM);
    ASSERT_TRUE(testing::GoneWithin(daemon->process().pid(), std::chrono::seconds(20)));
    daemon.reset();
    daemon = std::make_unique<DaemonProcess>(args);
  }
}

TEST(StoreDaemonTest, ClientsReconnectAfterTheDaemonRestarts) {
  auto first = std::make_unique<DaemonProcess>();
  const std::string endpoint = first->endpoint();
  const std::string port = endpoint.substr(endpoint.rfind(':') + 1);
  auto shared = Connect(endpoint);
  auto own = Connect(endpoint, "run", /*own_connection=*/true);
  ASSERT_TRUE(shared->Set("before", "1").ok());
  ASSERT_TRUE(own->Set("before", "2").ok());
  std::atomic<bool> parked_answered{false};
  std::string parked_value;
  std::thread parked([&] {
    auto waiter = Connect(endpoint, "run", /*own_connection=*/true);
    auto value = waiter->Get("after-restart");
    ASSERT_TRUE(value.ok()) << value.status();
    parked_value = *value;
    parked_answered = true;
  });
  std::this_thread::sleep_for(milliseconds(200));  // let the get park
  first->process().Signal(SIGKILL);
  ASSERT_TRUE(first->process().Wait(std::chrono::seconds(10)));
  first.reset();
  DaemonProcess second({"--port", port});
  ASSERT_EQ(second.endpoint(), endpoint);
  ASSERT_TRUE(shared->Set("after", "3").ok());
  auto read = own->Get("after");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "3");
  EXPECT_FALSE(parked_answered);
  ASSERT_TRUE(shared->Set("after-restart", "late").ok());
  parked.join();
  EXPECT_TRUE(parked_answered);
  EXPECT_EQ(parked_value, "late");
}

TEST(StoreDaemonTest, ReconnectGivesUpAfterTheConnectTimeout) {
  auto daemon = std::make_unique<DaemonProcess>();
  rdzv::StoreClientOptions options;
  options.target = daemon->endpoint();
  options.ns = "run";
  options.connect_timeout = milliseconds(1000);
  auto client = rdzv::StoreClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Set("k", "v").ok());
  daemon->process().Signal(SIGKILL);
  ASSERT_TRUE(daemon->process().Wait(std::chrono::seconds(10)));
  daemon.reset();
  const auto started = std::chrono::steady_clock::now();
  auto status = (*client)->Set("k", "w");
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("cannot reach the rendezvous daemon"),
            std::string::npos)
      << status;
  EXPECT_LT(took, std::chrono::seconds(10));
}

// A stand-in daemon that applies each write to a key named "break-..." and
// then, before replying, lets another client overwrite it and breaks the
// stream: the window (a daemon killed after its log held the write, a reset
// connection) in which a repeated write would undo the newer value.
class BreakAfterApplying final : public meshrun::v1::Store::Service {
 public:
  grpc::Status BatchSession(
      grpc::ServerContext* /*context*/,
      grpc::ServerReaderWriter<meshrun::v1::StoreResponseBatch,
                               meshrun::v1::StoreRequestBatch>* stream) override {
    meshrun::v1::StoreRequestBatch batch;
    while (stream->Read(&batch)) {
      meshrun::v1::StoreResponseBatch out;
      for (const auto& request : batch.requests()) {
        std::vector<std::pair<std::string, std::string>> writes;
        if (request.has_set())
          writes.emplace_back(request.set().key(), request.set().value());
        for (const auto& kv : request.multi_set().entries())
          writes.emplace_back(kv.key(), kv.value());
        auto* reply = out.add_responses();
        reply->set_id(request.id());
        std::lock_guard<std::mutex> lock(mu_);
        bool break_now = false;
        for (const auto& [key, value] : writes) {
          ++writes_[key];
          values_[key] = value;
          if (key.rfind("break-", 0) == 0 && broken_.insert(key).second) {
            values_[key] = "newer, from another client";
            break_now = true;
          }
        }
        if (break_now) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "reset");
      }
      stream->Write(out);
    }
    return grpc::Status::OK;
  }

  std::string Value(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return values_[key];
  }
  int Writes(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return writes_[key];
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> values_;
  std::map<std::string, int> writes_;
  std::set<std::string> broken_;
};

// A Set or MultiSet that may have been applied is not sent again after the
// stream breaks: the daemon cannot tell a repeat from a new write (nor
// remember one across its own restart), and a repeat would overwrite a
// newer value or bring back a deleted key. The caller is told instead.
TEST(StoreDaemonTest, AWriteTheDaemonMayHaveAppliedIsNotRepeated) {
  BreakAfterApplying service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  rdzv::StoreClientOptions options;
  options.target = "127.0.0.1:" + std::to_string(port);
  options.ns = "run";
  options.connect_timeout = std::chrono::seconds(10);
  options.share_stream = false;
  auto client = rdzv::StoreClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();

  absl::Status set = (*client)->Set("break-set", "mine");
  EXPECT_EQ(set.code(), absl::StatusCode::kUnavailable) << set;
  EXPECT_NE(set.message().find("not repeated"), std::string::npos) << set;
  EXPECT_EQ(service.Writes("break-set"), 1);
  EXPECT_EQ(service.Value("break-set"), "newer, from another client");

  absl::Status multi_set = (*client)->MultiSet({{"plain", "1"}, {"break-multi", "mine"}});
  EXPECT_EQ(multi_set.code(), absl::StatusCode::kUnavailable) << multi_set;
  EXPECT_EQ(service.Writes("break-multi"), 1);
  EXPECT_EQ(service.Value("break-multi"), "newer, from another client");

  // The client goes on working on a new stream.
  EXPECT_TRUE((*client)->Set("after", "1").ok());
  EXPECT_EQ(service.Value("after"), "1");
  client->reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

TEST(StoreDaemonTest, BadFlagsExitWithCodeTwo) {
  ChildProcess bad({testing::BinDir() + "/meshrun-rdzvd", "--port", "70000"});
  auto status = bad.Wait(std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 2);
  ChildProcess unknown({testing::BinDir() + "/meshrun-rdzvd", "--no-such-flag"});
  status = unknown.Wait(std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 2);
}

TEST(StoreDaemonTest, PortInUseIsAClearFailure) {
  DaemonProcess first;
  auto port = first.endpoint().substr(first.endpoint().rfind(':') + 1);
  ChildProcess second({testing::BinDir() + "/meshrun-rdzvd", "--port", port});
  auto status = second.Wait(std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 1);
}

}  // namespace
}  // namespace meshrun
