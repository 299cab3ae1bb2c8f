#pragma once

// RunStatusRecord and friends <-> their protos (the Status RPC, failure and
// worker-exit reports).

#include "meshrun/v1/rendezvous.pb.h"
#include "rendezvous/status/run_status.h"

namespace meshrun::rdzv {

meshrun::v1::WorkerExit ToProto(const WorkerExitRecord& exit);
WorkerExitRecord FromProto(const meshrun::v1::WorkerExit& exit);
FailureCauseRecord FromProto(const meshrun::v1::FailureCause& cause);

meshrun::v1::StatusReply ToProto(const StatusSnapshot& snapshot);
StatusSnapshot FromProto(const meshrun::v1::StatusReply& reply);

}  // namespace meshrun::rdzv
