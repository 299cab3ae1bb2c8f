#pragma once

// The GPUs a test may use: how many `nvidia-smi -L` lists. Tests of the CUDA
// path (NCCL) run where there are some and skip, saying why, elsewhere.

#include <string>

#include "tests/support/child_process.h"
#include "tests/support/text.h"

namespace meshrun::testing {

// The number of GPUs `nvidia-smi -L` lists; 0 with `why_none` set when it
// lists none or cannot run.
inline int CountGpus(std::string* why_none) {
  ChildProcess probe({"/bin/sh", "-c", "nvidia-smi -L"}, /*merge_stderr=*/true);
  const int code = ExitCode(probe);
  const std::string& output = probe.output();
  const int gpus = static_cast<int>(Count(output, "GPU "));
  if (code != 0 || gpus == 0) {
    *why_none = "no GPU here (nvidia-smi -L exited " + std::to_string(code) + ": " +
                output.substr(0, output.find('\n')) + ")";
    return 0;
  }
  return gpus;
}

}  // namespace meshrun::testing
