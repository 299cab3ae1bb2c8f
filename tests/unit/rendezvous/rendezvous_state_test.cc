#include "rendezvous/core/rendezvous_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace meshrun::rdzv {
namespace {

using Kind = NodeEvent::Kind;

constexpr char kRun[] = "job";
const RdzvTime kT0{};

RunOptions Opts(uint32_t min_nodes, uint32_t max_nodes) {
  RunOptions o;
  o.min_nodes = min_nodes;
  o.max_nodes = max_nodes;
  o.last_call_timeout = Millis(1000);
  o.join_timeout = Millis(60000);
  o.keep_alive_interval = Millis(1000);
  o.keep_alive_max_attempt = 3;
  return o;
}

NodeInfo Node(const std::string& id, uint32_t nproc = 1, int32_t hint = -1) {
  return NodeInfo{id, "host-" + id, nproc, hint};
}

RdzvTime At(int64_t ms) { return kT0 + Millis(ms); }

std::vector<NodeEvent> Of(const std::vector<NodeEvent>& events, Kind kind) {
  std::vector<NodeEvent> out;
  for (const NodeEvent& e : events) {
    if (e.kind == kind) out.push_back(e);
  }
  return out;
}

std::vector<std::string> Ids(const std::vector<NodeEvent>& events) {
  std::vector<std::string> ids;
  for (const NodeEvent& e : events) ids.push_back(e.node_id);
  return ids;
}

// node id -> group rank, from kAssigned events.
std::map<std::string, uint32_t> Ranks(const std::vector<NodeEvent>& events) {
  std::map<std::string, uint32_t> ranks;
  for (const NodeEvent& e : Of(events, Kind::kAssigned)) {
    ranks[e.node_id] = e.assignment.group_rank;
  }
  return ranks;
}

// Checks what the kAssigned events of each completed round must satisfy: a
// round's events all come from the one call that completed it.
void ExpectConsistentAssignments(const std::vector<NodeEvent>& events) {
  std::map<uint64_t, std::vector<const NodeEvent*>> by_round;
  for (const NodeEvent& e : events) {
    if (e.kind == Kind::kAssigned) by_round[e.round].push_back(&e);
  }
  for (const auto& [round, group] : by_round) {
    const Assignment& first = group.front()->assignment;
    ASSERT_NE(first.roster, nullptr);
    const std::vector<ParticipantView>& roster = *first.roster;
    ASSERT_EQ(roster.size(), first.group_world_size);
    ASSERT_EQ(group.size(), first.group_world_size) << "round " << round;
    uint64_t base = 0;
    for (uint32_t r = 0; r < roster.size(); ++r) {
      EXPECT_EQ(roster[r].group_rank, r);
      EXPECT_EQ(roster[r].rank_base, base);
      base += roster[r].nproc;
    }
    EXPECT_EQ(first.world_size, base);
    std::vector<bool> seen(roster.size(), false);
    for (const NodeEvent* e : group) {
      const Assignment& a = e->assignment;
      EXPECT_EQ(a.round, round);
      EXPECT_EQ(a.roster, first.roster) << "roster is shared, not copied";
      EXPECT_EQ(a.world_size, first.world_size);
      EXPECT_EQ(a.restart_count, first.restart_count);
      // "<run>/e<epoch>.r<round>"
      const std::string prefix = absl::StrCat(e->run_id, "/e");
      const std::string suffix = absl::StrCat(".r", round);
      EXPECT_EQ(a.store_prefix.rfind(prefix, 0), 0u) << a.store_prefix;
      EXPECT_EQ(a.store_prefix.substr(a.store_prefix.size() - suffix.size()), suffix)
          << a.store_prefix;
      ASSERT_LT(a.group_rank, roster.size());
      EXPECT_FALSE(seen[a.group_rank]) << "rank " << a.group_rank << " twice";
      seen[a.group_rank] = true;
      EXPECT_EQ(roster[a.group_rank].node_id, e->node_id);
      EXPECT_EQ(a.rank_base, roster[a.group_rank].rank_base);
      if (a.group_world_size <= kMaxInlineParticipants) {
        ASSERT_EQ(a.participants.size(), roster.size());
        EXPECT_EQ(a.participants.back().node_id, roster.back().node_id);
      } else {
        EXPECT_TRUE(a.participants.empty());
      }
    }
  }
}

class RendezvousStateTest : public ::testing::Test {
 protected:
  absl::Status Join(const NodeInfo& node, RdzvTime now = kT0) {
    return Join(node, options_, now);
  }
  absl::Status Join(const NodeInfo& node, const RunOptions& options, RdzvTime now) {
    return state_.Join(kRun, node, options, now, &events_);
  }
  // Joins every node at `now`, expecting success.
  void JoinAll(const std::vector<NodeInfo>& nodes, RdzvTime now = kT0) {
    for (const NodeInfo& n : nodes) ASSERT_TRUE(Join(n, now).ok()) << n.node_id;
  }
  std::vector<NodeEvent> Take() { return std::exchange(events_, {}); }
  RunSummary Summary() { return *state_.Summary(kRun); }
  std::vector<std::string> ParticipantIds() {
    std::vector<std::string> ids;
    for (const ParticipantView& p : Summary().participants) {
      ids.push_back(p.node_id);
    }
    return ids;
  }

