// The status page in a real browser: headless Chromium (Debian's chromium +
// chromedriver, driven by status_page_check.py over WebDriver) opens the page
// of a real meshrun-rdzvd during a real 2-node run, sees both nodes and 0
// restarts, then a worker fails (the script creates the file the workers
// wait on) and the page must show the restart and the failure's traceback.
// Skipped, with the reason, only when Chromium or chromedriver is missing.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/child_process.h"
#include "tests/support/http_client.h"

namespace meshrun {
namespace {

using std::chrono::seconds;
using testing::BinDir;
using testing::ChildProcess;
using testing::DaemonProcess;
using testing::ExitCode;
namespace fs = std::filesystem;

const std::string kSource = MESHRUN_SOURCE_DIR;

TEST(StatusPageTest, BrowserSeesNodesRestartAndFailure) {
  for (const char* binary : {"/usr/bin/chromium", "/usr/bin/chromedriver"}) {
    if (access(binary, X_OK) != 0) {
      GTEST_SKIP() << binary
                   << " is not installed (Debian packages chromium and chromium-driver; "
                      "scripts/install-deps.sh installs them)";
    }
  }
  std::string dir = (fs::temp_directory_path() / "meshrun-page-XXXXXX").string();
  ASSERT_NE(mkdtemp(dir.data()), nullptr);

  DaemonProcess daemon({"--metrics-port", "0"});
  auto line = daemon.process().ReadLine(seconds(20));
  ASSERT_TRUE(line && line->rfind("MESHRUN_RDZVD_METRICS=", 0) == 0);
  const std::string metrics = line->substr(line->find('=') + 1);
  const int port = std::stoi(metrics.substr(metrics.rfind(':') + 1));

  auto agent = [&] {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{
            "/usr/bin/env", "PYTHON_EXEC=" MESHRUN_PYTHON,
            "FAIL_PY=" + kSource + "/tests/integration/workers/raise_error.py",
            BinDir() + "/meshrun", "--nnodes=2", "--nproc-per-node=2",
            "--rdzv-backend=c10d", "--rdzv-endpoint=" + daemon.endpoint(),
            "--rdzv-id=train-lm", "--max-restarts=1", "--no-python",
            kSource + "/tests/integration/workers/obs_worker.sh",
            BinDir() + "/store_tool", dir},
        /*merge_stderr=*/true);
  };
  auto a = agent();
  auto b = agent();
  // The run is up when all four workers got through their store ops.
  std::string scrape = testing::ScrapeUntil(port, [](const std::string& m) {
    return testing::MetricSample(m, "meshrun_store_ops_total{op=\"wait\"}") >= 4;
  });
  ASSERT_GE(testing::MetricSample(scrape, "meshrun_store_ops_total{op=\"wait\"}"), 4)
      << scrape;

  const std::string screenshot = dir + "/status-page.png";
  ChildProcess check({"/usr/bin/python3", kSource + "/tests/e2e/status_page_check.py",
                      "--url", "http://" + metrics + "/", "--run-id", "train-lm",
                      "--fail-file", dir + "/fail", "--screenshot", screenshot},
                     /*merge_stderr=*/true);
  const int code = ExitCode(check, seconds(180));
  EXPECT_EQ(code, 0) << check.output();
  EXPECT_GT(fs::exists(screenshot) ? fs::file_size(screenshot) : 0, 10000u)
      << check.output();
  // Keep the picture for a human (the README's comes from here).
  if (const char* keep = getenv("MESHRUN_KEEP_SCREENSHOT");
      keep && fs::exists(screenshot))
    fs::copy_file(screenshot, keep, fs::copy_options::overwrite_existing);

  std::ofstream(dir + "/finish") << "x";
  EXPECT_EQ(ExitCode(*a, seconds(60)), 0) << a->output();
  EXPECT_EQ(ExitCode(*b, seconds(60)), 0) << b->output();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshrun
