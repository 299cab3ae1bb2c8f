#include "rendezvous/core/rendezvous_state.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rendezvous/core/state_codec.h"

namespace meshrun::rdzv {
namespace {

constexpr size_t kMaxIdBytes = 256;
constexpr uint32_t kMaxNodesLimit = 100000;
constexpr uint32_t kMaxNproc = 65536;
// Bounds every timeout so `now + timeout` cannot overflow the clock.
constexpr Millis kMaxTimeout = std::chrono::hours(24 * 366);
// Global ranks are int32 in torch.distributed.
constexpr uint64_t kMaxWorldSize = std::numeric_limits<int32_t>::max();
// Rounds start at 1 so that 0 can mean "unset" on the wire (proto3).
constexpr uint64_t kFirstRound = 1;

enum class Phase { kGathering, kActive, kClosed };
enum class Role { kGathering, kWaiting, kParticipant };

absl::Status CheckId(const char* what, const std::string& id, bool required) {
  if (required && id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must not be empty"));
  }
  if (id.size() > kMaxIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is ", id.size(), " bytes; at most ", kMaxIdBytes, " allowed"));
  }
  return absl::OkStatus();
}

absl::Status CheckTimeout(const char* what, Millis value, bool zero_ok) {
  if (value.count() < 0 || (!zero_ok && value.count() == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be ",
                                                   zero_ok ? "non-negative" : "positive",
                                                   ", got ", value.count(), "ms"));
  }
  if (value > kMaxTimeout) {
    return absl::InvalidArgumentError(absl::StrCat(what, " of ", value.count(),
                                                   "ms exceeds the limit of ",
                                                   kMaxTimeout.count(), "ms"));
  }
  return absl::OkStatus();
}

absl::Status ValidateJoin(const std::string& run_id, const NodeInfo& node,
                          const RunOptions& o) {
  if (auto s = CheckId("run_id", run_id, true); !s.ok()) return s;
  if (auto s = CheckId("node_id", node.node_id, true); !s.ok()) return s;
  if (auto s = CheckId("host", node.host, false); !s.ok()) return s;
  if (node.nproc == 0) {
    return absl::InvalidArgumentError("nproc must be at least 1");
  }
  if (node.nproc > kMaxNproc) {
    return absl::InvalidArgumentError(
        absl::StrCat("nproc ", node.nproc, " exceeds the limit of ", kMaxNproc));
  }
  if (o.max_nodes == 0) {
    return absl::InvalidArgumentError("max_nodes must be at least 1");
  }
  if (o.max_nodes > kMaxNodesLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_nodes ", o.max_nodes, " exceeds the limit of ", kMaxNodesLimit));
  }
  // min_nodes 0 would let a round form with nobody in it.
  if (o.min_nodes == 0) {
    return absl::InvalidArgumentError("min_nodes must be at least 1");
  }
  if (o.min_nodes > o.max_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_nodes (", o.min_nodes, ") must not exceed max_nodes (", o.max_nodes, ")"));
  }
  if (auto s = CheckTimeout("last_call_timeout", o.last_call_timeout, true); !s.ok()) {
    return s;
  }
  if (auto s = CheckTimeout("join_timeout", o.join_timeout, false); !s.ok()) {
    return s;
  }
  if (auto s = CheckTimeout("keep_alive_interval", o.keep_alive_interval, false);
      !s.ok()) {
    return s;
  }
  if (o.keep_alive_max_attempt == 0) {
    return absl::InvalidArgumentError("keep_alive_max_attempt must be at least 1");
  }
  // Divide rather than multiply: interval * attempts can overflow int64.
  if (o.keep_alive_max_attempt > kMaxTimeout.count() / o.keep_alive_interval.count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_alive_interval * keep_alive_max_attempt exceeds the limit of ",
                     kMaxTimeout.count(), "ms"));
  }
  if (o.replica_size > 0 && node.nproc % o.replica_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("nproc ", node.nproc, " is not a multiple of the replica size ",
                     o.replica_size, " (restart scope replica)"));
  }
  if (node.node_rank_hint < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node_rank_hint must be -1 (none) or a rank, got ", node.node_rank_hint));
  }
  if (node.node_rank_hint >= 0 &&
      static_cast<uint32_t>(node.node_rank_hint) >= o.max_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("node_rank_hint ", node.node_rank_hint,
                                                   " must be below max_nodes (",
                                                   o.max_nodes, ")"));
  }
  return absl::OkStatus();
}

// "min_nodes: run has 2, node asked for 3; ..." or empty when equal.
std::string DescribeOptionDiff(const RunOptions& run, const RunOptions& asked) {
  std::vector<std::string> diffs;
  auto number = [&](const char* name, uint64_t have, uint64_t want) {
    if (have != want) {
      diffs.push_back(absl::StrCat(name, ": run has ", have, ", node asked for ", want));
    }
  };
  auto millis = [&](const char* name, Millis have, Millis want) {
    if (have != want) {
      diffs.push_back(absl::StrCat(name, ": run has ", have.count(),
                                   "ms, node asked for ", want.count(), "ms"));
    }
  };
  number("min_nodes", run.min_nodes, asked.min_nodes);
  number("max_nodes", run.max_nodes, asked.max_nodes);
  number("max_restarts", run.max_restarts, asked.max_restarts);
  millis("last_call_timeout", run.last_call_timeout, asked.last_call_timeout);
  millis("join_timeout", run.join_timeout, asked.join_timeout);
  millis("keep_alive_interval", run.keep_alive_interval, asked.keep_alive_interval);
  number("keep_alive_max_attempt", run.keep_alive_max_attempt,
         asked.keep_alive_max_attempt);
  if (run.uniform_nproc != asked.uniform_nproc) {
    diffs.push_back(
        absl::StrCat("uniform_nproc: run has ", run.uniform_nproc ? "true" : "false",
                     ", node asked for ", asked.uniform_nproc ? "true" : "false"));
  }
  if (run.replica_size != asked.replica_size) {
    auto scope = [](uint32_t replica_size) {
      return replica_size == 0
                 ? std::string("job")
                 : absl::StrCat("replica (groups of ", replica_size, " workers)");
    };
    diffs.push_back(absl::StrCat("restart scope: run has ", scope(run.replica_size),
                                 ", node asked for ", scope(asked.replica_size)));
  }
  return absl::StrJoin(diffs, "; ");
}

NodeEvent& Emit(std::vector<NodeEvent>* events, const std::string& run_id,
                const std::string& node_id, NodeEvent::Kind kind, uint64_t round) {
  NodeEvent& event = events->emplace_back();
  event.run_id = run_id;
  event.node_id = node_id;
  event.kind = kind;
  event.round = round;
  return event;
}

}  // namespace

const char* ToString(ReformReason reason) {
  switch (reason) {
    case ReformReason::kNodesWaiting:
      return "nodes waiting";
    case ReformReason::kNodeExpired:
      return "node expired";
    case ReformReason::kNodeLeft:
      return "node left";
    case ReformReason::kWorkerFailure:
      return "worker failure";
  }
  return "unknown";
}

const char* ToString(Outcome outcome) {
  switch (outcome) {
    case Outcome::kSucceeded:
      return "succeeded";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kAborted:
      return "aborted";
  }
  return "unknown";
}

struct RendezvousState::Node {
  NodeInfo info;
  // Join order: ties in rank assignment and the wait list go by it. A node
  // that re-joins keeps its number.
  uint64_t seq = 0;
  Role role = Role::kGathering;
  RdzvTime lease_until{};
  bool leased = false;
  // Group rank in the last completed round this node took part in; makes
  // ranks sticky across re-forms.
  std::optional<uint32_t> group_rank;
  bool succeeded = false;
  // Its admission into its slot of the round (see the header); 0 for none
  // (not a participant, or restored from a record that predates it).
  uint64_t admission = 0;
  // A participant that succeeded and then left or expired: still counted for
  // the round's success, but no longer live (no events, no lease).
  bool departed = false;
};

// How an incarnation of a run ended.
struct RendezvousState::RunEnd {
  Outcome outcome = Outcome::kAborted;
  std::string reason;
  uint64_t round = 0;
};

namespace {
// What a node that took part in no round of a run that ended with `outcome`
// is told: a success is not its own (it ran nothing), so it reads as kAborted.
std::pair<Outcome, std::string> AsToldTo(bool took_part, const std::string& run_id,
                                         Outcome outcome, uint64_t round,
                                         const std::string& reason) {
  if (took_part || outcome != Outcome::kSucceeded) return {outcome, reason};
  return {Outcome::kAborted,
          absl::StrCat("run ", run_id, " ended (succeeded) in round ", round,
                       " before this node took part; nothing ran on it")};
}
}  // namespace

