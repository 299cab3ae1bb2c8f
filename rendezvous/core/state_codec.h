#pragma once

// Byte formats of the daemon's persisted state (--state-dir), as pure code:
// no files, no clock. The I/O lives in state_log.
//
// A log is a sequence of framed records: [u32 payload length][u32 CRC-32 of
// the payload][payload], little-endian. A record cut short by a crash (its
// frame runs past the end, or its CRC fails and nothing follows it) is a torn
// tail and is dropped; a bad record with data after it is corruption.
//
// Record payloads start with a RecordType byte:
//   kSet ns key value, kAppend ns key value, kDelete ns key, kDropNamespace
//     ns  (the store, as effects: Add and CompareSet are logged as the Set of
//     their result), kQueuePush ns key value, kQueuePop ns key
//   kRemembered ns id answer effects  (a request with a dedup id: its answer
//     (StoredAnswer) and the store records of what it did, applied together,
//     so a crash can never keep the one without the other)
//   kForgotten ns ids  (remembered answers their sender said it has)
//   kRun run_id state         (a whole run of RendezvousState::EncodeRun)
//   kRunGone run_id           (the run was forgotten)
// A snapshot file is kSnapshotMagic, then framed records: a header (the log
// generation that continues it), the entries, remembered answers (without
// effects) and runs, and a trailer with
// their count. Anything missing or failing its CRC makes the whole snapshot
// unusable: it is refused, never half-loaded.
//
// Thread-safety: none needed (free functions and value types).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rendezvous/core/kv_store.h"
#include "rendezvous/core/rendezvous_state.h"

namespace meshrun::rdzv::codec {

inline constexpr std::string_view kSnapshotMagic = "MESHRUN-STATE-SNAPSHOT-1\n";

enum class RecordType : uint8_t {
  kSet = 1,
  kAppend = 2,
  kDelete = 3,
  kRun = 4,
  kRunGone = 5,
  kSnapshotHeader = 6,
  kSnapshotTrailer = 7,
  kDropNamespace = 8,
  kQueuePush = 9,
  kQueuePop = 10,
  kRemembered = 11,
  kForgotten = 12,
};

uint32_t Crc32(std::string_view data);

// Little-endian integers and length-prefixed strings.
class ByteWriter {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v);
  void U64(uint64_t v);
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void Str(std::string_view s);
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads what ByteWriter wrote; any read past the end sets !ok() and returns
// zeros, so a decoder checks once at the end.
class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}
  uint8_t U8();
  uint32_t U32();
  uint64_t U64();
  int64_t I64() { return static_cast<int64_t>(U64()); }
  std::string Str();
  bool ok() const { return ok_; }
  bool done() const { return in_.empty(); }

 private:
  bool Need(size_t n);
  std::string_view in_;
  bool ok_ = true;
};

// Appends one framed record to `out`.
void AppendFrame(std::string* out, std::string_view payload);

struct FrameScan {
  std::vector<std::string_view> records;  // views into the scanned data
  size_t valid_bytes = 0;                 // where the good prefix ends
  bool torn_tail = false;                 // a cut-short last record was dropped
};
// Splits `data` into records. DATA_LOSS when a bad record is followed by more
// data (corruption, not a crash mid-write).
absl::StatusOr<FrameScan> ScanFrames(std::string_view data);

// Store record payloads.
std::string SetRecord(std::string_view ns, std::string_view key, std::string_view value);
std::string AppendRecord(std::string_view ns, std::string_view key,
                         std::string_view value);
std::string DeleteRecord(std::string_view ns, std::string_view key);
std::string QueuePushRecord(std::string_view ns, std::string_view key,
                            std::string_view value);
std::string QueuePopRecord(std::string_view ns, std::string_view key);
// The answer to a request with a dedup id, with the store records of its
// effects (none when it changed nothing).
std::string RememberedRecord(std::string_view ns, std::string_view id,
                             const StoredAnswer& answer,
                             const std::vector<std::string>& effects);
// Remembered answers forgotten (StoreRequest.forget_dedup_ids).
template <typename Ids>
std::string ForgottenRecord(std::string_view ns, const Ids& ids) {
  ByteWriter w;
  w.U8(static_cast<uint8_t>(RecordType::kForgotten));
  w.Str(ns);
  w.U64(static_cast<uint64_t>(ids.size()));
  for (const auto& id : ids) w.Str(id);
  return w.Take();
}
// A whole namespace dropped (its run was forgotten).
std::string DropNamespaceRecord(std::string_view ns);
// Rendezvous record payloads: the run's current state, or its removal when
// `state` no longer has it.
std::string RunRecord(const RendezvousState& state, const std::string& run_id,
                      RdzvTime now);

// Applies one log record. `now` is the restore time (fresh leases, timers
// resumed with what they had left).
absl::Status ApplyRecord(std::string_view payload, KvStore* store,
                         RendezvousState* rendezvous, RdzvTime now);

// A whole snapshot file; `next_generation` names the log that continues it.
std::string EncodeSnapshot(const KvStore& store, const RendezvousState& rendezvous,
                           uint64_t next_generation, RdzvTime now);
// Loads a snapshot into empty `store` and `rendezvous`; returns the log
// generation to replay next. DATA_LOSS, naming the problem, on any damage.
absl::StatusOr<uint64_t> DecodeSnapshot(std::string_view data, KvStore* store,
                                        RendezvousState* rendezvous, RdzvTime now);

}  // namespace meshrun::rdzv::codec
