#include "agent/agent_state.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "agent/backoff.h"

namespace meshrun::agent {
namespace {

RoundInfo Round(uint64_t number, uint32_t restarts = 0) {
  RoundInfo round;
  round.round = number;
  round.group_world_size = 1;
  round.world_size = 2;
  round.restart_count = restarts;
  return round;
}

ExitInfo Exit(int local_rank, int code, int signal = 0) {
  ExitInfo exit;
  exit.local_rank = local_rank;
  exit.global_rank = local_rank;
  exit.exit_code = code;
  exit.signal = signal;
  return exit;
}

template <typename T>
const T* Find(const std::vector<Action>& actions) {
  for (const Action& a : actions)
    if (auto* found = std::get_if<T>(&a)) return found;
  return nullptr;
}

TEST(AgentStateTest, StartsWorkersWhenAssignedAndSucceedsWhenAllExitZero) {
  AgentState state(2);
  auto actions = state.Step(event::Assigned{Round(1)});
  ASSERT_NE(Find<action::StartWorkers>(actions), nullptr);
  EXPECT_EQ(state.phase(), AgentState::Phase::kRunning);
  EXPECT_TRUE(state.Step(event::WorkerExited{Exit(0, 0)}).empty());
  actions = state.Step(event::WorkerExited{Exit(1, 0)});
  auto* success = Find<action::ReportSuccess>(actions);
  ASSERT_NE(success, nullptr);
  EXPECT_EQ(success->round, 1u);
  EXPECT_EQ(state.phase(), AgentState::Phase::kSucceeded);
  actions = state.Step(event::Closed{RunEnd::kSucceeded, ""});
  ASSERT_NE(Find<action::Exit>(actions), nullptr);
  EXPECT_EQ(Find<action::Exit>(actions)->code, 0);
}

TEST(AgentStateTest, FailureStopsReportsOnceAndRestartsOnTheNextRound) {
  AgentState state(2);
  state.Step(event::Assigned{Round(1)});
  auto actions = state.Step(event::WorkerExited{Exit(1, 3)});
  ASSERT_NE(Find<action::StopWorkers>(actions), nullptr);
  auto* report = Find<action::ReportFailure>(actions);
  ASSERT_NE(report, nullptr);
  EXPECT_EQ(report->exit.exit_code, 3);
  // The sibling dies of our SIGTERM: expected, not another failure.
  EXPECT_TRUE(state.Step(event::WorkerExited{Exit(0, 0, SIGTERM)}).empty());
  // The daemon re-forms; the assignment may arrive before the stop ends.
  EXPECT_TRUE(state.Step(event::Reform{2, "worker failure"}).empty());
  EXPECT_TRUE(state.Step(event::Assigned{Round(2, 1)}).empty());
  actions = state.Step(event::WorkersStopped{});
  auto* start = Find<action::StartWorkers>(actions);
  ASSERT_NE(start, nullptr);
  EXPECT_EQ(start->round.round, 2u);
  EXPECT_EQ(start->round.restart_count, 1u);
}

TEST(AgentStateTest, ExhaustedBudgetExitsWithTheRootCauseCode) {
  AgentState state(1);
  state.Step(event::Assigned{Round(1)});
  state.Step(event::WorkerExited{Exit(0, 7)});
  EXPECT_TRUE(state.Step(event::Closed{RunEnd::kFailed, "rank 0 exited 7"}).empty());
  auto actions = state.Step(event::WorkersStopped{});
  auto* exit = Find<action::Exit>(actions);
  ASSERT_NE(exit, nullptr);
  EXPECT_EQ(exit->code, 7);
  EXPECT_NE(exit->summary.find("rank 0 exited 7"), std::string::npos);
  EXPECT_EQ(state.phase(), AgentState::Phase::kExited);
  EXPECT_TRUE(state.Step(event::Assigned{Round(9)}).empty());
}

TEST(AgentStateTest, RemoteFailureClosingTheRunExitsNonZero) {
  AgentState state(1);
  state.Step(event::Assigned{Round(1)});
  auto actions = state.Step(event::Closed{RunEnd::kFailed, "elsewhere"});
  ASSERT_NE(Find<action::StopWorkers>(actions), nullptr);
  actions = state.Step(event::WorkersStopped{});
  EXPECT_EQ(Find<action::Exit>(actions)->code, 1);
}

TEST(AgentStateTest, SignaledWorkerCountsAsFailureWithShellCode) {
  AgentState state(1);
  state.Step(event::Assigned{Round(1)});
  state.Step(event::WorkerExited{Exit(0, 0, SIGSEGV)});
  ASSERT_TRUE(state.failure().has_value());
  EXPECT_EQ(state.failure()->status_code(), 128 + SIGSEGV);
}

// The run fails in round 2 on this node's exit 3; round 1's SIGKILL was
// restarted and is not what the exit code reports.
TEST(AgentStateTest, TheExitCodeIsTheFailureOfTheRoundThatFailedTheRun) {
  AgentState state(1);
  state.Step(event::Assigned{Round(1)});
  state.Step(event::WorkerExited{Exit(0, 0, SIGKILL)});
  state.Step(event::Reform{2, "worker failure"});
  state.Step(event::WorkersStopped{});
  state.Step(event::Assigned{Round(2, 1)});
  state.Step(event::WorkerExited{Exit(0, 3)});
  state.Step(event::Closed{RunEnd::kFailed, "rank 0 exited 3"});
  auto actions = state.Step(event::WorkersStopped{});
  ASSERT_NE(Find<action::Exit>(actions), nullptr);
  EXPECT_EQ(Find<action::Exit>(actions)->code, 3);
}

TEST(AgentStateTest, TerminationSignalStopsWorkersWithItLeavesAndExits128PlusSignal) {
  AgentState state(2);
  state.Step(event::Assigned{Round(1)});
  auto actions = state.Step(event::Signal{SIGTERM});
  ASSERT_NE(Find<action::LeaveRun>(actions), nullptr);
  ASSERT_NE(Find<action::StopWorkers>(actions), nullptr);
  EXPECT_EQ(Find<action::StopWorkers>(actions)->signal, SIGTERM);
  // Workers dying of the signal are not failures to report.
  EXPECT_EQ(
      Find<action::ReportFailure>(state.Step(event::WorkerExited{Exit(0, 0, SIGTERM)})),
      nullptr);
  actions = state.Step(event::WorkersStopped{});
  EXPECT_EQ(Find<action::Exit>(actions)->code, 128 + SIGTERM);
}

// Issue 19 (6): the workers get the signal before the daemon hears of the
// departure, which may take as long as the daemon takes to answer.
TEST(AgentStateTest, SignalStopsTheWorkersBeforeLeaving) {
  AgentState state(1);
  state.Step(event::Assigned{Round(1)});
  auto actions = state.Step(event::Signal{SIGTERM});
  ASSERT_EQ(actions.size(), 2u);
  EXPECT_TRUE(std::holds_alternative<action::StopWorkers>(actions[0]));
  EXPECT_TRUE(std::holds_alternative<action::LeaveRun>(actions[1]));
}

TEST(AgentStateTest, SignalWhileJoiningExitsAtOnce) {
  AgentState state(1);
  auto actions = state.Step(event::Signal{SIGINT});
  ASSERT_NE(Find<action::Exit>(actions), nullptr);
  EXPECT_EQ(Find<action::Exit>(actions)->code, 128 + SIGINT);
}

TEST(AgentStateTest, UserSignalsAreForwardedWithoutStopping) {
  AgentState state(1);
  state.Step(event::Assigned{Round(1)});
  auto actions = state.Step(event::Signal{SIGUSR1});
  ASSERT_NE(Find<action::ForwardSignal>(actions), nullptr);
  EXPECT_EQ(state.phase(), AgentState::Phase::kRunning);
}

TEST(AgentStateTest, ScaleUpAfterLocalSuccessRunsTheNextRoundToo) {
  AgentState state(1);
  state.Step(event::Assigned{Round(1)});
  state.Step(event::WorkerExited{Exit(0, 0)});
  EXPECT_EQ(state.phase(), AgentState::Phase::kSucceeded);
  EXPECT_TRUE(state.Step(event::Reform{2, "node left"}).empty());
  auto actions = state.Step(event::Assigned{Round(2)});
  ASSERT_NE(Find<action::StartWorkers>(actions), nullptr);
}

TEST(AgentStateTest, ResentAssignmentOfTheCurrentRoundIsIgnored) {
  AgentState state(1);
  state.Step(event::Assigned{Round(1)});
  EXPECT_TRUE(state.Step(event::Assigned{Round(1)}).empty());
  // A newer round without a re-form restarts into it.
  auto actions = state.Step(event::Assigned{Round(2)});
  ASSERT_NE(Find<action::StopWorkers>(actions), nullptr);
  actions = state.Step(event::WorkersStopped{});
  EXPECT_EQ(Find<action::StartWorkers>(actions)->round.round, 2u);
}

TEST(AgentStateTest, LostRendezvousStopsWorkersAndFails) {
  AgentState state(1);
  state.Step(event::Assigned{Round(1)});
  auto actions = state.Step(event::RendezvousLost{"daemon gone"});
  ASSERT_NE(Find<action::StopWorkers>(actions), nullptr);
  actions = state.Step(event::WorkersStopped{});
  EXPECT_EQ(Find<action::Exit>(actions)->code, 1);
  EXPECT_NE(Find<action::Exit>(actions)->summary.find("daemon gone"), std::string::npos);
}

// The daemon restarted or this node reconnected: the re-sent assignment of
// the running round changes nothing.
TEST(AgentStateTest, ResentAssignmentOfTheRunningRoundKeepsTheWorkers) {
  AgentState state(2);
  state.Step(event::Assigned{Round(3)});
  EXPECT_EQ(state.resumable_round(), 3u);
  EXPECT_TRUE(state.Step(event::Assigned{Round(3)}).empty());
  EXPECT_EQ(state.phase(), AgentState::Phase::kRunning);
}

TEST(AgentStateTest, ResentAssignmentAfterSuccessReportsTheSuccessAgain) {
  AgentState state(1);
  state.Step(event::Assigned{Round(2)});
  ASSERT_NE(Find<action::ReportSuccess>(state.Step(event::WorkerExited{Exit(0, 0)})),
            nullptr);
  EXPECT_EQ(state.resumable_round(), 2u);
  auto actions = state.Step(event::Assigned{Round(2)});
  ASSERT_EQ(actions.size(), 1u);
  ASSERT_NE(Find<action::ReportSuccess>(actions), nullptr);
  EXPECT_EQ(Find<action::ReportSuccess>(actions)->round, 2u);
  EXPECT_EQ(state.phase(), AgentState::Phase::kSucceeded);
}

TEST(AgentStateTest, LeaseExpiredStopsTheWorkersThenExitsWithItsCode) {
  AgentState state(2);
  state.Step(event::Assigned{Round(1)});
  auto actions = state.Step(event::LeaseExpired{"no heartbeat for 3 s"});
  ASSERT_NE(Find<action::StopWorkers>(actions), nullptr);
  EXPECT_EQ(Find<action::Exit>(actions), nullptr);
  EXPECT_EQ(state.resumable_round(), std::nullopt);
  actions = state.Step(event::WorkersStopped{});
  const auto* exit = Find<action::Exit>(actions);
  ASSERT_NE(exit, nullptr);
  EXPECT_EQ(exit->code, kLeaseExpiredExitCode);
  EXPECT_EQ(exit->summary, "no heartbeat for 3 s");
}

TEST(AgentStateTest, LeaseExpiredWhileJoiningExitsAtOnce) {
  AgentState state(1);
  auto actions = state.Step(event::LeaseExpired{"gone"});
  const auto* exit = Find<action::Exit>(actions);
  ASSERT_NE(exit, nullptr);
  EXPECT_EQ(exit->code, kLeaseExpiredExitCode);
}

TEST(AgentStateTest, RoundLostStopsTheWorkersAndTheNextAssignmentStartsThem) {
  AgentState state(2);
  state.Step(event::Assigned{Round(4, 1)});
  auto actions = state.Step(event::RoundLost{"unknown run"});
  ASSERT_NE(Find<action::StopWorkers>(actions), nullptr);
  EXPECT_EQ(Find<action::Exit>(actions), nullptr);
  // The fresh join's assignment may arrive while the workers still stop; a
  // restarted daemon numbers rounds from 1 again.
  EXPECT_TRUE(state.Step(event::Assigned{Round(1)}).empty());
  actions = state.Step(event::WorkersStopped{});
  const auto* start = Find<action::StartWorkers>(actions);
  ASSERT_NE(start, nullptr);
  EXPECT_EQ(start->round.round, 1u);
}

TEST(AgentStateTest, RoundLostAfterSuccessWaitsForTheNextRound) {
  AgentState state(1);
  state.Step(event::Assigned{Round(1)});
  state.Step(event::WorkerExited{Exit(0, 0)});
  EXPECT_TRUE(state.Step(event::RoundLost{"unknown run"}).empty());
  EXPECT_EQ(state.phase(), AgentState::Phase::kJoining);
  ASSERT_NE(Find<action::StartWorkers>(state.Step(event::Assigned{Round(1)})), nullptr);
}

// --- Restart scope "replica" (issue 18) ------------------------------------------

// A node whose local ranks start at `rank_base`.
RoundInfo NodeRound(uint64_t number, uint32_t rank_base, uint32_t restarts = 0) {
  RoundInfo round = Round(number, restarts);
  round.rank_base = rank_base;
  round.world_size = 8;
  return round;
}

template <typename T>
int CountOf(const std::vector<Action>& actions) {
  int n = 0;
  for (const Action& a : actions) n += std::holds_alternative<T>(a) ? 1 : 0;
  return n;
}

TEST(AgentStateReplicaTest, AFailureStopsAndReportsOnlyItsReplicaGroup) {
  AgentState state(4, 2);
  state.Step(event::Assigned{NodeRound(1, 4)});  // ranks 4..7: replicas 2 and 3
  auto actions = state.Step(event::WorkerExited{Exit(3, 5)});
  auto* stop = Find<action::StopReplica>(actions);
  ASSERT_NE(stop, nullptr);
  EXPECT_EQ(stop->replica, 3u);
  EXPECT_EQ(stop->group, 1);
  EXPECT_EQ(stop->signal, SIGTERM);
  EXPECT_EQ(Find<action::StopWorkers>(actions), nullptr);
  auto* report = Find<action::ReportFailure>(actions);
  ASSERT_NE(report, nullptr);
  ASSERT_TRUE(report->replica.has_value());
  EXPECT_EQ(*report->replica, 3u);
  EXPECT_EQ(report->replica_restarts, 0u);
  EXPECT_EQ(report->exit.exit_code, 5);
  EXPECT_EQ(state.phase(), AgentState::Phase::kRunning);
  // Its sibling dies of the SIGTERM: expected, no second report.
  EXPECT_TRUE(state.Step(event::WorkerExited{Exit(2, 0, SIGTERM)}).empty());
}

TEST(AgentStateReplicaTest, RestartsOnceStoppedAndToldInEitherOrder) {
  for (bool verdict_first : {false, true}) {
    SCOPED_TRACE(verdict_first ? "verdict first" : "stopped first");
    AgentState state(4, 2);
    state.Step(event::Assigned{NodeRound(1, 0)});
    state.Step(event::WorkerExited{Exit(1, 1)});
    state.Step(event::WorkerExited{Exit(0, 0, SIGTERM)});
    std::vector<Action> actions;
    if (verdict_first) {
      EXPECT_TRUE(state.Step(event::ReplicaVerdict{1, 0, true, 1}).empty());
      actions = state.Step(event::ReplicaStopped{0});
    } else {
      EXPECT_TRUE(state.Step(event::ReplicaStopped{0}).empty());
      actions = state.Step(event::ReplicaVerdict{1, 0, true, 1});
    }
    ASSERT_EQ(actions.size(), 1u);
    auto* start = Find<action::StartReplica>(actions);
    ASSERT_NE(start, nullptr);
    EXPECT_EQ(start->replica, 0u);
    EXPECT_EQ(start->group, 0);
    EXPECT_EQ(start->restarts, 1u);
    EXPECT_EQ(start->round.round, 1u);
    EXPECT_EQ(start->round.restart_count, 1u);
    // A repeated answer or stop changes nothing.
    EXPECT_TRUE(state.Step(event::ReplicaVerdict{1, 0, true, 1}).empty());
    EXPECT_TRUE(state.Step(event::ReplicaStopped{0}).empty());
    // The restarted incarnation fails again: reported as restart 1.
    actions = state.Step(event::WorkerExited{Exit(0, 2)});
    ASSERT_NE(Find<action::ReportFailure>(actions), nullptr);
    EXPECT_EQ(Find<action::ReportFailure>(actions)->replica_restarts, 1u);
  }
}

TEST(AgentStateReplicaTest, SuccessNeedsEveryRanksLatestIncarnation) {
  AgentState state(4, 2);
  state.Step(event::Assigned{NodeRound(1, 0)});
  EXPECT_TRUE(state.Step(event::WorkerExited{Exit(0, 0)}).empty());  // finished
  EXPECT_TRUE(state.Step(event::WorkerExited{Exit(2, 0)}).empty());
  EXPECT_TRUE(state.Step(event::WorkerExited{Exit(3, 0)}).empty());
  // Rank 1 fails after its partner finished: the whole group runs again.
  state.Step(event::WorkerExited{Exit(1, 1)});
  state.Step(event::ReplicaStopped{0});
  ASSERT_NE(Find<action::StartReplica>(state.Step(event::ReplicaVerdict{1, 0, true, 1})),
            nullptr);
  EXPECT_TRUE(state.Step(event::WorkerExited{Exit(1, 0)}).empty());
  auto actions = state.Step(event::WorkerExited{Exit(0, 0)});
  ASSERT_NE(Find<action::ReportSuccess>(actions), nullptr);
  EXPECT_EQ(state.phase(), AgentState::Phase::kSucceeded);
}

TEST(AgentStateReplicaTest, TwoGroupsFailAndRestartIndependently) {
  AgentState state(4, 1);
  state.Step(event::Assigned{NodeRound(1, 0)});
  auto a = state.Step(event::WorkerExited{Exit(1, 1)});
  auto b = state.Step(event::WorkerExited{Exit(3, 1)});
  EXPECT_EQ(Find<action::ReportFailure>(a)->replica, 1u);
  EXPECT_EQ(Find<action::ReportFailure>(b)->replica, 3u);
  state.Step(event::ReplicaStopped{3});
  auto start = state.Step(event::ReplicaVerdict{1, 3, true, 1});
  ASSERT_NE(Find<action::StartReplica>(start), nullptr);
  EXPECT_EQ(Find<action::StartReplica>(start)->round.restart_count, 1u);
  state.Step(event::ReplicaStopped{1});
  start = state.Step(event::ReplicaVerdict{1, 1, true, 2});
  ASSERT_NE(Find<action::StartReplica>(start), nullptr);
  EXPECT_EQ(Find<action::StartReplica>(start)->round.restart_count, 2u);
  EXPECT_EQ(Find<action::StartReplica>(start)->restarts, 1u);
  for (int rank : {0, 1, 2})
    EXPECT_TRUE(state.Step(event::WorkerExited{Exit(rank, 0)}).empty());
  EXPECT_NE(Find<action::ReportSuccess>(state.Step(event::WorkerExited{Exit(3, 0)})),
            nullptr);
}

TEST(AgentStateReplicaTest, SpentBudgetStopsEveryWorkerAndExitsWithTheRootCause) {
  AgentState state(4, 2);
  state.Step(event::Assigned{NodeRound(1, 0)});
  state.Step(event::WorkerExited{Exit(2, 9)});
  state.Step(event::ReplicaStopped{1});
  auto actions = state.Step(event::ReplicaVerdict{1, 1, false, 3});
  ASSERT_NE(Find<action::StopWorkers>(actions), nullptr);
  EXPECT_EQ(Find<action::StartReplica>(actions), nullptr);
  EXPECT_TRUE(state.Step(event::Closed{RunEnd::kFailed, "rank 2 exited 9"}).empty());
  actions = state.Step(event::WorkersStopped{});
  auto* exit = Find<action::Exit>(actions);
  ASSERT_NE(exit, nullptr);
  EXPECT_EQ(exit->code, 9);
  EXPECT_NE(exit->summary.find("Root Cause"), std::string::npos);
}

// Group 0 was SIGKILLed and restarted; its second life exits 1 and spends
// the budget: the exit code is that failure's, the one the close is about.
TEST(AgentStateReplicaTest, TheExitCodeIsTheFailureThatSpentTheBudget) {
  AgentState state(2, 1);
  state.Step(event::Assigned{NodeRound(1, 0)});
  state.Step(event::WorkerExited{Exit(0, 0, SIGKILL)});
  state.Step(event::ReplicaStopped{0});
  ASSERT_NE(Find<action::StartReplica>(state.Step(event::ReplicaVerdict{1, 0, true, 1})),
            nullptr);
  state.Step(event::WorkerExited{Exit(0, 1)});
  state.Step(event::ReplicaStopped{0});
  state.Step(event::ReplicaVerdict{1, 0, false, 2});
  state.Step(event::Closed{RunEnd::kFailed, "rank 0 exited 1"});
  auto actions = state.Step(event::WorkersStopped{});
  ASSERT_NE(Find<action::Exit>(actions), nullptr);
  EXPECT_EQ(Find<action::Exit>(actions)->code, 1);
}

TEST(AgentStateReplicaTest, CloseBeforeTheVerdictStopsEverything) {
  AgentState state(2, 1);
  state.Step(event::Assigned{NodeRound(1, 0)});
  state.Step(event::WorkerExited{Exit(0, 4)});
  ASSERT_NE(Find<action::StopWorkers>(state.Step(event::Closed{RunEnd::kFailed, "x"})),
            nullptr);
  EXPECT_TRUE(state.Step(event::ReplicaVerdict{1, 0, false, 1}).empty());
  EXPECT_TRUE(state.Step(event::ReplicaStopped{0}).empty());
  EXPECT_EQ(Find<action::Exit>(state.Step(event::WorkersStopped{}))->code, 4);
}

TEST(AgentStateReplicaTest, AReformStopsEveryWorkerAndForgetsPendingRestarts) {
  AgentState state(4, 2);
  state.Step(event::Assigned{NodeRound(1, 0)});
  state.Step(event::WorkerExited{Exit(0, 1)});
  auto actions = state.Step(event::Reform{2, "node left"});
  ASSERT_NE(Find<action::StopWorkers>(actions), nullptr);
  // What arrives for the old round now is stale.
  EXPECT_TRUE(state.Step(event::ReplicaStopped{0}).empty());
  EXPECT_TRUE(state.Step(event::ReplicaVerdict{1, 0, true, 1}).empty());
  EXPECT_TRUE(state.Step(event::Assigned{NodeRound(2, 0, 1)}).empty());
  actions = state.Step(event::WorkersStopped{});
  ASSERT_NE(Find<action::StartWorkers>(actions), nullptr);
  EXPECT_EQ(CountOf<action::StartReplica>(actions), 0);
  // A fresh round: the group's restarts count from 0 again.
  actions = state.Step(event::WorkerExited{Exit(1, 1)});
  EXPECT_EQ(Find<action::ReportFailure>(actions)->replica_restarts, 0u);
  EXPECT_EQ(Find<action::ReportFailure>(actions)->round, 2u);
  // A verdict of round 1 does not restart round 2's group.
  state.Step(event::ReplicaStopped{0});
  EXPECT_TRUE(state.Step(event::ReplicaVerdict{1, 0, true, 2}).empty());
  EXPECT_NE(Find<action::StartReplica>(state.Step(event::ReplicaVerdict{2, 0, true, 2})),
            nullptr);
}

TEST(AgentStateReplicaTest, ASignalStopsEveryWorker) {
  AgentState state(4, 2);
  state.Step(event::Assigned{NodeRound(1, 0)});
  state.Step(event::WorkerExited{Exit(0, 1)});
  auto actions = state.Step(event::Signal{SIGTERM});
  ASSERT_NE(Find<action::StopWorkers>(actions), nullptr);
  ASSERT_NE(Find<action::LeaveRun>(actions), nullptr);
  EXPECT_TRUE(state.Step(event::ReplicaStopped{0}).empty());
  EXPECT_EQ(Find<action::Exit>(state.Step(event::WorkersStopped{}))->code, 128 + SIGTERM);
}

TEST(AgentStateReplicaTest, UnknownReplicaIdsAreIgnored) {
  AgentState state(2, 1);
  state.Step(event::Assigned{NodeRound(1, 2)});  // replicas 2 and 3
  EXPECT_TRUE(state.Step(event::ReplicaStopped{0}).empty());
  EXPECT_TRUE(state.Step(event::ReplicaVerdict{1, 7, true, 1}).empty());
  EXPECT_EQ(state.phase(), AgentState::Phase::kRunning);
}

TEST(AgentStateReplicaTest, ScopeJobIgnoresReplicaEvents) {
  AgentState state(2);
  state.Step(event::Assigned{Round(1)});
  EXPECT_TRUE(state.Step(event::ReplicaStopped{0}).empty());
  EXPECT_TRUE(state.Step(event::ReplicaVerdict{1, 0, true, 1}).empty());
  auto actions = state.Step(event::WorkerExited{Exit(0, 1)});
  ASSERT_NE(Find<action::StopWorkers>(actions), nullptr);
  EXPECT_FALSE(Find<action::ReportFailure>(actions)->replica.has_value());
}

TEST(BackoffTest, GrowsExponentiallyWithJitterUpToTheCap) {
  Backoff backoff(std::chrono::milliseconds(100), std::chrono::milliseconds(1000), 7);
  const int64_t highs[] = {100, 200, 400, 800, 1000, 1000};
  for (int64_t high : highs) {
    const int64_t d = backoff.Next().count();
    EXPECT_GE(d, high / 2);
    EXPECT_LE(d, high);
  }
  backoff.Reset();
  EXPECT_LE(backoff.Next().count(), 100);
  // Jitter: two agents seeded differently do not wait the same times.
  Backoff a(std::chrono::milliseconds(1000), std::chrono::milliseconds(8000), 1);
  Backoff b(std::chrono::milliseconds(1000), std::chrono::milliseconds(8000), 2);
  int same = 0;
  for (int i = 0; i < 8; ++i) same += a.Next() == b.Next();
  EXPECT_LT(same, 8);
}

}  // namespace
}  // namespace meshrun::agent
