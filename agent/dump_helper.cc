#include "agent/dump_helper.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace meshrun::agent {

namespace {

constexpr int kHelperFd = 3;
// A request or reply longer than this is refused (a dump is at most 256 KiB).
constexpr uint32_t kMaxMessage = 4 * 1024 * 1024;
// How much longer than the command's own bound the agent waits for the reply.
constexpr std::chrono::seconds kReplyMargin{10};

std::atomic<bool> helper_cancelled{false};  // the helper's SIGTERM

void OnHelperSigterm(int) { helper_cancelled = true; }

void PutU32(std::string* out, uint32_t value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof value);
}
void PutI64(std::string* out, int64_t value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof value);
}
void PutString(std::string* out, const std::string& value) {
  PutU32(out, static_cast<uint32_t>(value.size()));
  out->append(value);
}

// Reads what Put* wrote; false when the message is short.
class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}
  template <typename T>
  bool Get(T* value) {
    if (data_.size() - at_ < sizeof(T)) return false;
    std::memcpy(value, data_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* value) {
    uint32_t size = 0;
    if (!Get(&size) || data_.size() - at_ < size) return false;
    value->assign(data_, at_, size);
    at_ += size;
    return true;
  }

 private:
  const std::string& data_;
  size_t at_ = 0;
};

bool WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t wrote = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) return false;
    done += static_cast<size_t>(wrote);
  }
  return true;
}

bool WriteMessage(int fd, const std::string& payload) {
  std::string framed;
  PutString(&framed, payload);
  return WriteAll(fd, framed);
}

enum class ReadOutcome { kDone, kEof, kCancelled, kTimedOut };

// `size` bytes into `out`, waiting in 100 ms slices for `cancel` and up to
// `deadline`.
ReadOutcome ReadExactly(int fd, size_t size, std::string* out,
                        std::chrono::steady_clock::time_point deadline,
                        const std::atomic<bool>* cancel) {
  out->clear();
  char buffer[64 * 1024];
  while (out->size() < size) {
    if (cancel != nullptr && cancel->load()) return ReadOutcome::kCancelled;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return ReadOutcome::kTimedOut;
    pollfd readable{fd, POLLIN, 0};
    if (poll(&readable, 1, static_cast<int>(std::min<int64_t>(left.count(), 100))) <= 0)
      continue;
    const ssize_t got = read(fd, buffer, std::min(sizeof buffer, size - out->size()));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return ReadOutcome::kEof;
    out->append(buffer, static_cast<size_t>(got));
  }
  return ReadOutcome::kDone;
}

ReadOutcome ReadMessage(int fd, std::string* payload,
                        std::chrono::steady_clock::time_point deadline,
                        const std::atomic<bool>* cancel) {
  std::string header;
  ReadOutcome outcome = ReadExactly(fd, sizeof(uint32_t), &header, deadline, cancel);
  if (outcome != ReadOutcome::kDone) return outcome;
  uint32_t size = 0;
  std::memcpy(&size, header.data(), sizeof size);
  if (size > kMaxMessage) return ReadOutcome::kEof;
  return ReadExactly(fd, size, payload, deadline, cancel);
}

}  // namespace

int RunDumpHelper(int argc, char** argv) {
  // With the agent: its SIGKILL leaves no helper (the SIGTERM kills the
  // command under way too).
  struct sigaction on_term {};
  on_term.sa_handler = OnHelperSigterm;  // no SA_RESTART: a read returns EINTR
  sigemptyset(&on_term.sa_mask);
  sigaction(SIGTERM, &on_term, nullptr);
  if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) return 1;
  if (argc < 3 || getppid() != static_cast<pid_t>(std::atoll(argv[2]))) return 1;
  // Nothing of the agent's but fd 3 and stdin/out/err.
  (void)close_range(kHelperFd + 1, ~0U, 0);
  if (!WriteAll(kHelperFd, "R")) return 1;
  const auto forever = std::chrono::steady_clock::time_point::max();
  for (;;) {
    std::string request;
    if (ReadMessage(kHelperFd, &request, forever, &helper_cancelled) !=
        ReadOutcome::kDone)
      return 0;
    Reader in(request);
    int64_t timeout_s = 0;
    uint8_t merge_stderr = 0;
    uint32_t max_output = 0, args = 0;
    std::vector<std::string> command;
    bool ok = in.Get(&timeout_s) && in.Get(&merge_stderr) && in.Get(&max_output) &&
              in.Get(&args) && args > 0 && args < 4096;
    for (uint32_t i = 0; ok && i < args; ++i) ok = in.GetString(&command.emplace_back());
    if (!ok) return 1;
    const CommandResult result =
        RunBounded(command, std::chrono::seconds(timeout_s), merge_stderr != 0,
                   max_output, &helper_cancelled);
    if (result.cancelled) return 0;
    std::string reply;
    reply.push_back(static_cast<char>(result.started));
    reply.push_back(static_cast<char>(result.timed_out));
    PutI64(&reply, result.exit_code);
    PutI64(&reply, result.signal);
    PutString(&reply, result.output);
    PutString(&reply, result.error);
    if (!WriteMessage(kHelperFd, reply)) return 0;
  }
}

