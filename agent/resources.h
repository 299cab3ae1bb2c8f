#pragma once

// What an agent needs from the operating system besides memory: threads and
// file descriptors. Neither can be handled where it runs out (gRPC aborts
// when it cannot make its wakeup descriptors, carries on without a thread it
// could not start and then hangs at shutdown waiting for it; std::thread
// throws on the agent's own threads), so the launcher checks descriptors
// before anything starts and ends the process on a thread it cannot get
// (launcher/thread_guard.cc), each with one line naming the limit.

#include <string>

#include "absl/status/status.h"

namespace meshrun::agent {

// meshrun's exit code when it could not get a thread or a file descriptor
// (sysexits' EX_OSERR): nothing of the run is known to have failed, the
// machine ran out. Distinct from 1 so a launcher of many agents can tell.
inline constexpr int kResourceExitCode = 71;

// Descriptors a meshrun process holds at most with `nproc` workers (their
// pipes and log files, the agent's and gRPC's own, and those of a daemon it
// hosts; the connections of other nodes to that daemon come on top), with
// headroom.
int DescriptorsNeeded(int nproc, bool hosts_daemon);

// OK when RLIMIT_NOFILE leaves room for `needed` more descriptors than are
// open now; else RESOURCE_EXHAUSTED saying how many are allowed, open and
// needed, and what to raise.
absl::Status CheckDescriptors(int needed);

// The limits on threads that apply to this process, for the line saying it
// could not get one: the threads this machine runs now, kernel.pid_max,
// kernel.threads-max, and RLIMIT_NPROC, RLIMIT_STACK, RLIMIT_AS and the
// cgroup's pids.max where they are set. Reads /proc and /sys only; never
// starts a thread.
std::string ThreadLimits();

// A directory removed, with what it holds, when the process ends for want of
// a thread (launcher/thread_guard.cc), as an orderly exit removes it: the
// agent's temporary log root. Empty: none. Thread-safe.
void SetRemovedOnResourceExit(const std::string& dir);
// Removes it; for the thread guard, from any thread.
void RemoveOnResourceExit();

}  // namespace meshrun::agent