  RunOptions options_ = Opts(1, 4);
  RendezvousState state_;
  std::vector<NodeEvent> events_;
};

// ---------------------------------------------------------------------------
// Round completion

TEST_F(RendezvousStateTest, CompletesAsSoonAsMaxNodesJoined) {
  options_ = Opts(2, 3);
  options_.last_call_timeout = Millis(100000);
  JoinAll({Node("a"), Node("b")});
  auto events = Take();
  EXPECT_EQ(Ids(Of(events, Kind::kWaiting)), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(Of(events, Kind::kAssigned).empty());
  EXPECT_EQ(events[0].round, 1u) << "rounds start at 1";

  JoinAll({Node("c")}, At(5));
  events = Take();
  ExpectConsistentAssignments(events);
  ASSERT_EQ(Of(events, Kind::kAssigned).size(), 3u);
  EXPECT_EQ(Ranks(events),
            (std::map<std::string, uint32_t>{{"a", 0}, {"b", 1}, {"c", 2}}));
  const Assignment a = Of(events, Kind::kAssigned)[0].assignment;
  EXPECT_EQ(a.round, 1u);
  EXPECT_EQ(a.group_world_size, 3u);
  EXPECT_EQ(a.world_size, 3u);
  EXPECT_EQ(a.restart_count, 0u);
  EXPECT_EQ(a.store_prefix, "job/e1.r1");
  EXPECT_TRUE(Summary().round_active);
}

TEST_F(RendezvousStateTest, CompletesAtMinAfterLastCall) {
  options_ = Opts(2, 4);
  options_.last_call_timeout = Millis(1000);
  JoinAll({Node("a")}, At(0));
  JoinAll({Node("b")}, At(100));  // min reached: last call at 1100
  JoinAll({Node("c")}, At(600));  // does not extend the last call
  Take();
  state_.Tick(At(1099), &events_);
  EXPECT_TRUE(events_.empty());
  EXPECT_FALSE(Summary().round_active);
  state_.Tick(At(1100), &events_);
  EXPECT_EQ(Ranks(Take()),
            (std::map<std::string, uint32_t>{{"a", 0}, {"b", 1}, {"c", 2}}));
  EXPECT_TRUE(Summary().round_active);
}

TEST_F(RendezvousStateTest, ZeroLastCallCompletesAtMin) {
  options_ = Opts(2, 4);
  options_.last_call_timeout = Millis(0);
  JoinAll({Node("a")});
  EXPECT_TRUE(Of(Take(), Kind::kAssigned).empty());
  JoinAll({Node("b")});
  EXPECT_EQ(Of(Take(), Kind::kAssigned).size(), 2u);
}

TEST_F(RendezvousStateTest, LastCallCountsFromFirstReachingMin) {
  options_ = Opts(2, 4);
  options_.last_call_timeout = Millis(1000);
  JoinAll({Node("a"), Node("b")}, At(0));  // last call at 1000
  ASSERT_TRUE(state_.Leave(kRun, "b", At(200), &events_).ok());
  state_.Tick(At(1000), &events_);
  EXPECT_TRUE(Of(Take(), Kind::kAssigned).empty()) << "below min";
  // Min was first reached at 0; regaining it after 1000 completes at once.
  JoinAll({Node("c")}, At(1500));
  EXPECT_EQ(Of(Take(), Kind::kAssigned).size(), 2u);
}

TEST_F(RendezvousStateTest, JoinTimeoutDismissesGatheringNodes) {
  options_ = Opts(3, 4);
  options_.join_timeout = Millis(5000);
  options_.keep_alive_interval = Millis(10000);
  JoinAll({Node("a")}, At(0));
  JoinAll({Node("b")}, At(3000));
  Take();
  state_.Tick(At(4999), &events_);
  EXPECT_TRUE(events_.empty());
  state_.Tick(At(5000), &events_);
  auto events = Take();
  EXPECT_EQ(Ids(Of(events, Kind::kJoinTimeout)), (std::vector<std::string>{"a", "b"}));
  EXPECT_NE(events[0].detail.find("2 of the 3 nodes"), std::string::npos)
      << events[0].detail;
  RunSummary s = Summary();
  EXPECT_TRUE(s.waiting.empty());
  // Nobody is left: the run ends, and is forgotten after the retention.
  EXPECT_EQ(s.outcome, Outcome::kAborted);
  EXPECT_TRUE(state_.Heartbeat(kRun, "a", At(5001))->closed);
  EXPECT_FALSE(state_.NextDeadline().has_value());

  // A later join is a new incarnation with a new gathering clock.
  JoinAll({Node("c")}, At(9000));
  EXPECT_EQ(Take().at(0).round, 2u);
  EXPECT_FALSE(Summary().outcome.has_value());
  state_.Tick(At(13999), &events_);
  EXPECT_TRUE(Of(Take(), Kind::kJoinTimeout).empty());
  state_.Tick(At(14000), &events_);
  EXPECT_EQ(Ids(Of(Take(), Kind::kJoinTimeout)), (std::vector<std::string>{"c"}));
}

TEST_F(RendezvousStateTest, JoinTimeoutIgnoredOnceMinReached) {
  options_ = Opts(2, 4);
  options_.join_timeout = Millis(5000);
  options_.last_call_timeout = Millis(8000);
  options_.keep_alive_interval = Millis(100000);
  JoinAll({Node("a")}, At(0));
  JoinAll({Node("b")}, At(1000));  // last call at 9000
  state_.Tick(At(5000), &events_);
  EXPECT_TRUE(Of(Take(), Kind::kJoinTimeout).empty());
  state_.Tick(At(9000), &events_);
  EXPECT_EQ(Of(Take(), Kind::kAssigned).size(), 2u);
}

// ---------------------------------------------------------------------------
// Rank assignment

struct RankCase {
  const char* name;
  std::vector<NodeInfo> joins;  // in order; the round completes at the last
  std::map<std::string, uint32_t> ranks;
};

TEST_F(RendezvousStateTest, RankAssignmentTable) {
  const std::vector<RankCase> cases = {
      {"join order", {Node("x"), Node("b"), Node("a")}, {{"x", 0}, {"b", 1}, {"a", 2}}},
      {"hints honoured",
       {Node("a", 1, 2), Node("b", 1, 0), Node("c", 1, 1)},
       {{"a", 2}, {"b", 0}, {"c", 1}}},
      {"hints then join order",
       {Node("a"), Node("b", 1, 0), Node("c")},
       {{"a", 1}, {"b", 0}, {"c", 2}}},
      {"hint beyond group size falls back",
       {Node("a", 1, 5), Node("b"), Node("c")},
       {{"a", 0}, {"b", 1}, {"c", 2}}},
  };
  for (const RankCase& c : cases) {
    SCOPED_TRACE(c.name);
    RendezvousState state;
    std::vector<NodeEvent> events;
    RunOptions o = Opts(1, 8);
    o.last_call_timeout = Millis(10);
    for (const NodeInfo& n : c.joins) {
      ASSERT_TRUE(state.Join("r", n, o, kT0, &events).ok());
    }
    state.Tick(At(10), &events);
    EXPECT_EQ(Ranks(events), c.ranks);
    ExpectConsistentAssignments(events);
  }
}

TEST_F(RendezvousStateTest, AssignmentIsDeterministic) {
  auto run = [](uint32_t seed) {
    RendezvousState state;
    std::vector<NodeEvent> events;
    RunOptions o = Opts(1, 50);
    std::mt19937 rng(seed);
    for (int i = 0; i < 50; ++i) {
      int32_t hint = (i % 7 == 0) ? i : -1;
      EXPECT_TRUE(
          state
              .Join("r", Node(absl::StrCat("n", i), 1 + rng() % 4, hint), o, kT0, &events)
              .ok());
    }
    return Ranks(events);
  };
  EXPECT_EQ(run(1), run(1));
  auto ranks = run(7);
  EXPECT_EQ(ranks.size(), 50u);
  EXPECT_EQ(ranks["n14"], 14u);
  EXPECT_EQ(ranks["n1"], 1u) << "first unhinted node fills slot 1 after n0's 0";
}

TEST_F(RendezvousStateTest, ASharedHintGoesToTheFirstAndTheOtherIsPlacedWithout) {
  // torchrun's users start every node with --node_rank=0 (torchrun ignores
  // it outside the static backend): both join, the first keeps the slot.
  options_ = Opts(3, 3);
  JoinAll({Node("a", 1, 1), Node("b", 1, 1), Node("c", 1, 1)});
  auto assigned = Of(Take(), Kind::kAssigned);
  ExpectConsistentAssignments(assigned);
  EXPECT_EQ(Ranks(assigned),
            (std::map<std::string, uint32_t>{{"a", 1}, {"b", 0}, {"c", 2}}));
}

TEST_F(RendezvousStateTest, HeterogeneousNprocGivesPrefixSums) {
  options_ = Opts(3, 3);
  JoinAll({Node("a", 4), Node("b", 2), Node("c", 8)});
  auto assigned = Of(Take(), Kind::kAssigned);
  ExpectConsistentAssignments(assigned);
  ASSERT_EQ(assigned.size(), 3u);
  std::map<std::string, uint32_t> base;
  for (const auto& e : assigned) base[e.node_id] = e.assignment.rank_base;
  EXPECT_EQ(base, (std::map<std::string, uint32_t>{{"a", 0}, {"b", 4}, {"c", 6}}));
  const Assignment& a = assigned[0].assignment;
  EXPECT_EQ(a.world_size, 14u);
  ASSERT_EQ(a.participants.size(), 3u);
  EXPECT_EQ(a.participants[2].node_id, "c");
  EXPECT_EQ(a.participants[2].nproc, 8u);
  EXPECT_EQ(a.participants[2].rank_base, 6u);
  EXPECT_EQ(a.participants[2].host, "host-c");
}

TEST_F(RendezvousStateTest, UniformNprocRefusesADifferentCount) {
  options_.uniform_nproc = true;
  JoinAll({Node("a", 4)});
  absl::Status s = Join(Node("b", 8));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("nproc 4"), std::string::npos) << s;
  EXPECT_NE(s.message().find("asked for 8"), std::string::npos) << s;
  EXPECT_TRUE(Join(Node("c", 4)).ok());
}

TEST_F(RendezvousStateTest, StickyRanksKeepRankZeroWhenMembershipChanges) {
  options_ = Opts(1, 4);
  options_.last_call_timeout = Millis(0);
  // Round 1 forms with a alone (min 1, no last call), then b, c, d scale up.
  JoinAll({Node("a"), Node("b"), Node("c")});
  EXPECT_EQ(Ranks(Take()),
            (std::map<std::string, uint32_t>{{"a", 0}, {"b", 1}, {"c", 2}}));
  // b leaves: a keeps 0; c's old rank 2 no longer fits, so it takes 1.
  ASSERT_TRUE(state_.Leave(kRun, "b", At(1), &events_).ok());
  EXPECT_EQ(Ranks(Take()), (std::map<std::string, uint32_t>{{"a", 0}, {"c", 1}}));
  // d joins: a and c keep theirs, d takes the free slot.
  JoinAll({Node("d")}, At(2));
  EXPECT_EQ(Ranks(Take()),
            (std::map<std::string, uint32_t>{{"a", 0}, {"c", 1}, {"d", 2}}));
  // The old rank 0 leaving: the others keep theirs where they fit.
  ASSERT_TRUE(state_.Leave(kRun, "a", At(3), &events_).ok());
  EXPECT_EQ(Ranks(Take()), (std::map<std::string, uint32_t>{{"c", 1}, {"d", 0}}));
}

TEST_F(RendezvousStateTest, HintBeatsStickiness) {
  options_ = Opts(2, 3);
  options_.last_call_timeout = Millis(0);
  JoinAll({Node("a"), Node("b")});
  Take();
  JoinAll({Node("c", 1, 0)}, At(1));  // scale-up; c claims rank 0
  EXPECT_EQ(Ranks(Take()),
            (std::map<std::string, uint32_t>{{"a", 2}, {"b", 1}, {"c", 0}}));
}

// ---------------------------------------------------------------------------
// Input checks

TEST_F(RendezvousStateTest, MismatchedOptionsListEveryDifference) {
  options_ = Opts(2, 4);
  JoinAll({Node("a")});
  RunOptions other = options_;
  other.min_nodes = 3;
  other.max_nodes = 5;
  other.last_call_timeout = Millis(250);
  other.uniform_nproc = true;
  other.replica_size = 1;
  absl::Status s = Join(Node("b"), other, kT0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "run job was started with different options: min_nodes: run has "
            "2, node asked for 3; max_nodes: run has 4, node asked for 5; "
            "last_call_timeout: run has 1000ms, node asked for 250ms; "
            "uniform_nproc: run has false, node asked for true; restart scope: run "
            "has job, node asked for replica (groups of 1 workers)");
}

TEST_F(RendezvousStateTest, InvalidInputIsRefused) {
  struct Case {
    const char* name;
    std::string run_id;
    NodeInfo node;
    RunOptions options;
    const char* message_part;
  };
  auto opts = [](auto mutate) {
    RunOptions o = Opts(1, 4);
    mutate(o);
    return o;
  };
  const std::string long_id(257, 'x');
  const std::vector<Case> cases = {
      {"empty run", "", Node("a"), Opts(1, 4), "run_id must not be empty"},
      {"empty node", "r", Node(""), Opts(1, 4), "node_id must not be empty"},
      {"long run", long_id, Node("a"), Opts(1, 4), "run_id is 257 bytes"},
      {"long node", "r", Node(long_id), Opts(1, 4), "node_id is 257 bytes"},
      {"long host", "r", NodeInfo{"a", long_id, 1, -1}, Opts(1, 4), "host is 257 bytes"},
      {"nproc 0", "r", Node("a", 0), Opts(1, 4), "nproc must be at least 1"},
      {"nproc big", "r", Node("a", 65537), Opts(1, 4), "nproc 65537"},
      {"replica size", "r", Node("a", 4), opts([](RunOptions& o) { o.replica_size = 3; }),
       "nproc 4 is not a multiple of the replica size 3"},
      {"max 0", "r", Node("a"), opts([](RunOptions& o) { o.max_nodes = 0; }),
       "max_nodes must be at least 1"},
      {"max big", "r", Node("a"), opts([](RunOptions& o) { o.max_nodes = 100001; }),
       "max_nodes 100001"},
      {"min 0", "r", Node("a"), opts([](RunOptions& o) { o.min_nodes = 0; }),
       "min_nodes must be at least 1"},
      {"min > max", "r", Node("a"), Opts(3, 2),
       "min_nodes (3) must not exceed max_nodes (2)"},
      {"keep alive 0", "r", Node("a"),
       opts([](RunOptions& o) { o.keep_alive_interval = Millis(0); }),
       "keep_alive_interval must be positive"},
      {"attempts 0", "r", Node("a"),
       opts([](RunOptions& o) { o.keep_alive_max_attempt = 0; }),
       "keep_alive_max_attempt must be at least 1"},
      {"lease overflow", "r", Node("a"),
       opts([](RunOptions& o) { o.keep_alive_max_attempt = 4000000000u; }),
       "keep_alive_interval * keep_alive_max_attempt"},
      {"negative last call", "r", Node("a"),
       opts([](RunOptions& o) { o.last_call_timeout = Millis(-1); }),
       "last_call_timeout must be non-negative"},
      {"join timeout 0", "r", Node("a"),
       opts([](RunOptions& o) { o.join_timeout = Millis(0); }),
       "join_timeout must be positive"},
      {"hint >= max", "r", Node("a", 1, 4), Opts(1, 4),
       "node_rank_hint 4 must be below max_nodes (4)"},
      {"hint < -1", "r", Node("a", 1, -2), Opts(1, 4), "node_rank_hint must"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RendezvousState state;
    std::vector<NodeEvent> events;
    absl::Status s = state.Join(c.run_id, c.node, c.options, kT0, &events);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(c.message_part), std::string::npos) << s;
    EXPECT_TRUE(events.empty());
    EXPECT_TRUE(state.RunIds().empty()) << "no run created by a bad join";
  }
}

TEST_F(RendezvousStateTest, WorldSizeBeyondInt32IsRefused) {
  options_ = Opts(1, 40000);
  options_.last_call_timeout = Millis(100000);
  // 32767 * 65536 = 2^31 - 65536 fits; one more node of 65536 does not.
  for (int i = 0; i < 32767; ++i) {
    ASSERT_TRUE(
        state_.Join(kRun, Node(absl::StrCat(i), 65536), options_, kT0, &events_).ok());
  }
  absl::Status s = state_.Join(kRun, Node("last", 65536), options_, kT0, &events_);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(state_.Join(kRun, Node("small", 1), options_, kT0, &events_).ok());
}

TEST_F(RendezvousStateTest, UnknownRunOrNodeIsNotFound) {
  EXPECT_EQ(state_.Heartbeat("nope", "a", kT0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.Leave("nope", "a", kT0, &events_).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.ReportFailure("nope", "a", 1, "", kT0, &events_).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.ReportSuccess("nope", "a", 1, kT0, &events_).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.Close("nope", Outcome::kAborted, "", kT0, &events_).code(),
            absl::StatusCode::kNotFound);
  JoinAll({Node("a")});
  EXPECT_EQ(state_.Heartbeat(kRun, "zz", kT0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.Leave(kRun, "zz", kT0, &events_).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(state_.Summary("nope").has_value());
}

// ---------------------------------------------------------------------------
// Scale-up and waiting

TEST_F(RendezvousStateTest, JoinDuringActiveRoundScalesUp) {
  options_ = Opts(2, 4);
  options_.last_call_timeout = Millis(0);
  JoinAll({Node("a"), Node("b")});
  Take();
  JoinAll({Node("c")}, At(10));
  auto events = Take();
  ExpectConsistentAssignments(events);
  // c is told it waits for round 2, a and b to re-form, then all three run.
  ASSERT_GE(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kWaiting);
  EXPECT_EQ(events[0].node_id, "c");
  EXPECT_EQ(events[0].round, 2u);
  auto reforms = Of(events, Kind::kReform);
  EXPECT_EQ(Ids(reforms), (std::vector<std::string>{"a", "b"}));
  for (const auto& e : reforms) {
    EXPECT_EQ(e.reason, ReformReason::kNodesWaiting);
    EXPECT_EQ(e.round, 2u);
  }
  EXPECT_EQ(Ranks(events),
            (std::map<std::string, uint32_t>{{"a", 0}, {"b", 1}, {"c", 2}}));
  EXPECT_EQ(Of(events, Kind::kAssigned)[0].assignment.round, 2u);
  EXPECT_EQ(Of(events, Kind::kAssigned)[0].assignment.restart_count, 0u)
      << "scale-up is not a restart";
}

TEST_F(RendezvousStateTest, FullRunMakesNewNodesWaitWithoutReform) {
  options_ = Opts(2, 2);
  JoinAll({Node("a"), Node("b")});
  Take();
  JoinAll({Node("c"), Node("d")}, At(10));
  auto events = Take();
  EXPECT_EQ(Ids(events), (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(Of(events, Kind::kWaiting).size(), 2u);
  RunSummary s = Summary();
  EXPECT_EQ(s.round, 1u);
  EXPECT_TRUE(s.round_active);
  EXPECT_EQ(s.waiting, (std::vector<std::string>{"c", "d"}));

  // b expires: the round re-forms with a and the first waiter, c.
  for (int64_t t = 1000; t <= 3000; t += 1000) {
    ASSERT_TRUE(state_.Heartbeat(kRun, "a", At(t)).ok());
    ASSERT_TRUE(state_.Heartbeat(kRun, "c", At(t)).ok());
    ASSERT_TRUE(state_.Heartbeat(kRun, "d", At(t)).ok());
  }
  state_.Tick(At(3000), &events_);
  events = Take();
  EXPECT_EQ(Ids(Of(events, Kind::kReform)), (std::vector<std::string>{"a"}));
  EXPECT_EQ(Of(events, Kind::kReform)[0].reason, ReformReason::kNodeExpired);
  EXPECT_EQ(Ranks(events), (std::map<std::string, uint32_t>{{"a", 0}, {"c", 1}}));
  EXPECT_EQ(Summary().waiting, (std::vector<std::string>{"d"}));
}

TEST_F(RendezvousStateTest, NoScaleUpOnceAParticipantSucceeded) {
  options_ = Opts(1, 4);
  options_.last_call_timeout = Millis(0);
  JoinAll({Node("a"), Node("b")});
  // a is alone in round 1 (min 1, no last call); b's join scaled it to round 2.
  ASSERT_EQ(Summary().round, 2u);
  ASSERT_TRUE(state_.ReportSuccess(kRun, "a", 2, At(1), &events_).ok());
  Take();
  JoinAll({Node("c")}, At(2));
  EXPECT_EQ(Ids(Take()), (std::vector<std::string>{"c"}));
  ASSERT_TRUE(state_.ReportSuccess(kRun, "b", 2, At(3), &events_).ok());
  auto closed = Of(Take(), Kind::kClosed);
  EXPECT_EQ(Ids(closed), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(closed[2].outcome, Outcome::kAborted) << "c ran nothing";
}

// ---------------------------------------------------------------------------
// Expiry and leave

TEST_F(RendezvousStateTest, ExpiredParticipantReformsTheOthers) {
  options_ = Opts(2, 3);  // lease 3000ms
  JoinAll({Node("a"), Node("b"), Node("c")});
  Take();
  EXPECT_EQ(state_.NextDeadline(), At(3000));
  ASSERT_TRUE(state_.Heartbeat(kRun, "a", At(2000)).ok());
  ASSERT_TRUE(state_.Heartbeat(kRun, "c", At(2000)).ok());
  state_.Tick(At(2999), &events_);
  EXPECT_TRUE(events_.empty());
  state_.Tick(At(3000), &events_);
  auto events = Take();
  EXPECT_EQ(Ids(Of(events, Kind::kReform)), (std::vector<std::string>{"a", "c"}));
  const NodeEvent reform = Of(events, Kind::kReform)[0];
  EXPECT_EQ(reform.reason, ReformReason::kNodeExpired);
  EXPECT_NE(reform.detail.find("node b on host host-b"), std::string::npos);
  for (const auto& e : events) EXPECT_NE(e.node_id, "b");
  EXPECT_EQ(Ranks(events), (std::map<std::string, uint32_t>{{"a", 0}, {"c", 1}}));
  EXPECT_EQ(Summary().restart_count, 0u) << "expiry is not a worker failure";
  EXPECT_EQ(state_.Heartbeat(kRun, "b", At(3001)).status().code(),
            absl::StatusCode::kNotFound);
}

// A participant expired for a stall (SIGSTOP, a VM pause) whose agent comes
// back rejoins: its workers restart, so the run counts a restart.
TEST_F(RendezvousStateTest, ExpelledParticipantRejoiningCountsARestart) {
  options_ = Opts(2, 2);  // lease 3000ms
  options_.max_restarts = 1;
  JoinAll({Node("a"), Node("b")});
  Take();
  ASSERT_TRUE(state_.Heartbeat(kRun, "a", At(2000)).ok());
  state_.Tick(At(3000), &events_);  // b expelled, a gathers alone
  Take();
  EXPECT_EQ(Summary().restart_count, 0u);
  JoinAll({Node("b")}, At(3100));
  auto events = Take();
  EXPECT_EQ(Ranks(events), (std::map<std::string, uint32_t>{{"a", 0}, {"b", 1}}));
  EXPECT_EQ(Of(events, Kind::kAssigned)[0].assignment.restart_count, 1u);
  EXPECT_NE(Summary().last_failure.find("node b on host host-b was expelled"),
            std::string::npos)
      << Summary().last_failure;
  // Counted once: a second, ordinary re-join of b is not a restart.
  ASSERT_TRUE(state_.Heartbeat(kRun, "a", At(3200)).ok());
  EXPECT_EQ(Summary().restart_count, 1u);
}

TEST_F(RendezvousStateTest, ExpelledParticipantRejoiningPastTheBudgetFailsTheRun) {
  options_ = Opts(2, 2);
  options_.max_restarts = 0;
  JoinAll({Node("a"), Node("b")});
  Take();
  ASSERT_TRUE(state_.Heartbeat(kRun, "a", At(2000)).ok());
  state_.Tick(At(3000), &events_);
  Take();
  JoinAll({Node("b")}, At(3100));
  auto events = Take();
  ASSERT_EQ(Ids(Of(events, Kind::kClosed)), (std::vector<std::string>{"a", "b"}));
  for (const NodeEvent& e : Of(events, Kind::kClosed)) {
    EXPECT_EQ(e.outcome, Outcome::kFailed) << e.node_id;
    EXPECT_NE(e.detail.find("was expelled"), std::string::npos) << e.detail;
  }
  EXPECT_EQ(Summary().outcome, Outcome::kFailed);
}

TEST_F(RendezvousStateTest, ExpelledNodesSurviveEncodeAndRestore) {
  options_ = Opts(2, 2);
  options_.max_restarts = 1;
  JoinAll({Node("a"), Node("b")});
  ASSERT_TRUE(state_.Heartbeat(kRun, "a", At(2000)).ok());
  state_.Tick(At(3000), &events_);
  Take();
  RendezvousState restored;
  ASSERT_TRUE(restored.RestoreRun(*state_.EncodeRun(kRun, At(3000)), At(3000)).ok());
  ASSERT_TRUE(restored.Join(kRun, Node("a"), options_, At(3050), &events_).ok());
  ASSERT_TRUE(restored.Join(kRun, Node("b"), options_, At(3100), &events_).ok());
  EXPECT_EQ(restored.Summary(kRun)->restart_count, 1u);
}

TEST_F(RendezvousStateTest, ExpiredGatheringNodeIsJustRemoved) {
  options_ = Opts(3, 3);
  JoinAll({Node("a")}, At(0));
  JoinAll({Node("b")}, At(2000));
  Take();
  state_.Tick(At(3000), &events_);
  EXPECT_TRUE(Take().empty());
  EXPECT_EQ(Summary().waiting, (std::vector<std::string>{"b"}));
}

TEST_F(RendezvousStateTest, LeaveOfParticipantReformsAtOnceWhenMinRemains) {
  options_ = Opts(2, 3);
  JoinAll({Node("a"), Node("b"), Node("c")});
  Take();
  ASSERT_TRUE(state_.Leave(kRun, "a", At(5), &events_).ok());
  auto events = Take();
  EXPECT_EQ(Ids(Of(events, Kind::kReform)), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(Of(events, Kind::kReform)[0].reason, ReformReason::kNodeLeft);
  EXPECT_EQ(Ranks(events), (std::map<std::string, uint32_t>{{"b", 1}, {"c", 0}}));
  EXPECT_EQ(Summary().round, 2u);
}

TEST_F(RendezvousStateTest, LeaveBelowMinGathersAndTimesOut) {
  options_ = Opts(2, 3);
  options_.keep_alive_interval = Millis(100000);
  options_.join_timeout = Millis(5000);
  JoinAll({Node("a"), Node("b"), Node("c")});
  ASSERT_TRUE(state_.Leave(kRun, "a", At(10), &events_).ok());
  Take();  // round 2: b, c
  ASSERT_TRUE(state_.Leave(kRun, "b", At(20), &events_).ok());
  auto events = Take();
  EXPECT_EQ(Ids(events), (std::vector<std::string>{"c"}));
  EXPECT_EQ(events[0].kind, Kind::kReform);
  EXPECT_EQ(events[0].round, 3u);
  EXPECT_FALSE(Summary().round_active);
  EXPECT_EQ(Summary().waiting, (std::vector<std::string>{"c"}));
  // Alone below min: the re-formed round gathers with join_timeout from the
  // re-form moment.
  EXPECT_EQ(state_.NextDeadline(), At(5020));
  state_.Tick(At(5020), &events_);
  EXPECT_EQ(Ids(Of(Take(), Kind::kJoinTimeout)), (std::vector<std::string>{"c"}));
}

TEST_F(RendezvousStateTest, ReformBelowMinCompletesOnJoinAndLastCall) {
  options_ = Opts(2, 3);
  options_.keep_alive_interval = Millis(100000);
  options_.last_call_timeout = Millis(1000);
  JoinAll({Node("a"), Node("b"), Node("c")});
  ASSERT_TRUE(state_.Leave(kRun, "a", At(10), &events_).ok());
  ASSERT_TRUE(state_.Leave(kRun, "b", At(20), &events_).ok());
  Take();
  JoinAll({Node("d")}, At(100));
  EXPECT_TRUE(Of(Take(), Kind::kAssigned).empty());
  state_.Tick(At(1100), &events_);
  EXPECT_EQ(Ranks(Take()), (std::map<std::string, uint32_t>{{"c", 0}, {"d", 1}}));
}

TEST_F(RendezvousStateTest, LeaveOfWaitingOrGatheringNodeEmitsNothing) {
  options_ = Opts(2, 2);
  JoinAll({Node("a")});
  ASSERT_TRUE(state_.Leave(kRun, "a", kT0, &events_).ok());
  Take();
  JoinAll({Node("b"), Node("c"), Node("d")});
  Take();
  ASSERT_TRUE(state_.Leave(kRun, "d", At(1), &events_).ok());
  EXPECT_TRUE(events_.empty());
  EXPECT_TRUE(Summary().waiting.empty());
  EXPECT_EQ(Summary().round, 1u);
  EXPECT_EQ(state_.Leave(kRun, "d", At(2), &events_).code(), absl::StatusCode::kNotFound);
}

TEST_F(RendezvousStateTest, RunWithNoLiveNodeEndsOneLeaseLater) {
  options_ = Opts(1, 1);  // lease 3000 ms
  JoinAll({Node("a")});
  Take();
  ASSERT_TRUE(state_.Leave(kRun, "a", At(1), &events_).ok());
  EXPECT_TRUE(Take().empty());
  RunSummary s = Summary();
  EXPECT_FALSE(s.outcome.has_value()) << "a reconnecting agent gets its lease";
  EXPECT_EQ(s.round, 2u);
  EXPECT_EQ(state_.Status(At(1)).at(0).state, "abandoned");
  EXPECT_EQ(state_.NextDeadline(), At(3001));
  state_.Tick(At(3000), &events_);
  EXPECT_FALSE(Summary().outcome.has_value());
  state_.Tick(At(3001), &events_);
  EXPECT_TRUE(Take().empty()) << "nobody left to tell";
  EXPECT_EQ(Summary().outcome, Outcome::kAborted);
  RunStatusRecord status = state_.Status(At(3001)).at(0);
  EXPECT_EQ(status.state, "closed");
  EXPECT_NE(status.closed_reason.find("no live node"), std::string::npos)
      << status.closed_reason;
  // Forgotten after the retention like any ended run.
  EXPECT_EQ(state_.ForgetClosedBefore(At(3002)), (std::vector<std::string>{"job"}));
}

TEST_F(RendezvousStateTest, ExpiredNodesEndTheRunAndAJoinInTimeKeepsItGoing) {
  options_ = Opts(2, 2);      // lease 3000 ms
  options_.max_restarts = 1;  // an expelled participant's return is a restart
  JoinAll({Node("a"), Node("b")});
  Take();
  state_.Tick(At(3000), &events_);  // both expire
  EXPECT_FALSE(Summary().outcome.has_value());
  // A node back within the lease keeps the run; the timer is disarmed.
  JoinAll({Node("a")}, At(5000));
  EXPECT_EQ(Summary().round, 2u);
  state_.Tick(At(6001), &events_);
  EXPECT_FALSE(Summary().outcome.has_value());
  // Then it expires too, and the run ends one lease after that.
  state_.Tick(At(8000), &events_);
  EXPECT_FALSE(Summary().outcome.has_value());
  state_.Tick(At(11000), &events_);
  EXPECT_EQ(Summary().outcome, Outcome::kAborted);
}

// a and b gather (min 2) and the join deadline passes at 5000 while the last
// call (at 9000) is pending.
class PassedJoinDeadlineTest : public RendezvousStateTest {
 protected:
  void SetUp() override {
    options_ = Opts(2, 4);
    options_.join_timeout = Millis(5000);
    options_.last_call_timeout = Millis(8000);
    options_.keep_alive_interval = Millis(100000);
    JoinAll({Node("a")}, At(0));
    JoinAll({Node("b")}, At(1000));
    state_.Tick(At(5000), &events_);
    EXPECT_TRUE(Of(Take(), Kind::kJoinTimeout).empty());
  }
};

TEST_F(PassedJoinDeadlineTest, RoundDroppingBelowMinTimesOutAtOnce) {
  // b leaves before the last call: below min with no join time left, a is
  // told at once instead of waiting with no timer.
  ASSERT_TRUE(state_.Leave(kRun, "b", At(6000), &events_).ok());
  auto events = Take();
  EXPECT_EQ(Ids(Of(events, Kind::kJoinTimeout)), (std::vector<std::string>{"a"}));
  EXPECT_EQ(Summary().outcome, Outcome::kAborted);
}

TEST_F(PassedJoinDeadlineTest, NewJoinDeadlineClearsIt) {
  // The round empties; the next join arms a fresh join timeout.
  ASSERT_TRUE(state_.Leave(kRun, "a", At(5500), &events_).ok());
  ASSERT_TRUE(state_.Leave(kRun, "b", At(5600), &events_).ok());
  Take();
  JoinAll({Node("c"), Node("d")}, At(6000));
  ASSERT_TRUE(state_.Leave(kRun, "d", At(6500), &events_).ok());
  EXPECT_TRUE(Of(Take(), Kind::kJoinTimeout).empty());
  state_.Tick(At(11000), &events_);
  EXPECT_EQ(Ids(Of(Take(), Kind::kJoinTimeout)), (std::vector<std::string>{"c"}));
}

// ---------------------------------------------------------------------------
// Failure, success, close

TEST_F(RendezvousStateTest, FailureRestartsOncePerRoundJobGlobally) {
  options_ = Opts(3, 3);
  options_.max_restarts = 3;
  JoinAll({Node("a"), Node("b"), Node("c")});
  Take();
  auto v = state_.ReportFailure(kRun, "b", 1, "rank 1 exited with 1", At(1), &events_);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->will_restart);
  EXPECT_EQ(v->restart_count, 1u);
  auto events = Take();
  ExpectConsistentAssignments(events);
  auto reforms = Of(events, Kind::kReform);
  EXPECT_EQ(Ids(reforms), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(reforms[0].reason, ReformReason::kWorkerFailure);
  EXPECT_EQ(reforms[0].detail, "rank 1 exited with 1");
  EXPECT_EQ(reforms[0].round, 2u);
  auto assigned = Of(events, Kind::kAssigned);
  ASSERT_EQ(assigned.size(), 3u);
  EXPECT_EQ(assigned[0].assignment.restart_count, 1u);
  EXPECT_EQ(Ranks(events),
            (std::map<std::string, uint32_t>{{"a", 0}, {"b", 1}, {"c", 2}}));

  // The other nodes saw the same failure: no second restart.
  for (const char* node : {"a", "c"}) {
    v = state_.ReportFailure(kRun, node, 1, "peer died", At(2), &events_);
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(v->will_restart);
    EXPECT_EQ(v->restart_count, 1u);
  }
  EXPECT_TRUE(Take().empty());
  EXPECT_EQ(Summary().last_failure, "rank 1 exited with 1");
  EXPECT_EQ(Summary().restart_count, 1u);

  // A failure in round 2 counts again.
  v = state_.ReportFailure(kRun, "a", 2, "oom", At(3), &events_);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->restart_count, 2u);
  EXPECT_EQ(Summary().last_failure, "oom");
}

// Restart scope "replica" (issue 18): the group restarts alone; the run
// keeps its round and its nodes hear nothing.
TEST_F(RendezvousStateTest, ReplicaFailureCountsARestartWithoutReforming) {
  options_ = Opts(2, 2);
  options_.max_restarts = 3;
  options_.replica_size = 1;
  JoinAll({Node("a", 2), Node("b", 2)});
  Take();
  auto v =
      state_.ReportReplicaFailure(kRun, "b", 1, 3, 0, "rank 3 exited 1", At(1), &events_);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->will_restart);
  EXPECT_TRUE(v->counted);
  EXPECT_EQ(v->restart_count, 1u);
  EXPECT_TRUE(Take().empty());
  EXPECT_EQ(Summary().round, 1u);
  EXPECT_TRUE(Summary().round_active);
  EXPECT_EQ(Summary().restart_count, 1u);
  EXPECT_EQ(Summary().last_failure, "rank 3 exited 1");
  EXPECT_EQ(state_.stats().replica_restarts, 1u);
  EXPECT_EQ(state_.stats().reforms[static_cast<size_t>(ReformReason::kWorkerFailure)],
            0u);
  // The retried report of that incarnation does not count again; the next
  // incarnation's failure, and another group's, do.
  v = state_.ReportReplicaFailure(kRun, "b", 1, 3, 0, "rank 3 exited 1", At(2), &events_);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->will_restart);
  EXPECT_FALSE(v->counted);
  EXPECT_EQ(v->restart_count, 1u);
  v = state_.ReportReplicaFailure(kRun, "b", 1, 3, 1, "again", At(3), &events_);
  EXPECT_EQ(v->restart_count, 2u);
  v = state_.ReportReplicaFailure(kRun, "a", 1, 0, 0, "rank 0", At(4), &events_);
  EXPECT_EQ(v->restart_count, 3u);
  // Without an incarnation, every report counts: the budget (3) is spent.
  v = state_.ReportReplicaFailure(kRun, "a", 1, 0, std::nullopt, "rank 0 again", At(5),
                                  &events_);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->will_restart);
  EXPECT_TRUE(v->counted);
  EXPECT_EQ(v->restart_count, 4u);
  auto closed = Of(Take(), Kind::kClosed);
  EXPECT_EQ(Ids(closed), (std::vector<std::string>{"a", "b"}));
  for (const auto& e : closed) {
    EXPECT_EQ(e.outcome, Outcome::kFailed);
    EXPECT_EQ(e.detail, "rank 0 again");
  }
  // After the close, a report is told so.
  v = state_.ReportReplicaFailure(kRun, "b", 1, 2, 0, "late", At(6), &events_);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->will_restart);
}

TEST_F(RendezvousStateTest, ReplicaFailureOutOfRangeOrStaleDoesNotCount) {
  options_ = Opts(2, 2);
  options_.max_restarts = 3;
  options_.replica_size = 1;
  JoinAll({Node("a", 2), Node("b", 2)});
  Take();
  auto v = state_.ReportReplicaFailure(kRun, "a", 1, 4, 0, "", At(1), &events_);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("failure.replica: 4 is not one of node a's"),
            std::string::npos)
      << v.status();
  EXPECT_EQ(Summary().restart_count, 0u);
  // A round the run has left behind.
  ASSERT_TRUE(state_.ReportFailure(kRun, "a", 1, "job-wide", At(2), &events_).ok());
  Take();
  v = state_.ReportReplicaFailure(kRun, "b", 1, 2, 0, "", At(3), &events_);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->will_restart);
  EXPECT_FALSE(v->counted);
  EXPECT_EQ(Summary().restart_count, 1u);
  // A retry guard of round 1 does not carry into round 2.
  v = state_.ReportReplicaFailure(kRun, "b", 2, 2, 0, "", At(4), &events_);
  EXPECT_TRUE(v->counted);
  v = state_.ReportReplicaFailure(kRun, "b", 2, 2, 0, "", At(5), &events_);
  EXPECT_FALSE(v->counted);
  // Unknown nodes and runs, as for ReportFailure.
  EXPECT_EQ(state_.ReportReplicaFailure(kRun, "zz", 2, 0, 0, "", At(6), &events_)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.ReportReplicaFailure("nope", "a", 2, 0, 0, "", At(6), &events_)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  // The default root cause names the group.
  v = state_.ReportReplicaFailure(kRun, "a", 2, 1, 0, "", At(7), &events_);
  EXPECT_NE(Summary().last_failure.find("replica group 1"), std::string::npos)
      << Summary().last_failure;
}

TEST_F(RendezvousStateTest, CountedReplicaFailuresSurviveEncodeAndRestore) {
  options_ = Opts(1, 1);
  options_.max_restarts = 5;
  options_.replica_size = 2;
  JoinAll({Node("a", 4)});
  ASSERT_TRUE(state_.ReportReplicaFailure(kRun, "a", 1, 1, 0, "x", At(1), &events_).ok());
  RendezvousState restored;
  ASSERT_TRUE(restored.RestoreRun(*state_.EncodeRun(kRun, At(2)), At(2)).ok());
  EXPECT_EQ(restored.Summary(kRun)->restart_count, 1u);
  // The restart scope came back too: a node of the other scope is refused.
  RunOptions job_scope = options_;
  job_scope.replica_size = 0;
  absl::Status s = restored.Join(kRun, Node("b", 4), job_scope, At(2), &events_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  // The agent retries its report against the restarted daemon: counted once.
  auto v = restored.ReportReplicaFailure(kRun, "a", 1, 1, 0, "x", At(3), &events_);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->counted);
  EXPECT_EQ(v->restart_count, 1u);
}

// A replica failure names one of the reporting node's own groups (its
// ranks / replica size): a group id past the number of groups, or another
// node's, would make the step quorum wait for a group that is not
// restarting (issue 27).
TEST_F(RendezvousStateTest, ReplicaFailureNamesOneOfTheReportingNodesGroups) {
  struct Case {
    std::string node;
    uint32_t replica;
    bool accepted;
  };
  // Groups of 2: a holds ranks 0..1 (group 0), b ranks 2..5 (groups 1, 2).
  const std::vector<Case> cases{
      {"a", 0, true},  {"a", 1, false}, {"b", 0, false}, {"b", 1, true},
      {"b", 2, true},  {"b", 3, false},  // below the world size (6), past the groups (3)
      {"b", 5, false}, {"a", 6, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.node + " reports replica " + std::to_string(c.replica));
    RendezvousState state;
    RunOptions options = Opts(2, 2);
    options.max_restarts = 10;
    options.replica_size = 2;
    for (const NodeInfo& node : {Node("a", 2), Node("b", 4)})
      ASSERT_TRUE(state.Join(kRun, node, options, At(0), nullptr).ok());
    ASSERT_TRUE(state.Summary(kRun)->round_active);
    auto v =
        state.ReportReplicaFailure(kRun, c.node, 1, c.replica, 0, "", At(1), nullptr);
    if (c.accepted) {
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_TRUE(v->counted);
    } else {
      EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << v.status();
      EXPECT_EQ(state.Summary(kRun)->restart_count, 0u);
    }
  }
  // Scope job has no replica groups.
  options_ = Opts(2, 2);
  JoinAll({Node("a", 2), Node("b", 2)});
  auto v = state_.ReportReplicaFailure(kRun, "a", 1, 0, 0, "", At(1), &events_);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << v.status();
}

// Admission epochs (issue 27): every slot occupancy gets a larger one, a
// restore keeps the holders' and makes later ones larger still, and
// CheckAdmission accepts only a rank's current holder.
TEST_F(RendezvousStateTest, ReplicaScopeAdmissionEpochsNameEachSlotOccupancy) {
  options_ = Opts(1, 2);
  options_.replica_size = 2;
  JoinAll({Node("a", 2), Node("b", 2)});
  std::map<std::string, uint64_t> admission;
  for (const NodeEvent& e : Of(Take(), Kind::kAssigned))
    admission[e.node_id] = e.assignment.admission_epoch;
  ASSERT_EQ(admission.size(), 2u);
  EXPECT_NE(admission["a"], 0u);
  EXPECT_NE(admission["a"], admission["b"]);
  EXPECT_TRUE(state_.CheckAdmission(kRun, 1, admission["a"]).ok());
  EXPECT_TRUE(state_.CheckAdmission(kRun, 3, admission["b"]).ok());
  EXPECT_TRUE(state_.CheckAdmission(kRun, 3, 0).ok()) << "not stamped: not checked";

  struct Refused {
    uint32_t rank;
    uint64_t admission;
    std::string why;
  };
  auto expect_refused = [&](const RendezvousState& state, const Refused& r) {
    absl::Status s = state.CheckAdmission(kRun, r.rank, r.admission);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << r.why;
    EXPECT_NE(s.message().find(r.why), std::string::npos) << s;
  };
  expect_refused(state_, {1, admission["b"], "node a's since admission"});
  expect_refused(state_, {4, admission["a"], "world has 4 ranks"});
  EXPECT_EQ(state_.CheckAdmission("nope", 0, 1).code(), absl::StatusCode::kNotFound);

  // b is lost: its slot is vacant, then c takes it with a newer admission.
  ASSERT_TRUE(state_.Leave(kRun, "b", At(10), &events_).ok());
  expect_refused(state_, {2, admission["b"], "was vacated"});
  JoinAll({Node("c", 2)}, At(20));
  auto events = Of(Take(), Kind::kAssigned);
  ASSERT_EQ(Ids(events), (std::vector<std::string>{"c"}));
  const Assignment c = events[0].assignment;  // a copy: `events` is reused below
  EXPECT_EQ(c.rank_base, 2u);
  EXPECT_EQ(c.store_prefix, "job/e1.r1") << "the round's namespace is shared";
  EXPECT_GT(c.admission_epoch, admission["b"]);
  EXPECT_TRUE(state_.CheckAdmission(kRun, 2, c.admission_epoch).ok());
  expect_refused(state_, {2, admission["b"], "node c's since admission"});

  // A restore keeps the holders' admissions; the next occupant's is larger
  // than any given before the restore.
  RendezvousState restored;
  ASSERT_TRUE(restored.RestoreRun(*state_.EncodeRun(kRun, At(30)), At(30)).ok());
  EXPECT_TRUE(restored.CheckAdmission(kRun, 0, admission["a"]).ok());
  EXPECT_TRUE(restored.CheckAdmission(kRun, 2, c.admission_epoch).ok());
  expect_refused(restored, {2, admission["b"], "node c's since admission"});
  ASSERT_TRUE(restored.Leave(kRun, "c", At(40), &events_).ok());
  Take();
  ASSERT_TRUE(restored.Join(kRun, Node("d", 2), options_, At(50), &events_).ok());
  events = Of(Take(), Kind::kAssigned);
  ASSERT_EQ(Ids(events), (std::vector<std::string>{"d"}));
  EXPECT_GT(events[0].assignment.admission_epoch, c.admission_epoch);
  // A node that resumes (its agent reconnects) keeps its admission.
  NodeInfo resuming = Node("a", 2);
  resuming.resume_round = 1;
  ASSERT_TRUE(restored.Join(kRun, resuming, options_, At(60), &events_).ok());
  events = Of(Take(), Kind::kAssigned);
  ASSERT_EQ(Ids(events), (std::vector<std::string>{"a"}));
  EXPECT_EQ(events[0].assignment.admission_epoch, admission["a"]);
}

// Issue 44 (5): what the daemon relies on when a node's Join stream breaks
// (it no longer counts as a leave). The node stays a participant while its
// lease lasts; re-joining, resuming its round, it gets the same assignment
// back and nobody re-forms; one that stays away expires with its lease.
TEST_F(RendezvousStateTest, AParticipantResumingWithinItsLeaseKeepsTheRound) {
  options_ = Opts(2, 2);
  JoinAll({Node("a"), Node("b")});
  auto assigned = Of(Take(), Kind::kAssigned);
  ASSERT_EQ(assigned.size(), 2u);
  const auto ranks = Ranks(assigned);
  // a's stream broke at 500 ms; it is back at 2500 ms, within its lease
  // (3 s from its join).
  state_.Tick(At(2500), &events_);
  EXPECT_TRUE(Take().empty());
  NodeInfo back = Node("a");
  back.resume_round = 1;
  ASSERT_TRUE(Join(back, At(2500)).ok());
  auto events = Take();
  ASSERT_EQ(events.size(), 1u) << "nobody else hears of it";
  EXPECT_EQ(events[0].kind, Kind::kAssigned);
  EXPECT_EQ(events[0].node_id, "a");
  EXPECT_EQ(events[0].round, 1u);
  EXPECT_EQ(events[0].assignment.group_rank, ranks.at("a"));
  EXPECT_EQ(Summary().restart_count, 0u);
  EXPECT_EQ(Summary().round, 1u);
  // The resume renewed a's lease (to 5.5 s). b's stream broke too and b
  // never came back: its lease (3 s from its join) runs out, and a
  // re-forms.
  ASSERT_TRUE(state_.Heartbeat(kRun, "a", At(2900)).ok());
  state_.Tick(At(2999), &events_);
  EXPECT_TRUE(Take().empty());
  state_.Tick(At(3001), &events_);
  events = Of(Take(), Kind::kReform);
  ASSERT_EQ(Ids(events), (std::vector<std::string>{"a"}));
  EXPECT_EQ(events[0].reason, ReformReason::kNodeExpired);
}

// Restart scope "replica": a newcomer's replica groups join the running
// ones (which survive each other) without a re-form; the world grows.
TEST_F(RendezvousStateTest, ReplicaScopeAdmitsANewNodeIntoTheActiveRound) {
  options_ = Opts(1, 3);
  options_.replica_size = 2;
  JoinAll({Node("a", 2)});
  state_.Tick(At(1000), &events_);
  ASSERT_EQ(Of(Take(), Kind::kAssigned).size(), 1u);

  JoinAll({Node("b", 4)}, At(2000));
  auto events = Take();
  ASSERT_EQ(events.size(), 1u) << "nobody else hears of it";
  ASSERT_EQ(events[0].kind, Kind::kAssigned);
  EXPECT_EQ(events[0].node_id, "b");
  const Assignment& b = events[0].assignment;
  EXPECT_EQ(b.round, 1u);
  EXPECT_EQ(b.store_prefix, "job/e1.r1");
  EXPECT_EQ(b.group_rank, 1u);
  EXPECT_EQ(b.group_world_size, 2u);
  EXPECT_EQ(b.rank_base, 2u);
  EXPECT_EQ(b.world_size, 6u);
  ASSERT_EQ(b.participants.size(), 2u);
  EXPECT_EQ(b.participants[1].rank_base, 2u);
  EXPECT_EQ(ParticipantIds(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(state_.stats().joins_into_active_round, 1u);
  EXPECT_EQ(state_.stats().reforms[static_cast<size_t>(ReformReason::kNodesWaiting)], 0u);

  // The grown round survives a restore, and succeeds when both nodes do.
  RendezvousState restored;
  ASSERT_TRUE(restored.RestoreRun(*state_.EncodeRun(kRun, At(2100)), At(2100)).ok());
  EXPECT_EQ(restored.Summary(kRun)->participants.size(), 2u);
  EXPECT_EQ(restored.Summary(kRun)->participants[1].rank_base, 2u);
  ASSERT_TRUE(state_.ReportSuccess(kRun, "a", 1, At(3000), &events_).ok());
  EXPECT_TRUE(Of(Take(), Kind::kClosed).empty());

  // Once a participant has succeeded, a newcomer waits instead (and
  // learns the end).
  JoinAll({Node("c", 2)}, At(3100));
  events = Take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kWaiting);
  ASSERT_TRUE(state_.ReportSuccess(kRun, "b", 1, At(3200), &events_).ok());
  auto closed = Of(Take(), Kind::kClosed);
  ASSERT_EQ(closed.size(), 3u);
  for (const NodeEvent& e : closed) {
    EXPECT_EQ(e.outcome, e.node_id == "c" ? Outcome::kAborted : Outcome::kSucceeded)
        << e.node_id;
  }
}

TEST_F(RendezvousStateTest, ReplicaScopeAtMaxNodesStillWaits) {
  options_ = Opts(1, 1);
  options_.replica_size = 1;
  JoinAll({Node("a", 2)});
  Take();
  JoinAll({Node("b", 2)}, At(10));
  auto events = Take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kWaiting);
  EXPECT_EQ(ParticipantIds(), (std::vector<std::string>{"a"}));
}

TEST_F(RendezvousStateTest, ReplicaScopeAWaitingNodeTakesTheSlotOfALostOne) {
  options_ = Opts(1, 2);
  options_.replica_size = 1;
  JoinAll({Node("a", 2), Node("b", 2)});
  Take();
  JoinAll({Node("c", 2)}, At(10));  // the round is at max: c waits
  ASSERT_EQ(Take()[0].kind, Kind::kWaiting);
  ASSERT_TRUE(state_.Leave(kRun, "a", At(20), &events_).ok());
  // Only c hears of it: a's slot, ranks 0..1.
  auto events = Take();
  ASSERT_EQ(Ids(Of(events, Kind::kAssigned)), (std::vector<std::string>{"c"}));
  EXPECT_EQ(events.size(), 1u);
  EXPECT_EQ(Ranks(events), (std::map<std::string, uint32_t>{{"c", 0}}));
  EXPECT_EQ(ParticipantIds(), (std::vector<std::string>{"c", "b"}));
  EXPECT_EQ(Summary().participants[0].rank_base, 0u);
  EXPECT_TRUE(Summary().waiting.empty());
}

// Restart scope "replica": a lost participant's slot is left vacant, the
// others go on (no re-form), its replica groups are reported lost, and the
// next newcomer of its size takes the slot with its ranks.
TEST_F(RendezvousStateTest, ReplicaScopeALostNodeLeavesItsSlotToTheNextNewcomer) {
  options_ = Opts(1, 3);
  options_.replica_size = 2;
  JoinAll({Node("a", 2)});
  state_.Tick(At(1000), &events_);
  JoinAll({Node("b", 4), Node("c", 2)}, At(1000));
  Take();
  ASSERT_EQ(ParticipantIds(), (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_TRUE(state_.Heartbeat(kRun, "a", At(3000)).ok());
  ASSERT_TRUE(state_.Heartbeat(kRun, "c", At(3000)).ok());
  state_.Tick(At(4001), &events_);  // b's lease (3 s) ran out
  EXPECT_TRUE(Take().empty()) << "nobody re-forms";
  EXPECT_TRUE(Summary().round_active);
  EXPECT_EQ(Summary().round, 1u);
  EXPECT_NE(Summary().last_failure.find("node b"), std::string::npos);
  const auto lost = state_.TakeLostReplicaGroups();
  ASSERT_EQ(lost.size(), 2u);
  EXPECT_EQ(lost[0].replica, 1u);
  EXPECT_EQ(lost[1].replica, 2u);
  EXPECT_TRUE(state_.TakeLostReplicaGroups().empty());
  EXPECT_EQ(state_.stats().nodes_dropped_from_active_round, 1u);

  // A node of another size gets new ranks; one of b's size takes its slot.
  JoinAll({Node("d", 2)}, At(4100));
  auto events = Take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].assignment.group_rank, 3u);
  EXPECT_EQ(events[0].assignment.rank_base, 8u);
  ASSERT_TRUE(state_.Leave(kRun, "d", At(4200), &events_).ok());
  EXPECT_TRUE(Take().empty());
  JoinAll({Node("e", 4)}, At(4300));
  events = Take();
  ASSERT_EQ(events.size(), 1u);
  const Assignment& e = events[0].assignment;
  EXPECT_EQ(e.group_rank, 1u);
  EXPECT_EQ(e.rank_base, 2u);
  EXPECT_EQ(e.world_size, 10u);
  EXPECT_EQ(e.participants[1].node_id, "e");

  // The grown, holed round survives a restore; the run succeeds without d.
  RendezvousState restored;
  ASSERT_TRUE(restored.RestoreRun(*state_.EncodeRun(kRun, At(4400)), At(4400)).ok());
  for (const std::string id : {"a", "c", "e"}) {
    EXPECT_TRUE(Of(events_, Kind::kClosed).empty());
    ASSERT_TRUE(restored.ReportSuccess(kRun, id, 1, At(4500), &events_).ok());
  }
  EXPECT_EQ(Of(Take(), Kind::kClosed).size(), 3u);
  EXPECT_EQ(restored.Summary(kRun)->outcome, Outcome::kSucceeded);
}

// Below min_nodes the round re-forms as in scope job.
TEST_F(RendezvousStateTest, ReplicaScopeLosingANodeBelowMinNodesReforms) {
  options_ = Opts(2, 2);
  options_.replica_size = 1;
  JoinAll({Node("a", 2), Node("b", 2)});
  Take();
  ASSERT_TRUE(state_.Leave(kRun, "b", At(10), &events_).ok());
  EXPECT_EQ(Ids(Of(Take(), Kind::kReform)), (std::vector<std::string>{"a"}));
  EXPECT_TRUE(state_.TakeLostReplicaGroups().empty());
}

TEST_F(RendezvousStateTest, FailureWhileGatheringDoesNotRestart) {
  options_ = Opts(2, 2);
  options_.max_restarts = 3;
  JoinAll({Node("a")});
  auto v = state_.ReportFailure(kRun, "a", 1, "x", At(1), &events_);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->will_restart);
  EXPECT_EQ(v->restart_count, 0u);
  EXPECT_EQ(Summary().restart_count, 0u);
}

TEST_F(RendezvousStateTest, SpentBudgetClosesTheRunWithTheRootCause) {
  options_ = Opts(2, 2);
  options_.max_restarts = 1;
  JoinAll({Node("a"), Node("b"), Node("w")});  // w waits
  Take();
  auto v = state_.ReportFailure(kRun, "a", 1, "first", At(1), &events_);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->will_restart);
  Take();
  v = state_.ReportFailure(kRun, "b", 2, "rank 3 segfault", At(2), &events_);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->will_restart);
  EXPECT_EQ(v->restart_count, 2u);
  auto closed = Of(Take(), Kind::kClosed);
  EXPECT_EQ(Ids(closed), (std::vector<std::string>{"a", "b", "w"}));
  for (const auto& e : closed) {
    EXPECT_EQ(e.outcome, Outcome::kFailed);
    EXPECT_EQ(e.detail, "rank 3 segfault");
  }
  RunSummary s = Summary();
  EXPECT_EQ(s.outcome, Outcome::kFailed);
  EXPECT_EQ(s.last_failure, "rank 3 segfault");
  EXPECT_EQ(s.restart_count, 2u);
  // Late reports of the same failure get the closed verdict, no error.
  v = state_.ReportFailure(kRun, "a", 2, "late", At(3), &events_);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->will_restart);
  EXPECT_EQ(v->restart_count, 2u);
  EXPECT_TRUE(events_.empty());
}

