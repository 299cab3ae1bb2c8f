// torchrun 2's command line against meshrun's: the pinned torchrun's --help
// names the flags; every spelling it lists must be accepted by the real
// meshrun (a one-worker job that succeeds) or refused with exit 2 and one line
// saying what meshrun does instead. A torchrun upgrade that adds a flag fails
// here until meshrun's table (launcher/launch_config.cc) has a row for it.

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/child_process.h"
#include "tests/support/temp_dir.h"
#include "tests/support/text.h"

namespace meshrun {
namespace {

using std::chrono::seconds;
using testing::BinDir;
using testing::ChildProcess;
using testing::Count;
using testing::ExitCode;
using testing::FreePort;
using testing::TempDir;

// One option of argparse's help: its spellings ("-r", "--redirects"),
// whether it takes a value, and its choices when it names them.
struct ArgparseOption {
  std::vector<std::string> spellings;
  bool takes_value = false;
  std::vector<std::string> choices;

  // The first long spelling: "--redirects" for -r, "--nproc-per-node".
  std::string Canonical() const {
    for (const std::string& s : spellings)
      if (s.rfind("--", 0) == 0) return s;
    return spellings.front();
  }
};

// The "options:" section of argparse's --help. An option's invocation is
// the text before its description, which argparse separates by two spaces
// or a line break: "  -r REDIRECTS, --redirects REDIRECTS   Redirect ...".
std::vector<ArgparseOption> ParseArgparseHelp(const std::string& help) {
  std::vector<ArgparseOption> options;
  std::istringstream lines(help);
  bool in_options = false;
  for (std::string line; std::getline(lines, line);) {
    if (line == "options:" || line == "optional arguments:") {
      in_options = true;
      continue;
    }
    if (!in_options || line.rfind("  -", 0) != 0) continue;
    std::string invocation = line.substr(2, line.find("  ", 2) - 2);
    ArgparseOption option;
    size_t start = 0;
    while (start < invocation.size()) {
      size_t comma = invocation.find(", ", start);
      std::string part = invocation.substr(start, comma - start);
      size_t space = part.find(' ');
      option.spellings.push_back(part.substr(0, space));
      if (space != std::string::npos) {
        option.takes_value = true;
        std::string metavar = part.substr(space + 1);
        if (metavar.size() > 2 && metavar.front() == '{' && option.choices.empty()) {
          std::istringstream items(metavar.substr(1, metavar.size() - 2));
          for (std::string item; std::getline(items, item, ',');)
            option.choices.push_back(item);
        }
      }
      if (comma == std::string::npos) break;
      start = comma + 2;
    }
    if (option.Canonical() == "--help") continue;
    options.push_back(option);
  }
  return options;
}

// Every flag spelling in meshrun's (CLI11's) --help.
std::set<std::string> MeshrunHelpFlags(const std::string& help) {
  std::set<std::string> flags;
  std::regex flag_re("(^|[\\s,])(--?[A-Za-z][-A-Za-z0-9_]*)");
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(' ') == std::string::npos ||
        line[line.find_first_not_of(' ')] != '-')
      continue;
    std::string invocation = line.substr(0, line.find("  ", line.find_first_not_of(' ')));
    for (std::sregex_iterator it(invocation.begin(), invocation.end(), flag_re), end;
         it != end; ++it)
      flags.insert((*it)[2]);
  }
  return flags;
}

std::string RunCommand(const std::vector<std::string>& argv, int* code) {
  ChildProcess process(argv, /*merge_stderr=*/true);
  *code = ExitCode(process, seconds(60));
  return process.output();
}

class TorchrunFlags : public ::testing::Test {
 protected:
  // torchrun imports torch (seconds): once for the suite.
  static void SetUpTestSuite() {
    torchrun_help_ = new std::string(RunCommand({MESHRUN_TORCHRUN, "--help"}, &code_));
  }
  static void TearDownTestSuite() { delete torchrun_help_; }

  void SetUp() override {
    ASSERT_EQ(code_, 0) << *torchrun_help_;
    torchrun_ = ParseArgparseHelp(*torchrun_help_);
    // A sanity floor: 2.15 has 31 options besides -h.
    ASSERT_GE(torchrun_.size(), 30u) << *torchrun_help_;
    int code = 0;
    meshrun_help_ = RunCommand({BinDir() + "/meshrun", "--help"}, &code);
    ASSERT_EQ(code, 0) << meshrun_help_;
  }

  static inline int code_ = -1;
  static inline std::string* torchrun_help_ = nullptr;
  std::vector<ArgparseOption> torchrun_;
  std::string meshrun_help_;
};

TEST_F(TorchrunFlags, MeshrunsHelpListsEveryTorchrunSpelling) {
  std::set<std::string> meshrun = MeshrunHelpFlags(meshrun_help_);
  for (const ArgparseOption& option : torchrun_)
    for (const std::string& spelling : option.spellings)
      EXPECT_TRUE(meshrun.count(spelling)) << spelling << " is missing from\n"
                                           << meshrun_help_;
}

