#include "worker_lib/data/data.h"

#include <ATen/CPUGeneratorImpl.h>

namespace meshrun::worker::parallel {

Batch SyntheticBatch(uint64_t seed, int64_t step, int64_t batch, int64_t in,
                     int64_t out) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(
      seed * 1000003 + static_cast<uint64_t>(step));
  at::Tensor input = at::empty({batch, in}, at::kFloat).normal_(0, 1, generator);
  // A fixed random projection of sin(input): learnable, not trivially linear.
  at::Generator projection_generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor projection =
      at::empty({in, out}, at::kFloat).normal_(0, 1, projection_generator).div_(in);
  at::Tensor noise = at::empty({batch, out}, at::kFloat).normal_(0, 0.01, generator);
  return {input, at::sin(input).matmul(projection).add_(noise)};
}

TokenBatch SyntheticTokens(uint64_t seed, int64_t step, int64_t batch, int64_t seq,
                           int64_t vocab) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(
      seed * 1000003 + static_cast<uint64_t>(step));
  at::Tensor sequence = at::empty({batch, seq + 1}, at::kLong);
  sequence.select(1, 0).random_(0, vocab, generator);
  for (int64_t t = 1; t <= seq; ++t) {
    at::Tensor next = (sequence.select(1, t - 1) * 5 + 3).remainder(vocab);
    at::Tensor random = at::empty({batch}, at::kLong).random_(0, vocab, generator);
    at::Tensor noisy = at::empty({batch}, at::kFloat).uniform_(0, 1, generator) < 0.1;
    sequence.select(1, t).copy_(at::where(noisy, random, next));
  }
  return {sequence.narrow(1, 0, seq).contiguous(),
          sequence.narrow(1, 1, seq).contiguous()};
}

at::Tensor DataShard(const at::Tensor& t, int64_t parts, int64_t index) {
  TORCH_CHECK(t.size(0) % parts == 0, "a batch of ", t.size(0),
              " rows does not split over ", parts, " data-parallel ranks");
  const int64_t rows = t.size(0) / parts;
  return t.narrow(0, index * rows, rows);
}

}  // namespace meshrun::worker::parallel
