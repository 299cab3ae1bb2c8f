#include "agent/stack_dump.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/bounded_command.h"
#include "agent/dump_helper.h"

namespace meshrun::agent {

namespace fs = std::filesystem;

namespace {

// A dump longer than this is cut: a few hundred threads' frames fit.
constexpr size_t kMaxDumpBytes = 256 * 1024;

bool IsExecutable(const std::string& path) {
  return !path.empty() && access(path.c_str(), X_OK) == 0 && !fs::is_directory(path);
}

// Each thread's name and what the kernel says it waits in.
std::string KernelView(pid_t pid) {
  std::string out;
  std::error_code error;
  for (const auto& task :
       fs::directory_iterator(absl::StrCat("/proc/", pid, "/task"), error)) {
    auto read = [&](const char* file) {
      std::ifstream in(task.path() / file);
      std::string text((std::istreambuf_iterator<char>(in)),
                       std::istreambuf_iterator<char>());
      while (!text.empty() && text.back() == '\n') text.pop_back();
      return text;
    };
    absl::StrAppend(&out, "Thread ", task.path().filename().string(), " (", read("comm"),
                    "): waits in ", read("wchan").empty() ? "-" : read("wchan"), "\n");
  }
  return out;
}

}  // namespace

std::string FindOnPath(const std::string& name, const std::string& path) {
  if (name.find('/') != std::string::npos) return IsExecutable(name) ? name : "";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    // An empty entry means the working directory to execvp, and a relative
    // one is under it: whoever can write there would choose what the agent
    // runs against its workers (as root, often). Only absolute entries.
    if (dir.empty() || dir.front() != '/') continue;
    std::string candidate = absl::StrCat(dir, "/", name);
    if (IsExecutable(candidate)) return candidate;
  }
  return "";
}

StackTools FindStackTools(const std::vector<std::string>& worker_argv) {
  const char* own = getenv("PATH");
  const std::string path = own != nullptr ? own : "";
  StackTools tools;
  tools.py_spy = FindOnPath("py-spy", path);
  if (tools.py_spy.empty() && !worker_argv.empty()) {
    std::string program = FindOnPath(worker_argv[0], path);
    if (!program.empty()) {
      std::string beside = (fs::path(program).parent_path() / "py-spy").string();
      if (IsExecutable(beside)) tools.py_spy = beside;
    }
  }
  tools.gdb = FindOnPath("gdb", path);
  return tools;
}

std::string DumpStacks(pid_t pid, const StackTools& tools, std::chrono::seconds timeout,
                       const std::atomic<bool>* cancel, DumpHelper* helper) {
  auto run_bounded = [&](const std::vector<std::string>& argv) {
    return helper != nullptr
               ? helper->Run(argv, timeout, /*merge_stderr=*/false, kMaxDumpBytes, cancel)
               : RunBounded(argv, timeout, /*merge_stderr=*/false, kMaxDumpBytes, cancel);
  };
  std::vector<std::string> tried;
  if (!tools.py_spy.empty()) {
    CommandResult run = run_bounded(
        {tools.py_spy, "dump", "--pid", std::to_string(pid), "--nonblocking"});
    if (run.cancelled) return "no stacks (the agent is exiting)";
    if (run.ok()) return absl::StrCat("Python stacks (py-spy dump):\n", run.output);
    tried.push_back(
        absl::StrCat("py-spy: ", run.Outcome(timeout), " (not a Python process?)"));
  } else {
    tried.push_back("no py-spy");
  }
  if (!tools.gdb.empty()) {
    CommandResult run = run_bounded({tools.gdb, "-p", std::to_string(pid), "-batch",
                                     "-nx", "-q", "-ex", "thread apply all bt"});
    if (run.cancelled) return "no stacks (the agent is exiting)";
    // From the first thread on: gdb's notes on symbols and auto-loading before
    // it say nothing of the worker.
    if (size_t first = run.output.find("\nThread ");
        run.ok() && first != std::string::npos)
      return absl::StrCat("native stacks (gdb):", run.output.substr(first));
    tried.push_back(run.ok() ? "gdb found no threads" : "gdb: " + run.Outcome(timeout));
  } else {
    tried.push_back("no gdb");
  }
  std::string why;
  for (const std::string& reason : tried)
    absl::StrAppend(&why, why.empty() ? "" : "; ", reason);
  return absl::StrCat("no stacks (", why, "); the kernel's view:\n", KernelView(pid));
}

}  // namespace meshrun::agent
