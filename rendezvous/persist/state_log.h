#pragma once

// The daemon's durable state: a write-ahead log of state changes with group
// commit, plus a snapshot that compacts it, kept on a StateMedium
// (state_medium.h): a directory, or etcd. The directory's files (--state-dir):
//   LOCK          flock'ed for the daemon's lifetime (holds its pid), so a
//                 second daemon on the same directory is refused
//   snapshot      the whole state (state_codec's snapshot format), replaced
//                 atomically (written aside, fsync'd, renamed)
//   wal.<gen>     records since that snapshot; <gen> is named in it
// Records are appended to memory by the services; a flusher thread writes
// everything queued so far with one write + fdatasync (one etcd transaction),
// so concurrent writers share one fsync (group commit). When the log passes
// `snapshot_after_bytes` the flusher takes a snapshot and starts a new log generation.
//
// Thread-safe. Lock order: a service's mutex, then the log's own; the
// flusher takes service mutexes (through the hooks) without holding the log's.

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "rendezvous/core/kv_store.h"
#include "rendezvous/core/rendezvous_state.h"
#include "rendezvous/persist/state_medium.h"

namespace meshrun::rdzv {

struct StateLoadReport {
  bool had_snapshot = false;
  uint64_t log_records = 0;  // replayed from the log after the snapshot
  bool torn_tail = false;    // a record cut short by a crash was dropped
  size_t store_entries = 0;
  size_t runs = 0;
};

class StateLog {
 public:
  // Locks `dir` (creating it if needed), loads its snapshot and replays its
  // log into `store` and `rendezvous` (which must be empty), then writes a
  // fresh snapshot so the next start replays nothing twice. Errors name the
  // directory: FAILED_PRECONDITION when another daemon holds it, DATA_LOSS
  // for a damaged snapshot or log (nothing is half-loaded: the caller must
  // not serve), INTERNAL for I/O failures.
  static absl::StatusOr<std::unique_ptr<StateLog>> Open(
      const std::string& dir, size_t snapshot_after_bytes, KvStore* store,
      RendezvousState* rendezvous, RdzvTime now, StateLoadReport* report);
  // The same on another medium (etcd), whose errors keep their codes.
  static absl::StatusOr<std::unique_ptr<StateLog>> Open(
      std::unique_ptr<StateMedium> medium, size_t snapshot_after_bytes, KvStore* store,
      RendezvousState* rendezvous, RdzvTime now, StateLoadReport* report);
  ~StateLog();  // Stop()
  StateLog(const StateLog&) = delete;
  StateLog& operator=(const StateLog&) = delete;

  // Called on the flusher thread before each write: append whatever was
  // changed but not yet logged (the rendezvous runs).
  using Collect = std::function<void(StateLog&)>;
  // Called on the flusher thread to compact: take the services' locks, call
  // `rotate` (returns the new generation; records queued so far are then
  // covered by the snapshot), and encode the snapshot under those locks.
  using Snapshot = std::function<std::string(const std::function<uint64_t()>& rotate)>;
  void Start(Collect collect, Snapshot snapshot);
  // Writes what is queued, then stops the flusher. Idempotent.
  void Stop();

  // Queues a record; returns its sequence number. Memory only, so callers
  // may hold their own mutex.
  uint64_t Append(std::string_view payload);
  // Everything changed so far: records queued and changes poked. A reply
  // that waits on it never acknowledges more than the disk holds, including
  // rendezvous changes it may have observed.
  struct Mark {
    uint64_t seq = 0;
    uint64_t pokes = 0;
  };
  Mark Now();
  // Runs `done` on the flusher thread once everything in `mark` is on disk.
  // Callbacks run in the order they were registered when their marks allow,
  // so one caller's replies keep their order. `done` may take a service's
  // mutex (not the log's).
  void WhenDurable(Mark mark, std::function<void()> done);
  // Something is waiting for Collect.
  void Poke();

  struct Stats {
    uint64_t records = 0;
    uint64_t fsyncs = 0;
    uint64_t bytes = 0;
    uint64_t snapshots = 0;
  };
  Stats stats();

 private:
  StateLog() = default;
  void FlushLoop();
  // REQUIRES: mu_ held.
  bool DurableLocked(const Mark& mark) const {
    return durable_seq_ >= mark.seq && durable_pokes_ >= mark.pokes;
  }
  // Takes the callbacks whose marks are durable, keeping the others' order.
  std::vector<std::function<void()>> TakeReadyLocked();
  // Runs the ready callbacks, without mu_ held.
  void RunReady();
  // Writes the snapshot for generation `gen` and starts its log. Flusher
  // thread (or Open) only.
  absl::Status InstallSnapshot(const std::string& bytes, uint64_t gen);
  [[noreturn]] void Fatal(const std::string& what);

  std::unique_ptr<StateMedium> medium_;
  size_t snapshot_after_bytes_ = 0;
  uint64_t generation_ = 0;  // flusher thread only (after Open)
  uint64_t wal_bytes_ = 0;   // flusher thread only

  Collect collect_;
  Snapshot snapshot_;
  std::thread flusher_;

  std::mutex mu_;
  std::condition_variable work_cv_;  // flusher waits for records or a poke
  std::string pending_;              // guarded by mu_: framed, not yet written
  uint64_t last_seq_ = 0;            // guarded by mu_
  uint64_t durable_seq_ = 0;         // guarded by mu_
  uint64_t pokes_ = 0;               // guarded by mu_
  uint64_t durable_pokes_ = 0;       // guarded by mu_: collected and written
  bool stopping_ = false;            // guarded by mu_
  bool stopped_ = false;             // guarded by mu_
  Stats stats_;                      // guarded by mu_
  std::deque<std::pair<Mark, std::function<void()>>> callbacks_;  // guarded by mu_
};

}  // namespace meshrun::rdzv
