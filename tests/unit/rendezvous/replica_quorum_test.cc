#include "rendezvous/core/replica_quorum.h"

#include <chrono>
#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace meshrun::rdzv {
namespace {

using std::chrono::seconds;

constexpr uint64_t kFirstId = 1000;

// Drives one ReplicaQuorum and keeps every answer by waiter.
class QuorumDriver {
 public:
  QuorumDriver() : quorum_(kFirstId) {}

  // Member `member` of `replica` arrives; returns its waiter.
  QuorumWaiter Arrive(uint32_t replica, uint64_t steps, uint32_t incarnation = 0,
                      uint32_t member = 0, uint32_t size = 1, uint32_t num = 3,
                      bool finished = false, uint64_t admission = 0) {
    const QuorumWaiter waiter = next_++;
    EXPECT_TRUE(quorum_
                    .Arrive({.replica = replica,
                             .member = member,
                             .replica_size = size,
                             .num_replicas = num,
                             .committed_steps = steps,
                             .incarnation = incarnation,
                             .admission = admission,
                             .finished = finished},
                            waiter, now_ + seconds(10), &out_)
                    .ok());
    Collect();
    return waiter;
  }
  // As Arrive, for a caller expected to be refused: the refusal's status.
  absl::Status Refused(const QuorumArrival& arrival) {
    const QuorumWaiter waiter = next_++;
    absl::Status status = quorum_.Arrive(arrival, waiter, now_ + seconds(10), &out_);
    Collect();
    EXPECT_FALSE(Answered(waiter));
    return status;
  }
  // A group of one that has trained every step (`steps`) arrives.
  QuorumWaiter ArriveFinished(uint32_t replica, uint64_t steps, uint32_t num = 3) {
    return Arrive(replica, steps, 0, 0, 1, num, /*finished=*/true);
  }
  QuorumWaiter Vote(uint64_t quorum_id, uint32_t replica, bool ok, uint32_t member = 0,
                    uint64_t admission = 0) {
    const QuorumWaiter waiter = next_++;
    EXPECT_TRUE(quorum_
                    .Vote(quorum_id, replica, member, ok, admission, waiter,
                          now_ + seconds(10), &out_)
                    .ok());
    Collect();
    return waiter;
  }
  void Advance(seconds by) {
    now_ += by;
    quorum_.Tick(now_, &out_);
    Collect();
  }

  bool Answered(QuorumWaiter waiter) const { return answers_.count(waiter) > 0; }
  const QuorumFormed& Formed(QuorumWaiter waiter) const {
    return std::get<QuorumFormed>(answers_.at(waiter));
  }
  const CommitDecision& Decision(QuorumWaiter waiter) const {
    return std::get<CommitDecision>(answers_.at(waiter));
  }
  const absl::Status& Error(QuorumWaiter waiter) const {
    return std::get<absl::Status>(answers_.at(waiter));
  }
  ReplicaQuorum& quorum() { return quorum_; }
  std::vector<QuorumAnswer>& out() { return out_; }
  void Collect() {
    for (auto& answer : out_) {
      EXPECT_FALSE(answers_.count(answer.waiter)) << "answered twice: " << answer.waiter;
      answers_[answer.waiter] = answer.result;
    }
    out_.clear();
  }