TEST_F(RendezvousStateTest, AllParticipantsSucceedingClosesTheRun) {
  options_ = Opts(2, 2);
  JoinAll({Node("a"), Node("b"), Node("w")});
  Take();
  ASSERT_TRUE(state_.ReportSuccess(kRun, "a", 1, At(1), &events_).ok());
  ASSERT_TRUE(state_.ReportSuccess(kRun, "a", 1, At(2), &events_).ok());
  ASSERT_TRUE(state_.ReportSuccess(kRun, "b", 0, At(2), &events_).ok())
      << "stale round: acknowledged, ignored";
  EXPECT_TRUE(events_.empty());
  EXPECT_FALSE(Summary().outcome.has_value());
  ASSERT_TRUE(state_.ReportSuccess(kRun, "b", 1, At(3), &events_).ok());
  auto closed = Of(Take(), Kind::kClosed);
  EXPECT_EQ(Ids(closed), (std::vector<std::string>{"a", "b", "w"}));
  EXPECT_EQ(closed[0].outcome, Outcome::kSucceeded);
  EXPECT_EQ(closed[0].detail, "all 2 nodes succeeded in round 1");
  EXPECT_EQ(closed[2].outcome, Outcome::kAborted) << "w waited: it ran nothing";
  EXPECT_EQ(Summary().outcome, Outcome::kSucceeded);
  EXPECT_FALSE(state_.NextDeadline().has_value());
}

