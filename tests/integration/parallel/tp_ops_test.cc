// The tensor-parallel operators (conjugate f/g, gather/scatter, column- and
// row-parallel linear, vocab-parallel embedding and cross-entropy) equal
// their whole counterparts in value and gradient: tp_ops_worker checks
// itself on every rank under the real launcher; here every check must have
// passed on every rank.

#include <gtest/gtest.h>

#include <string>

#include "tests/integration/parallel/driver_support.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

class TpOpsTest : public ::testing::TestWithParam<int> {};

TEST_P(TpOpsTest, OperatorsEqualWholeOnesInValueAndGradient) {
  const int n = GetParam();
  MeshrunRun run = RunUnderMeshrun(n, "tp_ops_worker", {});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(CountLines(run.output, "FAIL"), 0) << run.output;
  for (const char* check :
       {"copy_to_tp_region", "reduce_from_tp_region", "gather_from_tp_region",
        "scatter_to_tp_region", "column_parallel_linear", "row_parallel_linear",
        "vocab_parallel_embedding", "vocab_parallel_cross_entropy"}) {
    EXPECT_EQ(CountLines(run.output, std::string(" ") + check), n) << check << "\n"
                                                                   << run.output;
  }
  EXPECT_EQ(CountLines(run.output, "DONE rank"), n) << run.output;
}

INSTANTIATE_TEST_SUITE_P(TpSizes, TpOpsTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace meshrun
