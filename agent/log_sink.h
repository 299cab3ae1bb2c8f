#pragma once

// Where a worker's output goes: the agent's console, prefixed line by line,
// and/or a log file with the raw bytes.
//
// Every worker's console lines pass through one ConsoleWriter, which writes
// whole lines under a mutex, so lines of different workers never interleave
// mid-line (torchrun gets the same from its `tail` threads).

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace meshrun::agent {

enum class OutputStream { kStdout, kStderr };

// Writes whole lines to the agent's stdout or stderr.
//
// Thread-safe. Does not own its fds.
class ConsoleWriter {
 public:
  // The process-wide writer on fds 1 and 2.
  static ConsoleWriter& Default();

  // Tests pass their own fds (a file or memfd) to capture the console.
  ConsoleWriter(int stdout_fd, int stderr_fd);
  ConsoleWriter(const ConsoleWriter&) = delete;
  ConsoleWriter& operator=(const ConsoleWriter&) = delete;

  // REQUIRES: `lines` is empty or ends with '\n'.
  // Writes `lines` with write(2), retrying partial writes while holding the
  // lock, so another Write never lands inside them. A broken console (EIO,
  // or EPIPE when the agent ignores SIGPIPE; otherwise SIGPIPE ends the agent
  // as it would `cat`) drops the lines: workers must not stall on it.
  void Write(OutputStream stream, std::string_view lines);

 private:
  std::mutex mu_;
  const int fds_[2];
};

// torchrun's --duplicate-std{out,err}-filters: console lines that contain
// any of the needles are copied, prefix and all, into one file shared by the
// workers of an attempt (attempt_<n>/filtered_std{out,err}.log). An empty
// needle matches every line, as in torchrun.
//
// Thread-compatible; shared by the sinks of one worker group, which all run
// on its io_context thread.
class LineCopy {
 public:
  // `file` is created (truncated, as torchrun opens it "w") with its parent
  // directories.
  static absl::StatusOr<std::shared_ptr<LineCopy>> Create(
      const std::string& file, std::vector<std::string> needles);
  ~LineCopy();
  LineCopy(const LineCopy&) = delete;
  LineCopy& operator=(const LineCopy&) = delete;

  // Appends `prefix` + `line` + '\n' when `line` matches. A failed write
  // abandons the file (the console is what matters).
  void Offer(std::string_view prefix, std::string_view line);

 private:
  LineCopy(int fd, std::vector<std::string> needles)
      : fd_(fd), needles_(std::move(needles)) {}
  int fd_;
  const std::vector<std::string> needles_;
};

// One worker stream's destination.
//
// Thread-compatible; the worker group calls it from its io_context thread.
class OutputSink {
 public:
  // Lines longer than this reach the console split into several prefixed
  // lines, so a worker printing progress bars with '\r' and no '\n' neither
  // grows the buffer without bound nor stays invisible.
  static constexpr size_t kMaxLineBytes = 64 * 1024;

  // `console` (nullable: not on the console) must outlive the sink. `file`,
  // if given, is created with its parent directories and appended to.
  static absl::StatusOr<std::unique_ptr<OutputSink>> Create(
      ConsoleWriter* console, OutputStream stream, std::string prefix,
      const std::optional<std::string>& file);
  ~OutputSink();  // closes the file; does not flush a partial line (Close does)
  OutputSink(const OutputSink&) = delete;
  OutputSink& operator=(const OutputSink&) = delete;

  // Bytes as the worker wrote them: complete lines go to the console with
  // the prefix in one ConsoleWriter::Write, the bytes go to the file as they
  // are. Returns an error the first time a file write fails; the file is then
  // abandoned (the console keeps working) and later calls return OK.
  absl::Status Write(std::string_view bytes);

  // End of the stream: a partial last line reaches the console with a '\n'
  // added. Later Writes are ignored.
  void Close();

  // Console lines from now on are also offered to `copy` (torchrun copies
  // only tee'd lines that reach the console). No effect without a console.
  void CopyMatchingLines(std::shared_ptr<LineCopy> copy) { copy_ = std::move(copy); }

 private:
  OutputSink(ConsoleWriter* console, OutputStream stream, std::string prefix, int file_fd,
             std::string file_path);
  void AppendLine(std::string_view line, std::string* out) const;

  ConsoleWriter* const console_;
  const OutputStream stream_;
  const std::string prefix_;
  int file_fd_;  // -1: no file, or abandoned after an error
  const std::string file_path_;
  std::string partial_;             // console bytes after the last '\n'
  std::shared_ptr<LineCopy> copy_;  // may be null
  bool closed_ = false;
};

}  // namespace meshrun::agent
