#include "agent/resources.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>

#include "tests/support/temp_dir.h"

namespace meshrun::agent {
namespace {

namespace fs = std::filesystem;

TEST(ResourcesTest, DescriptorsNeededGrowWithWorkersAndAHostedDaemon) {
  EXPECT_GT(DescriptorsNeeded(8, false), DescriptorsNeeded(1, false));
  EXPECT_GT(DescriptorsNeeded(1, true), DescriptorsNeeded(1, false));
  // Never more than a default soft limit of 1,024 for a node of 128 workers:
  // the check must not refuse a launch that would work.
  EXPECT_LT(DescriptorsNeeded(128, true), 1024);
}

TEST(ResourcesTest, CheckDescriptorsNamesTheLimitWhenTooFewAreLeft) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_cur != RLIM_INFINITY && saved.rlim_cur < 64)
    GTEST_SKIP() << "RLIMIT_NOFILE is below 64 already";
  EXPECT_TRUE(CheckDescriptors(16).ok());
  // Room for 32 descriptors in all: asking for 1,000 more cannot fit.
  rlimit low = saved;
  low.rlim_cur = 32;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  absl::Status too_many = CheckDescriptors(1000);
  absl::Status few = CheckDescriptors(1);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_TRUE(few.ok()) << few;
  EXPECT_EQ(too_many.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_many.message().find("RLIMIT_NOFILE allows 32 (hard limit "),
            std::string::npos)
      << too_many;
  EXPECT_NE(too_many.message().find("1000 more are needed; raise `ulimit -n`"),
            std::string::npos)
      << too_many;
}

TEST(ResourcesTest, ThreadLimitsNameTheKernelAndProcessLimits) {
  const std::string text = ThreadLimits();
  if (fs::exists("/proc/sys/kernel/pid_max")) {
    EXPECT_NE(text.find("this machine runs "), std::string::npos) << text;
    EXPECT_NE(text.find("kernel.pid_max "), std::string::npos) << text;
    EXPECT_NE(text.find("kernel.threads-max "), std::string::npos) << text;
  }
  rlimit stack{};
  ASSERT_EQ(getrlimit(RLIMIT_STACK, &stack), 0);
  if (stack.rlim_cur != RLIM_INFINITY) {
    EXPECT_NE(text.find("RLIMIT_STACK " + std::to_string(stack.rlim_cur >> 20) + " MiB"),
              std::string::npos)
        << text;
  }
}

TEST(ResourcesTest, RemoveOnResourceExitRemovesTheRegisteredDirectoryOnly) {
  testing::TempDir dir;
  const std::string root = dir / "meshrun-root";
  fs::create_directories(root + "/run/attempt_0");
  std::ofstream(root + "/run/attempt_0/error.json") << "{}";
  SetRemovedOnResourceExit("");
  RemoveOnResourceExit();
  EXPECT_TRUE(fs::exists(root));
  SetRemovedOnResourceExit(root);
  RemoveOnResourceExit();
  EXPECT_FALSE(fs::exists(root));
  EXPECT_TRUE(fs::exists(dir.path()));
  SetRemovedOnResourceExit("");
}

}  // namespace
}  // namespace meshrun::agent
