#include "rendezvous/status/status_proto.h"

namespace meshrun::rdzv {

namespace v1 = meshrun::v1;

v1::WorkerExit ToProto(const WorkerExitRecord& exit) {
  v1::WorkerExit out;
  out.set_local_rank(exit.local_rank);
  out.set_global_rank(exit.global_rank);
  out.set_exit_code(exit.exit_code);
  out.set_signal(exit.signal);
  out.set_time_unix_ms(exit.time_unix_ms);
  return out;
}

WorkerExitRecord FromProto(const v1::WorkerExit& exit) {
  WorkerExitRecord out;
  out.local_rank = exit.local_rank();
  out.global_rank = exit.global_rank();
  out.exit_code = exit.exit_code();
  out.signal = exit.signal();
  out.time_unix_ms = exit.time_unix_ms();
  return out;
}

FailureCauseRecord FromProto(const v1::FailureCause& cause) {
  FailureCauseRecord out;
  out.exit = FromProto(cause.exit());
  out.message = cause.message();
  out.traceback = cause.traceback();
  return out;
}

v1::StatusReply ToProto(const StatusSnapshot& snapshot) {
  v1::StatusReply reply;
  reply.set_now_unix_ms(snapshot.now_unix_ms);
  if (snapshot.etcd) {
    v1::EtcdStatus* etcd = reply.mutable_etcd();
    etcd->set_leader_term(snapshot.etcd->leader_term);
    etcd->set_reachable(snapshot.etcd->reachable);
    etcd->set_member(snapshot.etcd->member);
  }
  for (const RunStatusRecord& run : snapshot.runs) {
    v1::RunStatus* r = reply.add_runs();
    r->set_run_id(run.run_id);
    r->set_state(run.state);
    r->set_outcome(run.outcome);
    r->set_closed_reason(run.closed_reason);
    r->set_round(run.round);
    r->set_restart_count(run.restart_count);
    r->set_max_restarts(run.max_restarts);
    r->set_min_nodes(run.min_nodes);
    r->set_max_nodes(run.max_nodes);
    r->set_world_size(run.world_size);
    for (const NodeStatusRecord& node : run.nodes) {
      v1::NodeStatus* n = r->add_nodes();
      n->set_node_id(node.node_id);
      n->set_host(node.host);
      n->set_state(node.state);
      n->set_group_rank(node.group_rank);
      n->set_nproc(node.nproc);
      n->set_rank_base(node.rank_base);
      n->set_heartbeat_age_ms(node.heartbeat_age_ms);
      n->set_health(node.health);
    }
    if (run.last_failure) {
      const FailureStatusRecord& failure = *run.last_failure;
      v1::FailureStatus* f = r->mutable_last_failure();
      f->set_round(failure.round);
      f->set_node_id(failure.node_id);
      f->set_host(failure.host);
      f->set_detail(failure.detail);
      if (failure.cause) {
        *f->mutable_cause()->mutable_exit() = ToProto(failure.cause->exit);
        f->mutable_cause()->set_message(failure.cause->message);
        f->mutable_cause()->set_traceback(failure.cause->traceback);
        f->mutable_cause()->set_host(failure.host);
      }
    }
    for (const NodeExitsRecord& node : run.worker_exits) {
      v1::NodeExits* e = r->add_worker_exits();
      e->set_node_id(node.node_id);
      e->set_host(node.host);
      e->set_round(node.round);
      for (const WorkerExitRecord& exit : node.exits) *e->add_exits() = ToProto(exit);
    }
    for (const SlowRankRecord& slow : run.slow_ranks) {
      v1::SlowRankStatus* s = r->add_slow_ranks();
      s->set_rank(slow.rank);
      s->set_node_id(slow.node_id);
      s->set_host(slow.host);
      s->set_mean_seconds(slow.mean_seconds);
      s->set_times_median(slow.times_median);
      s->set_steps(slow.steps);
    }
    for (const ReplicaLagRecord& lag : run.stragglers) {
      v1::ReplicaLag* l = r->add_stragglers();
      l->set_replica(lag.replica);
      l->set_mean_lag_ms(lag.mean_lag_ms);
      l->set_last_lag_ms(lag.last_lag_ms);
      l->set_quorums(lag.quorums);
      l->set_slowest(lag.slowest);
    }
  }
  return reply;
}

StatusSnapshot FromProto(const v1::StatusReply& reply) {
  StatusSnapshot snapshot;
  snapshot.now_unix_ms = reply.now_unix_ms();
  if (reply.has_etcd()) {
    snapshot.etcd = EtcdStatusRecord{reply.etcd().leader_term(), reply.etcd().reachable(),
                                     reply.etcd().member()};
  }
  for (const v1::RunStatus& r : reply.runs()) {
    RunStatusRecord& run = snapshot.runs.emplace_back();
    run.run_id = r.run_id();
    run.state = r.state();
    run.outcome = r.outcome();
    run.closed_reason = r.closed_reason();
    run.round = r.round();
    run.restart_count = r.restart_count();
    run.max_restarts = r.max_restarts();
    run.min_nodes = r.min_nodes();
    run.max_nodes = r.max_nodes();
    run.world_size = r.world_size();
    for (const v1::NodeStatus& n : r.nodes()) {
      NodeStatusRecord& node = run.nodes.emplace_back();
      node.node_id = n.node_id();
      node.host = n.host();
      node.state = n.state();
      node.group_rank = n.group_rank();
      node.nproc = n.nproc();
      node.rank_base = n.rank_base();
      node.heartbeat_age_ms = n.heartbeat_age_ms();
      node.health = n.health();
    }
    if (r.has_last_failure()) {
      const v1::FailureStatus& f = r.last_failure();
      FailureStatusRecord& failure = run.last_failure.emplace();
      failure.round = f.round();
      failure.node_id = f.node_id();
      failure.host = f.host();
      failure.detail = f.detail();
      if (f.has_cause()) failure.cause = FromProto(f.cause());
    }
    for (const v1::NodeExits& e : r.worker_exits()) {
      NodeExitsRecord& node = run.worker_exits.emplace_back();
      node.node_id = e.node_id();
      node.host = e.host();
      node.round = e.round();
      for (const v1::WorkerExit& exit : e.exits()) node.exits.push_back(FromProto(exit));
    }
    for (const v1::SlowRankStatus& s : r.slow_ranks()) {
      run.slow_ranks.push_back({s.rank(), s.node_id(), s.host(), s.mean_seconds(),
                                s.times_median(), s.steps()});
    }
    for (const v1::ReplicaLag& l : r.stragglers()) {
      run.stragglers.push_back(
          {l.replica(), l.mean_lag_ms(), l.last_lag_ms(), l.quorums(), l.slowest()});
    }
  }
  return snapshot;
}

}  // namespace meshrun::rdzv
