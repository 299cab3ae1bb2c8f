#pragma once

// The shared-token rules of meshrun's rendezvous daemon, apart from gRPC: where
// a token comes from (a file or the environment, never a command line that
// `ps` shows), what a valid token looks like, comparing it without leaking
// where it differs, and a limiter so a flood of refused calls cannot fill the
// daemon's log. The gRPC side is in rendezvous/security.h.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace meshrun::rdzv {

// Environment variables clients and daemons read (README "Security").
inline constexpr char kTokenEnv[] = "MESHRUN_RDZV_TOKEN";
inline constexpr char kTokenFileEnv[] = "MESHRUN_RDZV_TOKEN_FILE";
inline constexpr char kTlsCaEnv[] = "MESHRUN_RDZV_TLS_CA";
inline constexpr char kTlsCertEnv[] = "MESHRUN_RDZV_TLS_CERT";
inline constexpr char kTlsKeyEnv[] = "MESHRUN_RDZV_TLS_KEY";

// The gRPC metadata key carrying "Bearer <token>" on every call.
inline constexpr char kAuthMetadataKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";

inline constexpr size_t kMaxTokenBytes = 4096;
inline constexpr size_t kMinTokenBytes = 16;

// Validates a token's text: one trailing "\n" (or "\r\n") is dropped, as in a
// file written by `echo`; the rest must be kMinTokenBytes..kMaxTokenBytes of
// printable ASCII without spaces (it travels as an HTTP/2 header value).
// `source` names where it came from, for the error message.
absl::StatusOr<std::string> ParseToken(std::string text, absl::string_view source);

// Reads and validates a token file. Refuses, as ssh does for keys, a file that
// its group or others may read or write, and anything but a regular file.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Reads a whole (PEM) file, for TLS certificates and keys. `what` names the
// file's role in errors ("--tls-cert").
absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view what,
                                        absl::string_view must_contain);

using GetEnv = std::function<const char*(const char*)>;

// The token from the environment: MESHRUN_RDZV_TOKEN, else the file named by
// MESHRUN_RDZV_TOKEN_FILE; an empty string when neither is set (no token).
absl::StatusOr<std::string> TokenFromEnvironment(const GetEnv& getenv_fn);

// Equality whose running time depends on the lengths only, not on where the
// first differing byte is.
bool TokensEqual(absl::string_view a, absl::string_view b);

// Lets at most `burst` events through per `window`; the first event let
// through after a suppressed stretch learns how many were dropped.
// Thread-safety: none; the owner serialises calls.
class LogRateLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  LogRateLimiter(uint32_t burst, std::chrono::milliseconds window)
      : burst_(burst), window_(window) {}
  // nullopt: suppress this event. Otherwise log it, mentioning the returned
  // number of events suppressed since the last one logged (when above 0).
  std::optional<uint64_t> Allow(Clock::time_point now);

 private:
  const uint32_t burst_;
  const std::chrono::milliseconds window_;
  std::optional<Clock::time_point> window_start_;
  uint32_t in_window_ = 0;
  uint64_t suppressed_ = 0;
};

}  // namespace meshrun::rdzv
