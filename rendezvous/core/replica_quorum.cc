#include "rendezvous/core/replica_quorum.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace meshrun::rdzv {
namespace {

// Decided steps kept for late or retried votes.
constexpr size_t kKeptSteps = 16;

}  // namespace

ReplicaQuorum::ReplicaQuorum(uint64_t first_id)
    : first_id_(first_id), next_quorum_id_(first_id) {}

absl::Status ReplicaQuorum::Arrive(const QuorumArrival& arrival, QuorumWaiter waiter,
                                   RdzvTime deadline, std::vector<QuorumAnswer>* out) {
  if (arrival.replica_size == 0 || arrival.member >= arrival.replica_size) {
    return absl::InvalidArgumentError(absl::StrCat("quorum: member ", arrival.member,
                                                   " of a replica group of ",
                                                   arrival.replica_size));
  }
  if (replica_size_ != 0 && arrival.replica_size != replica_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("quorum: replica group size ", arrival.replica_size,
                     " differs from the run's ", replica_size_));
  }
  if (replica_size_ == 0) {
    // The groups the job starts with are expected from the first step on.
    replica_size_ = arrival.replica_size;
    for (uint32_t r = 0; r < arrival.num_replicas; ++r) replicas_[r];
  }
  Replica& replica = replicas_[arrival.replica];
  // Newer: another node took the slot (a newer admission; its incarnations
  // count from 0 again), or the group restarted (a newer incarnation).
  bool newer = false;
  if (arrival.admission != 0 && replica.admission != 0 &&
      arrival.admission != replica.admission) {
    if (arrival.admission < replica.admission) {
      return absl::FailedPreconditionError(absl::StrCat(
          "quorum: replica ", arrival.replica, " admission ", arrival.admission,
          " is stale: its slot was taken by admission ", replica.admission));
    }
    newer = true;
  } else {
    if (arrival.incarnation < replica.incarnation) {
      return absl::FailedPreconditionError(absl::StrCat(
          "quorum: replica ", arrival.replica, " incarnation ", arrival.incarnation,
          " was replaced by incarnation ", replica.incarnation));
    }
    newer = arrival.incarnation > replica.incarnation;
  }
  if (replica.failed && !newer) {
    // A survivor of the failed incarnation (its agent is stopping it):
    // reviving the group would make the next quorum wait for the dead member.
    return absl::FailedPreconditionError(
        absl::StrCat("quorum: replica ", arrival.replica, " incarnation ",
                     arrival.incarnation, " failed; only a newer incarnation rejoins"));
  }
  if (replica.admission == 0) replica.admission = arrival.admission;
  if (newer || replica.done) {
    if (arrival.admission != 0) replica.admission = arrival.admission;
    replica.incarnation = arrival.incarnation;
    replica.failed = false;
    replica.done = false;
    group_healthy_ = false;  // a new process: the group must be rebuilt with it
    // Members of the replaced incarnation that were still waiting are gone.
    for (auto it = arrived_.begin(); it != arrived_.end();) {
      if (it->first.first == arrival.replica &&
          (it->second.incarnation != arrival.incarnation ||
           (it->second.admission != 0 && arrival.admission != 0 &&
            it->second.admission != arrival.admission))) {
        out->push_back({it->second.waiter,
                        absl::AbortedError("quorum: replaced by a newer incarnation")});
        it = arrived_.erase(it);
      } else {
        ++it;
      }
    }
  }
  const Member key{arrival.replica, arrival.member};
  if (auto it = arrived_.find(key); it != arrived_.end()) {
    out->push_back(
        {it->second.waiter, absl::AbortedError("quorum: the same member arrived again")});
  }
  arrived_[key] = {waiter,
                   deadline,
                   arrival.committed_steps,
                   arrival.incarnation,
                   arrival.admission,
                   arrival.finished};
  TryForm(/*overdue=*/false, out);
  return absl::OkStatus();
}

