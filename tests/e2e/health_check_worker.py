"""A worker for health_check_test.py (no torch): says who it is; on the first
attempt, the last rank creates the flag file that makes its node's health
check fail, then fails itself, so the run restarts."""

import os
import sys

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {rank} of {world}, restart {restart}", flush=True)
if restart == 0 and rank == world - 1 and world > 1:
    open(sys.argv[1], "w").close()
    sys.exit(1)
