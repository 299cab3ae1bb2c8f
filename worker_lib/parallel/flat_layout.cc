#include "worker_lib/parallel/flat_layout.h"

#include <algorithm>

#include "worker_lib/parallel/sharding.h"

namespace meshrun::worker::parallel {

FlatShardLayout MakeFlatShardLayout(const std::vector<FlatShardMember>& members,
                                    int64_t parts) {
  FlatShardLayout layout;
  layout.parts = parts;
  for (const FlatShardMember& member : members) {
    const int64_t padded_rows = ChunkOf(member.rows, parts, 0).padded_size;
    layout.padded_rows.push_back(padded_rows);
    layout.numels.push_back(padded_rows * member.row_numel);
    layout.offsets.push_back(layout.segment_numel);
    layout.segment_numel += layout.numels.back();
  }
  return layout;
}

std::vector<std::vector<size_t>> GroupByKey(const std::vector<int>& keys) {
  std::vector<int> seen;
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto found = std::find(seen.begin(), seen.end(), keys[i]);
    if (found == seen.end()) {
      seen.push_back(keys[i]);
      groups.emplace_back();
      groups.back().push_back(i);
    } else {
      groups[found - seen.begin()].push_back(i);
    }
  }
  return groups;
}

std::vector<BucketLayout> MakeBuckets(const std::vector<int64_t>& numels,
                                      const std::vector<int64_t>& element_sizes,
                                      const std::vector<int>& dtype_keys,
                                      size_t bucket_bytes, size_t first_bucket_bytes) {
  std::vector<BucketLayout> buckets;
  int bucket_key = 0;
  size_t bytes = 0;
  const bool small_first = first_bucket_bytes > 0 && first_bucket_bytes < bucket_bytes;
  for (size_t k = numels.size(); k-- > 0;) {
    const size_t size = static_cast<size_t>(numels[k] * element_sizes[k]);
    const bool first_full =
        small_first && buckets.size() == 1 && bytes >= first_bucket_bytes;
    if (buckets.empty() || first_full || bytes + size > bucket_bytes ||
        bucket_key != dtype_keys[k]) {
      buckets.emplace_back();
      bucket_key = dtype_keys[k];
      bytes = 0;
    }
    BucketLayout& bucket = buckets.back();
    bucket.members.push_back(k);
    bucket.offsets.push_back(bucket.numel);
    bucket.numel += numels[k];
    bytes += size;
  }
  return buckets;
}

std::vector<BucketSlot> SlotsOf(const std::vector<BucketLayout>& buckets,
                                size_t num_params) {
  std::vector<BucketSlot> slots(num_params);
  for (size_t b = 0; b < buckets.size(); ++b) {
    for (size_t m = 0; m < buckets[b].members.size(); ++m)
      slots[buckets[b].members[m]] = BucketSlot{b, m};
  }
  return slots;
}

}  // namespace meshrun::worker::parallel
