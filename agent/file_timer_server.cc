#include "agent/file_timer_server.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace meshrun::agent {

namespace {

// torch's client refuses requests over PIPE_BUF (4096) bytes; more than this
// without a newline is not a client of torch's.
constexpr size_t kMaxLineBytes = 64 * 1024;
// Expirations are looked for at least this often (the wall clock may jump).
constexpr std::chrono::milliseconds kMaxCheckInterval{1000};

double UnixNow() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<FileTimerServer>> FileTimerServer::Start(
    boost::asio::io_context& io, const std::string& path, Callbacks callbacks) {
  auto failed = [&](const char* what) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot ", what, " the watchdog's FIFO ", path, ": ", strerror(errno)));
  };
  if (unlink(path.c_str()) != 0 && errno != ENOENT) return failed("replace");
  if (mkfifo(path.c_str(), 0600) != 0) return failed("create");
  const int read_fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (read_fd < 0) {
    auto status = failed("open");
    unlink(path.c_str());
    return status;
  }
  const int keep_fd = open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (keep_fd < 0) {
    auto status = failed("open");
    close(read_fd);
    unlink(path.c_str());
    return status;
  }
  std::unique_ptr<FileTimerServer> server(
      new FileTimerServer(io, path, read_fd, keep_fd, std::move(callbacks)));
  server->Read();
  return server;
}

FileTimerServer::FileTimerServer(boost::asio::io_context& io, std::string path,
                                 int read_fd, int keep_fd, Callbacks callbacks)
    : path_(std::move(path)),
      callbacks_(std::move(callbacks)),
      fifo_(io, read_fd),
      keep_fd_(keep_fd),
      timer_(io),
      self_(std::make_shared<FileTimerServer*>(this)) {}

FileTimerServer::~FileTimerServer() {
  *self_ = nullptr;
  boost::system::error_code ignored;
  fifo_.close(ignored);
  timer_.cancel();
  close(keep_fd_);
  unlink(path_.c_str());
}

void FileTimerServer::Read() {
  std::weak_ptr<FileTimerServer*> weak = self_;
  fifo_.async_read_some(
      boost::asio::buffer(buffer_),
      [weak](const boost::system::error_code& error, size_t bytes) {
        auto self = weak.lock();
        if (!self || *self == nullptr || error == boost::asio::error::operation_aborted)
          return;
        FileTimerServer& server = **self;
        if (error) {
          // Cannot happen while keep_fd_ is open; stop serving rather than spin.
          spdlog::error("worker watchdog: cannot read {}: {}", server.path_,
                        error.message());
          return;
        }
        server.pending_.append(server.buffer_, bytes);
        size_t start = 0;
        for (size_t end; (end = server.pending_.find('\n', start)) != std::string::npos;
             start = end + 1) {
          server.OnLine(std::string_view(server.pending_).substr(start, end - start));
        }
        server.pending_.erase(0, start);
        if (server.pending_.size() > kMaxLineBytes) {
          server.refusals_.Refuse(
              absl::StrCat("a line of over ", kMaxLineBytes, " bytes"));
          server.pending_.clear();
        }
        server.CheckTimers();
        server.Read();
      });
}

void FileTimerServer::OnLine(std::string_view line) {
  absl::StatusOr<TimerRequest> request = ParseTimerRequest(line);
  if (!request.ok()) {
    refusals_.Refuse(absl::StrCat("a line that is not a timer request (",
                                  request.status().message(), ")"));
    return;
  }
  if (!callbacks_.is_worker(request->pid)) {
    refusals_.Refuse(absl::StrCat("a timer request for pid ", request->pid,
                                  ", not one of this agent's running workers"));
    return;
  }
  table_.Apply(*request);
}

void FileTimerServer::CheckTimers() {
  const double now = UnixNow();
  for (const ExpiredWorker& worker : table_.TakeExpired(now)) callbacks_.expired(worker);
  timer_.cancel();
  std::optional<double> next = table_.NextExpiration();
  if (!next) return;
  const auto wait = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::duration<double>(*next - now)),
                               std::chrono::milliseconds(1), kMaxCheckInterval);
  timer_.expires_after(wait);
  std::weak_ptr<FileTimerServer*> weak = self_;
  timer_.async_wait([weak](const boost::system::error_code& error) {
    auto self = weak.lock();
    if (error || !self || *self == nullptr) return;
    (*self)->CheckTimers();
  });
}

}  // namespace meshrun::agent
