#pragma once

// `meshrun status --rdzv-endpoint HOST:PORT [--run-id ID] [--json]`: what the
// daemon knows of its runs (nodes, ranks, heartbeat ages, restarts, the last
// failure), fetched over gRPC and printed as a table or JSON.
//
// Exit codes: 0 shown; 1 daemon unreachable or unknown run (one line on
// stderr); 2 bad flags.

#include <string>
#include <vector>

namespace meshrun::launcher {

// `args`: what follows `meshrun status`.
int RunStatusCommand(const std::vector<std::string>& args);

}  // namespace meshrun::launcher
