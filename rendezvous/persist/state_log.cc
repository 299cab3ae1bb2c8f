#include "rendezvous/persist/state_log.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "rendezvous/core/state_codec.h"

namespace meshrun::rdzv {
namespace fs = std::filesystem;

namespace {

std::string Errno() { return std::strerror(errno); }

absl::Status WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("write: ", Errno()));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InternalError(absl::StrCat("cannot read ", path, ": ", Errno()));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat("cannot read ", path));
  return std::move(text).str();
}

absl::Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", dir, ": ", Errno()));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat("fsync ", dir, ": ", Errno()));
  return absl::OkStatus();
}

std::string WalPath(const std::string& dir, uint64_t gen) {
  return absl::StrCat(dir, "/wal.", gen);
}

// --state-dir's medium: LOCK, snapshot, wal.<gen> (see state_log.h).
class DirMedium final : public StateMedium {
 public:
  static absl::StatusOr<std::unique_ptr<DirMedium>> Open(const std::string& dir) {
    std::unique_ptr<DirMedium> medium(new DirMedium());
    medium->dir_ = dir;
    std::error_code error;
    fs::create_directories(dir, error);
    if (error) return absl::InternalError(error.message());
    const std::string lock_path = dir + "/LOCK";
    medium->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (medium->lock_fd_ < 0) {
      return absl::InternalError(absl::StrCat("cannot open ", lock_path, ": ", Errno()));
    }
    if (::flock(medium->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      std::string holder;
      char buf[32] = {};
      if (::pread(medium->lock_fd_, buf, sizeof buf - 1, 0) > 0) holder = buf;
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' '))
        holder.pop_back();
      return absl::FailedPreconditionError(
          absl::StrCat("in use by another meshrun-rdzvd",
                       holder.empty() ? "" : absl::StrCat(" (pid ", holder, ")")));
    }
    const std::string pid = absl::StrCat(::getpid(), "\n");
    if (::ftruncate(medium->lock_fd_, 0) != 0 ||
        ::pwrite(medium->lock_fd_, pid.data(), pid.size(), 0) < 0) {
      return absl::InternalError(absl::StrCat("cannot write ", lock_path, ": ", Errno()));
    }
    return medium;
  }
  ~DirMedium() override {
    if (wal_fd_ >= 0) ::close(wal_fd_);
    if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
  }

  std::string name() const override { return "state dir " + dir_; }

  absl::StatusOr<std::optional<std::string>> ReadSnapshot() override {
    const std::string path = dir_ + "/snapshot";
    std::error_code error;
    if (!fs::exists(path, error)) return std::nullopt;
    auto bytes = ReadWhole(path);
    if (!bytes.ok()) return bytes.status();
    return std::optional<std::string>(std::move(*bytes));
  }

  absl::StatusOr<std::string> ReadLog(uint64_t gen) override {
    generation_ = gen;
    const std::string path = WalPath(dir_, gen);
    std::error_code error;
    if (!fs::exists(path, error)) return std::string();
    return ReadWhole(path);
  }

  absl::Status Append(std::string_view frames) override {
    if (absl::Status s = WriteAll(wal_fd_, frames); !s.ok()) return s;
    if (::fdatasync(wal_fd_) != 0) return absl::InternalError("fdatasync: " + Errno());
    return absl::OkStatus();
  }

  absl::Status InstallSnapshot(const std::string& bytes, uint64_t gen) override {
    // The new log exists before the snapshot that names it.
    const std::string wal_path = WalPath(dir_, gen);
    int wal = ::open(wal_path.c_str(),
                     O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (wal < 0) {
      return absl::InternalError(absl::StrCat("cannot create ", wal_path, ": ", Errno()));
    }
    const std::string tmp = dir_ + "/snapshot.tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      ::close(wal);
      return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", Errno()));
    }
    absl::Status status = WriteAll(fd, bytes);
    if (status.ok() && ::fsync(fd) != 0)
      status = absl::InternalError("fsync: " + Errno());
    ::close(fd);
    if (status.ok() && ::rename(tmp.c_str(), (dir_ + "/snapshot").c_str()) != 0)
      status = absl::InternalError("rename snapshot: " + Errno());
    if (status.ok()) status = SyncDir(dir_);
    if (!status.ok()) {
      ::close(wal);
      return status;
    }
    if (wal_fd_ >= 0) ::close(wal_fd_);
    wal_fd_ = wal;
    generation_ = gen;
    // Logs of older generations (the previous one, or one left by a crash
    // between rename and unlink) are covered by the snapshot.
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(dir_, error)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("wal.", 0) == 0 && name != absl::StrCat("wal.", generation_)) {
        fs::remove(entry.path(), error);
      }
    }
    return absl::OkStatus();
  }

 private:
  DirMedium() = default;
  std::string dir_;
  int lock_fd_ = -1;
  int wal_fd_ = -1;
  uint64_t generation_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StateLog>> StateLog::Open(
    const std::string& dir, size_t snapshot_after_bytes, KvStore* store,
    RendezvousState* rendezvous, RdzvTime now, StateLoadReport* report) {
  auto medium = DirMedium::Open(dir);
  if (!medium.ok()) {
    return absl::Status(medium.status().code(),
                        absl::StrCat("state dir ", dir, ": ", medium.status().message()));
  }
  return Open(std::move(*medium), snapshot_after_bytes, store, rendezvous, now, report);
}

