#include "worker_lib/parallel/sharding.h"

#include <algorithm>

namespace meshrun::worker::parallel {

ChunkExtent ChunkOf(int64_t n, int64_t parts, int64_t index) {
  ChunkExtent extent;
  extent.padded_size = (n + parts - 1) / parts;
  extent.offset = std::min(index * extent.padded_size, n);
  extent.size = std::clamp<int64_t>(n - extent.offset, 0, extent.padded_size);
  return extent;
}

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t size : sizes) n *= size;
  return n;
}

Box WholeBox(const std::vector<int64_t>& shape) {
  return Box{std::vector<int64_t>(shape.size(), 0), shape};
}

Box ChunkBox(const Box& box, int dim, int64_t parts, int64_t index) {
  Box chunk = box;
  ChunkExtent extent = ChunkOf(box.sizes[dim], parts, index);
  chunk.offsets[dim] += extent.offset;
  chunk.sizes[dim] = extent.size;
  return chunk;
}

Box Intersect(const Box& a, const Box& b) {
  Box overlap;
  for (size_t d = 0; d < a.sizes.size(); ++d) {
    int64_t begin = std::max(a.offsets[d], b.offsets[d]);
    int64_t end = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    overlap.offsets.push_back(begin);
    overlap.sizes.push_back(std::max<int64_t>(end - begin, 0));
  }
  return overlap;
}

Box LocalBox(const std::vector<int64_t>& global_shape,
             const std::vector<ShardStep>& steps) {
  Box box = WholeBox(global_shape);
  for (const ShardStep& step : steps)
    box = ChunkBox(box, step.dim, step.parts, step.index);
  return box;
}

std::string DescribeSteps(const std::vector<ShardStep>& steps) {
  if (steps.empty()) return "Replicate()";
  std::string text;
  for (const ShardStep& step : steps) {
    if (!text.empty()) text += ", ";
    text += "Shard(dim=" + std::to_string(step.dim) + ")@" + step.mesh_dim;
  }
  return text;
}

}  // namespace meshrun::worker::parallel
