#include "rendezvous/server/fd_limit.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace meshrun::rdzv {

namespace {

// The most descriptors the kernel lets a process have.
uint64_t KernelMaximum() {
  std::ifstream nr_open("/proc/sys/fs/nr_open");
  uint64_t value = 0;
  if (nr_open >> value && value > 0) return value;
  return uint64_t{1} << 20;  // the kernel's default
}

}  // namespace

absl::StatusOr<DescriptorLimit> RaiseDescriptorLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0)
    return absl::InternalError(absl::StrCat("getrlimit: ", std::strerror(errno)));
  DescriptorLimit result;
  result.soft_before = limit.rlim_cur;
  const uint64_t target =
      limit.rlim_max == RLIM_INFINITY ? KernelMaximum() : uint64_t{limit.rlim_max};
  result.hard = target;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < target) {
    limit.rlim_cur = target;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot raise the soft descriptor limit from ", result.soft_before,
                       " to ", target, ": ", std::strerror(errno)));
    }
  }
  result.soft = limit.rlim_cur == RLIM_INFINITY ? KernelMaximum() : limit.rlim_cur;
  return result;
}

size_t ConnectionCapFor(uint64_t soft) {
  const uint64_t reserve = std::max(soft / 4, std::min<uint64_t>(256, soft / 2));
  return static_cast<size_t>(std::max<uint64_t>(1, soft - reserve));
}

}  // namespace meshrun::rdzv
