#pragma once

// torch.utils.data.distributed.DistributedSampler for a dataset of N
// indices: every data-parallel rank takes a disjoint, equal-length subset of
// the (optionally shuffled) indices, re-shuffled per epoch via set_epoch().
// Pure (no libtorch, no I/O).
//
//   auto sampler = DistributedSampler::Create(dataset_size, {.num_replicas = dp,
//                                                            .rank = dp_rank});
//   for (int epoch = 0; ...; ++epoch) {
//     sampler->set_epoch(epoch);
//     for (int64_t index : sampler->Indices()) ...
//   }
//
// The indices equal PyTorch's bit for bit (same seed, epoch and options):
// the shuffle is torch.randperm(N) on a CPU torch.Generator seeded with
// seed + epoch, i.e. a forward Fisher-Yates over MT19937 (swap i with
// i + mt() % (N - i)), which is what libtorch's CPU randperm does (1.13 and 2.15 alike;
// and the unit tests compare against indices printed by Python's sampler).
//
// Without drop_last the index list is padded to a multiple of num_replicas
// by repeating indices from its start; with drop_last the tail is dropped.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace meshrun::worker::parallel {

struct DistributedSamplerOptions {
  int64_t num_replicas = 1;
  int64_t rank = 0;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // INVALID_ARGUMENT for a negative dataset size, num_replicas < 1 or a rank
  // outside [0, num_replicas), with torch's message for the latter.
  static absl::StatusOr<DistributedSampler> Create(int64_t dataset_size,
                                                   DistributedSamplerOptions options);

  // Changes the shuffle; call at the start of every epoch (as in torch, the
  // same epoch gives the same order).
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  // Indices this rank takes per epoch (len(sampler)), and over all ranks.
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return num_samples_ * options_.num_replicas; }

  // This rank's indices for the current epoch, in order.
  std::vector<int64_t> Indices() const;

 private:
  DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options);

  int64_t dataset_size_;
  DistributedSamplerOptions options_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
};

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on CPU.
std::vector<int64_t> TorchRandperm(int64_t n, uint64_t seed);

}  // namespace meshrun::worker::parallel