struct RendezvousState::Run {
  std::string id;
  RunOptions options;
  // The first node's nproc: the reference when options.uniform_nproc.
  uint32_t nproc = 0;
  Phase phase = Phase::kGathering;
  uint64_t round = kFirstRound;
  uint32_t restart_count = 0;
  std::string last_failure;
  std::optional<Outcome> outcome;
  std::string close_reason;
  RdzvTime closed_at{};
  uint64_t next_seq = 0;
  // Sum of nproc over live nodes, to refuse a join that no round could fit.
  uint64_t live_nproc = 0;

  std::unordered_map<std::string, Node> nodes;
  std::map<uint64_t, std::string> gathering;  // join seq -> node id
  std::map<uint64_t, std::string> waiting;    // join seq -> node id

  // The active round (or, once closed, the last one), by group rank.
  std::vector<std::string> participants;
  std::shared_ptr<const std::vector<ParticipantView>> roster;
  std::string store_prefix;
  uint32_t world_size = 0;
  uint32_t succeeded = 0;

  std::optional<RdzvTime> min_reached_at;
  std::optional<RdzvTime> last_call_at;      // mirrored in deadlines_
  std::optional<RdzvTime> join_deadline_at;  // mirrored in deadlines_
  // The join timeout fired while the round had min nodes (its last call was
  // pending): should the round drop below min, it times out at once.
  bool join_deadline_passed = false;
  std::optional<RdzvTime> abandon_at;  // mirrored in deadlines_; no live node

  // Grows with every incarnation and every restore; part of store prefixes,
  // so none repeats (see the header).
  uint64_t epoch = 1;
  uint64_t round_epoch = 0;  // the epoch the current (or last) round formed in
  // Every node that enrolled in this incarnation, gone ones included: after
  // the end they are told the outcome, anyone else starts a new incarnation.
  // The value: whether the node took part in a round (else it only waited).
  std::map<std::string, bool> members;
  // The incarnation before this one and its members, for its nodes that
  // come back late.
  std::optional<RunEnd> previous;
  std::map<std::string, bool> previous_members;
  // Participants expired mid-round (a stall, a partition) that have not come
  // back: when one rejoins, its workers restart, which counts as a restart.
  std::set<std::string> expelled;
  // Restart scope "replica", this round: by replica group, the latest
  // incarnation whose failure was counted, so a retried report is not.
  std::map<uint32_t, uint32_t> replica_failures;
  // Restart scope "replica": slots of the active round whose node was lost
  // (an empty id in `participants`, which no node can have), until a
  // newcomer takes one.
  uint32_t vacant = 0;
  // Admissions given since the epoch began (not persisted: a restore starts
  // a new epoch); see NextAdmission.
  uint32_t admissions = 0;
};

namespace {
// The next admission epoch of `epoch`'s run (see the header).
uint64_t NextAdmission(uint64_t epoch, uint32_t* admissions) {
  return (epoch << 32) | ++*admissions;
}
}  // namespace

bool RendezvousState::Deadline::operator<(const Deadline& other) const {
  return std::tie(at, kind, run_id, node_id) <
         std::tie(other.at, other.kind, other.run_id, other.node_id);
}

RendezvousState::RendezvousState() = default;
RendezvousState::~RendezvousState() = default;

absl::Status RendezvousState::Join(const std::string& run_id, const NodeInfo& node,
                                   const RunOptions& options, RdzvTime now,
                                   std::vector<NodeEvent>* events) {
  std::vector<NodeEvent> scratch;
  if (events == nullptr) events = &scratch;
  absl::Status status = JoinChecked(run_id, node, options, now, events);
  if (status.ok()) {
    ++stats_.joins;
  } else {
    ++stats_.joins_refused;
  }
  return status;
}

absl::Status RendezvousState::JoinChecked(const std::string& run_id, const NodeInfo& node,
                                          const RunOptions& options, RdzvTime now,
                                          std::vector<NodeEvent>* events) {
  if (auto s = ValidateJoin(run_id, node, options); !s.ok()) return s;

  auto it = runs_.find(run_id);
  if (node.resume_round != 0) {
    if (auto s =
            CheckResume(it == runs_.end() ? nullptr : it->second.get(), run_id, node);
        !s.ok()) {
      return s;
    }
  }
  Touch(run_id);
  if (it == runs_.end()) {
    ++stats_.runs_created;
    auto run = std::make_unique<Run>();
    run->id = run_id;
    run->options = options;
    run->nproc = node.nproc;
    it = runs_.emplace(run_id, std::move(run)).first;
  }
  Run& run = *it->second;
  if (const std::optional<RunEnd> end = EndedRunOf(run, node.node_id)) {
    // A node of an ended incarnation that comes back (its stream broke
    // before the end reached it, an agent back from a partition) learns the
    // outcome as the other participants did. It is not enrolled.
    NodeEvent& event =
        Emit(events, run.id, node.node_id, NodeEvent::Kind::kClosed, end->round);
    event.outcome = end->outcome;
    event.detail = absl::StrCat("run ", run_id, " had already ended (",
                                ToString(end->outcome), ") when this node joined");
    if (!end->reason.empty()) absl::StrAppend(&event.detail, ": ", end->reason);
    return absl::OkStatus();
  }
  if (run.phase == Phase::kClosed) {
    // Anyone else is a new launch under a used id: telling it the old
    // outcome would report work it never ran, so it runs its own.
    ++stats_.runs_created;
    StartIncarnation(run, options, node.nproc);
  }
  if (std::string diff = DescribeOptionDiff(run.options, options); !diff.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("run ", run_id, " was started with different options: ", diff));
  }
  if (run.options.uniform_nproc && node.nproc != run.nproc) {
    return absl::FailedPreconditionError(
        absl::StrCat("run ", run_id, " requires uniform nproc: run has nproc ", run.nproc,
                     ", node ", node.node_id, " asked for ", node.nproc));
  }
  auto existing = run.nodes.find(node.node_id);
  uint64_t live_nproc = run.live_nproc + node.nproc;
  if (existing != run.nodes.end() && !existing->second.departed) {
    live_nproc -= existing->second.info.nproc;
  }
  if (live_nproc > kMaxWorldSize) {
    return absl::ResourceExhaustedError(absl::StrCat("run ", run_id, " would exceed ",
                                                     kMaxWorldSize, " workers with node ",
                                                     node.node_id));
  }

  if (existing != run.nodes.end()) {
    return Rejoin(run, existing->second, node, now, events);
  }
  if (run.expelled.erase(node.node_id) > 0) {
    ++run.restart_count;
    run.last_failure = absl::StrCat("node ", node.node_id, " on host ", node.host,
                                    " was expelled (it missed its heartbeats for ",
                                    run.options.lease().count(), "ms) and rejoined");
    if (run.restart_count > run.options.max_restarts) {
      // Out of restarts, as if a worker had failed: the run fails, and the
      // rejoining node learns it with the others.
      CloseRun(run, Outcome::kFailed, run.last_failure, now, events);
      NodeEvent& event =
          Emit(events, run.id, node.node_id, NodeEvent::Kind::kClosed, run.round);
      event.outcome = Outcome::kFailed;
      event.detail = run.last_failure;
      return absl::OkStatus();
    }
  }
  Enrol(run, node, now, events);
  return absl::OkStatus();
}

absl::Status RendezvousState::CheckResume(const Run* run, const std::string& run_id,
                                          const NodeInfo& node) const {
  auto unknown = [&](const std::string& why) {
    return absl::NotFoundError(absl::StrCat("cannot resume round ", node.resume_round,
                                            " of run ", run_id, ": ", why));
  };
  if (run == nullptr) return unknown("the daemon does not know the run");
  // An ended run answers its nodes with its outcome (see Join).
  if (EndedRunOf(*run, node.node_id)) return absl::OkStatus();
  if (run->phase == Phase::kClosed) return unknown("the run ended without this node");
  if (run->phase != Phase::kActive || run->round != node.resume_round) {
    return unknown(absl::StrCat("the run is ",
                                run->phase == Phase::kActive ? "active" : "gathering",
                                " in round ", run->round));
  }
  auto it = run->nodes.find(node.node_id);
  if (it == run->nodes.end() || it->second.role != Role::kParticipant ||
      (it->second.departed && !it->second.succeeded)) {
    return unknown(absl::StrCat("node ", node.node_id, " is not a participant"));
  }
  return absl::OkStatus();
}

