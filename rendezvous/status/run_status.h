#pragma once

// A snapshot of every run the daemon knows, as plain data: what the status
// page (/api/status), `meshrun status` and its --json show. Built by the
// daemon under its lock, rendered anywhere (status_render.h); the gRPC Status
// RPC carries the same fields (status_proto.h).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace meshrun::rdzv {

struct WorkerExitRecord {
  uint32_t local_rank = 0;
  uint32_t global_rank = 0;
  int32_t exit_code = 0;  // -1 when killed by a signal
  int32_t signal = 0;     // 0: exited normally
  int64_t time_unix_ms = 0;

  bool failed() const { return signal != 0 || exit_code != 0; }
};

// The worker that failed first, as its agent reported it.
struct FailureCauseRecord {
  WorkerExitRecord exit;
  std::string message;    // from TORCHELASTIC_ERROR_FILE, may be empty
  std::string traceback;  // its last lines, may be empty
};

struct FailureStatusRecord {
  uint64_t round = 0;
  std::string node_id;
  std::string host;
  // Unset when the agent sent only the text (older agents).
  std::optional<FailureCauseRecord> cause;
  std::string detail;  // the agent's full summary
};

struct NodeStatusRecord {
  std::string node_id;
  std::string host;
  // participant, gathering, waiting, succeeded, departed, unhealthy
  std::string state;
  int32_t group_rank = -1;  // -1 unless a participant of the round
  uint32_t nproc = 0;
  uint32_t rank_base = 0;
  int64_t heartbeat_age_ms = 0;
  std::string health;  // unhealthy: which check failed, how (HealthFailure::Summary)
};

struct NodeExitsRecord {
  std::string node_id;
  std::string host;
  uint64_t round = 0;
  std::vector<WorkerExitRecord> exits;
};

// A fault-tolerant replica group's lag at the step quorum
// (rendezvous/core/straggler_tracker.h).
struct ReplicaLagRecord {
  uint32_t replica = 0;
  double mean_lag_ms = 0;  // behind the first group, over its last 100 quorums
  double last_lag_ms = 0;
  uint64_t quorums = 0;
  uint64_t slowest = 0;  // quorums it was the last to reach
};

// A rank whose reported step time is well above its run's median
// (rendezvous/core/step_times.h).
struct SlowRankRecord {
  uint32_t rank = 0;
  std::string node_id;
  std::string host;
  double mean_seconds = 0;
  double times_median = 0;
  uint64_t steps = 0;
};

struct RunStatusRecord {
  std::string run_id;
  std::string state;    // gathering, active, abandoned (no live node), closed
  std::string outcome;  // succeeded, failed, aborted; empty while open
  std::string closed_reason;
  uint64_t round = 0;
  uint32_t restart_count = 0;
  uint32_t max_restarts = 0;
  uint32_t min_nodes = 0;
  uint32_t max_nodes = 0;
  uint32_t world_size = 0;
  // Participants by group rank, then the others in join order.
  std::vector<NodeStatusRecord> nodes;
  std::optional<FailureStatusRecord> last_failure;
  std::vector<NodeExitsRecord> worker_exits;
  // --restart-scope=replica: the slowest replica groups, slowest first.
  std::vector<ReplicaLagRecord> stragglers;
  // Jobs whose workers report step times: the slow ranks, slowest first.
  std::vector<SlowRankRecord> slow_ranks;
};

// A daemon replica on etcd (--etcd-endpoints): where its state is kept.
struct EtcdStatusRecord {
  uint64_t leader_term = 0;  // the leadership term this daemon leads in
  // etcd answers its lease keep-alives and state writes. While it does not,
  // the runs keep their round, but nothing is acknowledged that needs a
  // write (new rounds, store writes) until it is back.
  bool reachable = true;
  std::string member;  // the member it talks to
};

struct StatusSnapshot {
  int64_t now_unix_ms = 0;
  // The daemon's build (build_info.h); empty: not shown.
  std::string version;
  std::string commit;
  std::vector<RunStatusRecord> runs;     // by run id
  std::optional<EtcdStatusRecord> etcd;  // unset: not a replica on etcd
};

}  // namespace meshrun::rdzv