absl::StatusOr<std::unique_ptr<StateLog>> StateLog::Open(
    std::unique_ptr<StateMedium> medium, size_t snapshot_after_bytes, KvStore* store,
    RendezvousState* rendezvous, RdzvTime now, StateLoadReport* report) {
  const std::string name = medium->name();
  auto fail = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(name, ": ", s.message()));
  };
  std::unique_ptr<StateLog> log(new StateLog());
  log->medium_ = std::move(medium);
  log->snapshot_after_bytes_ = snapshot_after_bytes;

  // Load: the snapshot (if any) names the log generation that follows it.
  uint64_t gen = 0;
  auto snapshot = log->medium_->ReadSnapshot();
  if (!snapshot.ok()) return fail(snapshot.status());
  if (snapshot->has_value()) {
    auto next = codec::DecodeSnapshot(**snapshot, store, rendezvous, now);
    if (!next.ok()) {
      return fail(absl::DataLossError(
          absl::StrCat("snapshot is damaged (", next.status().message(),
                       "); refusing to start rather than lose part of the state. Move "
                       "it away to start empty")));
    }
    gen = *next;
    report->had_snapshot = true;
  }
  auto bytes = log->medium_->ReadLog(gen);
  if (!bytes.ok()) return fail(bytes.status());
  if (!bytes->empty()) {
    auto scan = codec::ScanFrames(*bytes);
    if (!scan.ok()) {
      return fail(absl::DataLossError(
          absl::StrCat("log ", gen, " is damaged (", scan.status().message(),
                       "); refusing to start rather than lose part of the state")));
    }
    for (std::string_view record : scan->records) {
      if (absl::Status s = codec::ApplyRecord(record, store, rendezvous, now); !s.ok()) {
        return fail(absl::DataLossError(absl::StrCat(
            "log ", gen, " record ", report->log_records, ": ", s.message())));
      }
      ++report->log_records;
    }
    report->torn_tail = scan->torn_tail;
  }
  report->store_entries = store->num_entries();
  report->runs = rendezvous->RunIds().size();

  // Start from a fresh snapshot: it drops a torn tail for good and leaves the
  // next start nothing to replay twice.
  log->generation_ = gen;
  if (absl::Status s = log->InstallSnapshot(
          codec::EncodeSnapshot(*store, *rendezvous, gen + 1, now), gen + 1);
      !s.ok()) {
    return fail(s);
  }
  return log;
}

StateLog::~StateLog() { Stop(); }

