#pragma once

// The daemon's own memory, for /metrics: what the kernel holds for it
// (resident) and what its heap holds (in use by live objects, and freed but
// kept by the allocator). Resident memory only ratchets up under bursts of
// connections, as glibc keeps each arena's high-water mark; the heap in use
// falls back, so it is what says whether the daemon leaks.

#include <cstdint>
#include <optional>
#include <vector>

#include "rendezvous/status/metrics.h"

namespace meshrun::rdzv {

struct HeapUsage {
  uint64_t in_use_bytes = 0;  // live allocations, mmapped ones included
  uint64_t free_bytes = 0;    // freed, kept in the allocator's arenas
};

struct ProcessMemory {
  uint64_t resident_bytes = 0;
  // Absent where the allocator cannot say: not glibc, or a sanitizer's
  // allocator in its place (glibc's numbers would then miss every block).
  std::optional<HeapUsage> heap;
};

// Reads /proc/self/statm and the allocator's statistics (mallinfo2, which
// walks every arena's free lists under its lock: fine per scrape).
ProcessMemory ReadProcessMemory();

// process_resident_memory_bytes (Prometheus' own name for it) and, when
// known, meshrun_process_heap_bytes{state="in_use"|"free"}.
void AddProcessMemoryMetrics(const ProcessMemory& memory,
                             std::vector<MetricFamily>* families);

}  // namespace meshrun::rdzv
