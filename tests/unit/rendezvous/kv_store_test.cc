#include "rendezvous/core/kv_store.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace meshrun::rdzv {
namespace {

// Plain gtest (the target does not link gmock): vectors compare with ==.
using Ids = std::vector<WaiterId>;
using Values = std::vector<std::string>;

constexpr char kNs[] = "run";

TimePoint At(int ms) { return TimePoint{} + std::chrono::milliseconds(ms); }

// Reads a key without parking: nullopt when absent.
std::optional<std::string> Peek(KvStore& store, const std::string& ns,
                                const std::string& key) {
  absl::StatusOr<bool> present = store.Check(ns, {key});
  if (!present.ok() || !*present) return std::nullopt;
  BlockingResult result = store.Get(ns, key, /*waiter=*/~WaiterId{0}, At(0));
  EXPECT_TRUE(result.ready);
  EXPECT_TRUE(result.status.ok()) << result.status;
  return result.values.at(0);
}

std::vector<WaiterId> IdsOf(const std::vector<Wakeup>& woken) {
  std::vector<WaiterId> ids;
  ids.reserve(woken.size());
  for (const Wakeup& wake : woken) ids.push_back(wake.waiter);
  return ids;
}

// --- Plain operations -------------------------------------------------------

TEST(KvStoreTest, SetOverwrites) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Set(kNs, "k", "one", &woken).ok());
  ASSERT_TRUE(store.Set(kNs, "k", "two", &woken).ok());
  EXPECT_EQ(Peek(store, kNs, "k"), "two");
  EXPECT_EQ(store.NumKeys(kNs), 1);
  EXPECT_EQ(IdsOf(woken), Ids{});
}

TEST(KvStoreTest, SetAcceptsEmptyAndBinaryValues) {
  KvStore store;
  std::vector<Wakeup> woken;
  const std::string binary("a\0b", 3);
  ASSERT_TRUE(store.Set(kNs, "empty", "", &woken).ok());
  ASSERT_TRUE(store.Set(kNs, binary, binary, &woken).ok());
  EXPECT_EQ(Peek(store, kNs, "empty"), "");
  EXPECT_EQ(Peek(store, kNs, binary), binary);
}

TEST(KvStoreTest, Add) {
  struct Case {
    const char* name;
    std::optional<std::string> initial;
    int64_t delta;
    absl::StatusCode code;
    int64_t result;  // when ok
  };
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  const std::vector<Case> cases = {
      {"absent counts as zero", std::nullopt, 5, absl::StatusCode::kOk, 5},
      {"absent with negative delta", std::nullopt, -3, absl::StatusCode::kOk, -3},
      {"adds to existing", "10", 7, absl::StatusCode::kOk, 17},
      {"negative existing", "-4", 4, absl::StatusCode::kOk, 0},
      {"zero delta reads", "42", 0, absl::StatusCode::kOk, 42},
      {"reaches int64 max", absl::StrCat(kMax - 1), 1, absl::StatusCode::kOk, kMax},
      {"reaches int64 min", absl::StrCat(kMin + 1), -1, absl::StatusCode::kOk, kMin},
      {"text", "abc", 1, absl::StatusCode::kInvalidArgument, 0},
      {"empty string", "", 1, absl::StatusCode::kInvalidArgument, 0},
      // As c10d's servers read counters (std::stoll): a leading integer.
      {"fraction", "1.5", 1, absl::StatusCode::kOk, 2},
      {"trailing garbage", "12abc", 1, absl::StatusCode::kOk, 13},
      {"leading blanks", " \t7", 1, absl::StatusCode::kOk, 8},
      {"plus sign", "+3", 1, absl::StatusCode::kOk, 4},
      {"negative with garbage", "-5x", 1, absl::StatusCode::kOk, -4},
      {"hex is its leading 0", "0x10", 1, absl::StatusCode::kOk, 1},
      {"a sign alone", "-", 1, absl::StatusCode::kInvalidArgument, 0},
      {"too big for int64", "99999999999999999999", 1, absl::StatusCode::kInvalidArgument,
       0},
      {"overflow", absl::StrCat(kMax), 1, absl::StatusCode::kOutOfRange, 0},
      {"underflow", absl::StrCat(kMin), -1, absl::StatusCode::kOutOfRange, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    KvStore store;
    std::vector<Wakeup> woken;
    if (c.initial) {
      ASSERT_TRUE(store.Set(kNs, "n", *c.initial, &woken).ok());
    }
    absl::StatusOr<int64_t> sum = store.Add(kNs, "n", c.delta, &woken);
    ASSERT_EQ(sum.status().code(), c.code) << sum.status();
    if (sum.ok()) {
      EXPECT_EQ(*sum, c.result);
      // Stored as a decimal string, as c10d clients expect.
      EXPECT_EQ(Peek(store, kNs, "n"), absl::StrCat(c.result));
    } else {
      EXPECT_EQ(Peek(store, kNs, "n"), c.initial) << "a failed add changed the value";
    }
  }
}

TEST(KvStoreTest, AddNamesTheKeyOfANonIntegerValue) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Set(kNs, "rank", "abc", &woken).ok());
  EXPECT_PRED_FORMAT2(testing::IsSubstring, "rank",
                      std::string(store.Add(kNs, "rank", 1, &woken).status().message()));
}

TEST(KvStoreTest, CompareSetFollowsC10d) {
  struct Case {
    const char* name;
    std::optional<std::string> initial;
    std::string expected;
    std::string desired;
    std::string returned;
    std::optional<std::string> stored;
  };
  const std::vector<Case> cases = {
      {"absent, empty expected: sets", std::nullopt, "", "new", "new", "new"},
      {"absent, other expected: returns expected", std::nullopt, "old", "new", "old",
       std::nullopt},
      {"present and equal: sets", "old", "old", "new", "new", "new"},
      {"present and different: returns current", "cur", "old", "new", "cur", "cur"},
      {"present empty, empty expected: sets", "", "", "new", "new", "new"},
      {"present, empty expected: returns current", "cur", "", "new", "cur", "cur"},
      {"desired may be empty", "old", "old", "", "", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    KvStore store;
    std::vector<Wakeup> woken;
    if (c.initial) {
      ASSERT_TRUE(store.Set(kNs, "k", *c.initial, &woken).ok());
    }
    absl::StatusOr<std::string> result =
        store.CompareSet(kNs, "k", c.expected, c.desired, &woken);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(*result, c.returned);
    EXPECT_EQ(Peek(store, kNs, "k"), c.stored);
  }
}

TEST(KvStoreTest, AppendCreatesThenAppends) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Append(kNs, "log", "a", &woken).ok());
  ASSERT_TRUE(store.Append(kNs, "log", "bc", &woken).ok());
  ASSERT_TRUE(store.Append(kNs, "log", "", &woken).ok());
  EXPECT_EQ(Peek(store, kNs, "log"), "abc");
}

TEST(KvStoreTest, MultiSetSetsAllInOrder) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.MultiSet(kNs, {{"a", "1"}, {"b", "2"}, {"a", "3"}}, &woken).ok());
  EXPECT_EQ(Peek(store, kNs, "a"), "3");
  EXPECT_EQ(Peek(store, kNs, "b"), "2");
  EXPECT_EQ(store.NumKeys(kNs), 2);
  ASSERT_TRUE(store.MultiSet(kNs, {}, &woken).ok());
  EXPECT_EQ(store.NumKeys(kNs), 2);
}

TEST(KvStoreTest, DeleteReportsWhetherTheKeyExisted) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Set(kNs, "k", "v", &woken).ok());
  EXPECT_TRUE(store.Delete(kNs, "k"));
  EXPECT_FALSE(store.Delete(kNs, "k"));
  EXPECT_FALSE(store.Delete("other", "k"));
  EXPECT_EQ(Peek(store, kNs, "k"), std::nullopt);
  EXPECT_EQ(store.NumKeys(kNs), 0);
}

TEST(KvStoreTest, NumKeysCountsPerNamespace) {
  KvStore store;
  std::vector<Wakeup> woken;
  EXPECT_EQ(store.NumKeys("unknown"), 0);
  ASSERT_TRUE(store.Set("a", "x", "1", &woken).ok());
  ASSERT_TRUE(store.Set("a", "y", "1", &woken).ok());
  ASSERT_TRUE(store.Set("a", "y", "2", &woken).ok());
  ASSERT_TRUE(store.Set("b", "x", "1", &woken).ok());
  EXPECT_EQ(store.NumKeys("a"), 2);
  EXPECT_EQ(store.NumKeys("b"), 1);
  store.Delete("a", "x");
  EXPECT_EQ(store.NumKeys("a"), 1);
}