// The agent reconnected (its old stream is gone). Re-sending the current
// state keeps a reconnect from costing everyone a re-form.
absl::Status RendezvousState::Rejoin(Run& run, Node& node, const NodeInfo& info,
                                     RdzvTime now, std::vector<NodeEvent>* events) {
  const bool same =
      node.info.nproc == info.nproc && node.info.node_rank_hint == info.node_rank_hint &&
      node.info.host == info.host && node.info.master_port == info.master_port;
  SetRunTimer(run, DeadlineKind::kAbandoned, std::nullopt);
  // A participant that joins afresh after a restore may have run (and
  // stopped) workers in a round the crash lost; its round's world and store
  // keys cannot be trusted, so the round re-forms below. Without a restore in
  // between, a fresh join means the assignment never reached it: re-sent.
  const bool stale_round =
      info.resume_round == 0 && run.round_epoch != run.epoch && !node.succeeded;
  if (node.role == Role::kParticipant) {
    // A succeeded node's round is over for it; its new details cannot matter.
    if ((same && !stale_round) || node.succeeded) {
      if (node.departed) {
        node.departed = false;
        run.live_nproc += node.info.nproc;
      }
      SetLease(run, node, now + run.options.lease());
      NodeEvent& event =
          Emit(events, run.id, node.info.node_id, NodeEvent::Kind::kAssigned, run.round);
      event.assignment = AssignmentFor(run, *node.group_rank);
      return absl::OkStatus();
    }
    // Its assignment is stale (other nproc, host or hint, or see above): the
    // round must re-form without the old incarnation, then it joins afresh.
    RemoveNode(run, info.node_id, ReformReason::kNodeLeft, now, events);
    Enrol(run, info, now, events);
    return absl::OkStatus();
  }

  run.live_nproc = run.live_nproc - node.info.nproc + info.nproc;
  node.info = info;
  SetLease(run, node, now + run.options.lease());
  Emit(events, run.id, info.node_id, NodeEvent::Kind::kWaiting,
       node.role == Role::kGathering ? run.round : run.round + 1);
  return absl::OkStatus();
}

void RendezvousState::Enrol(Run& run, const NodeInfo& info, RdzvTime now,
                            std::vector<NodeEvent>* events) {
  Node& node = run.nodes[info.node_id];
  node.info = info;
  node.seq = run.next_seq++;
  run.members.emplace(info.node_id, false);
  SetRunTimer(run, DeadlineKind::kAbandoned, std::nullopt);
  run.live_nproc += info.nproc;
  SetLease(run, node, now + run.options.lease());

  if (run.phase == Phase::kGathering) {
    // The join timeout runs from the first node of a gathering round: the
    // run's first join, the re-form moment, or the first join after the round
    // emptied (a timeout with nobody to tell is pointless).
    if (run.gathering.empty()) {
      SetRunTimer(run, DeadlineKind::kJoinTimeout, now + run.options.join_timeout);
    }
    node.role = Role::kGathering;
    run.gathering.emplace(node.seq, info.node_id);
    Emit(events, run.id, info.node_id, NodeEvent::Kind::kWaiting, run.round);
    OnGatheringGrew(run, now, events);
    return;
  }

  // Restart scope "replica": the round's workers survive each other, so a
  // newcomer's replica groups join them where they are instead of
  // restarting everyone (they heal from a live replica at a step boundary).
  if (run.options.replica_size > 0 && run.succeeded == 0 &&
      run.participants.size() - run.vacant < run.options.max_nodes) {
    AdmitIntoActiveRound(run, node, events);
    return;
  }

  node.role = Role::kWaiting;
  run.waiting.emplace(node.seq, info.node_id);
  Emit(events, run.id, info.node_id, NodeEvent::Kind::kWaiting, run.round + 1);
  // Once a participant has succeeded the job is finishing: restarting it to
  // admit a newcomer would throw away finished work, so the node just waits
  // (it gets kClosed when the run ends, or joins a failure re-form).
  if (run.participants.size() < run.options.max_nodes && run.succeeded == 0) {
    Reform(run, ReformReason::kNodesWaiting,
           absl::StrCat(run.waiting.size(), " node(s) waiting to join"), now, events);
  }
}

void RendezvousState::OnGatheringGrew(Run& run, RdzvTime now,
                                      std::vector<NodeEvent>* events) {
  const size_t joined = run.gathering.size();
  if (joined >= run.options.max_nodes) {
    CompleteRound(run, events);
    return;
  }
  if (joined < run.options.min_nodes) return;
  // The last call counts from when min was first reached in this round, even
  // if the count dipped below min in between: stragglers already had their
  // chance.
  if (!run.min_reached_at) run.min_reached_at = now;
  const RdzvTime last_call = *run.min_reached_at + run.options.last_call_timeout;
  if (last_call <= now) {
    CompleteRound(run, events);
    return;
  }
  SetRunTimer(run, DeadlineKind::kLastCall, last_call);
}

void RendezvousState::CompleteRound(Run& run, std::vector<NodeEvent>* events) {
  const uint32_t n = static_cast<uint32_t>(run.gathering.size());
  std::vector<Node*> slots(n, nullptr);
  std::vector<Node*> unhinted;
  unhinted.reserve(n);
  // 1. Hints win: the user (or SLURM) asked for that rank. Two nodes may
  // give one hint (torchrun's users pass --node-rank=0 everywhere, and
  // torchrun ignores it outside the static backend): the first to join gets
  // the slot, the other is placed as if it had given none.
  for (const auto& [seq, id] : run.gathering) {
    Node& node = run.nodes.at(id);
    const int32_t hint = node.info.node_rank_hint;
    if (hint >= 0 && static_cast<uint32_t>(hint) < n && slots[hint] == nullptr) {
      slots[hint] = &node;
    } else {
      unhinted.push_back(&node);
    }
  }
  // 2. Sticky: keep last round's rank where it still fits, so rank 0 (the
  // MASTER_ADDR host) stays put when it survives.
  std::vector<Node*> rest;
  rest.reserve(unhinted.size());
  for (Node* node : unhinted) {
    if (node->group_rank && *node->group_rank < n &&
        slots[*node->group_rank] == nullptr) {
      slots[*node->group_rank] = node;
    } else {
      rest.push_back(node);
    }
  }
  // 3. Everyone else fills the free slots ascending, in join order.
  uint32_t next_free = 0;
  for (Node* node : rest) {
    while (slots[next_free] != nullptr) ++next_free;
    slots[next_free] = node;
  }

  auto roster = std::make_shared<std::vector<ParticipantView>>();
  roster->reserve(n);
  run.participants.clear();
  run.participants.reserve(n);
  uint64_t rank_base = 0;
  for (uint32_t rank = 0; rank < n; ++rank) {
    Node& node = *slots[rank];
    run.members[node.info.node_id] = true;
    node.role = Role::kParticipant;
    node.group_rank = rank;
    node.succeeded = false;
    node.admission = NextAdmission(run.epoch, &run.admissions);
    roster->push_back(ParticipantView{node.info.node_id, node.info.host, rank,
                                      node.info.nproc, static_cast<uint32_t>(rank_base),
                                      node.info.master_port});
    rank_base += node.info.nproc;
    run.participants.push_back(node.info.node_id);
  }
  run.roster = std::move(roster);
  // Bounded by kMaxWorldSize at join.
  run.world_size = static_cast<uint32_t>(rank_base);
  run.store_prefix = absl::StrCat(run.id, "/e", run.epoch, ".r", run.round);
  run.round_epoch = run.epoch;
  run.succeeded = 0;
  run.vacant = 0;
  run.replica_failures.clear();
  run.phase = Phase::kActive;
  ++stats_.rounds_completed;
  run.gathering.clear();
  run.min_reached_at.reset();
  SetRunTimer(run, DeadlineKind::kLastCall, std::nullopt);
  SetRunTimer(run, DeadlineKind::kJoinTimeout, std::nullopt);

  events->reserve(events->size() + n);
  for (uint32_t rank = 0; rank < n; ++rank) {
    NodeEvent& event = Emit(events, run.id, run.participants[rank],
                            NodeEvent::Kind::kAssigned, run.round);
    event.assignment = AssignmentFor(run, rank);
  }
}

void RendezvousState::AdmitIntoActiveRound(Run& run, Node& node,
                                           std::vector<NodeEvent>* events) {
  // A lost node's slot of the same size, so that its replica groups (ids
  // from the ranks) come back; else new ranks after the world's.
  auto group_rank = static_cast<uint32_t>(run.participants.size());
  for (uint32_t g = 0; run.vacant > 0 && g < run.participants.size(); ++g) {
    if (run.participants[g].empty() && (*run.roster)[g].nproc == node.info.nproc) {
      group_rank = g;
      break;
    }
  }
  // The roster is shared with the events already sent: a new one.
  auto roster = std::make_shared<std::vector<ParticipantView>>(*run.roster);
  if (group_rank < run.participants.size()) {
    ParticipantView& slot = (*roster)[group_rank];
    slot.node_id = node.info.node_id;
    slot.host = node.info.host;
    slot.master_port = node.info.master_port;
    run.participants[group_rank] = node.info.node_id;
    --run.vacant;
  } else {
    roster->push_back(ParticipantView{node.info.node_id, node.info.host, group_rank,
                                      node.info.nproc, run.world_size,
                                      node.info.master_port});
    run.participants.push_back(node.info.node_id);
    // Bounded by kMaxWorldSize at join.
    run.world_size += node.info.nproc;
  }
  run.roster = std::move(roster);
  run.members[node.info.node_id] = true;
  node.role = Role::kParticipant;
  node.group_rank = group_rank;
  node.succeeded = false;
  node.admission = NextAdmission(run.epoch, &run.admissions);
  ++stats_.joins_into_active_round;
  NodeEvent& event =
      Emit(events, run.id, node.info.node_id, NodeEvent::Kind::kAssigned, run.round);
  event.assignment = AssignmentFor(run, group_rank);
}

