// The daemon's memory gauges: read from this very process, and rendered.

#include "rendezvous/status/process_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

namespace meshrun::rdzv {
namespace {

TEST(ProcessMemoryTest, ResidentAndHeapFollowABlockAllocatedAndFreed) {
  const ProcessMemory before = ReadProcessMemory();
  EXPECT_GT(before.resident_bytes, 1u << 20);
#ifdef MESHRUN_SANITIZED
  // The sanitizer's allocator serves every block; glibc's statistics would
  // miss them all, so none are reported.
  EXPECT_FALSE(before.heap.has_value());
#else
  ASSERT_TRUE(before.heap.has_value());
  constexpr size_t kBlock = 16u << 20;
  auto block = std::make_unique<char[]>(kBlock);
  std::memset(block.get(), 1, kBlock);  // touched: resident
  const ProcessMemory with_block = ReadProcessMemory();
  ASSERT_TRUE(with_block.heap.has_value());
  EXPECT_GE(with_block.heap->in_use_bytes, before.heap->in_use_bytes + kBlock);
  EXPECT_GE(with_block.resident_bytes, before.resident_bytes + kBlock / 2);
  block.reset();
  const ProcessMemory after = ReadProcessMemory();
  ASSERT_TRUE(after.heap.has_value());
  EXPECT_LE(after.heap->in_use_bytes + kBlock, with_block.heap->in_use_bytes);
#endif
}

TEST(ProcessMemoryTest, RendersResidentAlwaysAndTheHeapWhenKnown) {
  std::vector<MetricFamily> families;
  AddProcessMemoryMetrics({.resident_bytes = 4096, .heap = std::nullopt}, &families);
  EXPECT_EQ(RenderPrometheusText(families),
            "# HELP process_resident_memory_bytes Resident memory size in bytes\n"
            "# TYPE process_resident_memory_bytes gauge\n"
            "process_resident_memory_bytes 4096\n");

  families.clear();
  AddProcessMemoryMetrics({.resident_bytes = 4096,
                           .heap = HeapUsage{.in_use_bytes = 3000, .free_bytes = 500}},
                          &families);
  const std::string text = RenderPrometheusText(families);
  EXPECT_NE(text.find("# TYPE meshrun_process_heap_bytes gauge\n"
                      "meshrun_process_heap_bytes{state=\"in_use\"} 3000\n"
                      "meshrun_process_heap_bytes{state=\"free\"} 500\n"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace meshrun::rdzv