TEST(KvStoreTest, Check) {
  struct Case {
    const char* name;
    std::string ns;
    std::vector<std::string> keys;
    absl::StatusCode code;
    bool result;
  };
  const std::vector<Case> cases = {
      {"all present", kNs, {"a", "b"}, absl::StatusCode::kOk, true},
      {"one missing", kNs, {"a", "missing"}, absl::StatusCode::kOk, false},
      {"empty list", kNs, {}, absl::StatusCode::kOk, true},
      {"empty list, unknown namespace", "unknown", {}, absl::StatusCode::kOk, true},
      {"unknown namespace", "unknown", {"a"}, absl::StatusCode::kOk, false},
      {"empty key", kNs, {"a", ""}, absl::StatusCode::kInvalidArgument, false},
  };
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.MultiSet(kNs, {{"a", "1"}, {"b", "2"}}, &woken).ok());
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<bool> present = store.Check(c.ns, c.keys);
    ASSERT_EQ(present.status().code(), c.code) << present.status();
    if (present.ok()) {
      EXPECT_EQ(*present, c.result);
    }
  }
}

// --- Blocking queries answered at once --------------------------------------

TEST(KvStoreTest, BlockingQueriesAreReadyWhenKeysExist) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.MultiSet(kNs, {{"a", "1"}, {"b", "2"}}, &woken).ok());

  BlockingResult get = store.Get(kNs, "a", 1, At(10));
  EXPECT_TRUE(get.ready);
  EXPECT_TRUE(get.status.ok());
  EXPECT_EQ(get.values, (Values{"1"}));

  BlockingResult multi = store.MultiGet(kNs, {"b", "a", "b"}, 2, At(10));
  EXPECT_TRUE(multi.ready);
  EXPECT_EQ(multi.values, (Values{"2", "1", "2"}));

  BlockingResult wait = store.Wait(kNs, {"a", "b"}, 3, At(10));
  EXPECT_TRUE(wait.ready);
  EXPECT_TRUE(wait.status.ok());
  EXPECT_EQ(wait.values, Values{});

  EXPECT_EQ(store.num_waiters(), 0u);
  EXPECT_EQ(store.NextDeadline(), std::nullopt);
}

TEST(KvStoreTest, EmptyKeyListIsReadyAtOnce) {
  KvStore store;
  BlockingResult wait = store.Wait("unknown", {}, 1, At(10));
  EXPECT_TRUE(wait.ready);
  EXPECT_TRUE(wait.status.ok());
  BlockingResult multi = store.MultiGet("unknown", {}, 2, At(10));
  EXPECT_TRUE(multi.ready);
  EXPECT_TRUE(multi.status.ok());
  EXPECT_EQ(multi.values, Values{});
  EXPECT_EQ(store.num_waiters(), 0u);
  EXPECT_EQ(store.num_namespaces(), 0u);
}

TEST(KvStoreTest, BlockingQueriesRejectInvalidKeys) {
  KvStore store;
  BlockingResult get = store.Get(kNs, "", 1, At(10));
  EXPECT_TRUE(get.ready);
  EXPECT_EQ(get.status.code(), absl::StatusCode::kInvalidArgument);
  BlockingResult wait = store.Wait(kNs, {"ok", ""}, 2, At(10));
  EXPECT_TRUE(wait.ready);
  EXPECT_EQ(wait.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.num_waiters(), 0u);
}

// --- Waking -----------------------------------------------------------------

TEST(KvStoreTest, EveryCreatingMutationWakesAGet) {
  struct Case {
    const char* name;
    std::function<void(KvStore&, std::vector<Wakeup>*)> mutate;
    std::string value;
  };
  const std::vector<Case> cases = {
      {"set", [](KvStore& s, auto* w) { ASSERT_TRUE(s.Set(kNs, "k", "v", w).ok()); },
       "v"},
      {"add", [](KvStore& s, auto* w) { ASSERT_TRUE(s.Add(kNs, "k", 3, w).ok()); }, "3"},
      {"append",
       [](KvStore& s, auto* w) { ASSERT_TRUE(s.Append(kNs, "k", "tail", w).ok()); },
       "tail"},
      {"multi_set",
       [](KvStore& s, auto* w) {
         ASSERT_TRUE(s.MultiSet(kNs, {{"other", "x"}, {"k", "v"}}, w).ok());
       },
       "v"},
      {"compare_set",
       [](KvStore& s, auto* w) {
         ASSERT_EQ(s.CompareSet(kNs, "k", "", "new", w).value(), "new");
       },
       "new"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    KvStore store;
    BlockingResult get = store.Get(kNs, "k", 7, At(100));
    ASSERT_FALSE(get.ready);
    ASSERT_EQ(store.num_waiters(), 1u);
    std::vector<Wakeup> woken;
    c.mutate(store, &woken);
    ASSERT_EQ(woken.size(), 1u);
    EXPECT_EQ(woken[0].waiter, 7u);
    EXPECT_TRUE(woken[0].status.ok()) << woken[0].status;
    EXPECT_EQ(woken[0].values, (Values{c.value}));
    EXPECT_EQ(store.num_waiters(), 0u);
    EXPECT_EQ(store.NextDeadline(), std::nullopt);
  }
}

TEST(KvStoreTest, MutationsThatCreateNothingWakeNobody) {
  StoreLimits limits;
  limits.max_value_bytes = 4;
  KvStore store(limits);
  std::vector<Wakeup> woken;
  ASSERT_FALSE(store.Wait(kNs, {"k"}, 1, At(100)).ready);
  // CompareSet on an absent key with a non-empty expectation stores nothing.
  ASSERT_EQ(store.CompareSet(kNs, "k", "old", "new", &woken).value(), "old");
  ASSERT_TRUE(store.Set(kNs, "unrelated", "v", &woken).ok());
  ASSERT_TRUE(store.Set("other-ns", "k", "v", &woken).ok());
  // Failed mutations of the awaited key wake nobody either.
  ASSERT_FALSE(store.Set(kNs, "k", "12345", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{});
  EXPECT_EQ(store.num_waiters(), 1u);
}

TEST(KvStoreTest, WaitWakesWithoutValues) {
  KvStore store;
  ASSERT_FALSE(store.Wait(kNs, {"k"}, 1, At(100)).ready);
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Set(kNs, "k", "v", &woken).ok());
  ASSERT_EQ(woken.size(), 1u);
  EXPECT_TRUE(woken[0].status.ok());
  EXPECT_EQ(woken[0].values, Values{});
}

TEST(KvStoreTest, MultiKeyWaitWakesOnlyWhenTheLastKeyArrives) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Set(kNs, "a", "1", &woken).ok());
  ASSERT_FALSE(store.MultiGet(kNs, {"c", "a", "b", "c"}, 1, At(100)).ready);
  ASSERT_TRUE(store.Set(kNs, "b", "2", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{});
  ASSERT_TRUE(store.Set(kNs, "b", "2b", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{});
  ASSERT_TRUE(store.Set(kNs, "c", "3", &woken).ok());
  ASSERT_EQ(woken.size(), 1u);
  EXPECT_EQ(woken[0].values, (Values{"3", "1", "2b", "3"}));
}

TEST(KvStoreTest, ValuesAreReadAtWakeTime) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_FALSE(store.MultiGet(kNs, {"a", "b"}, 1, At(100)).ready);
  ASSERT_TRUE(store.Set(kNs, "a", "first", &woken).ok());
  ASSERT_TRUE(store.Append(kNs, "a", "+more", &woken).ok());
  ASSERT_TRUE(store.Set(kNs, "b", "b", &woken).ok());
  ASSERT_EQ(woken.size(), 1u);
  EXPECT_EQ(woken[0].values, (Values{"first+more", "b"}));
}

TEST(KvStoreTest, MultiSetWakesWithItsFinalValues) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_FALSE(store.Get(kNs, "a", 1, At(100)).ready);
  ASSERT_FALSE(store.MultiGet(kNs, {"a", "b"}, 2, At(100)).ready);
  ASSERT_TRUE(store.MultiSet(kNs, {{"a", "1"}, {"b", "2"}, {"a", "3"}}, &woken).ok());
  ASSERT_EQ(woken.size(), 2u);
  EXPECT_EQ(IdsOf(woken), (Ids{1u, 2u}));
  EXPECT_EQ(woken[0].values, (Values{"3"}));
  EXPECT_EQ(woken[1].values, (Values{"3", "2"}));
}

