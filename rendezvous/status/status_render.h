#pragma once

// Renders a StatusSnapshot: as JSON (the status page's /api/status and
// `meshrun status --json`) and as the text table of `meshrun status`. Pure.

#include <string>

#include "rendezvous/status/run_status.h"

namespace meshrun::rdzv {

// One JSON object: {"now_unix_ms": ..., "runs": [...]}, field names as in
// run_status.h. Strings are escaped for JSON (control bytes as \u00XX); bytes
// that are not valid UTF-8 become U+FFFD, so the output always parses.
std::string RenderStatusJson(const StatusSnapshot& snapshot);

// Human-readable: per run a header line, a table of its nodes, the last
// failure (with up to `max_traceback_lines` of its traceback) and the
// failed worker exits.
std::string RenderStatusTable(const StatusSnapshot& snapshot,
                              int max_traceback_lines = 12);

// "exit 3", "SIGKILL" or "signal 64".
std::string DescribeExit(const WorkerExitRecord& exit);

}  // namespace meshrun::rdzv
