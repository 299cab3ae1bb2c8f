// RendezvousState's counters and status snapshot: each counter moves exactly
// where its event happens; the snapshot shows states, ranks and ages.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "rendezvous/core/rendezvous_state.h"

namespace meshrun::rdzv {
namespace {

constexpr char kRun[] = "job";
const RdzvTime kT0{};

RdzvTime At(int64_t ms) { return kT0 + Millis(ms); }

RunOptions Opts(uint32_t min_nodes, uint32_t max_nodes, uint32_t max_restarts = 1) {
  RunOptions o;
  o.min_nodes = min_nodes;
  o.max_nodes = max_nodes;
  o.max_restarts = max_restarts;
  o.last_call_timeout = Millis(1000);
  o.join_timeout = Millis(60000);
  o.keep_alive_interval = Millis(1000);
  o.keep_alive_max_attempt = 3;
  return o;
}

NodeInfo Node(const std::string& id, uint32_t nproc = 1) {
  return NodeInfo{id, "host-" + id, nproc, -1};
}

size_t Reforms(const RendezvousStats& s, ReformReason reason) {
  return s.reforms[static_cast<size_t>(reason)];
}

TEST(RendezvousStatsTest, JoinsRoundsAndRefusals) {
  RendezvousState state;
  EXPECT_EQ(state.stats().joins, 0u);
  ASSERT_TRUE(state.Join(kRun, Node("a"), Opts(2, 2), At(0), nullptr).ok());
  EXPECT_EQ(state.stats().runs_created, 1u);
  EXPECT_EQ(state.stats().rounds_completed, 0u);
  ASSERT_TRUE(state.Join(kRun, Node("b"), Opts(2, 2), At(0), nullptr).ok());
  EXPECT_EQ(state.stats().joins, 2u);
  EXPECT_EQ(state.stats().runs_created, 1u) << "one run";
  EXPECT_EQ(state.stats().rounds_completed, 1u) << "max reached";
  EXPECT_FALSE(state.Join(kRun, Node("c"), Opts(3, 3), At(0), nullptr).ok());
  EXPECT_FALSE(state.Join("", Node("d"), Opts(1, 1), At(0), nullptr).ok());
  EXPECT_EQ(state.stats().joins_refused, 2u);
  EXPECT_EQ(state.stats().joins, 2u);
}

TEST(RendezvousStatsTest, RestartsCountedByCause) {
  RendezvousState state;
  const RunOptions o = Opts(1, 3, /*max_restarts=*/1);
  ASSERT_TRUE(state.Join(kRun, Node("a"), o, At(0), nullptr).ok());
  ASSERT_TRUE(state.Join(kRun, Node("b"), o, At(0), nullptr).ok());
  state.Tick(At(1000), nullptr);  // last call: round 1 with a, b
  ASSERT_EQ(state.stats().rounds_completed, 1u);

  // A third node waits: scale-up re-form.
  ASSERT_TRUE(state.Join(kRun, Node("c"), o, At(1100), nullptr).ok());
  EXPECT_EQ(Reforms(state.stats(), ReformReason::kNodesWaiting), 1u);
  EXPECT_EQ(state.stats().rounds_completed, 2u) << "re-formed round completes at once";

  // A worker failure: counted once, the stale report of the same round not.
  auto first = state.ReportFailure(kRun, "a", 2, "boom", At(1200), nullptr);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->counted);
  auto stale = state.ReportFailure(kRun, "b", 2, "boom too", At(1201), nullptr);
  ASSERT_TRUE(stale.ok());
  EXPECT_FALSE(stale->counted);
  EXPECT_EQ(Reforms(state.stats(), ReformReason::kWorkerFailure), 1u);
  EXPECT_EQ(state.stats().failure_reports, 2u);

  // A node leaves: re-form by "node left", not charged to the budget.
  ASSERT_TRUE(state.Leave(kRun, "c", At(1300), nullptr).ok());
  EXPECT_EQ(Reforms(state.stats(), ReformReason::kNodeLeft), 1u);

  // b stops heartbeating: its lease expires, the run re-forms with a.
  ASSERT_TRUE(state.Heartbeat(kRun, "a", At(3000)).ok());
  state.Tick(At(4400), nullptr);
  EXPECT_EQ(state.stats().leases_expired, 1u);
  EXPECT_EQ(Reforms(state.stats(), ReformReason::kNodeExpired), 1u);

