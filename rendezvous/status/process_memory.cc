#include "rendezvous/status/process_memory.h"

#include <malloc.h>
#include <unistd.h>

#include <fstream>

namespace meshrun::rdzv {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerAllocator = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
constexpr bool kSanitizerAllocator = true;
#else
constexpr bool kSanitizerAllocator = false;
#endif
#else
constexpr bool kSanitizerAllocator = false;
#endif

std::optional<HeapUsage> ReadHeapUsage() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  if (kSanitizerAllocator) return std::nullopt;
  const struct mallinfo2 info = mallinfo2();
  return HeapUsage{.in_use_bytes = info.uordblks + info.hblkhd,
                   .free_bytes = info.fordblks};
#else
  return std::nullopt;
#endif
}

}  // namespace

ProcessMemory ReadProcessMemory() {
  ProcessMemory memory;
  // statm: size resident shared text lib data dt, in pages.
  std::ifstream statm("/proc/self/statm");
  uint64_t size_pages = 0, resident_pages = 0;
  if (statm >> size_pages >> resident_pages) {
    memory.resident_bytes = resident_pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  }
  memory.heap = ReadHeapUsage();
  return memory;
}

void AddProcessMemoryMetrics(const ProcessMemory& memory,
                             std::vector<MetricFamily>* families) {
  families->emplace_back("process_resident_memory_bytes", "Resident memory size in bytes",
                         "gauge");
  families->back().Add({}, static_cast<double>(memory.resident_bytes));
  if (!memory.heap) return;
  families->emplace_back(
      "meshrun_process_heap_bytes",
      "This process's heap: in use by live objects, or freed and kept by the allocator",
      "gauge");
  families->back().Add({{"state", "in_use"}},
                       static_cast<double>(memory.heap->in_use_bytes));
  families->back().Add({{"state", "free"}}, static_cast<double>(memory.heap->free_bytes));
}

}  // namespace meshrun::rdzv
