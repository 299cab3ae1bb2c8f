#pragma once

// Server-side rendezvous for elastic runs, as a pure state machine: inputs are
// requests and `now`, outputs are events addressed to nodes (plain data the
// gRPC adapter pushes on each node's Join stream). No threads, clock or I/O.
//
// Per run: a round number, the participants of the current round, a wait list,
// one job-global restart counter and the run's outcome. A round completes when
// max_nodes have joined, or when min_nodes have joined and last_call_timeout
// has passed since. While a round is active, a new node waits and the
// participants are told to re-form (scale-up), except under restart scope
// "replica", whose workers survive each other: there the newcomer joins the
// active round at once (the next group rank, ranks after the world's, which
// grows) and nobody else hears of it. There, too, a participant that
// expires or leaves (while min_nodes others remain) leaves its slot vacant
// instead of re-forming the round: its replica groups are reported lost
// (TakeLostReplicaGroups), the run can succeed without it, and the next
// newcomer with the same nproc takes the slot, ranks and all, so that its
// groups take the lost ones' places. Otherwise a participant that expires,
// leaves or reports a worker failure also makes the round re-form, the last
// one counting against max_restarts.
//
// Rounds are numbered from 1 (0 reads as "unset" on the wire). Ranks: a node's
// rank hint if it fits the round, else its rank of the previous round if that
// still fits (rank 0 stays put), else the lowest free rank in join order.
//
// Lifecycle: a run ends (kClosed) when every participant succeeds, when the
// restart budget is spent, when a Close names it, when its join times out,
// or when it has had no live node for one lease (every node left or
// expired). An ended run is kept (answering its own nodes with the outcome)
// until ForgetClosedBefore. A node that was not part of it and joins its id
// starts a new incarnation of the run: new rounds (numbered on from the old
// ones), restart count 0, the joiner's options, a new store prefix. A node
// of the run that took part in no round of it (it was still waiting when the
// run ended) ran nothing, so a success reaches it as kAborted saying so.
//
// Admission epochs: each time a node takes a slot (a round forms, or a
// newcomer takes a lost node's slot) it gets a number larger than any the
// run has given before, across restores too (the epoch's, below, in its
// high 32 bits). Its workers carry it (the step quorum checks it with
// CheckAdmission), and key their replica groups' store prefixes with it, so
// that a slot's next occupant never meets the keys or the quorum identity
// of the one before.
//
// Store prefixes ("<run_id>/e<epoch>.r<round>") never repeat for a run id:
// the epoch grows with every incarnation and every restore (RestoreRun), so
// a round formed again after a crash lost it cannot meet its old keys.
//
// Thread-safety: none; the owner serialises all calls.

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rendezvous/status/run_status.h"

namespace meshrun::rdzv {

using RdzvClock = std::chrono::steady_clock;
using RdzvTime = RdzvClock::time_point;
using Millis = std::chrono::milliseconds;

struct RunOptions {
  uint32_t min_nodes = 1;
  uint32_t max_nodes = 1;
  uint32_t max_restarts = 0;
  Millis last_call_timeout{30000};
  Millis join_timeout{600000};
  Millis keep_alive_interval{5000};
  uint32_t keep_alive_max_attempt = 3;
  bool uniform_nproc = false;
  // Restart scope: 0 "job"; N "replica", groups of N workers (a node's nproc
  // a multiple of it).
  uint32_t replica_size = 0;