TEST_F(RendezvousStateTest, SucceededParticipantLeavingChangesNothing) {
  options_ = Opts(2, 2);
  JoinAll({Node("a"), Node("b")});
  Take();
  ASSERT_TRUE(state_.ReportSuccess(kRun, "a", 1, At(1), &events_).ok());
  ASSERT_TRUE(state_.Leave(kRun, "a", At(2), &events_).ok());
  EXPECT_TRUE(Take().empty());
  // ... and so does its lease running out.
  ASSERT_TRUE(state_.Heartbeat(kRun, "b", At(2500)).ok());
  state_.Tick(At(4000), &events_);
  EXPECT_TRUE(Take().empty());
  EXPECT_TRUE(Summary().round_active);
  ASSERT_TRUE(state_.ReportSuccess(kRun, "b", 1, At(4100), &events_).ok());
  // a left, so only b is told.
  EXPECT_EQ(Ids(Of(Take(), Kind::kClosed)), (std::vector<std::string>{"b"}));
  EXPECT_EQ(Summary().outcome, Outcome::kSucceeded);
}

TEST_F(RendezvousStateTest, CloseEndsTheRunForEveryone) {
  options_ = Opts(2, 2);
  JoinAll({Node("a"), Node("b"), Node("w")});
  Take();
  ASSERT_TRUE(state_.Close(kRun, Outcome::kAborted, "operator", At(1), &events_).ok());
  auto closed = Of(Take(), Kind::kClosed);
  EXPECT_EQ(Ids(closed), (std::vector<std::string>{"a", "b", "w"}));
  EXPECT_EQ(closed[0].outcome, Outcome::kAborted);
  EXPECT_EQ(closed[0].detail, "operator");
  // Idempotent; the first outcome stands.
  ASSERT_TRUE(state_.Close(kRun, Outcome::kSucceeded, "x", At(2), &events_).ok());
  EXPECT_TRUE(events_.empty());
  EXPECT_EQ(Summary().outcome, Outcome::kAborted);
}

