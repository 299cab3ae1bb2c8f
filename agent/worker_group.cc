#include "agent/worker_group.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace meshrun::agent {

namespace {

using SteadyClock = std::chrono::steady_clock;

spdlog::logger& Log() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    if (auto existing = spdlog::get("agent")) return existing;
    try {
      return spdlog::stderr_color_mt("agent");
    } catch (const spdlog::spdlog_ex&) {
      return spdlog::get("agent");  // registered by another thread meanwhile
    }
  }();
  return *logger;
}

// What a child that could not exec tells the parent through the status pipe.
enum class ChildStage : int { kPdeathsig, kSetsid, kDup2, kExec };
struct ChildError {
  ChildStage stage;
  int error;
};

const char* StageName(ChildStage stage) {
  switch (stage) {
    case ChildStage::kPdeathsig:
      return "prctl(PR_SET_PDEATHSIG)";
    case ChildStage::kSetsid:
      return "setsid";
    case ChildStage::kDup2:
      return "dup2";
    case ChildStage::kExec:
      return "execve";
  }
  return "?";
}

// Everything the child needs, as plain pointers: between fork and exec the
// child may only make async-signal-safe calls, so no allocation (another
// thread of the agent may have held the malloc lock at fork time).
struct ChildArgs {
  pid_t parent = 0;
  pid_t ptracer = 0;  // 0: none
  int stdout_fd = -1;
  int stderr_fd = -1;
  int status_fd = -1;
  int cgroup_procs_fd = -1;  // the worker's cgroup.procs, or -1
  bool simulate_no_close_range_cloexec = false;
  // The soft RLIMIT_NOFILE the worker gets (the agent's at its start).
  struct rlimit nofile {};
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  const char* const* candidates = nullptr;  // paths to try, as execvp would
  size_t num_candidates = 0;
};

[[noreturn]] void ReportAndExit(int status_fd, ChildStage stage, int error) {
  ChildError report{stage, error};
  while (::write(status_fd, &report, sizeof report) < 0 && errno == EINTR) {
  }
  // What a shell returns: 127 for "not found", 126 for "found, cannot run".
  ::_exit(stage == ChildStage::kExec && error == ENOENT ? 127 : 126);
}

// The descriptor limit this process started with, read before main() (and
// so before a daemon it hosts raises it: rendezvous/server/fd_limit.h).
const struct rlimit kStartupNofile = [] {
  struct rlimit limit {};
  (void)::getrlimit(RLIMIT_NOFILE, &limit);
  return limit;
}();

// close_range(CLOSE_RANGE_CLOEXEC) by hand, for kernels before 5.11: every
// fd >= 3 listed in /proc/self/fd, or without /proc every one below the fd
// limit. Async-signal-safe (raw getdents64 into a stack buffer).
void MarkFdsCloexec() {
  int dir = ::open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    struct Dirent64 {
      ino64_t ino;
      off64_t off;
      unsigned short reclen;
      unsigned char type;
      char name[1];
    };
    alignas(Dirent64) char buffer[4096];
    while (true) {
      long n = ::syscall(SYS_getdents64, dir, buffer, sizeof buffer);
      if (n <= 0) break;
      for (long at = 0; at < n;) {
        const auto* entry = reinterpret_cast<const Dirent64*>(buffer + at);
        at += entry->reclen;
        int fd = 0;
        bool number = entry->name[0] != '\0';
        for (const char* c = entry->name; *c != '\0'; ++c) {
          if (*c < '0' || *c > '9')
            number = false;
          else
            fd = fd * 10 + (*c - '0');
        }
        if (number && fd >= 3 && fd != dir) (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
      }
    }
    ::close(dir);
    return;
  }
  struct rlimit limit {};
  rlim_t end = 65536;
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    end = limit.rlim_cur;
  for (rlim_t fd = 3; fd < end; ++fd) {
    int flags = ::fcntl(static_cast<int>(fd), F_GETFD);
    if (flags >= 0 && (flags & FD_CLOEXEC) == 0)
      (void)::fcntl(static_cast<int>(fd), F_SETFD, flags | FD_CLOEXEC);
  }
}

