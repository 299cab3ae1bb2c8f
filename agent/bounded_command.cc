#include "agent/bounded_command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace meshrun::agent {

std::string CommandResult::Outcome(std::chrono::seconds timeout) const {
  if (!started) return error;
  if (timed_out) return absl::StrCat("took over ", timeout.count(), " s");
  if (cancelled) return "cancelled";
  if (signal != 0) {
    const char* name = sigabbrev_np(signal);
    return absl::StrCat("killed by ",
                        name ? absl::StrCat("SIG", name) : std::to_string(signal));
  }
  return absl::StrCat("exit ", exit_code);
}

CommandResult RunBounded(const std::vector<std::string>& argv,
                         std::chrono::seconds timeout, bool merge_stderr,
                         size_t max_output, const std::atomic<bool>* cancel) {
  CommandResult result;
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    result.error = absl::StrCat("cannot make a pipe: ", strerror(errno));
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  if (merge_stderr) {
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  }
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  // A group of its own, so a timeout ends what it started too (a shell's
  // children).
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned =
      posix_spawn(&pid, args[0], &actions, &attributes, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  close(pipe_fds[1]);
  if (spawned != 0) {
    close(pipe_fds[0]);
    result.error = absl::StrCat("cannot start ", argv[0], ": ", strerror(spawned));
    return result;
  }
  result.started = true;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buffer[16 * 1024];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      break;
    }
    if (cancel != nullptr && cancel->load()) {
      result.cancelled = true;
      break;
    }
    const auto slice =
        cancel != nullptr ? std::min(left, std::chrono::milliseconds(100)) : left;
    pollfd readable{pipe_fds[0], POLLIN, 0};
    const int ready = poll(&readable, 1, static_cast<int>(slice.count()));
    if (ready <= 0) continue;  // EINTR, a slice, or the deadline (checked above)
    const ssize_t got = read(pipe_fds[0], buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // EOF: it (and whatever shares its stdout) is done
    result.output.append(buffer, static_cast<size_t>(got));
    if (result.output.size() > 2 * max_output)
      result.output.erase(0, result.output.size() - max_output);
  }
  close(pipe_fds[0]);
  if (result.timed_out || result.cancelled) kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (result.output.size() > max_output)
    result.output.erase(0, result.output.size() - max_output);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  return result;
}

}  // namespace meshrun::agent