  Millis lease() const { return keep_alive_interval * keep_alive_max_attempt; }
};

struct NodeInfo {
  std::string node_id;
  std::string host;
  uint32_t nproc = 1;
  int32_t node_rank_hint = -1;  // -1: none
  // A free port on this node for the workers' MASTER_PORT should it become
  // group rank 0 (0: none offered).
  uint32_t master_port = 0;
  // Non-zero: the agent was a participant of this round and reconnects to it
  // (its workers still run). Refused with NOT_FOUND unless the run is active
  // in exactly this round with the node among its participants, so a node
  // never resumes into a world that has moved on without it.
  uint64_t resume_round = 0;
};

struct ParticipantView {
  std::string node_id;
  std::string host;
  uint32_t group_rank = 0;
  uint32_t nproc = 0;
  uint32_t rank_base = 0;
  uint32_t master_port = 0;
};

// Rounds up to this many nodes also carry the roster inline in
// Assignment::participants. Beyond it, copying the roster into every node's
// event would make forming a round O(n^2) (10,000 nodes: 10^8 entries, ~8 GB),
// so larger rounds share it through Assignment::roster only.
inline constexpr uint32_t kMaxInlineParticipants = 256;

struct Assignment {
  uint64_t round = 0;
  uint32_t group_rank = 0;
  uint32_t group_world_size = 0;
  uint32_t rank_base = 0;
  uint32_t world_size = 0;
  uint32_t restart_count = 0;
  std::string store_prefix;      // "<run_id>/e<epoch>.r<round>"
  uint64_t admission_epoch = 0;  // this node's admission into its slot (above)
  // By group rank; empty when group_world_size > kMaxInlineParticipants.
  std::vector<ParticipantView> participants;
  // The same roster, always set on kAssigned events and shared (not copied)
  // by every participant's event of the round. Adapters should prefer it.
  std::shared_ptr<const std::vector<ParticipantView>> roster;
};

enum class ReformReason { kNodesWaiting, kNodeExpired, kNodeLeft, kWorkerFailure };
enum class Outcome { kSucceeded, kFailed, kAborted };

const char* ToString(ReformReason reason);
const char* ToString(Outcome outcome);

// One message for one node's Join stream.
struct NodeEvent {
  enum class Kind {
    kWaiting,     // enrolled, round not yet complete (round)
    kAssigned,    // round complete (assignment)
    kReform,      // stop workers; a new round follows (round = next round)
    kClosed,      // run over (outcome, detail); the stream ends
    kJoinTimeout  // not enough nodes within join_timeout; the stream ends
  };
  std::string run_id;
  std::string node_id;
  Kind kind = Kind::kWaiting;
  uint64_t round = 0;
  Assignment assignment;
  ReformReason reason = ReformReason::kNodesWaiting;
  Outcome outcome = Outcome::kSucceeded;
  std::string detail;
};

struct HeartbeatStatus {
  uint64_t round = 0;
  uint32_t restart_count = 0;
  bool closed = false;
};

// Restart scope "replica": a replica group whose node was lost (its slot
// vacated) while the round went on.
struct LostReplicaGroup {
  std::string run_id;
  uint32_t replica = 0;
};

struct FailureVerdict {
  bool will_restart = false;
  uint32_t restart_count = 0;
  // This report was the round's root cause (it restarted or failed the run);
  // false for the stale reports of the same failure by other nodes.
  bool counted = false;
};

// What happened, counted where it happened, since the state was created.
// Plain counters; the owner serialises access like every other call.
struct RendezvousStats {
  uint64_t runs_created = 0;  // new incarnations of an ended run included
  uint64_t joins = 0;         // accepted, re-joins included
  uint64_t joins_refused = 0;
  uint64_t join_timeouts = 0;  // rounds that gathered too few nodes in time
  uint64_t rounds_completed = 0;
  uint64_t heartbeats = 0;
  // Arrived more than 1.5 keep-alive intervals after the node's last contact:
  // a beat was missed, the lease has not run out yet.
  uint64_t heartbeats_late = 0;
  uint64_t leases_expired = 0;
  uint64_t failure_reports = 0;  // every report, stale ones included
  // Replica groups restarted alone (restart scope "replica"; not re-forms).
  uint64_t replica_restarts = 0;
  // Nodes admitted into an active round without a re-form (restart scope
  // "replica").
  uint64_t joins_into_active_round = 0;
  // Participants lost (expired or left) whose slot was vacated without a
  // re-form (restart scope "replica").
  uint64_t nodes_dropped_from_active_round = 0;
  std::array<uint64_t, 4> reforms{};      // by ReformReason
  std::array<uint64_t, 3> runs_closed{};  // by Outcome
};

struct RunSummary {
  std::string run_id;
  uint64_t round = 0;
  bool round_active = false;
  uint32_t restart_count = 0;
  std::vector<ParticipantView> participants;
  std::vector<std::string> waiting;
  std::optional<Outcome> outcome;
  std::string last_failure;
};

class RendezvousState {
 public:
  // Enrols a node. The first node of a run fixes its options; a node whose
  // options differ is refused with FAILED_PRECONDITION naming each field that
  // differs ("min_nodes: run has 2, node asked for 3"). A node id already in
  // the run is re-enrolled (its previous stream is considered gone); a
  // participant of a round formed before the last restore that joins afresh
  // (not resuming) re-forms the round, since its workers are gone. A node of
  // an ended run is told its outcome (kClosed); anyone else starts a new
  // incarnation (see the lifecycle above). Invalid input (empty ids,
  // nproc 0, min > max, max 0) answers INVALID_ARGUMENT.
  absl::Status Join(const std::string& run_id, const NodeInfo& node,
                    const RunOptions& options, RdzvTime now,
                    std::vector<NodeEvent>* events);

  // Refreshes the node's lease. NOT_FOUND for an unknown run or node.
  absl::StatusOr<HeartbeatStatus> Heartbeat(const std::string& run_id,
                                            const std::string& node_id, RdzvTime now);

