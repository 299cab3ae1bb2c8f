#include "worker_lib/parallel/data.h"

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

at::Tensor DataShard(const at::Tensor& t, int64_t parts, int64_t index) {
  TORCH_CHECK(t.size(0) % parts == 0, "a batch of ", t.size(0),
              " rows does not split over ", parts, " data-parallel ranks");
  const int64_t rows = t.size(0) / parts;
  return t.narrow(0, index * rows, rows);
}

}  // namespace meshrun::worker::parallel