TEST(KvStoreTest, OneSetWakesEveryWaiterOnTheKeyAndNoOther) {
  KvStore store;
  std::vector<Wakeup> woken;
  for (WaiterId id = 1; id <= 5; ++id)
    ASSERT_FALSE(store.Wait(kNs, {"k"}, id, At(100)).ready);
  ASSERT_FALSE(store.Wait(kNs, {"k", "other"}, 6, At(100)).ready);
  ASSERT_FALSE(store.Wait(kNs, {"other"}, 7, At(100)).ready);
  ASSERT_TRUE(store.Set(kNs, "k", "v", &woken).ok());
  EXPECT_EQ(IdsOf(woken), (Ids{1u, 2u, 3u, 4u, 5u}));
  EXPECT_EQ(store.num_waiters(), 2u);
}

TEST(KvStoreTest, DeleteDoesNotWakeAndAWaiterNeverSeesADeletedKey) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Set(kNs, "a", "1", &woken).ok());
  ASSERT_FALSE(store.MultiGet(kNs, {"a", "b"}, 1, At(100)).ready);
  EXPECT_TRUE(store.Delete(kNs, "a"));
  EXPECT_EQ(IdsOf(woken), Ids{});
  // "a" was present when the waiter parked but is gone now: "b" alone must
  // not complete it.
  ASSERT_TRUE(store.Set(kNs, "b", "2", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{});
  EXPECT_EQ(store.num_waiters(), 1u);
  ASSERT_TRUE(store.Set(kNs, "a", "again", &woken).ok());
  ASSERT_EQ(woken.size(), 1u);
  EXPECT_EQ(woken[0].values, (Values{"again", "2"}));
}

TEST(KvStoreTest, DuplicateWaiterIdIsRefused) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Set(kNs, "present", "v", &woken).ok());
  ASSERT_FALSE(store.Wait(kNs, {"k"}, 1, At(100)).ready);
  for (bool answerable : {false, true}) {
    SCOPED_TRACE(answerable);
    BlockingResult again = answerable ? store.Get(kNs, "present", 1, At(200))
                                      : store.Get(kNs, "k2", 1, At(200));
    EXPECT_TRUE(again.ready);
    EXPECT_EQ(again.status.code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(store.num_waiters(), 1u);
  EXPECT_EQ(store.NextDeadline(), At(100));
  // The original is untouched and the id is free again once it is woken.
  ASSERT_TRUE(store.Set(kNs, "k", "v", &woken).ok());
  EXPECT_EQ(IdsOf(woken), (Ids{1u}));
  EXPECT_FALSE(store.Wait(kNs, {"k2"}, 1, At(100)).ready);
}

// --- Expiry, cancel, deadlines ----------------------------------------------

TEST(KvStoreTest, ExpireTimesOutDueWaitersInDeadlineOrder) {
  KvStore store;
  ASSERT_FALSE(store.Wait(kNs, {"k"}, 1, At(30)).ready);
  ASSERT_FALSE(store.Wait(kNs, {"k"}, 2, At(10)).ready);
  ASSERT_FALSE(store.Wait(kNs, {"k"}, 3, At(20)).ready);
  ASSERT_FALSE(store.Wait(kNs, {"k"}, 4, At(10)).ready);
  std::vector<Wakeup> woken;

  store.ExpireWaiters(At(9), &woken);
  EXPECT_EQ(IdsOf(woken), Ids{});

  store.ExpireWaiters(At(20), &woken);  // deadline <= now expires
  EXPECT_EQ(IdsOf(woken), (Ids{2u, 4u, 3u}));
  for (const Wakeup& wake : woken) {
    EXPECT_EQ(wake.status.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(wake.values, Values{});
  }
  EXPECT_EQ(store.num_waiters(), 1u);
  EXPECT_EQ(store.NextDeadline(), At(30));

  // Timed-out waiters are gone: the key arriving wakes only the live one.
  woken.clear();
  ASSERT_TRUE(store.Set(kNs, "k", "v", &woken).ok());
  EXPECT_EQ(IdsOf(woken), (Ids{1u}));
}

TEST(KvStoreTest, TimeoutNamesOnlyTheKeysStillMissing) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Set(kNs, "here", "v", &woken).ok());
  ASSERT_FALSE(store.MultiGet(kNs, {"here", "b", "a", "b", "late"}, 1, At(10)).ready);
  ASSERT_TRUE(store.Set(kNs, "late", "v", &woken).ok());
  store.ExpireWaiters(At(10), &woken);
  ASSERT_EQ(woken.size(), 1u);
  EXPECT_EQ(woken[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(woken[0].status.message(), "timed out waiting for keys: 'b', 'a'");
}

TEST(KvStoreTest, TimeoutListsTenKeysThenCountsTheRest) {
  KvStore store;
  std::vector<std::string> keys;
  for (int i = 0; i < 15; ++i) keys.push_back(absl::StrCat("key", i));
  ASSERT_FALSE(store.Wait(kNs, keys, 1, At(10)).ready);
  std::vector<Wakeup> woken;
  store.ExpireWaiters(At(10), &woken);
  ASSERT_EQ(woken.size(), 1u);
  const std::string message(woken[0].status.message());
  EXPECT_PRED_FORMAT2(testing::IsSubstring, "'key0', 'key1'", message);
  EXPECT_PRED_FORMAT2(testing::IsSubstring, "'key9' and 5 more", message);
  EXPECT_PRED_FORMAT2(testing::IsNotSubstring, "key10", message);
}

TEST(KvStoreTest, CancelForgetsSilently) {
  KvStore store;
  ASSERT_FALSE(store.Get(kNs, "k", 1, At(10)).ready);
  ASSERT_FALSE(store.Get(kNs, "k", 2, At(20)).ready);
  store.CancelWaiter(1);
  store.CancelWaiter(99);  // unknown: no-op
  EXPECT_EQ(store.num_waiters(), 1u);
  EXPECT_EQ(store.NextDeadline(), At(20));

  std::vector<Wakeup> woken;
  store.ExpireWaiters(At(15), &woken);
  EXPECT_EQ(IdsOf(woken), Ids{});
  ASSERT_TRUE(store.Set(kNs, "k", "v", &woken).ok());
  EXPECT_EQ(IdsOf(woken), (Ids{2u}));
  // A cancelled id may be reused.
  EXPECT_TRUE(store.Get(kNs, "k", 1, At(10)).ready);
}

TEST(KvStoreTest, NextDeadlineTracksTheEarliestLiveWaiter) {
  KvStore store;
  std::vector<Wakeup> woken;
  EXPECT_EQ(store.NextDeadline(), std::nullopt);
  ASSERT_FALSE(store.Wait(kNs, {"a"}, 1, At(50)).ready);
  EXPECT_EQ(store.NextDeadline(), At(50));
  ASSERT_FALSE(store.Wait(kNs, {"b"}, 2, At(20)).ready);
  EXPECT_EQ(store.NextDeadline(), At(20));
  ASSERT_FALSE(store.Wait(kNs, {"c"}, 3, At(30)).ready);
  ASSERT_TRUE(store.Set(kNs, "b", "v", &woken).ok());  // woken
  EXPECT_EQ(store.NextDeadline(), At(30));
  store.CancelWaiter(3);
  EXPECT_EQ(store.NextDeadline(), At(50));
  store.ExpireWaiters(At(50), &woken);
  EXPECT_EQ(store.NextDeadline(), std::nullopt);
}

TEST(KvStoreTest, AParkedWaiterPastItsDeadlineWaitsForExpire) {
  // The core has no clock: a deadline already past still parks, and the
  // adapter's next ExpireWaiters() times it out.
  KvStore store;
  ASSERT_FALSE(store.Wait(kNs, {"k"}, 1, At(0)).ready);
  std::vector<Wakeup> woken;
  store.ExpireWaiters(At(0), &woken);
  EXPECT_EQ(IdsOf(woken), (Ids{1u}));
}

// --- Namespaces ---------------------------------------------------------------

TEST(KvStoreTest, NamespacesAreIsolated) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_FALSE(store.Get("a", "k", 1, At(100)).ready);
  ASSERT_TRUE(store.Set("b", "k", "in b", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{});
  ASSERT_TRUE(store.Add("c", "k", 5, &woken).ok());
  EXPECT_EQ(Peek(store, "b", "k"), "in b");
  EXPECT_EQ(Peek(store, "c", "k"), "5");
  EXPECT_EQ(Peek(store, "a", "k"), std::nullopt);
  ASSERT_TRUE(store.Set("a", "k", "in a", &woken).ok());
  ASSERT_EQ(woken.size(), 1u);
  EXPECT_EQ(woken[0].values, (Values{"in a"}));
}

TEST(KvStoreTest, DropNamespaceRemovesDataAndAbortsItsWaiters) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.MultiSet("done", {{"a", "1"}, {"b", "2"}}, &woken).ok());
  ASSERT_TRUE(store.Set("live", "a", "1", &woken).ok());
  ASSERT_FALSE(store.Wait("done", {"x", "y"}, 1, At(10)).ready);
  ASSERT_FALSE(store.Get("done", "x", 2, At(20)).ready);
  ASSERT_FALSE(store.Get("live", "x", 3, At(30)).ready);
  ASSERT_EQ(store.num_namespaces(), 2u);

  store.DropNamespace("done", &woken);
  EXPECT_EQ(IdsOf(woken), (Ids{1u, 2u}));
  for (const Wakeup& wake : woken) {
    EXPECT_EQ(wake.status.code(), absl::StatusCode::kAborted);
    EXPECT_PRED_FORMAT2(testing::IsSubstring, "done", std::string(wake.status.message()));
  }
  EXPECT_EQ(store.NumKeys("done"), 0);
  EXPECT_EQ(Peek(store, "done", "a"), std::nullopt);
  EXPECT_EQ(store.num_namespaces(), 1u);
  EXPECT_EQ(store.num_waiters(), 1u);
  EXPECT_EQ(store.NextDeadline(), At(30));

  // The other namespace is untouched, and the dropped one starts afresh.
  woken.clear();
  store.DropNamespace("never-existed", &woken);
  EXPECT_EQ(IdsOf(woken), Ids{});
  EXPECT_EQ(Peek(store, "live", "a"), "1");
  ASSERT_TRUE(store.Set("done", "x", "v", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{});
  EXPECT_EQ(store.NumKeys("done"), 1);
}

// Run ids may contain '/', so run "a"'s namespaces are "a/e<epoch>.r<round>"
// (or "a/r<round>") exactly: a prefix match on "a/" also took run "a/b"'s
// ("a/b/e1.r1") and run "a/e1.r1"'s ("a/e1.r1/e2.r3").
TEST(KvStoreTest, NamespacesOfRunAreItsRoundsOnly) {
  KvStore store;
  std::vector<Wakeup> woken;
  for (const char* ns :
       {"a/e1.r1", "a/e12.r22", "a/r3", "a/b/e1.r1", "a/e1.r1/e2.r3", "a/r", "a/e1.r",
        "a/e.r1", "a/e1r1", "a/e1.r1x", "a/rx", "ab/e1.r1", "a", "b/a/e1.r1"})
    ASSERT_TRUE(store.Set(ns, "k", "v", &woken).ok()) << ns;
  auto of_run = [&](const std::string& run_id) {
    auto names = store.NamespacesOfRun(run_id);
    std::sort(names.begin(), names.end());
    return names;
  };
  EXPECT_EQ(of_run("a"), (std::vector<std::string>{"a/e1.r1", "a/e12.r22", "a/r3"}));
  EXPECT_EQ(of_run("a/b"), (std::vector<std::string>{"a/b/e1.r1"}));
  EXPECT_EQ(of_run("a/e1.r1"), (std::vector<std::string>{"a/e1.r1/e2.r3"}));
  EXPECT_EQ(of_run("b"), (std::vector<std::string>{}));
}

// One write can wake any number of gets, each copying the value; past the
// budget the caller is left to read them when it delivers.
TEST(KvStoreTest, WokenValuesStopAtTheBudget) {
  KvStore store;
  std::vector<Wakeup> woken;
  for (WaiterId id : {1, 2, 3}) ASSERT_FALSE(store.Get("ns", "k", id, At(10)).ready);
  ASSERT_FALSE(store.Wait("ns", {"k"}, 4, At(10)).ready);
  store.set_woken_value_budget(10);
  ASSERT_TRUE(store.Set("ns", "k", "12345", &woken).ok());
  ASSERT_EQ(IdsOf(woken), (Ids{1u, 2u, 3u, 4u}));
  EXPECT_EQ(woken[0].values, (Values{"12345"}));
  EXPECT_EQ(woken[1].values, (Values{"12345"}));
  EXPECT_TRUE(woken[2].reread);
  EXPECT_TRUE(woken[2].values.empty());
  EXPECT_TRUE(woken[2].status.ok());
  EXPECT_FALSE(woken[3].reread);  // a wait carries no values
  EXPECT_EQ(store.num_waiters(), 0u);
  // Reading again under the same id answers at once.
  BlockingResult again = store.MultiGet("ns", {"k"}, 3, At(10));
  ASSERT_TRUE(again.ready);
  EXPECT_EQ(again.values, (Values{"12345"}));
}

TEST(KvStoreTest, EmptyNamespacesAreForgotten) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Set("a", "k", "v", &woken).ok());
  ASSERT_FALSE(store.Wait("b", {"k"}, 1, At(10)).ready);
  ASSERT_FALSE(store.Wait("c", {"k"}, 2, At(10)).ready);
  EXPECT_EQ(store.num_namespaces(), 3u);
  store.Delete("a", "k");
  store.CancelWaiter(1);
  store.ExpireWaiters(At(10), &woken);
  EXPECT_EQ(store.num_namespaces(), 0u);
  // Queries do not create namespaces.
  EXPECT_EQ(store.NumKeys("d"), 0);
  EXPECT_FALSE(store.Check("d", {"k"}).value());
  EXPECT_EQ(store.num_namespaces(), 0u);
}