 private:
  ReplicaQuorum quorum_;
  RdzvTime now_{};
  QuorumWaiter next_ = 1;
  std::vector<QuorumAnswer> out_;
  std::map<QuorumWaiter, decltype(QuorumAnswer::result)> answers_;
};

// Three replicas arrive and vote ok on every step.
uint64_t CommitStep(QuorumDriver& d, uint64_t steps, uint64_t* group_id) {
  const QuorumWaiter a = d.Arrive(0, steps), b = d.Arrive(1, steps),
                     c = d.Arrive(2, steps);
  const QuorumFormed formed = d.Formed(a);
  EXPECT_EQ(d.Formed(b).quorum_id, formed.quorum_id);
  EXPECT_EQ(d.Formed(c).quorum_id, formed.quorum_id);
  const QuorumWaiter v0 = d.Vote(formed.quorum_id, 0, true);
  const QuorumWaiter v1 = d.Vote(formed.quorum_id, 1, true);
  EXPECT_FALSE(d.Answered(v0));
  const QuorumWaiter v2 = d.Vote(formed.quorum_id, 2, true);
  for (QuorumWaiter v : {v0, v1, v2}) EXPECT_TRUE(d.Decision(v).commit);
  *group_id = formed.group_id;
  return formed.quorum_id;
}

TEST(ReplicaQuorumTest, FormsOnceEveryReplicaIsHereAndCommitsWhenAllVoteOk) {
  QuorumDriver d;
  const QuorumWaiter a = d.Arrive(0, 0), b = d.Arrive(1, 0);
  EXPECT_FALSE(d.Answered(a));  // replica 2 of the 3 the job started with is missing
  const QuorumWaiter c = d.Arrive(2, 0);
  const QuorumFormed& formed = d.Formed(a);
  EXPECT_EQ(formed.participants, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_FALSE(formed.heal);
  EXPECT_EQ(formed.quorum_id, kFirstId);
  EXPECT_TRUE(d.Answered(b) && d.Answered(c));

  uint64_t group = 0, next_group = 0;
  CommitStep(d, 1, &group);
  // Same members, committed steps: the same process group carries on.
  CommitStep(d, 2, &next_group);
  EXPECT_EQ(next_group, group);
}

TEST(ReplicaQuorumTest, OneFailedVoteDiscardsTheStepForEveryoneAndTheGroupIsRebuilt) {
  QuorumDriver d;
  uint64_t group = 0;
  CommitStep(d, 0, &group);
  d.Arrive(0, 1), d.Arrive(1, 1);
  const QuorumFormed formed = d.Formed(d.Arrive(2, 1));
  const QuorumWaiter v0 = d.Vote(formed.quorum_id, 0, true);
  const QuorumWaiter v1 = d.Vote(formed.quorum_id, 1, false);
  EXPECT_FALSE(d.Decision(v0).commit);
  EXPECT_NE(d.Decision(v1).reason.find("replica 1"), std::string::npos);
  // A late vote gets the same decision.
  EXPECT_FALSE(d.Decision(d.Vote(formed.quorum_id, 2, true)).commit);
  // The next quorum has the same members but a new group.
  d.Arrive(0, 1), d.Arrive(1, 1);
  EXPECT_NE(d.Formed(d.Arrive(2, 1)).group_id, group);
}

TEST(ReplicaQuorumTest, AFailedReplicaIsNotWaitedForAndItsUnfinishedStepIsDiscarded) {
  QuorumDriver d;
  d.Arrive(0, 0), d.Arrive(1, 0);
  const QuorumFormed formed = d.Formed(d.Arrive(2, 0));
  const QuorumWaiter v0 = d.Vote(formed.quorum_id, 0, true);
  const QuorumWaiter v1 = d.Vote(formed.quorum_id, 1, true);
  d.quorum().ReplicaFailed(2, ReplicaQuorum::Loss::kRestarting, &d.out());
  d.Collect();
  EXPECT_FALSE(d.Decision(v0).commit);
  EXPECT_NE(d.Decision(v1).reason.find("replica 2 failed"), std::string::npos);

  // The survivors form the next quorum without waiting for it.
  const QuorumWaiter a = d.Arrive(0, 0);
  const QuorumFormed& next = d.Formed(d.Arrive(1, 0));
  EXPECT_EQ(next.participants, (std::vector<uint32_t>{0, 1}));
  EXPECT_TRUE(d.Answered(a));
}

TEST(ReplicaQuorumTest, AReplicaThatFailsAfterVotingOkDoesNotUndoTheCommit) {
  QuorumDriver d;
  d.Arrive(0, 0), d.Arrive(1, 0);
  const QuorumFormed formed = d.Formed(d.Arrive(2, 0));
  const QuorumWaiter v0 = d.Vote(formed.quorum_id, 0, true);
  d.Vote(formed.quorum_id, 2, true);
  d.quorum().ReplicaFailed(2, ReplicaQuorum::Loss::kRestarting, &d.out());
  d.Collect();
  EXPECT_FALSE(d.Answered(v0));
  d.Vote(formed.quorum_id, 1, true);
  EXPECT_TRUE(d.Decision(v0).commit);
}

TEST(ReplicaQuorumTest, ARestartedReplicaJoinsAtTheNextStepAndIsHealedFromALivePeer) {
  QuorumDriver d;
  uint64_t group = 0;
  CommitStep(d, 0, &group);
  d.quorum().ReplicaFailed(1, ReplicaQuorum::Loss::kRestarting, &d.out());
  d.Collect();
  // Its old incarnation cannot come back (a survivor of it retrying).
  const absl::Status survivor =
      d.Refused({.replica = 1, .replica_size = 1, .num_replicas = 3});
  EXPECT_EQ(survivor.code(), absl::StatusCode::kFailedPrecondition) << survivor;
  EXPECT_NE(survivor.message().find("only a newer incarnation"), std::string::npos)
      << survivor;
  // Incarnation 1 takes its place; the survivors arrive with 1 step.
  const QuorumWaiter restarted = d.Arrive(1, 0, /*incarnation=*/1);
  d.Arrive(0, 1);
  const QuorumFormed formed = d.Formed(d.Arrive(2, 1));
  EXPECT_EQ(d.Formed(restarted).quorum_id, formed.quorum_id);
  EXPECT_EQ(formed.participants, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_TRUE(formed.heal);
  EXPECT_EQ(formed.max_committed_steps, 1u);
  EXPECT_EQ(formed.source_replica, 0u);
  EXPECT_NE(formed.group_id, group);
  // An incarnation older than the newest is refused.
  EXPECT_EQ(d.quorum()
                .Arrive({.replica = 1, .replica_size = 1, .num_replicas = 3}, 100,
                        RdzvTime{} + seconds(10), &d.out())
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ReplicaQuorumTest, ReplicasThatFinishedWaitForAFailedOneToBeHealedBeforeLeaving) {
  QuorumDriver d;
  uint64_t group = 0;
  CommitStep(d, 0, &group);
  d.quorum().ReplicaFailed(2, ReplicaQuorum::Loss::kRestarting, &d.out());
  d.Collect();
  // The survivors have trained every step: they wait for the restarting one.
  const QuorumWaiter survivor = d.ArriveFinished(0, 1);
  d.ArriveFinished(1, 1);
  EXPECT_FALSE(d.Answered(survivor));
  const QuorumWaiter restarted = d.Arrive(2, 0, /*incarnation=*/1);
  EXPECT_TRUE(d.Formed(restarted).heal);
  EXPECT_EQ(d.Formed(survivor).participants, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(d.Formed(survivor).max_committed_steps, 1u);
}

// An elastic job that started with two groups: a node joining brings a
// third, which is waited for once it is here and healed from a live one.
TEST(ReplicaQuorumTest, AGroupOfAJoiningNodeIsWaitedForOnceHereAndHealed) {
  QuorumDriver d;
  const QuorumWaiter a = d.Arrive(0, 0, 0, 0, 1, /*num=*/2);
  EXPECT_EQ(d.Formed(d.Arrive(1, 0, 0, 0, 1, 2)).participants,
            (std::vector<uint32_t>{0, 1}));
  const uint64_t q = d.Formed(a).quorum_id;
  d.Vote(q, 0, true), d.Vote(q, 1, true);
  // The newcomer's world holds three groups.
  const QuorumWaiter joined = d.Arrive(2, 0, 0, 0, 1, /*num=*/3);
  EXPECT_FALSE(d.Answered(joined));
  const QuorumWaiter b = d.Arrive(0, 1, 0, 0, 1, 2);
  EXPECT_FALSE(d.Answered(b));
  d.Arrive(1, 1, 0, 0, 1, 2);
  const QuorumFormed& formed = d.Formed(joined);
  EXPECT_EQ(formed.participants, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_TRUE(formed.heal);
  EXPECT_EQ(formed.source_replica, 0u);
  EXPECT_EQ(formed.max_committed_steps, 1u);
  EXPECT_NE(formed.group_id, d.Formed(a).group_id);
}

// Two groups of a run of two train step 1 together.
void CommitFirstStepOfTwo(QuorumDriver& d) {
  const QuorumWaiter a = d.Arrive(0, 0, 0, 0, 1, 2);
  d.Arrive(1, 0, 0, 0, 1, 2);
  const uint64_t q = d.Formed(a).quorum_id;
  const QuorumWaiter vote = d.Vote(q, 0, true);
  d.Vote(q, 1, true);
  EXPECT_TRUE(d.Decision(vote).commit);
}

// A group that arrives after the ones that finished training have left (a
// restart or a joining node, too late) would train from where it is, alone:
// it is told OUT_OF_RANGE instead.
TEST(ReplicaQuorumTest, AGroupArrivingAfterTheFinishedOnesLeftIsRefused) {
  QuorumDriver d;
  CommitFirstStepOfTwo(d);
  const QuorumWaiter finished = d.ArriveFinished(0, 1, 2);
  d.ArriveFinished(1, 1, 2);
  EXPECT_EQ(d.Formed(finished).participants, (std::vector<uint32_t>{0, 1}));
  // They left; a newcomer arrives.
  const QuorumWaiter late = d.Arrive(2, 0, 0, 0, 1, 3);
  ASSERT_TRUE(d.Answered(late));
  EXPECT_EQ(d.Error(late).code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(d.Error(late).message().find("training finished (1 steps)"),
            std::string::npos)
      << d.Error(late);
}

// The only group with the final state fails during the finishing quorum's
// heal (its state_dict raised): nobody left with the state, so the groups
// that come later are told it is lost, not that training finished.
TEST(ReplicaQuorumTest,
     WhenEveryGroupThatFinishedWithTheStateFailsTheLateOnesAreRefused) {
  QuorumDriver d;
  CommitFirstStepOfTwo(d);
  d.quorum().ReplicaFailed(1, ReplicaQuorum::Loss::kRestarting, &d.out());
  d.Collect();
  // Replica 0 finished with 1 step; replica 1 comes back and is to be healed.
  const QuorumWaiter finished = d.ArriveFinished(0, 1, 2);
  const QuorumWaiter receiver = d.Arrive(1, 0, /*incarnation=*/1, 0, 1, 2);
  EXPECT_TRUE(d.Formed(finished).heal);
  EXPECT_EQ(d.Formed(receiver).source_replica, 0u);
  // The source fails during the heal; the receiver, which got nothing, and
  // then (once the receiver's refused worker has exited) the source's own
  // restart are refused.
  d.quorum().ReplicaFailed(0, ReplicaQuorum::Loss::kRestarting, &d.out());
  d.Collect();
  for (const auto& [replica, incarnation] : {std::pair{1u, 1u}, std::pair{0u, 1u}}) {
    const QuorumWaiter late = d.Arrive(replica, 0, incarnation, 0, 1, 2);
    ASSERT_TRUE(d.Answered(late)) << replica;
    EXPECT_EQ(d.Error(late).code(), absl::StatusCode::kDataLoss) << d.Error(late);
    EXPECT_NE(d.Error(late).message().find(
                  "after 1 committed steps is lost: every replica group that finished "
                  "with it failed before leaving"),
              std::string::npos)
        << d.Error(late);
    d.quorum().ReplicaFailed(replica, ReplicaQuorum::Loss::kRestarting, &d.out());
    d.Collect();
  }
}

// Two groups finished with the state; one fails on the way out, the other
// left with it: training finished, as far as a late group is concerned.
TEST(ReplicaQuorumTest, OneHolderOfTheFinalStateFailingLeavesTheOthersWithIt) {
  QuorumDriver d;
  CommitFirstStepOfTwo(d);
  d.ArriveFinished(0, 1, 2);
  d.ArriveFinished(1, 1, 2);
  d.quorum().ReplicaFailed(0, ReplicaQuorum::Loss::kRestarting, &d.out());
  d.Collect();
  const QuorumWaiter late = d.Arrive(0, 0, /*incarnation=*/1, 0, 1, 2);
  ASSERT_TRUE(d.Answered(late));
  EXPECT_EQ(d.Error(late).code(), absl::StatusCode::kOutOfRange) << d.Error(late);
}

// Every group that held the state died after step 2 committed (or its
// program could not hand it over): the restarted groups, all at step 0,
// are refused rather than training on from step 0 as if nothing was lost.
TEST(ReplicaQuorumTest,
     GroupsThatAllLostTheCommittedStateAreRefusedNotRestartedFromZero) {
  QuorumDriver d;
  uint64_t group = 0;
  CommitStep(d, 0, &group);
  CommitStep(d, 1, &group);
  for (uint32_t r : {0u, 1u, 2u}) {
    d.quorum().ReplicaFailed(r, ReplicaQuorum::Loss::kRestarting, &d.out());
  }
  d.Collect();
  // The first one here is refused at once (the others are not expected).
  const QuorumWaiter a = d.Arrive(0, 0, /*incarnation=*/1);
  ASSERT_TRUE(d.Answered(a));
  // The others wait for it, until its agent reports its worker's exit.
  const QuorumWaiter b = d.Arrive(1, 0, 1);
  const QuorumWaiter c = d.Arrive(2, 0, 1);
  EXPECT_FALSE(d.Answered(c));
  d.quorum().ReplicaFailed(0, ReplicaQuorum::Loss::kRestarting, &d.out());
  d.Collect();
  for (QuorumWaiter w : {a, b, c}) {
    ASSERT_TRUE(d.Answered(w));
    EXPECT_EQ(d.Error(w).code(), absl::StatusCode::kDataLoss) << d.Error(w);
  }
  EXPECT_NE(d.Error(a).message().find("after 2 committed steps is lost"),
            std::string::npos)
      << d.Error(a);
  // One that still holds it is a source again: the others are healed from it.
  const QuorumWaiter holder = d.Arrive(0, 2, /*incarnation=*/2);
  const QuorumWaiter behind = d.Arrive(1, 0, 1);
  d.Arrive(2, 0, 1);
  EXPECT_TRUE(d.Formed(holder).heal);
  EXPECT_EQ(d.Formed(behind).source_replica, 0u);
}

TEST(ReplicaQuorumTest, AtTheDeadlineTheCompleteReplicasGoOnAndTheLateOneArrivesAgain) {
  QuorumDriver d;
  const QuorumWaiter a = d.Arrive(0, 0), b = d.Arrive(1, 0);
  d.Advance(seconds(11));
  EXPECT_EQ(d.Formed(a).participants, (std::vector<uint32_t>{0, 1}));
  EXPECT_TRUE(d.Answered(b));
  const uint64_t q = d.Formed(a).quorum_id;
  d.Vote(q, 0, true), d.Vote(q, 1, true);
  // The late one waits for the next quorum; it is behind, so it heals.
  const QuorumWaiter late = d.Arrive(2, 0);
  EXPECT_FALSE(d.Answered(late));
  d.Arrive(0, 1), d.Arrive(1, 1);
  EXPECT_TRUE(d.Formed(late).heal);
  EXPECT_EQ(d.Formed(late).participants, (std::vector<uint32_t>{0, 1, 2}));
}

TEST(ReplicaQuorumTest, AReplicaThatMissedAQuorumIsNotWaitedForUntilItIsBack) {
  QuorumDriver d;
  QuorumWaiter a = d.Arrive(0, 0);
  d.Arrive(1, 0);
  d.Advance(seconds(11));  // replica 2 hangs
  uint64_t q = d.Formed(a).quorum_id;
  d.Vote(q, 0, true), d.Vote(q, 1, true);
  // The next steps form as soon as the others are here: no deadline each.
  a = d.Arrive(0, 1);
  d.Arrive(1, 1);
  EXPECT_EQ(d.Formed(a).participants, (std::vector<uint32_t>{0, 1}));
  q = d.Formed(a).quorum_id;
  d.Vote(q, 0, true), d.Vote(q, 1, true);
  // Back (all its members here): waited for, and healed.
  const QuorumWaiter back = d.Arrive(2, 0);
  EXPECT_FALSE(d.Answered(back));
  d.Arrive(0, 2), a = d.Arrive(1, 2);
  EXPECT_EQ(d.Formed(back).participants, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_TRUE(d.Formed(back).heal);
  q = d.Formed(a).quorum_id;
  d.Vote(q, 0, true), d.Vote(q, 1, true), d.Vote(q, 2, true);
  // A full member again: the next quorum waits for it.
  a = d.Arrive(0, 3);
  d.Arrive(1, 3);
  EXPECT_FALSE(d.Answered(a));
  d.Arrive(2, 3);
  EXPECT_EQ(d.Formed(a).participants, (std::vector<uint32_t>{0, 1, 2}));
}

TEST(ReplicaQuorumTest, AVoterWhosePeerVanishedIsAnsweredAtItsDeadline) {
  QuorumDriver d;
  d.Arrive(0, 0), d.Arrive(1, 0);
  const QuorumFormed formed = d.Formed(d.Arrive(2, 0));
  const QuorumWaiter v0 = d.Vote(formed.quorum_id, 0, true);
  d.Vote(formed.quorum_id, 1, true);
  EXPECT_EQ(d.quorum().NextDeadline(), RdzvTime{} + seconds(10));
  d.Advance(seconds(11));
  EXPECT_FALSE(d.Decision(v0).commit);
  EXPECT_NE(d.Decision(v0).reason.find("2.0"), std::string::npos);
  EXPECT_FALSE(d.quorum().NextDeadline().has_value());
}

TEST(ReplicaQuorumTest, AnUnknownQuorumIsDiscarded) {
  QuorumDriver d;
  // As after a daemon restart: the vote names a quorum this daemon never formed.
  EXPECT_FALSE(d.Decision(d.Vote(7, 0, true)).commit);
}

TEST(ReplicaQuorumTest, AReplicaGroupCountsOnlyWithAllItsMembers) {
  QuorumDriver d;
  const QuorumWaiter a0 = d.Arrive(0, 0, 0, /*member=*/0, /*size=*/2, /*num=*/2);
  d.Arrive(0, 0, 0, 1, 2, 2);
  d.Arrive(1, 0, 0, 0, 2, 2);
  EXPECT_FALSE(d.Answered(a0));
  d.Arrive(1, 0, 0, 1, 2, 2);
  const QuorumFormed formed = d.Formed(a0);
  EXPECT_EQ(formed.participants, (std::vector<uint32_t>{0, 1}));
  // Three of four members voted ok: not yet.
  const QuorumWaiter v = d.Vote(formed.quorum_id, 0, true, 0);
  d.Vote(formed.quorum_id, 0, true, 1);
  d.Vote(formed.quorum_id, 1, true, 0);
  EXPECT_FALSE(d.Answered(v));
  d.Vote(formed.quorum_id, 1, true, 1);
  EXPECT_TRUE(d.Decision(v).commit);
  // A size that differs from the run's, and a member outside the group.
  std::vector<QuorumAnswer> out;
  EXPECT_EQ(
      d.quorum()
          .Arrive({.replica = 0, .replica_size = 3, .num_replicas = 2}, 50, {}, &out)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.quorum()
                .Arrive({.replica = 0, .member = 2, .replica_size = 2, .num_replicas = 2},
                        51, {}, &out)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ReplicaQuorumTest, OldStepsArePrunedAndParkedCallersCancelled) {
  QuorumDriver d;
  uint64_t group = 0;
  uint64_t first = CommitStep(d, 0, &group);
  for (uint64_t s = 1; s < 40; ++s) CommitStep(d, s, &group);
  // Pruned long ago: told to discard, never refused.
  EXPECT_FALSE(d.Decision(d.Vote(first, 0, true)).commit);
  EXPECT_EQ(d.quorum().quorums_formed(), 40u);
  const QuorumWaiter a = d.Arrive(0, 40);
  d.quorum().CancelAll(&d.out());
  d.Collect();
  EXPECT_EQ(d.Error(a).code(), absl::StatusCode::kUnavailable);
}

// Issue 27: a surviving member of a failed group that arrives again (after
// UNAVAILABLE) is refused instead of reviving the group, so the next quorum
// does not wait for its dead peer; the restarted incarnation is let in.
TEST(ReplicaQuorumTest, ASurvivorOfAFailedGroupDoesNotReviveIt) {
  QuorumDriver d;
  const uint32_t size = 2, num = 2;
  // Replica 1's member 0 waits; its member 1 dies and the group is reported.
  const QuorumWaiter a0 = d.Arrive(0, 0, 0, 0, size, num);
  d.Arrive(0, 0, 0, 1, size, num);
  const QuorumWaiter survivor = d.Arrive(1, 0, 0, 0, size, num);
  EXPECT_FALSE(d.Answered(a0));
  d.quorum().ReplicaFailed(1, ReplicaQuorum::Loss::kRestarting, &d.out());
  d.Collect();
  EXPECT_EQ(d.Error(survivor).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(d.Formed(a0).participants, (std::vector<uint32_t>{0}));
  // It retries: refused, and the next quorum forms without waiting.
  EXPECT_EQ(d.Refused({.replica = 1, .replica_size = size, .num_replicas = num}).code(),
            absl::StatusCode::kFailedPrecondition);
  const QuorumWaiter b0 = d.Arrive(0, 0, 0, 0, size, num);
  d.Arrive(0, 0, 0, 1, size, num);
  EXPECT_EQ(d.Formed(b0).participants, (std::vector<uint32_t>{0}));
  // Incarnation 1 revives it: it is waited for again.
  d.Arrive(1, 0, 1, 0, size, num);
  const QuorumWaiter c0 = d.Arrive(0, 0, 0, 0, size, num);
  d.Arrive(0, 0, 0, 1, size, num);
  EXPECT_FALSE(d.Answered(c0));
  d.Arrive(1, 0, 1, 1, size, num);
  EXPECT_EQ(d.Formed(c0).participants, (std::vector<uint32_t>{0, 1}));
}

// Issue 27: the admission epoch (a node's admission into its slot) orders
// a group's occupants before its incarnations. Each row: replica 1's
// current holder, then a caller; whether the caller is let in.
TEST(ReplicaQuorumTest, AStaleAdmissionIsRefusedAndANewerOneReplacesTheGroup) {
  struct Case {
    const char* name;
    uint64_t holder_admission;
    uint32_t holder_incarnation;
    uint64_t admission;
    uint32_t incarnation;
    absl::StatusCode code;
    bool replaces;  // the holder's waiting member is aborted
  };
  const std::vector<Case> cases{
      {"same admission", 7, 2, 7, 2, absl::StatusCode::kOk, false},
      {"newer incarnation", 7, 2, 7, 3, absl::StatusCode::kOk, true},
      {"older incarnation", 7, 2, 7, 1, absl::StatusCode::kFailedPrecondition, false},
      // A newcomer in the slot counts its incarnations from 0 again.
      {"newer admission", 7, 2, 9, 0, absl::StatusCode::kOk, true},
      // The expelled node's workers, still running.
      {"stale admission", 9, 0, 7, 2, absl::StatusCode::kFailedPrecondition, false},
      {"unknown admission", 7, 2, 0, 2, absl::StatusCode::kOk, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    QuorumDriver d;
    const QuorumWaiter holder =
        d.Arrive(1, 0, c.holder_incarnation, 0, 2, 2, false, c.holder_admission);
    const QuorumArrival caller{.replica = 1,
                               .member = 1,
                               .replica_size = 2,
                               .num_replicas = 2,
                               .incarnation = c.incarnation,
                               .admission = c.admission};
    if (c.code != absl::StatusCode::kOk) {
      const absl::Status refused = d.Refused(caller);
      EXPECT_EQ(refused.code(), c.code) << refused;
      EXPECT_FALSE(d.Answered(holder));
      continue;
    }
    d.Arrive(1, 0, c.incarnation, 1, 2, 2, false, c.admission);
    EXPECT_EQ(d.Answered(holder), c.replaces);
    if (c.replaces) {
      EXPECT_EQ(d.Error(holder).code(), absl::StatusCode::kAborted);
    }
  }
}

TEST(ReplicaQuorumTest, AVoteNamesTheAdmissionItsQuorumWasFormedWith) {
  QuorumDriver d;
  d.Arrive(0, 0, 0, 0, 1, 2, false, 5);
  const QuorumFormed formed = d.Formed(d.Arrive(1, 0, 0, 0, 1, 2, false, 6));
  std::vector<QuorumAnswer> out;
  // Replica 1's slot changed hands: the old occupant's vote is refused.
  const absl::Status stale = d.quorum().Vote(formed.quorum_id, 1, 0, true, 4, 90,
                                             RdzvTime{} + seconds(10), &out);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_TRUE(out.empty());
  const QuorumWaiter v0 = d.Vote(formed.quorum_id, 0, true, 0, 5);
  const QuorumWaiter v1 = d.Vote(formed.quorum_id, 1, true, 0, /*admission=*/0);
  EXPECT_TRUE(d.Decision(v0).commit && d.Decision(v1).commit);
  // A voter whose answer was lost votes again: the same decision.
  EXPECT_TRUE(d.Decision(d.Vote(formed.quorum_id, 1, true, 0, 6)).commit);
}

}  // namespace
}  // namespace meshrun::rdzv
