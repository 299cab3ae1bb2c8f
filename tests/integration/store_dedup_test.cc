// The daemon's memory of answers to requests with a dedup id (store.proto),
// in this process (rdzv::Daemon through its in-process channel), through
// the real request path: validation, KvStore, the StoreService adapter.
// Issue 44 (7): that memory must never forget an answer whose repeat could
// still come, whatever fills it (many answers, or one huge one); past its
// bounds a new request is refused, not applied, and a sender's
// forget_dedup_ids make room.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshrun/v1/store.grpc.pb.h"
#include "rendezvous/server/daemon.h"

namespace meshrun {
namespace {

namespace v1 = meshrun::v1;

constexpr char kNs[] = "job/e1.r1";

class StoreDedupTest : public ::testing::Test {
 protected:
  void Start(const rdzv::StoreLimits& limits) {
    rdzv::DaemonOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.store.limits = limits;
    auto started = rdzv::Daemon::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    daemon_ = std::move(*started);
    stub_ = v1::Store::NewStub(daemon_->InProcessChannel());
  }

  // Sends `requests` as batches of at most 1,024 on one BatchSession, each
  // once the previous one's replies came, and returns every reply by
  // request id.
  std::map<uint64_t, v1::StoreResponse> Exchange(
      const std::vector<v1::StoreRequest>& requests) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto stream = stub_->BatchSession(&context);
    std::map<uint64_t, v1::StoreResponse> replies;
    for (size_t at = 0; at < requests.size(); at += 1024) {
      v1::StoreRequestBatch batch;
      const size_t end = std::min(requests.size(), at + 1024);
      for (size_t i = at; i < end; ++i) *batch.add_requests() = requests[i];
      EXPECT_TRUE(stream->Write(batch));
      v1::StoreResponseBatch in;
      while (replies.size() < end && stream->Read(&in)) {
        for (const auto& r : in.responses())
          EXPECT_TRUE(replies.emplace(r.id(), r).second);
      }
    }
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
    EXPECT_EQ(replies.size(), requests.size());
    return replies;
  }
  v1::StoreResponse One(const v1::StoreRequest& request) {
    return Exchange({request})[request.id()];
  }

  static v1::StoreRequest Add(uint64_t id, const std::string& dedup_id,
                              const std::string& key, int64_t delta) {
    v1::StoreRequest r;
    r.set_id(id);
    r.set_ns(kNs);
    r.set_dedup_id(dedup_id);
    r.mutable_add()->set_key(key);
    r.mutable_add()->set_delta(delta);
    return r;
  }
  static v1::StoreRequest CompareSet(uint64_t id, const std::string& dedup_id,
                                     const std::string& key, const std::string& expected,
                                     const std::string& desired) {
    v1::StoreRequest r;
    r.set_id(id);
    r.set_ns(kNs);
    r.set_dedup_id(dedup_id);
    r.mutable_compare_set()->set_key(key);
    r.mutable_compare_set()->set_expected(expected);
    r.mutable_compare_set()->set_desired(desired);
    return r;
  }
  static v1::StoreRequest Set(uint64_t id, const std::string& key,
                              const std::string& value) {
    v1::StoreRequest r;
    r.set_id(id);
    r.set_ns(kNs);
    r.mutable_set()->set_key(key);
    r.mutable_set()->set_value(value);
    return r;
  }
  static v1::StoreRequest Delete(uint64_t id, const std::string& key) {
    v1::StoreRequest r;
    r.set_id(id);
    r.set_ns(kNs);
    r.mutable_delete_()->set_key(key);
    return r;
  }
  int64_t Count(const std::string& key) { return One(Add(999999, "", key, 0)).number(); }
  bool Exists(const std::string& key) {
    v1::StoreRequest r;
    r.set_id(999998);
    r.set_ns(kNs);
    r.mutable_check()->add_keys(key);
    return One(r).flag();
  }