// --- Limits -------------------------------------------------------------------

// What a refused operation must leave as it was.
struct Snapshot {
  std::vector<std::optional<std::string>> values;
  std::vector<int64_t> num_keys;
  size_t num_namespaces;
  size_t num_waiters;
  std::optional<TimePoint> next_deadline;

  bool operator==(const Snapshot& o) const {
    return values == o.values && num_keys == o.num_keys &&
           num_namespaces == o.num_namespaces && num_waiters == o.num_waiters &&
           next_deadline == o.next_deadline;
  }
};

Snapshot Take(KvStore& store) {
  Snapshot snap;
  for (const char* ns : {"run", "other", "new"}) {
    snap.num_keys.push_back(store.NumKeys(ns));
    for (const char* key : {"a", "b", "c", "n", "k"})
      snap.values.push_back(Peek(store, ns, key));
  }
  snap.num_namespaces = store.num_namespaces();
  snap.num_waiters = store.num_waiters();
  snap.next_deadline = store.NextDeadline();
  return snap;
}

TEST(KvStoreTest, LimitsRefuseAndChangeNothing) {
  using Op = std::function<absl::Status(KvStore&, std::vector<Wakeup>*)>;
  auto blocking = [](const BlockingResult& r) {
    EXPECT_TRUE(r.ready) << "a refused blocking call must not park";
    return r.status;
  };
  struct Case {
    const char* name;
    StoreLimits limits;
    Op setup;  // may be null; brings the store up to the limit
    Op op;     // must be refused
    absl::StatusCode code;
    std::string message;  // a substring
  };
  StoreLimits small;
  small.max_key_bytes = 8;
  small.max_value_bytes = 8;
  small.max_keys_per_namespace = 3;
  small.max_bytes_per_namespace = 20;
  small.max_namespaces = 2;
  small.max_keys_per_request = 3;
  small.max_waiters = 2;
  auto with = [&](size_t StoreLimits::*field, size_t value) {
    StoreLimits limits = small;
    limits.*field = value;
    return limits;
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const auto kExhausted = absl::StatusCode::kResourceExhausted;
  const std::vector<std::string> four_keys = {"a", "b", "c", "n"};

  // Every case starts from run = {a: "1", b: "22"} (5 bytes, 2 keys) and a
  // waiter on "k" in namespace "other": two of two namespaces, one of two
  // waiters.
  const std::vector<Case> cases = {
      {"empty key", small, nullptr,
       [](KvStore& s, auto* w) { return s.Set(kNs, "", "v", w); }, kInvalid, "empty"},
      {"long key", small, nullptr,
       [](KvStore& s, auto* w) { return s.Set(kNs, "123456789", "v", w); }, kInvalid,
       "key of 9 bytes exceeds the limit of 8 bytes"},
      {"long key on add", small, nullptr,
       [](KvStore& s, auto* w) { return s.Add(kNs, "123456789", 1, w).status(); },
       kInvalid, "limit of 8"},
      {"long key on append", small, nullptr,
       [](KvStore& s, auto* w) { return s.Append(kNs, "123456789", "v", w); }, kInvalid,
       "limit of 8"},
      {"long key on compare_set", small, nullptr,
       [](KvStore& s, auto* w) {
         return s.CompareSet(kNs, "123456789", "", "v", w).status();
       },
       kInvalid, "limit of 8"},
      {"long key on get", small, nullptr,
       [&](KvStore& s, auto*) { return blocking(s.Get(kNs, "123456789", 9, At(5))); },
       kInvalid, "limit of 8"},
      {"long key on check", small, nullptr,
       [](KvStore& s, auto*) { return s.Check(kNs, {"123456789"}).status(); }, kInvalid,
       "limit of 8"},
      {"large value", small, nullptr,
       [](KvStore& s, auto* w) { return s.Set(kNs, "c", "123456789", w); }, kExhausted,
       "value of 9 bytes exceeds the limit of 8 bytes"},
      {"large value overwriting", small, nullptr,
       [](KvStore& s, auto* w) { return s.Set(kNs, "a", "123456789", w); }, kExhausted,
       "value of 9 bytes"},
      {"large value waking nobody", small, nullptr,
       [](KvStore& s, auto* w) { return s.Set("other", "k", "123456789", w); },
       kExhausted, "value of 9 bytes"},
      {"append past the value limit", small, nullptr,
       [](KvStore& s, auto* w) { return s.Append(kNs, "b", "1234567", w); }, kExhausted,
       "value of 9 bytes"},
      {"large value on creating append", small, nullptr,
       [](KvStore& s, auto* w) { return s.Append(kNs, "c", "123456789", w); }, kExhausted,
       "value of 9 bytes"},
      {"add past the value limit", with(&StoreLimits::max_value_bytes, 2), nullptr,
       [](KvStore& s, auto* w) { return s.Add(kNs, "b", 78, w).status(); }, kExhausted,
       "value of 3 bytes exceeds the limit of 2 bytes"},
      {"large desired on compare_set", small, nullptr,
       [](KvStore& s, auto* w) {
         return s.CompareSet(kNs, "a", "1", "123456789", w).status();
       },
       kExhausted, "value of 9 bytes"},
      {"large desired on a losing compare_set", small, nullptr,
       [](KvStore& s, auto* w) {
         return s.CompareSet(kNs, "a", "other", "123456789", w).status();
       },
       kExhausted, "value of 9 bytes"},
      {"too many keys in namespace", small,
       [](KvStore& s, auto* w) {
         EXPECT_TRUE(s.Set(kNs, "c", "3", w).ok());
         // Overwriting needs no new key.
         return s.Set(kNs, "c", "33", w);
       },
       [](KvStore& s, auto* w) { return s.Add(kNs, "n", 1, w).status(); }, kExhausted,
       "4 keys, more than the limit of 3"},
      {"new key past namespace bytes", with(&StoreLimits::max_keys_per_namespace, 10),
       // 5 + 9 = 14, then 14 + 7 = 21.
       [](KvStore& s, auto* w) { return s.Set(kNs, "c", "12345678", w); },
       [](KvStore& s, auto* w) { return s.Set(kNs, "n", "123456", w); }, kExhausted,
       "21 bytes, more than the limit of 20 bytes"},
      {"overwrite past namespace bytes", with(&StoreLimits::max_bytes_per_namespace, 10),
       // b grows from 3 to 8 bytes: exactly 10; one more byte is refused.
       [](KvStore& s, auto* w) { return s.Set(kNs, "b", "1234567", w); },
       [](KvStore& s, auto* w) { return s.Set(kNs, "b", "12345678", w); }, kExhausted,
       "11 bytes, more than the limit of 10 bytes"},
      {"append past namespace bytes", with(&StoreLimits::max_bytes_per_namespace, 10),
       nullptr, [](KvStore& s, auto* w) { return s.Append(kNs, "a", "123456", w); },
       kExhausted, "11 bytes"},
      {"compare_set past namespace bytes",
       with(&StoreLimits::max_bytes_per_namespace, 10), nullptr,
       [](KvStore& s, auto* w) {
         return s.CompareSet(kNs, "a", "1", "1234567", w).status();
       },
       kExhausted, "11 bytes"},
      {"too many namespaces", small, nullptr,
       [](KvStore& s, auto* w) { return s.Set("new", "a", "1", w); }, kExhausted,
       "limit of 2 namespaces"},
      {"too many namespaces on add", small, nullptr,
       [](KvStore& s, auto* w) { return s.Add("new", "a", 1, w).status(); }, kExhausted,
       "limit of 2 namespaces"},
      {"too many namespaces on wait", with(&StoreLimits::max_waiters, 10), nullptr,
       [&](KvStore& s, auto*) { return blocking(s.Wait("new", {"k"}, 9, At(5))); },
       kExhausted, "limit of 2 namespaces"},
      {"multi_set with too many entries", small, nullptr,
       [](KvStore& s, auto* w) {
         return s.MultiSet(kNs, {{"a", "1"}, {"b", "2"}, {"c", "3"}, {"n", "4"}}, w);
       },
       kInvalid, "4 keys, more than the limit of 3"},
      {"multi_get with too many keys", small, nullptr,
       [&](KvStore& s, auto*) { return blocking(s.MultiGet(kNs, four_keys, 9, At(5))); },
       kInvalid, "limit of 3"},
      {"wait with too many keys", small, nullptr,
       [&](KvStore& s, auto*) { return blocking(s.Wait(kNs, four_keys, 9, At(5))); },
       kInvalid, "limit of 3"},
      {"check with too many keys", small, nullptr,
       [&](KvStore& s, auto*) { return s.Check(kNs, four_keys).status(); }, kInvalid,
       "limit of 3"},
      {"too many waiters", small,
       [&](KvStore& s, auto*) {
         // Answered calls do not count against the limit.
         EXPECT_TRUE(s.Get(kNs, "a", 8, At(5)).ready);
         EXPECT_FALSE(s.Wait(kNs, {"c"}, 8, At(5)).ready);
         return absl::OkStatus();
       },
       [&](KvStore& s, auto*) { return blocking(s.Wait(kNs, {"c"}, 9, At(5))); },
       kExhausted, "limit of 2 blocked requests"},
      {"multi_set with one large value sets nothing", small, nullptr,
       [](KvStore& s, auto* w) {
         return s.MultiSet(kNs, {{"a", "new"}, {"k", "v"}, {"c", "123456789"}}, w);
       },
       kExhausted, "value of 9 bytes"},
      {"multi_set with one bad key sets nothing", small, nullptr,
       [](KvStore& s, auto* w) {
         return s.MultiSet(kNs, {{"k", "v"}, {"", "v"}}, w);
       },
       kInvalid, "empty"},
      {"multi_set past keys per namespace sets nothing", small, nullptr,
       [](KvStore& s, auto* w) {
         return s.MultiSet(kNs, {{"k", "v"}, {"c", "v"}}, w);
       },
       kExhausted, "4 keys, more than the limit of 3"},
      {"multi_set past namespace bytes sets nothing",
       with(&StoreLimits::max_bytes_per_namespace, 15), nullptr,
       // a: 2 -> 9, k: +2, b: 3 -> 9 makes 20.
       [](KvStore& s, auto* w) {
         return s.MultiSet(kNs, {{"a", "12345678"}, {"k", "v"}, {"b", "12345678"}}, w);
       },
       kExhausted, "20 bytes, more than the limit of 15 bytes"},
      {"multi_set into a new namespace past the limit", small, nullptr,
       [](KvStore& s, auto* w) {
         return s.MultiSet("new", {{"a", "1"}}, w);
       },
       kExhausted, "namespaces"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    KvStore store(c.limits);
    std::vector<Wakeup> woken;
    ASSERT_TRUE(store.MultiSet(kNs, {{"a", "1"}, {"b", "22"}}, &woken).ok());
    ASSERT_FALSE(store.Wait("other", {"k"}, 1, At(50)).ready);
    if (c.setup) {
      ASSERT_TRUE(c.setup(store, &woken).ok());
    }
    const Snapshot before = Take(store);
    absl::Status status = c.op(store, &woken);
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_PRED_FORMAT2(testing::IsSubstring, c.message, std::string(status.message()));
    EXPECT_TRUE(Take(store) == before) << "a refused op changed the store";
    EXPECT_EQ(IdsOf(woken), Ids{});
  }
}

TEST(KvStoreTest, MultiSetCountsARepeatedKeyOnce) {
  StoreLimits limits;
  limits.max_keys_per_namespace = 2;
  limits.max_bytes_per_namespace = 4;
  KvStore store(limits);
  std::vector<Wakeup> woken;
  // Summed naively this is 3 keys and 6 bytes; finally it is 2 keys, 4 bytes.
  ASSERT_TRUE(store.MultiSet(kNs, {{"a", "1"}, {"a", "2"}, {"b", "3"}}, &woken).ok());
  EXPECT_EQ(store.NumKeys(kNs), 2);
}

TEST(KvStoreTest, NamespaceBytesAreTrackedExactly) {
  StoreLimits limits;
  limits.max_bytes_per_namespace = 10;
  KvStore store(limits);
  std::vector<Wakeup> woken;
  // The comments give the namespace's bytes after each call.
  ASSERT_TRUE(store.Set(kNs, "ab", "12345678", &woken).ok());       // 10
  EXPECT_FALSE(store.Set(kNs, "c", "", &woken).ok());               // 11: refused
  ASSERT_TRUE(store.Set(kNs, "ab", "1", &woken).ok());              // 3
  ASSERT_TRUE(store.Append(kNs, "ab", "23", &woken).ok());          // 5
  ASSERT_TRUE(store.Add(kNs, "c", 10, &woken).ok());                // 8
  EXPECT_FALSE(store.Append(kNs, "c", "000", &woken).ok());         // 11: refused
  ASSERT_TRUE(store.Add(kNs, "c", -9, &woken).ok());                // 7
  ASSERT_TRUE(store.CompareSet(kNs, "c", "1", "10", &woken).ok());  // 8
  ASSERT_TRUE(store.MultiSet(kNs, {{"c", "1234"}, {"c", "1"}}, &woken).ok());  // 7
  ASSERT_TRUE(store.Set(kNs, "d", "", &woken).ok());                           // 8
  EXPECT_FALSE(store.Set(kNs, "d", "123", &woken).ok());  // 11: refused
  EXPECT_TRUE(store.Delete(kNs, "c"));                    // 6
  ASSERT_TRUE(store.Set(kNs, "d", "1234", &woken).ok());  // 10
  EXPECT_FALSE(store.Set(kNs, "e", "", &woken).ok());     // 11: refused
  // Other namespaces have their own budget.
  EXPECT_TRUE(store.Set("other", "0123456789", "", &woken).ok());
}

// --- Scale ----------------------------------------------------------------------

TEST(KvStoreTest, TenThousandClientBarrier) {
  constexpr int kClients = 10000;
  KvStore store;
  std::vector<Wakeup> woken;
  for (int rank = 0; rank < kClients; ++rank) {
    absl::StatusOr<int64_t> arrived = store.Add(kNs, "arrived", 1, &woken);
    ASSERT_TRUE(arrived.ok());
    ASSERT_EQ(*arrived, rank + 1);
  }
  for (int rank = 0; rank < kClients; ++rank) {
    ASSERT_FALSE(store.Wait(kNs, {"done"}, rank, At(1000 + rank % 7)).ready);
  }
  EXPECT_EQ(store.num_waiters(), size_t{kClients});
  EXPECT_EQ(store.NextDeadline(), At(1000));

  ASSERT_TRUE(store.Set(kNs, "done", "1", &woken).ok());
  ASSERT_EQ(woken.size(), size_t{kClients});
  for (const Wakeup& wake : woken) ASSERT_TRUE(wake.status.ok());
  EXPECT_EQ(store.num_waiters(), 0u);
  EXPECT_EQ(store.NextDeadline(), std::nullopt);
}

TEST(KvStoreTest, TenThousandWaitersExpireTogether) {
  constexpr int kClients = 10000;
  KvStore store;
  for (int rank = 0; rank < kClients; ++rank) {
    ASSERT_FALSE(store.Get(kNs, "done", rank, At(100)).ready);
  }
  // Cancelling many waiters that share a key and a deadline stays cheap.
  for (int rank = 0; rank < kClients; rank += 2) store.CancelWaiter(rank);
  std::vector<Wakeup> woken;
  store.ExpireWaiters(At(100), &woken);
  EXPECT_EQ(woken.size(), size_t{kClients / 2});
  EXPECT_EQ(store.num_waiters(), 0u);
  EXPECT_EQ(store.num_namespaces(), 0u);
}

// --- c10d's queues, list_keys and barrier -------------------------------------

TEST(KvStoreTest, QueuesAreFifoAndAreNotKeys) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.QueuePush(kNs, "q", "first", &woken).ok());
  ASSERT_TRUE(store.QueuePush(kNs, "q", "second", &woken).ok());
  EXPECT_EQ(store.QueueLength(kNs, "q"), 2);
  EXPECT_EQ(store.NumKeys(kNs), 0);
  EXPECT_EQ(*store.ListKeys(kNs), Values{});
  EXPECT_TRUE(*store.Check(kNs, {"q"}));  // a check sees a queue with an item
  auto popped = store.QueuePop(kNs, "q");
  ASSERT_TRUE(popped.ok());
  EXPECT_EQ(popped->length_before, 2);
  EXPECT_EQ(popped->value, "first");
  EXPECT_EQ(store.QueuePop(kNs, "q")->value, "second");
  EXPECT_EQ(store.QueuePop(kNs, "q")->length_before, 0);  // empty: nothing popped
  EXPECT_FALSE(*store.Check(kNs, {"q"}));
  EXPECT_EQ(store.num_namespaces(), 0u);  // an emptied queue leaves nothing behind
}

