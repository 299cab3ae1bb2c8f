#include "rendezvous/core/step_times.h"

#include <gtest/gtest.h>

namespace meshrun::rdzv {
namespace {

RankStepTime Rank(uint32_t rank, double mean, uint64_t steps = 50) {
  RankStepTime r;
  r.rank = rank;
  r.mean_seconds = mean;
  r.steps = steps;
  return r;
}

TEST(StepTimesTest, AWindowKeepsTheLastHundredSteps) {
  StepWindow window;
  for (int i = 0; i < 100; ++i) window.Add(1.0);
  EXPECT_DOUBLE_EQ(window.mean(), 1.0);
  for (int i = 0; i < 100; ++i) window.Add(3.0);
  EXPECT_DOUBLE_EQ(window.mean(), 3.0);
  EXPECT_EQ(window.steps(), 200u);
}

TEST(StepTimesTest, ARankWellAboveTheMedianIsSlow) {
  auto slow = SlowRanks({Rank(0, 0.10), Rank(1, 0.11), Rank(2, 0.10), Rank(3, 0.25)});
  ASSERT_EQ(slow.size(), 1u);
  EXPECT_EQ(slow[0].rank.rank, 3u);
  EXPECT_NEAR(slow[0].times_median, 0.25 / 0.105, 1e-9);
}

TEST(StepTimesTest, NoSlowRankAmongEqualsNorWithTooFewSteps) {
  EXPECT_TRUE(SlowRanks({Rank(0, 0.10), Rank(1, 0.11), Rank(2, 0.115)}).empty());
  EXPECT_TRUE(SlowRanks({Rank(0, 0.10), Rank(1, 0.5, /*steps=*/3)}).empty());
  EXPECT_TRUE(SlowRanks({Rank(0, 0.10)}).empty());
  EXPECT_TRUE(SlowRanks({}).empty());
}

}  // namespace
}  // namespace meshrun::rdzv