  std::unique_ptr<rdzv::Daemon> daemon_;
  std::unique_ptr<v1::Store::Stub> stub_;
};

// An add and a compare_set applied, then 16,384 more answers (the old
// FIFO's count): their repeats get their first answers. The add counts
// once; the compare_set (whose key someone deleted since) is not replayed.
TEST_F(StoreDedupTest, ManyLaterAnswersForgetNoEarlierOne) {
  Start(rdzv::StoreLimits{});
  ASSERT_EQ(One(Add(1, "A", "n", 5)).number(), 5);
  ASSERT_EQ(One(CompareSet(2, "C", "flag", "", "1")).values(0), "1");
  ASSERT_TRUE(One(Delete(3, "flag")).flag());
  std::vector<v1::StoreRequest> others;
  for (int i = 0; i < 16384; ++i)
    others.push_back(Add(100 + i, "other" + std::to_string(i), "m", 1));
  for (const auto& [id, reply] : Exchange(others))
    ASSERT_EQ(reply.code(), v1::STORE_OK) << id << ": " << reply.error();
  auto again =
      Exchange({Add(20001, "A", "n", 5), CompareSet(20002, "C", "flag", "", "1")});
  EXPECT_EQ(again[20001].number(), 5);
  ASSERT_EQ(again[20002].values_size(), 1);
  EXPECT_EQ(again[20002].values(0), "1");
  EXPECT_EQ(Count("n"), 5) << "the add was applied again";
  EXPECT_FALSE(Exists("flag")) << "the compare_set was replayed";
}

// One answer larger than the old byte bound (16 MiB: a compare_set answers
// with the key's value) forgets no other.
TEST_F(StoreDedupTest, OneHugeAnswerForgetsNoOther) {
  Start(rdzv::StoreLimits{});
  ASSERT_EQ(One(Add(1, "A", "n", 5)).number(), 5);
  ASSERT_EQ(One(Set(2, "big", std::string(17 << 20, 'x'))).code(), v1::STORE_OK);
  auto huge = One(CompareSet(3, "H", "big", "not it", "y"));
  ASSERT_EQ(huge.code(), v1::STORE_OK) << huge.error();
  ASSERT_EQ(huge.values(0).size(), size_t{17} << 20);
  EXPECT_EQ(One(Add(4, "A", "n", 5)).number(), 5);
  EXPECT_EQ(Count("n"), 5) << "the add was applied again";
}

// Past the count bound a request with a new dedup id is refused and not
// applied, while repeats are still answered; the sender's forget_dedup_ids
// make room (before the request that carries them runs). A huge answer
// fills the byte bound alone, and is kept.
TEST_F(StoreDedupTest, PastItsBoundsTheMemoryRefusesNewRequestsUntilForgotten) {
  rdzv::StoreLimits limits;
  limits.max_remembered_per_namespace = 3;
  limits.max_remembered_bytes_per_namespace = 64 << 10;
  Start(limits);
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(One(Add(1 + i, "id" + std::to_string(i), "n", 1)).number(), i + 1);
  auto refused = One(Add(4, "id3", "n", 1));
  EXPECT_EQ(refused.code(), v1::STORE_RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error().find("not applied"), std::string::npos) << refused.error();
  EXPECT_EQ(One(Add(5, "id0", "n", 1)).number(), 1);  // a repeat: its first answer
  EXPECT_EQ(Count("n"), 3);
  // Without a dedup id nothing is remembered, and nothing refused.
  EXPECT_EQ(One(Add(6, "", "n", 1)).number(), 4);

  auto carrier = Add(7, "id3", "n", 1);
  carrier.add_forget_dedup_ids("id0");
  carrier.add_forget_dedup_ids("never-sent");
  EXPECT_EQ(One(carrier).number(), 5);
  // Forgotten at the sender's word only: its repeat would now be new.
  EXPECT_EQ(One(Add(8, "id1", "n", 1)).number(), 2);

  // One answer of 128 KiB over the 64 KiB bound: kept, then new ones wait.
  auto forget_all = Set(9, "big", std::string(128 << 10, 'x'));
  for (const char* id : {"id1", "id2", "id3"}) forget_all.add_forget_dedup_ids(id);
  ASSERT_EQ(One(forget_all).code(), v1::STORE_OK);
  auto huge = One(CompareSet(10, "H", "big", "not it", "y"));
  ASSERT_EQ(huge.code(), v1::STORE_OK) << huge.error();
  EXPECT_EQ(One(Add(11, "id4", "n", 1)).code(), v1::STORE_RESOURCE_EXHAUSTED);
  EXPECT_EQ(One(CompareSet(12, "H", "big", "not it", "y")).values(0).size(),
            size_t{128} << 10);
  auto after = Add(13, "id4", "n", 1);
  after.add_forget_dedup_ids("H");
  EXPECT_EQ(One(after).number(), 6);
}

}  // namespace
}  // namespace meshrun
