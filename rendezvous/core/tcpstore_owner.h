#pragma once

// Which run's store namespace the daemon's TCPStore endpoint serves. A stock
// TCPStore client cannot name its run, so one port serves one run's workers
// at a time:
//   - pinned (--tcpstore-run, which the launcher sets for a daemon it
//     embeds): that run only;
//   - otherwise the first run assigned a round while no owning run is in
//     progress owns it until the run closes; runs assigned rounds meanwhile
//     are told the daemon does not serve them (RoundAssignment.
//     serves_tcpstore), so their agents fall back to a store on rank 0
//     instead of their workers being refused.
// Pure: the caller passes the runs in progress (run id -> store prefix) and
// serialises calls.

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace meshrun::rdzv {

// The namespace TCPStore clients use while the daemon has no run.
inline constexpr char kDefaultTcpStoreNamespace[] = "_tcpstore";

class TcpStoreOwner {
 public:
  explicit TcpStoreOwner(std::string pinned_run = "") : pinned_(std::move(pinned_run)) {}

  // Whether `run`, being assigned a round, is (or now becomes) the run the
  // endpoint serves. `live` holds the runs in progress.
  bool Claim(const std::string& run, const std::map<std::string, std::string>& live);

  // The namespace for a client connecting now: the owner's store prefix, the
  // default one while no run is in progress, FAILED_PRECONDITION (saying
  // why) otherwise. A single run in progress is claimed on the way (a
  // daemon restarted with --state-dir learns its owner again this way).
  absl::StatusOr<std::string> Namespace(const std::map<std::string, std::string>& live);

  const std::string& owner() const { return pinned_.empty() ? owner_ : pinned_; }

 private:
  std::string pinned_;
  std::string owner_;  // unpinned: the owning run, or empty
};

}  // namespace meshrun::rdzv
