#pragma once

// Sharded checkpoints: each rank writes the shards it holds, each with its
// box in the global tensor; loading fills each rank's own box from whichever
// files overlap it, so a checkpoint saved on one mesh (say dp=2 x tp=2) loads
// on another (fsdp=4, tp=4 x pp=2, a single process...). The counterpart of
// torch.distributed.checkpoint's save/load with resharding.
//
// Layout: DIR/shard-<tag>.pt, one per writing rank, each a pickled list of
// (name, global shape, offsets, values) entries (torch::pickle_save).
// Replicas of the same shard (DP ranks) need not all write: any one copy
// covers the box; duplicates are harmless.
//
// Not collective: callers barrier between the last save and the first load
// of a checkpoint when ranks share it.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

// Writes `params`' local values (unpadded) to DIR/shard-<tag>.pt (DIR is
// created). Replaces a file of the same tag.
absl::Status SaveShards(const std::string& dir, const std::string& tag,
                        const std::vector<std::shared_ptr<Param>>& params);

// Fills every param's local box from DIR's shard files (padding stays zero).
// Fails, changing nothing, when a param's box is not fully covered, or its
// global shape differs from the checkpoint's.
absl::Status LoadShards(const std::string& dir,
                        const std::vector<std::shared_ptr<Param>>& params);

// Writes `bytes` to `path` under a hidden temporary name (".<name>.partial"
// beside it) and renames it, so that a crash never leaves a half-written
// file that a later reader would trust.
absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes);

}  // namespace meshrun::worker::parallel
