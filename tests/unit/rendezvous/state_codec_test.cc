// Persistence formats (state_codec) and the RendezvousState / KvStore hooks
// they use: round trips, a torn last log record, damaged logs and snapshots,
// fresh leases and resumed timers after a restore, and resume checks.
#include "rendezvous/core/state_codec.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace meshrun::rdzv {
namespace {

using Kind = NodeEvent::Kind;

const RdzvTime kT0{};
RdzvTime At(int64_t ms) { return kT0 + Millis(ms); }

RunOptions Opts(uint32_t min_nodes, uint32_t max_nodes) {
  RunOptions o;
  o.min_nodes = min_nodes;
  o.max_nodes = max_nodes;
  o.max_restarts = 3;
  o.last_call_timeout = Millis(1000);
  o.join_timeout = Millis(60000);
  o.keep_alive_interval = Millis(1000);
  o.keep_alive_max_attempt = 3;
  return o;
}

NodeInfo Node(const std::string& id, uint64_t resume_round = 0) {
  NodeInfo n{id, "host-" + id, 2, -1, 4000};
  n.resume_round = resume_round;
  return n;
}

std::vector<std::string> Entries(const KvStore& store) {
  std::vector<std::string> out;
  store.ForEachEntry(
      [&](const std::string& ns, const std::string& k, const std::string& v) {
        out.push_back(ns + "|" + k + "=" + v);
      });
  std::sort(out.begin(), out.end());
  return out;
}

std::string Log(const std::vector<std::string>& payloads) {
  std::string out;
  for (const std::string& p : payloads) codec::AppendFrame(&out, p);
  return out;
}

void Replay(std::string_view log, KvStore* store, RendezvousState* state, RdzvTime now) {
  auto scan = codec::ScanFrames(log);
  ASSERT_TRUE(scan.ok()) << scan.status();
  for (std::string_view r : scan->records) {
    ASSERT_TRUE(codec::ApplyRecord(r, store, state, now).ok());
  }
}

TEST(StateCodec, Crc32MatchesTheStandardCheckValue) {
  EXPECT_EQ(codec::Crc32("123456789"), 0xCBF43926u);
}

TEST(StateCodec, StoreLogRecordsReplay) {
  const std::string binary("a\0b\xff", 4);
  std::string log = Log(
      {codec::SetRecord("r/1", "k", "v1"), codec::SetRecord("r/1", binary, binary),
       codec::AppendRecord("r/1", "k", "+x"), codec::AppendRecord("r/2", "new", "first"),
       codec::SetRecord("r/1", "gone", "1"), codec::DeleteRecord("r/1", "gone"),
       codec::SetRecord("r/3", "x", "1"), codec::DropNamespaceRecord("r/3")});
  KvStore store;
  RendezvousState state;
  Replay(log, &store, &state, kT0);
  EXPECT_EQ(Entries(store), (std::vector<std::string>{"r/1|" + binary + "=" + binary,
                                                      "r/1|k=v1+x", "r/2|new=first"}));
  EXPECT_EQ(store.NumKeys("r/1"), 2);
}

StoredAnswer Answer(int32_t code, int64_t number, std::vector<std::string> values,
                    std::string error = "", bool flag = false) {
  StoredAnswer answer;
  answer.code = code;
  answer.error = std::move(error);
  answer.number = number;
  answer.values = std::move(values);
  answer.flag = flag;
  return answer;
}

TEST(StateCodec, ARememberedAnswerReplaysWithItsEffects) {
  const std::string binary("a\0b\xff", 4);
  const StoredAnswer added = Answer(0, 5, {});
  const StoredAnswer popped = Answer(0, 2, {binary}, "", true);
  const StoredAnswer refused = Answer(8, 0, {}, "over the limit");
  std::string log = Log({
      codec::SetRecord("r/1", "n", "2"),
      codec::RememberedRecord("r/1", "add-id", added,
                              {codec::SetRecord("r/1", "n", "5")}),
      codec::QueuePushRecord("r/1", "q", binary),
      codec::QueuePushRecord("r/1", "q", "second"),
      codec::RememberedRecord("r/1", binary, popped, {codec::QueuePopRecord("r/1", "q")}),
      codec::RememberedRecord("r/2", "no-effect", refused, {}),
  });
  KvStore store;
  RendezvousState state;
  Replay(log, &store, &state, kT0);
  EXPECT_EQ(Entries(store), (std::vector<std::string>{"r/1|n=5"}));
  EXPECT_EQ(store.QueueLength("r/1", "q"), 1);
  EXPECT_EQ(store.Recall("r/1", "add-id"), added);
  EXPECT_EQ(store.Recall("r/1", binary), popped);
  EXPECT_EQ(store.Recall("r/2", "no-effect"), refused);
  EXPECT_EQ(store.num_remembered("r/1"), 2u);
}

TEST(StateCodec, ARememberedAnswerWithAnEffectThatIsNotAStoreRecordIsRefused) {
  RendezvousState other;  // no run "job": its record says it is gone
  KvStore store;
  RendezvousState state;
  const std::string record = codec::RememberedRecord(
      "r/1", "id", Answer(0, 1, {}), {codec::RunRecord(other, "job", kT0)});
  EXPECT_EQ(codec::ApplyRecord(record, &store, &state, kT0).code(),
            absl::StatusCode::kDataLoss);
  std::string cut = codec::RememberedRecord("r/1", "id", Answer(0, 1, {"v"}),
                                            {codec::SetRecord("r/1", "n", "1")});
  cut.pop_back();
  EXPECT_EQ(codec::ApplyRecord(cut, &store, &state, kT0).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(store.num_entries(), 0u);
  EXPECT_EQ(store.num_remembered("r/1"), 0u);
  EXPECT_TRUE(state.RunIds().empty());
}

TEST(StateCodec, RememberedAnswersRoundTripThroughASnapshotInOrder) {
  StoreLimits limits;
  limits.max_remembered_per_namespace = 3;
  KvStore store(limits);
  store.RestoreSet("r/1", "k", "v");
  for (int i = 0; i < 3; ++i)
    store.Remember("r/1", "id" + std::to_string(i), Answer(0, i, {"x"}));
  store.Remember("r/2", "only", Answer(14, 0, {}, "why", true));
  RendezvousState state;
  const std::string snapshot = codec::EncodeSnapshot(store, state, 7, kT0);
  KvStore restored(limits);
  RendezvousState restored_state;
  auto generation = codec::DecodeSnapshot(snapshot, &restored, &restored_state, kT0);
  ASSERT_TRUE(generation.ok()) << generation.status();
  EXPECT_EQ(*generation, 7u);
  EXPECT_EQ(Entries(restored), (std::vector<std::string>{"r/1|k=v"}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(restored.Recall("r/1", "id" + std::to_string(i)), Answer(0, i, {"x"}));
  }
  EXPECT_EQ(restored.Recall("r/2", "only"), Answer(14, 0, {}, "why", true));
  std::vector<std::string> order;
  restored.ForEachRemembered(
      [&](const std::string& ns, const std::string& id, const StoredAnswer&) {
        if (ns == "r/1") order.push_back(id);
      });
  EXPECT_EQ(order, (std::vector<std::string>{"id0", "id1", "id2"}));
}

// What the senders said they have is forgotten again on replay.
TEST(StateCodec, ForgottenAnswersStayForgottenOnReplay) {
  const std::vector<std::string> ids{"id0", "never"};
  const std::string log = Log({
      codec::RememberedRecord("r/1", "id0", Answer(0, 1, {}), {}),
      codec::RememberedRecord("r/1", "id1", Answer(0, 2, {}), {}),
      codec::ForgottenRecord("r/1", ids),
  });
  KvStore store;
  RendezvousState state;
  Replay(log, &store, &state, kT0);
  EXPECT_EQ(store.Recall("r/1", "id0"), std::nullopt);
  EXPECT_EQ(store.Recall("r/1", "id1"), Answer(0, 2, {}));
  std::string cut = codec::ForgottenRecord("r/1", ids);
  cut.pop_back();
  EXPECT_EQ(codec::ApplyRecord(cut, &store, &state, kT0).code(),
            absl::StatusCode::kDataLoss);
}

TEST(StateCodec, TornLastRecordIsDroppedAtEveryCut) {
  const std::string whole =
      Log({codec::SetRecord("n", "a", "1"), codec::SetRecord("n", "b", "2")});
  const size_t first = 8 + codec::SetRecord("n", "a", "1").size();  // end of record 1
  for (size_t cut = first; cut < whole.size(); ++cut) {
    auto scan = codec::ScanFrames(std::string_view(whole).substr(0, cut));
    ASSERT_TRUE(scan.ok()) << "cut at " << cut;
    EXPECT_EQ(scan->records.size(), 1u) << "cut at " << cut;
    EXPECT_EQ(scan->torn_tail, cut != first) << "cut at " << cut;
    EXPECT_EQ(scan->valid_bytes, first);
  }
  // A last record whose bytes were never fully written (garbage in place).
  std::string garbled = whole;
  garbled.back() ^= 0x5a;
  auto scan = codec::ScanFrames(garbled);
  ASSERT_TRUE(scan.ok());
  EXPECT_EQ(scan->records.size(), 1u);
  EXPECT_TRUE(scan->torn_tail);
}

TEST(StateCodec, DamageBeforeTheLastRecordIsRefused) {
  std::string log =
      Log({codec::SetRecord("n", "a", "1"), codec::SetRecord("n", "b", "2")});
  log[10] ^= 0x01;  // inside the first record's payload
  auto scan = codec::ScanFrames(log);
  EXPECT_EQ(scan.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(scan.status().message().find("checksum"), std::string_view::npos);
}

TEST(StateCodec, UnknownRecordIsRefused) {
  KvStore store;
  RendezvousState state;
  EXPECT_EQ(codec::ApplyRecord("\x63garbage", &store, &state, kT0).code(),
            absl::StatusCode::kDataLoss);
  // A known type with a truncated body.
  std::string set = codec::SetRecord("n", "k", "v");
  set.pop_back();
  EXPECT_EQ(codec::ApplyRecord(set, &store, &state, kT0).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(store.num_entries(), 0u);
}

// Two nodes in an active round 2 (one worker failure), a third waiting.
void BuildRun(RendezvousState& state) {
  std::vector<NodeEvent> events;
  ASSERT_TRUE(state.Join("job", Node("a"), Opts(2, 2), At(0), &events).ok());
  ASSERT_TRUE(state.Join("job", Node("b"), Opts(2, 2), At(10), &events).ok());
  ASSERT_TRUE(
      state.ReportFailure("job", "a", 1, "rank 0 exited 1", At(20), &events).ok());
  ASSERT_TRUE(state.Join("job", Node("c"), Opts(2, 2), At(30), &events).ok());
}

TEST(StateCodec, RunRoundTripsAndResumes) {
  RendezvousState before;
  before.set_track_changes(true);
  BuildRun(before);
  EXPECT_EQ(before.TakeChangedRuns(), std::vector<std::string>{"job"});
  EXPECT_TRUE(before.TakeChangedRuns().empty());
  ASSERT_TRUE(before.Heartbeat("job", "a", At(40)).ok());
  EXPECT_TRUE(before.TakeChangedRuns().empty()) << "heartbeats are not persisted";

  KvStore store;
  store.RestoreSet("job/r2", "MASTER", "x");
  const std::string snapshot = codec::EncodeSnapshot(store, before, 7, At(50));

  // The daemon was down for a long time: restored far later.
  const RdzvTime restore = At(1000000);
  KvStore kv;
  RendezvousState after;
  auto gen = codec::DecodeSnapshot(snapshot, &kv, &after, restore);
  ASSERT_TRUE(gen.ok()) << gen.status();
  EXPECT_EQ(*gen, 7u);
  EXPECT_EQ(Entries(kv), std::vector<std::string>{"job/r2|MASTER=x"});

  auto was = before.Summary("job");
  auto now = after.Summary("job");
  ASSERT_TRUE(now.has_value());
  EXPECT_EQ(now->round, 2u);
  EXPECT_EQ(was->round, 2u);
  EXPECT_TRUE(now->round_active);
  EXPECT_EQ(now->restart_count, 1u);
  EXPECT_EQ(now->last_failure, "rank 0 exited 1");
  EXPECT_EQ(now->waiting, was->waiting);
  ASSERT_EQ(now->participants.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(now->participants[i].node_id, was->participants[i].node_id);
    EXPECT_EQ(now->participants[i].rank_base, was->participants[i].rank_base);
    EXPECT_EQ(now->participants[i].master_port, was->participants[i].master_port);
  }

  // Fresh leases from the restore time: the downtime expired nobody.
  std::vector<NodeEvent> events;
  after.Tick(restore + Millis(2999), &events);
  EXPECT_TRUE(events.empty());

  // A participant resumes its round: same assignment, no re-form.
  const std::string& a_id = now->participants[0].node_id;
  NodeInfo resuming = Node(a_id, 2);
  resuming.resume_round = 2;
  ASSERT_TRUE(
      after.Join("job", resuming, Opts(2, 2), restore + Millis(100), &events).ok());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::kAssigned);
  EXPECT_EQ(events[0].assignment.round, 2u);
  EXPECT_EQ(events[0].assignment.restart_count, 1u);
  EXPECT_EQ(events[0].assignment.group_rank, 0u);
  EXPECT_EQ(events[0].assignment.store_prefix, "job/e1.r2");

  // The other participant never comes back: it expires one lease after the restore.
  events.clear();
  after.Tick(restore + Millis(3000), &events);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].kind, Kind::kReform);
}

TEST(StateCodec, GatheringTimersResumeWithWhatWasLeft) {
  RendezvousState before;
  std::vector<NodeEvent> events;
  RunOptions o = Opts(2, 4);
  ASSERT_TRUE(before.Join("job", Node("a"), o, At(0), &events).ok());
  ASSERT_TRUE(
      before.Join("job", Node("b"), o, At(100), &events).ok());  // last call at 1100
  auto bytes = before.EncodeRun("job", At(600));                 // 500 ms left
  ASSERT_TRUE(bytes.has_value());
  RendezvousState after;
  ASSERT_TRUE(after.RestoreRun(*bytes, At(10000)).ok());
  events.clear();
  after.Tick(At(10499), &events);
  EXPECT_TRUE(events.empty());
  after.Tick(At(10500), &events);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, Kind::kAssigned);
}

TEST(StateCodec, ResumeIsRefusedUnlessTheNodeIsInThatRound) {
  RendezvousState state;
  BuildRun(state);
  std::vector<NodeEvent> events;
  auto code = [&](const std::string& run, const std::string& node, uint64_t round) {
    return state.Join(run, Node(node, round), Opts(2, 2), At(100), &events).code();
  };
  EXPECT_EQ(code("other", "a", 1), absl::StatusCode::kNotFound);  // unknown run
  EXPECT_FALSE(state.Summary("other").has_value()) << "a refused resume creates nothing";
  EXPECT_EQ(code("job", "a", 1), absl::StatusCode::kNotFound);  // the run moved on
  EXPECT_EQ(code("job", "c", 2),
            absl::StatusCode::kNotFound);  // waiting, not a participant
  EXPECT_EQ(code("job", "zz", 2), absl::StatusCode::kNotFound);
  EXPECT_EQ(code("job", "b", 2), absl::StatusCode::kOk);
}

TEST(StateCodec, ForgottenRunIsLoggedAsGone) {
  RendezvousState state;
  BuildRun(state);
  ASSERT_TRUE(state.Close("job", Outcome::kAborted, "test", At(100), nullptr).ok());
  state.ForgetClosedBefore(At(200));
  const std::string record = codec::RunRecord(state, "job", At(200));
  RendezvousState restored;
  BuildRun(restored);
  KvStore store;
  ASSERT_TRUE(codec::ApplyRecord(record, &store, &restored, At(300)).ok());
  EXPECT_FALSE(restored.Summary("job").has_value());
}

TEST(StateCodec, ClosedRunStaysClosed) {
  RendezvousState state;
  BuildRun(state);
  ASSERT_TRUE(state.Close("job", Outcome::kFailed, "gave up", At(100), nullptr).ok());
  RendezvousState restored;
  ASSERT_TRUE(restored.RestoreRun(*state.EncodeRun("job", At(100)), At(500)).ok());
  EXPECT_EQ(restored.Summary("job")->outcome, Outcome::kFailed);
  // A late node, or a participant resuming, learns the outcome and its reason.
  for (uint64_t resume : {0, 1}) {
    std::vector<NodeEvent> events;
    ASSERT_TRUE(
        restored.Join("job", Node("a", resume), Opts(2, 2), At(600), &events).ok());
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].kind, Kind::kClosed);
    EXPECT_EQ(events[0].outcome, Outcome::kFailed);
    EXPECT_NE(events[0].detail.find("gave up"), std::string::npos) << events[0].detail;
  }
  std::vector<NodeEvent> events;
  restored.Tick(At(100000), &events);
  EXPECT_TRUE(events.empty());
}

