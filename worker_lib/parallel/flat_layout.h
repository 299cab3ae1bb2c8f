#pragma once

// Where parameters and gradients lie in the flat buffers that FSDP and DP
// hand to one collective: the arithmetic only (pure, no libtorch), so that
// offsets, padding and grouping are unit-tested on their own.
//
// FSDP (fsdp.h) gathers a unit's params with ONE all-gather and
// reduce-scatters their grads with ONE reduce-scatter, as FSDP2's parameter
// group does. Each rank contributes a segment: its dim-0 chunk of every
// member param, padded to the first chunk's rows, laid end to end. The
// gathered buffer is the group's segments in rank order:
//
//   [ rank 0: p0 chunk | p1 chunk | ... ][ rank 1: p0 chunk | p1 chunk | ... ]...
//
// so member m's rows from rank r start at r * segment_numel + offsets[m], and
// the reduce-scatter input is the full grads cut the same way (each rank's
// output segment then holds its chunk of every grad).
//
// DP (dp.h) all-reduces gradients in buckets of up to bucket_bytes, filled in
// reverse parameter order (the last layers' grads are ready first in
// backward), a new bucket at every dtype change.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace meshrun::worker::parallel {

// One param of an FSDP group: its local tensor's dim 0 and the elements of
// one row (the product of the other dims; 1 for a vector).
struct FlatShardMember {
  int64_t rows = 0;
  int64_t row_numel = 1;
};

struct FlatShardLayout {
  int64_t parts = 1;
  // Per member: rows of every rank's chunk (torch.chunk's first chunk; the
  // last ranks' chunks are zero-padded to it), its elements, and where it
  // starts in a rank's segment.
  std::vector<int64_t> padded_rows;
  std::vector<int64_t> numels;
  std::vector<int64_t> offsets;
  // Elements of one rank's segment: the all-gather input, the reduce-scatter
  // output.
  int64_t segment_numel = 0;

  // The all-gather output, the reduce-scatter input.
  int64_t total_numel() const { return parts * segment_numel; }
  // Where rank `rank`'s chunk of member `member` starts in the gathered buffer.
  int64_t GatheredOffset(size_t member, int64_t rank) const {
    return rank * segment_numel + offsets[member];
  }
  // Whether member `member`'s full tensor has fewer rows than parts *
  // padded_rows (so the gathered rows end in padding).
  bool padded(size_t member, int64_t rows) const {
    return rows != parts * padded_rows[member];
  }
};

// REQUIRES: parts >= 1; every member rows >= 0, row_numel >= 0.
FlatShardLayout MakeFlatShardLayout(const std::vector<FlatShardMember>& members,
                                    int64_t parts);

// Indices 0..keys.size()-1 grouped by equal key, groups in order of their
// key's first appearance, members in index order: FSDP's parameter groups of
// one dtype each (a unit usually has one).
std::vector<std::vector<size_t>> GroupByKey(const std::vector<int>& keys);

// One DP bucket: params (indices into the caller's list) and their element
// offsets in its flat buffer.
struct BucketLayout {
  std::vector<size_t> members;
  std::vector<int64_t> offsets;
  int64_t numel = 0;
};

// Where a param lives: its bucket and its position among the bucket's members.
struct BucketSlot {
  size_t bucket = 0;
  size_t member = 0;
};

// DDP's bucketing: params taken in reverse order, a bucket closed when the
// next param would take it over `bucket_bytes` (a param larger than that gets
// a bucket of its own) or has another dtype (`dtype_keys`). `numels`,
// `element_sizes`, `dtype_keys` are per param, of one length.
// first_bucket_bytes, when below bucket_bytes: the first bucket closes as soon
// as it holds at least that much, as DDP's first bucket (1 MiB) does, so the
// first all-reduce starts early in backward instead of with the rest.
// REQUIRES: bucket_bytes >= 1.
std::vector<BucketLayout> MakeBuckets(const std::vector<int64_t>& numels,
                                      const std::vector<int64_t>& element_sizes,
                                      const std::vector<int>& dtype_keys,
                                      size_t bucket_bytes, size_t first_bucket_bytes = 0);

// slots[param] for every param of `buckets` (of `num_params` params).
std::vector<BucketSlot> SlotsOf(const std::vector<BucketLayout>& buckets,
                                size_t num_params);

}  // namespace meshrun::worker::parallel
