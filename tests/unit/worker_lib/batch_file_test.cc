// Batch files (train_example --data): written and read back in one process,
// and the errors a wrong file gives. That Python's torch.save output reads
// the same is checked end to end by ParityTorch.short (tests/parity/).

#include "worker_lib/data/batch_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace meshrun::worker::parallel {
namespace {

namespace fs = std::filesystem;

class BatchFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/meshrun_batch_file_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const {
    return (fs::path(dir_) / name).string();
  }

  std::string dir_;
};

TEST_F(BatchFileTest, RoundTripsFloatAndTokenBatches) {
  std::vector<InputTarget> batches{{at::randn({4, 3}), at::randn({4, 2})},
                                   {at::arange(8, at::kLong).reshape({2, 4}),
                                    at::arange(8, at::kLong).reshape({2, 4})}};
  ASSERT_TRUE(WriteBatchFile(Path("b.pt"), batches).ok());
  auto read = ReadBatchFile(Path("b.pt"));
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(at::equal((*read)[i].first, batches[i].first));
    EXPECT_TRUE(at::equal((*read)[i].second, batches[i].second));
    EXPECT_EQ((*read)[i].first.scalar_type(), batches[i].first.scalar_type());
  }
}

TEST_F(BatchFileTest, MissingFileIsNotFound) {
  auto read = ReadBatchFile(Path("absent.pt"));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BatchFileTest, GarbageIsDataLossNamingTheFile) {
  std::ofstream(Path("garbage.pt")) << "not a pickle";
  auto read = ReadBatchFile(Path("garbage.pt"));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(read.status().message().find("garbage.pt is not a batch file"),
            std::string::npos);
}

TEST_F(BatchFileTest, RowsThatDifferAreRefused) {
  ASSERT_TRUE(
      WriteBatchFile(Path("uneven.pt"), {{at::zeros({4, 3}), at::zeros({3, 2})}}).ok());
  auto read = ReadBatchFile(Path("uneven.pt"));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(read.status().message().find("input and target rows differ"),
            std::string::npos);
}

}  // namespace
}  // namespace meshrun::worker::parallel
