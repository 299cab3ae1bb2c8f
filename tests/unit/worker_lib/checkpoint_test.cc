// Sharded checkpoints in one process: the shards of several "ranks" are made
// by hand (Param::AddStep, no process group needed), written to real files
// and loaded into a different layout.

#include "worker_lib/training/checkpoint.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace meshrun::worker::parallel {
namespace {

namespace fs = std::filesystem;

// The shard of `full` that `steps` leave on one rank, padded like FSDP's.
std::shared_ptr<Param> ShardOf(const std::string& name, const at::Tensor& full,
                               const std::vector<ShardStep>& steps) {
  auto param = Param::FromFull(name, full);
  for (const ShardStep& step : steps) {
    at::Tensor current = param->LocalValues();
    ChunkExtent chunk = ChunkOf(current.size(step.dim), step.parts, step.index);
    std::vector<int64_t> shape = current.sizes().vec();
    shape[step.dim] = chunk.padded_size;
    at::Tensor padded = at::zeros(shape);
    padded.narrow(step.dim, 0, chunk.size)
        .copy_(current.narrow(step.dim, chunk.offset, chunk.size));
    param->AddStep(step, ProcessGroupPtr(), padded.set_requires_grad(true));
  }
  return param;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/meshrun_checkpoint_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    weight_ = at::arange(60, at::kFloat).reshape({10, 6});
    bias_ = at::arange(10, at::kFloat).neg();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Saves the layout "tp=2 on rows, then fsdp=3 on rows" (5 rows -> 2, 2, 1
  // per FSDP rank: padding) as six shard files.
  void SaveTpThenFsdp() {
    int tag = 0;
    for (int tp = 0; tp < 2; ++tp) {
      for (int fsdp = 0; fsdp < 3; ++fsdp) {
        std::vector<ShardStep> steps{{"tp", 0, 2, tp}, {"fsdp", 0, 3, fsdp}};
        ASSERT_TRUE(SaveShards(dir_, std::to_string(tag++),
                               {ShardOf("w", weight_, steps), ShardOf("b", bias_, steps)})
                        .ok());
      }
    }
  }

  std::string dir_;
  at::Tensor weight_;
  at::Tensor bias_;
};

TEST_F(CheckpointTest, LoadsIntoAnotherLayout) {
  SaveTpThenFsdp();
  // Columns over 3 ranks: every target box overlaps several saved shards.
  for (int index = 0; index < 3; ++index) {
    auto w = ShardOf("w", at::zeros({10, 6}), {{"x", 1, 3, index}});
    ASSERT_TRUE(LoadShards(dir_, {w}).ok());
    EXPECT_TRUE(at::equal(w->LocalValues(), weight_.narrow(1, 2 * index, 2)));
  }
  // Rows over 4 FSDP ranks (3, 3, 3, 1): padding stays zero.
  auto w = ShardOf("w", at::zeros({10, 6}), {{"fsdp", 0, 4, 3}});
  auto b = ShardOf("b", at::zeros({10}), {{"fsdp", 0, 4, 3}});
  ASSERT_TRUE(LoadShards(dir_, {w, b}).ok());
  EXPECT_TRUE(at::equal(w->LocalValues(), weight_.narrow(0, 9, 1)));
  EXPECT_TRUE(at::equal(b->LocalValues(), bias_.narrow(0, 9, 1)));
  EXPECT_EQ(w->data().size(0), 3);
  EXPECT_EQ(w->data().narrow(0, 1, 2).abs().sum().item<float>(), 0);
  // One process, whole.
  auto whole = Param::FromFull("w", at::zeros({10, 6}));
  ASSERT_TRUE(LoadShards(dir_, {whole}).ok());
  EXPECT_TRUE(at::equal(whole->data(), weight_));
}

TEST_F(CheckpointTest, IncompleteCheckpointIsRefusedAndChangesNothing) {
  SaveTpThenFsdp();
  fs::remove(fs::path(dir_) / "shard-4.pt");  // tp=1, fsdp=1: rows 7-8
  auto w = Param::FromFull("w", at::full({10, 6}, 7.0));
  auto status = LoadShards(dir_, {w});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("does not cover all of 'w' (12 of 60"),
            std::string::npos)
      << status.message();
  EXPECT_TRUE(at::equal(w->data(), at::full({10, 6}, 7.0)));
  // A box that misses only the lost rows loads.
  auto top = ShardOf("w", at::zeros({10, 6}), {{"tp", 0, 2, 0}});
  EXPECT_TRUE(LoadShards(dir_, {top}).ok());
}

TEST_F(CheckpointTest, ShapeMismatchMissingNameAndCorruptFilesAreErrors) {
  SaveTpThenFsdp();
  auto wrong_shape = Param::FromFull("w", at::zeros({10, 7}));
  auto status = LoadShards(dir_, {wrong_shape});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("[10, 6] in the checkpoint but [10, 7]"),
            std::string::npos)
      << status.message();

  auto unknown = Param::FromFull("fc9.weight", at::zeros({2}));
  EXPECT_EQ(LoadShards(dir_, {unknown}).code(), absl::StatusCode::kNotFound);

  std::ofstream(fs::path(dir_) / "shard-9.pt") << "not a pickle";
  auto w = Param::FromFull("w", at::zeros({10, 6}));
  status = LoadShards(dir_, {w});
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status.message();

  EXPECT_EQ(LoadShards(dir_ + "/nowhere", {w}).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace meshrun::worker::parallel