Assignment RendezvousState::AssignmentFor(const Run& run, uint32_t group_rank) const {
  Assignment a;
  a.round = run.round;
  a.group_rank = group_rank;
  a.group_world_size = static_cast<uint32_t>(run.participants.size());
  a.rank_base = (*run.roster)[group_rank].rank_base;
  a.world_size = run.world_size;
  a.restart_count = run.restart_count;
  a.store_prefix = run.store_prefix;
  if (auto node = run.nodes.find(run.participants[group_rank]); node != run.nodes.end())
    a.admission_epoch = node->second.admission;
  a.roster = run.roster;
  if (a.group_world_size <= kMaxInlineParticipants) {
    a.participants = *run.roster;
  }
  return a;
}

// Re-forms the active round as round + 1 with its live participants and as
// many waiting nodes as fit. The daemon already knows every live node, so
// waiting for a last call would only add latency: a re-formed round with at
// least min_nodes completes at once. With fewer it gathers like a fresh round
// (completes on joins / last call, or times out after join_timeout).
void RendezvousState::Reform(Run& run, ReformReason reason, const std::string& detail,
                             RdzvTime now, std::vector<NodeEvent>* events) {
  ++stats_.reforms[static_cast<size_t>(reason)];
  const uint64_t next = run.round + 1;
  for (const std::string& id : run.participants) {
    auto it = run.nodes.find(id);
    if (it == run.nodes.end() || it->second.departed) continue;
    NodeEvent& event = Emit(events, run.id, id, NodeEvent::Kind::kReform, next);
    event.reason = reason;
    event.detail = detail;
  }

  run.round = next;
  run.phase = Phase::kGathering;
  run.gathering.clear();
  for (const std::string& id : run.participants) {
    auto it = run.nodes.find(id);
    if (it == run.nodes.end()) continue;
    if (it->second.departed) {
      run.nodes.erase(it);
      continue;
    }
    it->second.role = Role::kGathering;
    it->second.succeeded = false;
    run.gathering.emplace(it->second.seq, id);
  }
  run.participants.clear();
  run.roster.reset();
  run.store_prefix.clear();
  run.world_size = 0;
  run.succeeded = 0;
  run.vacant = 0;
  // Waiting nodes beyond max_nodes keep waiting, in join order.
  while (run.gathering.size() < run.options.max_nodes && !run.waiting.empty()) {
    auto first = run.waiting.begin();
    run.nodes.at(first->second).role = Role::kGathering;
    run.gathering.emplace(first->first, std::move(first->second));
    run.waiting.erase(first);
  }
  run.min_reached_at.reset();
  SetRunTimer(run, DeadlineKind::kLastCall, std::nullopt);
  if (run.gathering.empty()) {
    SetRunTimer(run, DeadlineKind::kJoinTimeout, std::nullopt);
    return;
  }
  SetRunTimer(run, DeadlineKind::kJoinTimeout, now + run.options.join_timeout);
  if (run.gathering.size() >= run.options.min_nodes) {
    CompleteRound(run, events);
  }
}

void RendezvousState::RemoveNode(Run& run, const std::string& node_id,
                                 ReformReason reason, RdzvTime now,
                                 std::vector<NodeEvent>* events) {
  auto it = run.nodes.find(node_id);
  if (it == run.nodes.end()) return;
  Node& node = it->second;
  switch (node.role) {
    case Role::kParticipant: {
      if (node.succeeded) {
        // Its work is done; the round can still succeed without it.
        if (!node.departed) Depart(run, node);
        return;
      }
      std::string detail =
          reason == ReformReason::kNodeExpired
              ? absl::StrCat("node ", node_id, " on host ", node.info.host,
                             " missed its heartbeats for ", run.options.lease().count(),
                             "ms")
              : absl::StrCat("node ", node_id, " on host ", node.info.host, " left");
      if (reason == ReformReason::kNodeExpired) run.expelled.insert(node_id);
      // Restart scope "replica": the other nodes' workers survive the loss
      // of this one's, as they survive a failed group, while min_nodes stay.
      if (run.options.replica_size > 0 &&
          run.participants.size() - run.vacant - 1 >= run.options.min_nodes) {
        VacateSlot(run, node, detail, events);
        return;
      }
      Forget(run, node_id);
      Reform(run, reason, detail, now, events);
      return;
    }
    case Role::kGathering: {
      run.gathering.erase(node.seq);
      Forget(run, node_id);
      if (run.gathering.empty()) {
        run.min_reached_at.reset();
        SetRunTimer(run, DeadlineKind::kJoinTimeout, std::nullopt);
      }
      if (run.gathering.size() < run.options.min_nodes) {
        SetRunTimer(run, DeadlineKind::kLastCall, std::nullopt);
        // The join timeout has no time left to give: waiting on would have
        // no timer at all.
        if (run.join_deadline_passed && !run.gathering.empty()) {
          TimeOutJoin(run, now, events);
        }
      }
      return;
    }
    case Role::kWaiting:
      run.waiting.erase(node.seq);
      Forget(run, node_id);
      return;
  }
}

void RendezvousState::VacateSlot(Run& run, Node& node, const std::string& detail,
                                 std::vector<NodeEvent>* events) {
  const ParticipantView& slot = (*run.roster)[*node.group_rank];
  const uint32_t size = run.options.replica_size;
  for (uint32_t replica = slot.rank_base / size;
       replica < (slot.rank_base + slot.nproc) / size; ++replica) {
    lost_replica_groups_.push_back({run.id, replica});
    // Whoever takes the slot counts its groups' failures afresh.
    run.replica_failures.erase(replica);
  }
  run.last_failure = detail;
  run.participants[*node.group_rank].clear();
  ++run.vacant;
  ++stats_.nodes_dropped_from_active_round;
  Forget(run, node.info.node_id);
  // A node that waited for room (the round was at max_nodes) gets it now.
  if (!run.waiting.empty() && run.succeeded == 0) {
    auto first = run.waiting.begin();
    Node& next = run.nodes.at(first->second);
    run.waiting.erase(first);
    AdmitIntoActiveRound(run, next, events);
  }
}

std::vector<LostReplicaGroup> RendezvousState::TakeLostReplicaGroups() {
  return std::exchange(lost_replica_groups_, {});
}

void RendezvousState::Depart(Run& run, Node& node) {
  node.departed = true;
  DropLease(run, node);
  run.live_nproc -= node.info.nproc;
}

void RendezvousState::Forget(Run& run, const std::string& node_id) {
  auto it = run.nodes.find(node_id);
  if (it == run.nodes.end()) return;
  if (!it->second.departed) Depart(run, it->second);
  run.nodes.erase(it);
}

void RendezvousState::TimeOutJoin(Run& run, RdzvTime now,
                                  std::vector<NodeEvent>* events) {
  ++stats_.join_timeouts;
  const std::string detail = absl::StrCat(
      "round ", run.round, " of run ", run.id, " gathered ", run.gathering.size(),
      " of the ", run.options.min_nodes, " nodes needed within join_timeout (",
      run.options.join_timeout.count(), "ms)");
  for (const auto& [seq, id] : run.gathering) {
    NodeEvent& event = Emit(events, run.id, id, NodeEvent::Kind::kJoinTimeout, run.round);
    event.detail = detail;
  }
  // Copy: Forget() edits the map being walked.
  std::vector<std::string> ids;
  ids.reserve(run.gathering.size());
  for (const auto& [seq, id] : run.gathering) ids.push_back(id);
  run.gathering.clear();
  for (const std::string& id : ids) Forget(run, id);
  run.min_reached_at.reset();
  SetRunTimer(run, DeadlineKind::kLastCall, std::nullopt);
  SetRunTimer(run, DeadlineKind::kJoinTimeout, std::nullopt);
  // The timed-out nodes were all of it (a gathering round has no waiting
  // nodes while it has room): the run ends, and a relaunch is a new one.
  if (run.live_nproc == 0) CloseRun(run, Outcome::kAborted, detail, now, events);
}

void RendezvousState::CheckAbandoned(Run& run, RdzvTime now) {
  if (run.phase == Phase::kClosed || run.live_nproc > 0) {
    SetRunTimer(run, DeadlineKind::kAbandoned, std::nullopt);
  } else if (!run.abandon_at) {
    SetRunTimer(run, DeadlineKind::kAbandoned, now + run.options.lease());
  }
}

