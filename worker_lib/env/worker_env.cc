#include "worker_lib/env/worker_env.h"

#include <arpa/inet.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace meshrun::worker {

namespace {

constexpr char kHint[] = "start this program with meshrun (or torchrun)";

class Parser {
 public:
  explicit Parser(const std::map<std::string, std::string>& env) : env_(env) {}

  const std::string* Find(const std::string& name) const {
    auto it = env_.find(name);
    return it == env_.end() ? nullptr : &it->second;
  }

  // A required variable: absent ones are collected for one message.
  const std::string* Require(const std::string& name) {
    const std::string* value = Find(name);
    if (value == nullptr) missing_.push_back(name);
    return value;
  }

  absl::Status MissingStatus() const {
    if (missing_.empty()) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(absl::StrJoin(missing_, ", "), missing_.size() == 1 ? " is" : " are",
                     " not set: ", kHint));
  }

 private:
  const std::map<std::string, std::string>& env_;
  std::vector<std::string> missing_;
};

absl::StatusOr<int> ParseInt(const std::string& name, const std::string& text) {
  std::string trimmed(absl::StripAsciiWhitespace(text));
  errno = 0;
  char* end = nullptr;
  long value = trimmed.empty() ? 0 : std::strtol(trimmed.c_str(), &end, 10);
  if (trimmed.empty() || *end != '\0' || errno == ERANGE || value < INT_MIN ||
      value > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", text, "' is not an integer"));
  }
  return static_cast<int>(value);
}

absl::Status CheckAtLeast(const std::string& name, int value, int minimum) {
  if (value >= minimum) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, "=", value, " is invalid: it must be at least ", minimum));
}

// 0 <= rank < size, named after the two variables.
absl::Status CheckRank(const std::string& rank_name, int rank,
                       const std::string& size_name, int size) {
  if (rank >= 0 && rank < size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(rank_name, "=", rank, " is out of range: ", size_name, " is ", size,
                   " (0 <= ", rank_name, " < ", size_name, ")"));
}

absl::StatusOr<std::optional<int>> OptionalInt(const Parser& parser,
                                               const std::string& name) {
  const std::string* text = parser.Find(name);
  if (text == nullptr) return std::optional<int>();
  auto value = ParseInt(name, *text);
  if (!value.ok()) return value.status();
  return std::optional<int>(*value);
}

absl::StatusOr<bool> ParseBool(const std::string& name, const std::string& text) {
  std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "true" || lower == "1" || lower == "yes") return true;
  if (lower == "false" || lower == "0" || lower == "no" || lower.empty()) return false;
  return absl::InvalidArgumentError(
      absl::StrCat(name, "='", text, "' is not a boolean (True or False)"));
}

// "host:port" or "[v6]:port" with a port in 1..65535.
bool ValidOneEndpoint(const std::string& endpoint) {
  auto colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  std::string port = endpoint.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos)
    return false;
  int value = std::atoi(port.c_str());
  return value >= 1 && value <= 65535;
}

// One endpoint, or a comma-separated list of daemon replicas (meshrun
// --rdzv-endpoint=A,B,...), each valid.
bool ValidEndpoint(const std::string& endpoint) {
  for (absl::string_view entry : absl::StrSplit(endpoint, ',')) {
    if (!ValidOneEndpoint(std::string(absl::StripAsciiWhitespace(entry)))) return false;
  }
  return true;
}

#define MESHRUN_ASSIGN_OR_RETURN(lhs, expr)     \
  do {                                          \
    auto _result = (expr);                      \
    if (!_result.ok()) return _result.status(); \
    lhs = *std::move(_result);                  \
  } while (false)

#define MESHRUN_RETURN_IF_ERROR(expr)  \
  do {                                 \
    absl::Status _status = (expr);     \
    if (!_status.ok()) return _status; \
  } while (false)

}  // namespace

