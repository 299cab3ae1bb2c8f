#include "tests/e2e/slurm_cluster.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "tests/support/child_process.h"

extern char** environ;

namespace meshrun::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr char kLockFile[] = "/tmp/meshrun-slurm-e2e.lock";
constexpr char kHostsFile[] = "/etc/hosts";
constexpr char kHostsMarker[] = "# meshrun slurm e2e";
constexpr int kNodes = 3;

const char* const kRequired[] = {
    "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/slurmstepd",
    "/usr/sbin/munged",    "/usr/bin/srun",    "/usr/bin/sbatch",
    "/usr/bin/scancel",    "/usr/bin/sinfo",   "/usr/bin/squeue",
};

std::string NodeName(int i) { return "n" + std::to_string(i + 1); }

// Kernel-chosen free ports, distinct (all bound at once, then released).
std::vector<int> FreePorts(int count) {
  std::vector<int> fds, ports;
  for (int i = 0; i < count; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof addr;
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      if (fd >= 0) close(fd);
      continue;
    }
    fds.push_back(fd);
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) close(fd);
  return ports;
}

// Starts argv in `dir` with stdin from /dev/null and stdout+stderr appended
// to `log`.
pid_t SpawnDaemon(const std::vector<std::string>& argv, const std::string& dir,
                  const std::string& log) {
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addchdir_np(&actions, dir.c_str());
  pid_t pid = -1;
  int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

// SIGTERM, up to `grace` to exit, then SIGKILL; always reaps.
void StopDaemon(pid_t pid, milliseconds grace) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  auto deadline = Clock::now() + grace;
  while (Clock::now() < deadline) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return;
    std::this_thread::sleep_for(milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

bool Exited(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, WNOHANG) == pid;
}

bool Resolves(const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* result = nullptr;
  if (getaddrinfo(name.c_str(), nullptr, &hints, &result) != 0) return false;
  freeaddrinfo(result);
  return true;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Rewrites /etc/hosts in place (it is often a bind mount: no rename over it)
// without the lines containing `marker`.
void RemoveHostsLines(const std::string& marker) {
  std::string text = ReadFile(kHostsFile);
  std::stringstream in(text);
  std::string line, kept;
  bool changed = false;
  while (std::getline(in, line)) {
    if (line.find(marker) != std::string::npos) {
      changed = true;
      continue;
    }
    kept += line + "\n";
  }
  if (!changed) return;
  std::ofstream out(kHostsFile, std::ios::trunc);
  out << kept;
}

std::string Tail(const std::string& path, int lines) {
  std::string text = ReadFile(path);
  size_t pos = text.size();
  for (int i = 0; i <= lines && pos != std::string::npos && pos > 0; ++i) {
    pos = text.rfind('\n', pos - 1);
  }
  return pos == std::string::npos ? text : text.substr(pos + 1);
}

}  // namespace

std::optional<int> RunCommand(const std::vector<std::string>& argv, milliseconds timeout,
                              std::string* output) {
  ChildProcess child(argv, /*merge_stderr=*/true);
  auto deadline = Clock::now() + timeout;
  *output = child.ReadAll(timeout);
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
  return child.Wait(std::max(left, milliseconds(100)));
}

std::optional<std::string> SlurmCluster::WhyUnavailable() {
  if (geteuid() != 0) {
    return std::string(
        "needs root: slurmd and munged of the test cluster run as root (CI runs as "
        "root)");
  }
  std::string missing;
  for (const char* path : kRequired) {
    if (access(path, X_OK) != 0)
      missing += std::string(missing.empty() ? "" : ", ") + path;
  }
  if (!missing.empty()) {
    return "needs Debian's slurmctld slurmd slurm-client munge (bash "
           "scripts/install-deps.sh); missing " +
           missing;
  }
  return std::nullopt;
}

std::unique_ptr<SlurmCluster> SlurmCluster::Start(std::string* error) {
  std::unique_ptr<SlurmCluster> cluster(new SlurmCluster());
  auto began = Clock::now();
  // One cluster on the machine at a time: they share /etc/hosts and the
  // node names.
  cluster->lock_fd_ = open(kLockFile, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  auto lock_deadline = Clock::now() + std::chrono::minutes(10);
  while (cluster->lock_fd_ >= 0 && flock(cluster->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (Clock::now() >= lock_deadline) {
      *error =
          std::string("another SLURM test cluster held ") + kLockFile + " for 10 min";
      return nullptr;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  if (!cluster->Launch(error) || !cluster->WaitIdle(std::chrono::seconds(60), error)) {
    *error += "\n" + cluster->Logs();
    return nullptr;
  }
  cluster->start_time_ = std::chrono::duration_cast<milliseconds>(Clock::now() - began);
  return cluster;
}

bool SlurmCluster::Launch(std::string* error) {
  char pattern[] = "/tmp/meshrun-slurm-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    *error = "mkdtemp failed";
    return false;
  }
  dir_ = pattern;
  // munged wants its socket's directory reachable by all.
  chmod(dir_.c_str(), 0755);
  std::filesystem::create_directories(dir_ + "/state");
  std::filesystem::create_directories(dir_ + "/spool");

  const std::string key = dir_ + "/munge.key";
  {
    std::random_device random;
    std::ofstream out(key, std::ios::binary);
    for (int i = 0; i < 1024; ++i) out.put(static_cast<char>(random()));
  }
  chmod(key.c_str(), 0600);
  const std::string socket = dir_ + "/munge.sock";
  munged_ = SpawnDaemon(
      {"/usr/sbin/munged", "-F", "--force", "--socket=" + socket, "--key-file=" + key,
       "--pid-file=" + dir_ + "/munged.pid", "--log-file=" + dir_ + "/munged.log",
       "--seed-file=" + dir_ + "/munged.seed", "--num-threads=2"},
      dir_, dir_ + "/munged.out");
  if (munged_ < 0) {
    *error = "cannot start munged";
    return false;
  }

  std::vector<int> ports = FreePorts(1 + kNodes);
  if (static_cast<int>(ports.size()) != 1 + kNodes) {
    *error = "cannot find free ports";
    return false;
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string short_host(host);
  short_host = short_host.substr(0, short_host.find('.'));
  // Job ids (and so meshrun's derived rendezvous ports) differ between runs.
  std::random_device random;
  int first_job_id = 1000 + static_cast<int>(random() % 1000000);

  conf_ = dir_ + "/slurm.conf";
  {
    std::ofstream conf(conf_);
    conf << "ClusterName=meshrun\n"
         << "SlurmctldHost=" << short_host << "(127.0.0.1)\n"
         << "SlurmctldPort=" << ports[0] << "\n"
         << "SlurmUser=root\nSlurmdUser=root\n"
         << "AuthType=auth/munge\nCredType=cred/munge\n"
         << "AuthInfo=socket=" << socket << "\n"
         << "StateSaveLocation=" << dir_ << "/state\n"
         << "SlurmdSpoolDir=" << dir_ << "/spool/%n\n"
         << "SlurmctldPidFile=" << dir_ << "/slurmctld.pid\n"
         << "SlurmdPidFile=" << dir_ << "/slurmd-%n.pid\n"
         << "SlurmctldLogFile=" << dir_ << "/slurmctld.log\n"
         << "SlurmdLogFile=" << dir_
         << "/slurmd-%n.log\n"
         // pgid: SLURM signals only the task's process group, i.e. meshrun;
         // meshrun's workers (own groups) are reached by meshrun alone.
         << "ProctrackType=proctrack/pgid\nTaskPlugin=task/none\n"
         << "MpiDefault=none\nSwitchType=switch/none\n"
         << "SchedulerType=sched/builtin\n"
         << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
         << "SlurmdParameters=config_overrides\nReturnToService=2\n"
         << "AccountingStorageType=accounting_storage/none\n"
         << "JobCompType=jobcomp/none\nJobAcctGatherType=jobacct_gather/none\n"
         << "FirstJobId=" << first_job_id << "\n"
         << "KillWait=10\nInactiveLimit=0\nMinJobAge=300\n";
    for (int i = 0; i < kNodes; ++i) {
      conf << "NodeName=" << NodeName(i) << " NodeHostname=" << short_host
           << " NodeAddr=127.0.0.1 Port=" << ports[1 + i]
           << " CPUs=4 RealMemory=1000 State=UNKNOWN\n";
    }
    conf << "PartitionName=debug Nodes=n[1-" << kNodes
         << "] Default=YES MaxTime=INFINITE State=UP\n";
  }
  setenv("SLURM_CONF", conf_.c_str(), 1);

  // munged must answer before slurmctld asks it anything (bounded).
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!std::filesystem::exists(socket)) {
    if (Exited(munged_) || Clock::now() >= deadline) {
      munged_ = -1;
      *error = "munged did not create its socket";
      return false;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }

  MapNodeNames();
  pid_t ctld = SpawnDaemon({"/usr/sbin/slurmctld", "-D", "-c", "-f", conf_}, dir_,
                           dir_ + "/slurmctld.out");
  if (ctld < 0) {
    *error = "cannot start slurmctld";
    return false;
  }
  daemons_.push_back(ctld);
  for (int i = 0; i < kNodes; ++i) {
    pid_t slurmd = SpawnDaemon({"/usr/sbin/slurmd", "-D", "-N", NodeName(i), "-f", conf_},
                               dir_, dir_ + "/slurmd-" + NodeName(i) + ".out");
    if (slurmd < 0) {
      *error = "cannot start slurmd -N " + NodeName(i);
      return false;
    }
    daemons_.push_back(slurmd);
  }
  return true;
}

bool SlurmCluster::WaitIdle(milliseconds timeout, std::string* error) {
  auto deadline = Clock::now() + timeout;
  std::string last;
  while (Clock::now() < deadline) {
    for (pid_t pid : daemons_) {
      if (Exited(pid)) {
        *error = "a SLURM daemon exited during start (pid " + std::to_string(pid) + ")";
        return false;
      }
    }
    std::optional<int> status = RunCommand({"/usr/bin/sinfo", "-h", "-N", "-o", "%N %T"},
                                           milliseconds(5000), &last);
    if (status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) {
      int idle = 0;
      std::stringstream lines(last);
      std::string line;
      while (std::getline(lines, line)) {
        if (line.find(" idle") != std::string::npos) ++idle;
      }
      if (idle == kNodes) return true;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  *error = "the SLURM nodes were not idle within " +
           std::to_string(timeout.count() / 1000) + " s; sinfo: " + last;
  return false;
}

void SlurmCluster::MapNodeNames() {
  // A line left by a test that was killed: we hold the lock, so it is stale.
  RemoveHostsLines(kHostsMarker);
  bool all = true;
  for (int i = 0; i < kNodes; ++i) all = all && Resolves(NodeName(i));
  if (all) return;
  hosts_line_ = "127.0.0.1";
  for (int i = 0; i < kNodes; ++i) hosts_line_ += " " + NodeName(i);
  hosts_line_ += std::string(" ") + kHostsMarker;
  std::ofstream out(kHostsFile, std::ios::app);
  out << hosts_line_ << "\n";
}

void SlurmCluster::UnmapNodeNames() {
  if (!hosts_line_.empty()) RemoveHostsLines(kHostsMarker);
}

std::string SlurmCluster::Logs() const {
  std::string logs;
  if (dir_.empty()) return logs;
  for (const char* name : {"munged.log", "munged.out", "slurmctld.log", "slurmctld.out",
                           "slurmd-n1.log", "slurmd-n2.log", "slurmd-n3.log"}) {
    std::string path = dir_ + "/" + name;
    if (!std::filesystem::exists(path)) continue;
    logs += "--- " + path + " (tail)\n" + Tail(path, 15);
  }
  return logs;
}

SlurmCluster::~SlurmCluster() {
  if (!daemons_.empty() && !Exited(daemons_.front())) {
    // Jobs a failed test left behind end first, so no slurmstepd outlives
    // its slurmd.
    std::string out;
    RunCommand({"/usr/bin/scancel", "--user=root"}, milliseconds(5000), &out);
    auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline) {
      auto status =
          RunCommand({"/usr/bin/squeue", "-h", "-o", "%i %T"}, milliseconds(5000), &out);
      if (!status || out.find_first_not_of(" \n") == std::string::npos) break;
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
  // slurmds, then slurmctld, then munged, which the others use to the end.
  for (auto it = daemons_.rbegin(); it != daemons_.rend(); ++it) {
    StopDaemon(*it, milliseconds(10000));
  }
  StopDaemon(munged_, milliseconds(5000));
  UnmapNodeNames();
  if (!dir_.empty() && getenv("MESHRUN_KEEP_SLURM_DIR") == nullptr) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  if (lock_fd_ >= 0) close(lock_fd_);
}

}  // namespace meshrun::testing