absl::Status StateLog::InstallSnapshot(const std::string& bytes, uint64_t gen) {
  if (absl::Status s = medium_->InstallSnapshot(bytes, gen); !s.ok()) return s;
  generation_ = gen;
  wal_bytes_ = 0;
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.snapshots;
  return absl::OkStatus();
}

void StateLog::Start(Collect collect, Snapshot snapshot) {
  collect_ = std::move(collect);
  snapshot_ = std::move(snapshot);
  flusher_ = std::thread([this] { FlushLoop(); });
}

void StateLog::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (flusher_.joinable()) flusher_.join();
}

uint64_t StateLog::Append(std::string_view payload) {
  std::lock_guard<std::mutex> lock(mu_);
  codec::AppendFrame(&pending_, payload);
  ++stats_.records;
  ++last_seq_;
  work_cv_.notify_one();
  return last_seq_;
}

StateLog::Mark StateLog::Now() {
  std::lock_guard<std::mutex> lock(mu_);
  return Mark{last_seq_, pokes_};
}

void StateLog::WhenDurable(Mark mark, std::function<void()> done) {
  std::lock_guard<std::mutex> lock(mu_);
  callbacks_.emplace_back(mark, std::move(done));
  work_cv_.notify_one();
}

std::vector<std::function<void()>> StateLog::TakeReadyLocked() {
  std::vector<std::function<void()>> ready;
  for (auto it = callbacks_.begin(); it != callbacks_.end();) {
    if (DurableLocked(it->first)) {
      ready.push_back(std::move(it->second));
      it = callbacks_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

void StateLog::Poke() {
  std::lock_guard<std::mutex> lock(mu_);
  ++pokes_;
  work_cv_.notify_one();
}

StateLog::Stats StateLog::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void StateLog::RunReady() {
  std::vector<std::function<void()>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready = TakeReadyLocked();
  }
  for (auto& done : ready) done();
}

void StateLog::Fatal(const std::string& what) {
  // Nothing more can be made durable, so nothing more may be acknowledged:
  // end like a crash. Agents keep their workers and reconnect to a restarted
  // daemon, which loads what did reach the disk.
  spdlog::critical("{}: {}; exiting", medium_->name(), what);
  std::fflush(nullptr);
  ::_exit(3);
}

void StateLog::FlushLoop() {
  while (true) {
    bool stopping;
    uint64_t pokes;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] {
        return stopping_ || pokes_ != durable_pokes_ || !pending_.empty() ||
               (!callbacks_.empty() && DurableLocked(callbacks_.front().first));
      });
      stopping = stopping_;
      // Every change poked up to here is collected below.
      pokes = pokes_;
    }
    if (collect_) collect_(*this);
    std::string data;
    uint64_t upto;
    {
      std::lock_guard<std::mutex> lock(mu_);
      data.swap(pending_);
      upto = last_seq_;
    }
    if (!data.empty()) {
      if (absl::Status s = medium_->Append(data); !s.ok())
        Fatal(std::string(s.message()));
      wal_bytes_ += data.size();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      durable_seq_ = upto;
      durable_pokes_ = pokes;
      if (!data.empty()) {
        ++stats_.fsyncs;
        stats_.bytes += data.size();
      }
    }
    RunReady();

    if (wal_bytes_ >= snapshot_after_bytes_ && snapshot_) {
      uint64_t covered = 0;
      std::string bytes = snapshot_([&] {
        std::lock_guard<std::mutex> lock(mu_);
        pending_.clear();  // the snapshot taken under the callers' locks holds them
        covered = last_seq_;
        return generation_ + 1;
      });
      if (absl::Status s = InstallSnapshot(bytes, generation_ + 1); !s.ok())
        Fatal(std::string(s.message()));
      {
        std::lock_guard<std::mutex> lock(mu_);
        durable_seq_ = std::max(durable_seq_, covered);
      }
      RunReady();
    }
    if (stopping) {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.empty() && callbacks_.empty()) return;
    }
  }
}

}  // namespace meshrun::rdzv