  // A participant's workers failed in `round`. Re-forms the run (restart
  // count + 1) while the budget lasts, else closes it as kFailed with `detail`
  // as the root cause. Reports for an older round than the current one are
  // acknowledged without a second restart (several nodes may see one failure).
  absl::StatusOr<FailureVerdict> ReportFailure(const std::string& run_id,
                                               const std::string& node_id, uint64_t round,
                                               const std::string& detail, RdzvTime now,
                                               std::vector<NodeEvent>* events);

  // Restart scope "replica": replica group `replica` (global rank / replica
  // size) of a participant failed in `round` and restarts alone. Counts one
  // restart against the run's budget without re-forming (no event for
  // anyone) while the budget lasts, else closes the run as kFailed with
  // `detail` as the root cause. `incarnation` (the failed incarnation's
  // MESHRUN_REPLICA_RESTARTS), when given, makes a retried report of one
  // failure count once. A report for another round than the active one is
  // acknowledged without a restart, as in ReportFailure. INVALID_ARGUMENT
  // when the run's scope is not "replica", or `replica` is not one of the
  // reporting node's own groups (its slot's ranks / replica size).
  absl::StatusOr<FailureVerdict> ReportReplicaFailure(
      const std::string& run_id, const std::string& node_id, uint64_t round,
      uint32_t replica, std::optional<uint32_t> incarnation, const std::string& detail,
      RdzvTime now, std::vector<NodeEvent>* events);

  // A participant's workers all succeeded in `round`. When every participant
  // of the round has succeeded, the run closes as kSucceeded.
  absl::Status ReportSuccess(const std::string& run_id, const std::string& node_id,
                             uint64_t round, RdzvTime now,
                             std::vector<NodeEvent>* events);

  // The node departs (graceful leave, or its stream broke). An active round
  // that loses a participant that has not succeeded re-forms with the others;
  // a run left with no live node ends as kAborted one lease later unless a
  // node joins meanwhile (a reconnecting agent comes back within its lease).
  absl::Status Leave(const std::string& run_id, const std::string& node_id, RdzvTime now,
                     std::vector<NodeEvent>* events);

  // Ends the run for everyone with the given outcome.
  absl::Status Close(const std::string& run_id, Outcome outcome,
                     const std::string& reason, RdzvTime now,
                     std::vector<NodeEvent>* events);

  // Expires leases, completes rounds whose last call passed, times out joins.
  void Tick(RdzvTime now, std::vector<NodeEvent>* events);
  // When Tick must run next, if anything is pending.
  std::optional<RdzvTime> NextDeadline() const;

  // The step quorum's check of a worker's identity: OK when `admission` is
  // 0 (not stamped) or the admission of the node that holds global rank
  // `rank` in the active round. FAILED_PRECONDITION, saying why, when the
  // run is not active, the rank is outside its world, the rank's slot was
  // vacated, or another node (or a newer admission) holds it; NOT_FOUND for
  // an unknown run.
  absl::Status CheckAdmission(const std::string& run_id, uint32_t rank,
                              uint64_t admission) const;

  std::optional<RunSummary> Summary(const std::string& run_id) const;
  // Every run (or the one named), for the status page and `meshrun status`;
  // worker exits and structured failure causes are the adapter's to add.
  std::vector<RunStatusRecord> Status(RdzvTime now, const std::string& run_id = {}) const;
  const RendezvousStats& stats() const { return stats_; }
  // The replica groups lost with vacated slots since the last call, for the
  // step quorum (which must stop waiting for them).
  std::vector<LostReplicaGroup> TakeLostReplicaGroups();
  // Whether the run exists and has ended (its latest incarnation).
  bool IsClosed(const std::string& run_id) const;
  // Whether the run has this node (live or departed).
  bool HasNode(const std::string& run_id, const std::string& node_id) const;
  bool HasRun(const std::string& run_id) const { return runs_.count(run_id) > 0; }
  std::vector<std::string> RunIds() const;
  // The store namespace of each run that is not closed and has formed a
  // round (Assignment::store_prefix of its current round), by run id.
  std::map<std::string, std::string> LiveStorePrefixes() const;
  // Forgets closed runs that closed before `cutoff`; returns their ids.
  std::vector<std::string> ForgetClosedBefore(RdzvTime cutoff);

  // Persistence (see state_codec). With tracking on, every call that changes
  // a run records its id until TakeChangedRuns(); heartbeats only refresh
  // leases, which are never persisted, and record nothing.
  void set_track_changes(bool on) { track_changes_ = on; }
  std::vector<std::string> TakeChangedRuns();
  // The run without its leases; nullopt for an unknown run. Timers are
  // stored as what remains of them at `now`.
  std::optional<std::string> EncodeRun(const std::string& run_id, RdzvTime now) const;
  // Adds or replaces a run from EncodeRun's bytes. Every live node gets a
  // fresh lease from `now`, so the daemon's downtime expires nobody, and the
  // run a new epoch, so rounds formed from now on get store prefixes that the
  // rounds a crash may have lost did not use.
  // DATA_LOSS when the bytes do not decode.
  absl::Status RestoreRun(std::string_view bytes, RdzvTime now);
  void RemoveRun(const std::string& run_id);

