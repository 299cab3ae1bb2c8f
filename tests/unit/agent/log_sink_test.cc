#include "agent/log_sink.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace meshrun::agent {
namespace {

// Everything written to `fd` so far (a memfd or file).
std::string Contents(int fd) {
  std::string result;
  char chunk[4096];
  off_t offset = 0;
  while (true) {
    ssize_t n = ::pread(fd, chunk, sizeof chunk, offset);
    if (n <= 0) break;
    result.append(chunk, static_cast<size_t>(n));
    offset += n;
  }
  return result;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class LogSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    out_fd_ = ::memfd_create("console-out", MFD_CLOEXEC);
    err_fd_ = ::memfd_create("console-err", MFD_CLOEXEC);
    ASSERT_GE(out_fd_, 0);
    ASSERT_GE(err_fd_, 0);
    console_ = std::make_unique<ConsoleWriter>(out_fd_, err_fd_);
    std::string pattern =
        (std::filesystem::temp_directory_path() / "log_sink_test-XXXXXX");
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    ::close(out_fd_);
    ::close(err_fd_);
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  int out_fd_ = -1;
  int err_fd_ = -1;
  std::unique_ptr<ConsoleWriter> console_;
  std::string dir_;
};

TEST_F(LogSinkTest, PrefixesCompleteLinesAndFlushesPartialOnClose) {
  auto sink =
      OutputSink::Create(console_.get(), OutputStream::kStdout, "[w0]:", std::nullopt);
  ASSERT_TRUE(sink.ok()) << sink.status();
  ASSERT_TRUE((*sink)->Write("one\ntw").ok());
  EXPECT_EQ(Contents(out_fd_), "[w0]:one\n");
  ASSERT_TRUE((*sink)->Write("o\n\nthr").ok());
  EXPECT_EQ(Contents(out_fd_), "[w0]:one\n[w0]:two\n[w0]:\n");
  (*sink)->Close();
  EXPECT_EQ(Contents(out_fd_), "[w0]:one\n[w0]:two\n[w0]:\n[w0]:thr\n");
  EXPECT_EQ(Contents(err_fd_), "");
  // Nothing after the end of the stream.
  ASSERT_TRUE((*sink)->Write("late\n").ok());
  (*sink)->Close();
  EXPECT_EQ(Contents(out_fd_), "[w0]:one\n[w0]:two\n[w0]:\n[w0]:thr\n");
}

TEST_F(LogSinkTest, StderrGoesToStderr) {
  auto sink =
      OutputSink::Create(console_.get(), OutputStream::kStderr, "[w1]:", std::nullopt);
  ASSERT_TRUE(sink.ok()) << sink.status();
  ASSERT_TRUE((*sink)->Write("oops\n").ok());
  EXPECT_EQ(Contents(err_fd_), "[w1]:oops\n");
  EXPECT_EQ(Contents(out_fd_), "");
}

TEST_F(LogSinkTest, OverlongLineIsSplitIntoPrefixedPieces) {
  auto sink =
      OutputSink::Create(console_.get(), OutputStream::kStdout, "P:", std::nullopt);
  ASSERT_TRUE(sink.ok()) << sink.status();
  const std::string chunk(OutputSink::kMaxLineBytes / 2, 'x');
  ASSERT_TRUE((*sink)->Write(chunk).ok());
  EXPECT_EQ(Contents(out_fd_), "");
  ASSERT_TRUE((*sink)->Write(chunk + "yz").ok());
  EXPECT_EQ(Contents(out_fd_), "P:" + chunk + chunk + "\n");
  ASSERT_TRUE((*sink)->Write("\n").ok());
  EXPECT_EQ(Contents(out_fd_), "P:" + chunk + chunk + "\nP:yz\n");
}

TEST_F(LogSinkTest, FileGetsRawBytesAppendedAndParentsAreCreated) {
  const std::string path = dir_ + "/a/b/stdout.log";
  {
    std::filesystem::create_directories(dir_ + "/a/b");
    std::ofstream(path) << "earlier\n";
  }
  auto sink = OutputSink::Create(nullptr, OutputStream::kStdout, "[w0]:", path);
  ASSERT_TRUE(sink.ok()) << sink.status();
  ASSERT_TRUE((*sink)->Write("raw\npartial").ok());
  (*sink)->Close();
  EXPECT_EQ(ReadFile(path), "earlier\nraw\npartial");
  EXPECT_EQ(Contents(out_fd_), "");

  const std::string fresh = dir_ + "/x/y/z/stderr.log";
  auto tee = OutputSink::Create(console_.get(), OutputStream::kStderr, "[w2]:", fresh);
  ASSERT_TRUE(tee.ok()) << tee.status();
  ASSERT_TRUE((*tee)->Write("both\n").ok());
  EXPECT_EQ(ReadFile(fresh), "both\n");
  EXPECT_EQ(Contents(err_fd_), "[w2]:both\n");
}

// torchrun's --duplicate-std*-filters: the matching console lines of every
// sink sharing the copy, prefixed, in one file; partial lines when complete.
TEST_F(LogSinkTest, MatchingLinesAreCopiedWithTheirPrefix) {
  const std::string path = dir_ + "/attempt_0/filtered_stdout.log";
  auto copy = LineCopy::Create(path, {"apple", "a,b"});
  ASSERT_TRUE(copy.ok()) << copy.status();
  auto w0 =
      OutputSink::Create(console_.get(), OutputStream::kStdout, "[w0]:", std::nullopt);
  auto w1 =
      OutputSink::Create(console_.get(), OutputStream::kStdout, "[w1]:", std::nullopt);
  ASSERT_TRUE(w0.ok() && w1.ok());
  (*w0)->CopyMatchingLines(*copy);
  (*w1)->CopyMatchingLines(*copy);
  ASSERT_TRUE((*w0)->Write("an apple\nbanana\npine").ok());
  ASSERT_TRUE((*w1)->Write("a,b\n").ok());
  ASSERT_TRUE((*w0)->Write("apple\n").ok());
  EXPECT_EQ(ReadFile(path), "[w0]:an apple\n[w1]:a,b\n[w0]:pineapple\n");
  EXPECT_EQ(Contents(out_fd_), "[w0]:an apple\n[w0]:banana\n[w1]:a,b\n[w0]:pineapple\n");

  // An empty filter matches every line; the file starts afresh.
  auto all = LineCopy::Create(path, {""});
  ASSERT_TRUE(all.ok());
  (*w0)->CopyMatchingLines(*all);
  ASSERT_TRUE((*w0)->Write("x\n").ok());
  (*w0)->Close();
  EXPECT_EQ(ReadFile(path), "[w0]:x\n");
}

TEST_F(LogSinkTest, UncreatableFileIsAnError) {
  const std::string blocker = dir_ + "/file";
  std::ofstream(blocker) << "x";
  auto sink =
      OutputSink::Create(console_.get(), OutputStream::kStdout, "", blocker + "/log");
  EXPECT_FALSE(sink.ok());
}

}  // namespace
}  // namespace meshrun::agent
