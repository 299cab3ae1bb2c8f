#pragma once

// Where a shard of a tensor lies in the global tensor: the arithmetic of
// DTensor's Shard(dim) placements, applied in a recorded order. Pure (no
// libtorch), so that the ordering rules are unit-tested on their own.
//
// A parameter is sharded by a sequence of steps, each "split tensor dim d of
// what I hold into k chunks, keep chunk i" (torch.chunk semantics: chunks of
// ceil(n/k), the last ones smaller or empty). The ORDER of the steps is part
// of the layout: TP shards the global weight first, FSDP then shards the TP
// shard. Reassembling in mesh-dimension order instead is pytorch#129229 (seed
// 000's FSDP+TP full_tensor with rows out of order); here every shard knows
// its box in the global tensor, so reassembly and resharding go by offsets.

#include <cstdint>
#include <string>
#include <vector>

namespace meshrun::worker::parallel {

// One chunk of torch.chunk(n elements, parts)[index]: where it starts, how
// many real elements it has, and the size every chunk is padded to (so that
// collectives see equal sizes).
struct ChunkExtent {
  int64_t offset = 0;
  int64_t size = 0;
  int64_t padded_size = 0;
};
// REQUIRES: n >= 0, parts >= 1, 0 <= index < parts.
ChunkExtent ChunkOf(int64_t n, int64_t parts, int64_t index);

// A rectangular region of a tensor: offsets and sizes per dimension.
struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;

  int64_t numel() const;
  bool empty() const { return numel() == 0; }
  bool operator==(const Box& other) const {
    return offsets == other.offsets && sizes == other.sizes;
  }
};

// The whole of a tensor of `shape`.
Box WholeBox(const std::vector<int64_t>& shape);

// `box` split along `dim` into `parts` chunks (of its extent along dim), chunk
// `index`. REQUIRES: 0 <= dim < rank, parts >= 1, 0 <= index < parts.
Box ChunkBox(const Box& box, int dim, int64_t parts, int64_t index);

// The overlap of two boxes of the same rank (empty sizes if none).
Box Intersect(const Box& a, const Box& b);

// A sharding step as recorded on a parameter: tensor dim `dim` split over the
// mesh dimension `mesh_dim` (size `parts`), this rank holding chunk `index`.
struct ShardStep {
  std::string mesh_dim;
  int dim = 0;
  int64_t parts = 1;
  int64_t index = 0;
};

// The box of the global tensor that `steps`, applied in order, leave here.
Box LocalBox(const std::vector<int64_t>& global_shape,
             const std::vector<ShardStep>& steps);

// "Shard(dim=0)@tp, Shard(dim=0)@fsdp" (the order is the application order).
std::string DescribeSteps(const std::vector<ShardStep>& steps);

}  // namespace meshrun::worker::parallel
