#include "worker_lib/parallel/sharding.h"

#include <gtest/gtest.h>

#include <vector>

namespace meshrun::worker::parallel {
namespace {

TEST(ChunkOf, FollowsTorchChunk) {
  // torch.arange(10).chunk(4) -> sizes 3, 3, 3, 1.
  EXPECT_EQ(ChunkOf(10, 4, 0).offset, 0);
  EXPECT_EQ(ChunkOf(10, 4, 2).offset, 6);
  EXPECT_EQ(ChunkOf(10, 4, 3).size, 1);
  EXPECT_EQ(ChunkOf(10, 4, 3).padded_size, 3);
  // torch.arange(5).chunk(4) -> sizes 2, 2, 1, and a 4th chunk that is empty.
  EXPECT_EQ(ChunkOf(5, 4, 2).size, 1);
  EXPECT_EQ(ChunkOf(5, 4, 3).size, 0);
  EXPECT_EQ(ChunkOf(5, 4, 3).offset, 5);
  // 100 weights over 4 FSDP ranks (seed 000's HSDP): 25 each, 101..125 first.
  EXPECT_EQ(ChunkOf(100, 4, 0).size, 25);
  EXPECT_EQ(ChunkOf(100, 4, 2).offset, 50);
}

TEST(ChunkOf, EmptyTensor) {
  EXPECT_EQ(ChunkOf(0, 3, 1).size, 0);
  EXPECT_EQ(ChunkOf(0, 3, 1).padded_size, 0);
}

TEST(LocalBox, ColumnThenRowSharding) {
  // [8, 6]: rows over tp=2, then columns over 3 ranks.
  std::vector<ShardStep> steps{{"tp", 0, 2, 1}, {"x", 1, 3, 2}};
  Box box = LocalBox({8, 6}, steps);
  EXPECT_EQ(box.offsets, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(box.sizes, (std::vector<int64_t>{4, 2}));
}

// Seed 000's FSDP+TP: a 12x12 weight, ColwiseParallel over tp=4 (3 rows
// each), then FSDP over fsdp=2 of each TP shard (2 rows, then 1). Every row
// of the global weight is held exactly once, at the position of the TP shard
// it came from: reassembling by these boxes cannot reorder rows, which
// assembling in mesh order did (pytorch#129229).
TEST(LocalBox, FsdpOfTpShardsTileTheWeightInOrder) {
  std::vector<int> owner(12, -1);
  for (int fsdp = 0; fsdp < 2; ++fsdp) {
    for (int tp = 0; tp < 4; ++tp) {
      Box box = LocalBox({12, 12}, {{"tp", 0, 4, tp}, {"fsdp", 0, 2, fsdp}});
      EXPECT_EQ(box.offsets[0], tp * 3 + fsdp * 2);
      EXPECT_EQ(box.sizes[0], fsdp == 0 ? 2 : 1);
      EXPECT_EQ(box.sizes[1], 12);
      for (int64_t row = box.offsets[0]; row < box.offsets[0] + box.sizes[0]; ++row) {
        EXPECT_EQ(owner[row], -1) << "row " << row << " held twice";
        owner[row] = fsdp * 4 + tp;
      }
    }
  }
  for (int row = 0; row < 12; ++row) EXPECT_NE(owner[row], -1) << "row " << row;
  // Rank (fsdp=1, tp=0) holds global row 2: the 3rd row of TP shard 0, not
  // the row that mesh-order reassembly (fsdp outer) would put there.
  EXPECT_EQ(owner[2], 4);
}

TEST(Intersect, OverlapAndDisjoint) {
  Box a{{0, 0}, {4, 4}};
  Box b{{2, 3}, {4, 4}};
  Box overlap = Intersect(a, b);
  EXPECT_EQ(overlap.offsets, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(overlap.sizes, (std::vector<int64_t>{2, 1}));
  EXPECT_TRUE(Intersect(a, Box{{4, 0}, {1, 1}}).empty());
}

TEST(DescribeSteps, NamesTheOrder) {
  EXPECT_EQ(DescribeSteps({}), "Replicate()");
  EXPECT_EQ(DescribeSteps({{"tp", 0, 4, 1}, {"fsdp", 0, 2, 0}}),
            "Shard(dim=0)@tp, Shard(dim=0)@fsdp");
}

}  // namespace
}  // namespace meshrun::worker::parallel
