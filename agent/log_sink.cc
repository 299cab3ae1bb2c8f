#include "agent/log_sink.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace meshrun::agent {

namespace {

// Writes all of `data` to `fd`; returns 0 or the errno that stopped it.
int WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n >= 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      // Someone made the fd non-blocking (a shared terminal can be); wait
      // instead of dropping the rest of a line.
      pollfd pfd{fd, POLLOUT, 0};
      if (::poll(&pfd, 1, -1) >= 0 || errno == EINTR) continue;
    }
    return errno;
  }
  return 0;
}

}  // namespace

ConsoleWriter& ConsoleWriter::Default() {
  // Never destroyed: workers' output may still be flushed during static
  // destruction of the agent.
  static ConsoleWriter* const writer = new ConsoleWriter(STDOUT_FILENO, STDERR_FILENO);
  return *writer;
}

ConsoleWriter::ConsoleWriter(int stdout_fd, int stderr_fd) : fds_{stdout_fd, stderr_fd} {}

void ConsoleWriter::Write(OutputStream stream, std::string_view lines) {
  if (lines.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  (void)WriteAll(fds_[stream == OutputStream::kStdout ? 0 : 1], lines);
}

absl::StatusOr<std::shared_ptr<LineCopy>> LineCopy::Create(
    const std::string& file, std::vector<std::string> needles) {
  std::filesystem::path path(file);
  std::error_code error;
  if (path.has_parent_path())
    std::filesystem::create_directories(path.parent_path(), error);
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot open ", file, ": ", std::strerror(errno)));
  }
  return std::shared_ptr<LineCopy>(new LineCopy(fd, std::move(needles)));
}

LineCopy::~LineCopy() {
  if (fd_ >= 0) ::close(fd_);
}

void LineCopy::Offer(std::string_view prefix, std::string_view line) {
  if (fd_ < 0) return;
  bool match = false;
  for (const std::string& needle : needles_) {
    if (line.find(needle) != std::string_view::npos) {
      match = true;
      break;
    }
  }
  if (!match) return;
  std::string out;
  out.reserve(prefix.size() + line.size() + 1);
  out.append(prefix).append(line).push_back('\n');
  if (WriteAll(fd_, out) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

absl::StatusOr<std::unique_ptr<OutputSink>> OutputSink::Create(
    ConsoleWriter* console, OutputStream stream, std::string prefix,
    const std::optional<std::string>& file) {
  int fd = -1;
  if (file) {
    std::filesystem::path path(*file);
    if (path.has_parent_path()) {
      std::error_code error;
      std::filesystem::create_directories(path.parent_path(), error);
      if (error) {
        return absl::InternalError(absl::StrCat("cannot create directory ",
                                                path.parent_path().string(), ": ",
                                                error.message()));
      }
    }
    fd = ::open(file->c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::InternalError(
          absl::StrCat("cannot open ", *file, ": ", std::strerror(errno)));
    }
  }
  return std::unique_ptr<OutputSink>(
      new OutputSink(console, stream, std::move(prefix), fd, file.value_or("")));
}

OutputSink::OutputSink(ConsoleWriter* console, OutputStream stream, std::string prefix,
                       int file_fd, std::string file_path)
    : console_(console),
      stream_(stream),
      prefix_(std::move(prefix)),
      file_fd_(file_fd),
      file_path_(std::move(file_path)) {}

OutputSink::~OutputSink() {
  if (file_fd_ >= 0) ::close(file_fd_);
}

void OutputSink::AppendLine(std::string_view line, std::string* out) const {
  if (copy_) copy_->Offer(prefix_, line);
  out->append(prefix_);
  out->append(line);
  out->push_back('\n');
}

absl::Status OutputSink::Write(std::string_view bytes) {
  if (closed_ || bytes.empty()) return absl::OkStatus();
  absl::Status status;
  if (file_fd_ >= 0) {
    if (int error = WriteAll(file_fd_, bytes); error != 0) {
      status = absl::InternalError(
          absl::StrCat("cannot write ", file_path_, ": ", std::strerror(error)));
      ::close(file_fd_);
      file_fd_ = -1;
    }
  }
  if (console_ == nullptr) return status;

  std::string out;
  size_t start = 0;
  while (start < bytes.size()) {
    size_t newline = bytes.find('\n', start);
    if (newline == std::string_view::npos) break;
    std::string_view piece = bytes.substr(start, newline - start);
    if (partial_.empty()) {
      AppendLine(piece, &out);
    } else {
      partial_.append(piece);
      AppendLine(partial_, &out);
      partial_.clear();
    }
    start = newline + 1;
  }
  partial_.append(bytes.substr(start));
  while (partial_.size() >= kMaxLineBytes) {
    AppendLine(std::string_view(partial_).substr(0, kMaxLineBytes), &out);
    partial_.erase(0, kMaxLineBytes);
  }
  console_->Write(stream_, out);
  return status;
}

void OutputSink::Close() {
  if (closed_) return;
  closed_ = true;
  if (console_ != nullptr && !partial_.empty()) {
    std::string out;
    AppendLine(partial_, &out);
    partial_.clear();
    console_->Write(stream_, out);
  }
}

}  // namespace meshrun::agent