void RendezvousState::CloseRun(Run& run, Outcome outcome, const std::string& reason,
                               RdzvTime now, std::vector<NodeEvent>* events) {
  auto tell = [&](const std::string& id) {
    auto it = run.nodes.find(id);
    if (it == run.nodes.end() || it->second.departed) return;
    NodeEvent& event = Emit(events, run.id, id, NodeEvent::Kind::kClosed, run.round);
    std::tie(event.outcome, event.detail) =
        AsToldTo(run.members[id], run.id, outcome, run.round, reason);
  };
  // Participants by rank, then the rest in join order: a stable order for
  // the adapter and the tests.
  if (run.phase == Phase::kActive) {
    for (const std::string& id : run.participants) tell(id);
  }
  for (const auto& [seq, id] : run.gathering) tell(id);
  for (const auto& [seq, id] : run.waiting) tell(id);

  for (auto& [id, node] : run.nodes) DropLease(run, node);
  SetRunTimer(run, DeadlineKind::kLastCall, std::nullopt);
  SetRunTimer(run, DeadlineKind::kJoinTimeout, std::nullopt);
  SetRunTimer(run, DeadlineKind::kAbandoned, std::nullopt);
  // Told the end; no longer gathering or waiting for anything.
  run.gathering.clear();
  run.waiting.clear();
  run.min_reached_at.reset();
  run.phase = Phase::kClosed;
  run.outcome = outcome;
  run.close_reason = reason;
  run.closed_at = now;
  ++stats_.runs_closed[static_cast<size_t>(outcome)];
}

void RendezvousState::StartIncarnation(Run& run, const RunOptions& options,
                                       uint32_t nproc) {
  run.previous = RunEnd{*run.outcome, run.close_reason, run.round};
  run.previous_members = std::move(run.members);
  run.members.clear();
  run.expelled.clear();
  run.replica_failures.clear();
  for (auto& [id, node] : run.nodes) DropLease(run, node);
  run.nodes.clear();
  run.gathering.clear();
  run.waiting.clear();
  run.participants.clear();
  run.roster.reset();
  run.store_prefix.clear();
  run.world_size = 0;
  run.succeeded = 0;
  run.vacant = 0;
  run.live_nproc = 0;
  run.min_reached_at.reset();
  SetRunTimer(run, DeadlineKind::kLastCall, std::nullopt);
  SetRunTimer(run, DeadlineKind::kJoinTimeout, std::nullopt);
  SetRunTimer(run, DeadlineKind::kAbandoned, std::nullopt);
  run.options = options;
  run.nproc = nproc;
  run.phase = Phase::kGathering;
  // Numbered on, so a round number names one round of one incarnation (an
  // old node's resume can never match a new round).
  ++run.round;
  ++run.epoch;
  run.restart_count = 0;
  run.last_failure.clear();
  run.outcome.reset();
  run.close_reason.clear();
  run.closed_at = {};
}

std::optional<RendezvousState::RunEnd> RendezvousState::EndedRunOf(
    const Run& run, const std::string& node_id) {
  std::optional<RunEnd> end;
  bool took_part = false;
  if (auto it = run.members.find(node_id); it != run.members.end()) {
    if (run.phase != Phase::kClosed) return std::nullopt;
    end = RunEnd{*run.outcome, run.close_reason, run.round};
    took_part = it->second;
  } else if (auto old = run.previous_members.find(node_id);
             run.previous && old != run.previous_members.end()) {
    end = run.previous;
    took_part = old->second;
  } else {
    return std::nullopt;
  }
  // A node that only waited (a scale-up or replacement node, or a second
  // launch under the same id, that came while the run was finishing) ran
  // nothing: it must not report the others' success as its own.
  std::tie(end->outcome, end->reason) =
      AsToldTo(took_part, run.id, end->outcome, end->round, end->reason);
  return end;
}

void RendezvousState::SetLease(Run& run, Node& node, RdzvTime until) {
  DropLease(run, node);
  node.lease_until = until;
  node.leased = true;
  deadlines_.insert(Deadline{until, DeadlineKind::kLease, run.id, node.info.node_id});
}

void RendezvousState::DropLease(Run& run, Node& node) {
  if (!node.leased) return;
  deadlines_.erase(
      Deadline{node.lease_until, DeadlineKind::kLease, run.id, node.info.node_id});
  node.leased = false;
}

void RendezvousState::SetRunTimer(Run& run, DeadlineKind kind,
                                  std::optional<RdzvTime> at) {
  std::optional<RdzvTime>& slot = kind == DeadlineKind::kLastCall ? run.last_call_at
                                  : kind == DeadlineKind::kJoinTimeout
                                      ? run.join_deadline_at
                                      : run.abandon_at;
  // A new join deadline (or none) starts the round's wait over.
  if (kind == DeadlineKind::kJoinTimeout) run.join_deadline_passed = false;
  if (slot == at) return;
  if (slot) deadlines_.erase(Deadline{*slot, kind, run.id, {}});
  slot = at;
  if (slot) deadlines_.insert(Deadline{*slot, kind, run.id, {}});
}

absl::StatusOr<HeartbeatStatus> RendezvousState::Heartbeat(const std::string& run_id,
                                                           const std::string& node_id,
                                                           RdzvTime now) {
  auto it = runs_.find(run_id);
  if (it == runs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown run ", run_id));
  }
  Run& run = *it->second;
  HeartbeatStatus status{run.round, run.restart_count, run.phase == Phase::kClosed};
  if (status.closed) return status;
  if (EndedRunOf(run, node_id)) {
    status.closed = true;  // its incarnation ended; a new one runs now
    return status;
  }
  auto node = run.nodes.find(node_id);
  // A departed node must re-join to be live again, like an expired one.
  if (node == run.nodes.end() || node->second.departed) {
    return absl::NotFoundError(
        absl::StrCat("node ", node_id, " is not enrolled in run ", run_id));
  }
  ++stats_.heartbeats;
  // The lease was last set at the node's last contact.
  const RdzvTime last_contact = node->second.lease_until - run.options.lease();
  if (node->second.leased && now - last_contact > run.options.keep_alive_interval * 3 / 2)
    ++stats_.heartbeats_late;
  SetLease(run, node->second, now + run.options.lease());
  return status;
}

absl::StatusOr<FailureVerdict> RendezvousState::ReportFailure(
    const std::string& run_id, const std::string& node_id, uint64_t round,
    const std::string& detail, RdzvTime now, std::vector<NodeEvent>* events) {
  return OnFailure(run_id, node_id, round, std::nullopt, std::nullopt, detail, now,
                   events);
}

absl::StatusOr<FailureVerdict> RendezvousState::ReportReplicaFailure(
    const std::string& run_id, const std::string& node_id, uint64_t round,
    uint32_t replica, std::optional<uint32_t> incarnation, const std::string& detail,
    RdzvTime now, std::vector<NodeEvent>* events) {
  return OnFailure(run_id, node_id, round, replica, incarnation, detail, now, events);
}

absl::StatusOr<FailureVerdict> RendezvousState::OnFailure(
    const std::string& run_id, const std::string& node_id, uint64_t round,
    std::optional<uint32_t> replica, std::optional<uint32_t> incarnation,
    const std::string& detail, RdzvTime now, std::vector<NodeEvent>* events) {
  std::vector<NodeEvent> scratch;
  if (events == nullptr) events = &scratch;
  auto it = runs_.find(run_id);
  if (it == runs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown run ", run_id));
  }
  Run& run = *it->second;
  Touch(run_id);
  ++stats_.failure_reports;
  if (run.phase == Phase::kClosed) {
    return FailureVerdict{false, run.restart_count};
  }
  if (EndedRunOf(run, node_id)) return FailureVerdict{false, 0};
  auto node_it = run.nodes.find(node_id);
  if (node_it == run.nodes.end()) {
    return absl::NotFoundError(
        absl::StrCat("node ", node_id, " is not enrolled in run ", run_id));
  }
  Node& node = node_it->second;
  // Any message from the node proves it alive.
  if (!node.departed) SetLease(run, node, now + run.options.lease());

  // Only reports of the active round count: a re-form moves the run to a
  // new round, so the other nodes' reports of the same failure are stale by
  // the time they arrive.
  if (run.phase != Phase::kActive || round != run.round ||
      node.role != Role::kParticipant) {
    return FailureVerdict{true, run.restart_count};
  }
  if (replica) {
    const uint32_t size = run.options.replica_size;
    if (size == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("failure.replica: run ", run_id,
                       " restarts the whole job on a failure (restart scope job)"));
    }
    // The node's own groups only: another id would make the step quorum
    // wait for a group that is not restarting (or does not exist).
    const ParticipantView& slot = (*run.roster)[*node.group_rank];
    const uint32_t first = slot.rank_base / size;
    const uint32_t end = (slot.rank_base + slot.nproc) / size;
    if (*replica < first || *replica >= end) {
      return absl::InvalidArgumentError(
          absl::StrCat("failure.replica: ", *replica, " is not one of node ", node_id,
                       "'s replica groups in round ", round, " (", first, "..", end - 1,
                       ": its ranks / replica size ", size, ")"));
    }
    if (incarnation) {
      auto counted = run.replica_failures.find(*replica);
      if (counted != run.replica_failures.end() && *incarnation <= counted->second) {
        return FailureVerdict{true, run.restart_count};  // a retry
      }
      run.replica_failures[*replica] = *incarnation;
    }
  }
  ++run.restart_count;
  run.last_failure = !detail.empty() ? detail
                     : replica
                         ? absl::StrCat("node ", node_id, " on host ", node.info.host,
                                        " reported a failure of replica group ", *replica,
                                        " in round ", round)
                         : absl::StrCat("node ", node_id, " on host ", node.info.host,
                                        " reported a worker failure in round ", round);
  const std::string reason = run.last_failure;
  if (run.restart_count > run.options.max_restarts) {
    const uint32_t restart_count = run.restart_count;
    CloseRun(run, Outcome::kFailed, reason, now, events);
    return FailureVerdict{false, restart_count, /*counted=*/true};
  }
  if (replica) {
    // The group restarts alone; the others train on.
    ++stats_.replica_restarts;
  } else {
    Reform(run, ReformReason::kWorkerFailure, reason, now, events);
  }
  return FailureVerdict{true, run.restart_count, /*counted=*/true};
}

