// The Rendezvous service end to end: real daemon, real Join streams.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/client/store_client.h"
#include "tests/support/child_process.h"

namespace meshrun {
namespace {

namespace v1 = meshrun::v1;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::DaemonProcess;
using Session = rdzv::RendezvousClient::JoinSession;

v1::JoinRequest MakeJoin(const std::string& node, uint32_t min_nodes, uint32_t max_nodes,
                         uint32_t nproc = 2, int32_t hint = -1) {
  v1::JoinRequest join;
  join.set_run_id("job");
  join.set_node_id(node);
  join.set_host("host-" + node);
  join.set_nproc(nproc);
  join.set_node_rank_hint(hint);
  auto* config = join.mutable_config();
  config->set_min_nodes(min_nodes);
  config->set_max_nodes(max_nodes);
  config->set_max_restarts(1);
  // Long enough that a round never closes before every node of a test has
  // joined; tests of the last call shorten it.
  config->set_last_call_timeout_ms(10000);
  config->set_keep_alive_interval_ms(1000);
  config->set_keep_alive_max_attempt(3);
  return join;
}

// Skips "waiting" events and returns the next other one.
v1::RendezvousEvent NextNonWaiting(Session& session) {
  while (true) {
    auto event = session.Next(seconds(20));
    EXPECT_TRUE(event.ok()) << event.status();
    if (!event.ok()) return {};
    if (!event->has_waiting()) return *event;
  }
}

class RendezvousDaemonTest : public ::testing::Test {
 protected:
  DaemonProcess daemon_;
  std::shared_ptr<grpc::Channel> channel_ =
      grpc::CreateChannel(daemon_.endpoint(), grpc::InsecureChannelCredentials());
  rdzv::RendezvousClient client_{channel_};
};

TEST_F(RendezvousDaemonTest, ThreeNodesFormOneWorldWithPrefixSumRanks) {
  std::vector<std::unique_ptr<Session>> sessions;
  const uint32_t nprocs[] = {2, 4, 1};
  for (int i = 0; i < 3; ++i)
    sessions.push_back(
        client_.Join(MakeJoin("n" + std::to_string(i), 3, 3, nprocs[i], i)));
  std::set<uint32_t> ranks;
  for (int i = 0; i < 3; ++i) {
    auto event = NextNonWaiting(*sessions[i]);
    ASSERT_TRUE(event.has_assigned());
    const auto& a = event.assigned();
    EXPECT_EQ(a.group_rank(), static_cast<uint32_t>(i));  // hints honoured
    EXPECT_EQ(a.group_world_size(), 3u);
    EXPECT_EQ(a.world_size(), 7u);
    EXPECT_EQ(a.rank_base(), std::vector<uint32_t>({0, 2, 6})[i]);
    EXPECT_EQ(a.participants_size(), 3);
    EXPECT_FALSE(a.store_prefix().empty());
    ranks.insert(a.group_rank());
  }
  EXPECT_EQ(ranks.size(), 3u);
}

// Issue 44 (5): a stream that breaks is not a node that left. The node keeps
// its place while its lease lasts: re-opened, resuming its round, the
// stream gets the same assignment back and nobody re-forms. Only a node
// that stays away (no stream, no heartbeat) is dropped, when its lease runs
// out; a Leave (below) is at once.
TEST_F(RendezvousDaemonTest, ABrokenStreamKeepsTheNodeUntilItsLeaseRunsOut) {
  std::vector<v1::JoinRequest> joins;
  for (const char* node : {"a", "b", "c"}) {
    joins.push_back(MakeJoin(node, 2, 3));
    joins.back().mutable_config()->set_keep_alive_interval_ms(200);
    joins.back().mutable_config()->set_keep_alive_max_attempt(3);
  }
  auto a = client_.Join(joins[0]);
  auto b = client_.Join(joins[1]);
  auto c = client_.Join(joins[2]);
  uint64_t round = 0;
  uint32_t c_rank = 0;
  for (auto* s : {a.get(), b.get(), c.get()}) {
    auto event = NextNonWaiting(*s);
    ASSERT_TRUE(event.has_assigned());
    round = event.assigned().round();
    if (s == c.get()) c_rank = event.assigned().group_rank();
  }
  c.reset();  // the stream breaks (cancelled: as a reset looks to the daemon)
  joins[2].set_resume_round(round);
  c = client_.Join(joins[2]);
  auto back = NextNonWaiting(*c);
  ASSERT_TRUE(back.has_assigned()) << back.DebugString();
  EXPECT_EQ(back.assigned().round(), round);
  EXPECT_EQ(back.assigned().group_rank(), c_rank);
  EXPECT_EQ(back.assigned().group_world_size(), 3u);
  // Its stream breaks again and it stays away: a and b keep heartbeating,
  // and re-form without it once its lease (600 ms) ran out, not before.
  c.reset();
  const auto broke = std::chrono::steady_clock::now();
  const auto deadline = broke + seconds(20);
  bool reformed = false;
  while (!reformed && std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE(client_.Heartbeat("job", "a").ok());
    ASSERT_TRUE(client_.Heartbeat("job", "b").ok());
    auto event = a->Next(milliseconds(50));
    if (event.ok() && event->has_reform()) {
      EXPECT_EQ(event->reform().reason(), v1::REFORM_NODE_EXPIRED);
      EXPECT_GE(std::chrono::steady_clock::now() - broke, milliseconds(500));
      reformed = true;
    }
  }
  ASSERT_TRUE(reformed);
  auto assigned = NextNonWaiting(*a);
  ASSERT_TRUE(assigned.has_assigned());
  EXPECT_EQ(assigned.assigned().round(), round + 1);
  EXPECT_EQ(assigned.assigned().group_world_size(), 2u);
  // A node that says it leaves is gone at once.
  ASSERT_TRUE(client_.Leave("job", "b").ok());
  auto reform = NextNonWaiting(*a);
  ASSERT_TRUE(reform.has_reform()) << reform.DebugString();
  EXPECT_EQ(reform.reform().reason(), v1::REFORM_NODE_LEFT);
}

TEST_F(RendezvousDaemonTest, WorkerFailureRestartsUntilTheBudgetIsSpent) {
  auto a = client_.Join(MakeJoin("a", 2, 2));
  auto b = client_.Join(MakeJoin("b", 2, 2));
  uint64_t round = NextNonWaiting(*a).assigned().round();
  NextNonWaiting(*b);
  auto verdict = client_.ReportFailure("job", "b", round, "rank 3 exited with code 1");
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_TRUE(verdict->will_restart());
  EXPECT_EQ(verdict->restart_count(), 1u);
  for (auto* s : {a.get(), b.get()}) {
    EXPECT_EQ(NextNonWaiting(*s).reform().reason(), v1::REFORM_WORKER_FAILURE);
    auto assigned = NextNonWaiting(*s).assigned();
    EXPECT_EQ(assigned.restart_count(), 1u);
    round = assigned.round();
  }
  // max_restarts is 1: the second failure closes the run for everyone.
  verdict = client_.ReportFailure("job", "a", round, "rank 0 killed by SIGSEGV");
  ASSERT_TRUE(verdict.ok());
  EXPECT_FALSE(verdict->will_restart());
  for (auto* s : {a.get(), b.get()}) {
    auto closed = NextNonWaiting(*s);
    ASSERT_TRUE(closed.has_closed());
    EXPECT_EQ(closed.closed().outcome(), v1::OUTCOME_FAILED);
    EXPECT_NE(closed.closed().reason().find("SIGSEGV"), std::string::npos);
    // The stream ends after the terminal event.
    EXPECT_FALSE(s->Next(seconds(10)).ok());
  }
}

// Restart scope "replica" (issue 18): a replica failure counts against the
// budget and re-forms nobody; a retried report counts once; a replica group
// beyond the world is refused and the daemon serves on.
v1::JoinRequest ReplicaScope(v1::JoinRequest join, uint32_t replica_size) {
  join.mutable_config()->set_replica_size(replica_size);
  return join;
}

TEST_F(RendezvousDaemonTest, ReplicaFailureCountsWithoutReforming) {
  auto a = client_.Join(ReplicaScope(MakeJoin("a", 2, 2, 2, /*hint=*/0), 1));
  auto b = client_.Join(ReplicaScope(MakeJoin("b", 2, 2, 2, /*hint=*/1), 1));
  const uint64_t round = NextNonWaiting(*a).assigned().round();
  NextNonWaiting(*b);
  v1::FailureReport report;
  report.set_run_id("job");
  report.set_node_id("b");
  report.set_round(round);
  report.set_detail("rank 3 exited with code 1");
  report.set_replica(4);  // the world has 4 workers
  auto verdict = client_.ReportFailure(report);
  EXPECT_EQ(verdict.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(verdict.status().message().find("failure.replica: 4"), std::string::npos)
      << verdict.status();
  report.set_replica(1);  // a's group, not b's
  verdict = client_.ReportFailure(report);
  EXPECT_EQ(verdict.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(verdict.status().message().find("is not one of node b's replica groups"),
            std::string::npos)
      << verdict.status();
  report.set_replica(3);
  report.set_replica_restarts(0);
  for (int attempt = 0; attempt < 2; ++attempt) {
    verdict = client_.ReportFailure(report);
    ASSERT_TRUE(verdict.ok()) << verdict.status();
    EXPECT_TRUE(verdict->will_restart());
    EXPECT_EQ(verdict->restart_count(), 1u);
  }
  // The status page counts the restart and shows its cause; the round stays.
  v1::StatusRequest request;
  request.set_run_id("job");
  auto status = client_.Status(request);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->runs_size(), 1);
  EXPECT_EQ(status->runs(0).restart_count(), 1u);
  EXPECT_EQ(status->runs(0).round(), round);
  EXPECT_EQ(status->runs(0).state(), "active");
  EXPECT_EQ(status->runs(0).last_failure().detail(), "rank 3 exited with code 1");
  // max_restarts is 1: the restarted group's failure closes the run, and
  // that close is the first event either stream carries since the round.
  report.set_replica_restarts(1);
  verdict = client_.ReportFailure(report);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_FALSE(verdict->will_restart());
  EXPECT_EQ(verdict->restart_count(), 2u);
  for (auto* s : {a.get(), b.get()}) {
    auto closed = NextNonWaiting(*s);
    ASSERT_TRUE(closed.has_closed()) << closed.DebugString();
    EXPECT_EQ(closed.closed().outcome(), v1::OUTCOME_FAILED);
    EXPECT_NE(closed.closed().reason().find("rank 3"), std::string::npos);
  }
}

// Issue 27: the step quorum checks the admission epoch a worker carries
// against its rank's slot: the workers of a node that lost its slot are
// refused, before and after a newcomer takes it; the newcomer's are let in.
TEST_F(RendezvousDaemonTest, TheStepQuorumRefusesAStaleAdmission) {
  auto a = client_.Join(ReplicaScope(MakeJoin("a", 1, 2, 2, /*hint=*/0), 2));
  auto b = client_.Join(ReplicaScope(MakeJoin("b", 1, 2, 2, /*hint=*/1), 2));
  NextNonWaiting(*a);
  const v1::RoundAssignment old = NextNonWaiting(*b).assigned();
  ASSERT_NE(old.admission_epoch(), 0u);
  ASSERT_EQ(old.rank_base(), 2u);
  v1::QuorumRequest request;
  request.set_run_id("job");
  request.set_replica(1);  // b's ranks 2..3
  request.set_replica_size(2);
  request.set_num_replicas(2);
  request.set_timeout_ms(50);
  request.set_admission_epoch(old.admission_epoch());
  auto refused = [&](const std::string& why) {
    auto reply = client_.Quorum(request);
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition)
        << reply.status();
    EXPECT_NE(reply.status().message().find(why), std::string::npos) << reply.status();
  };
  ASSERT_TRUE(client_.Leave("job", "b").ok());
  refused("was vacated");
  auto c = client_.Join(ReplicaScope(MakeJoin("c", 1, 2), 2));
  const v1::RoundAssignment taken = NextNonWaiting(*c).assigned();
  EXPECT_EQ(taken.rank_base(), 2u);
  EXPECT_GT(taken.admission_epoch(), old.admission_epoch());
  refused("is node c's since admission");
  // c's own workers are let in (and, alone, wait out their 50 ms).
  request.set_admission_epoch(taken.admission_epoch());
  auto reply = client_.Quorum(request);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded) << reply.status();
}

TEST_F(RendezvousDaemonTest, SuccessOfEveryNodeClosesTheRun) {
  auto a = client_.Join(MakeJoin("a", 2, 2));
  auto b = client_.Join(MakeJoin("b", 2, 2));
  uint64_t round = NextNonWaiting(*a).assigned().round();
  NextNonWaiting(*b);
  ASSERT_TRUE(client_.ReportSuccess("job", "a", round).ok());
  ASSERT_TRUE(client_.ReportSuccess("job", "b", round).ok());
  for (auto* s : {a.get(), b.get()})
    EXPECT_EQ(NextNonWaiting(*s).closed().outcome(), v1::OUTCOME_SUCCEEDED);
  // A node of the run that comes back is told how the run ended.
  auto back = client_.Join(MakeJoin("a", 2, 2));
  auto told = NextNonWaiting(*back);
  ASSERT_TRUE(told.has_closed());
  EXPECT_EQ(told.closed().outcome(), v1::OUTCOME_SUCCEEDED);
  // Any other node is a new launch under the id: it is never told a success
  // it had no part in, it gathers a new incarnation of the run.
  auto late = client_.Join(MakeJoin("late", 2, 2));
  auto waiting = late->Next(seconds(10));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  ASSERT_TRUE(waiting->has_waiting()) << waiting->DebugString();
  EXPECT_EQ(waiting->waiting().round(), round + 1);
}

TEST_F(RendezvousDaemonTest, LateNodeTriggersScaleUp) {
  auto join_a = MakeJoin("a", 1, 2);
  join_a.mutable_config()->set_last_call_timeout_ms(50);
  auto a = client_.Join(join_a);
  ASSERT_TRUE(NextNonWaiting(*a).has_assigned());  // alone, after the last call
  auto join_b = MakeJoin("b", 1, 2);
  join_b.mutable_config()->set_last_call_timeout_ms(50);
  auto b = client_.Join(join_b);
  auto reform = NextNonWaiting(*a);
  ASSERT_TRUE(reform.has_reform());
  EXPECT_EQ(reform.reform().reason(), v1::REFORM_NODES_WAITING);
  auto a2 = NextNonWaiting(*a).assigned();
  auto b2 = NextNonWaiting(*b).assigned();
  EXPECT_EQ(a2.group_world_size(), 2u);
  EXPECT_EQ(a2.group_rank(), 0u);  // rank 0 stays put
  EXPECT_EQ(b2.group_rank(), 1u);
  EXPECT_EQ(a2.restart_count(), 0u);  // scale-up is not a restart
}

TEST_F(RendezvousDaemonTest, MismatchedConfigIsRefusedSayingWhatDiffers) {
  auto a = client_.Join(MakeJoin("a", 2, 2));
  // Joins race on the wire; make sure a's options define the run.
  ASSERT_TRUE(a->Next(seconds(10))->has_waiting());
  auto b = client_.Join(MakeJoin("b", 3, 3));
  auto refused = b->Next(seconds(10));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("min_nodes"), std::string::npos)
      << refused.status();
}

