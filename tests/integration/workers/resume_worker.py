# Worker for daemon_restart_test: reports its pid and restart count, then
# runs until the test creates the file `go` (at most `limit` seconds).
import os
import sys
import time

go, limit = sys.argv[1], float(sys.argv[2])
rank = os.environ["RANK"]
print(
    f"WORKER rank={rank} pid={os.getpid()} restart={os.environ['TORCHELASTIC_RESTART_COUNT']}",
    flush=True,
)
deadline = time.monotonic() + limit
while not os.path.exists(go):
    if time.monotonic() > deadline:
        print(f"WORKER rank={rank} gave up waiting for {go}", flush=True)
        sys.exit(3)
    time.sleep(0.05)
print(f"WORKER rank={rank} done", flush=True)