TEST(StateCodec, DamagedSnapshotIsRefusedAndNothingLoaded) {
  KvStore store;
  for (int i = 0; i < 20; ++i) store.RestoreSet("ns", "key" + std::to_string(i), "value");
  RendezvousState state;
  BuildRun(state);
  const std::string good = codec::EncodeSnapshot(store, state, 3, At(0));
  {
    KvStore kv;
    RendezvousState st;
    ASSERT_TRUE(codec::DecodeSnapshot(good, &kv, &st, At(0)).ok());
    EXPECT_EQ(kv.num_entries(), 20u);
  }
  std::vector<std::pair<std::string, std::string>> damaged;
  damaged.emplace_back("bad magic", "X" + good.substr(1));
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x10;
  damaged.emplace_back("a flipped byte", flipped);
  damaged.emplace_back("cut short", good.substr(0, good.size() - 5));
  damaged.emplace_back("no trailer", good.substr(0, good.size() - 17));
  damaged.emplace_back("empty", "");
  for (const auto& [what, bytes] : damaged) {
    KvStore kv;
    RendezvousState st;
    auto result = codec::DecodeSnapshot(bytes, &kv, &st, At(0));
    EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << what;
    EXPECT_FALSE(result.status().message().empty()) << what;
    EXPECT_EQ(kv.num_entries(), 0u) << what << ": half-loaded";
    EXPECT_TRUE(st.RunIds().empty()) << what << ": half-loaded";
  }
}

TEST(StateCodec, DamagedRunRecordIsRefused) {
  RendezvousState state;
  BuildRun(state);
  std::string bytes = *state.EncodeRun("job", At(0));
  RendezvousState other;
  EXPECT_EQ(other.RestoreRun(bytes.substr(0, bytes.size() - 3), At(0)).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(other.RestoreRun(bytes + "x", At(0)).code(), absl::StatusCode::kDataLoss);
  bytes[0] = 9;  // unknown format
  EXPECT_EQ(other.RestoreRun(bytes, At(0)).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(other.RunIds().empty());
}

}  // namespace
}  // namespace meshrun::rdzv