absl::StatusOr<WorkerEnv> ParseWorkerEnv(const std::map<std::string, std::string>& env) {
  Parser parser(env);
  const std::string* rank = parser.Require("RANK");
  const std::string* world_size = parser.Require("WORLD_SIZE");
  const std::string* local_rank = parser.Require("LOCAL_RANK");
  const std::string* master_addr = parser.Require("MASTER_ADDR");
  const std::string* master_port = parser.Require("MASTER_PORT");
  MESHRUN_RETURN_IF_ERROR(parser.MissingStatus());

  WorkerEnv out;
  MESHRUN_ASSIGN_OR_RETURN(out.world_size, ParseInt("WORLD_SIZE", *world_size));
  MESHRUN_RETURN_IF_ERROR(CheckAtLeast("WORLD_SIZE", out.world_size, 1));
  MESHRUN_ASSIGN_OR_RETURN(out.rank, ParseInt("RANK", *rank));
  MESHRUN_RETURN_IF_ERROR(CheckRank("RANK", out.rank, "WORLD_SIZE", out.world_size));

  MESHRUN_ASSIGN_OR_RETURN(out.local_world_size, OptionalInt(parser, "LOCAL_WORLD_SIZE"));
  MESHRUN_ASSIGN_OR_RETURN(out.local_rank, ParseInt("LOCAL_RANK", *local_rank));
  if (out.local_world_size) {
    MESHRUN_RETURN_IF_ERROR(CheckAtLeast("LOCAL_WORLD_SIZE", *out.local_world_size, 1));
    if (*out.local_world_size > out.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("LOCAL_WORLD_SIZE=", *out.local_world_size,
                       " is larger than WORLD_SIZE=", out.world_size));
    }
    MESHRUN_RETURN_IF_ERROR(CheckRank("LOCAL_RANK", out.local_rank, "LOCAL_WORLD_SIZE",
                                      *out.local_world_size));
  } else {
    MESHRUN_RETURN_IF_ERROR(
        CheckRank("LOCAL_RANK", out.local_rank, "WORLD_SIZE", out.world_size));
  }

  MESHRUN_ASSIGN_OR_RETURN(out.group_world_size, OptionalInt(parser, "GROUP_WORLD_SIZE"));
  MESHRUN_ASSIGN_OR_RETURN(out.group_rank, OptionalInt(parser, "GROUP_RANK"));
  if (out.group_world_size) {
    MESHRUN_RETURN_IF_ERROR(CheckAtLeast("GROUP_WORLD_SIZE", *out.group_world_size, 1));
    if (out.group_rank) {
      MESHRUN_RETURN_IF_ERROR(CheckRank("GROUP_RANK", *out.group_rank, "GROUP_WORLD_SIZE",
                                        *out.group_world_size));
    }
  } else if (out.group_rank) {
    MESHRUN_RETURN_IF_ERROR(CheckAtLeast("GROUP_RANK", *out.group_rank, 0));
  }

  MESHRUN_ASSIGN_OR_RETURN(out.role_world_size, OptionalInt(parser, "ROLE_WORLD_SIZE"));
  MESHRUN_ASSIGN_OR_RETURN(out.role_rank, OptionalInt(parser, "ROLE_RANK"));
  if (out.role_world_size) {
    MESHRUN_RETURN_IF_ERROR(CheckAtLeast("ROLE_WORLD_SIZE", *out.role_world_size, 1));
    if (out.role_rank) {
      MESHRUN_RETURN_IF_ERROR(CheckRank("ROLE_RANK", *out.role_rank, "ROLE_WORLD_SIZE",
                                        *out.role_world_size));
    }
  } else if (out.role_rank) {
    MESHRUN_RETURN_IF_ERROR(CheckAtLeast("ROLE_RANK", *out.role_rank, 0));
  }
  if (const std::string* role_name = parser.Find("ROLE_NAME")) out.role_name = *role_name;

  out.master_addr = std::string(absl::StripAsciiWhitespace(*master_addr));
  if (out.master_addr.empty())
    return absl::InvalidArgumentError(absl::StrCat("MASTER_ADDR is empty: ", kHint));
  MESHRUN_ASSIGN_OR_RETURN(out.master_port, ParseInt("MASTER_PORT", *master_port));
  if (out.master_port < 1 || out.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT=", out.master_port, " is not a port (1..65535)"));
  }

  std::optional<int> restart_count, max_restarts;
  MESHRUN_ASSIGN_OR_RETURN(restart_count,
                           OptionalInt(parser, "TORCHELASTIC_RESTART_COUNT"));
  MESHRUN_ASSIGN_OR_RETURN(max_restarts,
                           OptionalInt(parser, "TORCHELASTIC_MAX_RESTARTS"));
  out.restart_count = restart_count.value_or(0);
  out.max_restarts = max_restarts.value_or(0);
  MESHRUN_RETURN_IF_ERROR(
      CheckAtLeast("TORCHELASTIC_RESTART_COUNT", out.restart_count, 0));
  MESHRUN_RETURN_IF_ERROR(CheckAtLeast("TORCHELASTIC_MAX_RESTARTS", out.max_restarts, 0));
  if (const std::string* run_id = parser.Find("TORCHELASTIC_RUN_ID"))
    out.run_id = *run_id;
  if (const std::string* use = parser.Find("TORCHELASTIC_USE_AGENT_STORE"))
    MESHRUN_ASSIGN_OR_RETURN(out.use_agent_store,
                             ParseBool("TORCHELASTIC_USE_AGENT_STORE", *use));
  if (const std::string* file = parser.Find("TORCHELASTIC_ERROR_FILE")) {
    if (!file->empty()) out.error_file = *file;
  }

  const std::string* endpoint = parser.Find("MESHRUN_STORE_ENDPOINT");
  const std::string* prefix = parser.Find("MESHRUN_STORE_PREFIX");
  if ((endpoint == nullptr) != (prefix == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        endpoint == nullptr ? "MESHRUN_STORE_PREFIX" : "MESHRUN_STORE_ENDPOINT",
        " is set but ",
        endpoint == nullptr ? "MESHRUN_STORE_ENDPOINT" : "MESHRUN_STORE_PREFIX",
        " is not: meshrun sets both"));
  }
  if (endpoint != nullptr) {
    if (!ValidEndpoint(*endpoint)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MESHRUN_STORE_ENDPOINT='", *endpoint, "' is not host:port or a list of them"));
    }
    if (prefix->empty())
      return absl::InvalidArgumentError("MESHRUN_STORE_PREFIX is empty");
    out.store_endpoint = *endpoint;
    out.store_prefix = *prefix;
  }
  return out;
}

absl::StatusOr<WorkerEnv> WorkerEnvFromProcessEnvironment() {
  std::map<std::string, std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string text(*entry);
    auto eq = text.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  return ParseWorkerEnv(env);
}

bool IsLoopbackAddress(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  return false;
}

}  // namespace meshrun::worker