TEST_F(TorchrunFlags, EveryTorchrunFlagIsAcceptedOrRefusedInOneLine) {
  TempDir dir("torchrun-flags");
  dir.Write("noop.py", "");
  const std::string log_dir = dir / "logs";
  // A valid value for each option that takes one and names no choices. A
  // flag torchrun gains needs a row here (the test says which).
  const std::map<std::string, std::string> kSample = {
      {"--nnodes", "1"},
      {"--nproc-per-node", "1"},
      {"--rdzv-backend", "static"},
      {"--rdzv-endpoint", "127.0.0.1:PORT"},
      {"--rdzv-id", "job"},
      {"--rdzv-conf", "join_timeout=30"},
      {"--max-restarts", "0"},
      {"--monitor-interval", "0.1"},
      {"--event-log-handler", "null"},
      {"--role", "trainer"},
      {"--log-dir", log_dir},
      {"--redirects", "3"},
      {"--tee", "3"},
      {"--log-line-prefix-template", "[${rank}]:"},
      {"--local-ranks-filter", "0"},
      {"--duplicate-stdout-filters", "apple"},
      {"--duplicate-stderr-filters", "apple"},
      {"--node-rank", "0"},
      {"--master-addr", "127.0.0.1"},
      {"--master-port", "PORT"},
      {"--local-addr", "127.0.0.1"},
      {"--logs-specs", "custom"},
      {"--signals-to-handle", "SIGTERM,SIGUSR1"},
      {"--shutdown-timeout", "5"},
  };

  struct Attempt {
    std::string canonical;
    std::vector<std::string> argv;
  };
  std::vector<Attempt> attempts;
  for (const ArgparseOption& option : torchrun_) {
    const std::string canonical = option.Canonical();
    std::string value;
    if (option.takes_value) {
      auto sample = kSample.find(canonical);
      if (sample != kSample.end()) {
        value = sample->second;
      } else if (!option.choices.empty()) {
        value = option.choices.front();
      } else {
        ADD_FAILURE() << canonical << ": new torchrun flag; give it a sample value here";
        continue;
      }
    }
    // -m runs a module, --no-python a program; the rest a python script.
    std::string script = dir / "noop.py";
    if (canonical == "--module") script = "noop";
    if (canonical == "--no-python") script = "/bin/true";
    for (const std::string& spelling : option.spellings) {
      std::string spelled_value = value;
      size_t port = spelled_value.find("PORT");
      if (port != std::string::npos)
        spelled_value.replace(port, 4, std::to_string(FreePort()));
      std::vector<std::string> argv{"/usr/bin/env", "PYTHON_EXEC=" MESHRUN_PYTHON,
                                    "PYTHONPATH=" + dir.path(), BinDir() + "/meshrun",
                                    spelling};
      if (option.takes_value) argv.push_back(spelled_value);
      argv.push_back(script);
      attempts.push_back({canonical, argv});
    }
  }

  // Four at a time: each is a whole (one-worker) job.
  const size_t kParallel = 4;
  std::set<std::string> accepted, refused;
  for (size_t first = 0; first < attempts.size(); first += kParallel) {
    std::vector<std::future<std::pair<int, std::string>>> runs;
    for (size_t i = first; i < std::min(first + kParallel, attempts.size()); ++i) {
      runs.push_back(std::async(std::launch::async, [argv = attempts[i].argv] {
        int code = 0;
        std::string output = RunCommand(argv, &code);
        return std::make_pair(code, output);
      }));
    }
    for (size_t i = first; i < first + runs.size(); ++i) {
      const Attempt& attempt = attempts[i];
      auto [code, output] = runs[i - first].get();
      std::string command;
      for (size_t a = 3; a < attempt.argv.size(); ++a) command += attempt.argv[a] + " ";
      SCOPED_TRACE(command);
      if (code == 0) {  // accepted, and the job ran
        accepted.insert(attempt.argv[4]);
        continue;
      }
      refused.insert(attempt.argv[4]);
      // Refused: exit 2, one line naming the flag and what meshrun does.
      EXPECT_EQ(code, 2) << output;
      EXPECT_EQ(Count(output, "\n"), 1u) << output;
      EXPECT_EQ(output.rfind("meshrun: " + attempt.canonical + ": meshrun ", 0), 0u)
          << output;
    }
  }
  std::string summary = "accepted:";
  for (const std::string& s : accepted) summary += " " + s;
  summary += "\nrefused:";
  for (const std::string& s : refused) summary += " " + s;
  std::cout << summary << "\n";
  EXPECT_EQ(accepted.size() + refused.size(), attempts.size());
}

}  // namespace
}  // namespace meshrun