TEST_F(RendezvousStateTest, ClosedRunAnswersWithClosedStatus) {
  options_ = Opts(1, 1);
  JoinAll({Node("a")});
  ASSERT_TRUE(state_.ReportSuccess(kRun, "a", 1, At(1), &events_).ok());
  Take();
  // A node of the run that comes back late is told the outcome (and is not
  // enrolled), like the other participants.
  ASSERT_TRUE(Join(Node("a"), At(2)).ok());
  auto told = Take();
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].node_id, "a");
  EXPECT_EQ(told[0].kind, NodeEvent::Kind::kClosed);
  EXPECT_EQ(told[0].outcome, Outcome::kSucceeded);
  EXPECT_EQ(told[0].detail.rfind(
                "run job had already ended (succeeded) when this node joined", 0),
            0u)
      << told[0].detail;
  ASSERT_TRUE(Join(Node("a"), At(2)).ok());
  EXPECT_EQ(Take().at(0).kind, NodeEvent::Kind::kClosed);
  EXPECT_EQ(Summary().outcome, Outcome::kSucceeded);

  auto hb = state_.Heartbeat(kRun, "a", At(3));
  ASSERT_TRUE(hb.ok());
  EXPECT_TRUE(hb->closed);
  EXPECT_EQ(hb->round, 1u);
  auto v = state_.ReportFailure(kRun, "a", 1, "x", At(3), &events_);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->will_restart);
  EXPECT_TRUE(state_.ReportSuccess(kRun, "a", 1, At(3), &events_).ok());
  EXPECT_TRUE(state_.Leave(kRun, "a", At(3), &events_).ok());
  EXPECT_TRUE(events_.empty());
  EXPECT_FALSE(state_.NextDeadline().has_value());

  // Queryable until forgotten.
  EXPECT_EQ(state_.RunIds(), (std::vector<std::string>{"job"}));
  EXPECT_TRUE(Summary().waiting.empty());
  state_.ForgetClosedBefore(At(1));
  EXPECT_EQ(state_.RunIds().size(), 1u) << "closed at 1, not before";
  state_.ForgetClosedBefore(At(2));
  EXPECT_TRUE(state_.RunIds().empty());
  // The id is free for a new run.
  EXPECT_TRUE(Join(Node("b"), At(4)).ok());
}

// A relaunch under the id of an ended run (another launch: none of its nodes)
// is never told that run's outcome: it runs its own incarnation, with its own
// options, restart count and store prefix, while the old nodes still learn
// how theirs ended.
TEST_F(RendezvousStateTest, RelaunchAfterTheEndStartsANewIncarnation) {
  options_ = Opts(2, 2);
  options_.max_restarts = 1;
  JoinAll({Node("a"), Node("b")});
  ASSERT_TRUE(state_.ReportFailure(kRun, "a", 1, "boom", At(1), &events_).ok());
  ASSERT_TRUE(state_.ReportSuccess(kRun, "a", 2, At(2), &events_).ok());
  ASSERT_TRUE(state_.ReportSuccess(kRun, "b", 2, At(2), &events_).ok());
  EXPECT_EQ(Summary().outcome, Outcome::kSucceeded);
  Take();

  RunOptions changed = Opts(1, 2);
  changed.max_restarts = 3;
  ASSERT_TRUE(Join(Node("c"), changed, At(10)).ok()) << "other options are fine now";
  ASSERT_TRUE(Join(Node("d"), changed, At(11)).ok());
  auto events = Take();
  EXPECT_TRUE(Of(events, Kind::kClosed).empty()) << "nobody is told the old outcome";
  auto assigned = Of(events, Kind::kAssigned);
  ASSERT_EQ(assigned.size(), 2u);
  EXPECT_EQ(assigned[0].round, 3u) << "rounds are numbered on";
  EXPECT_EQ(assigned[0].assignment.restart_count, 0u);
  EXPECT_EQ(assigned[0].assignment.store_prefix, "job/e2.r3");
  EXPECT_FALSE(Summary().outcome.has_value());

  // An old node is still told how its run ended.
  ASSERT_TRUE(Join(Node("a"), At(12)).ok());
  events = Take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kClosed);
  EXPECT_EQ(events[0].outcome, Outcome::kSucceeded);
  auto hb = state_.Heartbeat(kRun, "b", At(12));
  ASSERT_TRUE(hb.ok());
  EXPECT_TRUE(hb->closed);
  EXPECT_EQ(Summary().participants.size(), 2u) << "a was not enrolled";

  // The new incarnation's own budget: 3 restarts, none used yet.
  auto verdict = state_.ReportFailure(kRun, "c", 3, "x", At(13), &events_);
  ASSERT_TRUE(verdict.ok());
  EXPECT_TRUE(verdict->will_restart);
  EXPECT_EQ(verdict->restart_count, 1u);
}

