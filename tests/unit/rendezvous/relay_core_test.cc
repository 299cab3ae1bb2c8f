// RelayCore: what an agent's workers' requests become on its one stream to
// the daemon (aggregation, batching, limits, and what survives the stream
// breaking). Pure: the "daemon" is this test, answering batches by hand.
#include "rendezvous/relay/relay_core.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "rendezvous/server/store_backend.h"

namespace meshrun::rdzv {
namespace {

using meshrun::v1::StoreRequest;
using meshrun::v1::StoreRequestBatch;
using meshrun::v1::StoreResponse;

// Only its address matters: RelayCore never calls a session.
class Sink final : public StoreReplySink {
 public:
  void Send(StoreResponse) override {}
  void SendAll(std::vector<StoreResponse>*) override {}
  void Hold(const std::vector<StoreResponse>&) override {}
  void SendHeld(std::vector<StoreResponse>*) override {}
  bool DeferIfOverBounds() override { return false; }
  void MarkDeferred() override {}
  size_t RoomBytes() override { return 0; }
};

StoreRequest Wait(uint64_t id, std::vector<std::string> keys, std::string ns = "run/r1") {
  StoreRequest r;
  r.set_id(id);
  r.set_ns(std::move(ns));
  r.set_timeout_ms(UINT32_MAX);
  for (auto& k : keys) r.mutable_wait()->add_keys(k);
  return r;
}
StoreRequest Get(uint64_t id, const std::string& key) {
  StoreRequest r;
  r.set_id(id);
  r.set_ns("run/r1");
  r.mutable_get()->set_key(key);
  r.mutable_get()->set_if_present(true);
  return r;
}
StoreRequest Add(uint64_t id, const std::string& key, int64_t delta) {
  StoreRequest r;
  r.set_id(id);
  r.set_ns("run/r1");
  r.mutable_add()->set_key(key);
  r.mutable_add()->set_delta(delta);
  return r;
}
StoreRequest Set(uint64_t id, const std::string& key, const std::string& value) {
  StoreRequest r;
  r.set_id(id);
  r.set_ns("run/r1");
  r.mutable_set()->set_key(key);
  r.mutable_set()->set_value(value);
  return r;
}

StoreResponse Ok(uint64_t id) {
  StoreResponse reply;
  reply.set_id(id);
  return reply;
}

// Takes and writes the next batch.
StoreRequestBatch Send(RelayCore& core) {
  StoreRequestBatch batch;
  EXPECT_TRUE(core.TakeBatch(&batch));
  core.WriteDone(true);
  return batch;
}

// The deliveries as session -> reply.
std::map<StoreReplySink*, StoreResponse> BySession(
    const std::vector<RelayDelivery>& out) {
  std::map<StoreReplySink*, StoreResponse> by;
  for (const RelayDelivery& d : out) by[d.session] = d.reply;
  return by;
}

TEST(RelayCoreTest, WaitsOnOneKeyShareOneUpstreamWaitAlsoOnceSent) {
  RelayCore core;
  Sink a, b, c;
  ASSERT_FALSE(core.Submit(&a, Wait(7, {"done"})));
  ASSERT_FALSE(core.Submit(&b, Wait(1, {"done"})));
  StoreRequestBatch batch = Send(core);
  ASSERT_EQ(batch.requests_size(), 1);
  // A wait that comes after the first went up joins it too.
  ASSERT_FALSE(core.Submit(&c, Wait(3, {"done"})));
  StoreRequestBatch none;
  EXPECT_FALSE(core.TakeBatch(&none));
  // Another key, or another namespace, is another wait.
  ASSERT_FALSE(core.Submit(&c, Wait(4, {"other"})));
  std::vector<RelayDelivery> out;
  core.OnReply(Ok(batch.requests(0).id()), &out);
  auto by = BySession(out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(by[&a].id(), 7u);
  EXPECT_EQ(by[&b].id(), 1u);
  EXPECT_EQ(by[&c].id(), 3u);
  EXPECT_EQ(core.stats().joined, 2u);
}

TEST(RelayCoreTest, GetsJoinOnlyWhileNotSent) {
  RelayCore core;
  Sink a, b, c;
  ASSERT_FALSE(core.Submit(&a, Get(1, "addr0")));
  ASSERT_FALSE(core.Submit(&b, Get(2, "addr0")));
  StoreRequestBatch first = Send(core);
  ASSERT_EQ(first.requests_size(), 1);
  // Asked after the read went up: its answer may be older than this get.
  ASSERT_FALSE(core.Submit(&c, Get(3, "addr0")));
  StoreRequestBatch second;
  ASSERT_TRUE(core.TakeBatch(&second));
  EXPECT_EQ(second.requests_size(), 1);
  StoreResponse value = Ok(first.requests(0).id());
  value.add_values("10.0.0.1:5000");
  std::vector<RelayDelivery> out;
  core.OnReply(value, &out);
  ASSERT_EQ(out.size(), 2u);
  for (const RelayDelivery& d : out) EXPECT_EQ(d.reply.values(0), "10.0.0.1:5000");
}

TEST(RelayCoreTest, AddsToOneKeyBecomeOneAddAndEachCallerGetsItsOwnValue) {
  RelayCore core;
  Sink a, b, c;
  ASSERT_FALSE(core.Submit(&a, Add(1, "arrived", 1)));
  ASSERT_FALSE(core.Submit(&b, Add(1, "arrived", 2)));
  ASSERT_FALSE(core.Submit(&c, Add(1, "arrived", 3)));
  StoreRequestBatch batch = Send(core);
  ASSERT_EQ(batch.requests_size(), 1);
  EXPECT_EQ(batch.requests(0).add().delta(), 6);
  StoreResponse reply = Ok(batch.requests(0).id());
  reply.set_number(10);  // 4 before the combined add
  std::vector<RelayDelivery> out;
  core.OnReply(reply, &out);
  auto by = BySession(out);
  EXPECT_EQ(by[&a].number(), 5);
  EXPECT_EQ(by[&b].number(), 7);
  EXPECT_EQ(by[&c].number(), 10);
}

TEST(RelayCoreTest, AnErrorReachesEveryJoinedCaller) {
  RelayCore core;
  Sink a, b;
  ASSERT_FALSE(core.Submit(&a, Add(1, "not_a_number", 1)));
  ASSERT_FALSE(core.Submit(&b, Add(2, "not_a_number", 1)));
  StoreRequestBatch batch = Send(core);
  StoreResponse reply = Ok(batch.requests(0).id());
  reply.set_code(meshrun::v1::STORE_INVALID_ARGUMENT);
  reply.set_number(0);
  std::vector<RelayDelivery> out;
  core.OnReply(reply, &out);
  ASSERT_EQ(out.size(), 2u);
  for (const RelayDelivery& d : out) {
    EXPECT_EQ(d.reply.code(), meshrun::v1::STORE_INVALID_ARGUMENT);
    EXPECT_EQ(d.reply.number(), 0);
  }
}

TEST(RelayCoreTest, ASessionWithARequestPendingJoinsNothingSoItsOrderHolds) {
  RelayCore core;
  Sink a, b;
  ASSERT_FALSE(core.Submit(&a, Get(1, "k")));
  // b pipelines: set, then get; its get must not share a's (queued before
  // b's set) read.
  ASSERT_FALSE(core.Submit(&b, Set(1, "k", "v")));
  ASSERT_FALSE(core.Submit(&b, Get(2, "k")));
  StoreRequestBatch batch = Send(core);
  ASSERT_EQ(batch.requests_size(), 3);
  EXPECT_TRUE(batch.requests(0).has_get());
  EXPECT_TRUE(batch.requests(1).has_set());
  EXPECT_TRUE(batch.requests(2).has_get());
}

TEST(RelayCoreTest, BatchesKeepTheDaemonsBounds) {
  RelayLimits limits;
  limits.max_requests_per_batch = 2;
  limits.max_batch_bytes = 100;
  RelayCore core(limits);
  std::vector<Sink> sinks(4);
  for (size_t i = 0; i < 3; ++i)
    ASSERT_FALSE(core.Submit(&sinks[i], Set(1, "k" + std::to_string(i), "v")));
  EXPECT_EQ(Send(core).requests_size(), 2);
  EXPECT_EQ(Send(core).requests_size(), 1);
  // A request larger than a batch's bytes goes alone.
  ASSERT_FALSE(core.Submit(&sinks[0], Set(2, "big", std::string(200, 'x'))));
  ASSERT_FALSE(core.Submit(&sinks[1], Set(2, "small", "v")));
  EXPECT_EQ(Send(core).requests_size(), 1);
  EXPECT_EQ(Send(core).requests_size(), 1);
}

TEST(RelayCoreTest, RefusesWhatTheDaemonWouldEndTheStreamFor) {
  RelayLimits limits;
  limits.max_request_bytes = 1000;
  limits.max_pending_per_session = 2;
  RelayCore core(limits);
  Sink a;
  auto refusal = core.Submit(&a, Set(1, "k", std::string(2000, 'x')));
  ASSERT_TRUE(refusal);
  EXPECT_EQ(refusal->code(), meshrun::v1::STORE_INVALID_ARGUMENT);
  EXPECT_EQ(refusal->id(), 1u);
  ASSERT_FALSE(core.Submit(&a, Wait(2, {"x"})));
  ASSERT_FALSE(core.Submit(&a, Wait(3, {"y"})));
  refusal = core.Submit(&a, Wait(4, {"z"}));
  ASSERT_TRUE(refusal);
  EXPECT_EQ(refusal->code(), meshrun::v1::STORE_RESOURCE_EXHAUSTED);
  EXPECT_EQ(core.stats().refused, 2u);
}

TEST(RelayCoreTest, AfterTheStreamBreaksWhatWasInFlightIsSentAgainAddsWithTheirDedupId) {
  RelayCore core({}, /*identity=*/0x1122334455667788);
  Sink waiter, adder, setter, late;
  ASSERT_FALSE(core.Submit(&waiter, Wait(1, {"go"})));
  ASSERT_FALSE(core.Submit(&adder, Add(1, "n", 1)));
  ASSERT_FALSE(core.Submit(&setter, Set(1, "k", "v")));
  Sink counter;  // add(key, 0): a read
  ASSERT_FALSE(core.Submit(&counter, Add(1, "m", 0)));
  StoreRequestBatch first = Send(core);
  ASSERT_EQ(first.requests_size(), 4);
  // Only the add that changes something carries a dedup id: the relay's
  // identity, then the upstream id, little-endian.
  const std::string dedup_id = first.requests(1).dedup_id();
  ASSERT_EQ(dedup_id.size(), 16u);
  EXPECT_EQ(dedup_id.substr(0, 8), std::string("\x88\x77\x66\x55\x44\x33\x22\x11", 8));
  EXPECT_EQ(uint64_t{static_cast<uint8_t>(dedup_id[8])}, first.requests(1).id());
  EXPECT_TRUE(first.requests(0).dedup_id().empty());
  EXPECT_TRUE(first.requests(2).dedup_id().empty());
  EXPECT_TRUE(first.requests(3).dedup_id().empty());
  ASSERT_FALSE(core.Submit(&late, Add(1, "n", 5)));  // not sent yet
  std::vector<RelayDelivery> out;
  core.OnStreamLost(&out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(core.stats().failed_in_flight, 0u);
  // The next stream carries the wait, the add (the same request, dedup id
  // and all), the set, the add of 0 and the unsent add, in order.
  StoreRequestBatch again = Send(core);
  ASSERT_EQ(again.requests_size(), 5);
  EXPECT_TRUE(again.requests(0).has_wait());
  EXPECT_EQ(again.requests(1).SerializeAsString(), first.requests(1).SerializeAsString());
  EXPECT_TRUE(again.requests(2).has_set());
  EXPECT_EQ(again.requests(3).add().delta(), 0);
  EXPECT_EQ(again.requests(4).add().delta(), 5);
  EXPECT_EQ(again.requests(4).dedup_id().size(), 16u);
  EXPECT_NE(again.requests(4).dedup_id(), dedup_id);
  EXPECT_EQ(core.stats().repeated, 4u);
  // The daemon's answer (the first one, remembered) reaches the adder.
  StoreResponse sum = Ok(again.requests(1).id());
  sum.set_number(1);
  core.OnReply(sum, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].session, &adder);
  EXPECT_EQ(out[0].reply.number(), 1);
}

TEST(RelayCoreTest, EveryMutationWhoseRepeatIsNotHarmlessIsSentAgain) {
  RelayCore core({}, /*identity=*/7);
  Sink a, b, c, d;
  StoreRequest compare_set = Set(1, "cs", "");
  compare_set.mutable_compare_set()->set_key("cs");
  compare_set.mutable_compare_set()->set_desired("x");
  StoreRequest append = Set(1, "ap", "");
  append.mutable_append()->set_key("ap");
  append.mutable_append()->set_value("y");
  StoreRequest push = Set(1, "q", "");
  push.mutable_queue_push()->set_key("q");
  push.mutable_queue_push()->set_value("z");
  StoreRequest pop = Set(1, "q", "");
  pop.mutable_queue_pop()->set_key("q");
  ASSERT_FALSE(core.Submit(&a, compare_set));
  ASSERT_FALSE(core.Submit(&b, append));
  ASSERT_FALSE(core.Submit(&c, push));
  ASSERT_FALSE(core.Submit(&d, pop));
  StoreRequestBatch first = Send(core);
  ASSERT_EQ(first.requests_size(), 4);
  std::vector<RelayDelivery> out;
  core.OnStreamLost(&out);
  EXPECT_TRUE(out.empty());
  StoreRequestBatch again = Send(core);
  ASSERT_EQ(again.requests_size(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(again.requests(i).dedup_id().size(), 16u) << i;
    EXPECT_EQ(again.requests(i).SerializeAsString(),
              first.requests(i).SerializeAsString())
        << i;
  }
  EXPECT_EQ(core.stats().failed_in_flight, 0u);
}

TEST(RelayCoreTest, ABarrierInFlightWhenTheStreamBreaksFails) {
  RelayCore core;
  Sink arriving;
  StoreRequest barrier = Set(1, "b", "");
  barrier.mutable_barrier()->set_key("b");
  barrier.mutable_barrier()->set_world_size(2);
  ASSERT_FALSE(core.Submit(&arriving, barrier));
  EXPECT_TRUE(Send(core).requests(0).dedup_id().empty());
  std::vector<RelayDelivery> out;
  core.OnStreamLost(&out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].session, &arriving);
  EXPECT_EQ(out[0].reply.code(), meshrun::v1::STORE_UNAVAILABLE);
  EXPECT_EQ(core.stats().failed_in_flight, 1u);
}

TEST(RelayCoreTest, ABatchNotWrittenIsSentAgainWhateverItHolds) {
  RelayCore core;
  Sink adder;
  ASSERT_FALSE(core.Submit(&adder, Add(1, "n", 1)));
  StoreRequestBatch batch;
  ASSERT_TRUE(core.TakeBatch(&batch));
  core.WriteDone(false);  // the stream broke before the write went out
  std::vector<RelayDelivery> out;
  core.OnStreamLost(&out);
  EXPECT_TRUE(out.empty());
  StoreRequestBatch again = Send(core);
  ASSERT_EQ(again.requests_size(), 1);
  EXPECT_EQ(again.requests(0).add().delta(), 1);
}

TEST(RelayCoreTest, ARepliedRequestBeforeItsWriteDoneIsFine) {
  RelayCore core;
  Sink a;
  ASSERT_FALSE(core.Submit(&a, Get(1, "k")));
  StoreRequestBatch batch;
  ASSERT_TRUE(core.TakeBatch(&batch));
  std::vector<RelayDelivery> out;
  core.OnReply(Ok(batch.requests(0).id()), &out);  // gRPC may order them so
  core.WriteDone(true);
  EXPECT_EQ(out.size(), 1u);
  EXPECT_EQ(core.pending_upstream(), 0u);
}

TEST(RelayCoreTest, CancelledWaitsGetNoReplyAndAnUnsentOneIsNotSent) {
  RelayCore core;
  Sink a, b;
  ASSERT_FALSE(core.Submit(&a, Wait(1, {"sent"})));
  StoreRequestBatch sent = Send(core);
  ASSERT_FALSE(core.Submit(&b, Wait(1, {"unsent"})));
  core.CancelWaits(&a);
  core.CancelWaits(&b);
  StoreRequestBatch none;
  EXPECT_FALSE(core.TakeBatch(&none));
  std::vector<RelayDelivery> out;
  core.OnReply(Ok(sent.requests(0).id()), &out);
  EXPECT_TRUE(out.empty());
  // The session may wait again at once (c10d's client does after a timeout).
  EXPECT_FALSE(core.Submit(&a, Wait(2, {"sent"})));
}

TEST(RelayCoreTest, AnEndedSessionsWritesStillGoUpItsReadsDoNot) {
  RelayCore core;
  Sink a;
  ASSERT_FALSE(core.Submit(&a, Set(1, "k", "v")));
  core.EndSession(&a);
  Sink b;
  ASSERT_FALSE(core.Submit(&b, Get(1, "k")));
  core.EndSession(&b);
  StoreRequestBatch batch = Send(core);
  ASSERT_EQ(batch.requests_size(), 1);
  EXPECT_TRUE(batch.requests(0).has_set());
  std::vector<RelayDelivery> out;
  core.OnReply(Ok(batch.requests(0).id()), &out);
  EXPECT_TRUE(out.empty());
}

// Issue 44 (7): the daemon keeps each answer to a request with a dedup id
// until the relay says it has it. Answered ids ride on the next request of
// their namespace; a request that carried them and was lost carries them
// again (or its successor does), so the daemon's memory is emptied without
// it ever dropping an answer a repeat may ask for.
TEST(RelayCoreTest, AnsweredDedupIdsAreNamedForTheDaemonToForget) {
  RelayCore core;
  Sink adder, other;
  ASSERT_FALSE(core.Submit(&adder, Add(1, "n", 1)));
  StoreRequestBatch first = Send(core);
  const std::string dedup_id = first.requests(0).dedup_id();
  ASSERT_EQ(dedup_id.size(), 16u);
  EXPECT_EQ(first.requests(0).forget_dedup_ids_size(), 0);
  EXPECT_EQ(core.dedup_in_flight(), 1u);
  std::vector<RelayDelivery> out;
  StoreResponse answer = Ok(first.requests(0).id());
  answer.set_number(1);
  core.OnReply(answer, &out);
  EXPECT_EQ(core.dedup_in_flight(), 0u);
  EXPECT_EQ(core.to_forget(), 1u);
  // Not on a request of another namespace.
  StoreRequest elsewhere = Wait(2, {"k"}, "run/r2");
  ASSERT_FALSE(core.Submit(&other, elsewhere));
  EXPECT_EQ(Send(core).requests(0).forget_dedup_ids_size(), 0);
  // On the next one of its own: a read, which the stream then loses (an
  // orphan nobody waits for, dropped): named again on the next.
  ASSERT_FALSE(core.Submit(&adder, Get(2, "k")));
  StoreRequestBatch second = Send(core);
  ASSERT_EQ(second.requests(0).forget_dedup_ids_size(), 1);
  EXPECT_EQ(second.requests(0).forget_dedup_ids(0), dedup_id);
  EXPECT_EQ(core.to_forget(), 0u);
  core.EndSession(&adder);
  core.OnStreamLost(&out);
  EXPECT_EQ(core.to_forget(), 1u);
  ASSERT_FALSE(core.Submit(&other, Set(3, "k", "v")));
  StoreRequestBatch third = Send(core);
  ASSERT_EQ(third.requests_size(), 2);  // the wait again, then the set
  EXPECT_TRUE(third.requests(0).has_wait());
  ASSERT_EQ(third.requests(1).forget_dedup_ids_size(), 1);
  EXPECT_EQ(third.requests(1).forget_dedup_ids(0), dedup_id);
  // A request sent again (a set) after its stream broke keeps them.
  core.OnStreamLost(&out);
  StoreRequestBatch fourth = Send(core);
  ASSERT_EQ(fourth.requests_size(), 2);
  EXPECT_EQ(fourth.requests(1).forget_dedup_ids_size(), 1);
  core.OnReply(Ok(fourth.requests(1).id()), &out);
  EXPECT_EQ(core.to_forget(), 0u);
}

// No more requests with a dedup id are out than the window: the next one
// (and what its session sent after it) waits for an answer; others'
// requests ahead of it go.
TEST(RelayCoreTest, RequestsWithADedupIdWaitForTheWindow) {
  RelayLimits limits;
  limits.max_dedup_in_flight = 2;
  RelayCore core(limits);
  Sink a, b, c, d;
  ASSERT_FALSE(core.Submit(&a, Add(1, "a", 1)));
  ASSERT_FALSE(core.Submit(&b, Add(1, "b", 1)));
  ASSERT_FALSE(core.Submit(&c, Add(1, "c", 1)));
  ASSERT_FALSE(core.Submit(&d, Add(1, "d", 0)));  // a read: no dedup id
  StoreRequestBatch first = Send(core);
  ASSERT_EQ(first.requests_size(), 2);
  EXPECT_EQ(core.dedup_in_flight(), 2u);
  StoreRequestBatch none;
  EXPECT_FALSE(core.TakeBatch(&none));
  EXPECT_EQ(none.requests_size(), 0);
  std::vector<RelayDelivery> out;
  core.OnReply(Ok(first.requests(0).id()), &out);
  StoreRequestBatch second = Send(core);
  ASSERT_EQ(second.requests_size(), 2);
  EXPECT_EQ(second.requests(0).add().key(), "c");
  EXPECT_EQ(second.requests(1).add().key(), "d");
  ASSERT_EQ(second.requests(0).forget_dedup_ids_size(), 1);
  EXPECT_EQ(second.requests(0).forget_dedup_ids(0), first.requests(0).dedup_id());
  // A stream that breaks takes them out of the window until sent again.
  core.OnStreamLost(&out);
  EXPECT_EQ(core.dedup_in_flight(), 0u);
  EXPECT_EQ(Send(core).requests_size(), 3);
  EXPECT_EQ(core.dedup_in_flight(), 2u);
}

}  // namespace
}  // namespace meshrun::rdzv