TEST_F(RendezvousDaemonTest, SilentNodeExpiresAndSurvivorsReform) {
  auto join_a = MakeJoin("a", 1, 2);
  auto join_b = MakeJoin("b", 1, 2);
  for (auto* j : {&join_a, &join_b}) {
    j->mutable_config()->set_keep_alive_interval_ms(100);
    j->mutable_config()->set_keep_alive_max_attempt(2);
  }
  auto a = client_.Join(join_a);
  auto b = client_.Join(join_b);
  NextNonWaiting(*a);
  NextNonWaiting(*b);
  // Only a heartbeats: b's lease (200 ms) runs out even though its stream is
  // open (a partitioned node looks like this).
  auto deadline = std::chrono::steady_clock::now() + seconds(20);
  bool reformed = false;
  while (!reformed && std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE(client_.Heartbeat("job", "a").ok());
    auto event = a->Next(milliseconds(50));
    if (event.ok() && event->has_reform()) {
      EXPECT_EQ(event->reform().reason(), v1::REFORM_NODE_EXPIRED);
      reformed = true;
    }
  }
  ASSERT_TRUE(reformed);
  auto assigned = NextNonWaiting(*a).assigned();
  EXPECT_EQ(assigned.group_world_size(), 1u);
}

TEST_F(RendezvousDaemonTest, UnknownNodesAndRunsAreNotFound) {
  EXPECT_EQ(client_.Heartbeat("nope", "x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_.Leave("nope", "x").code(), absl::StatusCode::kNotFound);
  auto bad = MakeJoin("", 1, 1);
  auto refused = client_.Join(bad)->Next(seconds(10));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
}

// A long-lived daemon forgets closed runs after --closed-run-retention: the
// run id is free again and the run's store namespaces are gone.
// Node "a" alone in run "job" on a daemon that forgets closed runs after 1 s,
// with a key in its round's store namespace.
class RendezvousRetentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = client_.Join(MakeJoin("a", 1, 1));  // lease: 3 s
    auto assigned = NextNonWaiting(*a_);
    ASSERT_TRUE(assigned.has_assigned());
    options_.target = daemon_.endpoint();
    options_.ns = assigned.assigned().store_prefix();
    auto store = rdzv::StoreClient::Connect(options_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    ASSERT_TRUE(store_->Set("key", "value").ok());
  }

  // Waits until the run's key is gone (its namespace dropped).
  void ExpectKeyDropped(std::chrono::seconds within) {
    const auto deadline = std::chrono::steady_clock::now() + within;
    while (*store_->Check({"key"})) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the run's keys remain";
      std::this_thread::sleep_for(milliseconds(100));
    }
  }

  DaemonProcess daemon_{{"--closed-run-retention", "1"}};
  std::shared_ptr<grpc::Channel> channel_ =
      grpc::CreateChannel(daemon_.endpoint(), grpc::InsecureChannelCredentials());
  rdzv::RendezvousClient client_{channel_};
  std::unique_ptr<rdzv::RendezvousClient::JoinSession> a_;
  rdzv::StoreClientOptions options_;
  std::unique_ptr<rdzv::StoreClient> store_;
};