[[noreturn]] void RunChild(const ChildArgs& args) {
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
    ReportAndExit(args.status_fd, ChildStage::kPdeathsig, errno);
  // The agent may have died between fork and prctl; then no signal will come.
  if (::getppid() != args.parent) ::_exit(1);
  // A session of its own, hence a process group of its own (the agent
  // signals the group), as torchrun 2's workers (start_new_session). It also
  // gives the worker its own scheduler autogroup where the kernel has them,
  // so it is not sharing the CPU with whatever else runs in the launching
  // shell's session.
  if (::setsid() < 0) ReportAndExit(args.status_fd, ChildStage::kSetsid, errno);
  // Sources are >= 3 (MakeFd), so dup2 never hits its own source and clears
  // O_CLOEXEC on the target.
  if (::dup2(args.stdout_fd, STDOUT_FILENO) < 0 ||
      ::dup2(args.stderr_fd, STDERR_FILENO) < 0)
    ReportAndExit(args.status_fd, ChildStage::kDup2, errno);
  // Into its own cgroup before it can start anything. Best effort: a worker
  // outside it only loses the cleanup of what escapes its process group.
  if (args.cgroup_procs_fd >= 0) (void)::write(args.cgroup_procs_fd, "0", 1);
  // Where Yama restricts ptrace to ancestors (ptrace_scope 1), the stack
  // dump helper and its dumpers may still read the worker (--hang-timeout,
  // agent/dump_helper.h). Not the agent: every worker descends from it, so
  // naming it would let a worker trace its siblings. EINVAL without Yama.
  if (args.ptracer > 0) (void)::prctl(PR_SET_PTRACER, args.ptracer, 0, 0, 0);
  // Nothing of the agent's but stdin/out/err reaches the worker, even fds
  // opened without O_CLOEXEC by a library (Popen's close_fds in torchrun).
  if (args.simulate_no_close_range_cloexec ||
      ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0)
    MarkFdsCloexec();
  // A daemon the agent hosts raised the agent's own limit; the worker starts
  // with the one it would have under torchrun (programs that use select()
  // rely on a soft limit of 1,024). Best effort: the raised one also works.
  (void)::setrlimit(RLIMIT_NOFILE, &args.nofile);
  // exec keeps ignored signals ignored and the mask as is; a worker starts
  // with defaults, whatever the agent set up.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  for (int number = 1; number < NSIG; ++number) {
    (void)::sigaction(number, &default_action, nullptr);  // EINVAL for KILL, STOP
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  // execvp's search: skip entries where the file is missing, remember that
  // one existed but was not executable, stop at any other error.
  int error = ENOENT;
  bool denied = false;
  for (size_t i = 0; i < args.num_candidates; ++i) {
    ::execve(args.candidates[i], args.argv, args.envp);
    error = errno;
    if (error == EACCES) {
      denied = true;
    } else if (error != ENOENT && error != ENOTDIR && error != ESTALE &&
               error != ENODEV && error != ETIMEDOUT) {
      break;
    }
  }
  if (denied && (error == ENOENT || error == ENOTDIR || error == ESTALE ||
                 error == ENODEV || error == ETIMEDOUT)) {
    error = EACCES;
  }
  ReportAndExit(args.status_fd, ChildStage::kExec, error);
}

// Moves `fd` to >= 3, so that the child's dup2 onto 0..2 cannot clobber it
// when the agent runs with one of 0..2 closed.
absl::StatusOr<int> MakeFd(int fd) {
  if (fd >= 3) return fd;
  int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  int error = errno;
  ::close(fd);
  if (moved < 0)
    return absl::InternalError(absl::StrCat("fcntl: ", std::strerror(error)));
  return moved;
}

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    Reset();
    fd_ = std::exchange(other.fd_, -1);
    return *this;
  }
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or
// /sys/fs/cgroup/unified on a hybrid system) and the root of what this mount
// shows of it; empty without one.
std::pair<std::string, std::string> Cgroup2Mount() {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    size_t dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    std::istringstream fields(line.substr(0, dash));
    std::string id, parent, device, root, mount;
    if (fields >> id >> parent >> device >> root >> mount) return {mount, root};
  }
  return {};
}