  // The second failure spends the budget: counted, the run closes failed.
  const uint64_t round = state.Summary(kRun)->round;
  auto last = state.ReportFailure(kRun, "a", round, "again", At(4500), nullptr);
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(last->counted);
  EXPECT_FALSE(last->will_restart);
  EXPECT_EQ(Reforms(state.stats(), ReformReason::kWorkerFailure), 1u)
      << "closed, no re-form";
  EXPECT_EQ(state.stats().runs_closed[static_cast<size_t>(Outcome::kFailed)], 1u);
}

TEST(RendezvousStatsTest, LateHeartbeats) {
  RendezvousState state;
  ASSERT_TRUE(state.Join(kRun, Node("a"), Opts(1, 1), At(0), nullptr).ok());
  ASSERT_TRUE(state.Heartbeat(kRun, "a", At(1000)).ok());  // on time
  ASSERT_TRUE(state.Heartbeat(kRun, "a", At(2500)).ok());  // 1.5 intervals: on time
  ASSERT_TRUE(state.Heartbeat(kRun, "a", At(4100)).ok());  // 1.6 intervals: late
  EXPECT_EQ(state.stats().heartbeats, 3u);
  EXPECT_EQ(state.stats().heartbeats_late, 1u);
  EXPECT_FALSE(state.Heartbeat(kRun, "nobody", At(4200)).ok());
  EXPECT_EQ(state.stats().heartbeats, 3u) << "unknown nodes are not counted";
}

// `meshrun status` must tell an abandoned run from a gathering one, and a
// closed run has nobody waiting any more.
TEST(RendezvousStatsTest, StatusOfAbandonedAndClosedRuns) {
  RendezvousState state;
  ASSERT_TRUE(state.Join(kRun, Node("a"), Opts(2, 2), At(0), nullptr).ok());
  ASSERT_TRUE(state.Leave(kRun, "a", At(1), nullptr).ok());
  RunStatusRecord abandoned = state.Status(At(1)).at(0);
  EXPECT_EQ(abandoned.state, "abandoned");
  EXPECT_TRUE(abandoned.nodes.empty());

  ASSERT_TRUE(state.Join("full", Node("a"), Opts(1, 1), At(0), nullptr).ok());
  ASSERT_TRUE(state.Join("full", Node("w"), Opts(1, 1), At(0), nullptr).ok());
  ASSERT_TRUE(state.Close("full", Outcome::kAborted, "operator", At(2), nullptr).ok());
  RunStatusRecord closed = state.Status(At(2), "full").at(0);
  EXPECT_EQ(closed.state, "closed");
  for (const NodeStatusRecord& node : closed.nodes)
    EXPECT_NE(node.state, "waiting") << node.node_id;
  ASSERT_EQ(closed.nodes.size(), 1u);
  EXPECT_EQ(closed.nodes[0].node_id, "a");
}

TEST(RendezvousStatsTest, StatusShowsNodesRanksAndAges) {
  RendezvousState state;
  const RunOptions o = Opts(2, 2, 3);
  ASSERT_TRUE(state.Join(kRun, Node("a", 2), o, At(0), nullptr).ok());
  std::vector<RunStatusRecord> runs = state.Status(At(500));
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].state, "gathering");
  ASSERT_EQ(runs[0].nodes.size(), 1u);
  EXPECT_EQ(runs[0].nodes[0].state, "gathering");
  EXPECT_EQ(runs[0].nodes[0].group_rank, -1);
  EXPECT_EQ(runs[0].nodes[0].heartbeat_age_ms, 500);

  ASSERT_TRUE(state.Join(kRun, Node("b", 3), o, At(600), nullptr).ok());
  ASSERT_TRUE(state.Heartbeat(kRun, "a", At(900)).ok());
  runs = state.Status(At(1000), kRun);
  ASSERT_EQ(runs.size(), 1u);
  const RunStatusRecord& run = runs[0];
  EXPECT_EQ(run.state, "active");
  EXPECT_EQ(run.round, 1u);
  EXPECT_EQ(run.max_restarts, 3u);
  EXPECT_EQ(run.world_size, 5u);
  ASSERT_EQ(run.nodes.size(), 2u);
  EXPECT_EQ(run.nodes[0].node_id, "a");
  EXPECT_EQ(run.nodes[0].group_rank, 0);
  EXPECT_EQ(run.nodes[0].rank_base, 0u);
  EXPECT_EQ(run.nodes[0].heartbeat_age_ms, 100);
  EXPECT_EQ(run.nodes[1].node_id, "b");
  EXPECT_EQ(run.nodes[1].host, "host-b");
  EXPECT_EQ(run.nodes[1].state, "participant");
  EXPECT_EQ(run.nodes[1].rank_base, 2u);
  EXPECT_EQ(run.nodes[1].nproc, 3u);
  EXPECT_EQ(run.nodes[1].heartbeat_age_ms, 400);

  ASSERT_TRUE(state.ReportSuccess(kRun, "a", 1, At(1100), nullptr).ok());
  runs = state.Status(At(1100));
  EXPECT_EQ(runs[0].nodes[0].state, "succeeded");
  ASSERT_TRUE(state.ReportSuccess(kRun, "b", 1, At(1200), nullptr).ok());
  runs = state.Status(At(1200));
  EXPECT_EQ(runs[0].state, "closed");
  EXPECT_EQ(runs[0].outcome, "succeeded");
  EXPECT_EQ(runs[0].closed_reason, "all 2 nodes succeeded in round 1");
  EXPECT_TRUE(state.Status(At(1200), "other").empty());
}

}  // namespace
}  // namespace meshrun::rdzv
