#include "worker_lib/parallel/checkpoint_series.h"

#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_format.h"

namespace meshrun::worker::parallel {
namespace {

namespace fs = std::filesystem;

absl::Status WriteAtomically(const fs::path& path, const std::string& text) {
  const fs::path partial = path.string() + ".partial";
  {
    std::ofstream out(partial, std::ios::trunc);
    out << text;
    out.flush();
    if (!out.good()) return absl::InternalError("cannot write " + partial.string());
  }
  std::error_code error;
  fs::rename(partial, path, error);
  if (error)
    return absl::InternalError("cannot rename " + partial.string() + ": " +
                               error.message());
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointStepPath(const std::string& dir, int64_t step) {
  return (fs::path(dir) / absl::StrFormat("step-%06d", step)).string();
}

std::optional<int64_t> LatestCheckpointStep(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "latest");
  int64_t step;
  if (in >> step && step >= 0) return step;
  return std::nullopt;
}

absl::Status SaveCheckpointStep(Trainer& trainer, int rank, const std::string& dir,
                                int64_t step) {
  // Save ends with a barrier: every rank's shards are in before the marker.
  if (absl::Status status = trainer.Save(CheckpointStepPath(dir, step)); !status.ok())
    return status;
  if (rank != 0) return absl::OkStatus();
  return WriteAtomically(fs::path(dir) / "latest", std::to_string(step) + "\n");
}

absl::StatusOr<int64_t> ResumeFromLatestCheckpoint(Trainer& trainer,
                                                   const std::string& dir) {
  const std::optional<int64_t> latest = LatestCheckpointStep(dir);
  if (!latest) return 0;
  if (absl::Status status = trainer.Load(CheckpointStepPath(dir, *latest)); !status.ok())
    return status;
  return *latest;
}

}  // namespace meshrun::worker::parallel