void ReplicaQuorum::TryForm(bool overdue, std::vector<QuorumAnswer>* out) {
  if (arrived_.empty()) return;
  std::map<uint32_t, uint32_t> members_here;  // replica -> members arrived
  for (const auto& [key, arrived] : arrived_) ++members_here[key.first];
  bool finishing = false;
  for (const auto& [key, arrived] : arrived_) finishing = finishing || arrived.finished;
  std::vector<uint32_t> complete;
  std::vector<Replica*> live_incomplete;  // stragglers if the quorum is overdue
  bool all_expected_complete = true;
  for (auto& [id, replica] : replicas_) {
    const bool is_complete = members_here[id] == replica_size_;
    if (is_complete) {
      complete.push_back(id);
      replica.straggling = false;
    } else if (!replica.failed && !replica.done) {
      live_incomplete.push_back(&replica);
    }
    const bool expected =
        !replica.done && (finishing || (!replica.failed && !replica.straggling));
    if (expected && !is_complete) all_expected_complete = false;
  }
  if (complete.empty() || !(all_expected_complete || overdue)) return;
  if (overdue)
    for (Replica* replica : live_incomplete) replica->straggling = true;

  // A group's committed steps are its least advanced member's.
  std::map<uint32_t, uint64_t> steps_of;
  for (const auto& [key, arrived] : arrived_) {
    auto [it, inserted] = steps_of.emplace(key.first, arrived.committed_steps);
    if (!inserted) it->second = std::min(it->second, arrived.committed_steps);
  }
  uint64_t max_committed = 0;
  for (uint32_t r : complete) max_committed = std::max(max_committed, steps_of[r]);
  if (max_committed < finished_steps_) {
    // Whoever finished training has left: nobody can hand these groups the
    // final state, and training on from where they are would make another.
    // If every holder failed on the way out, the state is lost with them.
    for (auto it = arrived_.begin(); it != arrived_.end();) {
      if (std::binary_search(complete.begin(), complete.end(), it->first.first)) {
        // Told so, the group leaves (exit 0, or 1 for a lost state, which
        // its agent reports): no quorum is to wait for it again.
        replicas_[it->first.first].done = true;
        out->push_back(
            {it->second.waiter,
             final_state_lost_
                 ? absl::DataLossError(absl::StrCat(
                       "quorum: the training state after ", finished_steps_,
                       " committed steps is lost: every replica group that finished "
                       "with it failed before leaving; restart the job, from a "
                       "checkpoint if it has one"))
                 : absl::OutOfRangeError(
                       absl::StrCat("quorum: training finished (", finished_steps_,
                                    " steps) and its replicas left before replica ",
                                    it->first.first, " could join them"))});
        it = arrived_.erase(it);
      } else {
        ++it;
      }
    }
    return;
  }
  if (max_committed < committed_high_) {
    // Every group that had the state is gone (or could not give it): training
    // on from here would drop committed steps without a word.
    for (auto it = arrived_.begin(); it != arrived_.end();) {
      if (std::binary_search(complete.begin(), complete.end(), it->first.first)) {
        out->push_back(
            {it->second.waiter,
             absl::DataLossError(absl::StrCat(
                 "quorum: the training state after ", committed_high_,
                 " committed steps is lost: no live replica group holds it (the groups "
                 "here have ",
                 max_committed,
                 " at most); restart the job, from a checkpoint if it has one"))});
        it = arrived_.erase(it);
      } else {
        ++it;
      }
    }
    return;
  }
  if (finishing) {
    // Everyone here leaves with the final state after this quorum.
    for (const auto& [key, arrived] : arrived_)
      if (arrived.finished)
        finished_steps_ = std::max(finished_steps_, arrived.committed_steps);
    for (uint32_t r : complete) {
      replicas_[r].done = true;
      replicas_[r].holds_final = steps_of[r] == max_committed;
    }
  }

  QuorumFormed formed;
  formed.quorum_id = next_quorum_id_++;
  formed.participants = complete;
  formed.max_committed_steps = max_committed;
  for (uint32_t r : complete) {
    if (steps_of[r] == formed.max_committed_steps) {
      formed.source_replica = r;
      break;
    }
  }
  for (uint32_t r : complete)
    formed.heal = formed.heal || steps_of[r] != formed.max_committed_steps;
  if (group_id_ == 0 || !group_healthy_ || group_participants_ != complete) {
    group_id_ = formed.quorum_id;
    group_participants_ = complete;
  }
  group_healthy_ = false;  // until this step commits
  formed.group_id = group_id_;

  Step& step = steps_[formed.quorum_id];
  step.steps = max_committed;
  step.participants = complete;
  for (uint32_t r : complete) step.admissions[r] = replicas_[r].admission;
  for (const auto& [key, arrived] : arrived_) out->push_back({arrived.waiter, formed});
  arrived_.clear();
  Prune(out);
}

