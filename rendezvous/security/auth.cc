#include "rendezvous/security/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace meshrun::rdzv {

namespace {

// Reads at most `limit` + 1 bytes of an open file, so an oversized file is
// detected without reading it all.
absl::StatusOr<std::string> ReadFd(int fd, size_t limit, const std::string& path) {
  std::string data;
  char buffer[4096];
  while (data.size() <= limit) {
    ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::FailedPreconditionError(
          absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (n == 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  return data;
}

}  // namespace

absl::StatusOr<std::string> ParseToken(std::string text, absl::string_view source) {
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  if (text.size() < kMinTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat("token from ", source, " has ",
                                                   text.size(), " bytes; at least ",
                                                   kMinTokenBytes, " are required"));
  }
  if (text.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token from ", source, " is longer than ", kMaxTokenBytes, " bytes"));
  }
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrFormat("token from %s has byte 0x%02x at offset %d; only printable "
                          "ASCII without spaces is allowed",
                          source, c, i));
    }
  }
  return text;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open token file ", path, ": ", std::strerror(errno)));
  }
  // fstat on the opened file, so the file checked is the file read.
  struct stat info;
  if (fstat(fd, &info) != 0) {
    int error = errno;
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot stat token file ", path, ": ", std::strerror(error)));
  }
  if (!S_ISREG(info.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("token file ", path, " is not a regular file"));
  }
  if ((info.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrFormat("permissions %04o for token file %s are too open: it must not be "
                        "accessible by group or others (chmod 600 %s)",
                        info.st_mode & 07777, path, path));
  }
  auto data = ReadFd(fd, kMaxTokenBytes + 2, path);
  close(fd);
  if (!data.ok()) return data.status();
  return ParseToken(std::move(*data), absl::StrCat("file ", path));
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view what,
                                        absl::string_view must_contain) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", what, " file ", path, ": ", std::strerror(errno)));
  }
  constexpr size_t kMaxPemBytes = 1 << 20;
  auto data = ReadFd(fd, kMaxPemBytes, path);
  close(fd);
  if (!data.ok()) return data.status();
  if (data->size() > kMaxPemBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " file ", path, " is larger than ", kMaxPemBytes, " bytes"));
  }
  if (absl::string_view(*data).find(must_contain) == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " file ", path, " is not PEM (no \"", must_contain, "\" in it)"));
  }
  return data;
}

absl::StatusOr<std::string> TokenFromEnvironment(const GetEnv& getenv_fn) {
  if (const char* token = getenv_fn(kTokenEnv); token != nullptr && *token != '\0')
    return ParseToken(token, kTokenEnv);
  if (const char* path = getenv_fn(kTokenFileEnv); path != nullptr && *path != '\0')
    return ReadTokenFile(path);
  return std::string();
}

bool TokensEqual(absl::string_view a, absl::string_view b) {
  // Walk the longer length whatever the contents; a length difference makes
  // the result false without an early exit.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::optional<uint64_t> LogRateLimiter::Allow(Clock::time_point now) {
  if (!window_start_ || now - *window_start_ >= window_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++suppressed_;
    return std::nullopt;
  }
  ++in_window_;
  uint64_t dropped = suppressed_;
  suppressed_ = 0;
  return dropped;
}

}  // namespace meshrun::rdzv