// An agent that was SIGKILLed could not remove its cgroups; once empty,
// the next agent on the machine does. Non-empty ones (what escaped that
// agent's workers) are left alone.
void RemoveStaleCgroups(const std::string& parent) {
  namespace fs = std::filesystem;
  std::error_code error;
  for (fs::directory_iterator it(parent, error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    constexpr std::string_view kPrefix = "meshrun-agent.";
    if (name.rfind(kPrefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + kPrefix.size(), nullptr, 10);
    if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code ignored;
    for (fs::directory_iterator worker(it->path(), ignored), none;
         !ignored && worker != none; worker.increment(ignored)) {
      if (worker->is_directory(ignored)) ::rmdir(worker->path().c_str());
    }
    ::rmdir(it->path().c_str());
  }
}

// A cgroup directory for one WorkerGroup's workers, below the agent's own
// cgroup. A child of the agent's cgroup may always hold processes (its
// subtree_control is empty while the agent is in it); moving a worker there
// needs write access to the agent's cgroup: root, or a delegated subtree.
absl::StatusOr<std::string> CreateGroupCgroup() {
  auto [mount, root] = Cgroup2Mount();
  if (mount.empty()) return absl::UnavailableError("no cgroup v2 hierarchy is mounted");
  std::string own;
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("0::", 0) == 0) own = line.substr(3);
  }
  if (own.empty() || own.find(" (deleted)") != std::string::npos)
    return absl::UnavailableError("the agent is in no cgroup v2 cgroup");
  if (root != "/" && own.rfind(root, 0) == 0) own = own.substr(root.size());
  if (!own.empty() && own.back() == '/') own.pop_back();
  const std::string parent = absl::StrCat(mount, own);
  RemoveStaleCgroups(parent);
  static std::atomic<uint64_t> counter{0};
  // The name can be taken: an agent of another PID namespace (a container,
  // `unshare --pid`) with the same pid, or one SIGKILLed there, whose
  // cgroups RemoveStaleCgroups cannot tell from a live agent's.
  for (int attempt = 0;; ++attempt) {
    std::string dir =
        absl::StrCat(parent, "/meshrun-agent.", ::getpid(), ".", counter.fetch_add(1));
    if (::mkdir(dir.c_str(), 0755) == 0) return dir;
    if (errno != EEXIST || attempt == 1000)
      return absl::UnavailableError(
          absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
  }
}

// SIGKILL to every process in the cgroup `dir` and below.
void KillCgroup(const std::string& dir) {
  int fd = ::open(absl::StrCat(dir, "/cgroup.kill").c_str(), O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    bool killed = ::write(fd, "1", 1) == 1;
    ::close(fd);
    if (killed) return;
  }
  // Before Linux 5.14: what cgroup.procs lists, a few times over for what
  // forked meanwhile.
  for (int round = 0; round < 10; ++round) {
    std::ifstream procs(absl::StrCat(dir, "/cgroup.procs"));
    bool any = false;
    for (pid_t pid; procs >> pid;) {
      ::kill(pid, SIGKILL);
      any = true;
    }
    if (!any) return;
  }
}

// False while killed processes are still being torn down (EBUSY).
bool RemoveCgroup(const std::string& dir) {
  return ::rmdir(dir.c_str()) == 0 || errno == ENOENT;
}

absl::Status MakePipe(Fd* read_end, Fd* write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  absl::StatusOr<int> r = MakeFd(fds[0]);
  absl::StatusOr<int> w = MakeFd(fds[1]);
  if (r.ok()) *read_end = Fd(*r);
  if (w.ok()) *write_end = Fd(*w);
  return r.ok() ? w.status() : r.status();
}

std::vector<std::string> WorkerEnvironment(
    const std::map<std::string, std::string>& env) {
  std::vector<std::string> result;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string_view text(*entry);
    if (env.count(std::string(text.substr(0, text.find('=')))) == 0)
      result.emplace_back(text);
  }
  for (const auto& [key, value] : env) result.push_back(absl::StrCat(key, "=", value));
  return result;
}

// A spec turned into what fork/exec needs, all allocated before the fork.
struct Prepared {
  WorkerSpec spec;
  std::vector<std::string> env_strings;
  std::vector<char*> envp;
  std::vector<char*> argv;
  std::vector<std::string> candidates;
  std::vector<const char*> candidate_ptrs;
  std::unique_ptr<OutputSink> out;  // null: the stream goes to /dev/null
  std::unique_ptr<OutputSink> err;
};

// usage_usec of a cgroup v2 cpu.stat (kept by the kernel whether or not the
// cpu controller is enabled), or nullopt where it cannot be read.
std::optional<std::chrono::microseconds> CgroupCpuTime(const std::string& dir) {
  std::ifstream in(absl::StrCat(dir, "/cpu.stat"));
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) {
    if (key == "usage_usec") return std::chrono::microseconds(value);
  }
  return std::nullopt;
}

// User and system time of every process in each process group, and of the
// children they reaped, from /proc/<pid>/stat: one pass over /proc for all.
std::map<pid_t, std::chrono::microseconds> ProcessGroupCpuTimes() {
  static const long ticks_per_second = sysconf(_SC_CLK_TCK);
  std::map<pid_t, int64_t> ticks;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    // After the command's closing parenthesis (a command may hold spaces and
    // parentheses): state ppid pgrp ... utime(14) stime cutime cstime.
    const size_t end = stat.rfind(')');
    if (end == std::string::npos) continue;
    std::istringstream fields(stat.substr(end + 1));
    std::string state;
    int64_t ppid = 0, pgrp = 0, skip = 0, utime = 0, stime = 0, cutime = 0, cstime = 0;
    fields >> state >> ppid >> pgrp;
    if (!fields) continue;
    for (int field = 6; field <= 13; ++field) fields >> skip;
    fields >> utime >> stime >> cutime >> cstime;
    if (fields) ticks[static_cast<pid_t>(pgrp)] += utime + stime + cutime + cstime;
  }
  std::map<pid_t, std::chrono::microseconds> times;
  for (const auto& [pgid, count] : ticks)
    times[pgid] = std::chrono::microseconds(
        count * 1000000 / (ticks_per_second > 0 ? ticks_per_second : 100));
  return times;
}

}  // namespace

