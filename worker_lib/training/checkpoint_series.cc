#include "worker_lib/training/checkpoint_series.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_format.h"
#include "worker_lib/training/checkpoint.h"

namespace meshrun::worker::parallel {
namespace fs = std::filesystem;

std::string CheckpointStepPath(const std::string& dir, int64_t step) {
  return (fs::path(dir) / absl::StrFormat("step-%06d", step)).string();
}

std::optional<int64_t> LatestCheckpointStep(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "latest");
  int64_t step;
  if (in >> step && step >= 0) return step;
  return std::nullopt;
}

absl::Status SaveCheckpointStep(const SaveFn& save, int rank, const std::string& dir,
                                int64_t step) {
  if (absl::Status status = save(CheckpointStepPath(dir, step)); !status.ok())
    return status;
  if (rank != 0) return absl::OkStatus();
  return WriteFileAtomically((fs::path(dir) / "latest").string(),
                             std::to_string(step) + "\n");
}

absl::StatusOr<int64_t> ResumeFromLatestCheckpoint(const LoadFn& load,
                                                   const std::string& dir) {
  const std::optional<int64_t> latest = LatestCheckpointStep(dir);
  if (!latest) return 0;
  if (absl::Status status = load(CheckpointStepPath(dir, *latest)); !status.ok())
    return status;
  return *latest;
}

}  // namespace meshrun::worker::parallel
