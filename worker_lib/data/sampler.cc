#include "worker_lib/data/sampler.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace meshrun::worker::parallel {

std::vector<int64_t> TorchRandperm(int64_t n, uint64_t seed) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  // at::mt19937 seeds with the low 32 bits, as std::mt19937 does; its
  // random() is one 32-bit draw.
  std::mt19937 engine(static_cast<uint32_t>(seed));
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int64_t z = static_cast<int64_t>(engine() % static_cast<uint64_t>(n - i));
    std::swap(perm[i], perm[z + i]);
  }
  return perm;
}

absl::StatusOr<DistributedSampler> DistributedSampler::Create(
    int64_t dataset_size, DistributedSamplerOptions options) {
  if (dataset_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedSampler: dataset size ", dataset_size, " < 0"));
  }
  if (options.num_replicas < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedSampler: num_replicas must be >= 1, got ", options.num_replicas));
  }
  if (options.rank < 0 || options.rank >= options.num_replicas) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Invalid rank ", options.rank, ", rank should be in the interval [0, ",
        options.num_replicas - 1, "]"));
  }
  return DistributedSampler(dataset_size, options);
}

DistributedSampler::DistributedSampler(int64_t dataset_size,
                                       DistributedSamplerOptions options)
    : dataset_size_(dataset_size), options_(options) {
  const int64_t replicas = options_.num_replicas;
  if (options_.drop_last && dataset_size_ % replicas != 0) {
    // ceil((N - R) / R): the largest equal share that needs no padding.
    num_samples_ = (dataset_size_ - replicas + replicas - 1) / replicas;
    if (num_samples_ < 0) num_samples_ = 0;
  } else {
    num_samples_ = (dataset_size_ + replicas - 1) / replicas;
  }
}

std::vector<int64_t> DistributedSampler::Indices() const {
  std::vector<int64_t> indices;
  if (options_.shuffle) {
    indices = TorchRandperm(dataset_size_, options_.seed + static_cast<uint64_t>(epoch_));
  } else {
    indices.resize(static_cast<size_t>(dataset_size_));
    for (int64_t i = 0; i < dataset_size_; ++i) indices[i] = i;
  }
  const int64_t total = total_size();
  if (!options_.drop_last) {
    // Pad by repeating the list from its start (cyclically when the padding
    // is longer than the list, as torch's `indices * ceil(pad / len)`).
    const int64_t n = static_cast<int64_t>(indices.size());
    for (int64_t i = 0; static_cast<int64_t>(indices.size()) < total; ++i) {
      indices.push_back(indices[i % n]);
    }
  } else {
    indices.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = options_.rank; i < total; i += options_.num_replicas) {
    mine.push_back(indices[i]);
  }
  return mine;
}

}  // namespace meshrun::worker::parallel
