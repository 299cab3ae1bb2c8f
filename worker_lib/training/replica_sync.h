#pragma once

// Gradient averaging across data-parallel replicas outside a trainer's
// world (fault-tolerant replicas, fault_tolerant.h): after the world's own
// gradient sync, before the optimizer step (ModuleTrainer).

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

class ReplicaGradientSync {
 public:
  virtual ~ReplicaGradientSync() = default;
  // Averages every param's grad and `*loss` over the step's replicas; false:
  // the step is discarded everywhere (no update).
  virtual absl::StatusOr<bool> Sync(const std::vector<std::shared_ptr<Param>>& params,
                                    double* loss) = 0;
};

}  // namespace meshrun::worker::parallel
