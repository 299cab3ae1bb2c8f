#pragma once

// Periodic checkpoints of one training run, for a job that restarts from the
// newest one after a failure (torchrun's restart-everything recovery):
// DIR/step-NNNNNN is the sharded checkpoint (checkpoint.h) taken after that
// many steps, and DIR/latest names the newest complete one. The marker is
// written only after every rank's shards are in, and atomically, so a crash
// mid-save resumes from the checkpoint before.
//
// A checkpoint of ModuleTrainer (module_checkpoint.h) holds the module and
// its optimizer's state, and a step's batch depends on the step alone, so a
// run resumed from step N continues exactly as an uninterrupted one would.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace meshrun::worker::parallel {

// DIR/step-NNNNNN.
std::string CheckpointStepPath(const std::string& dir, int64_t step);

// The newest complete checkpoint's step in DIR, if any.
std::optional<int64_t> LatestCheckpointStep(const std::string& dir);

// Saves a checkpoint into a directory; collective, and every rank's
// shards are in when it returns (it ends with a barrier).
using SaveFn = std::function<absl::Status(const std::string& dir)>;
using LoadFn = std::function<absl::Status(const std::string& dir)>;

// Collective: `save` after `step` steps, then `rank` 0 marks the checkpoint
// the latest.
absl::Status SaveCheckpointStep(const SaveFn& save, int rank, const std::string& dir,
                                int64_t step);

// Collective: loads DIR's latest checkpoint and returns its step; 0,
// loading nothing, when DIR has none (a fresh start).
absl::StatusOr<int64_t> ResumeFromLatestCheckpoint(const LoadFn& load,
                                                   const std::string& dir);

}  // namespace meshrun::worker::parallel
