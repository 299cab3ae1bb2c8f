#pragma once

// Where the daemon's state log keeps what it has made durable: a directory
// (--state-dir: snapshot + write-ahead log files, fsync'd) or etcd
// (--etcd-endpoints: the same snapshot and log records as keys under a
// prefix, each write fenced by this daemon's leadership). StateLog does the
// batching, ordering and acknowledgement; a medium only stores bytes.
//
// Called from one thread at a time (StateLog's Open, then its flusher).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace meshrun::rdzv {

class StateMedium {
 public:
  virtual ~StateMedium() = default;
  // For messages: "state dir /var/lib/x", "etcd prefix /meshrun/ at h:2379".
  virtual std::string name() const = 0;
  // The latest snapshot (state_codec's format, which names its generation),
  // or nullopt when there is none yet.
  virtual absl::StatusOr<std::optional<std::string>> ReadSnapshot() = 0;
  // The framed records appended after snapshot generation `gen`, in order
  // (a record cut short by a crash may end them).
  virtual absl::StatusOr<std::string> ReadLog(uint64_t gen) = 0;
  // Makes `frames` durable after everything appended before; OK only once
  // they are. An error is final: nothing more can be made durable.
  virtual absl::Status Append(std::string_view frames) = 0;
  // Makes `snapshot` the state, with an empty log of generation `gen` after
  // it, and drops older generations. An error is final, as for Append.
  virtual absl::Status InstallSnapshot(const std::string& snapshot, uint64_t gen) = 0;
};

}  // namespace meshrun::rdzv