std::vector<std::string> ExecCandidates(const std::string& file,
                                        const std::map<std::string, std::string>& env) {
  if (file.empty()) return {};
  if (file.find('/') != std::string::npos) return {file};
  std::string path;
  if (auto it = env.find("PATH"); it != env.end()) {
    path = it->second;
  } else if (const char* inherited = ::getenv("PATH")) {
    path = inherited;
  } else {
    path = "/bin:/usr/bin";  // glibc's default for execvp
  }
  std::vector<std::string> candidates;
  size_t start = 0;
  while (true) {
    size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon - start);
    candidates.push_back(dir.empty() ? file : absl::StrCat(dir, "/", file));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return candidates;
}

struct WorkerGroup::Pipe {
  Pipe(boost::asio::io_context& io, int fd, std::unique_ptr<OutputSink> sink)
      : descriptor(io, fd), sink(std::move(sink)) {}
  boost::asio::posix::stream_descriptor descriptor;
  std::unique_ptr<OutputSink> sink;
  std::array<char, 64 * 1024> buffer;  // a default pipe's capacity
  bool open = true;
  uint64_t bytes_read = 0;
};

struct WorkerGroup::Worker {
  explicit Worker(boost::asio::io_context& io) : drain_timer(io) {}
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = 0;
  std::unique_ptr<Pipe> out;  // null when not piped
  std::unique_ptr<Pipe> err;
  int open_pipes = 0;
  std::string cgroup;  // its own cgroup's directory, or empty
  bool reaped = false;
  bool status_known = true;
  int wait_status = 0;
  std::chrono::system_clock::time_point when;
  boost::asio::steady_timer drain_timer;
  uint64_t drain_generation = 0;  // tells a stale drain timer expiry apart
  bool finished = false;

  void ClosePipe(Pipe* pipe) {
    if (pipe == nullptr || !pipe->open) return;
    pipe->open = false;
    pipe->sink->Close();
    boost::system::error_code ignored;
    pipe->descriptor.close(ignored);
    --open_pipes;
  }
};

WorkerGroup::WorkerGroup(boost::asio::io_context& io,
                         std::function<void(const WorkerExit&)> on_exit,
                         WorkerGroupOptions options)
    : io_(io),
      on_exit_(std::move(on_exit)),
      options_(options),
      console_(options.console != nullptr ? options.console : &ConsoleWriter::Default()),
      sigchld_(io),
      grace_timer_(io),
      self_(std::make_shared<WorkerGroup*>(this)) {
  boost::system::error_code error;
  sigchld_.add(SIGCHLD, error);
  if (error) Log().error("cannot watch SIGCHLD: {}", error.message());
  // Asio 1.74 installs its handler without SA_RESTART: every worker exit would
  // then fail a blocking call on any of the agent's threads with EINTR.
  struct sigaction action {};
  if (::sigaction(SIGCHLD, nullptr, &action) == 0 && action.sa_handler != SIG_DFL &&
      action.sa_handler != SIG_IGN) {
    action.sa_flags |= SA_RESTART | SA_NOCLDSTOP;
    ::sigaction(SIGCHLD, &action, nullptr);
  }
  WaitForSigchld();

  const char* setting = ::getenv("MESHRUN_CGROUPS");
  if (options_.cgroups == WorkerGroupOptions::Cgroups::kOff) {
    Log().debug("workers run without cgroups");
  } else if (setting != nullptr && std::string_view(setting) == "off") {
    if (options_.log_setup)
      Log().info(
          "workers run without cgroups (MESHRUN_CGROUPS=off): what a worker leaves in "
          "its process group ends with it, processes that left the group (setsid) "
          "outlive it");
  } else if (absl::StatusOr<std::string> dir = CreateGroupCgroup(); dir.ok()) {
    cgroup_parent_ = *dir;
    if (options_.log_setup)
      Log().info(
          "each worker runs in a cgroup of its own under {}: whatever it leaves running "
          "ends with it",
          cgroup_parent_);
  } else if (options_.log_setup) {
    Log().info(
        "workers run without cgroups ({}): what a worker leaves in its process group "
        "ends with it, processes that left the group (setsid) outlive it",
        std::string(dir.status().message()));
  }
}

