#pragma once

// --hang-timeout's evidence: a hung worker's stacks, taken before it is
// stopped. Python frames through py-spy (`dump --nonblocking`: it reads the
// interpreter's memory without stopping the process, so it works on a
// SIGSTOPped one too), native frames of every thread through gdb for other
// programs, and where neither is at hand, each thread's kernel wait channel
// from /proc.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

namespace meshrun::agent {

class DumpHelper;

struct StackTools {
  std::string py_spy;  // empty: not found
  std::string gdb;
};

// py-spy and gdb as the workers would find them: on the PATH they inherit
// from the agent, and py-spy also beside the worker's program (a
// virtualenv's bin/, where pip puts it).
StackTools FindStackTools(const std::vector<std::string>& worker_argv);

// `name` as found on `path` (a PATH value): its first absolute entry that
// holds an executable file of that name; a name with a '/' as is. Empty and
// relative entries (execvp's "the working directory") are skipped, so a
// program in the agent's working directory is never chosen. Empty: none.
std::string FindOnPath(const std::string& name, const std::string& path);

// The stacks of process `pid`, with a first line saying how they were taken.
// Blocks: each tool gets at most `timeout` (then it is killed and the next
// way is tried), and stops within 100 ms of `cancel` (when given) becoming
// true (an exiting agent). The tools run as children of `helper` when given
// (the process the workers let trace them: agent/dump_helper.h), else of the
// caller. Call it off the agent's io_context.
std::string DumpStacks(pid_t pid, const StackTools& tools, std::chrono::seconds timeout,
                       const std::atomic<bool>* cancel = nullptr,
                       DumpHelper* helper = nullptr);

}  // namespace meshrun::agent
