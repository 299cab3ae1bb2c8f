#include "rendezvous/core/tcpstore_owner.h"

#include "absl/strings/str_cat.h"

namespace meshrun::rdzv {

bool TcpStoreOwner::Claim(const std::string& run,
                          const std::map<std::string, std::string>& live) {
  if (!pinned_.empty()) return run == pinned_;
  if (owner_.empty() || live.count(owner_) == 0) owner_ = run;
  return owner_ == run;
}

absl::StatusOr<std::string> TcpStoreOwner::Namespace(
    const std::map<std::string, std::string>& live) {
  if (pinned_.empty() && (owner_.empty() || live.count(owner_) == 0)) {
    owner_.clear();
    if (live.size() == 1) owner_ = live.begin()->first;
  }
  const std::string& run = owner();
  if (run.empty()) {
    if (live.empty()) return std::string(kDefaultTcpStoreNamespace);
    return absl::FailedPreconditionError(absl::StrCat(
        live.size(),
        " runs are in progress on this daemon, none of them assigned as the one its "
        "TCPStore endpoint serves (their agents were told to use a store on rank 0)"));
  }
  auto it = live.find(run);
  if (it == live.end())
    return absl::FailedPreconditionError(
        absl::StrCat("run ", run, " has no round in progress"));
  return it->second;
}

}  // namespace meshrun::rdzv
