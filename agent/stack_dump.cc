#include "agent/stack_dump.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace meshrun::agent {

namespace fs = std::filesystem;

namespace {

// A dump longer than this is cut: a few hundred threads' frames fit.
constexpr size_t kMaxDumpBytes = 256 * 1024;

bool IsExecutable(const std::string& path) {
  return !path.empty() && access(path.c_str(), X_OK) == 0 && !fs::is_directory(path);
}

std::string FindOnPath(const std::string& name, const std::string& path) {
  if (name.find('/') != std::string::npos) return IsExecutable(name) ? name : "";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    std::string candidate =
        absl::StrCat(dir.empty() ? absl::string_view(".") : dir, "/", name);
    if (IsExecutable(candidate)) return candidate;
  }
  return "";
}

struct ToolRun {
  bool ran = false;  // started, finished in time and exited 0
  std::string output;
  std::string why;  // when !ran
};

// Runs argv with stdout into a pipe (stderr to /dev/null), for at most
// `timeout`.
ToolRun RunTool(const std::vector<std::string>& argv, std::chrono::seconds timeout) {
  ToolRun run;
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    run.why = absl::StrCat("cannot make a pipe: ", strerror(errno));
    return run;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (spawned != 0) {
    close(pipe_fds[0]);
    run.why = absl::StrCat("cannot start ", argv[0], ": ", strerror(spawned));
    return run;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  char buffer[16 * 1024];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd readable{pipe_fds[0], POLLIN, 0};
    const int ready = poll(&readable, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t got = read(pipe_fds[0], buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (run.output.size() < kMaxDumpBytes)
      run.output.append(buffer, std::min<size_t>(got, kMaxDumpBytes - run.output.size()));
  }
  close(pipe_fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    run.why = absl::StrCat(fs::path(argv[0]).filename().string(), " took over ",
                           timeout.count(), " s");
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    run.why = absl::StrCat(fs::path(argv[0]).filename().string(), " failed");
  } else {
    run.ran = true;
  }
  return run;
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

StackTools FindStackTools(const std::vector<std::string>& worker_argv,
                          const std::map<std::string, std::string>& env) {
  std::string path;
  if (auto it = env.find("PATH"); it != env.end()) {
    path = it->second;
  } else if (const char* own = getenv("PATH")) {
    path = own;
  }
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

std::string DumpStacks(pid_t pid, const StackTools& tools, std::chrono::seconds timeout) {
  std::vector<std::string> tried;
  if (!tools.py_spy.empty()) {
    ToolRun run = RunTool(
        {tools.py_spy, "dump", "--pid", std::to_string(pid), "--nonblocking"}, timeout);
    if (run.ran) return absl::StrCat("Python stacks (py-spy dump):\n", run.output);
    tried.push_back(run.why + " (not a Python process?)");
  } else {
    tried.push_back("no py-spy");
  }
  if (!tools.gdb.empty()) {
    ToolRun run = RunTool({tools.gdb, "-p", std::to_string(pid), "-batch", "-nx", "-q",
                           "-ex", "thread apply all bt"},
                          timeout);
    // From the first thread on: gdb's notes on symbols and auto-loading before
    // it say nothing of the worker.
    if (size_t first = run.output.find("\nThread ");
        run.ran && first != std::string::npos)
      return absl::StrCat("native stacks (gdb):", run.output.substr(first));
    tried.push_back(run.ran ? "gdb found no threads" : run.why);
  } else {
    tried.push_back("no gdb");
  }
  std::string why;
  for (const std::string& reason : tried)
    absl::StrAppend(&why, why.empty() ? "" : "; ", reason);
  return absl::StrCat("no stacks (", why, "); the kernel's view:\n", KernelView(pid));
}

}  // namespace meshrun::agent
