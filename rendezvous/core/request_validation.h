#pragma once

// Validation of every field of every request the daemon accepts, before the
// request reaches the store or the rendezvous state machine. Pure: no I/O, no
// clock. Each rejection is one INVALID_ARGUMENT line naming the field and the
// limit ("join.master_port: 70000 is above 65535"), so a client learns what
// to fix and a hostile client learns nothing else.
//
// The cores keep their own checks (key and value sizes against the
// configured StoreLimits, capacity, option consistency within a run); this
// unit adds what the cores do not know about: names and their allowed bytes,
// the wire's ranges, enum values and text lengths.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "meshrun/v1/rendezvous.pb.h"
#include "meshrun/v1/store.pb.h"

namespace meshrun::rdzv {

struct RequestLimits {
  // Run and node ids: also used in store prefixes, env vars and log lines.
  size_t max_id_bytes = 256;
  // A host name (RFC 1035: 253) or an address.
  size_t max_host_bytes = 253;
  // A store namespace: a run id plus a round prefix and a user prefix.
  size_t max_namespace_bytes = 1024;
  // A store request's dedup_id (a relay sends 16 bytes), and so each of its
  // forget_dedup_ids.
  size_t max_dedup_id_bytes = 64;
  size_t max_forget_dedup_ids = 4096;
  // Keys per store request (wait, check, multi_get, multi_set).
  size_t max_keys_per_request = 128 << 10;
  // Failure details and close reasons (tracebacks are cut to this).
  size_t max_text_bytes = 64 << 10;
  uint32_t max_nodes = 100000;
  uint32_t max_nproc = 65536;
  uint32_t max_restarts = 1000000;
  // Timeouts of a run's config, in ms (a year): `now + timeout` never overflows.
  uint64_t max_timeout_ms = uint64_t{366} * 24 * 3600 * 1000;
  uint32_t max_keep_alive_attempts = 1000000;
  // Replica groups of a fault-tolerant run, and members of one.
  uint32_t max_replicas = 65536;
};

// Run ids and node ids: 1..max_id_bytes of printable ASCII (0x21-0x7e), so they
// are safe in an environment variable, a store prefix and a log line.
absl::Status ValidateId(absl::string_view field, const std::string& id,
                        const RequestLimits& limits);

// The ops a dedup_id applies to (store.proto): the mutations whose repeat
// would apply twice. Not barrier: it parks after its add. The daemon ignores
// the id on any other op.
bool TakesDedupId(const meshrun::v1::StoreRequest& request);
absl::Status ValidateStoreRequest(const meshrun::v1::StoreRequest& request,
                                  const RequestLimits& limits);
absl::Status ValidateJoin(const meshrun::v1::JoinRequest& request,
                          const RequestLimits& limits);
absl::Status ValidateHeartbeat(const meshrun::v1::HeartbeatRequest& request,
                               const RequestLimits& limits);
absl::Status ValidateFailureReport(const meshrun::v1::FailureReport& request,
                                   const RequestLimits& limits);
absl::Status ValidateSuccessReport(const meshrun::v1::SuccessReport& request,
                                   const RequestLimits& limits);
absl::Status ValidateLeave(const meshrun::v1::LeaveRequest& request,
                           const RequestLimits& limits);
absl::Status ValidateClose(const meshrun::v1::CloseRequest& request,
                           const RequestLimits& limits);
absl::Status ValidateHealthReport(const meshrun::v1::HealthReport& request,
                                  const RequestLimits& limits);
absl::Status ValidateWorkerExitsReport(const meshrun::v1::WorkerExitsReport& request,
                                       const RequestLimits& limits);
absl::Status ValidateStatusRequest(const meshrun::v1::StatusRequest& request,
                                   const RequestLimits& limits);
absl::Status ValidateQuorumRequest(const meshrun::v1::QuorumRequest& request,
                                   const RequestLimits& limits);
absl::Status ValidateCommitRequest(const meshrun::v1::CommitRequest& request,
                                   const RequestLimits& limits);

}  // namespace meshrun::rdzv
