#include "worker_lib/parallel/flat_layout.h"

#include <gtest/gtest.h>

#include <vector>

namespace meshrun::worker::parallel {
namespace {

// fc0 of the 50,50,50,50,4 MLP over 4 ranks: weight [50, 50] and bias [50]
// in chunks of 13 rows (the last rank's 11 padded to 13).
TEST(FlatShardLayout, WeightAndBiasOverFourRanks) {
  FlatShardLayout layout = MakeFlatShardLayout({{50, 50}, {50, 1}}, 4);
  EXPECT_EQ(layout.padded_rows, (std::vector<int64_t>{13, 13}));
  EXPECT_EQ(layout.numels, (std::vector<int64_t>{650, 13}));
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 650}));
  EXPECT_EQ(layout.segment_numel, 663);
  EXPECT_EQ(layout.total_numel(), 4 * 663);
  // Rank 2's bias chunk: after ranks 0 and 1's segments and its weight chunk.
  EXPECT_EQ(layout.GatheredOffset(1, 2), 2 * 663 + 650);
  EXPECT_TRUE(layout.padded(0, 50));
}

TEST(FlatShardLayout, EvenRowsNeedNoPadding) {
  FlatShardLayout layout = MakeFlatShardLayout({{8, 3}, {8, 1}, {4, 2}}, 4);
  EXPECT_EQ(layout.padded_rows, (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 6, 8}));
  EXPECT_EQ(layout.segment_numel, 10);
  EXPECT_FALSE(layout.padded(0, 8));
  EXPECT_FALSE(layout.padded(2, 4));
}

// Fewer rows than ranks: [2, 5] over 4 ranks has chunks of 1 row, ranks 2
// and 3 all padding; still a full row each in every segment.
TEST(FlatShardLayout, FewerRowsThanRanks) {
  FlatShardLayout layout = MakeFlatShardLayout({{2, 5}, {2, 1}}, 4);
  EXPECT_EQ(layout.padded_rows, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(layout.segment_numel, 6);
  EXPECT_TRUE(layout.padded(0, 2));
}

TEST(FlatShardLayout, OneRankHoldsEverything) {
  FlatShardLayout layout = MakeFlatShardLayout({{7, 3}}, 1);
  EXPECT_EQ(layout.padded_rows, (std::vector<int64_t>{7}));
  EXPECT_EQ(layout.segment_numel, 21);
  EXPECT_EQ(layout.total_numel(), 21);
}

TEST(FlatShardLayout, NoMembers) {
  FlatShardLayout layout = MakeFlatShardLayout({}, 3);
  EXPECT_EQ(layout.segment_numel, 0);
  EXPECT_TRUE(layout.offsets.empty());
}

TEST(GroupByKey, GroupsInOrderOfFirstAppearance) {
  EXPECT_EQ(GroupByKey({6, 6, 6}), (std::vector<std::vector<size_t>>{{0, 1, 2}}));
  EXPECT_EQ(GroupByKey({6, 5, 6, 7, 5}),
            (std::vector<std::vector<size_t>>{{0, 2}, {1, 4}, {3}}));
  EXPECT_TRUE(GroupByKey({}).empty());
}

// Four params of 100, 10, 100, 10 floats, 440 bytes to a bucket: reverse
// order, so the last two share the first bucket.
TEST(MakeBuckets, ReverseOrderUpToTheByteLimit) {
  auto buckets = MakeBuckets({100, 10, 100, 10}, {4, 4, 4, 4}, {0, 0, 0, 0}, 440);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].members, (std::vector<size_t>{3, 2}));
  EXPECT_EQ(buckets[0].offsets, (std::vector<int64_t>{0, 10}));
  EXPECT_EQ(buckets[0].numel, 110);
  EXPECT_EQ(buckets[1].members, (std::vector<size_t>{1, 0}));
  EXPECT_EQ(buckets[1].offsets, (std::vector<int64_t>{0, 10}));
}

TEST(MakeBuckets, LargeParamGetsABucketOfItsOwn) {
  auto buckets = MakeBuckets({1, 1000, 1}, {4, 4, 4}, {0, 0, 0}, 16);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[1].members, (std::vector<size_t>{1}));
  EXPECT_EQ(buckets[1].numel, 1000);
}

TEST(MakeBuckets, NewBucketAtADtypeChange) {
  auto buckets = MakeBuckets({4, 4, 4}, {4, 2, 2}, {1, 2, 2}, 1 << 20);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].members, (std::vector<size_t>{2, 1}));
  EXPECT_EQ(buckets[1].members, (std::vector<size_t>{0}));
}

TEST(MakeBuckets, DefaultSizeKeepsASmallModelInOneBucket) {
  auto buckets = MakeBuckets({2500, 50, 2500, 50}, {4, 4, 4, 4}, {0, 0, 0, 0}, 25 << 20);
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0].members, (std::vector<size_t>{3, 2, 1, 0}));
  EXPECT_EQ(buckets[0].offsets, (std::vector<int64_t>{0, 50, 2550, 2600}));
}

// DDP's small first bucket: it closes once it holds at least the first
// limit (here fc3's 1 KiB bias and 1 MiB weight), the rest share 25 MiB.
TEST(MakeBuckets, SmallFirstBucketClosesOnceFull) {
  auto buckets = MakeBuckets({1 << 18, 1024, 1 << 18, 256}, {4, 4, 4, 4}, {0, 0, 0, 0},
                             25 << 20, 1 << 20);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].members, (std::vector<size_t>{3, 2}));
  EXPECT_EQ(buckets[1].members, (std::vector<size_t>{1, 0}));
}

TEST(MakeBuckets, FirstBucketLimitAboveTheBucketSizeIsIgnored) {
  auto buckets =
      MakeBuckets({100, 10, 100, 10}, {4, 4, 4, 4}, {0, 0, 0, 0}, 440, 1 << 20);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].members, (std::vector<size_t>{3, 2}));
}

TEST(SlotsOf, FindsEveryParamsBucketAndPosition) {
  auto buckets = MakeBuckets({100, 10, 100, 10}, {4, 4, 4, 4}, {0, 0, 0, 0}, 440);
  auto slots = SlotsOf(buckets, 4);
  EXPECT_EQ(slots[3].bucket, 0u);
  EXPECT_EQ(slots[3].member, 0u);
  EXPECT_EQ(slots[2].bucket, 0u);
  EXPECT_EQ(slots[2].member, 1u);
  EXPECT_EQ(slots[0].bucket, 1u);
  EXPECT_EQ(slots[0].member, 1u);
}

}  // namespace
}  // namespace meshrun::worker::parallel
