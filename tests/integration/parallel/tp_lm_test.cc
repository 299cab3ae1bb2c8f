// Tensor-parallel transformer LM training equals single-process training:
// tp_lm_worker under the real launcher checks every step's loss and the
// gathered final params against its own single-process reference (rtol
// 1e-5); here the launcher's exit code, the shard layout and the printed
// losses are checked.

#include <gtest/gtest.h>

#include "tests/integration/parallel/driver_support.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

// vocab 64, d_model 32, 4 heads, d_ff 64, 2 blocks, seq 8, batch 4.
TEST(TpLmTest, TransformerLmAtTp2MatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(2, "tp_lm_worker", {"--steps", "10"});
  ExpectTrained(run, 2, 10);
  EXPECT_EQ(CountLines(run.output,
                       "LOCAL 1 embed.weight [64, 32] Shard(dim=0)@tp local [32, 32]"),
            1)
      << run.output;
  EXPECT_EQ(CountLines(run.output,
                       "LOCAL 0 blocks.1.attn.q.weight [32, 32] Shard(dim=0)@tp "
                       "local [16, 32]"),
            1)
      << run.output;
  EXPECT_EQ(CountLines(run.output,
                       "LOCAL 1 blocks.0.attn.o.weight [32, 32] Shard(dim=1)@tp "
                       "local [32, 16]"),
            1)
      << run.output;
  EXPECT_EQ(
      CountLines(run.output, "LOCAL 1 blocks.0.ln1.weight [32] Replicate() local [32]"),
      1)
      << run.output;
  EXPECT_EQ(CountLines(run.output,
                       "LOCAL 0 head.weight [64, 32] Shard(dim=0)@tp local [32, 32]"),
            1)
      << run.output;
}

// One head per rank.
TEST(TpLmTest, TransformerLmAtTp4MatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "tp_lm_worker", {"--steps", "10"});
  ExpectTrained(run, 4, 10);
  EXPECT_EQ(CountLines(run.output,
                       "LOCAL 3 blocks.0.attn.k.weight [32, 32] Shard(dim=0)@tp "
                       "local [8, 32]"),
            1)
      << run.output;
  EXPECT_EQ(CountLines(run.output,
                       "LOCAL 2 blocks.1.mlp.fc2.weight [32, 64] Shard(dim=1)@tp "
                       "local [32, 16]"),
            1)
      << run.output;
}

TEST(TpLmTest, HeadsThatDoNotSplitAreRefused) {
  MeshrunRun run =
      RunUnderMeshrun(2, "tp_lm_worker",
                      {"--heads", "3", "--d-model", "24", "--expect-error",
                       "heads 3 does not split evenly over 2 ranks of 'tp'"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(CountLines(run.output, "ERROR "), 2) << run.output;
}

}  // namespace
}  // namespace meshrun
