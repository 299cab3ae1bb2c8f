// Sharded checkpoints of a user's torch::nn::Module and its AdamW state
// reload on other layouts: module_checkpoint_worker trains a few steps in
// one layout and saves, the next launch loads in another layout and goes on;
// each checks every step's loss (so the parameters, AdamW's moments and its
// step all came back) and, at the end, the final parameters against one
// process trained without a break (rtol 1e-5).

#include <gtest/gtest.h>

#include <string>

#include "tests/integration/parallel/driver_support.h"
#include "tests/support/temp_dir.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

struct Leg {
  int world;
  std::string layout;
  int from, to;
};

void RunLegs(const std::vector<Leg>& legs) {
  testing::TempDir dir;
  for (size_t i = 0; i < legs.size(); ++i) {
    const Leg& leg = legs[i];
    std::vector<std::string> args = {"--layout", leg.layout,
                                     "--from",   std::to_string(leg.from),
                                     "--to",     std::to_string(leg.to)};
    if (i > 0)
      args.insert(args.end(), {"--load", dir.path() + "/leg" + std::to_string(i - 1)});
    if (i + 1 < legs.size())
      args.insert(args.end(), {"--save", dir.path() + "/leg" + std::to_string(i)});
    MeshrunRun run = RunUnderMeshrun(leg.world, "module_checkpoint_worker", args);
    SCOPED_TRACE(leg.layout);
    ExpectTrained(run, leg.world, leg.to - leg.from);
  }
}

TEST(ModuleCheckpointTest, FsdpTpToFsdpToOneProcess) {
  RunLegs({{4, "fsdp_tp", 0, 3}, {2, "fsdp", 3, 6}, {1, "single", 6, 8}});
}

TEST(ModuleCheckpointTest, DdpToTpToFsdpTp) {
  RunLegs({{2, "ddp", 0, 3}, {4, "tp", 3, 6}, {4, "fsdp_tp", 6, 8}});
}

}  // namespace
}  // namespace meshrun
