#pragma once

// The per-step quorum and commit vote of fault-tolerant replicated training
// (issue 18), for one run: what torchft's lighthouse and should_commit do,
// inside the daemon that already sees every failure.
//
// Before a step, every member of every replica group arrives. The quorum
// forms once every live replica group has all its members here (every group,
// failed ones too, once someone arrives having finished training, so that a
// restarting group gets the final state), or at the earliest arrival's
// deadline with the groups that are complete by then;
// everyone waiting is told the participants (a late group is not among
// them and arrives again). A group is live unless reported failed
// (ReplicaFailed, from its agent); it becomes live again when a newer
// incarnation arrives (a survivor of the failed one that arrives again is
// refused: its agent is stopping it, and waiting for it would wait for its
// dead peer). A live group that was incomplete when a quorum formed
// at its deadline (hung, or slow) is a straggler: later quorums do not wait
// for it, so that a group that hangs without dying costs one deadline, not
// one per step; it is waited for again once all its members are here. The
// participant with the most committed steps is the source of a heal when
// any participant has fewer. Groups that arrive after the ones that finished
// training have left (a restart or a joining node, too late) are told
// OUT_OF_RANGE: nobody is left to give them the final state. Unless every
// group that held the final state at the finishing quorum was reported
// failed (kRestarting) after it, as a source whose state_dict raised during
// the last heal: then nobody left with it, and they are told DATA_LOSS. A
// quorum whose groups all have fewer steps than a step that committed (every
// group that held the state died, or could not hand it over: a program's
// state_dict that raises) is refused with DATA_LOSS instead of training on
// from an older state: the steps since would be lost silently.
//
// After its all-reduce, every member of every participant votes. The step
// commits when all voted ok; it is discarded at the first failed vote, when
// a participant fails before all its members voted ok, or when a voter's
// deadline passes. A decision is final, so no replica applies a partly
// reduced gradient: every vote that could say commit waited for all of them.
//
// Admissions: a group's processes carry the admission epoch of their node's
// slot (rendezvous_state.h's Assignment::admission_epoch), which grows each
// time a node takes a slot. A group's identity is (admission, incarnation),
// ordered in that order: an arrival with a newer one replaces the group's
// waiting members, an older one (the workers of a node that lost its slot,
// still running) is refused, and so is a vote that names another admission
// than the one the step's quorum was formed with. Admission 0 (a caller that
// does not know its own) matches any.
//
// Ids: quorum ids and group ids count up from `first_id`, which the daemon
// takes from its start time, so that they never repeat across daemon
// restarts (they name process groups' store prefixes). The rest is not
// persisted: after a restart the groups arrive again, a vote naming a
// forgotten quorum is told "discard", and a replica that committed the step
// before the restart is ahead by one step, so the next quorum heals the
// others from it.
//
// Pure: no clock (deadlines and `now` come from the caller), no threads;
// callers parked on Arrive or Vote are answered through `out`.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "rendezvous/core/rendezvous_state.h"

namespace meshrun::rdzv {

using QuorumWaiter = uint64_t;

struct QuorumArrival {
  uint32_t replica = 0;
  uint32_t member = 0;
  uint32_t replica_size = 1;
  uint32_t num_replicas = 1;
  uint64_t committed_steps = 0;
  uint32_t incarnation = 0;
  uint64_t admission = 0;  // 0: unknown (matches any)
  // Trained every step: wait for failed groups as well (QuorumRequest.finished).
  bool finished = false;
};

struct QuorumFormed {
  uint64_t quorum_id = 0;
  uint64_t group_id = 0;
  std::vector<uint32_t> participants;  // ascending
  uint64_t max_committed_steps = 0;
  uint32_t source_replica = 0;
  bool heal = false;
};

struct CommitDecision {
  bool commit = false;
  std::string reason;  // why not
};

// The answer for a parked caller: the quorum it waited for, the decision on
// its vote, or an error (deadline, superseded, replica failed).
struct QuorumAnswer {
  QuorumWaiter waiter = 0;
  std::variant<QuorumFormed, CommitDecision, absl::Status> result;
};

class ReplicaQuorum {
 public:
  explicit ReplicaQuorum(uint64_t first_id);

  // A member arrives for the next step and waits until `deadline` at most.
  // INVALID_ARGUMENT for a member outside the group or a group size that
  // differs from the run's; FAILED_PRECONDITION for an admission or
  // incarnation older than one already seen, or for the incarnation that
  // was reported failed.
  absl::Status Arrive(const QuorumArrival& arrival, QuorumWaiter waiter,
                      RdzvTime deadline, std::vector<QuorumAnswer>* out);

