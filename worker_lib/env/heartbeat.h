#pragma once

// meshrun.heartbeat()'s C++ twin: tells this node's agent that the worker
// makes progress. Under `meshrun --hang-timeout` (on by default) the agent
// judges a worker by its CPU time and output; once the worker has sent a
// heartbeat, by its heartbeats alone (a rank spinning in a collective that
// never completes is caught too). Call it once a step, or more often than
// the timeout.
//
// A heartbeat is a datagram to the agent's abstract Unix socket named in
// MESHRUN_HEARTBEAT_SOCKET; the kernel tells the agent which process sent it,
// so only the worker process itself counts. No libtorch here.
//
// `step_seconds`, when given, is the time this rank's step took by its own
// measure, before the collective that makes every rank wait for the slowest
// (e.g. its forward and backward): the daemon compares the ranks' means and
// shows the slow ones on its status page (stragglers).

#include <optional>

namespace meshrun::worker {

// False where there is no agent to tell (MESHRUN_HEARTBEAT_SOCKET unset:
// not under meshrun, or --hang-timeout 0) or the datagram was not sent (the
// agent's queue full: the next one will do). Thread-safe; never blocks.
bool Heartbeat(std::optional<double> step_seconds = std::nullopt);

}  // namespace meshrun::worker
