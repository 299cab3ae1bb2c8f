#include "worker_lib/data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

namespace meshrun::worker::parallel {
namespace {

struct TorchCase {
  int64_t n, replicas, rank;
  bool shuffle;
  uint64_t seed;
  int64_t epoch;
  bool drop_last;
  std::vector<int64_t> expected;
};

// Printed by Python (torch 1.13; torch 2.15 prints the same):
//   s = DistributedSampler(range(n), num_replicas, rank, shuffle, seed, drop_last)
//   s.set_epoch(epoch); list(s)
const TorchCase kTorchCases[] = {
    {10, 4, 1, true, 0, 0, false, {1, 9, 2}},
    {10, 4, 3, true, 0, 1, false, {2, 3, 6}},
    {10, 4, 3, true, 0, 1, true, {2, 3}},
    {10, 3, 2, false, 0, 0, false, {2, 5, 8, 1}},
    {10, 3, 2, false, 0, 0, true, {2, 5, 8}},
    {2, 5, 4, false, 0, 0, false, {0}},
    {3, 8, 7, true, 5, 2, false, {1}},
    {23, 4, 0, true, 1234, 7, false, {7, 9, 4, 12, 19, 18}},
    {23, 4, 2, true, 1234, 7, true, {13, 6, 8, 22, 21}},
};

TEST(DistributedSampler, MatchesTorchIndices) {
  for (const TorchCase& c : kTorchCases) {
    auto sampler = DistributedSampler::Create(
        c.n, {c.replicas, c.rank, c.shuffle, c.seed, c.drop_last});
    ASSERT_TRUE(sampler.ok()) << sampler.status();
    sampler->set_epoch(c.epoch);
    EXPECT_EQ(sampler->Indices(), c.expected)
        << "n=" << c.n << " replicas=" << c.replicas << " rank=" << c.rank;
    EXPECT_EQ(sampler->num_samples(), static_cast<int64_t>(c.expected.size()));
  }
}

TEST(TorchRandperm, MatchesTorch) {
  // torch.randperm(10, generator=torch.Generator().manual_seed(0)).
  EXPECT_EQ(TorchRandperm(10, 0), (std::vector<int64_t>{4, 1, 7, 5, 3, 9, 0, 8, 6, 2}));
  // Seeds are taken modulo 2^32, as torch's mt19937 does.
  EXPECT_EQ(TorchRandperm(50, (uint64_t{1} << 33) + 5), TorchRandperm(50, 5));
  EXPECT_EQ(TorchRandperm(0, 3), std::vector<int64_t>{});
  EXPECT_EQ(TorchRandperm(1, 3), std::vector<int64_t>{0});
}

// Ranks' indices, concatenated, cover the dataset: exactly once each with
// drop_last, plus a padding that repeats the first indices otherwise.
TEST(DistributedSampler, RanksPartitionTheEpoch) {
  for (bool drop_last : {false, true}) {
    for (int64_t n : {0, 1, 7, 16, 17, 101}) {
      for (int64_t replicas : {1, 3, 4, 8}) {
        std::multiset<int64_t> seen;
        int64_t samples = -1;
        for (int64_t rank = 0; rank < replicas; ++rank) {
          auto sampler =
              DistributedSampler::Create(n, {replicas, rank, true, 17, drop_last});
          ASSERT_TRUE(sampler.ok());
          sampler->set_epoch(3);
          auto indices = sampler->Indices();
          ASSERT_EQ(static_cast<int64_t>(indices.size()), sampler->num_samples());
          if (samples >= 0) {
            EXPECT_EQ(samples, sampler->num_samples());
          }
          samples = sampler->num_samples();
          seen.insert(indices.begin(), indices.end());
        }
        const int64_t total = samples * replicas;
        if (drop_last) {
          EXPECT_EQ(total, n - n % replicas) << n << " " << replicas;
          EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), seen.size());
        } else {
          EXPECT_GE(total, n);
          EXPECT_LT(total, n + replicas);
          for (int64_t i = 0; i < n; ++i) EXPECT_GE(seen.count(i), 1u) << i;
        }
        for (int64_t index : seen) {
          EXPECT_GE(index, 0);
          EXPECT_LT(index, n);
        }
      }
    }
  }
}

TEST(DistributedSampler, EpochChangesTheShuffle) {
  auto sampler = DistributedSampler::Create(64, {2, 1, true, 0, false});
  ASSERT_TRUE(sampler.ok());
  auto epoch0 = sampler->Indices();
  sampler->set_epoch(1);
  auto epoch1 = sampler->Indices();
  EXPECT_NE(epoch0, epoch1);
  sampler->set_epoch(0);
  EXPECT_EQ(sampler->Indices(), epoch0);
  // Same seed + epoch on another sampler: same order (every rank agrees).
  auto other = DistributedSampler::Create(64, {2, 1, true, 0, false});
  EXPECT_EQ(other->Indices(), epoch0);
}

TEST(DistributedSampler, WithoutShuffleTakesEveryReplicasIndex) {
  auto sampler = DistributedSampler::Create(9, {4, 0, false, 0, false});
  ASSERT_TRUE(sampler.ok());
  // 9 -> padded to 12 with 0, 1, 2; rank 0 takes 0, 4, 8.
  EXPECT_EQ(sampler->Indices(), (std::vector<int64_t>{0, 4, 8}));
  auto last = DistributedSampler::Create(9, {4, 3, false, 0, false});
  EXPECT_EQ(last->Indices(), (std::vector<int64_t>{3, 7, 2}));
}

TEST(DistributedSampler, RejectsBadOptions) {
  auto bad_rank = DistributedSampler::Create(10, {4, 4, true, 0, false});
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_EQ(bad_rank.status().message(),
            "Invalid rank 4, rank should be in the interval [0, 3]");
  EXPECT_FALSE(DistributedSampler::Create(10, {0, 0, true, 0, false}).ok());
  EXPECT_FALSE(DistributedSampler::Create(-1, {1, 0, true, 0, false}).ok());
}

}  // namespace
}  // namespace meshrun::worker::parallel