TEST_F(RendezvousRetentionTest, ClosedRunsAndTheirStoreDataAreForgotten) {
  rdzv::StoreClientOptions options = options_;
  options.ns = "another-run/r1";
  auto other = rdzv::StoreClient::Connect(options);
  ASSERT_TRUE((*other)->Set("key", "value").ok());

  ASSERT_TRUE(client_.Close("job", v1::OUTCOME_SUCCEEDED, "done").ok());
  // Forgotten within retention + one sweep period (1 s each here).
  ExpectKeyDropped(seconds(15));
  EXPECT_TRUE(*(*other)->Check({"key"})) << "another run's namespace was dropped";
  // The id is free: a new run of the same id forms.
  auto again = client_.Join(MakeJoin("b", 1, 1));
  EXPECT_TRUE(NextNonWaiting(*again).has_assigned());
}

// A run every node left is not kept forever: one lease later it ends as
// aborted, and after the retention it is forgotten with its store data.
TEST_F(RendezvousRetentionTest, RunEveryNodeLeftEndsAndIsForgotten) {
  ASSERT_TRUE(client_.Leave("job", "a").ok());
  // Lease (3 s) + retention (1 s) + one sweep period (1 s), with margin.
  ExpectKeyDropped(seconds(20));
  v1::StatusRequest request;
  request.set_run_id("job");
  v1::StatusReply reply;
  grpc::ClientContext context;
  EXPECT_EQ(
      v1::Rendezvous::NewStub(channel_)->Status(&context, request, &reply).error_code(),
      grpc::StatusCode::NOT_FOUND)
      << "the run is forgotten";
}

}  // namespace
}  // namespace meshrun