absl::Status RendezvousState::ReportSuccess(const std::string& run_id,
                                            const std::string& node_id, uint64_t round,
                                            RdzvTime now,
                                            std::vector<NodeEvent>* events) {
  std::vector<NodeEvent> scratch;
  if (events == nullptr) events = &scratch;
  auto it = runs_.find(run_id);
  if (it == runs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown run ", run_id));
  }
  Run& run = *it->second;
  if (run.phase == Phase::kClosed || EndedRunOf(run, node_id)) return absl::OkStatus();
  Touch(run_id);
  auto node_it = run.nodes.find(node_id);
  if (node_it == run.nodes.end()) {
    return absl::NotFoundError(
        absl::StrCat("node ", node_id, " is not enrolled in run ", run_id));
  }
  Node& node = node_it->second;
  if (!node.departed) SetLease(run, node, now + run.options.lease());
  // A report for a round that has since re-formed is stale: those workers
  // are being restarted anyway.
  if (run.phase != Phase::kActive || round != run.round ||
      node.role != Role::kParticipant || node.succeeded) {
    return absl::OkStatus();
  }
  node.succeeded = true;
  // (A slot whose node was lost has nothing left to succeed.)
  if (++run.succeeded + run.vacant == run.participants.size()) {
    CloseRun(run, Outcome::kSucceeded,
             absl::StrCat("all ", run.succeeded, " nodes succeeded in round ", run.round),
             now, events);
  }
  return absl::OkStatus();
}

absl::Status RendezvousState::Leave(const std::string& run_id, const std::string& node_id,
                                    RdzvTime now, std::vector<NodeEvent>* events) {
  std::vector<NodeEvent> scratch;
  if (events == nullptr) events = &scratch;
  auto it = runs_.find(run_id);
  if (it == runs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown run ", run_id));
  }
  Run& run = *it->second;
  if (EndedRunOf(run, node_id)) return absl::OkStatus();
  if (run.nodes.find(node_id) == run.nodes.end()) {
    return absl::NotFoundError(
        absl::StrCat("node ", node_id, " is not enrolled in run ", run_id));
  }
  // A closed run is a record; departures no longer change it.
  if (run.phase == Phase::kClosed) return absl::OkStatus();
  Touch(run_id);
  RemoveNode(run, node_id, ReformReason::kNodeLeft, now, events);
  CheckAbandoned(run, now);
  return absl::OkStatus();
}

absl::Status RendezvousState::Close(const std::string& run_id, Outcome outcome,
                                    const std::string& reason, RdzvTime now,
                                    std::vector<NodeEvent>* events) {
  std::vector<NodeEvent> scratch;
  if (events == nullptr) events = &scratch;
  auto it = runs_.find(run_id);
  if (it == runs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown run ", run_id));
  }
  Run& run = *it->second;
  // Idempotent: the first outcome stands.
  if (run.phase == Phase::kClosed) return absl::OkStatus();
  Touch(run_id);
  CloseRun(run, outcome, reason, now, events);
  return absl::OkStatus();
}

void RendezvousState::Tick(RdzvTime now, std::vector<NodeEvent>* events) {
  std::vector<NodeEvent> scratch;
  if (events == nullptr) events = &scratch;
  // Handlers add and remove timers, so re-read the front every time.
  while (!deadlines_.empty() && deadlines_.begin()->at <= now) {
    Deadline due = std::move(deadlines_.extract(deadlines_.begin()).value());
    auto run_it = runs_.find(due.run_id);
    if (run_it == runs_.end()) continue;
    Run& run = *run_it->second;
    Touch(due.run_id);
    switch (due.kind) {
      case DeadlineKind::kLease: {
        auto node = run.nodes.find(due.node_id);
        if (node == run.nodes.end()) break;
        node->second.leased = false;
        ++stats_.leases_expired;
        RemoveNode(run, due.node_id, ReformReason::kNodeExpired, now, events);
        CheckAbandoned(run, now);
        break;
      }
      case DeadlineKind::kLastCall:
        run.last_call_at.reset();
        if (run.phase == Phase::kGathering &&
            run.gathering.size() >= run.options.min_nodes) {
          CompleteRound(run, events);
        }
        break;
      case DeadlineKind::kJoinTimeout:
        run.join_deadline_at.reset();
        if (run.phase != Phase::kGathering || run.gathering.empty()) break;
        if (run.gathering.size() < run.options.min_nodes) {
          TimeOutJoin(run, now, events);
        } else {
          // Min nodes are in and the last call will complete the round,
          // unless some leave first (see RemoveNode).
          run.join_deadline_passed = true;
        }
        break;
      case DeadlineKind::kAbandoned:
        run.abandon_at.reset();
        if (run.phase != Phase::kClosed && run.live_nproc == 0) {
          CloseRun(run, Outcome::kAborted,
                   absl::StrCat("no live node for ", run.options.lease().count(),
                                "ms: every node left or expired"),
                   now, events);
        }
        break;
    }
  }
}

std::optional<RdzvTime> RendezvousState::NextDeadline() const {
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->at;
}

absl::Status RendezvousState::CheckAdmission(const std::string& run_id, uint32_t rank,
                                             uint64_t admission) const {
  auto it = runs_.find(run_id);
  if (it == runs_.end()) return absl::NotFoundError(absl::StrCat("unknown run ", run_id));
  if (admission == 0) return absl::OkStatus();
  const Run& run = *it->second;
  auto stale = [&](const std::string& why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "admission epoch ", admission, " of rank ", rank, " is stale: ", why));
  };
  if (run.phase != Phase::kActive) {
    return stale(absl::StrCat("run ", run_id, " is not running a round"));
  }
  if (rank >= run.world_size) {
    return stale(
        absl::StrCat("round ", run.round, "'s world has ", run.world_size, " ranks"));
  }
  // Slots hold ascending ranks by group rank.
  const auto& roster = *run.roster;
  auto slot = std::upper_bound(
      roster.begin(), roster.end(), rank,
      [](uint32_t r, const ParticipantView& p) { return r < p.rank_base; });
  const auto group_rank = static_cast<size_t>(slot - roster.begin()) - 1;
  const std::string& holder = run.participants[group_rank];
  if (holder.empty()) {
    return stale(absl::StrCat("its slot (group rank ", group_rank,
                              ") was vacated: its node was lost"));
  }
  auto node = run.nodes.find(holder);
  if (node != run.nodes.end() && node->second.admission != 0 &&
      node->second.admission != admission) {
    return stale(absl::StrCat("its slot (group rank ", group_rank, ") is node ", holder,
                              "'s since admission ", node->second.admission));
  }
  return absl::OkStatus();
}

std::optional<RunSummary> RendezvousState::Summary(const std::string& run_id) const {
  auto it = runs_.find(run_id);
  if (it == runs_.end()) return std::nullopt;
  const Run& run = *it->second;
  RunSummary summary;
  summary.run_id = run.id;
  summary.round = run.round;
  summary.round_active = run.phase == Phase::kActive;
  summary.restart_count = run.restart_count;
  if (run.roster) summary.participants = *run.roster;
  // While gathering, every enrolled node is waiting for the round.
  summary.waiting.reserve(run.gathering.size() + run.waiting.size());
  for (const auto& [seq, id] : run.gathering) summary.waiting.push_back(id);
  for (const auto& [seq, id] : run.waiting) summary.waiting.push_back(id);
  summary.outcome = run.outcome;
  summary.last_failure = run.last_failure;
  return summary;
}

