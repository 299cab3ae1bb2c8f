#pragma once

// Training batches from a file, instead of SyntheticBatch / SyntheticTokens:
// so that another trainer (PyTorch's own parallelisms, in
// tests/parity/torch_parallel.py) and meshrun train on exactly the same
// global batches. The file is what Python's
//
//   torch.save([(input0, target0), (input1, target1), ...], path)
//
// writes (or WriteBatchFile): a pickled list of 2-tuples of tensors, one per
// step, read with torch::pickle_load as checkpoint.h reads its shards.

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace meshrun::worker::parallel {

using InputTarget = std::pair<at::Tensor, at::Tensor>;

// The batches of `path`, in file order. NOT_FOUND when it cannot be read;
// DATA_LOSS (naming the file and what is wrong) when it is not a list of
// (tensor, tensor) tuples with matching first dims.
absl::StatusOr<std::vector<InputTarget>> ReadBatchFile(const std::string& path);

// Writes `batches` so that ReadBatchFile and Python's torch.load read them.
absl::Status WriteBatchFile(const std::string& path,
                            const std::vector<InputTarget>& batches);

}  // namespace meshrun::worker::parallel
