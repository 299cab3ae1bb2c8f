#include "tests/support/meshrun_run.h"

#include <sys/wait.h>

#include "tests/support/child_process.h"

namespace meshrun::testing {

MeshrunRun RunUnderMeshrun(int nproc, const std::string& program,
                           const std::vector<std::string>& args,
                           std::chrono::milliseconds timeout,
                           const std::vector<std::string>& launcher_flags) {
  std::vector<std::string> argv{"/usr/bin/env",
                                "PYTHON_EXEC=" MESHRUN_PYTHON,
                                BinDir() + "/meshrun",
                                "--standalone",
                                "--nproc-per-node=" + std::to_string(nproc),
                                "--no-python"};
  argv.insert(argv.end(), launcher_flags.begin(), launcher_flags.end());
  argv.push_back(program.front() == '/' ? program : BinDir() + "/" + program);
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess run(argv, /*merge_stderr=*/true);
  MeshrunRun result;
  result.output = run.ReadAll(timeout);
  if (auto status = run.Wait(timeout)) {
    result.exit_code =
        WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
  }
  return result;
}

}  // namespace meshrun::testing