// A node still waiting when the run succeeds ran nothing (a second launch
// that joined while the first ran, a replacement racing the last success):
// it is not told the success as its own, but that the run ended before it
// took part, and so again if it comes back.
TEST_F(RendezvousStateTest, NodeWaitingAtTheEndIsNotToldTheSuccess) {
  options_ = Opts(1, 1);
  JoinAll({Node("a")});
  JoinAll({Node("x")}, At(1));  // full: x waits
  Take();
  ASSERT_TRUE(state_.ReportSuccess(kRun, "a", 1, At(2), &events_).ok());
  auto closed = Of(Take(), Kind::kClosed);
  ASSERT_EQ(Ids(closed), (std::vector<std::string>{"a", "x"}));
  EXPECT_EQ(closed[0].outcome, Outcome::kSucceeded);
  EXPECT_EQ(closed[1].outcome, Outcome::kAborted);
  EXPECT_EQ(closed[1].detail,
            "run job ended (succeeded) in round 1 before this node took part; nothing "
            "ran on it");
  ASSERT_TRUE(Join(Node("x"), At(3)).ok());
  closed = Take();
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].kind, Kind::kClosed);
  EXPECT_EQ(closed[0].outcome, Outcome::kAborted);
  ASSERT_TRUE(Join(Node("a"), At(3)).ok());
  EXPECT_EQ(Take().at(0).outcome, Outcome::kSucceeded);
  EXPECT_EQ(Summary().outcome, Outcome::kSucceeded);
}

TEST_F(RendezvousStateTest, IncarnationsSurviveEncodeAndRestore) {
  options_ = Opts(1, 1);
  JoinAll({Node("a")});
  ASSERT_TRUE(state_.ReportSuccess(kRun, "a", 1, At(1), &events_).ok());
  JoinAll({Node("b")}, At(2));
  Take();
  std::optional<std::string> bytes = state_.EncodeRun(kRun, At(3));
  ASSERT_TRUE(bytes.has_value());
  RendezvousState restored;
  ASSERT_TRUE(restored.RestoreRun(*bytes, At(100)).ok());
  std::vector<NodeEvent> events;
  ASSERT_TRUE(restored.Join(kRun, Node("a"), options_, At(101), &events).ok());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kClosed) << "a belongs to the ended incarnation";
}

// A crash can lose a membership change that agents already acted on (with
// --state-dir). Rounds formed after the restore must not reuse any prefix,
// and a participant of the restored round that joins afresh (its workers
// stopped) must not be handed that round's old prefix again.
TEST_F(RendezvousStateTest, StorePrefixesNeverRepeatAcrossARestore) {
  options_ = Opts(2, 2);
  options_.max_restarts = 1;
  JoinAll({Node("a"), Node("b")});
  EXPECT_EQ(Of(Take(), Kind::kAssigned).at(0).assignment.store_prefix, "job/e1.r1");
  std::optional<std::string> persisted = state_.EncodeRun(kRun, At(1));
  ASSERT_TRUE(persisted.has_value());
  // What the crash loses: a re-form into round 2 (b's workers failed).
  ASSERT_TRUE(state_.ReportFailure(kRun, "b", 1, "x", At(2), &events_).ok());
  std::set<std::string> used;
  for (const NodeEvent& e : Of(Take(), Kind::kAssigned))
    used.insert(e.assignment.store_prefix);
  EXPECT_EQ(used, (std::set<std::string>{"job/e1.r2"}));
  used.insert("job/e1.r1");

  RendezvousState restored;
  ASSERT_TRUE(restored.RestoreRun(*persisted, At(10)).ok());
  std::vector<NodeEvent> events;
  // a resumes round 1 (its workers never stopped): the same round, fine.
  NodeInfo a = Node("a");
  a.resume_round = 1;
  ASSERT_TRUE(restored.Join(kRun, a, options_, At(11), &events).ok());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].assignment.store_prefix, "job/e1.r1");
  events.clear();
  // b was told round 2, ran it, and now joins afresh: round 1 re-forms.
  ASSERT_TRUE(restored.Join(kRun, Node("b"), options_, At(12), &events).ok());
  auto assigned = Of(events, Kind::kAssigned);
  ASSERT_EQ(assigned.size(), 2u);
  for (const NodeEvent& e : assigned) {
    EXPECT_EQ(used.count(e.assignment.store_prefix), 0u) << e.assignment.store_prefix;
    EXPECT_EQ(e.assignment.store_prefix, "job/e2.r2");
  }
}

TEST_F(RendezvousStateTest, ForgetKeepsOpenRuns) {
  ASSERT_TRUE(state_.Join("open", Node("a"), Opts(2, 2), kT0, &events_).ok());
  ASSERT_TRUE(state_.Join("done", Node("a"), Opts(1, 1), kT0, &events_).ok());
  ASSERT_TRUE(state_.Close("done", Outcome::kAborted, "x", At(1), &events_).ok());
  state_.ForgetClosedBefore(At(100));
  EXPECT_EQ(state_.RunIds(), (std::vector<std::string>{"open"}));
}

// ---------------------------------------------------------------------------
// Re-join and heartbeats

TEST_F(RendezvousStateTest, RejoinOfParticipantResendsAssignment) {
  options_ = Opts(2, 2);
  JoinAll({Node("a"), Node("b")});
  Take();
  // a reconnects at 2500 (lease renewed to 5500); b keeps heartbeating.
  ASSERT_TRUE(Join(Node("a"), At(2500)).ok());
  auto events = Take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kAssigned);
  EXPECT_EQ(events[0].node_id, "a");
  EXPECT_EQ(events[0].assignment.round, 1u);
  EXPECT_EQ(events[0].assignment.group_rank, 0u);
  EXPECT_EQ(events[0].assignment.group_world_size, 2u);
  ASSERT_TRUE(state_.Heartbeat(kRun, "b", At(2500)).ok());
  state_.Tick(At(5000), &events_);
  EXPECT_TRUE(Take().empty()) << "the re-join renewed a's lease";
  EXPECT_EQ(Summary().round, 1u);
}

TEST_F(RendezvousStateTest, RejoinWhileGatheringOrWaitingIsIdempotent) {
  options_ = Opts(3, 3);
  JoinAll({Node("a"), Node("b"), Node("a")});
  auto events = Take();
  EXPECT_EQ(Of(events, Kind::kWaiting).size(), 3u);
  EXPECT_TRUE(Of(events, Kind::kAssigned).empty()) << "a counted once";
  JoinAll({Node("c")});
  EXPECT_EQ(Ranks(Take()),
            (std::map<std::string, uint32_t>{{"a", 0}, {"b", 1}, {"c", 2}}));
  JoinAll({Node("w"), Node("w")}, At(1));
  events = Take();
  EXPECT_EQ(Ids(events), (std::vector<std::string>{"w", "w"}));
  EXPECT_EQ(events[1].kind, Kind::kWaiting);
  EXPECT_EQ(events[1].round, 2u);
  EXPECT_EQ(Summary().waiting, (std::vector<std::string>{"w"}));
}

TEST_F(RendezvousStateTest, RejoinWithOtherNprocReformsTheRound) {
  options_ = Opts(2, 2);
  JoinAll({Node("a", 2), Node("b", 2)});
  Take();
  ASSERT_TRUE(Join(Node("a", 4), At(1)).ok());
  auto events = Take();
  EXPECT_EQ(Ids(Of(events, Kind::kReform)), (std::vector<std::string>{"b"}));
  auto assigned = Of(events, Kind::kAssigned);
  ASSERT_EQ(assigned.size(), 2u);
  EXPECT_EQ(assigned[0].assignment.world_size, 6u);
}

TEST_F(RendezvousStateTest, HeartbeatReportsRoundAndRestarts) {
  options_ = Opts(1, 2);
  options_.max_restarts = 5;
  options_.last_call_timeout = Millis(0);
  JoinAll({Node("a")});
  ASSERT_TRUE(state_.ReportFailure(kRun, "a", 1, "x", At(1), &events_).ok());
  auto hb = state_.Heartbeat(kRun, "a", At(2));
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->round, 2u);
  EXPECT_EQ(hb->restart_count, 1u);
  EXPECT_FALSE(hb->closed);
}

TEST_F(RendezvousStateTest, NextDeadlineIsTheEarliestTimer) {
  options_ = Opts(2, 4);
  options_.last_call_timeout = Millis(500);
  options_.join_timeout = Millis(10000);
  options_.keep_alive_interval = Millis(1000);  // lease 3000
  EXPECT_FALSE(state_.NextDeadline().has_value());
  JoinAll({Node("a")}, At(0));
  EXPECT_EQ(state_.NextDeadline(), At(3000));  // lease; join timeout 10000
  ASSERT_TRUE(state_.Heartbeat(kRun, "a", At(9000)).ok());
  EXPECT_EQ(state_.NextDeadline(), At(10000));  // join timeout
  JoinAll({Node("b")}, At(9200));
  EXPECT_EQ(state_.NextDeadline(), At(9700));  // last call
  state_.Tick(At(9700), &events_);
  EXPECT_EQ(state_.NextDeadline(), At(12000));  // a's lease
}

TEST_F(RendezvousStateTest, SummaryDescribesTheRun) {
  options_ = Opts(2, 2);
  JoinAll({Node("a", 2), Node("b", 3), Node("w")});
  RunSummary s = Summary();
  EXPECT_EQ(s.run_id, "job");
  EXPECT_EQ(s.round, 1u);
  EXPECT_TRUE(s.round_active);
  ASSERT_EQ(s.participants.size(), 2u);
  EXPECT_EQ(s.participants[1].node_id, "b");
  EXPECT_EQ(s.participants[1].rank_base, 2u);
  EXPECT_EQ(s.waiting, (std::vector<std::string>{"w"}));
  EXPECT_FALSE(s.outcome.has_value());
  EXPECT_EQ(std::string(ToString(ReformReason::kNodeExpired)), "node expired");
  EXPECT_EQ(std::string(ToString(Outcome::kFailed)), "failed");
}

TEST_F(RendezvousStateTest, RunsAreIndependent) {
  ASSERT_TRUE(state_.Join("r1", Node("a"), Opts(1, 1), kT0, &events_).ok());
  ASSERT_TRUE(state_.Join("r2", Node("a"), Opts(2, 2), kT0, &events_).ok());
  EXPECT_TRUE(state_.Summary("r1")->round_active);
  EXPECT_FALSE(state_.Summary("r2")->round_active);
  EXPECT_EQ(state_.RunIds(), (std::vector<std::string>{"r1", "r2"}));
}

// ---------------------------------------------------------------------------
// Scale

TEST(RendezvousStateScaleTest, TenThousandNodesFormOneRound) {
  constexpr int kNodes = 10000;
  RendezvousState state;
  RunOptions o = Opts(kNodes, kNodes);
  std::vector<NodeEvent> events;
  for (int i = 0; i < kNodes; ++i) {
    events.clear();
    ASSERT_TRUE(state.Join("big", Node(absl::StrCat("n", i), 8), o, kT0, &events).ok());
  }
  ASSERT_EQ(events.size(), static_cast<size_t>(kNodes + 1));  // + kWaiting
  events.erase(events.begin());
  ExpectConsistentAssignments(events);
  EXPECT_EQ(events.back().assignment.world_size, 8u * kNodes);
  for (int i = 0; i < kNodes; ++i) {
    ASSERT_TRUE(state.Heartbeat("big", absl::StrCat("n", i), At(1000)).ok());
  }
  events.clear();
  state.Tick(At(2000), &events);
  EXPECT_TRUE(events.empty());
}

// ---------------------------------------------------------------------------
// Simulation: many agents over simulated time, with an in-memory network that
// delivers events to the agents, which react.

struct SimAgent {
  enum class State { kNotJoined, kWaiting, kRunning, kClosed, kTimedOut, kDead };
  std::string id;
  uint32_t nproc = 1;
  RdzvTime join_at;
  std::optional<RdzvTime> die_at;
  State state = State::kNotJoined;
  uint64_t round = 0;
  uint32_t group_rank = 0;
  RdzvTime running_since;
  RdzvTime next_heartbeat;
  bool ever_assigned = false;
  bool reported_success = false;
  std::optional<Outcome> outcome;
};

class Simulation {
 public:
  static constexpr char kRunId[] = "sim";
  static constexpr Millis kStep{100};
  static constexpr Millis kWork{15000};

