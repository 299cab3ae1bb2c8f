#include "rendezvous/core/request_validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace meshrun::rdzv {

namespace v1 = meshrun::v1;

namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status MaxBytes(absl::string_view field, size_t size, size_t limit) {
  if (size <= limit) return absl::OkStatus();
  return Invalid(field, absl::StrCat(size, " bytes exceeds the limit of ", limit));
}

// Printable ASCII without spaces; names the first offending byte.
absl::Status Printable(absl::string_view field, absl::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return Invalid(field, absl::StrFormat("byte 0x%02x at offset %d is not allowed "
                                            "(printable ASCII without spaces only)",
                                            c, i));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status AtMost(absl::string_view field, T value, T limit) {
  if (value <= limit) return absl::OkStatus();
  return Invalid(field, absl::StrCat(value, " is above ", limit));
}

// Text meant for people (tracebacks, reasons): any bytes, bounded length.
absl::Status Text(absl::string_view field, const std::string& text,
                  const RequestLimits& limits) {
  return MaxBytes(field, text.size(), limits.max_text_bytes);
}

absl::Status Keys(absl::string_view field,
                  const google::protobuf::RepeatedPtrField<std::string>& keys,
                  const RequestLimits& limits) {
  // No minimum: c10d calls wait/check with empty lists, answered at once.
  return AtMost(field, static_cast<size_t>(keys.size()), limits.max_keys_per_request);
}

absl::Status RunAndNode(absl::string_view kind, const std::string& run_id,
                        const std::string& node_id, const RequestLimits& limits) {
  if (auto s = ValidateId(absl::StrCat(kind, ".run_id"), run_id, limits); !s.ok())
    return s;
  return ValidateId(absl::StrCat(kind, ".node_id"), node_id, limits);
}

absl::Status ValidateRunConfig(const v1::RunConfig& config, const RequestLimits& limits) {
  if (config.min_nodes() == 0)
    return Invalid("join.config.min_nodes", "must be at least 1");
  if (config.max_nodes() == 0)
    return Invalid("join.config.max_nodes", "must be at least 1");
  if (auto s = AtMost("join.config.max_nodes", config.max_nodes(), limits.max_nodes);
      !s.ok())
    return s;
  if (config.min_nodes() > config.max_nodes()) {
    return Invalid("join.config.min_nodes",
                   absl::StrCat(config.min_nodes(), " is above max_nodes (",
                                config.max_nodes(), ")"));
  }
  if (auto s =
          AtMost("join.config.max_restarts", config.max_restarts(), limits.max_restarts);
      !s.ok())
    return s;
  for (const auto& [field, value] :
       {std::pair<const char*, uint32_t>{"join.config.last_call_timeout_ms",
                                         config.last_call_timeout_ms()},
        {"join.config.join_timeout_ms", config.join_timeout_ms()},
        {"join.config.keep_alive_interval_ms", config.keep_alive_interval_ms()}}) {
    if (auto s = AtMost<uint64_t>(field, value, limits.max_timeout_ms); !s.ok()) return s;
  }
  if (auto s = AtMost("join.config.keep_alive_max_attempt",
                      config.keep_alive_max_attempt(), limits.max_keep_alive_attempts);
      !s.ok())
    return s;
  // The lease (interval x attempts) must fit the timeout bound too.
  const uint64_t lease = uint64_t{config.keep_alive_interval_ms()} *
                         uint64_t{config.keep_alive_max_attempt()};
  if (lease > limits.max_timeout_ms) {
    return Invalid("join.config.keep_alive_interval_ms",
                   absl::StrCat("times keep_alive_max_attempt is ", lease,
                                " ms, above the limit of ", limits.max_timeout_ms));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateId(absl::string_view field, const std::string& id,
                        const RequestLimits& limits) {
  if (id.empty()) return Invalid(field, "must not be empty");
  if (auto s = MaxBytes(field, id.size(), limits.max_id_bytes); !s.ok()) return s;
  return Printable(field, id);
}

bool TakesDedupId(const meshrun::v1::StoreRequest& request) {
  switch (request.op_case()) {
    case meshrun::v1::StoreRequest::kAdd:
    case meshrun::v1::StoreRequest::kCompareSet:
    case meshrun::v1::StoreRequest::kAppend:
    case meshrun::v1::StoreRequest::kQueuePush:
    case meshrun::v1::StoreRequest::kQueuePop:
      return true;
    default:
      return false;
  }
}

absl::Status ValidateStoreRequest(const v1::StoreRequest& request,
                                  const RequestLimits& limits) {
  if (request.op_case() == v1::StoreRequest::OP_NOT_SET)
    return Invalid("store.op", "the request names no operation");
  // Namespaces carry user prefixes (c10d PrefixStore), so any byte but NUL is
  // allowed, and "" is a namespace like any other; the length is bounded.
  if (auto s = MaxBytes("store.ns", request.ns().size(), limits.max_namespace_bytes);
      !s.ok())
    return s;
  if (request.ns().find('\0') != std::string::npos)
    return Invalid("store.ns", "must not contain NUL bytes");
  if (auto s = MaxBytes("store.dedup_id", request.dedup_id().size(),
                        limits.max_dedup_id_bytes);
      !s.ok())
    return s;
  if (static_cast<size_t>(request.forget_dedup_ids_size()) > limits.max_forget_dedup_ids)
    return Invalid("store.forget_dedup_ids",
                   absl::StrCat("names ", request.forget_dedup_ids_size(),
                                " ids; at most ", limits.max_forget_dedup_ids));
  for (const std::string& id : request.forget_dedup_ids()) {
    if (auto s = MaxBytes("store.forget_dedup_ids", id.size(), limits.max_dedup_id_bytes);
        !s.ok())
      return s;
  }
  switch (request.op_case()) {
    case v1::StoreRequest::kWait:
      return Keys("store.wait.keys", request.wait().keys(), limits);
    case v1::StoreRequest::kCheck:
      return Keys("store.check.keys", request.check().keys(), limits);
    case v1::StoreRequest::kMultiGet:
      return Keys("store.multi_get.keys", request.multi_get().keys(), limits);
    case v1::StoreRequest::kMultiSet:
      return AtMost("store.multi_set.entries",
                    static_cast<size_t>(request.multi_set().entries_size()),
                    limits.max_keys_per_request);
    default:
      // Single keys and values are checked by KvStore against its limits.
      return absl::OkStatus();
  }
}

absl::Status ValidateJoin(const v1::JoinRequest& request, const RequestLimits& limits) {
  if (auto s = RunAndNode("join", request.run_id(), request.node_id(), limits); !s.ok())
    return s;
  // The host becomes the workers' MASTER_ADDR; empty means "not offered".
  if (auto s = MaxBytes("join.host", request.host().size(), limits.max_host_bytes);
      !s.ok())
    return s;
  if (auto s = Printable("join.host", request.host()); !s.ok()) return s;
  if (request.nproc() == 0) return Invalid("join.nproc", "must be at least 1");
  if (auto s = AtMost("join.nproc", request.nproc(), limits.max_nproc); !s.ok()) return s;
  if (request.node_rank_hint() < -1) {
    return Invalid("join.node_rank_hint",
                   absl::StrCat(request.node_rank_hint(), " is below -1 (none)"));
  }
  if (!request.has_config()) return Invalid("join.config", "is required");
  if (auto s = ValidateRunConfig(request.config(), limits); !s.ok()) return s;
  if (request.node_rank_hint() >= 0 &&
      static_cast<uint32_t>(request.node_rank_hint()) >= request.config().max_nodes()) {
    return Invalid("join.node_rank_hint",
                   absl::StrCat(request.node_rank_hint(), " is not below max_nodes (",
                                request.config().max_nodes(), ")"));
  }
  return AtMost("join.master_port", request.master_port(), uint32_t{65535});
}

absl::Status ValidateHeartbeat(const v1::HeartbeatRequest& request,
                               const RequestLimits& limits) {
  if (auto s = RunAndNode("heartbeat", request.run_id(), request.node_id(), limits);
      !s.ok())
    return s;
  // A node reports its own ranks' step times.
  if (auto s = AtMost("heartbeat.step_times",
                      static_cast<uint32_t>(request.step_times_size()), limits.max_nproc);
      !s.ok())
    return s;
  for (const v1::RankStepTime& step : request.step_times()) {
    if (!std::isfinite(step.mean_seconds()) || step.mean_seconds() < 0)
      return Invalid("heartbeat.step_times.mean_seconds",
                     "must be a finite number of seconds");
  }
  return absl::OkStatus();
}

absl::Status ValidateFailureReport(const v1::FailureReport& request,
                                   const RequestLimits& limits) {
  if (auto s = RunAndNode("failure", request.run_id(), request.node_id(), limits);
      !s.ok())
    return s;
  if (request.round() == 0) return Invalid("failure.round", "must be at least 1");
  if (auto s = Text("failure.detail", request.detail(), limits); !s.ok()) return s;
  const v1::FailureCause& cause = request.cause();
  if (auto s = MaxBytes("failure.cause.host", cause.host().size(), limits.max_host_bytes);
      !s.ok())
    return s;
  if (auto s = Printable("failure.cause.host", cause.host()); !s.ok()) return s;
  if (auto s = AtMost("failure.cause.exit.local_rank", cause.exit().local_rank(),
                      limits.max_nproc);
      !s.ok())
    return s;
  if (auto s = Text("failure.cause.message", cause.message(), limits); !s.ok()) return s;
  // The replica's bound is the round's world size, which the core checks.
  if (request.has_replica_restarts() && !request.has_replica())
    return Invalid("failure.replica_restarts", "is set without failure.replica");
  return Text("failure.cause.traceback", cause.traceback(), limits);
}

absl::Status ValidateWorkerExitsReport(const v1::WorkerExitsReport& request,
                                       const RequestLimits& limits) {
  if (auto s = RunAndNode("worker_exits", request.run_id(), request.node_id(), limits);
      !s.ok())
    return s;
  if (request.round() == 0) return Invalid("worker_exits.round", "must be at least 1");
  if (auto s =
          MaxBytes("worker_exits.host", request.host().size(), limits.max_host_bytes);
      !s.ok())
    return s;
  if (auto s = Printable("worker_exits.host", request.host()); !s.ok()) return s;
  // A node has at most max_nproc workers.
  return AtMost("worker_exits.exits", static_cast<uint32_t>(request.exits_size()),
                limits.max_nproc);
}

absl::Status ValidateHealthReport(const v1::HealthReport& request,
                                  const RequestLimits& limits) {
  if (auto s = RunAndNode("health", request.run_id(), request.node_id(), limits); !s.ok())
    return s;
  if (auto s = MaxBytes("health.host", request.host().size(), limits.max_host_bytes);
      !s.ok())
    return s;
  if (auto s = Printable("health.host", request.host()); !s.ok()) return s;
  // The agent sends at most 4 KiB of output (agent/health_check.cc) and a
  // command line; what is shown is their summary.
  constexpr size_t kMaxHealthBytes = 16 * 1024;
  for (auto [field, text] : {std::pair{"health.check", &request.check()},
                             std::pair{"health.outcome", &request.outcome()},
                             std::pair{"health.output", &request.output()}}) {
    if (auto s = MaxBytes(field, text->size(), kMaxHealthBytes); !s.ok()) return s;
  }
  if (request.check().empty()) return Invalid("health.check", "must not be empty");
  return absl::OkStatus();
}

absl::Status ValidateStatusRequest(const v1::StatusRequest& request,
                                   const RequestLimits& limits) {
  if (request.run_id().empty()) return absl::OkStatus();  // every run
  return ValidateId("status.run_id", request.run_id(), limits);
}

absl::Status ValidateSuccessReport(const v1::SuccessReport& request,
                                   const RequestLimits& limits) {
  if (auto s = RunAndNode("success", request.run_id(), request.node_id(), limits);
      !s.ok())
    return s;
  if (request.round() == 0) return Invalid("success.round", "must be at least 1");
  return absl::OkStatus();
}

absl::Status ValidateLeave(const v1::LeaveRequest& request, const RequestLimits& limits) {
  return RunAndNode("leave", request.run_id(), request.node_id(), limits);
}

absl::Status ValidateClose(const v1::CloseRequest& request, const RequestLimits& limits) {
  if (auto s = ValidateId("close.run_id", request.run_id(), limits); !s.ok()) return s;
  if (!v1::RunOutcome_IsValid(request.outcome()) ||
      request.outcome() == v1::OUTCOME_UNSPECIFIED) {
    return Invalid("close.outcome",
                   absl::StrCat(static_cast<int>(request.outcome()),
                                " is not one of SUCCEEDED (1), FAILED (2), ABORTED (3)"));
  }
  return Text("close.reason", request.reason(), limits);
}

absl::Status ValidateQuorumRequest(const v1::QuorumRequest& request,
                                   const RequestLimits& limits) {
  if (auto s = ValidateId("quorum.run_id", request.run_id(), limits); !s.ok()) return s;
  if (request.replica_size() == 0)
    return Invalid("quorum.replica_size", "must be at least 1");
  if (auto s = AtMost("quorum.replica_size", request.replica_size(), limits.max_nproc);
      !s.ok())
    return s;
  if (request.member() >= request.replica_size()) {
    return Invalid("quorum.member",
                   absl::StrCat(request.member(), " is not below replica_size (",
                                request.replica_size(), ")"));
  }
  if (request.num_replicas() == 0)
    return Invalid("quorum.num_replicas", "must be at least 1");
  if (auto s = AtMost("quorum.num_replicas", request.num_replicas(), limits.max_replicas);
      !s.ok())
    return s;
  if (auto s = AtMost("quorum.replica", request.replica(), limits.max_replicas - 1);
      !s.ok())
    return s;
  if (request.timeout_ms() == 0)
    return Invalid("quorum.timeout_ms", "must be at least 1");
  return absl::OkStatus();
}

absl::Status ValidateCommitRequest(const v1::CommitRequest& request,
                                   const RequestLimits& limits) {
  if (auto s = ValidateId("commit.run_id", request.run_id(), limits); !s.ok()) return s;
  if (auto s = AtMost("commit.replica", request.replica(), limits.max_replicas - 1);
      !s.ok())
    return s;
  if (auto s = AtMost("commit.member", request.member(), limits.max_nproc - 1); !s.ok())
    return s;
  if (request.timeout_ms() == 0)
    return Invalid("commit.timeout_ms", "must be at least 1");
  return absl::OkStatus();
}

}  // namespace meshrun::rdzv