absl::Status ReplicaQuorum::Vote(uint64_t quorum_id, uint32_t replica, uint32_t member,
                                 bool ok, uint64_t admission, QuorumWaiter waiter,
                                 RdzvTime deadline, std::vector<QuorumAnswer>* out) {
  auto it = steps_.find(quorum_id);
  if (it == steps_.end()) {
    if (quorum_id >= first_id_ && quorum_id < next_quorum_id_) {
      out->push_back(
          {waiter, CommitDecision{false, absl::StrCat("quorum ", quorum_id,
                                                      " is no longer known")}});
      return absl::OkStatus();
    }
    // Formed before the daemon restarted (or never): nobody can have been
    // told to commit it by this daemon, and whoever was told by the old one
    // is ahead, which the next quorum heals.
    out->push_back(
        {waiter, CommitDecision{false, absl::StrCat("quorum ", quorum_id,
                                                    " is unknown to this daemon "
                                                    "(it restarted?)")}});
    return absl::OkStatus();
  }
  Step& step = it->second;
  if (!std::binary_search(step.participants.begin(), step.participants.end(), replica)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "commit: replica ", replica, " is not a participant of quorum ", quorum_id));
  }
  if (member >= replica_size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "commit: member ", member, " of a replica group of ", replica_size_));
  }
  if (const uint64_t formed_with = step.admissions[replica];
      admission != 0 && formed_with != 0 && admission != formed_with) {
    return absl::FailedPreconditionError(
        absl::StrCat("commit: replica ", replica, " admission ", admission,
                     " did not take part in quorum ", quorum_id, " (admission ",
                     formed_with, " did)"));
  }
  if (step.decision) {
    out->push_back({waiter, *step.decision});
    return absl::OkStatus();
  }
  step.votes[{replica, member}] = ok;
  step.voters.emplace_back(waiter, deadline);
  if (!ok) {
    Decide(step,
           {false, absl::StrCat("replica ", replica, " member ", member,
                                "'s all-reduce failed")},
           out);
  } else if (step.votes.size() == step.participants.size() * replica_size_ &&
             std::all_of(step.votes.begin(), step.votes.end(),
                         [](const auto& vote) { return vote.second; })) {
    Decide(step, {true, ""}, out);
  }
  return absl::OkStatus();
}

void ReplicaQuorum::Decide(Step& step, CommitDecision decision,
                           std::vector<QuorumAnswer>* out) {
  if (step.decision) return;
  step.decision = decision;
  if (decision.commit) committed_high_ = std::max(committed_high_, step.steps + 1);
  for (const auto& [waiter, deadline] : step.voters) out->push_back({waiter, decision});
  step.voters.clear();
  // Only the newest step says whether its group can carry on.
  if (&step == &steps_.rbegin()->second) group_healthy_ = decision.commit;
}

