#pragma once

// Test support: a program run under the real launcher, `meshrun --standalone
// --nproc-per-node=n program args...`, bounded in time.

#include <chrono>
#include <string>
#include <vector>

namespace meshrun::testing {

struct MeshrunRun {
  int exit_code = -1;  // -1: did not finish in time (the launcher was killed)
  std::string output;  // launcher and workers, stdout and stderr
};

// `program` is a file name in BinDir() or an absolute path; `launcher_flags`
// go to meshrun before it.
MeshrunRun RunUnderMeshrun(int nproc, const std::string& program,
                           const std::vector<std::string>& args,
                           std::chrono::milliseconds timeout = std::chrono::seconds(240),
                           const std::vector<std::string>& launcher_flags = {});

}  // namespace meshrun::testing
