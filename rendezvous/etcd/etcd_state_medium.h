#pragma once

// The state log's medium in etcd (state_medium.h): the snapshot and the log
// records the leading daemon makes durable, as keys under its prefix, each
// write fenced by its leadership (etcd_leadership.h):
//   snapshot               "gen=<g> chunks=<n>": which snapshot is the state
//   snap/<g>/<i>           the snapshot of generation g, in chunks
//   log/<g>/<seq>          records appended after it, one flush a key
// (g, i and seq in fixed-width hex, so that key order is their order.)
// Values stay under etcd's default request limit (1.5 MiB): a larger flush or
// snapshot takes several keys. A new snapshot is written beside the old one;
// one transaction then names it and drops the older generations.
//
// etcd unreachable: a write is tried again until it lands (nothing is
// acknowledged meanwhile, nothing is lost) or Abandon() is called. A write
// whose fence fails asks the leadership to confirm itself; when another
// daemon leads, the write fails for good (the daemon must stop serving).

#include <atomic>
#include <memory>
#include <string>

#include "rendezvous/etcd/etcd_leadership.h"
#include "rendezvous/persist/state_medium.h"

namespace meshrun::rdzv {

class EtcdStateMedium final : public StateMedium {
 public:
  explicit EtcdStateMedium(EtcdLeadership* leadership);
  std::string name() const override;
  absl::StatusOr<std::optional<std::string>> ReadSnapshot() override;
  absl::StatusOr<std::string> ReadLog(uint64_t gen) override;
  absl::Status Append(std::string_view frames) override;
  absl::Status InstallSnapshot(const std::string& snapshot, uint64_t gen) override;

  // Any thread: writes waiting for etcd give up (shutdown).
  void Abandon() { abandoned_ = true; }
  // Whether a write is waiting for etcd now, and since when (for status).
  bool stalled() const { return stalled_.load(); }

  // Values at most this long (etcd refuses requests over 1.5 MiB by default).
  static constexpr size_t kMaxValueBytes = 1 << 20;

 private:
  // Runs `txn` with the fence until it succeeds; see the file comment.
  absl::Status FencedWrite(etcdserverpb::TxnRequest txn);
  // Every value in [from, to), in key order.
  absl::StatusOr<std::vector<std::string>> ReadRange(const std::string& from,
                                                     const std::string& to);
  std::string LogKey(uint64_t gen, uint64_t seq) const;
  std::string SnapKey(uint64_t gen, uint64_t chunk) const;

  EtcdLeadership* leadership_;
  std::string prefix_;
  uint64_t gen_ = 0;
  uint64_t next_seq_ = 0;
  std::atomic<bool> abandoned_{false};
  std::atomic<bool> stalled_{false};
};

}  // namespace meshrun::rdzv