 private:
  struct Run;     // defined in rendezvous_state.cc
  struct Node;    // defined in rendezvous_state.cc
  struct RunEnd;  // defined in rendezvous_state.cc

  enum class DeadlineKind : uint8_t { kLease, kLastCall, kJoinTimeout, kAbandoned };
  // One pending timer. All timers live in one ordered index so Tick costs
  // O(expired * log n) instead of a scan over every node of every run.
  struct Deadline {
    RdzvTime at;
    DeadlineKind kind;
    std::string run_id;
    std::string node_id;  // empty unless kind == kLease
    bool operator<(const Deadline& other) const;
  };

  // ReportFailure, or with `replica` ReportReplicaFailure.
  absl::StatusOr<FailureVerdict> OnFailure(const std::string& run_id,
                                           const std::string& node_id, uint64_t round,
                                           std::optional<uint32_t> replica,
                                           std::optional<uint32_t> incarnation,
                                           const std::string& detail, RdzvTime now,
                                           std::vector<NodeEvent>* events);
  absl::Status CheckResume(const Run* run, const std::string& run_id,
                           const NodeInfo& node) const;
  absl::Status JoinChecked(const std::string& run_id, const NodeInfo& node,
                           const RunOptions& options, RdzvTime now,
                           std::vector<NodeEvent>* events);
  absl::Status Rejoin(Run& run, Node& node, const NodeInfo& info, RdzvTime now,
                      std::vector<NodeEvent>* events);
  void Enrol(Run& run, const NodeInfo& info, RdzvTime now,
             std::vector<NodeEvent>* events);
  void OnGatheringGrew(Run& run, RdzvTime now, std::vector<NodeEvent>* events);
  // Restart scope "replica": `node` becomes the active round's last
  // participant, its ranks appended to the world.
  void AdmitIntoActiveRound(Run& run, Node& node, std::vector<NodeEvent>* events);
  // Restart scope "replica": the lost participant `node` leaves its slot
  // vacant (and the run) without a re-form; the first waiting node, if
  // any, is admitted.
  void VacateSlot(Run& run, Node& node, const std::string& detail,
                  std::vector<NodeEvent>* events);
  void CompleteRound(Run& run, std::vector<NodeEvent>* events);
  void Reform(Run& run, ReformReason reason, const std::string& detail, RdzvTime now,
              std::vector<NodeEvent>* events);
  void RemoveNode(Run& run, const std::string& node_id, ReformReason reason, RdzvTime now,
                  std::vector<NodeEvent>* events);
  void Depart(Run& run, Node& node);
  void Forget(Run& run, const std::string& node_id);
  void TimeOutJoin(Run& run, RdzvTime now, std::vector<NodeEvent>* events);
  // Arms or disarms the run's end for having no live node.
  void CheckAbandoned(Run& run, RdzvTime now);
  void CloseRun(Run& run, Outcome outcome, const std::string& reason, RdzvTime now,
                std::vector<NodeEvent>* events);
  // The ended run `run` starts over as a new incarnation with these options.
  void StartIncarnation(Run& run, const RunOptions& options, uint32_t nproc);
  // How the incarnation `node_id` belongs to ended, if it has: the run
  // itself once closed, or the one before it. A success reads as kAborted
  // to a node that took part in no round of it.
  static std::optional<RunEnd> EndedRunOf(const Run& run, const std::string& node_id);
  void SetLease(Run& run, Node& node, RdzvTime until);
  void DropLease(Run& run, Node& node);
  void SetRunTimer(Run& run, DeadlineKind kind, std::optional<RdzvTime> at);
  Assignment AssignmentFor(const Run& run, uint32_t group_rank) const;

  RunStatusRecord StatusOf(const Run& run, RdzvTime now) const;

  void Touch(const std::string& run_id) {
    if (track_changes_) changed_.insert(run_id);
  }

  std::map<std::string, std::unique_ptr<Run>> runs_;
  std::set<Deadline> deadlines_;
  bool track_changes_ = false;
  std::set<std::string> changed_;
  std::vector<LostReplicaGroup> lost_replica_groups_;
  RendezvousStats stats_;

 public:
  RendezvousState();
  ~RendezvousState();
  RendezvousState(const RendezvousState&) = delete;
  RendezvousState& operator=(const RendezvousState&) = delete;
};

}  // namespace meshrun::rdzv