WorkerGroup::~WorkerGroup() {
  self_.reset();  // handlers still queued now do nothing
  for (const auto& worker : workers_) {
    if (!worker->reaped) {
      KillGroup(*worker, SIGKILL);
      if (!worker->cgroup.empty()) KillCgroup(worker->cgroup);
      while (::waitpid(worker->pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    worker->finished = true;
    worker->ClosePipe(worker->out.get());
    worker->ClosePipe(worker->err.get());
    worker->drain_timer.cancel();
    if (!worker->cgroup.empty()) cgroups_to_remove_.push_back(worker->cgroup);
  }
  if (cgroup_parent_.empty()) return;
  // The killed processes go within milliseconds, unless stuck in the kernel
  // (D state); what is still busy after a second stays behind, empty once
  // they go.
  cgroups_to_remove_.push_back(cgroup_parent_);
  const auto deadline = SteadyClock::now() + std::chrono::seconds(1);
  while (true) {
    RemoveCgroups();
    if (cgroups_to_remove_.empty()) return;
    if (SteadyClock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Log().warn("cannot remove the workers' cgroup {}: {}", cgroup_parent_,
             std::strerror(EBUSY));
}

void WorkerGroup::RemoveCgroups() {
  // In order: a worker's cgroup before the group's own.
  auto kept = std::remove_if(cgroups_to_remove_.begin(), cgroups_to_remove_.end(),
                             [](const std::string& dir) { return RemoveCgroup(dir); });
  cgroups_to_remove_.erase(kept, cgroups_to_remove_.end());
}

absl::Status WorkerGroup::Start(std::vector<WorkerSpec> specs) {
  if (!workers_.empty() || stopping_) {
    return absl::FailedPreconditionError(
        "WorkerGroup::Start: the previous workers are still live");
  }

  // First everything that can fail for a reason the user can fix, so that
  // such a failure starts no worker at all.
  std::vector<Prepared> prepared;
  prepared.reserve(specs.size());
  bool needs_devnull = false;
  for (WorkerSpec& spec : specs) {
    if (spec.argv.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", spec.local_rank, ": empty argv"));
    }
    Prepared p;
    for (auto [to_console, prefixed, file, stream, sink, copy] :
         {std::tuple(spec.stdout_to_console, spec.prefix_stdout, &spec.stdout_file,
                     OutputStream::kStdout, &p.out, spec.stdout_copy),
          std::tuple(spec.stderr_to_console, spec.prefix_stderr, &spec.stderr_file,
                     OutputStream::kStderr, &p.err, spec.stderr_copy)}) {
      if (!to_console && !file->has_value()) {
        needs_devnull = true;
        continue;
      }
      auto created = OutputSink::Create(to_console ? console_ : nullptr, stream,
                                        prefixed ? spec.console_prefix : "", *file);
      if (!created.ok()) return created.status();
      *sink = std::move(*created);
      if (copy && to_console) (*sink)->CopyMatchingLines(copy);
    }
    p.env_strings = WorkerEnvironment(spec.env);
    for (std::string& entry : p.env_strings) p.envp.push_back(entry.data());
    p.envp.push_back(nullptr);
    p.candidates = ExecCandidates(spec.argv[0], spec.env);
    for (const std::string& path : p.candidates) p.candidate_ptrs.push_back(path.c_str());
    p.spec = std::move(spec);
    for (std::string& arg : p.spec.argv) p.argv.push_back(arg.data());
    p.argv.push_back(nullptr);
    prepared.push_back(std::move(p));
  }
  Fd devnull;
  if (needs_devnull) {
    int opened = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (opened < 0)
      return absl::InternalError(
          absl::StrCat("cannot open /dev/null: ", std::strerror(errno)));
    absl::StatusOr<int> fd = MakeFd(opened);
    if (!fd.ok()) return fd.status();
    devnull = Fd(*fd);
  }

  std::vector<std::shared_ptr<Worker>> started;
  // Undoes a partial start: no worker of a failed Start is left running.
  auto abandon = [&](absl::Status status) {
    for (const auto& worker : started) {
      KillGroup(*worker, SIGKILL);
      if (!worker->cgroup.empty()) KillCgroup(worker->cgroup);
      while (::waitpid(worker->pid, nullptr, 0) < 0 && errno == EINTR) {
      }
      if (!worker->cgroup.empty()) cgroups_to_remove_.push_back(worker->cgroup);
      worker->finished = true;
      worker->ClosePipe(worker->out.get());
      worker->ClosePipe(worker->err.get());
    }
    return status;
  };

  for (Prepared& p : prepared) {
    Fd out_read, out_write, err_read, err_write, status_read, status_write;
    absl::Status status;
    if (p.out) status.Update(MakePipe(&out_read, &out_write));
    if (p.err) status.Update(MakePipe(&err_read, &err_write));
    status.Update(MakePipe(&status_read, &status_write));
    if (!status.ok()) return abandon(status);
    std::string cgroup;
    Fd cgroup_procs;
    if (uses_cgroups()) {
      cgroup = absl::StrCat(cgroup_parent_, "/worker.", next_cgroup_++);
      if (::mkdir(cgroup.c_str(), 0755) == 0) {
        int fd =
            ::open(absl::StrCat(cgroup, "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
        absl::StatusOr<int> moved =
            fd < 0 ? absl::ErrnoToStatus(errno, "open") : MakeFd(fd);
        if (moved.ok()) cgroup_procs = Fd(*moved);
      } else {
        Log().warn("worker {} runs without a cgroup: cannot create {}: {}",
                   p.spec.local_rank, cgroup, std::strerror(errno));
        cgroup.clear();
      }
    }

    ChildArgs args;
    args.parent = ::getpid();
    args.ptracer = p.spec.ptracer;
    args.stdout_fd = p.out ? out_write.get() : devnull.get();
    args.stderr_fd = p.err ? err_write.get() : devnull.get();
    args.status_fd = status_write.get();
    args.cgroup_procs_fd = cgroup_procs.get();
    args.simulate_no_close_range_cloexec = options_.simulate_no_close_range_cloexec;
    // The startup soft limit, within today's hard one (which may be lower).
    (void)::getrlimit(RLIMIT_NOFILE, &args.nofile);
    args.nofile.rlim_cur = std::min(kStartupNofile.rlim_cur, args.nofile.rlim_max);
    args.argv = p.argv.data();
    args.envp = p.envp.data();
    args.candidates = p.candidate_ptrs.data();
    args.num_candidates = p.candidate_ptrs.size();

    // Signals stay blocked across fork, so no handler of the agent's (Asio's
    // writes to a pipe shared with the agent) runs in the child before it
    // resets them.
    sigset_t all, saved;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, &saved);
    pid_t pid = ::fork();
    if (pid == 0) RunChild(args);
    int fork_error = errno;
    ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
    if (pid < 0) {
      if (!cgroup.empty()) RemoveCgroup(cgroup);
      return abandon(absl::ResourceExhaustedError(
          absl::StrCat("cannot start worker ", p.spec.local_rank,
                       ": fork: ", std::strerror(fork_error))));
    }
    out_write.Reset();
    err_write.Reset();
    status_write.Reset();

    // EOF: the exec succeeded (the pipe is O_CLOEXEC), or the child died.
    ChildError child_error{};
    size_t got = 0;
    while (got < sizeof child_error) {
      ssize_t n = ::read(status_read.get(), reinterpret_cast<char*>(&child_error) + got,
                         sizeof child_error - got);
      if (n > 0) {
        got += static_cast<size_t>(n);
      } else if (n == 0 || errno != EINTR) {
        break;
      }
    }
    if (got == sizeof child_error) {
      // The child exits by itself (127/126) and is reaped and reported like
      // any worker; its stderr says why, as a shell would.
      std::string line = child_error.stage == ChildStage::kExec
                             ? absl::StrCat("meshrun: cannot execute '", p.spec.argv[0],
                                            "': ", std::strerror(child_error.error), "\n")
                             : absl::StrCat("meshrun: cannot start '", p.spec.argv[0],
                                            "': ", StageName(child_error.stage), ": ",
                                            std::strerror(child_error.error), "\n");
      if (p.err) {
        (void)p.err->Write(line);
      } else {
        Log().error("worker {}: {}", p.spec.local_rank,
                    std::string_view(line).substr(0, line.size() - 1));
      }
    }

    auto worker = std::make_shared<Worker>(io_);
    worker->local_rank = p.spec.local_rank;
    worker->global_rank = p.spec.global_rank;
    worker->pid = pid;
    worker->cgroup = std::move(cgroup);
    if (p.out) {
      worker->out = std::make_unique<Pipe>(io_, out_read.Release(), std::move(p.out));
      ++worker->open_pipes;
    }
    if (p.err) {
      worker->err = std::make_unique<Pipe>(io_, err_read.Release(), std::move(p.err));
      ++worker->open_pipes;
    }
    Log().debug("started worker {} (rank {}) as pid {}", worker->local_rank,
                worker->global_rank, pid);
    started.push_back(std::move(worker));
  }

  workers_ = std::move(started);
  for (const auto& worker : workers_) {
    if (worker->out) ReadPipe(worker, worker->out.get());
    if (worker->err) ReadPipe(worker, worker->err.get());
  }
  return absl::OkStatus();
}

void WorkerGroup::Stop(int signal, std::chrono::milliseconds grace,
                       std::function<void()> done) {
  if (workers_.empty()) {
    if (done) boost::asio::post(io_, std::move(done));
    return;
  }
  if (done) stop_done_.push_back(std::move(done));
  const SteadyClock::time_point deadline = SteadyClock::now() + grace;
  if (!stopping_) {
    stopping_ = true;
    grace_expired_ = false;
    ArmGraceTimer(deadline);
  } else if (!grace_expired_ && deadline < grace_deadline_) {
    ArmGraceTimer(deadline);
  }
  const char* name = ::sigabbrev_np(signal);
  size_t running = 0;
  for (const auto& worker : workers_) running += worker->reaped ? 0 : 1;
  Log().info("sending SIG{} to {} worker(s), SIGKILL after {} ms", name ? name : "?",
             running, grace.count());
  for (const auto& worker : workers_) KillGroup(*worker, signal);
}

void WorkerGroup::Signal(int signal) {
  for (const auto& worker : workers_) {
    if (!worker->reaped) KillGroup(*worker, signal);
  }
}

std::optional<int> WorkerGroup::SignalWorker(pid_t pid, int signal) {
  for (const auto& worker : workers_) {
    if (worker->pid == pid && !worker->reaped) {
      kill(pid, signal);
      return worker->local_rank;
    }
  }
  return std::nullopt;
}

std::vector<pid_t> WorkerGroup::pids() const {
  std::vector<pid_t> result;
  result.reserve(workers_.size());
  for (const auto& worker : workers_) result.push_back(worker->pid);
  return result;
}

std::vector<WorkerProgress> WorkerGroup::Progress() const {
  std::vector<WorkerProgress> result;
  // Without cgroups: one pass over /proc, when the first worker needs it.
  std::optional<std::map<pid_t, std::chrono::microseconds>> by_group;
  for (const auto& worker : workers_) {
    if (worker->reaped) continue;
    WorkerProgress progress;
    progress.pid = worker->pid;
    std::optional<std::chrono::microseconds> cpu;
    if (!worker->cgroup.empty()) cpu = CgroupCpuTime(worker->cgroup);
    if (!cpu) {
      if (!by_group) by_group = ProcessGroupCpuTimes();
      auto it = by_group->find(worker->pid);  // a worker leads its process group
      cpu = it != by_group->end() ? it->second : std::chrono::microseconds(0);
    }
    progress.cpu = *cpu;
    for (const Pipe* pipe : {worker->out.get(), worker->err.get()})
      if (pipe != nullptr) progress.output_bytes += pipe->bytes_read;
    result.push_back(progress);
  }
  return result;
}

std::optional<int> WorkerGroup::GlobalRankOf(pid_t pid) const {
  for (const auto& worker : workers_)
    if (worker->pid == pid && !worker->reaped) return worker->global_rank;
  return std::nullopt;
}

std::optional<int> WorkerGroup::LocalRankOf(pid_t pid) const {
  for (const auto& worker : workers_)
    if (worker->pid == pid && !worker->reaped) return worker->local_rank;
  return std::nullopt;
}

void WorkerGroup::KillGroup(const Worker& worker, int signal) {
  // Only while the leader is unreaped: its pid, which is the group's id,
  // cannot be reused until then. Once it is reaped and its group gone, the
  // number may name an unrelated group.
  if (worker.reaped) return;
  if (::kill(-worker.pid, signal) == 0 || errno != ESRCH) return;
  // Not a group leader (it failed before setsid, or left its group itself).
  ::kill(worker.pid, signal);
}

void WorkerGroup::WaitForSigchld() {
  std::weak_ptr<WorkerGroup*> self = self_;
  sigchld_.async_wait([self](const boost::system::error_code& error, int) {
    auto group = self.lock();
    if (!group || error) return;
    (*group)->WaitForSigchld();
    (*group)->Reap();
  });
}

void WorkerGroup::Reap() {
  // One SIGCHLD may stand for several exits; only our own pids are waited
  // for, so other children of the agent are left to their owners.
  const auto snapshot = workers_;
  for (const auto& worker : snapshot) {
    if (worker->reaped) continue;
    // WNOWAIT: the exited worker stays a zombie, so its pid, which is its
    // group's id, is still reserved while what it left in the group is
    // killed.
    siginfo_t info{};
    int waited;
    do {
      waited = ::waitid(P_PID, static_cast<id_t>(worker->pid), &info,
                        WEXITED | WNOHANG | WNOWAIT);
    } while (waited < 0 && errno == EINTR);
    if (waited == 0 && info.si_pid == 0) continue;  // still running
    pid_t result = -1;
    int status = 0;
    if (waited == 0) {
      EndLeftovers(*worker);
      do {
        result = ::waitpid(worker->pid, &status, 0);  // a zombie: at once
      } while (result < 0 && errno == EINTR);
    }
    worker->reaped = true;
    worker->when = std::chrono::system_clock::now();
    if (result == worker->pid) {
      worker->wait_status = status;
    } else {
      // Someone else reaped it (SIGCHLD ignored, or a waitpid(-1) elsewhere).
      // Its group id may be reused already: only its cgroup is safe to kill.
      worker->status_known = false;
      Log().error("worker {} (pid {}) was reaped by someone else: {}; counted as failed",
                  worker->local_rank, worker->pid, std::strerror(errno));
      if (!worker->cgroup.empty()) KillCgroup(worker->cgroup);
    }
    OnReaped(worker);
  }
}

void WorkerGroup::EndLeftovers(const Worker& worker) {
  // torch's agent likewise kills each worker's process group: nothing a
  // worker started may outlive it, into the next round or past the job.
  KillGroup(worker, SIGKILL);
  if (!worker.cgroup.empty()) KillCgroup(worker.cgroup);
}

void WorkerGroup::OnReaped(const std::shared_ptr<Worker>& worker) {
  // Also while stopping: what the worker left in its group (and cgroup) is
  // dead, so output still open is held by a process outside them, which no
  // grace period would end.
  if (worker->open_pipes == 0) {
    Finish(worker);
  } else {
    StartDrainTimer(worker);
  }
}

void WorkerGroup::ReadPipe(const std::shared_ptr<Worker>& worker, Pipe* pipe) {
  std::weak_ptr<WorkerGroup*> self = self_;
  pipe->descriptor.async_read_some(
      boost::asio::buffer(pipe->buffer),
      [self, worker, pipe](const boost::system::error_code& error, size_t bytes) {
        auto group = self.lock();
        if (!group || worker->finished || !pipe->open) return;
        if (bytes > 0) {
          pipe->bytes_read += bytes;
          absl::Status status =
              pipe->sink->Write(std::string_view(pipe->buffer.data(), bytes));
          if (!status.ok())
            Log().warn("worker {}: {}", worker->local_rank,
                       std::string(status.message()));
        }
        if (error) {  // EOF, or an error that ends the stream all the same
          worker->ClosePipe(pipe);
          (*group)->OnPipeClosed(worker);
          return;
        }
        (*group)->ReadPipe(worker, pipe);
      });
}

void WorkerGroup::OnPipeClosed(const std::shared_ptr<Worker>& worker) {
  if (worker->reaped && worker->open_pipes == 0) Finish(worker);
}

void WorkerGroup::StartDrainTimer(const std::shared_ptr<Worker>& worker) {
  const uint64_t generation = ++worker->drain_generation;
  worker->drain_timer.expires_after(options_.output_drain_timeout);
  std::weak_ptr<WorkerGroup*> self = self_;
  worker->drain_timer.async_wait([self, worker,
                                  generation](const boost::system::error_code& error) {
    auto group = self.lock();
    if (!group || error || worker->finished || generation != worker->drain_generation)
      return;
    Log().warn(
        "worker {} (pid {}) exited but its output is still open {} ms later (a "
        "process it started holds it); closing it",
        worker->local_rank, worker->pid, (*group)->options_.output_drain_timeout.count());
    worker->ClosePipe(worker->out.get());
    worker->ClosePipe(worker->err.get());
    (*group)->Finish(worker);
  });
}

void WorkerGroup::ArmGraceTimer(SteadyClock::time_point deadline) {
  grace_deadline_ = deadline;
  const uint64_t generation = ++grace_generation_;
  grace_timer_.expires_at(deadline);
  std::weak_ptr<WorkerGroup*> self = self_;
  grace_timer_.async_wait([self, generation](const boost::system::error_code& error) {
    auto group = self.lock();
    if (!group || error || generation != (*group)->grace_generation_) return;
    (*group)->OnGraceExpired();
  });
}

void WorkerGroup::OnGraceExpired() {
  grace_expired_ = true;
  size_t running = 0;
  for (const auto& worker : workers_) running += worker->reaped ? 0 : 1;
  if (running > 0)
    Log().warn("{} worker(s) still running after the grace period; sending SIGKILL",
               running);
  for (const auto& worker : workers_) {
    if (worker->reaped) continue;
    KillGroup(*worker, SIGKILL);
    if (!worker->cgroup.empty()) KillCgroup(worker->cgroup);
  }
}

void WorkerGroup::Finish(const std::shared_ptr<Worker>& worker) {
  worker->finished = true;
  ++worker->drain_generation;
  worker->drain_timer.cancel();
  worker->ClosePipe(worker->out.get());
  worker->ClosePipe(worker->err.get());
  workers_.erase(std::find(workers_.begin(), workers_.end(), worker));
  if (!worker->cgroup.empty()) cgroups_to_remove_.push_back(worker->cgroup);
  RemoveCgroups();

  WorkerExit exit;
  exit.local_rank = worker->local_rank;
  exit.global_rank = worker->global_rank;
  exit.pid = worker->pid;
  exit.when = worker->when;
  if (!worker->status_known) {
    exit.exit_code = -1;
    exit.status_known = false;
  } else if (WIFEXITED(worker->wait_status)) {
    exit.exit_code = WEXITSTATUS(worker->wait_status);
  } else if (WIFSIGNALED(worker->wait_status)) {
    exit.exit_code = -1;
    exit.signal = WTERMSIG(worker->wait_status);
  }
  Log().debug("worker {} (pid {}) exited: code {}, signal {}", exit.local_rank, exit.pid,
              exit.exit_code, exit.signal);
  if (on_exit_) on_exit_(exit);
  MaybeFinishStop();
}

void WorkerGroup::MaybeFinishStop() {
  if (!stopping_ || !workers_.empty()) return;
  stopping_ = false;
  grace_expired_ = false;
  ++grace_generation_;
  grace_timer_.cancel();
  boost::asio::post(io_, [done = std::move(stop_done_)] {
    for (const auto& callback : done) callback();
  });
  stop_done_.clear();
}

}  // namespace meshrun::agent
