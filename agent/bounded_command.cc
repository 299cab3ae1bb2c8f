#include "agent/bounded_command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
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
  // Its exit, as a descriptor poll() can wait on with the output (Linux 5.3);
  // without one, the exit is looked for every 20 ms.
#ifdef SYS_pidfd_open
  const int exit_fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  const int exit_fd = -1;
#endif
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Done when it has exited AND its output is at EOF (what it started may
  // still write); the deadline and `cancel` bound both waits: a command that
  // closes its stdout and lives on is as bounded as one that never exits.
  bool exited = false;
  bool output_done = false;
  char buffer[16 * 1024];
  for (;;) {
    if (!exited) {
      // WNOWAIT: left a zombie, its pid (the group's id) cannot be reused
      // before the kill below.
      siginfo_t info{};
      exited = waitid(P_PID, static_cast<id_t>(pid), &info,
                      WEXITED | WNOHANG | WNOWAIT) == 0 &&
               info.si_pid == pid;
    }
    if (exited && output_done) break;
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
    auto slice = left;
    if (cancel != nullptr) slice = std::min(slice, std::chrono::milliseconds(100));
    if (!exited && exit_fd < 0) slice = std::min(slice, std::chrono::milliseconds(20));
    pollfd waits[2];
    nfds_t count = 0;
    if (!output_done) waits[count++] = pollfd{pipe_fds[0], POLLIN, 0};
    if (!exited && exit_fd >= 0) waits[count++] = pollfd{exit_fd, POLLIN, 0};
    // EINTR, a slice or the deadline: all looked at above.
    if (poll(waits, count, static_cast<int>(slice.count())) <= 0) continue;
    if (output_done || waits[0].revents == 0) continue;
    const ssize_t got = read(pipe_fds[0], buffer, sizeof buffer);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) {  // EOF: nothing holds its stdout any more
      output_done = true;
      continue;
    }
    result.output.append(buffer, static_cast<size_t>(got));
    if (result.output.size() > 2 * max_output)
      result.output.erase(0, result.output.size() - max_output);
  }
  close(pipe_fds[0]);
  if (exit_fd >= 0) close(exit_fd);
  // The whole group: what it started too (a shell's children), which may
  // hold the output open.
  if (result.timed_out || result.cancelled) kill(-pid, SIGKILL);
  // Prompt: it has exited, or was just SIGKILLed.
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