absl::StatusOr<std::unique_ptr<DumpHelper>> DumpHelper::Start(
    const std::string& program) {
  int ends[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0)
    return absl::ErrnoToStatus(errno, "socketpair");
  // dup2 onto itself would keep FD_CLOEXEC: the helper's end must not be 3.
  if (ends[1] == kHelperFd) {
    const int moved = fcntl(ends[1], F_DUPFD_CLOEXEC, kHelperFd + 1);
    close(ends[1]);
    ends[1] = moved;
    if (moved < 0) {
      close(ends[0]);
      return absl::ErrnoToStatus(errno, "fcntl");
    }
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, ends[1], kHelperFd);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  // Default signals, none blocked (the agent blocks and handles some); a
  // group of its own, so a terminal's ^C reaches the agent, which ends it.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &all);
  posix_spawnattr_setpgroup(&attributes, 0);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                            POSIX_SPAWN_SETPGROUP);
  const std::string parent = std::to_string(getpid());
  std::vector<char*> args = {const_cast<char*>(program.c_str()),
                             const_cast<char*>(kDumpHelperFlag),
                             const_cast<char*>(parent.c_str()), nullptr};
  pid_t pid = 0;
  const int spawned =
      posix_spawn(&pid, program.c_str(), &actions, &attributes, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  close(ends[1]);
  if (spawned != 0) {
    close(ends[0]);
    return absl::ErrnoToStatus(spawned, absl::StrCat("cannot start ", program));
  }
  std::unique_ptr<DumpHelper> helper(new DumpHelper(pid, ends[0]));
  std::string ready;
  if (ReadExactly(ends[0], 1, &ready, std::chrono::steady_clock::now() + kReplyMargin,
                  nullptr) != ReadOutcome::kDone ||
      ready != "R")
    return absl::UnavailableError(
        absl::StrCat(program, " ", kDumpHelperFlag, " did not start"));
  return helper;
}

DumpHelper::~DumpHelper() {
  if (fd_ >= 0) close(fd_);
  kill(pid_, SIGTERM);
  while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

CommandResult DumpHelper::Run(const std::vector<std::string>& argv,
                              std::chrono::seconds timeout, bool merge_stderr,
                              size_t max_output, const std::atomic<bool>* cancel) {
  CommandResult result;
  if (fd_ < 0) {
    result.error = "cannot start it: the dump helper has ended";
    return result;
  }
  std::string request;
  PutI64(&request, timeout.count());
  request.push_back(static_cast<char>(merge_stderr));
  PutU32(&request, static_cast<uint32_t>(max_output));
  PutU32(&request, static_cast<uint32_t>(argv.size()));
  for (const std::string& arg : argv) PutString(&request, arg);
  std::string reply;
  const ReadOutcome outcome =
      WriteMessage(fd_, request)
          ? ReadMessage(fd_, &reply,
                        std::chrono::steady_clock::now() + timeout + kReplyMargin, cancel)
          : ReadOutcome::kEof;
  Reader in(reply);
  uint8_t started = 0, timed_out = 0;
  int64_t exit_code = 0, signal = 0;
  if (outcome == ReadOutcome::kDone && in.Get(&started) && in.Get(&timed_out) &&
      in.Get(&exit_code) && in.Get(&signal) && in.GetString(&result.output) &&
      in.GetString(&result.error)) {
    result.started = started != 0;
    result.timed_out = timed_out != 0;
    result.exit_code = static_cast<int>(exit_code);
    result.signal = static_cast<int>(signal);
    return result;
  }
  // Cancelled, or the helper broke its word: it ends (and what it runs).
  close(fd_);
  fd_ = -1;
  kill(pid_, SIGTERM);
  if (outcome == ReadOutcome::kCancelled) {
    result.started = true;
    result.cancelled = true;
  } else {
    result.error = "cannot run it: the dump helper did not answer";
  }
  return result;
}

}  // namespace meshrun::agent
