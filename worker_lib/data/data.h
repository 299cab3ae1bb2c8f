#pragma once

// Synthetic training data, the same on every rank for the same seed and
// step, so parallel runs and their single-process reference see one global
// batch; and the rows a data-parallel rank takes of it.

#include <ATen/ATen.h>

#include <cstdint>

namespace meshrun::worker::parallel {

struct Batch {
  at::Tensor input;   // [batch, in], float
  at::Tensor target;  // [batch, out], float
};

// Regression data for step `step`: inputs ~ N(0, 1), targets a fixed
// nonlinear function of them plus noise.
Batch SyntheticBatch(uint64_t seed, int64_t step, int64_t batch, int64_t in, int64_t out);

struct TokenBatch {
  at::Tensor tokens;   // [batch, seq] int64
  at::Tensor targets;  // [batch, seq] int64: the next tokens
};
// Synthetic sequences for step `step`, the same on every rank: mostly a
// fixed affine recurrence over the vocabulary (learnable), with random
// tokens mixed in.
TokenBatch SyntheticTokens(uint64_t seed, int64_t step, int64_t batch, int64_t seq,
                           int64_t vocab);

// Rows of `t` (dim 0) that data-parallel rank `index` of `parts` takes:
// contiguous, equal chunks. REQUIRES: t.size(0) divisible by parts.
at::Tensor DataShard(const at::Tensor& t, int64_t parts, int64_t index);

}  // namespace meshrun::worker::parallel
