// The agent's stack dump helper for tests (agent/dump_helper.h): what
// `meshrun --meshrun-internal-dump-helper <agent pid>` runs.

#include "agent/dump_helper.h"

int main(int argc, char** argv) { return meshrun::agent::RunDumpHelper(argc, argv); }
