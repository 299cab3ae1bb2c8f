#pragma once

// The daemon's file descriptors: every TCPStore client, gRPC connection,
// parked wait's socket and log file takes one, and the usual soft limit
// (1,024) is below what a thousand workers on one daemon need.

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace meshrun::rdzv {

struct DescriptorLimit {
  uint64_t soft_before = 0;  // the soft limit the process started with
  uint64_t soft = 0;         // the soft limit now
  uint64_t hard = 0;         // an unlimited one as the kernel's maximum
};

// Raises this process's soft RLIMIT_NOFILE to its hard limit (to
// /proc/sys/fs/nr_open when the hard one is unlimited; the kernel refuses
// more). Children started later inherit it. The limits unchanged and the
// error when setrlimit fails.
absl::StatusOr<DescriptorLimit> RaiseDescriptorLimit();

// The connections the daemon's port may hold open (TCPStore clients and
// sockets not yet classified) under a soft limit of `soft` descriptors: the
// rest, a quarter and at least 256 (half of a smaller limit), is kept for
// what is not counted there: gRPC's connections once handed over, gRPC's and
// Asio's own descriptors, the state log and the HTTP port.
size_t ConnectionCapFor(uint64_t soft);

}  // namespace meshrun::rdzv