  // `replica_size` > 0: restart scope "replica" (nodes join and leave the
  // active round without re-forming it).
  Simulation(uint32_t seed, int initial, int late, int deaths, uint32_t replica_size = 0)
      : rng_(seed) {
    options_.replica_size = replica_size;
    options_.min_nodes = 900;
    options_.max_nodes = 1100;
    options_.max_restarts = 5;
    options_.last_call_timeout = Millis(2000);
    options_.join_timeout = Millis(60000);
    options_.keep_alive_interval = Millis(1000);
    options_.keep_alive_max_attempt = 3;
    auto uniform = [&](int64_t lo, int64_t hi) {
      return kT0 + Millis(std::uniform_int_distribution<int64_t>(lo, hi)(rng_));
    };
    for (int i = 0; i < initial + late; ++i) {
      SimAgent& a = agents_[absl::StrCat("node", i)];
      a.id = absl::StrCat("node", i);
      a.nproc = 1 + static_cast<uint32_t>(rng_() % 8);
      a.join_at = i < initial ? uniform(0, 3000) : uniform(10000, 30000);
    }
    std::vector<SimAgent*> all;
    for (auto& [id, a] : agents_) all.push_back(&a);
    std::shuffle(all.begin(), all.end(), rng_);
    for (int i = 0; i < deaths; ++i) {
      all[i]->die_at = std::max(all[i]->join_at, uniform(5000, 60000));
    }
  }

  void Run(RdzvTime end) {
    for (now_ = kT0; now_ <= end && !closed_; now_ += kStep) {
      Step();
      if (::testing::Test::HasFatalFailure()) return;
    }
  }

  void InjectFailureAt(RdzvTime at) { injections_.push_back(at); }

  const std::map<std::string, SimAgent>& agents() const { return agents_; }
  RendezvousState& state() { return state_; }
  int restarts_injected() const { return restarts_injected_; }
  uint64_t rounds_formed() const { return rounds_formed_; }

 private:
  void Step() {
    std::vector<NodeEvent> events;
    for (auto& [id, a] : agents_) {
      if (a.state == SimAgent::State::kDead) continue;
      if (a.die_at && now_ >= *a.die_at) {
        a.state = SimAgent::State::kDead;  // silently: no leave, no heartbeat
        continue;
      }
      if (a.state == SimAgent::State::kNotJoined && now_ >= a.join_at) {
        ASSERT_TRUE(state_
                        .Join(kRunId, NodeInfo{a.id, "h" + a.id, a.nproc, -1}, options_,
                              now_, &events)
                        .ok());
        a.state = SimAgent::State::kWaiting;
        a.next_heartbeat = now_ + options_.keep_alive_interval;
        Deliver(&events);
        continue;
      }
      if (a.state != SimAgent::State::kWaiting && a.state != SimAgent::State::kRunning) {
        continue;
      }
      if (now_ >= a.next_heartbeat) {
        auto hb = state_.Heartbeat(kRunId, a.id, now_);
        ASSERT_TRUE(hb.ok()) << a.id << ": " << hb.status();
        if (hb->closed) continue;
        a.next_heartbeat += options_.keep_alive_interval;
      }
      if (a.state == SimAgent::State::kRunning && !a.reported_success &&
          now_ - a.running_since >= kWork) {
        a.reported_success = true;
        ASSERT_TRUE(state_.ReportSuccess(kRunId, a.id, a.round, now_, &events).ok());
        Deliver(&events);
      }
    }
    MaybeInjectFailure(&events);
    state_.Tick(now_, &events);
    Deliver(&events);
    CheckInvariants();
  }

  // Several nodes of one round report the same failure; it must cost one
  // restart.
  void MaybeInjectFailure(std::vector<NodeEvent>* events) {
    if (injections_.empty() || now_ < injections_.front()) return;
    auto s = state_.Summary(kRunId);
    if (!s || !s->round_active) return;  // retry next step
    injections_.erase(injections_.begin());
    std::vector<SimAgent*> running;
    for (auto& [id, a] : agents_) {
      if (a.state == SimAgent::State::kRunning) running.push_back(&a);
    }
    ASSERT_GE(running.size(), 3u);
    std::shuffle(running.begin(), running.end(), rng_);
    const uint32_t before = s->restart_count;
    for (int i = 0; i < 3; ++i) {
      auto v = state_.ReportFailure(kRunId, running[i]->id, running[i]->round,
                                    absl::StrCat("injected on ", running[i]->id), now_,
                                    events);
      ASSERT_TRUE(v.ok());
      EXPECT_EQ(v->will_restart, before + 1 <= options_.max_restarts);
      EXPECT_EQ(v->restart_count, before + 1);
    }
    ++restarts_injected_;
    Deliver(events);
  }

  void Deliver(std::vector<NodeEvent>* events) {
    // (Under scope replica a node admitted into the active round is
    // assigned alone, in a later call than the round's other nodes.)
    if (options_.replica_size == 0) ExpectConsistentAssignments(*events);
    std::set<uint64_t> rounds;
    for (const NodeEvent& e : *events) {
      ASSERT_EQ(e.run_id, kRunId);
      SimAgent& a = agents_.at(e.node_id);
      if (a.state == SimAgent::State::kDead) continue;  // nobody listening
      switch (e.kind) {
        case Kind::kWaiting:
          EXPECT_NE(a.state, SimAgent::State::kRunning) << a.id;
          a.state = SimAgent::State::kWaiting;
          break;
        case Kind::kAssigned:
          if (rounds.insert(e.round).second && e.round != last_round_) {
            EXPECT_GT(e.round, last_round_);
            last_round_ = e.round;
            ++rounds_formed_;
          }
          EXPECT_TRUE(options_.replica_size > 0 || rounds_formed_ == 0 ||
                      rounds.count(e.round))
              << "scope job: a round's nodes are all assigned at once";
          EXPECT_LE(e.assignment.restart_count, options_.max_restarts + 1);
          a.state = SimAgent::State::kRunning;
          a.round = e.round;
          a.group_rank = e.assignment.group_rank;
          a.running_since = now_;
          a.ever_assigned = true;
          a.reported_success = false;
          break;
        case Kind::kReform:
          EXPECT_EQ(a.state, SimAgent::State::kRunning) << a.id;
          a.state = SimAgent::State::kWaiting;
          break;
        case Kind::kClosed:
          a.state = SimAgent::State::kClosed;
          a.outcome = e.outcome;
          closed_ = true;
          break;
        case Kind::kJoinTimeout:
          a.state = SimAgent::State::kTimedOut;
          break;
      }
    }
    events->clear();
  }

  void CheckInvariants() {
    auto s = state_.Summary(kRunId);
    if (!s) return;
    EXPECT_LE(s->restart_count, options_.max_restarts + 1);
    if (s->round_active) {
      // (Under scope replica the roster keeps the slots of lost nodes.)
      const auto& p = s->participants;
      size_t live = 0;
      for (const ParticipantView& v : p) {
        auto agent = agents_.find(v.node_id);
        live += agent != agents_.end() && agent->second.state != SimAgent::State::kDead;
      }
      if (options_.replica_size == 0) {
        EXPECT_GE(p.size(), options_.min_nodes);
      }
      EXPECT_LE(live, options_.max_nodes);
      uint64_t base = 0;
      for (uint32_t r = 0; r < p.size(); ++r) {
        ASSERT_EQ(p[r].group_rank, r);
        ASSERT_EQ(p[r].rank_base, base);
        base += p[r].nproc;
      }
    }
    // One active round: every agent that believes it runs, runs the current
    // round, with the rank the daemon holds for it.
    for (const auto& [id, a] : agents_) {
      if (a.state != SimAgent::State::kRunning) continue;
      ASSERT_TRUE(s->round_active || s->outcome.has_value()) << id;
      ASSERT_EQ(a.round, s->round) << id;
      ASSERT_LT(a.group_rank, s->participants.size());
      ASSERT_EQ(s->participants[a.group_rank].node_id, id);
    }
  }

  std::mt19937 rng_;
  RunOptions options_;
  RendezvousState state_;
  std::map<std::string, SimAgent> agents_;
  RdzvTime now_;
  bool closed_ = false;
  uint64_t last_round_ = 0;
  uint64_t rounds_formed_ = 0;
  std::vector<RdzvTime> injections_;
  int restarts_injected_ = 0;
};

class RendezvousStateSimulationSeedTest : public ::testing::TestWithParam<uint32_t> {};

// Two injected failures 13s apart, with 15s of work per round: both land
// before the run can succeed, whatever the seed.
TEST_P(RendezvousStateSimulationSeedTest, ThousandAgentsJoinDieFailAndSucceed) {
  Simulation sim(/*seed=*/GetParam(), /*initial=*/1000, /*late=*/40, /*deaths=*/25);
  sim.InjectFailureAt(At(35000));
  sim.InjectFailureAt(At(48000));
  sim.Run(At(600000));
  ASSERT_FALSE(::testing::Test::HasFailure());

  auto s = sim.state().Summary(Simulation::kRunId);
  ASSERT_TRUE(s.has_value());
  ASSERT_EQ(s->outcome, Outcome::kSucceeded);
  EXPECT_EQ(sim.restarts_injected(), 2);
  EXPECT_EQ(s->restart_count, 2u);
  EXPECT_GT(sim.rounds_formed(), 10u) << "late joins, deaths, failures";
  int live = 0;
  for (const auto& [id, a] : sim.agents()) {
    if (a.state == SimAgent::State::kDead) continue;
    ++live;
    EXPECT_TRUE(a.ever_assigned) << id;
    EXPECT_EQ(a.state, SimAgent::State::kClosed) << id;
    EXPECT_EQ(a.outcome, Outcome::kSucceeded) << id;
  }
  EXPECT_EQ(live, 1040 - 25);
  EXPECT_EQ(s->participants.size(), static_cast<size_t>(live));
}

INSTANTIATE_TEST_SUITE_P(Seeds, RendezvousStateSimulationSeedTest,
                         ::testing::Values(42u, 1u, 2u, 3u, 2024u));

// Restart scope "replica": late nodes join the running round, dead ones
// leave their slots vacant, and the one round succeeds without re-forming.
TEST(RendezvousStateSimulationTest, ReplicaScopeNodesComeAndGoWithoutReforming) {
  Simulation sim(/*seed=*/5, /*initial=*/1000, /*late=*/40, /*deaths=*/25,
                 /*replica_size=*/1);
  sim.Run(At(600000));
  ASSERT_FALSE(::testing::Test::HasFailure());
  auto s = sim.state().Summary(Simulation::kRunId);
  ASSERT_TRUE(s.has_value());
  ASSERT_EQ(s->outcome, Outcome::kSucceeded);
  EXPECT_EQ(sim.rounds_formed(), 1u);
  const RendezvousStats& stats = sim.state().stats();
  for (uint64_t reforms : stats.reforms) EXPECT_EQ(reforms, 0u);
  EXPECT_GT(stats.nodes_dropped_from_active_round, 0u);
  // Late nodes that came before the first node succeeded (15 s of work)
  // took part; the later ones waited and learnt that nothing ran on them.
  int admitted = 0;
  for (const auto& [id, a] : sim.agents()) {
    if (a.state == SimAgent::State::kDead) continue;
    EXPECT_EQ(a.outcome, a.ever_assigned ? Outcome::kSucceeded : Outcome::kAborted) << id;
    admitted += a.ever_assigned && a.join_at > At(3000);
  }
  EXPECT_GT(admitted, 0);
  EXPECT_GE(stats.joins_into_active_round,
            static_cast<uint64_t>(admitted));  // + the dead
}

TEST(RendezvousStateSimulationTest, SpentBudgetFailsEveryAgent) {
  Simulation sim(/*seed=*/7, /*initial=*/1000, /*late=*/0, /*deaths=*/0);
  for (int i = 1; i <= 6; ++i) sim.InjectFailureAt(At(5000 + i * 1000));
  sim.Run(At(60000));
  auto s = sim.state().Summary(Simulation::kRunId);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->outcome, Outcome::kFailed);
  EXPECT_EQ(s->restart_count, 6u);
  for (const auto& [id, a] : sim.agents()) {
    EXPECT_EQ(a.outcome, Outcome::kFailed) << id;
  }
}

}  // namespace
}  // namespace meshrun::rdzv