bool RendezvousState::IsClosed(const std::string& run_id) const {
  auto it = runs_.find(run_id);
  return it != runs_.end() && it->second->phase == Phase::kClosed;
}

bool RendezvousState::HasNode(const std::string& run_id,
                              const std::string& node_id) const {
  auto it = runs_.find(run_id);
  return it != runs_.end() && it->second->nodes.count(node_id) > 0;
}

std::vector<RunStatusRecord> RendezvousState::Status(RdzvTime now,
                                                     const std::string& run_id) const {
  std::vector<RunStatusRecord> out;
  if (!run_id.empty()) {
    auto it = runs_.find(run_id);
    if (it != runs_.end()) out.push_back(StatusOf(*it->second, now));
    return out;
  }
  out.reserve(runs_.size());
  for (const auto& [id, run] : runs_) out.push_back(StatusOf(*run, now));
  return out;
}

RunStatusRecord RendezvousState::StatusOf(const Run& run, RdzvTime now) const {
  RunStatusRecord out;
  out.run_id = run.id;
  // A run with no live node is not gathering anything: it ends (aborted)
  // when its abandon timer runs out, unless a node joins.
  out.state = run.phase == Phase::kClosed      ? "closed"
              : run.live_nproc == 0            ? "abandoned"
              : run.phase == Phase::kGathering ? "gathering"
                                               : "active";
  if (run.outcome) out.outcome = ToString(*run.outcome);
  out.closed_reason = run.close_reason;
  out.round = run.round;
  out.restart_count = run.restart_count;
  out.max_restarts = run.options.max_restarts;
  out.min_nodes = run.options.min_nodes;
  out.max_nodes = run.options.max_nodes;
  out.world_size = run.world_size;
  auto describe = [&](const Node& node) {
    NodeStatusRecord record;
    record.node_id = node.info.node_id;
    record.host = node.info.host;
    record.nproc = node.info.nproc;
    record.heartbeat_age_ms =
        std::chrono::duration_cast<Millis>(now - (node.lease_until - run.options.lease()))
            .count();
    switch (node.role) {
      case Role::kGathering:
        record.state = "gathering";
        break;
      case Role::kWaiting:
        record.state = "waiting";
        break;
      case Role::kParticipant:
        record.state = node.departed    ? "departed"
                       : node.succeeded ? "succeeded"
                                        : "participant";
        break;
    }
    return record;
  };
  // Participants of the round (also of the last one, once closed).
  if (run.roster && (run.phase == Phase::kActive || run.phase == Phase::kClosed)) {
    for (const ParticipantView& p : *run.roster) {
      auto it = run.nodes.find(p.node_id);
      if (it == run.nodes.end()) continue;
      NodeStatusRecord record = describe(it->second);
      record.group_rank = static_cast<int32_t>(p.group_rank);
      record.rank_base = p.rank_base;
      out.nodes.push_back(std::move(record));
    }
  }
  for (const auto& [seq, id] : run.gathering)
    out.nodes.push_back(describe(run.nodes.at(id)));
  for (const auto& [seq, id] : run.waiting)
    out.nodes.push_back(describe(run.nodes.at(id)));
  return out;
}

std::vector<std::string> RendezvousState::RunIds() const {
  std::vector<std::string> ids;
  ids.reserve(runs_.size());
  for (const auto& [id, run] : runs_) ids.push_back(id);
  return ids;
}

std::map<std::string, std::string> RendezvousState::LiveStorePrefixes() const {
  std::map<std::string, std::string> prefixes;
  for (const auto& [id, run] : runs_) {
    if (run->phase != Phase::kClosed && !run->store_prefix.empty())
      prefixes.emplace(id, run->store_prefix);
  }
  return prefixes;
}

std::vector<std::string> RendezvousState::ForgetClosedBefore(RdzvTime cutoff) {
  std::vector<std::string> forgotten;
  for (auto it = runs_.begin(); it != runs_.end();) {
    if (it->second->phase == Phase::kClosed && it->second->closed_at < cutoff) {
      forgotten.push_back(it->first);
      Touch(it->first);
      it = runs_.erase(it);
    } else {
      ++it;
    }
  }
  return forgotten;
}

std::vector<std::string> RendezvousState::TakeChangedRuns() {
  std::vector<std::string> ids(changed_.begin(), changed_.end());
  changed_.clear();
  return ids;
}

void RendezvousState::RemoveRun(const std::string& run_id) {
  auto it = runs_.find(run_id);
  if (it == runs_.end()) return;
  Run& run = *it->second;
  for (auto& [id, node] : run.nodes) DropLease(run, node);
  SetRunTimer(run, DeadlineKind::kLastCall, std::nullopt);
  SetRunTimer(run, DeadlineKind::kJoinTimeout, std::nullopt);
  SetRunTimer(run, DeadlineKind::kAbandoned, std::nullopt);
  runs_.erase(it);
}

namespace {
// Bumped when the layout changes; a daemon refuses state it cannot read.
// 2 added the epoch, incarnations, the abandon timer and the passed join
// deadline; format 1 still reads (as a first incarnation).
// 3 added the counted replica failures (restart scope "replica").
// 4 added the restart scope's replica size (earlier formats: scope "job").
// 5 added the nodes' admission epochs.
constexpr uint32_t kRunFormat = 5;

void WriteRemaining(codec::ByteWriter& w, const std::optional<RdzvTime>& at,
                    RdzvTime now) {
  w.U8(at ? 1 : 0);
  w.I64(at ? std::chrono::duration_cast<Millis>(*at - now).count() : 0);
}

std::optional<RdzvTime> ReadRemaining(codec::ByteReader& r, RdzvTime now) {
  const bool set = r.U8() != 0;
  const int64_t ms = r.I64();
  if (!set) return std::nullopt;
  return now + Millis(ms);
}
}  // namespace

std::optional<std::string> RendezvousState::EncodeRun(const std::string& run_id,
                                                      RdzvTime now) const {
  auto it = runs_.find(run_id);
  if (it == runs_.end()) return std::nullopt;
  const Run& run = *it->second;
  codec::ByteWriter w;
  w.U32(kRunFormat);
  w.Str(run.id);
  const RunOptions& o = run.options;
  w.U32(o.min_nodes);
  w.U32(o.max_nodes);
  w.U32(o.max_restarts);
  w.I64(o.last_call_timeout.count());
  w.I64(o.join_timeout.count());
  w.I64(o.keep_alive_interval.count());
  w.U32(o.keep_alive_max_attempt);
  w.U8(o.uniform_nproc ? 1 : 0);
  w.U32(run.nproc);
  w.U8(static_cast<uint8_t>(run.phase));
  w.U64(run.round);
  w.U32(run.restart_count);
  w.Str(run.last_failure);
  w.Str(run.close_reason);
  w.U8(run.outcome ? static_cast<uint8_t>(*run.outcome) + 1 : 0);
  w.U64(run.next_seq);
  w.U32(static_cast<uint32_t>(run.nodes.size()));
  for (const auto& [id, node] : run.nodes) {
    w.Str(node.info.node_id);
    w.Str(node.info.host);
    w.U32(node.info.nproc);
    w.I64(node.info.node_rank_hint);
    w.U32(node.info.master_port);
    w.U64(node.seq);
    w.U8(static_cast<uint8_t>(node.role));
    w.U8(node.group_rank ? 1 : 0);
    w.U32(node.group_rank.value_or(0));
    w.U8(node.succeeded ? 1 : 0);
    w.U8(node.departed ? 1 : 0);
  }
  w.U32(static_cast<uint32_t>(run.participants.size()));
  for (const std::string& id : run.participants) w.Str(id);
  const uint32_t roster_size = run.roster ? static_cast<uint32_t>(run.roster->size()) : 0;
  w.U8(run.roster ? 1 : 0);
  w.U32(roster_size);
  if (run.roster) {
    for (const ParticipantView& p : *run.roster) {
      w.Str(p.node_id);
      w.Str(p.host);
      w.U32(p.group_rank);
      w.U32(p.nproc);
      w.U32(p.rank_base);
      w.U32(p.master_port);
    }
  }
  w.Str(run.store_prefix);
  w.U32(run.world_size);
  w.U32(run.succeeded);
  WriteRemaining(w, run.min_reached_at, now);
  WriteRemaining(w, run.last_call_at, now);
  WriteRemaining(w, run.join_deadline_at, now);
  // Format 2.
  w.U64(run.epoch);
  w.U64(run.round_epoch);
  w.U8(run.join_deadline_passed ? 1 : 0);
  WriteRemaining(w, run.abandon_at, now);
  auto members = [&w](const std::map<std::string, bool>& ids) {
    w.U32(static_cast<uint32_t>(ids.size()));
    for (const auto& [id, took_part] : ids) {
      w.Str(id);
      w.U8(took_part ? 1 : 0);
    }
  };
  members(run.members);
  w.U8(run.previous ? static_cast<uint8_t>(run.previous->outcome) + 1 : 0);
  if (run.previous) {
    w.Str(run.previous->reason);
    w.U64(run.previous->round);
    members(run.previous_members);
  }
  w.U32(static_cast<uint32_t>(run.expelled.size()));
  for (const std::string& id : run.expelled) w.Str(id);
  // Format 3.
  w.U32(static_cast<uint32_t>(run.replica_failures.size()));
  for (const auto& [replica, incarnation] : run.replica_failures) {
    w.U32(replica);
    w.U32(incarnation);
  }
  // Format 4.
  w.U32(o.replica_size);
  // Format 5.
  uint32_t admitted = 0;
  for (const auto& [id, node] : run.nodes) admitted += node.admission != 0;
  w.U32(admitted);
  for (const auto& [id, node] : run.nodes) {
    if (node.admission == 0) continue;
    w.Str(id);
    w.U64(node.admission);
  }
  return w.Take();
}