TEST(KvStoreTest, APushWakesOneWaiterNotAll) {
  KvStore store;
  ASSERT_FALSE(store.Wait(kNs, {"q"}, 1, At(100)).ready);
  ASSERT_FALSE(store.Wait(kNs, {"q"}, 2, At(100)).ready);
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.QueuePush(kNs, "q", "item", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{1});
  woken.clear();
  ASSERT_TRUE(store.QueuePush(kNs, "q", "item", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{2});
}

TEST(KvStoreTest, ListKeysIsSorted) {
  KvStore store;
  std::vector<Wakeup> woken;
  for (const char* key : {"b", "a", "c"})
    ASSERT_TRUE(store.Set(kNs, key, "v", &woken).ok());
  EXPECT_EQ(*store.ListKeys(kNs), (Values{"a", "b", "c"}));
  EXPECT_EQ(*store.ListKeys("other"), Values{});
}

TEST(KvStoreTest, BarrierReleasesEveryoneWhenTheLastArrives) {
  KvStore store;
  std::vector<Wakeup> woken;
  EXPECT_FALSE(store.Barrier(kNs, "b", 3, 1, At(100), &woken).ready);
  EXPECT_FALSE(store.Barrier(kNs, "b", 3, 2, At(100), &woken).ready);
  EXPECT_EQ(IdsOf(woken), Ids{});
  BlockingResult last = store.Barrier(kNs, "b", 3, 3, At(100), &woken);
  EXPECT_TRUE(last.ready);
  EXPECT_TRUE(last.status.ok());
  std::vector<WaiterId> ids = IdsOf(woken);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (Ids{1, 2}));
  EXPECT_EQ(Peek(store, kNs, "b"), "3");
  // A barrier key that reached its size lets later arrivals through.
  EXPECT_TRUE(store.Barrier(kNs, "b", 3, 4, At(100), &woken).ready);
}