void ReplicaQuorum::ReplicaFailed(uint32_t replica_id, Loss loss,
                                  std::vector<QuorumAnswer>* out) {
  Replica& replica = replicas_[replica_id];
  replica.failed = true;
  group_healthy_ = false;
  // A node lost is not counted: its group may have left with the state
  // before the node went (the daemon sees no group's own exit).
  if (replica.holds_final && loss == Loss::kRestarting) {
    replica.holds_final = false;
    final_state_lost_ = std::none_of(replicas_.begin(), replicas_.end(),
                                     [](const auto& r) { return r.second.holds_final; });
  }
  for (auto it = arrived_.begin(); it != arrived_.end();) {
    if (it->first.first == replica_id) {
      out->push_back(
          {it->second.waiter, absl::UnavailableError(absl::StrCat(
                                  "quorum: replica ", replica_id, " failed"))});
      it = arrived_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [id, step] : steps_) {
    if (step.decision || !std::binary_search(step.participants.begin(),
                                             step.participants.end(), replica_id))
      continue;
    uint32_t voted_ok = 0;
    for (const auto& [key, ok] : step.votes) voted_ok += key.first == replica_id && ok;
    if (voted_ok < replica_size_) {
      Decide(step,
             {false, absl::StrCat("replica ", replica_id, " failed during the step")},
             out);
    }
  }
  if (loss == Loss::kNodeLost) replicas_.erase(replica_id);
  TryForm(/*overdue=*/false, out);
}

void ReplicaQuorum::Tick(RdzvTime now, std::vector<QuorumAnswer>* out) {
  for (auto& [id, step] : steps_) {
    if (step.decision) continue;
    for (const auto& [waiter, deadline] : step.voters) {
      if (deadline > now) continue;
      std::vector<std::string> missing;
      for (uint32_t r : step.participants) {
        for (uint32_t m = 0; m < replica_size_; ++m)
          if (!step.votes.count({r, m})) missing.push_back(absl::StrCat(r, ".", m));
      }
      Decide(step,
             {false, absl::StrCat("timed out waiting for the votes of replica.member ",
                                  absl::StrJoin(missing, ", "))},
             out);
      break;
    }
  }
  bool overdue = false;
  for (const auto& [key, arrived] : arrived_)
    overdue = overdue || arrived.deadline <= now;
  if (!overdue) return;
  TryForm(/*overdue=*/true, out);
  // Nobody complete: those out of time are told so; the rest wait on.
  for (auto it = arrived_.begin(); it != arrived_.end();) {
    if (it->second.deadline <= now) {
      out->push_back({it->second.waiter,
                      absl::DeadlineExceededError(
                          "quorum: no replica group had all its members here in time")});
      it = arrived_.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<RdzvTime> ReplicaQuorum::NextDeadline() const {
  std::optional<RdzvTime> next;
  auto consider = [&next](RdzvTime t) {
    if (!next || t < *next) next = t;
  };
  for (const auto& [key, arrived] : arrived_) consider(arrived.deadline);
  for (const auto& [id, step] : steps_)
    for (const auto& [waiter, deadline] : step.voters) consider(deadline);
  return next;
}

void ReplicaQuorum::CancelAll(std::vector<QuorumAnswer>* out) {
  for (const auto& [key, arrived] : arrived_)
    out->push_back({arrived.waiter, absl::UnavailableError("the daemon is stopping")});
  arrived_.clear();
  for (auto& [id, step] : steps_) {
    for (const auto& [waiter, deadline] : step.voters)
      out->push_back({waiter, absl::UnavailableError("the daemon is stopping")});
    step.voters.clear();
  }
}

void ReplicaQuorum::Prune(std::vector<QuorumAnswer>* out) {
  while (steps_.size() > kKeptSteps) {
    Decide(steps_.begin()->second, {false, "superseded by newer quorums"}, out);
    steps_.erase(steps_.begin());
  }
}

}  // namespace meshrun::rdzv