absl::Status RendezvousState::RestoreRun(std::string_view bytes, RdzvTime now) {
  codec::ByteReader r(bytes);
  auto damaged = [](const std::string& why) {
    return absl::DataLossError("damaged run record: " + why);
  };
  const uint32_t format = r.U32();
  if (format < 1 || format > kRunFormat) {
    return damaged(
        absl::StrCat("format ", format, ", this daemon reads 1 to ", kRunFormat));
  }
  auto run = std::make_unique<Run>();
  run->id = r.Str();
  RunOptions& o = run->options;
  o.min_nodes = r.U32();
  o.max_nodes = r.U32();
  o.max_restarts = r.U32();
  o.last_call_timeout = Millis(r.I64());
  o.join_timeout = Millis(r.I64());
  o.keep_alive_interval = Millis(r.I64());
  o.keep_alive_max_attempt = r.U32();
  o.uniform_nproc = r.U8() != 0;
  run->nproc = r.U32();
  const uint8_t phase = r.U8();
  if (phase > static_cast<uint8_t>(Phase::kClosed)) return damaged("bad phase");
  run->phase = static_cast<Phase>(phase);
  run->round = r.U64();
  run->restart_count = r.U32();
  run->last_failure = r.Str();
  run->close_reason = r.Str();
  const uint8_t outcome = r.U8();
  if (outcome > static_cast<uint8_t>(Outcome::kAborted) + 1)
    return damaged("bad outcome");
  if (outcome != 0) run->outcome = static_cast<Outcome>(outcome - 1);
  run->next_seq = r.U64();
  const uint32_t num_nodes = r.U32();
  for (uint32_t i = 0; i < num_nodes && r.ok(); ++i) {
    Node node;
    node.info.node_id = r.Str();
    node.info.host = r.Str();
    node.info.nproc = r.U32();
    node.info.node_rank_hint = static_cast<int32_t>(r.I64());
    node.info.master_port = r.U32();
    node.seq = r.U64();
    const uint8_t role = r.U8();
    if (role > static_cast<uint8_t>(Role::kParticipant)) return damaged("bad role");
    node.role = static_cast<Role>(role);
    const bool has_rank = r.U8() != 0;
    const uint32_t rank = r.U32();
    if (has_rank) node.group_rank = rank;
    node.succeeded = r.U8() != 0;
    node.departed = r.U8() != 0;
    std::string id = node.info.node_id;
    run->nodes.emplace(std::move(id), std::move(node));
  }
  const uint32_t num_participants = r.U32();
  for (uint32_t i = 0; i < num_participants && r.ok(); ++i) {
    run->participants.push_back(r.Str());
  }
  const bool has_roster = r.U8() != 0;
  const uint32_t roster_size = r.U32();
  if (has_roster) {
    auto roster = std::make_shared<std::vector<ParticipantView>>();
    for (uint32_t i = 0; i < roster_size && r.ok(); ++i) {
      ParticipantView p;
      p.node_id = r.Str();
      p.host = r.Str();
      p.group_rank = r.U32();
      p.nproc = r.U32();
      p.rank_base = r.U32();
      p.master_port = r.U32();
      roster->push_back(std::move(p));
    }
    run->roster = std::move(roster);
  }
  run->store_prefix = r.Str();
  run->world_size = r.U32();
  run->succeeded = r.U32();
  run->min_reached_at = ReadRemaining(r, now);
  const std::optional<RdzvTime> last_call = ReadRemaining(r, now);
  const std::optional<RdzvTime> join_deadline = ReadRemaining(r, now);
  std::optional<RdzvTime> abandon_at;
  if (format >= 2) {
    run->epoch = r.U64();
    run->round_epoch = r.U64();
    run->join_deadline_passed = r.U8() != 0;
    abandon_at = ReadRemaining(r, now);
    auto members = [&r](std::map<std::string, bool>* ids) {
      const uint32_t n = r.U32();
      for (uint32_t i = 0; i < n && r.ok(); ++i) {
        std::string id = r.Str();
        (*ids)[std::move(id)] = r.U8() != 0;
      }
    };
    members(&run->members);
    const uint8_t previous = r.U8();
    if (previous > static_cast<uint8_t>(Outcome::kAborted) + 1)
      return damaged("bad previous outcome");
    if (previous != 0) {
      RunEnd& end = run->previous.emplace();
      end.outcome = static_cast<Outcome>(previous - 1);
      end.reason = r.Str();
      end.round = r.U64();
      members(&run->previous_members);
    }
    const uint32_t expelled = r.U32();
    for (uint32_t i = 0; i < expelled && r.ok(); ++i) run->expelled.insert(r.Str());
    if (format >= 3) {
      const uint32_t replicas = r.U32();
      for (uint32_t i = 0; i < replicas && r.ok(); ++i) {
        const uint32_t replica = r.U32();
        run->replica_failures[replica] = r.U32();
      }
    }
    if (format >= 4) o.replica_size = r.U32();
    if (format >= 5) {
      const uint32_t admitted = r.U32();
      for (uint32_t i = 0; i < admitted && r.ok(); ++i) {
        const std::string id = r.Str();
        const uint64_t admission = r.U64();
        auto node = run->nodes.find(id);
        if (node == run->nodes.end()) return damaged("admission of an unknown node");
        node->second.admission = admission;
      }
    }
  } else {
    // Format 1 kept no members apart from the nodes.
    for (const auto& [id, node] : run->nodes)
      run->members.emplace(id, node.group_rank.has_value());
    run->round_epoch = run->epoch;
  }
  if (!r.ok() || !r.done()) return damaged("truncated or overlong");
  // Rounds formed after this restore must not reuse a prefix that a round
  // lost in the crash may have used (see the header).
  ++run->epoch;
  // Cross-checks, so a bad record cannot make later calls index out of range.
  if (run->phase == Phase::kActive &&
      (!run->roster || run->roster->size() != run->participants.size() ||
       run->participants.empty())) {
    return damaged(absl::StrCat("run ", run->id, " is active without a roster"));
  }
  if (run->phase == Phase::kClosed && !run->outcome) {
    return damaged(absl::StrCat("run ", run->id, " is closed without an outcome"));
  }
  for (const std::string& id : run->participants) {
    auto node = run->nodes.find(id);
    if (node != run->nodes.end() &&
        (!node->second.group_rank || *node->second.group_rank >= num_participants)) {
      return damaged(absl::StrCat("participant ", id, " has no valid rank"));
    }
    if (run->phase == Phase::kActive && id.empty()) ++run->vacant;
  }
  if (run->phase == Phase::kActive && run->succeeded + run->vacant > num_participants) {
    return damaged(
        absl::StrCat("run ", run->id, " has more successes than participants"));
  }

  RemoveRun(run->id);
  Run& restored = *runs_.emplace(run->id, std::move(run)).first->second;
  if (restored.phase == Phase::kClosed) restored.closed_at = now;
  for (auto& [id, node] : restored.nodes) {
    if (node.role == Role::kGathering) restored.gathering.emplace(node.seq, id);
    if (node.role == Role::kWaiting) restored.waiting.emplace(node.seq, id);
    if (node.departed) continue;
    restored.live_nproc += node.info.nproc;
    if (restored.phase != Phase::kClosed) {
      SetLease(restored, node, now + restored.options.lease());
    }
  }
  if (restored.phase == Phase::kGathering) {
    const bool passed = restored.join_deadline_passed;
    SetRunTimer(restored, DeadlineKind::kLastCall, last_call);
    SetRunTimer(restored, DeadlineKind::kJoinTimeout, join_deadline);
    restored.join_deadline_passed = passed;
  }
  if (restored.phase != Phase::kClosed) {
    SetRunTimer(restored, DeadlineKind::kAbandoned, abandon_at);
    CheckAbandoned(restored, now);
  }
  return absl::OkStatus();
}

}  // namespace meshrun::rdzv
