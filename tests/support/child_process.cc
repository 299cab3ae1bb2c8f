#include "tests/support/child_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace meshrun::testing {

std::string BinDir() { return MESHRUN_BIN_DIR; }

ChildProcess::ChildProcess(std::vector<std::string> argv, bool merge_stderr) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  if (merge_stderr) posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  stdout_fd_ = fds[0];
}

ChildProcess::~ChildProcess() {
  if (Running()) {
    kill(pid_, SIGKILL);
    Wait(std::chrono::seconds(10));
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

std::optional<std::string> ChildProcess::ReadLine(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      output_ += line + "\n";
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() < 0) return std::nullopt;  // 0: one look without waiting
    pollfd pfd{stdout_fd_, POLLIN, 0};
    int ready = poll(&pfd, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return std::nullopt;
    char chunk[4096];
    ssize_t n = read(stdout_fd_, chunk, sizeof chunk);
    if (n <= 0) {
      // EOF: a last line without a newline still counts.
      if (buffer_.empty()) return std::nullopt;
      std::string line = std::move(buffer_);
      buffer_.clear();
      output_ += line + "\n";
      return line;
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

std::optional<std::string> ChildProcess::ReadUntil(const std::string& needle,
                                                   std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    auto line = ReadLine(left);
    if (!line) return std::nullopt;
    if (line->find(needle) != std::string::npos) return line;
  }
}

const std::string& ChildProcess::ReadAll(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || !ReadLine(left)) return output_;
  }
}

void ChildProcess::Signal(int signal_number) {
  if (Running()) kill(pid_, signal_number);
}

std::optional<int> ChildProcess::Wait(std::chrono::milliseconds timeout) {
  if (exit_status_) return exit_status_;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_status_ = status;
      return exit_status_;
    }
    if (r < 0 && errno != EINTR) return std::nullopt;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    // Polling waitpid is the portable way to bound a wait on a child; 5 ms
    // keeps it cheap.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool ChildProcess::Running() {
  if (exit_status_ || pid_ <= 0) return false;
  return !Wait(std::chrono::milliseconds(0)).has_value();
}

DaemonProcess::DaemonProcess(std::vector<std::string> extra_args,
                             std::vector<std::string> wrapper)
    : process_([&] {
        std::vector<std::string> argv = std::move(wrapper);
        argv.insert(argv.end(), {BinDir() + "/meshrun-rdzvd", "--host", "127.0.0.1",
                                 "--log-level", "warn"});
        // Port 0 unless the caller names one (a restart on the same port).
        if (std::find(extra_args.begin(), extra_args.end(), "--port") == extra_args.end())
          argv.insert(argv.end(), {"--port", "0"});
        argv.insert(argv.end(), extra_args.begin(), extra_args.end());
        return argv;
      }()) {
  const std::string prefix = "MESHRUN_RDZVD_ENDPOINT=";
  auto line = process_.ReadLine(std::chrono::seconds(20));
  if (!line || line->rfind(prefix, 0) != 0)
    throw std::runtime_error("meshrun-rdzvd did not print its endpoint");
  endpoint_ = line->substr(prefix.size());
}

int DaemonProcess::ReadMetricsPort() {
  const std::string prefix = "MESHRUN_RDZVD_METRICS=";
  auto line = process_.ReadLine(std::chrono::seconds(20));
  if (!line || line->rfind(prefix, 0) != 0) return -1;
  return std::stoi(line->substr(line->rfind(':') + 1));
}

int ExitCode(ChildProcess& process, std::chrono::milliseconds timeout) {
  process.ReadAll(timeout);
  auto status = process.Wait(timeout);
  if (!status) return -1;
  return WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

bool ProcessAlive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string line;
  std::getline(stat, line);
  auto close_paren = line.rfind(')');
  return close_paren != std::string::npos && line.size() > close_paren + 2 &&
         line[close_paren + 2] != 'Z';
}

bool GoneWithin(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (ProcessAlive(pid)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    // /proc has no way to wait on a process that is not our child.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

bool FilesWithin(const std::string& dir, const std::vector<std::string>& names,
                 const std::vector<std::unique_ptr<ChildProcess>>& readers,
                 std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    bool all = true;
    for (const std::string& name : names)
      all = all && std::filesystem::exists(dir + "/" + name);
    if (all) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    for (const auto& reader : readers) reader->ReadLine(std::chrono::milliseconds(20));
  }
}

}  // namespace meshrun::testing