  // A participant's member votes on quorum `quorum_id`'s step. A decided or
  // forgotten quorum is answered at once (forgotten: discard), so a voter
  // whose answer was lost can vote again. FAILED_PRECONDITION for a
  // non-participant, or an `admission` (non-zero) other than the one the
  // participant arrived with.
  absl::Status Vote(uint64_t quorum_id, uint32_t replica, uint32_t member, bool ok,
                    uint64_t admission, QuorumWaiter waiter, RdzvTime deadline,
                    std::vector<QuorumAnswer>* out);

  // The replica group failed (its agent said so): the quorum no longer waits
  // for it, its parked members are answered UNAVAILABLE, and an undecided
  // step it takes part in is discarded unless all its members voted ok.
  // kNodeLost (its node left the run, rendezvous_state.h's vacated slot):
  // the group is forgotten too, so that whoever takes its place later (a
  // node with incarnations of its own, from 0) arrives as a new group.
  enum class Loss { kRestarting, kNodeLost };
  void ReplicaFailed(uint32_t replica, Loss loss, std::vector<QuorumAnswer>* out);

  // Forms overdue quorums, decides overdue votes.
  void Tick(RdzvTime now, std::vector<QuorumAnswer>* out);
  std::optional<RdzvTime> NextDeadline() const;

  // Drops every parked caller (the daemon is stopping): answered UNAVAILABLE.
  void CancelAll(std::vector<QuorumAnswer>* out);

  // Quorums formed so far, for tests and metrics.
  uint64_t quorums_formed() const { return next_quorum_id_ - first_id_; }
  // The id the next quorum gets: where a successor's ids start.
  uint64_t next_id() const { return next_quorum_id_; }

 private:
  using Member = std::pair<uint32_t, uint32_t>;  // replica, member
  struct Replica {
    uint64_t admission = 0;
    uint32_t incarnation = 0;
    bool failed = false;
    bool straggling = false;  // missed an overdue quorum, not complete since
    bool done = false;        // took part in the finishing quorum
    // Held the final state at the finishing quorum (a heal's receiver does
    // not count: its heal may fail), and was not reported failed since.
    bool holds_final = false;
  };
  struct Arrived {
    QuorumWaiter waiter;
    RdzvTime deadline;
    uint64_t committed_steps;
    uint32_t incarnation;
    uint64_t admission;
    bool finished;
  };
  struct Step {
    uint64_t steps = 0;  // the participants' committed steps: it commits steps + 1
    std::vector<uint32_t> participants;
    std::map<uint32_t, uint64_t> admissions;  // by participant, when known
    std::map<Member, bool> votes;
    std::vector<std::pair<QuorumWaiter, RdzvTime>> voters;  // parked
    std::optional<CommitDecision> decision;
  };

  // Forms the quorum when every live group is complete, or (`overdue`)
  // with the complete ones.
  void TryForm(bool overdue, std::vector<QuorumAnswer>* out);
  void Decide(Step& step, CommitDecision decision, std::vector<QuorumAnswer>* out);
  // Keeps the newest steps only (an older undecided one is discarded).
  void Prune(std::vector<QuorumAnswer>* out);

  const uint64_t first_id_;
  uint32_t replica_size_ = 0;  // 0 until the first arrival
  std::map<uint32_t, Replica> replicas_;
  std::map<Member, Arrived> arrived_;
  std::map<uint64_t, Step> steps_;  // by quorum id
  uint64_t next_quorum_id_;
  uint64_t group_id_ = 0;  // the last quorum's; 0: none yet
  std::vector<uint32_t> group_participants_;
  bool group_healthy_ = false;  // the last quorum's step committed
  // The most committed steps of a group that arrived having finished
  // training: a quorum whose groups have fewer is refused (OUT_OF_RANGE),
  // since the finished ones, the only holders of the final state, have left.
  uint64_t finished_steps_ = 0;
  // Every group that held the final state failed after the finishing
  // quorum: the late ones are refused with DATA_LOSS instead.
  bool final_state_lost_ = false;
  // The most steps a decision has committed: a quorum whose groups all hold
  // fewer is refused (DATA_LOSS), since no group that has the state is left.
  uint64_t committed_high_ = 0;
};

}  // namespace meshrun::rdzv