TEST(KvStoreTest, ABarrierOfWorldSizeZeroOrLessCountsAndPassesAsTorchsDoes) {
  KvStore store;
  std::vector<Wakeup> woken;
  for (int64_t world_size : {0, -3}) {
    BlockingResult result = store.Barrier(kNs, "b", world_size, 1, At(100), &woken);
    EXPECT_TRUE(result.ready);
    EXPECT_TRUE(result.status.ok()) << result.status;
  }
  EXPECT_EQ(Peek(store, kNs, "b"), "2");
  EXPECT_EQ(store.num_waiters(), 0u);
}

TEST(KvStoreTest, ABarrierWaiterTimesOutAndIsCancelled) {
  KvStore store;
  std::vector<Wakeup> woken;
  EXPECT_FALSE(store.Barrier(kNs, "b", 2, 1, At(10), &woken).ready);
  EXPECT_FALSE(store.Barrier(kNs, "c", 2, 2, At(50), &woken).ready);
  store.CancelWaiter(2);
  store.ExpireWaiters(At(60), &woken);
  ASSERT_EQ(IdsOf(woken), Ids{1});
  EXPECT_EQ(woken[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(woken[0].status.message().find("1 of 2 arrived"), std::string::npos)
      << woken[0].status;
  EXPECT_EQ(store.num_waiters(), 0u);
}

// --- A queue's name: waits see its items, gets see values only --------------

TEST(KvStoreTest, AGetOfAQueuesNameWaitsForAValue) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.QueuePush(kNs, "q", "item", &woken).ok());
  EXPECT_TRUE(*store.Check(kNs, {"q"}));
  EXPECT_TRUE(store.Wait(kNs, {"q"}, 1, At(100)).ready);
  EXPECT_FALSE(store.Get(kNs, "q", 2, At(100)).ready);
  EXPECT_FALSE(store.MultiGet(kNs, {"q"}, 3, At(100)).ready);
  ASSERT_TRUE(store.QueuePush(kNs, "q", "another", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{});  // a push never answers a get
  ASSERT_TRUE(store.Set(kNs, "q", "value", &woken).ok());
  ASSERT_EQ(IdsOf(woken), (Ids{2, 3}));
  EXPECT_EQ(woken[0].values, Values{"value"});
  EXPECT_EQ(woken[1].values, Values{"value"});
  EXPECT_EQ(store.QueueLength(kNs, "q"), 2);  // the name holds both
}

TEST(KvStoreTest, AParkedGetIsNotAnsweredByAPushNorLostAfterARestore) {
  KvStore store;
  std::vector<Wakeup> woken;
  EXPECT_FALSE(store.Get(kNs, "q", 1, At(100)).ready);
  ASSERT_TRUE(store.QueuePush(kNs, "q", "item", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{});
  EXPECT_EQ(store.num_waiters(), 1u);

  KvStore restored;
  restored.RestoreQueuePush(kNs, "q", "item");
  EXPECT_FALSE(restored.Get(kNs, "q", 1, At(100)).ready);
  EXPECT_EQ(restored.MultiGet(kNs, {"q", "q"}, 2, At(100)).ready, false);
  restored.ExpireWaiters(At(100), &woken);
  EXPECT_EQ(IdsOf(woken), (Ids{1, 2}));
}

TEST(KvStoreTest, APushAnswersTheWaitItCompletesNotAMultiKeyWaitStillShort) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_FALSE(store.Wait(kNs, {"q", "k"}, 1, At(100)).ready);  // needs k too
  ASSERT_FALSE(store.Get(kNs, "q", 2, At(100)).ready);          // a value
  ASSERT_FALSE(store.Wait(kNs, {"q"}, 3, At(100)).ready);       // a popper
  ASSERT_FALSE(store.Wait(kNs, {"q"}, 4, At(100)).ready);       // another
  ASSERT_TRUE(store.QueuePush(kNs, "q", "item", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{3});
  woken.clear();
  // The item is still there (nobody popped): k completes the multi-key wait.
  ASSERT_TRUE(store.Set(kNs, "k", "v", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{1});
  woken.clear();
  ASSERT_TRUE(store.QueuePush(kNs, "q", "item", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{4});
  EXPECT_EQ(store.num_waiters(), 1u);  // the get
}

TEST(KvStoreTest, AnItemIsTheWokenWaitsAndTheWaitsAfterItWaitForTheNext) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_FALSE(store.Wait(kNs, {"q"}, 1, At(100)).ready);
  ASSERT_FALSE(store.Wait(kNs, {"q", "k"}, 2, At(100)).ready);
  ASSERT_TRUE(store.QueuePush(kNs, "q", "item", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{1});
  woken.clear();
  ASSERT_TRUE(store.Set(kNs, "k", "v", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{});  // the item went to wait 1
  ASSERT_TRUE(store.QueuePush(kNs, "q", "item", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{2});
}

TEST(KvStoreTest, AMultiKeyWaitPastAnEmptiedQueueParksThereAgain) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_FALSE(store.Wait(kNs, {"q", "k"}, 1, At(100)).ready);
  ASSERT_TRUE(store.QueuePush(kNs, "q", "item", &woken).ok());
  ASSERT_TRUE(store.QueuePop(kNs, "q").ok());
  ASSERT_TRUE(store.Set(kNs, "k", "v", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{});
  ASSERT_TRUE(store.QueuePush(kNs, "q", "item", &woken).ok());
  EXPECT_EQ(IdsOf(woken), Ids{1});
}

TEST(KvStoreTest, QueueItemsCountAsKeysWithTheirOverhead) {
  StoreLimits limits;
  limits.max_keys_per_namespace = 3;
  KvStore store(limits);
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Set(kNs, "k", "v", &woken).ok());
  ASSERT_TRUE(store.QueuePush(kNs, "q", "", &woken).ok());
  ASSERT_TRUE(store.QueuePush(kNs, "q", "", &woken).ok());
  EXPECT_EQ(store.QueuePush(kNs, "q", "", &woken).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store.Set(kNs, "k2", "v", &woken).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store.QueuePop(kNs, "q").ok());
  EXPECT_TRUE(store.Set(kNs, "k2", "v", &woken).ok());

  StoreLimits bytes_limits;
  bytes_limits.max_bytes_per_namespace = 10 * (1 + kQueueItemOverheadBytes);
  KvStore small(bytes_limits);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(small.QueuePush(kNs, "q", "", &woken).ok());
  EXPECT_EQ(small.QueuePush(kNs, "q", "", &woken).code(),
            absl::StatusCode::kResourceExhausted);
}

// --- Replies are budgeted before they are built -------------------------------

TEST(KvStoreTest, AMultiGetOverTheReplyBudgetIsRefusedNowOrWhenWoken) {
  StoreLimits limits;
  limits.max_value_bytes = 100;
  limits.max_reply_bytes = 250;
  KvStore store(limits);
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Set(kNs, "k", std::string(100, 'x'), &woken).ok());
  EXPECT_TRUE(store.MultiGet(kNs, {"k", "k"}, 1, At(100)).status.ok());
  BlockingResult three = store.MultiGet(kNs, {"k", "k", "k"}, 2, At(100));
  EXPECT_TRUE(three.ready);
  EXPECT_EQ(three.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(three.values.empty());
  EXPECT_EQ(store.PeekMany(kNs, {"k", "k", "k"}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*store.PeekMany(kNs, {"k", "absent"}), (Values{std::string(100, 'x'), ""}));

  ASSERT_FALSE(store.MultiGet(kNs, {"j", "j", "j"}, 3, At(100)).ready);
  ASSERT_TRUE(store.Set(kNs, "j", std::string(100, 'y'), &woken).ok());
  ASSERT_EQ(IdsOf(woken), Ids{3});
  EXPECT_EQ(woken[0].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(woken[0].values.empty());
}

TEST(KvStoreTest, TheReplyBudgetNeverRefusesOneValue) {
  StoreLimits limits;
  limits.max_value_bytes = 100;
  limits.max_reply_bytes = 10;  // raised to max_value_bytes
  KvStore store(limits);
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Set(kNs, "k", std::string(100, 'x'), &woken).ok());
  EXPECT_TRUE(store.Get(kNs, "k", 1, At(100)).status.ok());
}

TEST(KvStoreTest, ListKeysOverTheReplyBudgetIsRefused) {
  StoreLimits limits;
  limits.max_value_bytes = 16;
  limits.max_reply_bytes = 16;
  KvStore store(limits);
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Set(kNs, "a", "", &woken).ok());
  EXPECT_EQ(*store.ListKeys(kNs), Values{"a"});  // 1 + 8 bytes
  ASSERT_TRUE(store.Set(kNs, "b", "", &woken).ok());
  EXPECT_EQ(store.ListKeys(kNs).status().code(), absl::StatusCode::kResourceExhausted);
}

// --- Parked requests are capped per namespace, then in all -------------------

TEST(KvStoreTest, ANamespaceAtItsWaiterCapLeavesOtherNamespacesTheirWaits) {
  StoreLimits limits;
  limits.max_waiters_per_namespace = 2;
  limits.max_waiters = 5;
  KvStore store(limits);
  std::vector<Wakeup> woken;
  ASSERT_FALSE(store.Wait("a", {"k"}, 1, At(100)).ready);
  ASSERT_FALSE(store.Get("a", "k", 2, At(100)).ready);
  BlockingResult refused = store.Wait("a", {"j"}, 3, At(100));
  EXPECT_TRUE(refused.ready);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted);
  BlockingResult barrier = store.Barrier("a", "b", 2, 4, At(100), &woken);
  EXPECT_EQ(barrier.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Peek(store, "a", "b"), std::nullopt);  // a refused arrival is not counted
  EXPECT_EQ(store.num_waiters("a"), 2u);

  ASSERT_FALSE(store.Wait("b", {"k"}, 5, At(100)).ready);
  ASSERT_FALSE(store.Barrier("b", "bar", 3, 6, At(100), &woken).ready);
  ASSERT_FALSE(store.Wait("c", {"k"}, 7, At(100)).ready);
  EXPECT_EQ(store.Wait("d", {"k"}, 8, At(100)).status.code(),
            absl::StatusCode::kResourceExhausted);  // the global backstop

  // Woken, expired and cancelled waiters give their room back.
  ASSERT_TRUE(store.Set("a", "k", "v", &woken).ok());
  EXPECT_EQ(store.num_waiters("a"), 0u);
  store.CancelWaiter(5);
  store.ExpireWaiters(At(100), &woken);
  EXPECT_EQ(store.num_waiters(), 0u);
  EXPECT_EQ(store.num_waiters("b"), 0u);
  EXPECT_FALSE(store.Wait("a", {"j"}, 9, At(200)).ready);
}

StoredAnswer Answer(int64_t number, std::vector<std::string> values = {}) {
  StoredAnswer answer;
  answer.number = number;
  answer.values = std::move(values);
  return answer;
}

TEST(KvStoreTest, RememberedAnswersAreRecalledByNamespaceAndId) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Set(kNs, "k", "v", &woken).ok());
  StoredAnswer failed;
  failed.code = 8;
  failed.error = "full";
  failed.flag = true;
  ASSERT_TRUE(store.Remember(kNs, "id1", Answer(3, {"a", "b"})));
  ASSERT_TRUE(store.Remember(kNs, "id2", failed));
  EXPECT_EQ(store.Recall(kNs, "id1"), Answer(3, {"a", "b"}));
  EXPECT_EQ(store.Recall(kNs, "id2"), failed);
  EXPECT_EQ(store.Recall(kNs, "id3"), std::nullopt);
  EXPECT_EQ(store.Recall("other", "id1"), std::nullopt);
  EXPECT_EQ(store.num_remembered(kNs), 2u);
  // Apart from the keys.
  EXPECT_EQ(store.NumKeys(kNs), 1);
  EXPECT_EQ(*store.ListKeys(kNs), Values{"k"});
  EXPECT_EQ(store.num_entries(), 1u);
}

TEST(KvStoreTest, RememberedAnswersOutliveTheirNamespacesKeysUntilItIsDropped) {
  KvStore store;
  std::vector<Wakeup> woken;
  ASSERT_TRUE(store.Add("run/r1", "n", 1, &woken).ok());
  ASSERT_TRUE(store.Remember("run/r1", "id", Answer(1)));
  ASSERT_TRUE(store.Delete("run/r1", "n"));
  EXPECT_EQ(store.num_namespaces(), 0u);
  EXPECT_EQ(store.Recall("run/r1", "id"), Answer(1));
  // Its run's namespaces include it, so a forgotten run drops it too.
  EXPECT_EQ(store.NamespacesOfRun("run"), Values{"run/r1"});
  store.DropNamespace("run/r1", &woken);
  EXPECT_EQ(store.Recall("run/r1", "id"), std::nullopt);
  EXPECT_EQ(store.num_remembered("run/r1"), 0u);
  EXPECT_TRUE(store.NamespacesOfRun("run").empty());
}

// Issue 44 (7): an answer is forgotten only when its sender says so, never
// to make room: past the count the store says it can take no more.
TEST(KvStoreTest, NoRememberedAnswerIsForgottenPastTheCountOnlyRefused) {
  StoreLimits limits;
  limits.max_remembered_per_namespace = 3;
  KvStore store(limits);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(store.CanRemember(kNs)) << i;
    ASSERT_TRUE(store.Remember(kNs, absl::StrCat("id", i), Answer(i)));
  }
  EXPECT_FALSE(store.CanRemember(kNs));
  // Namespaces are bounded apart.
  EXPECT_TRUE(store.CanRemember("other"));
  // One remembered anyway (a restore) forgets nothing either.
  ASSERT_TRUE(store.Remember(kNs, "id3", Answer(3)));
  EXPECT_EQ(store.num_remembered(kNs), 4u);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(store.Recall(kNs, absl::StrCat("id", i)), Answer(i)) << i;
  // Remembering an id again replaces its answer and keeps its place.
  ASSERT_TRUE(store.Remember(kNs, "id1", Answer(10)));
  EXPECT_EQ(store.Recall(kNs, "id1"), Answer(10));
  std::vector<std::string> order;
  store.ForEachRemembered(
      [&](const std::string& ns, const std::string& id, const StoredAnswer&) {
        if (ns == kNs) order.push_back(id);
      });
  EXPECT_EQ(order, (Values{"id0", "id1", "id2", "id3"}));
  // The sender's word makes room; an id never remembered changes nothing.
  store.Forget(kNs, "id0");
  store.Forget(kNs, "unknown");
  store.Forget("nowhere", "id1");
  EXPECT_EQ(store.Recall(kNs, "id0"), std::nullopt);
  EXPECT_FALSE(store.CanRemember(kNs));
  store.Forget(kNs, "id2");
  EXPECT_TRUE(store.CanRemember(kNs));
  EXPECT_EQ(store.num_remembered(kNs), 2u);
  store.Forget(kNs, "id1");
  store.Forget(kNs, "id3");
  EXPECT_EQ(store.num_remembered(kNs), 0u);
  EXPECT_EQ(store.remembered_bytes(kNs), 0u);
  // A namespace left with nothing remembered is none of its run's.
  EXPECT_TRUE(store.NamespacesOfRun("run").empty());
}

// One answer larger than the byte bound forgets no other; it fills the
// bound alone until forgotten.
TEST(KvStoreTest, OneHugeRememberedAnswerForgetsNoOther) {
  StoreLimits limits;
  limits.max_remembered_bytes_per_namespace = 4096;
  KvStore store(limits);
  const std::string kilobyte(1024, 'x');
  for (int i = 0; i < 2; ++i)
    ASSERT_TRUE(store.Remember(kNs, absl::StrCat("id", i), Answer(i, {kilobyte})));
  EXPECT_TRUE(store.CanRemember(kNs));
  ASSERT_TRUE(store.Remember(kNs, "big", Answer(0, {std::string(8192, 'y')})));
  EXPECT_EQ(store.num_remembered(kNs), 3u);
  EXPECT_EQ(store.Recall(kNs, "id0"), Answer(0, {kilobyte}));
  EXPECT_EQ(store.Recall(kNs, "id1"), Answer(1, {kilobyte}));
  EXPECT_TRUE(store.Recall(kNs, "big").has_value());
  EXPECT_FALSE(store.CanRemember(kNs));
  store.Forget(kNs, "big");
  EXPECT_TRUE(store.CanRemember(kNs));
  EXPECT_EQ(store.num_remembered(kNs), 2u);
}

TEST(KvStoreTest, RememberingIsRefusedPastTheNamespaceCount) {
  StoreLimits limits;
  limits.max_namespaces = 2;
  KvStore store(limits);
  EXPECT_TRUE(store.Remember("a", "id", Answer(1)));
  EXPECT_TRUE(store.Remember("b", "id", Answer(1)));
  EXPECT_FALSE(store.CanRemember("c"));
  EXPECT_FALSE(store.Remember("c", "id", Answer(1)));
  EXPECT_TRUE(store.CanRemember("a"));
  EXPECT_TRUE(store.Remember("a", "id2", Answer(2)));
  EXPECT_EQ(store.Recall("c", "id"), std::nullopt);
}

}  // namespace
}  // namespace meshrun::rdzv
